"""The buffer as a Ray actor: puts from 1, 2 and 4 producer processes, take latency, and wake-up latency.

Every row is measured on one local Ray cluster that this case starts (or the one already running), side
by side with ``ray.util.queue.Queue`` (what a Ray user would reach for), the in-process StalenessBuffer,
and the floor: a Ray actor call that carries the same bytes and does nothing with them. Before them, when
this case starts Ray itself, the payload rows of ``ray_payloads`` run on a two-node cluster of their own; the
``ray_read`` rows (payloads the trainer reads: ``take`` + ``fetch`` against refs in a queue) run on this one.

``python -c "from pyfast_buffer.bench.ray_case import main; main()" [--quick]`` prints the rows as the
Markdown tables of docs/ray.md (``pyfast-buffer bench --cases ray`` prints them in the bench's own table).
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .._core import BATCH_COLUMNS
from .plan import CURRENT_STEP, Plan
from .ray_cluster import init_local_cluster
from .ray_journal import journal_rows
from .ray_journal import markdown as journal_table
from .ray_read import SIZES as READ_SIZES
from .ray_read import markdown as read_table
from .ray_read import read_rows
from .timing import median, percentile

PRODUCERS = (1, 2, 4)
#: Contenders; "pyfast_buffer" is the buffer actor, the floor is a Ray actor call carrying the same bytes.
OURS, QUEUE, LOCAL, FLOOR = "pyfast_buffer", "ray Queue", "pyfast_buffer in-process", "ray actor call (floor)"
#: The buffer actor without its journal (``journal=False``: no restarts), to show what the journal costs.
OURS_NO_JOURNAL = "pyfast_buffer, journal=False"
#: Ring of the buffer actors (the journal's cost per call does not depend on it: ``ray_journal``).
RING = 1 << 16
#: Rings of the journal rows (take and put cost by ring size, ``ray_journal``).
JOURNAL_SIZES = (4096, 1 << 16)
PAYLOAD_BYTES = 4096  # a small trajectory (1k int32 tokens): inlined by Ray, the per-object cost dominates
CASE = "ray"  # every row; ``op`` says which measurement: put/<n>p, take, wake


def _rate_row(op: str, contender: str, batch: int, entries: float, seconds: float, producers: int) -> Dict:
    rate = entries / seconds
    return {
        "case": CASE,
        "op": op,
        "contender": contender,
        "batch": batch,
        "producers": producers,
        "entries_per_s": rate,
        "median_s": 1 / rate if rate else float("inf"),
        "runs": 1,
    }


def _latency_row(op: str, contender: str, batch: int, times: List[float]) -> Dict:
    return {
        "case": CASE,
        "op": op,
        "contender": contender,
        "batch": batch,
        "median_s": median(times),
        "p50_s": percentile(times, 50),
        "p99_s": percentile(times, 99),
        "runs": len(times),
    }


def _remote_classes() -> Tuple[Any, Any]:
    import ray

    @ray.remote(num_cpus=0)
    class Producer:
        """Sends one batch per call to a target actor in a loop; ``warm`` first, so that ``loop`` times only sends."""

        def warm(self, target: Any, kind: str, batch: int) -> None:
            ids = np.arange(batch, dtype=np.int64)
            items = ids.tolist()
            payload = np.zeros(PAYLOAD_BYTES // 8, np.int64)
            if kind == "buffer":
                self.send = lambda: target.put(ids, CURRENT_STEP)
            elif kind == "buffer+values":  # the actor ray.puts each value: it owns them
                self.send = lambda: target.put(ids + self._next(batch), CURRENT_STEP, payloads=[payload] * batch)
            elif kind == "buffer+refs":  # this process puts them: they die with it
                self.send = lambda: target.put(
                    ids + self._next(batch), CURRENT_STEP, payloads=[ray.put(payload) for _ in range(batch)]
                )
            elif kind == "queue":
                self.send = lambda: target.put_nowait_batch(items)
            else:
                self.send = lambda: ray.get(target.sink.remote(ids))
            self.send()  # the first call to an actor resolves its handle and connects

        def _next(self, batch: int) -> int:
            """An id offset per call: ids holding payloads must be unique while they are in the buffer."""
            self.offset = getattr(self, "offset", 0) + batch
            return self.offset

        def loop(self, seconds: float) -> float:
            """Returns calls per second over this producer's own window (at least one call)."""
            began = time.perf_counter()
            stop, calls = began + seconds, 0
            while not calls or time.perf_counter() < stop:
                self.send()
                calls += 1
            return calls / (time.perf_counter() - began)

        def put_after(self, target: Any, kind: str, delay: float, value: int) -> int:
            """Sleeps, then puts one entry; returns perf_counter_ns just before the put (one clock per machine)."""
            time.sleep(delay)
            t0 = time.perf_counter_ns()
            if kind == "buffer":
                target.put(np.array([value], dtype=np.int64), CURRENT_STEP)
            else:
                target.put(value)
            return t0

        def ping(self) -> int:
            return 0

    threads: Dict[str, Any] = dict(num_cpus=0, max_concurrency=16)

    @ray.remote(**threads)
    class Sink:
        """An actor that receives and returns bytes and does nothing else: the floor under any actor design."""

        def sink(self, ids: np.ndarray) -> int:
            return len(ids)

        def give(self, n: int) -> np.ndarray:
            return np.zeros(n, dtype=np.int64)

    return Producer, Sink


def _puts(
    batches: Tuple[int, ...], seconds: float, producers: List[Any], sink: Any, client: Any, unjournaled: Any
) -> List[Dict]:
    import ray
    from ray.util.queue import Queue

    from ..buffer import StalenessBuffer

    rows = []
    for batch in batches:
        for n in PRODUCERS:
            op = f"put/{n}p"
            contenders = (
                (OURS, client, "buffer"),
                (OURS_NO_JOURNAL, unjournaled, "buffer"),
                (FLOOR, sink, "sink"),
                (QUEUE, None, "queue"),
            )
            for name, target, kind in contenders:
                queue = Queue(actor_options={"num_cpus": 0}) if kind == "queue" else None
                if queue is not None:
                    queue.size()  # started before the clock does
                ray.get([p.warm.remote(target if queue is None else queue, kind, batch) for p in producers[:n]])
                rates = ray.get([p.loop.remote(seconds) for p in producers[:n]])
                rows.append(_rate_row(op, name, batch, sum(rates) * batch * seconds, seconds, n))
                if queue is not None:
                    queue.shutdown()
            local = StalenessBuffer(1 << 20, max_age=10, pin_memory=False)
            rows.append(
                _rate_row(op, f"{LOCAL} ({n} threads)", batch, _local_puts(local, batch, n, seconds), seconds, n)
            )
    for name, kind in ((f"{OURS}, payload values", "buffer+values"), (f"{OURS}, payload refs", "buffer+refs")):
        batch = min(batches)
        ray.get([p.warm.remote(client, kind, batch) for p in producers[:1]])
        rates = ray.get([p.loop.remote(seconds) for p in producers[:1]])
        rows.append(_rate_row("put+payload/1p", name, batch, sum(rates) * batch * seconds, seconds, 1))
    return rows


def _local_puts(buf: Any, batch: int, threads: int, seconds: float) -> int:
    ids = np.arange(batch, dtype=np.int64)
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def produce(i: int) -> None:
        while time.perf_counter() < stop:
            buf.put(ids, CURRENT_STEP)
            counts[i] += 1

    workers = [threading.Thread(target=produce, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return sum(counts) * batch


def _timed(fn: Callable[[], int], repeat: int, batch: int, refill: Callable[[], None]) -> List[float]:
    times = []
    for _ in range(repeat):
        refill()
        t0 = time.perf_counter_ns()
        got = fn()
        times.append((time.perf_counter_ns() - t0) / 1e9)
        if got != batch:
            raise RuntimeError(f"a take returned {got} entries, not {batch}: the bench measured the wrong work")
    return times


def _takes(batches: Tuple[int, ...], repeat: int, sink: Any, client: Any, queue: Any) -> List[Dict]:
    import ray

    from ..buffer import StalenessBuffer

    rows = []
    local = StalenessBuffer(1 << 18, max_age=10, pin_memory=False)
    for batch in batches:
        chunk = np.arange(16 * batch, dtype=np.int64)

        def refill_buffer(buf: Any = client, batch: int = batch, chunk: np.ndarray = chunk) -> None:
            if len(buf) < batch:
                buf.put(chunk, CURRENT_STEP)

        def refill_queue(batch: int = batch, chunk: np.ndarray = chunk) -> None:
            if queue.size() < batch:
                queue.put_nowait_batch(chunk.tolist())

        def take_remote(batch: int = batch) -> int:
            return len(client.take(batch, CURRENT_STEP))

        def take_queue(batch: int = batch) -> int:
            return len(queue.get_nowait_batch(batch))

        def take_local(batch: int = batch) -> int:
            return len(local.take(batch, CURRENT_STEP))

        def take_floor(batch: int = batch) -> int:  # the same bytes as a batch's int64 columns, one actor call
            columns: np.ndarray = ray.get(sink.give.remote(BATCH_COLUMNS * batch))
            return columns.size // BATCH_COLUMNS

        cases: List[Tuple[str, Callable[[], int], Callable[[], None]]] = [
            (OURS, take_remote, refill_buffer),
            (QUEUE, take_queue, refill_queue),
            (LOCAL, take_local, lambda: refill_buffer(local)),
            (FLOOR, take_floor, lambda: None),
        ]
        for name, fn, refill in cases:
            fn_times = _timed(fn, repeat, batch, refill)  # warm, then measured
            fn_times = _timed(fn, repeat, batch, refill)
            rows.append(_latency_row("take", name, batch, fn_times))
    return rows


def _wakes(rounds: int, producer: Any, client: Any, queue: Any) -> List[Dict]:
    """A take blocked in the actor, woken by a put from another process; the same with ray Queue.get."""
    import ray

    rows = []
    client.max_age = 0  # empty both: every entry is one step too old for the evict below
    client.evict_stale(CURRENT_STEP + 1)  # the clock moves on one step: the takes below run at that step
    client.max_age = 10
    queue.get_nowait_batch(queue.size())
    for name, target, kind, take in (
        (OURS, client, "buffer", lambda: client.take(1, CURRENT_STEP + 1, timeout=30)),
        (QUEUE, queue, "queue", lambda: queue.get(block=True, timeout=30)),
    ):
        latencies = []
        for i in range(rounds):
            started = producer.put_after.remote(target, kind, 0.01, i)
            take()
            woken = time.perf_counter_ns()
            sent: int = ray.get(started)
            latencies.append((woken - sent) / 1e9)
        rows.append(_latency_row("wake", name, 1, latencies))
    return rows


def ray_case(plan: Plan, skipped: Dict[str, str]) -> List[Dict]:
    """The Ray rows of ``pyfast-buffer bench`` (skipped, with the reason, when ray is not installed)."""
    try:
        import ray
    except ImportError:
        skipped["ray"] = "ray is not installed: pip install 'pyfast_buffer[ray]'"
        return []
    started = not ray.is_initialized()
    rows: List[Dict] = []
    # A plan shorter than --quick (the tests' smoke plan) measures one payload size and producer count: every
    # contender and column still comes out, in a fifth of the time (the full run took 5 minutes of CI).
    smoke = plan.throughput_seconds < Plan.quick().throughput_seconds
    if started:  # payloads over two nodes need a cluster of their own, started before this process's one
        from .ray_payloads import PRODUCERS as PAYLOAD_PRODUCERS
        from .ray_payloads import SIZES as PAYLOAD_SIZES
        from .ray_payloads import can_pin, payload_rows

        rows += payload_rows(  # a second node brings cores of its own
            plan,
            sizes=PAYLOAD_SIZES[:1] if smoke else PAYLOAD_SIZES,
            producer_counts=PAYLOAD_PRODUCERS[:1] if smoke else PAYLOAD_PRODUCERS,
            pin_nodes=can_pin(),
        )
    else:
        skipped["ray payloads"] = "Ray was already running: the two-node payload rows start their own cluster"
    if started:
        init_local_cluster(
            num_cpus=max(PRODUCERS) + 2,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            namespace="pyfast_buffer_bench",  # the buffers are detached: a named namespace, not an anonymous one
        )
    try:
        from ray.util.queue import Queue

        from ..ray import RemoteBuffer

        producer_cls, sink_cls = _remote_classes()
        producers = [producer_cls.remote() for _ in range(max(PRODUCERS))]
        sink = sink_cls.remote()
        ray.get([p.ping.remote() for p in producers] + [sink.sink.remote(np.arange(1))])
        # One buffer actor and one queue serve every phase: starting an actor costs seconds.
        client = RemoteBuffer.create(RING, max_age=10, on_full="evict_oldest", num_cpus=0)
        unjournaled = RemoteBuffer.create(RING, max_age=10, on_full="evict_oldest", num_cpus=0, journal=False)
        queue = Queue(actor_options={"num_cpus": 0})
        rows += _puts(tuple(plan.batches), plan.throughput_seconds, producers, sink, client, unjournaled)
        rows += _takes(tuple(plan.batches), max(plan.repeat, 20), sink, client, queue)
        rows += _wakes(max(20, plan.wake_rounds // 3), producers[0], client, queue)
        read_sizes = READ_SIZES[:1] if smoke else READ_SIZES
        rows += read_rows(max(3.0, 6 * plan.throughput_seconds), sizes=read_sizes)  # the trainer's reads vs refs
        rows += journal_rows(JOURNAL_SIZES[:1] if smoke or plan.batches == Plan.quick().batches else JOURNAL_SIZES)
        client.kill()
        unjournaled.kill()
        queue.shutdown()
    finally:
        if started:
            ray.shutdown()
    return rows


def markdown(rows: List[Dict]) -> str:
    """Returns the rows as the tables of docs/ray.md, with ratios to ray Queue and to the floor."""

    def find(op: str, contender: str, batch: int) -> Dict:
        return next(r for r in rows if r["op"] == op and r["contender"] == contender and r["batch"] == batch)

    out = [
        "| producers | batch | pyfast_buffer actor | journal=False | ray Queue | actor/Queue | floor: actor call, "
        "same bytes | in-process (threads) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["op"].startswith("put") and r["contender"] == OURS:
            q = find(r["op"], QUEUE, r["batch"])
            f = find(r["op"], FLOOR, r["batch"])
            nj = find(r["op"], OURS_NO_JOURNAL, r["batch"])
            local = next(
                x for x in rows if x["op"] == r["op"] and x["batch"] == r["batch"] and x["contender"].startswith(LOCAL)
            )
            out.append(
                f"| {r['producers']} | {r['batch']} | {r['entries_per_s'] / 1e6:.3f} M/s "
                f"| {nj['entries_per_s'] / 1e6:.3f} M/s | {q['entries_per_s'] / 1e6:.3f} M/s "
                f"| {r['entries_per_s'] / q['entries_per_s']:.1f}x "
                f"| {f['entries_per_s'] / 1e6:.3f} M/s | {local['entries_per_s'] / 1e6:.2f} M/s |"
            )
    out += ["", "| one producer, batch | put with payloads | entries/s |", "| --- | --- | --- |"]
    out += [
        f"| {r['batch']} | {r['contender']} | {r['entries_per_s']:.0f} |" for r in rows if r["op"] == "put+payload/1p"
    ]
    out += [
        "",
        "| batch | pyfast_buffer actor take | ray Queue get_nowait_batch | Queue/actor "
        "| floor: actor call returning 8 x batch int64 | in-process take |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["op"] == "take" and r["contender"] == OURS:
            q, f, loc = (find("take", c, r["batch"]) for c in (QUEUE, FLOOR, LOCAL))
            out.append(
                f"| {r['batch']} | {_ms(r)} | {_ms(q)} | {q['median_s'] / r['median_s']:.1f}x | {_ms(f)} "
                f"| {loc['median_s'] * 1e6:.1f} us |"
            )
    out += ["", "| wake-up (blocked take, put from another process) | p50 | p99 |", "| --- | --- | --- |"]
    out += [
        f"| {r['contender']} | {r['p50_s'] * 1e3:.2f} ms | {r['p99_s'] * 1e3:.2f} ms |"
        for r in rows
        if r["op"] == "wake"
    ]
    if any(r["op"].startswith("ingest read/") for r in rows):
        out += ["", read_table(rows)]
    if any(r["op"].startswith("journal/") for r in rows):
        out += ["", journal_table(rows)]
    if any("nodes" in r for r in rows):
        from .ray_payloads import markdown as payload_table

        out += ["", payload_table(rows)]
    return "\n".join(out)


def _ms(r: Optional[Dict]) -> str:
    return "-" if r is None else f"{r['median_s'] * 1e3:.2f} ms (p99 {r['p99_s'] * 1e3:.2f})"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="pyfast_buffer.bench.ray_case", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="batch 512 only, shorter runs")
    args = parser.parse_args(argv)
    skipped: Dict[str, str] = {}
    rows = ray_case(Plan.quick() if args.quick else Plan(), skipped)
    print(markdown(rows) if rows else skipped)
    return 0

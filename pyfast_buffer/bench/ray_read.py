"""Payload ingest that the trainer reads, against the queue a Ray user would write instead (issue 41).

One node: 4 producer actors put payloads of 64 KiB or 1 MiB, 4 per call, for a fixed time; the trainer in the
driver takes 16 at a time and reads every payload (``take`` + ``fetch``: the values in its hands). The baseline:
each producer ``ray.put``s its payloads and sends the refs through ``ray.util.queue.Queue``; the trainer gets 16
refs and ``ray.get``s them. Per row: payloads read per second by the trainer, and ours / the queue.
Each producer makes one put and the trainer reads it before the timed window (both contenders alike).

``python -c "from pyfast_buffer.bench.ray_read import main; main()" [--seconds 6] [--repeats 3] [--inline]
[--sizes 64 1024] [--producers 4]`` prints the rows as a Markdown table: medians of the repeats (the contenders
take turns at going first), the median of the per-run ratios to the queue, and the floor, one core copying the
same bytes. ``--inline`` adds ours with every put's bytes inside its calls, the path before the memory file
(``pyfast_buffer/ray/_shm.py``), same run; ``--producers`` other than 4 leaves the issue's setup.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

SIZES = (64 * 1024, 1024 * 1024)
PRODUCERS = 4
PER_CALL = 4
TAKE = 16
OURS, QUEUE = "pyfast_buffer", "ray Queue (producer refs)"
FLOOR = "copy of the same bytes (floor)"
INLINE = "pyfast_buffer, bytes inline"


def _producer_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class Producer:
        def run(self, target: Any, kind: str, size: int, seconds: float, first_id: int) -> int:
            value = np.random.default_rng(first_id).integers(0, 2**31, size // 8, dtype=np.int64)
            sent, next_id = 0, first_id
            stop = time.perf_counter() + seconds
            while time.perf_counter() < stop:
                self.send(target, kind, value, next_id)
                next_id += PER_CALL
                sent += PER_CALL
            return sent

        def ping(self) -> int:
            return 0

        def warm(self, target: Any, kind: str, size: int, first_id: int) -> None:
            """One put before the timed window: the first call of a process imports what the client needs
            (for ours, pyfast_buffer and torch: ~1.4 s of CPU once), which a 6-second window must not count."""

            value = np.zeros(size // 8, dtype=np.int64)
            if kind == "inline":  # as a process whose memory files the owner cannot open: bytes in the calls
                from ..ray import _sending, _shm

                _shm.mark_unreachable(_shm.key(_sending.owner_here(target.actor)[1]))
            self.send(target, kind, value, first_id)

        def send(self, target: Any, kind: str, value: np.ndarray, first_id: int) -> None:
            """One put of PER_CALL payloads: ours with ids from ``first_id``, or refs into the queue."""
            import ray

            if kind != "queue":
                target.put(np.arange(first_id, first_id + PER_CALL, dtype=np.int64), 0, payloads=[value] * PER_CALL)
            else:
                target.put_nowait_batch([ray.put(value) for _ in range(PER_CALL)])

    return Producer


def _read_ours(buf: Any, stop: threading.Event, got: List[int]) -> None:
    while not stop.is_set():
        try:
            batch = buf.take(TAKE, 0, timeout=0.5)
        except TimeoutError:
            continue
        _, values = buf.fetch(batch)
        got[0] += sum(1 for v in values if v is not None)


def _read_queue(queue: Any, stop: threading.Event, got: List[int]) -> None:
    import ray
    from ray.util.queue import Empty

    while not stop.is_set():
        try:
            refs = queue.get_nowait_batch(TAKE)
        except Empty:
            time.sleep(0.002)
            continue
        got[0] += len(ray.get(refs))


def _drain(target: Any, kind: str, n: int) -> None:
    """Takes and reads the warm-up payloads, so that the timed window starts empty."""
    import ray

    if kind != "queue":
        target.fetch(target.take(n, 0, timeout=30))
    else:
        ray.get([target.get(timeout=30) for _ in range(n)])


def _rate(kind: str, size: int, seconds: float, producers: List[Any]) -> float:
    """Payloads per second the trainer reads from one fresh target while the producers put for ``seconds``."""
    payloads, elapsed, _ = run_once(kind, size, seconds, producers)
    return payloads / elapsed


def run_once(
    kind: str, size: int, seconds: float, producers: List[Any], sample: Optional[Callable[[], Any]] = None
) -> Tuple[int, float, List[Any]]:
    """One timed run on a fresh target ("ours", "inline" or "queue") after the warm-up: the payloads the
    trainer read, the seconds, and what ``sample`` returned just before and just after the timed window."""
    import ray
    from ray.util.queue import Queue

    from ..ray import RemoteBuffer

    target: Any
    if kind != "queue":
        target = RemoteBuffer.create(4096, max_age=10, on_full="evict_oldest", num_cpus=0)
    else:
        target = Queue(maxsize=4096, actor_options={"num_cpus": 0})
        target.size()
    marks: List[Any] = []
    try:
        firsts = [10**9 * (i + 1) for i in range(len(producers))]
        ray.get([p.warm.remote(target, kind, size, first - PER_CALL) for p, first in zip(producers, firsts)])
        _drain(target, kind, len(producers) * PER_CALL)  # the trainer's side warmed too, nothing counted
        stop, got = threading.Event(), [0]
        reader = threading.Thread(target=_read_queue if kind == "queue" else _read_ours, args=(target, stop, got))
        reader.start()
        marks += [sample()] if sample else []
        began = time.perf_counter()
        ray.get([p.run.remote(target, kind, size, seconds, first) for p, first in zip(producers, firsts)])
        elapsed = time.perf_counter() - began
        marks += [sample()] if sample else []
        stop.set()
        reader.join()
        return got[0], elapsed, marks
    finally:
        if kind != "queue":
            target.kill()
        else:
            target.shutdown()


def in_turns(names: List[str], rounds: int, measure: Callable[[str], Any]) -> Dict[str, List[Any]]:
    """``measure(name)`` for every name, ``rounds`` times, the names taking turns at going first (a machine
    that drifts during a run then favours none of them): name -> its results, in round order."""
    results: Dict[str, List[Any]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            results[name].append(measure(name))
    return results


def _copy_rate(size: int, seconds: float = 0.5) -> float:
    """The floor: payloads per second one core copies (the same bytes, memory to fresh memory)."""
    src = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    copies, began = 0, time.perf_counter()
    while time.perf_counter() < began + seconds:
        src.copy()
        copies += 1
    return copies / (time.perf_counter() - began)


def read_rows(
    seconds: float = 6.0, sizes: tuple = SIZES, repeats: int = 1, inline: bool = False, producers: int = PRODUCERS
) -> List[Dict[str, Any]]:
    """One row per size and contender (Ray must be running, one node), and the copy floor: median rates of
    ``repeats`` runs, the contenders taking turns at going first, and the median of the per-run ratios to the
    queue. ``inline`` adds ours with every put's bytes inside its calls (no memory file), as before it;
    ``producers`` changes how many producer actors put (the issue's setup is 4)."""
    if producers < 1:  # checked before Ray is imported: a refused run starts nothing
        raise ValueError(f"producers={producers}: the bench needs at least 1 producer actor (the issue's setup: 4)")
    if not sizes or any(size < 1024 or size % 1024 for size in sizes):
        raise ValueError(f"sizes={sizes}: give payload sizes in bytes, each a positive multiple of 1024 (e.g. 65536)")
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: give at least 1 run per row")
    import ray

    producer_cls = _producer_class()
    actors = [producer_cls.remote() for _ in range(producers)]
    ray.get([p.ping.remote() for p in actors])
    kinds = ["ours", "queue"] + (["inline"] if inline else [])
    names = {"ours": OURS, "queue": QUEUE, "inline": INLINE}
    rows: List[Dict[str, Any]] = []
    for size in sizes:

        def measure(kind: str, size: int = size) -> float:
            return _rate(kind, size, seconds, actors)

        rates = in_turns(kinds, repeats, measure)
        for kind in kinds:
            ratios = [a / q for a, q in zip(rates[kind], rates["queue"]) if q]
            rate = statistics.median(rates[kind])
            x_queue = statistics.median(ratios) if ratios else None
            rows.append(_row(size, names[kind], rate, x_queue, repeats, producers))
        rows.append(_row(size, FLOOR, _copy_rate(size), None, 1, None))
    return rows


def _row(
    size: int, contender: str, rate: float, x_queue: Optional[float], runs: int, producers: Optional[int] = PRODUCERS
) -> Dict[str, Any]:
    return {
        "case": "ray",
        "op": f"ingest read/{size // 1024}KiB",
        "contender": contender,
        "batch": TAKE,
        "payloads_per_s": rate,
        "x_queue": x_queue,
        "median_s": 1.0 / rate if rate else float("inf"),
        "p99_s": None,
        "runs": runs,
        "producers": producers,
    }


def markdown(rows: List[Dict[str, Any]]) -> str:
    """The rows as the table of docs/ray.md: per payload size, each contender's rate and its ratio to the queue."""
    out = ["| payload | contender | payloads/s | runs | ours / queue |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["op"].startswith("ingest read/"):
            ratio = "" if r["x_queue"] is None else f"{r['x_queue']:.2f}x"
            size = _size_label(int(r["op"].split("/", 1)[1].removesuffix("KiB")))
            out.append(f"| {size} | {r['contender']} | {r['payloads_per_s']:,.0f} | {r['runs']} | {ratio} |")
    return "\n".join(out)


def _size_label(kib: int) -> str:
    """64 -> "64 KiB", 1024 -> "1 MiB", 1536 -> "1536 KiB"."""
    return f"{kib // 1024} MiB" if kib % 1024 == 0 else f"{kib} KiB"


def main(argv: Optional[List[str]] = None) -> None:
    import logging

    import ray

    parser = argparse.ArgumentParser(description="Payloads the trainer reads, against producer refs in a queue.")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per row, taking turns; medians reported")
    parser.add_argument("--inline", action="store_true", help="also ours with every put's bytes inside its calls")
    parser.add_argument("--sizes", type=int, nargs="+", default=[s // 1024 for s in SIZES], help="payload KiB")
    parser.add_argument("--producers", type=int, default=PRODUCERS, help="producer actors (the issue's setup: 4)")
    args = parser.parse_args(argv)
    if any(k < 1 for k in args.sizes) or args.producers < 1 or args.repeats < 1:
        parser.error("--sizes (KiB), --producers and --repeats take whole numbers of at least 1")
    from .ray_cluster import init_local_cluster

    init_local_cluster(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        namespace="pyfast_buffer_read",
    )
    try:
        sizes = tuple(k * 1024 for k in args.sizes)
        print(markdown(read_rows(args.seconds, sizes, args.repeats, args.inline, args.producers)))
    finally:
        ray.shutdown()

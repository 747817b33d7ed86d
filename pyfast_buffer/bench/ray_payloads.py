"""Payload ingest on a two-node loopback cluster: RemoteBuffer (an owner per node) vs producer refs in ray Queue.

For 64 KiB and 1 MiB payloads, 4 and 8 producers, all on one node or split over two: producers put
payload values for a fixed time while a trainer in the driver takes batches and drops them (the refs
only: this measures ingest, not the trainer's fetch). The baseline is what a Ray user would write: each
producer ``ray.put``s its payloads and sends the refs through ``ray.util.queue.Queue``. Per row:
payloads/s, MB/s, CPU seconds per payload of the index actor (ours; its takes included) or the queue actor,
and the same less the actor's idle rate (its CPU per second measured just before, with the trainer waiting
and no producer: Ray's own threads and the waiting take, a cost per second that a slow row spreads over few
payloads), how many puts one index call registered (the payload owners' group commit), and store writes per payload
byte on the producers' nodes, from each raylet's own ``cumulative_created_bytes``. The trainer takes
``TAKE_BATCH`` trajectories per call.

Ray's floor: what any Ray actor serving the same calls costs, whatever it does in them. An actor that does
nothing spends ~10 ms of CPU per second on Ray's own threads (its main thread's periodic wake-ups), and
each call costs the actor Ray's machinery before any of our code runs: about twice as much for a call that
finds the actor idle (5 ms or more since the last) as for one of a back-to-back stream, and a row's calls
come tens of milliseconds apart. So each row also measures, just after its producers stop, the index's CPU
per empty call (``ping``, ``FLOOR_CALLS`` of them spaced as the row's index calls were, up to
``FLOOR_GAP_S`` apart, less the idle rate), counts the index calls of the row (the owners' registrations,
the trainer's takes and the receipts it sent alone), and reports the floor per payload, (idle rate x
seconds + calls x empty call) / payloads, and the index's CPU per payload above it: what our code in the
index costs beyond what Ray charges any actor.

Two "nodes" on one machine share its cores unless told otherwise, and then a second node adds processes but
no CPU, which no second machine does. So by default each node (its raylet, workers and actors) and this
driver with node 0 are pinned to their own half of the cores (``LocalCluster(cores=...)``): a one-node row
runs on half the machine, a two-node row on all of it, and "2 nodes / 1 node" measures what the second
node's cores buy. ``--share-cores`` runs both nodes on every core instead.

``python -c "from pyfast_buffer.bench.ray_payloads import main; main()" [--quick]`` prints the table.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .plan import Plan
from .ray_cluster import LocalCluster, object_store_stats

SIZES = (64 * 1024, 1024 * 1024)
PRODUCERS = (4, 8)
#: Payloads per call: about 1 MiB (64 KiB payloads) or 4 MiB (1 MiB payloads) per round trip.
PER_CALL = {64 * 1024: 16, 1024 * 1024: 4}
#: ``--index-bound``: small payloads, one per call, from many producers on one node, so that the index (not
#: the bytes) is what the puts wait for; its registrations then group, and its CPU per payload falls.
INDEX_BOUND = {"sizes": (1024,), "producers": (4, 16), "nodes": (1,), "kinds": ("unjournaled", "ours")}
#: Trajectories per take of the trainer (a training batch; the index's CPU per payload includes its takes).
TAKE_BATCH = 64
#: Seconds the trainer's take of ``TAKE_BATCH`` waits for a full batch: longer than a batch takes to arrive at
#: every rate here, so it seldom times out (a timeout is an exception through Ray, and a second, non-blocking
#: take). A bigger ``--take-batch`` waits as much longer.
TAKE_TIMEOUT_S = 2.0
#: Ring entries of the bench's buffers: 256, or room for 4 takes of a bigger ``--take-batch``.
RING = 256
#: Seconds over which a row first measures the actor's CPU with the trainer waiting and no producer running.
IDLE_S = 1.5
#: Empty calls (``ping``) over which a row measures the index's CPU per call before any code of ours runs.
FLOOR_CALLS = 40
#: Longest gap between those empty calls: they are spaced as the row's index calls were (its seconds over its
#: calls), up to this. Ray charges a call that finds the actor idle about twice what it charges one of a
#: back-to-back stream (its threads go to sleep between them), and the charge levels off from ~5-20 ms apart
#: (``python benchmarks/ray_actor_floor.py``), so spacing them further only makes the row slower.
FLOOR_GAP_S = 0.02
OURS, UNJOURNALED, QUEUE = "pyfast_buffer", "pyfast_buffer, journal=False", "ray Queue (producer refs)"
CASE = "ray"


def _classes() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class PayloadProducer:
        """Puts payload values (ours) or ray.puts and queues refs (the baseline) for ``seconds``."""

        def run(self, target: Any, kind: str, size: int, per_call: int, seconds: float, first_id: int) -> int:
            import ray

            value = np.random.default_rng(first_id).integers(0, 2**31, size // 8, dtype=np.int64)
            sent, next_id = 0, first_id
            stop = time.perf_counter() + seconds
            while time.perf_counter() < stop:
                if kind != "queue":
                    ids = np.arange(next_id, next_id + per_call, dtype=np.int64)
                    target.put(ids, 0, payloads=[value] * per_call)
                else:
                    target.put_nowait_batch([ray.put(value) for _ in range(per_call)])
                next_id += per_call
                sent += per_call
            return sent

        def ping(self) -> int:
            return 0

        def cores(self) -> List[int]:
            import os

            return sorted(os.sched_getaffinity(0))

    return PayloadProducer


def _queue_cpu(queue: Any) -> Optional[float]:
    import ray

    try:
        return float(ray.get(queue.actor.__ray_call__.remote(lambda self: time.process_time()), timeout=60))
    except Exception:  # an older Ray without __ray_call__: the row says "-"
        return None


def _trainer(take: Any, stop: threading.Event) -> None:
    while not stop.is_set():
        if not take():
            time.sleep(0.002)


def _one_row(
    cluster: LocalCluster,
    kind: str,
    size: int,
    producers: int,
    nodes: int,
    seconds: float,
    state: Dict[str, Any],
    take_batch: int = TAKE_BATCH,
) -> Dict[str, Any]:
    import ray
    from ray.util.queue import Empty

    per_call = state.get("per_call") or PER_CALL.get(size, 1)
    node_ids = cluster.node_ids()
    workers = state["workers"][:producers] if nodes == 2 else state["workers_node0"][:producers]
    client = state["unjournaled"] if kind == "unjournaled" else state["client"]
    queue = state["queue"]
    takes = [0]  # index calls the trainer's takes made
    if kind != "queue":

        def cpu() -> Optional[float]:
            return float(ray.get(client.actor.cpu_seconds.remote(), timeout=60))

        def take() -> int:  # blocking: an idle trainer does not spin calls on the index
            takes[0] += 1
            try:
                return len(client.take(take_batch, 0, timeout=TAKE_TIMEOUT_S * max(1.0, take_batch / TAKE_BATCH)))
            except TimeoutError:
                takes[0] += 1
                return len(client.take(take_batch, 0))
    else:

        def cpu() -> Optional[float]:
            return _queue_cpu(queue)

        def take() -> int:
            try:
                return len(queue.get_nowait_batch(min(64, max(1, queue.size()))))
            except Empty:
                return 0

    target = queue if kind == "queue" else client
    ray.get([w.run.remote(target, kind, size, per_call, 0.2, _next(state)) for w in workers])  # warm
    while take():  # empty before the clock starts
        pass
    stop = threading.Event()
    trainer = threading.Thread(target=_trainer, args=(take, stop))
    trainer.start()
    # The index's CPU per second with the trainer waiting and no producer. Not the queue's: its trainer polls
    # (ray Queue has no blocking batch get), and how often depends on the load, so an idle rate says nothing.
    idle = _idle_rate(cpu) if kind != "queue" else None
    before = object_store_stats()
    grouped0 = _registrations(client) if kind != "queue" else None
    calls0 = _index_calls(client, grouped0, takes[0]) if kind != "queue" else 0
    cpu0: Optional[float] = cpu()
    began = time.perf_counter()
    sent = sum(ray.get([w.run.remote(target, kind, size, per_call, seconds, _next(state)) for w in workers]))
    elapsed = time.perf_counter() - began
    after = object_store_stats()
    cpu1: Optional[float] = cpu()
    grouped1 = _registrations(client) if kind != "queue" else None
    index_calls = _index_calls(client, grouped1, takes[0]) - calls0 + 1 if kind != "queue" else 0  # + the last cpu()
    gap = min(FLOOR_GAP_S, elapsed / max(1, index_calls))  # the empty calls come as far apart as the row's did
    empty_call = (
        None if idle is None else empty_call_cpu(cpu, lambda: ray.get(client.actor.ping.remote()), idle, gap_s=gap)
    )  # while the trainer still waits in its take, as when the idle rate was measured
    floor = None if idle is None or empty_call is None else ray_floor(idle, empty_call, index_calls, elapsed, sent)
    stop.set()
    trainer.join()
    while take():
        pass
    written = {
        n: after[n]["created_bytes"] - before[n]["created_bytes"] for n in node_ids if n in after and n in before
    }

    producer_nodes = node_ids[:nodes]
    offered = sent * size
    return {
        "case": CASE,
        "op": f"payloads/{size // 1024}KiB/{producers}p/{nodes}n",
        "contender": {"ours": OURS, "unjournaled": UNJOURNALED, "queue": QUEUE}[kind],
        "batch": per_call,
        "producers": producers,
        "nodes": nodes,
        "payload_bytes": size,
        "entries_per_s": sent / elapsed,
        "median_s": elapsed / sent,
        "mb_per_s": offered / elapsed / 1e6,
        "actor_cpu_ms_per_payload": None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) * 1e3 / sent,
        "actor_idle_cpu_ms_per_s": None if idle is None else idle * 1e3,
        "actor_cpu_ms_per_payload_less_idle": (
            None if cpu0 is None or cpu1 is None or idle is None else (cpu1 - cpu0 - idle * elapsed) * 1e3 / sent
        ),
        "ray_empty_call_cpu_ms": None if empty_call is None else empty_call * 1e3,
        "ray_empty_call_gap_ms": None if kind == "queue" else gap * 1e3,
        "index_calls_per_payload": None if kind == "queue" else index_calls / sent,
        "ray_floor_ms_per_payload": None if floor is None else floor * 1e3,
        "actor_cpu_ms_per_payload_above_floor": (
            None if cpu0 is None or cpu1 is None or floor is None else (cpu1 - cpu0) * 1e3 / sent - floor * 1e3
        ),
        "take_batch": take_batch,
        "puts_per_index_call": _grouping(grouped0, grouped1),
        "writes_per_byte_producer_nodes": sum(written[n] for n in producer_nodes) / offered,
        "writes_per_byte_all_nodes": sum(written.values()) / offered,
        "spilled_bytes": sum(s["spilled_bytes"] for s in after.values()),
        "runs": 1,
    }


def _idle_rate(cpu: Any) -> Optional[float]:
    """CPU seconds per second the actor spends over ``IDLE_S`` with no producer running (Ray's own threads, the
    trainer's waiting take): a cost per second, not per payload, which a row's CPU per payload includes."""
    first = cpu()
    began = time.perf_counter()
    time.sleep(IDLE_S)
    last = cpu()
    return None if first is None or last is None else (last - first) / (time.perf_counter() - began)


def empty_call_cpu(cpu: Any, call: Any, idle: float, calls: int = FLOOR_CALLS, gap_s: float = 0.0) -> Optional[float]:
    """An actor's CPU seconds per empty ``call()`` (``calls`` of them, one at a time, ``gap_s`` apart; ``cpu()``
    reads its CPU seconds), less its idle rate over the block, sleeps included: what Ray's machinery costs an
    actor per call before any code of ours runs, for calls that come ``gap_s`` apart."""
    first = cpu()
    began = time.perf_counter()
    for i in range(calls):
        if i and gap_s > 0:
            time.sleep(gap_s)
        call()
    last = cpu()  # a call too: the block is calls + 1 calls between the two readings
    took = time.perf_counter() - began
    return None if first is None or last is None else max(0.0, last - first - idle * took) / (calls + 1)


def ray_floor(idle: float, empty_call: float, calls: int, seconds: float, payloads: int) -> float:
    """CPU seconds per payload that Ray charges any actor serving ``calls`` calls over ``seconds`` (its idle rate
    ``idle`` per second, ``empty_call`` per call), whatever the calls do: the physical floor of the index's
    CPU per payload. Raises ValueError for no payloads (a rate of nothing)."""
    if payloads <= 0:
        raise ValueError(f"payloads={payloads}: the floor is per payload; pass a row that moved payloads (> 0)")
    return (idle * seconds + empty_call * calls) / payloads


def _index_calls(client: Any, registered: Optional[Tuple[int, int]], takes: int) -> int:
    """Index calls so far of the payload rows' kinds: the owners' registrations (``_registrations``), the
    trainer's ``takes`` and the receipts this process sent alone (not carried by a take)."""
    from ..ray._receipts import receipts_for

    return (0 if registered is None else registered[0]) + takes + receipts_for(client.actor).alone


def _registrations(client: Any) -> Optional[Tuple[int, int]]:
    """(index calls, puts registered) summed over the buffer's payload owners; None where owners do not
    group their registrations (a build before the group commit)."""
    import ray

    calls = items = 0
    for owner in ray.get(client.actor.owners.remote(), timeout=60):
        if owner is None or not hasattr(owner, "registrations"):
            return None
        got: Dict[str, int] = ray.get(owner.registrations.remote(), timeout=60)
        calls, items = calls + got["calls"], items + got["items"]
    return calls, items


def _grouping(before: Optional[Tuple[int, int]], after: Optional[Tuple[int, int]]) -> Optional[float]:
    if before is None or after is None or after[0] == before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


def _next(state: Dict[str, Any]) -> int:
    state["next_id"] += 1 << 32  # every producer run gets ids of its own (ids with payloads are unique)
    return int(state["next_id"])


def payload_rows(
    plan: Plan,
    take_batch: int = TAKE_BATCH,
    sizes: Tuple[int, ...] = SIZES,
    producer_counts: Tuple[int, ...] = PRODUCERS,
    nodes_list: Tuple[int, ...] = (1, 2),
    kinds: Tuple[str, ...] = ("ours", "unjournaled", "queue"),
    pin_nodes: bool = False,
    per_call: Optional[int] = None,
    seconds: Optional[float] = None,
) -> List[Dict[str, Any]]:
    """Starts a two-node loopback cluster, measures every row (every contender), stops the cluster.

    ``per_call``: payloads per put call of every producer (default ``PER_CALL`` by size).
    ``pin_nodes``: each node (and this driver, with node 0) runs on its own half of this machine's cores, so
    that the second node adds cores as a second machine would; the one-node rows then have half the cores.
    """
    import ray
    from ray.util.queue import Queue

    from ..ray import RemoteBuffer

    seconds = seconds or max(1.0, plan.throughput_seconds * 2)
    ring = max(RING, 4 * take_batch)
    cores = _halves() if pin_nodes else None
    cluster = LocalCluster(nodes=2, cpus_per_node=16, object_store_bytes=512 * 2**20, cores=cores)
    driver_cores = os.sched_getaffinity(0)
    if cores is not None:  # the trainer (this driver) runs on the head node's cores
        os.sched_setaffinity(0, cores[0])
    try:
        cluster.connect(namespace="pyfast_buffer_bench")
        producer_cls = _classes()
        split = [producer_cls.options(resources={f"node{i % 2}": 1}).remote() for i in range(max(producer_counts))]
        node0 = [producer_cls.options(resources={"node0": 1}).remote() for _ in range(max(producer_counts))]
        ray.get([w.ping.remote() for w in split + node0])
        if cores is not None:  # the pinning holds in the actors the nodes started (the raylets passed it on)
            for i, w in enumerate(split):
                if not set(ray.get(w.cores.remote())) <= set(cores[i % 2]):
                    raise RuntimeError(f"a producer of node {i % 2} runs off that node's cores {cores[i % 2]}")
        client = RemoteBuffer.create(ring, max_age=10, on_full="evict_oldest", num_cpus=0, name="bench-payloads")
        unjournaled = RemoteBuffer.create(ring, max_age=10, num_cpus=0, name="bench-payloads-nj", journal=False)
        queue = Queue(maxsize=0, actor_options={"num_cpus": 0})
        state = {"workers": split, "workers_node0": node0, "client": client, "queue": queue, "next_id": 0}
        state["unjournaled"] = unjournaled
        state["per_call"] = per_call
        rows = []
        for size in sizes:
            for producers in producer_counts:
                for nodes in nodes_list:
                    for kind in kinds:
                        rows.append(_one_row(cluster, kind, size, producers, nodes, seconds, state, take_batch))
        client.kill()
        unjournaled.kill()
        queue.shutdown()
        for row in rows:
            row["pinned_cores"] = None if cores is None else [len(c) for c in cores]
        return rows
    finally:
        os.sched_setaffinity(0, driver_cores)
        cluster.stop()


def can_pin() -> bool:
    """Whether this process may run on 2 or more cores (so each node can have cores of its own)."""
    return len(os.sched_getaffinity(0)) >= 2


def _halves() -> List[List[int]]:
    """This process's cores split in two halves (node 0 gets the first), or ValueError on one core."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        raise ValueError("pinning the nodes needs at least 2 CPU cores (one per node): pass --share-cores")
    return [mine[: len(mine) // 2], mine[len(mine) // 2 :]]


def markdown(rows: List[Dict[str, Any]]) -> str:
    """The table of docs/ray.md: per row, ours next to the queue, and the second node's speed-up."""
    out = [
        "| payload | producers | nodes | contender | payloads/s | MB/s | actor CPU per payload | less its idle "
        "rate | Ray's floor per payload (index calls per payload x empty call, calls apart) | index CPU above "
        "the floor | puts per index call | store writes per byte (producer nodes / all) | 2 nodes / 1 node |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    by_key: Dict[Tuple[int, int, int, str], Dict[str, Any]] = {
        (r["payload_bytes"], r["producers"], r["nodes"], r["contender"]): r for r in rows if "nodes" in r
    }
    for (size, producers, nodes, contender), r in sorted(by_key.items()):
        one = by_key.get((size, producers, 1, contender))
        scale = f"{r['entries_per_s'] / one['entries_per_s']:.2f}x" if nodes == 2 and one else ""
        cpu = r["actor_cpu_ms_per_payload"]
        less = r.get("actor_cpu_ms_per_payload_less_idle")
        idle = r.get("actor_idle_cpu_ms_per_s")
        grouped = r.get("puts_per_index_call")
        above = r.get("actor_cpu_ms_per_payload_above_floor")
        out.append(
            f"| {size // 1024} KiB | {producers} | {nodes} | {contender} | {r['entries_per_s']:.0f} "
            f"| {r['mb_per_s']:.0f} | {'-' if cpu is None else f'{cpu:.3f} ms'} "
            f"| {'-' if less is None or idle is None else f'{less:.3f} ms (idle {idle:.0f} ms/s)'} "
            f"| {_floor_cell(r)} "
            f"| {'-' if above is None else f'{above:.3f} ms'} "
            f"| {'-' if grouped is None else f'{grouped:.1f}'} "
            f"| {r['writes_per_byte_producer_nodes']:.2f} / {r['writes_per_byte_all_nodes']:.2f} | {scale} |"
        )
    return "\n".join(out)


def _floor_cell(row: Dict[str, Any]) -> str:
    floor, calls, empty = (
        row.get(k) for k in ("ray_floor_ms_per_payload", "index_calls_per_payload", "ray_empty_call_cpu_ms")
    )
    if floor is None or calls is None or empty is None:
        return "-"
    gap = row.get("ray_empty_call_gap_ms")
    return f"{floor:.3f} ms ({calls:.3f} x {empty:.2f} ms{'' if gap is None else f', {gap:.0f} ms apart'})"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="pyfast_buffer.bench.ray_payloads", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--take-batch", type=int, default=TAKE_BATCH, help="trajectories per take of the trainer")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--index-bound", action="store_true", help="1 KiB payloads from 4 and 16 producers")
    parser.add_argument(
        "--share-cores",
        action="store_true",
        help="let both nodes use every core (default: each node on its own half, so a node adds cores)",
    )
    parser.add_argument("--sizes", type=int, nargs="+", help="payload sizes in KiB (default 64 1024)")
    parser.add_argument("--producers", type=int, nargs="+", help="producer counts (default 4 8)")
    parser.add_argument("--per-call", type=int, help="payloads per put call (default 16 of 64 KiB, 4 of 1 MiB)")
    parser.add_argument("--seconds", type=float, help="seconds of producing per row (default 2; 0.8 with --quick)")
    parser.add_argument("--kinds", nargs="+", choices=("ours", "unjournaled", "queue"), help="contenders (default all)")
    args = parser.parse_args(argv)
    if args.per_call is not None and args.per_call < 1:
        parser.error(f"--per-call {args.per_call}: pass a number of payloads >= 1")
    if args.seconds is not None and args.seconds <= 0:
        parser.error(f"--seconds {args.seconds}: pass a number of seconds > 0")
    if args.take_batch < 1:
        parser.error(f"--take-batch {args.take_batch}: pass a number of trajectories >= 1")
    plan = Plan.quick() if args.quick else Plan()
    if args.index_bound:
        bound: Dict[str, Any] = INDEX_BOUND
        rows = payload_rows(plan, args.take_batch, bound["sizes"], bound["producers"], bound["nodes"], bound["kinds"])
    else:
        rows = payload_rows(
            plan,
            args.take_batch,
            tuple(k * 1024 for k in args.sizes) if args.sizes else SIZES,
            tuple(args.producers) if args.producers else PRODUCERS,
            kinds=tuple(args.kinds) if args.kinds else ("ours", "unjournaled", "queue"),
            pin_nodes=can_pin() and not args.share_cores,
            per_call=args.per_call,
            seconds=args.seconds,
        )
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(markdown(rows))
    return 0

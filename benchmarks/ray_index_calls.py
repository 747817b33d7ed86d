"""The index actor's CPU per call, by kind (docs/ray.md, "Where the index's CPU per payload goes").

Usage: python benchmarks/ray_index_calls.py [--calls 300] [--records] [--snapshot-ids 1048576]

One process on a private one-node loopback cluster, for a buffer with and without the journal: ``--calls``
calls of each kind from this driver, one at a time, and the index process's CPU time (every thread)
before and after each block: an empty call (``ping``), a registration of one put of 16 ids (what a
payload owner sends), a take of 64 followed by its receipt as a call of its own, and a take of 64
carrying the previous take's receipt (as the client sends them). Each block runs twice; both are printed.

``--records`` instead times one journal record's parts inside the index (``__ray_call__``, so no Ray call is
in the timing): building the record, encoding it, and a whole commit (mark under the lock, then wait until it
is written), as process CPU and wall time per record, for a registration's record; and the payload tables'
work for 64 ids (their owner and size set as a put is admitted, dropped as a take hands them out).

``--snapshot-ids N`` instead fills the index's payload tables (owner slot and bytes per id) with N ids inside
the index and takes snapshots: how long each held the index lock, and how long the whole snapshot took.
The ring stays empty, so this is the tables' part of a snapshot (the ring's copy is timed in docs/ray.md).
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, List, Tuple

import numpy as np


def _captured_admission(self: Any) -> None:
    """Inside the index: keeps the arguments of the next admission (a real owner's registration item)."""
    self._captured = []
    admit_now = self._admit_now

    def capture(*args: Any) -> Any:
        self._captured.append(args)
        return admit_now(*args)

    self._admit_now = capture


def _first_admission(self: Any) -> Any:
    del self._admit_now
    return self._captured[0]


def measure(journal: Any, calls: int) -> List[Tuple[str, float]]:
    import ray

    from pyfast_buffer.ray import RemoteBuffer

    buf = RemoteBuffer.create(1 << 20, max_age=10, num_cpus=0, journal=journal)
    try:
        ray.get(buf.actor.__ray_call__.remote(_captured_admission))
        buf.put(np.arange(16, dtype=np.int64), 0, payloads=[np.zeros(8)] * 16)
        _request, call, sizes, slot = ray.get(buf.actor.__ray_call__.remote(_first_admission))
        state = {"id": 1 << 30, "request": 1 << 40, "previous": 0}

        def register() -> None:
            ids = np.arange(state["id"], state["id"] + 16, dtype=np.int64)
            state["id"] += 16
            state["request"] += 1
            item = ("admit", state["request"], {**call, "traj_ids": ids}, sizes, slot)
            ray.get(buf.actor.register.options(concurrency_group="blocking").remote([item]))

        def take_then_receipt() -> None:
            state["request"] += 1
            ray.get(buf.actor.take.remote(state["request"], 64, 0, None))
            ray.get(buf.actor.received.remote(state["request"], np.empty(0, np.int64)))

        def take_carrying() -> None:
            state["request"] += 1
            carried = [state["previous"]] if state["previous"] else []
            ray.get(buf.actor.take.remote(state["request"], 64, 0, None, carried))
            state["previous"] = state["request"]

        kinds: List[Tuple[str, Callable[[], None], int]] = [
            ("ping", lambda: ray.get(buf.actor.ping.remote()), calls),
            ("register 1 put of 16", register, calls),
            ("take 64 + receipt call", take_then_receipt, calls // 4),
            ("take 64 carrying a receipt", take_carrying, calls // 4),
        ]
        out = []
        for _ in range(2):
            for name, fn, n in kinds:
                if name.startswith("take"):
                    for _ in range(n * 4):  # 64 ids for each take
                        register()
                before = ray.get(buf.actor.cpu_seconds.remote())
                for _ in range(n):
                    fn()
                out.append((name, (ray.get(buf.actor.cpu_seconds.remote()) - before) / n))
        return out
    finally:
        buf.kill()


def _time_records(self: Any, n: int) -> List[Tuple[str, float, float]]:
    """Inside the index: CPU and wall seconds per record of its parts (the state changes nothing: no call runs)."""
    import time

    from pyfast_buffer.ray import _effects, _journal

    def timed(name: str, fn: Callable[[], Any]) -> Tuple[str, float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(n):
            fn()
        return name, (time.process_time() - cpu) / n, (time.perf_counter() - wall) / n

    def commit() -> None:
        with self._lock:
            version = self._journal.mark()
        self._journal.wait(version)

    ids = iter(range(1 << 50, 1 << 51, 64))

    def tables() -> None:  # what a payload's owner and size cost the index: set at admission, dropped at take
        traj_ids = np.arange(64, dtype=np.int64) + next(ids)
        _run, record, _repeat = self._admission(0, {"kind": "put", "traj_ids": traj_ids}, np.full(64, 65536), 0)
        record()
        self._forget(traj_ids, notify=False)
        _effects.start_logs(self._where, self._sizes)  # as the record of each call takes its logs

    with self._lock:
        record = self._record()
        rows = [timed("build the record", self._record), timed("encode it", lambda: _journal.encode_record(record))]
        rows.append(timed("payload tables of 64 ids: set at admission, dropped at take", tables))
    return [*rows, timed("commit: mark + wait until written", commit)]


def _time_snapshot(self: Any, ids: int) -> Tuple[float, float]:
    """Inside the index: payload tables of ``ids`` ids, then one snapshot; (lock held, whole snapshot) seconds."""
    import time

    keys = range(1 << 40, (1 << 40) + ids)
    with self._lock:  # dict.update: filled as if by many calls, whose records took their logs along
        dict.update(self._where, zip(keys, [0] * ids))
        dict.update(self._sizes, zip(keys, [65536] * ids))
    with self._lock:  # what a snapshot does under the lock (the journal's snapshot() holds it just so)
        start = time.perf_counter()
        self._capture()
        held = time.perf_counter() - start
    start = time.perf_counter()
    self._journal.snapshot()
    return held, time.perf_counter() - start


def _inside_fresh_indexes(rounds: int, capacity: int, fn: Callable[..., Any], *args: Any) -> List[Any]:
    """``fn(index, *args)`` run inside each of ``rounds`` fresh indexes (after a put of 64 ids), one answer each."""
    import ray

    from pyfast_buffer.ray import RemoteBuffer

    answers = []
    for _ in range(rounds):
        buf = RemoteBuffer.create(capacity, max_age=10, num_cpus=0)
        try:
            buf.put(np.arange(64, dtype=np.int64), 0, payloads=[np.zeros(8)] * 64)
            answers.append(ray.get(buf.actor.__ray_call__.remote(fn, *args), timeout=600))
        finally:
            buf.kill()
    return answers


def snapshots(ids: int) -> None:
    print("| payload ids | snapshot: index lock held | whole snapshot |")
    print("| --- | --- | --- |")
    for held, whole in _inside_fresh_indexes(3, 1 << 10, _time_snapshot, ids):
        print(f"| {ids:,} | {held * 1e3:.0f} ms | {whole * 1e3:.0f} ms |")


def records(n: int) -> None:
    print("| part of a journal record | index CPU per record | wall per record |")
    print("| --- | --- | --- |")
    for rows in _inside_fresh_indexes(2, 1 << 20, _time_records, n):
        for name, cpu, wall in rows:
            print(f"| {name} | {cpu * 1e6:.0f} us | {wall * 1e6:.0f} us |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--records", action="store_true", help="time a journal record's parts inside the index")
    parser.add_argument("--snapshot-ids", type=int, help="time a snapshot of payload tables of this many ids")
    args = parser.parse_args()
    from pyfast_buffer.bench.ray_cluster import LocalCluster

    cluster = LocalCluster(nodes=1, cpus_per_node=16, object_store_bytes=256 * 2**20)
    try:
        cluster.connect(namespace="index_calls")
        if args.records:
            records(max(args.calls, 1000))
            return
        if args.snapshot_ids:
            snapshots(args.snapshot_ids)
            return
        print("| journal | call | index CPU per call |")
        print("| --- | --- | --- |")
        for label, journal in (("off", False), ("on", None)):
            for name, seconds in measure(journal, args.calls):
                print(f"| {label} | {name} | {seconds * 1e3:.3f} ms |", flush=True)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()

"""What the index's journal costs per call as the ring grows: take and put through RemoteBuffer at several
ring sizes, with the journal and without it, beside ``ray.util.queue.Queue`` holding as many items.

Each ring is filled to capacity first (``on_full="evict_oldest"`` keeps it full); then each round times one
take of ``batch`` entries and one put of ``batch`` new ids (the refill), ``repeat`` rounds after a warm-up,
medians reported. The queue does the same with ``get_nowait_batch``/``put_nowait_batch``. Bytes per call
are the journal's own count (``journal_stats``) over the timed rounds.

``python -m pyfast_buffer.bench.ray_journal [--sizes 4096 65536 1048576] [--repeat 30]`` prints the table
of docs/ray.md ("What the journal costs").
"""

from __future__ import annotations

import argparse
import functools
import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from .plan import CURRENT_STEP
from .ray_cluster import init_local_cluster
from .timing import median

CASE = "ray"
OURS, OURS_NO_JOURNAL, QUEUE = "pyfast_buffer", "pyfast_buffer, journal=False", "ray Queue"
SIZES = (4096, 1 << 16)
FILL_CHUNK = 1 << 15


def _rounds(take: Any, put: Any, repeat: int) -> Dict[str, List[float]]:
    times: Dict[str, List[float]] = {"take": [], "put": []}
    for i in range(repeat + 3):  # three warm-up rounds, not kept
        t0 = time.perf_counter()
        take()
        t1 = time.perf_counter()
        put(i)
        t2 = time.perf_counter()
        if i >= 3:
            times["take"].append(t1 - t0)
            times["put"].append(t2 - t1)
    return times


def _refill(buf: Any, ids: np.ndarray, size: int) -> Callable[[int], Any]:
    """Round i's put: ``len(ids)`` ids never used before (a full ring evicts as many of its oldest)."""
    return lambda i: buf.put(ids + size * (i + 2), CURRENT_STEP)


def _queue_refill(queue: Any, items: List[int], _round: int) -> None:
    queue.put_nowait_batch(items)


def _row(op: str, contender: str, size: int, batch: int, times: List[float], **extra: Any) -> Dict[str, Any]:
    return {
        "case": CASE,
        "op": f"journal/{op}",  # ray_case's own take rows are "take"
        "contender": contender,
        "capacity": size,
        "batch": batch,
        "median_s": median(times),
        "runs": len(times),
        **extra,
    }


def journal_rows(sizes: Sequence[int] = SIZES, repeat: int = 30, batch: int = 256) -> List[Dict[str, Any]]:
    """Take and put medians per ring size for the journaled index, the unjournaled one and ray Queue."""
    import ray
    from ray.util.queue import Queue

    from ..ray import RemoteBuffer

    rows: List[Dict[str, Any]] = []
    for size in sizes:
        for name, journal in ((OURS, None), (OURS_NO_JOURNAL, False)):
            buf = RemoteBuffer.create(size, max_age=10, on_full="evict_oldest", num_cpus=0, journal=journal)
            try:
                for start in range(0, size, FILL_CHUNK):
                    buf.put(np.arange(start, min(size, start + FILL_CHUNK), dtype=np.int64), CURRENT_STEP)
                ids = np.arange(batch, dtype=np.int64)
                before: Dict[str, Any] = ray.get(buf.actor.journal_stats.remote())
                times = _rounds(functools.partial(buf.take, batch, CURRENT_STEP), _refill(buf, ids, size), repeat)
                after: Dict[str, Any] = ray.get(buf.actor.journal_stats.remote())
                calls = 2 * (repeat + 3)
                per_call = (after.get("bytes", 0) - before.get("bytes", 0)) / calls if "bytes" in after else None
                for op in ("take", "put"):
                    rows.append(_row(op, name, size, batch, times[op], journal_bytes_per_call=per_call))
            finally:
                buf.kill()
        queue = Queue(actor_options={"num_cpus": 0})
        try:
            for start in range(0, size, FILL_CHUNK):
                queue.put_nowait_batch(list(range(start, min(size, start + FILL_CHUNK))))
            refill = functools.partial(_queue_refill, queue, list(range(batch)))
            times = _rounds(functools.partial(queue.get_nowait_batch, batch), refill, repeat)
            for op in ("take", "put"):
                rows.append(_row(op, QUEUE, size, batch, times[op]))
        finally:
            queue.shutdown()
    return rows


def markdown(rows: List[Dict[str, Any]]) -> str:
    """The table of docs/ray.md: medians, and the journaled index over the queue and over journal=False."""

    def find(op: str, contender: str, size: int) -> Dict[str, Any]:
        return next(
            r for r in rows if r["op"] == f"journal/{op}" and r["contender"] == contender and r["capacity"] == size
        )

    out = [
        "| ring | call | journal | journal=False | ray Queue | journal / Queue | journal / journal=False "
        "| journal bytes per call |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for size in sorted({r["capacity"] for r in rows if r["op"].startswith("journal/")}):
        for op in ("take", "put"):
            ours, nj, q = (find(op, c, size) for c in (OURS, OURS_NO_JOURNAL, QUEUE))
            per_call = ours.get("journal_bytes_per_call")
            out.append(
                f"| {size:,} | {op} {ours['batch']} | {ours['median_s'] * 1e3:.2f} ms | {nj['median_s'] * 1e3:.2f} ms "
                f"| {q['median_s'] * 1e3:.2f} ms | {ours['median_s'] / q['median_s']:.1f}x "
                f"| {ours['median_s'] / nj['median_s']:.1f}x | {'-' if per_call is None else f'{per_call:,.0f}'} |"
            )
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    import ray

    parser = argparse.ArgumentParser(prog="pyfast_buffer.bench.ray_journal", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args(argv)
    init_local_cluster(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        namespace="pyfast_buffer_bench_journal",
    )
    try:
        print(markdown(journal_rows(args.sizes, args.repeat, args.batch)))
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

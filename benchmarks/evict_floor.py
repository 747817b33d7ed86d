"""evict_stale of 1e7 shuffled entries (half stale) against copies of 64 and of 16 bytes an entry, in one process.

    python benchmarks/evict_floor.py [--rounds 9] [--capacity 10000000]

Each round refills the ring (untimed), times one evict_stale, then one numpy copy of whole 64-byte rows and one of
the ids and steps alone; prints the medians and evict's ratio to each (docs/performance.md, issue 50).
"""

import argparse
import statistics
import time

import numpy as np

import pyfast_buffer as pfb
from pyfast_buffer.bench.plan import CURRENT_STEP, MAX_AGE, stamps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--capacity", type=int, default=10_000_000)
    args = parser.parse_args()
    n = args.capacity
    ids = np.arange(n, dtype=np.int64)
    steps = stamps(n, 0.5, np.random.default_rng(1))
    buf = pfb.StalenessBuffer(n, max_age=MAX_AGE)
    rows = np.ones(n * 64, np.uint8)
    rows_to = np.empty_like(rows)
    ids_to, steps_to = np.empty_like(ids), np.empty_like(steps)
    times: dict = {"evict_stale": [], "copy of 64 B rows": [], "copy of ids+steps": []}
    for _ in range(args.rounds):
        buf.put(ids, steps)
        start = time.perf_counter()
        buf.evict_stale(CURRENT_STEP)
        times["evict_stale"].append(time.perf_counter() - start)
        buf.evict_oldest(len(buf))  # empty for the next refill (every entry is its own group)
        start = time.perf_counter()
        np.copyto(rows_to, rows)
        times["copy of 64 B rows"].append(time.perf_counter() - start)
        start = time.perf_counter()
        np.copyto(ids_to, ids)
        np.copyto(steps_to, steps)
        times["copy of ids+steps"].append(time.perf_counter() - start)
    medians = {k: statistics.median(v) for k, v in times.items()}
    for name, median in medians.items():
        print(f"{name:18s} {median * 1e3:8.2f} ms   evict_stale / this {medians['evict_stale'] / median:5.2f}x")


if __name__ == "__main__":
    main()

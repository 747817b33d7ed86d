"""What one ``ray.put`` of a payload costs on this node, the work every contender of ``ray_read`` pays once per
payload (docs/ray.md, "payloads the trainer reads", "The ceiling at 1 MiB"):

    python benchmarks/ray_put_cost.py [--size-kib 1024] [--rounds 3]

- puts per second of one payload, by 1 process with 1 thread, 1 process with 4 threads (our payload owner serves
  its producers' puts in threads of one process), 2 and 4 processes (the queue's producers each put their own);
- 4 payloads put as 4 objects (what a put of 4 costs our owner and each queue producer) against one object
  holding all 4 (fewer store calls; not what we do, because each payload keeps an ObjectRef of its own):
  median wall and thread CPU of one such put;
- the floor: one core copying the same bytes.
Medians over ``--rounds`` rounds, the shapes taking turns at going first; the putters of a shape put in one shared
window of wall-clock time, and their counts add up over it.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time
from typing import Any, Callable, Dict, List

import numpy as np
import ray

WINDOW_S = 0.5  # seconds every putter of a shape puts for, all in the same window
KEEP = 8  # refs a putter holds at once (a producer's payloads live a while; the store recycles the rest)


@ray.remote(num_cpus=0)
class Putter:
    def __init__(self, size: int) -> None:
        self.values = [np.random.default_rng(i).integers(0, 255, size, dtype=np.uint8) for i in range(4)]

    def count(self, threads: int, start: float, seconds: float) -> int:
        """Puts that ``threads`` threads finish between ``start`` and ``start + seconds`` (wall clock, shared
        by every putter of a shape, so that their counts add up over one window)."""
        done = [0] * threads

        def work(t: int) -> None:
            held: List[ray.ObjectRef] = []
            while time.time() < start:
                time.sleep(0.001)
            while time.time() < start + seconds:
                held.append(ray.put(self.values[done[t] % 4]))
                done[t] += 1
                if len(held) > KEEP:
                    held.pop(0)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return sum(done)

    def four(self, grouped: bool, n: int = 100) -> Dict[str, float]:
        """Median wall and thread CPU (ms) of putting the 4 payloads as 4 objects or as one."""
        walls, cpus, held = [], [], []
        for _ in range(n):
            wall, cpu = time.perf_counter(), time.thread_time()
            held.append(ray.put(self.values) if grouped else [ray.put(v) for v in self.values])
            walls.append(time.perf_counter() - wall)
            cpus.append(time.thread_time() - cpu)
            if len(held) > KEEP // 4:
                held.pop(0)
        return {"wall": statistics.median(walls) * 1e3, "cpu": statistics.median(cpus) * 1e3}


def _rate(putters: List[Any], threads: int) -> float:
    """Puts per second of ``putters`` (each with ``threads`` threads) over one shared window."""
    start = time.time() + 0.2  # every putter is waiting before the window opens
    return sum(ray.get([p.count.remote(threads, start, WINDOW_S) for p in putters])) / WINDOW_S


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size-kib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.size_kib < 1 or args.rounds < 1:
        parser.error("--size-kib and --rounds take whole numbers of at least 1")
    size = args.size_kib * 1024

    from pyfast_buffer.bench.ray_cluster import init_local_cluster
    from pyfast_buffer.bench.ray_read import _copy_rate, in_turns

    init_local_cluster(num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        putters = [Putter.remote(size) for _ in range(4)]
        _rate(putters, 1)  # warm: each process's first puts map the store
        shapes: Dict[str, Callable[[], float]] = {
            "1 process, 1 thread": lambda: _rate(putters[:1], 1),
            "1 process, 4 threads (our owner serves its producers in threads of one process)": lambda: _rate(
                putters[:1], 4
            ),
            "2 processes": lambda: _rate(putters[:2], 1),
            "4 processes (the queue's producers)": lambda: _rate(putters, 1),
        }
        rates = in_turns(list(shapes), args.rounds, lambda name: shapes[name]())
        print(f"| {args.size_kib} KiB payloads | puts/s (median of {args.rounds} windows of {WINDOW_S} s) |")
        print("| --- | --- |")
        for name, got in rates.items():
            print(f"| {name} | {statistics.median(got):,.0f} |")
        print(f"| copy of the same bytes, one core (floor) | {_copy_rate(size):,.0f} |")
        print()
        print("| 4 payloads, one caller | wall ms | thread CPU ms |")
        print("| --- | --- | --- |")
        grouped = {"4 objects (ours, the queue's)": False, "1 object holding 4": True}
        times = in_turns(list(grouped), args.rounds, lambda name: ray.get(putters[0].four.remote(grouped[name])))
        for name, got in times.items():
            wall = statistics.median(g["wall"] for g in got)
            cpu = statistics.median(g["cpu"] for g in got)
            print(f"| {name} | {wall:.2f} | {cpu:.2f} |")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()

"""What one ``ray.put`` of a payload costs on this node, the work every contender of ``ray_read`` pays once per
payload (docs/ray.md, "payloads the trainer reads", "The ceiling at 1 MiB"):

    python benchmarks/ray_put_cost.py [--size-kib 1024] [--rounds 3]

- puts per second of one payload, by 1 process with 1 thread, 1 process with 4 threads (our payload owner serves
  its producers' puts in threads of one process), 2 and 4 processes (the queue's producers each put their own);
- 4 payloads put as 4 objects (what a put of 4 costs our owner and each queue producer) against one object
  holding all 4 (fewer store calls; not what we do, because each payload keeps an ObjectRef of its own):
  median wall and thread CPU of one such put;
- the floor: one core copying the same bytes.
Medians over ``--rounds`` rounds, the shapes taking turns at going first.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time
from typing import Dict, List

import numpy as np
import ray

PUTS = 100  # per thread and round
KEEP = 8  # refs a putter holds at once (a producer's payloads live a while; the store recycles the rest)


@ray.remote(num_cpus=0)
class Putter:
    def __init__(self, size: int) -> None:
        self.values = [np.random.default_rng(i).integers(0, 255, size, dtype=np.uint8) for i in range(4)]

    def rate(self, threads: int) -> float:
        """Puts per second of ``threads`` threads each putting PUTS payloads (holding the last KEEP)."""

        def work() -> None:
            held: List[ray.ObjectRef] = []
            for i in range(PUTS):
                held.append(ray.put(self.values[i % 4]))
                if len(held) > KEEP:
                    held.pop(0)

        workers = [threading.Thread(target=work) for _ in range(threads)]
        began = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return threads * PUTS / (time.perf_counter() - began)

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


def _copy_rate(size: int, seconds: float = 0.5) -> float:
    src = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    copies, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        src.copy()
        copies += 1
    return copies / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-kib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    size = args.size_kib * 1024

    from pyfast_buffer.bench.ray_cluster import init_local_cluster

    init_local_cluster(num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        putters = [Putter.remote(size) for _ in range(4)]
        ray.get([p.rate.remote(1) for p in putters])  # warm: each process's first puts map the store
        shapes = {
            "1 process, 1 thread": lambda: ray.get(putters[0].rate.remote(1)),
            "1 process, 4 threads": lambda: ray.get(putters[0].rate.remote(4)),
            "2 processes": lambda: sum(ray.get([p.rate.remote(1) for p in putters[:2]])),
            "4 processes": lambda: sum(ray.get([p.rate.remote(1) for p in putters])),
        }
        names = list(shapes)
        rates: Dict[str, List[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                rates[name].append(shapes[name]())
        print(f"| {args.size_kib} KiB payloads | puts/s (median of {args.rounds}) |")
        print("| --- | --- |")
        for name in names:
            print(f"| {name} | {statistics.median(rates[name]):,.0f} |")
        print(f"| copy of the same bytes, one core (floor) | {_copy_rate(size):,.0f} |")
        print()
        print("| 4 payloads | wall ms | thread CPU ms |")
        print("| --- | --- | --- |")
        for grouped, name in ((False, "4 objects (ours, the queue's)"), (True, "1 object holding 4")):
            got = [ray.get(putters[0].four.remote(grouped)) for _ in range(args.rounds)]
            wall = statistics.median(g["wall"] for g in got)
            cpu = statistics.median(g["cpu"] for g in got)
            print(f"| {name} | {wall:.2f} | {cpu:.2f} |")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()

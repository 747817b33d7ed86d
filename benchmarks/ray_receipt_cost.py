"""Cost of a RemoteBuffer take's receipt (docs/ray.md, "Delivery"): takes with and without sending it.

Usage: python benchmarks/ray_receipt_cost.py [--blocks 20] [--takes 25]

One process on a private one-node loopback cluster: put 64 ids, take 64, repeated; blocks alternate
between the client as shipped (each take's receipt rides in the next take, or goes alone) and a client whose receipt
is switched off, so both see the same machine load. Reports, per variant, the median take latency and
the index actor's CPU per put+take (its process CPU, every thread), with and without the journal, and
the floor: an empty round trip to the index (``ping``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Dict, List

import numpy as np

from pyfast_buffer.bench.ray_cluster import LocalCluster


def measure(journal: Any, blocks: int, takes: int) -> Dict[str, Dict[str, float]]:
    import ray

    from pyfast_buffer.ray import RemoteBuffer
    from pyfast_buffer.ray._receipts import Receipts, receipts_for

    shipped = Receipts.add
    buf = RemoteBuffer.create(4096, max_age=1000, journal=journal)
    latency: Dict[str, List[float]] = {"receipt": [], "no receipt": []}
    cpu: Dict[str, List[float]] = {"receipt": [], "no receipt": []}
    ping: List[float] = []
    next_id = 0
    try:
        for block in range(blocks):
            variant = "receipt" if block % 2 else "no receipt"
            Receipts.add = shipped if variant == "receipt" else (lambda self, request: None)  # type: ignore[method-assign]
            before = ray.get(buf.actor.cpu_seconds.remote())
            for _ in range(takes):
                buf.put(np.arange(next_id, next_id + 64), 0)
                next_id += 64
                start = time.perf_counter()
                buf.take(64, 0)
                latency[variant].append(time.perf_counter() - start)
                start = time.perf_counter()
                buf.ping()
                ping.append(time.perf_counter() - start)
            receipts_for(buf.actor).settle(wait=True)
            cpu[variant].append((ray.get(buf.actor.cpu_seconds.remote()) - before) / takes)
    finally:
        Receipts.add = shipped  # type: ignore[method-assign]
        buf.kill()
    out = {v: {"take_ms": statistics.median(latency[v]) * 1e3, "cpu_ms": statistics.median(cpu[v]) * 1e3} for v in cpu}
    out["floor"] = {"take_ms": statistics.median(ping) * 1e3, "cpu_ms": float("nan")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--takes", type=int, default=25)
    args = parser.parse_args()
    cluster = LocalCluster(nodes=1, cpus_per_node=4, object_store_bytes=128 * 2**20)
    try:
        cluster.connect(namespace="receipt_cost")
        print("| journal | variant | take p50 | index CPU per put+take |")
        print("| --- | --- | --- | --- |")
        for journal, label in ((False, "journal=False"), (None, "journal (default)")):
            for variant, row in measure(journal, args.blocks, args.takes).items():
                print(f"| {label} | {variant} | {row['take_ms']:.2f} ms | {row['cpu_ms']:.2f} ms |", flush=True)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()

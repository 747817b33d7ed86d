"""Payload ingest that the trainer reads, against the queue a Ray user would write instead (issue 41).

One node: 4 producer actors put payloads of 64 KiB or 1 MiB, 4 per call, for a fixed time; the trainer in the
driver takes 16 at a time and reads every payload (``take`` + ``fetch``: the values in its hands). The baseline:
each producer ``ray.put``s its payloads and sends the refs through ``ray.util.queue.Queue``; the trainer gets 16
refs and ``ray.get``s them. Per row: payloads read per second by the trainer, and ours / the queue.

``python -c "from pyfast_buffer.bench.ray_read import main; main()" [--seconds 6]`` prints the rows.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np

SIZES = (64 * 1024, 1024 * 1024)
PRODUCERS = 4
PER_CALL = 4
TAKE = 16
OURS, QUEUE = "pyfast_buffer", "ray Queue (producer refs)"


def _producer_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class Producer:
        def run(self, target: Any, kind: str, size: int, seconds: float, first_id: int) -> int:
            import ray

            value = np.random.default_rng(first_id).integers(0, 2**31, size // 8, dtype=np.int64)
            sent, next_id = 0, first_id
            stop = time.perf_counter() + seconds
            while time.perf_counter() < stop:
                if kind == "ours":
                    target.put(np.arange(next_id, next_id + PER_CALL, dtype=np.int64), 0, payloads=[value] * PER_CALL)
                else:
                    target.put_nowait_batch([ray.put(value) for _ in range(PER_CALL)])
                next_id += PER_CALL
                sent += PER_CALL
            return sent

        def ping(self) -> int:
            return 0

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


def read_rows(seconds: float = 6.0, sizes: tuple = SIZES) -> List[Dict[str, Any]]:
    """One row per size and contender (Ray must be running, one node)."""
    import ray
    from ray.util.queue import Queue

    from ..ray import RemoteBuffer

    producer_cls = _producer_class()
    producers = [producer_cls.remote() for _ in range(PRODUCERS)]
    ray.get([p.ping.remote() for p in producers])
    rows: List[Dict[str, Any]] = []
    for size in sizes:
        rates: Dict[str, float] = {}
        for kind in ("ours", "queue"):
            target: Any
            if kind == "ours":
                target = RemoteBuffer.create(4096, max_age=10, on_full="evict_oldest", num_cpus=0)
            else:
                target = Queue(maxsize=4096, actor_options={"num_cpus": 0})
                target.size()
            stop, got = threading.Event(), [0]
            reader = threading.Thread(target=_read_ours if kind == "ours" else _read_queue, args=(target, stop, got))
            reader.start()
            began = time.perf_counter()
            ray.get([p.run.remote(target, kind, size, seconds, 10**9 * (i + 1)) for i, p in enumerate(producers)])
            elapsed = time.perf_counter() - began
            stop.set()
            reader.join()
            rates[kind] = got[0] / elapsed
            if kind == "ours":
                target.kill()
            else:
                target.shutdown()
        for kind, name in (("ours", OURS), ("queue", QUEUE)):
            rows.append(
                {
                    "case": "ray",
                    "op": f"ingest read/{size // 1024}KiB",
                    "contender": name,
                    "batch": TAKE,
                    "payloads_per_s": rates[kind],
                    "x_queue": rates[kind] / rates["queue"] if rates["queue"] else None,
                    "median_s": 1.0 / rates[kind] if rates[kind] else float("inf"),
                    "p99_s": None,
                    "runs": 1,
                }
            )
    return rows


def main(argv: Optional[List[str]] = None) -> None:
    import logging

    import ray

    parser = argparse.ArgumentParser(description="Payloads the trainer reads, against producer refs in a queue.")
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args(argv)
    from .ray_cluster import init_local_cluster

    init_local_cluster(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        namespace="pyfast_buffer_read",
    )
    try:
        for r in read_rows(args.seconds):
            print(
                f"{r['op']:<20} {r['contender']:<28} {r['payloads_per_s']:8.0f} payloads/s  x_queue {r['x_queue']:.2f}"
            )
    finally:
        ray.shutdown()

"""CPU per payload of every process in the ``ray_read`` setup (docs/ray.md, "payloads the trainer reads"), ours
against producer refs in ``ray.util.queue.Queue``: which process spends what, read from ``/proc`` (Linux).

    python benchmarks/ray_read_cpu.py [--sizes 64 1024] [--seconds 6]

One run per size and contender, after the same warm-up as the bench. A process is named by its title (Ray
names an actor's process ``ray::<Class>``; the driver is this process); CPU is user + system time over the
timed window, per payload the trainer read.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Dict, Tuple

import ray

from pyfast_buffer.bench import ray_read

TICK = os.sysconf("SC_CLK_TCK")


def cpu_by_process() -> Dict[int, Tuple[str, float]]:
    """pid -> (name, CPU seconds) of every process this user can read."""
    out: Dict[int, Tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        pid = int(entry)
        name = "driver" if pid == os.getpid() else title.split()[0].rsplit("/", 1)[-1] if title else "?"
        if name.startswith("ray::"):
            name = name.split(".")[0]  # ray::Actor.method while it runs a call: one name per actor
        out[pid] = (name, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def measure(kind: str, size: int, seconds: float, producers: list) -> Tuple[float, Dict[str, float]]:
    """(payloads read per second, CPU microseconds per payload by process name) for one run."""
    payloads, elapsed, (before, after) = ray_read.run_once(kind, size, seconds, producers, sample=cpu_by_process)
    per: Dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        if pid in before:
            per[name] = per.get(name, 0.0) + (cpu - before[pid][1]) * 1e6 / max(payloads, 1)
    return payloads / elapsed, {k: v for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 1024], help="payload sizes in KiB")
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    from pyfast_buffer.bench.ray_cluster import init_local_cluster

    init_local_cluster(
        num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, namespace="read_cpu"
    )
    try:
        producers = [ray_read._producer_class().remote() for _ in range(ray_read.PRODUCERS)]
        ray.get([p.ping.remote() for p in producers])
        for size_kib in args.sizes:
            for kind in ("ours", "queue"):
                rate, per = measure(kind, size_kib * 1024, args.seconds, producers)
                total = sum(per.values())
                parts = ", ".join(f"{name} {us:.0f}" for name, us in per.items())
                print(f"{size_kib} KiB {kind}: {rate:.0f} payloads/s, CPU {total:.0f} us per payload ({parts})")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()

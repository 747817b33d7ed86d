"""What Ray charges an actor that does nothing (docs/ray.md, "Ray's floor").

Usage: python benchmarks/ray_actor_floor.py [--seconds 10] [--calls 400] [--gaps-ms 1 5 20 60]

On a private one-node loopback cluster, actors with no code of ours in their calls: a plain one, a threaded
one laid out as the index is (``max_concurrency`` 16 and two concurrency groups), the same with Ray's task
events off (``enable_task_events=False``, as the index is created), and a real index (``RemoteBuffer``,
journal on, empty), as created and with its task events on. For each: its CPU per second while idle, split
by thread (from each thread's ``/proc/<pid>/task/<tid>/schedstat``, nanoseconds on the CPU), and its CPU per
empty call (``--calls`` calls one at a time from this driver, less the idle rate over the block), back to
back and then with each of ``--gaps-ms`` between the calls (a call that finds the actor idle costs it more:
Ray's threads went to sleep). The index's CPU per payload in the payload bench cannot go below these: idle
rate / payloads per second + calls per payload x CPU per call at the row's spacing.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Dict, List, Tuple


class Empty:
    def ping(self) -> int:
        return 0

    def pid(self) -> int:
        return os.getpid()

    def cpu_seconds(self) -> float:
        return time.process_time()


def thread_cpu(pid: int) -> Dict[Tuple[str, str], float]:
    """CPU seconds so far of each thread of ``pid``, keyed by (tid, name); the main thread is named "main"."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = "main" if tid == str(pid) else f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[(tid, name)] = int(f.read().split()[0]) / 1e9
        except OSError:  # the thread ended between the listing and the read
            pass
    return out


def idle(actor: Any, seconds: float) -> Tuple[float, List[Tuple[str, float]]]:
    """(CPU seconds per second, [(thread name, CPU seconds per second)] biggest first) over ``seconds``."""
    import ray

    pid = ray.get(actor.pid.remote())
    time.sleep(1.0)  # let start-up work settle
    first, began = thread_cpu(pid), time.perf_counter()
    time.sleep(seconds)
    last, took = thread_cpu(pid), time.perf_counter() - began
    by_name: Dict[str, float] = {}
    for key, cpu in last.items():
        by_name[key[1]] = by_name.get(key[1], 0.0) + (cpu - first.get(key, 0.0)) / took
    return sum(by_name.values()), sorted(by_name.items(), key=lambda kv: -kv[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of idling per actor")
    parser.add_argument("--calls", type=int, default=400, help="empty calls per actor")
    parser.add_argument(
        "--gaps-ms", type=float, nargs="*", default=[1, 5, 20, 60], help="gaps between spaced empty calls"
    )
    parser.add_argument("--spaced-calls", type=int, default=40, help="empty calls per actor at each gap")
    args = parser.parse_args()
    import ray

    from pyfast_buffer.bench.ray_payloads import empty_call_cpu
    from pyfast_buffer.ray import RemoteBuffer

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", namespace="pyfast_buffer_floor")
    try:
        plain = ray.remote(num_cpus=0)(Empty).remote()
        threaded_cls = ray.remote(num_cpus=0, concurrency_groups={"blocking": 16, "admission": 4})(Empty)
        threaded = threaded_cls.options(max_concurrency=16).remote()
        untraced = threaded_cls.options(max_concurrency=16, enable_task_events=False).remote()
        index = RemoteBuffer.create(1024, max_age=10, num_cpus=0)
        traced = RemoteBuffer.create(1024, max_age=10, num_cpus=0, actor_options={"enable_task_events": True})
        gaps = " | ".join(f"{g:g} ms apart" for g in args.gaps_ms)
        print(f"| actor | idle CPU | by thread | CPU per empty call, back to back | {gaps} |")
        print("| --- | --- | --- | --- |" + " --- |" * len(args.gaps_ms))
        for name, actor in (
            ("plain", plain),
            ("threaded, as the index", threaded),
            ("threaded, task events off", untraced),
            ("RemoteBuffer index (task events off)", index.actor),
            ("RemoteBuffer index, task events on", traced.actor),
        ):
            rate, threads = idle(actor, args.seconds)
            cpu, ping = (lambda a=actor: ray.get(a.cpu_seconds.remote())), (lambda a=actor: ray.get(a.ping.remote()))
            per_call = [empty_call_cpu(cpu, ping, rate, args.calls)]
            per_call += [empty_call_cpu(cpu, ping, rate, args.spaced_calls, gap / 1e3) for gap in args.gaps_ms]
            top = ", ".join(f"{n} {r * 1e3:.1f}" for n, r in threads[:3] if r > 0)
            cells = " | ".join("-" if c is None else f"{c * 1e3:.2f} ms" for c in per_call)
            print(f"| {name} | {rate * 1e3:.1f} ms/s | {top} ms/s | {cells} |")
        index.kill()
        traced.kill()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()

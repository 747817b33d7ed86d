"""The in-process benchmark cases. Each returns rows: one contender, one configuration, measured in this process.

registry.py names them (with the Ray and verl cases) for ``pyfast-buffer bench``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np

from . import peers
from .plan import CURRENT_STEP, MAX_AGE, Plan, stamps
from .timing import Timed, calibrate, median, percentile, sample, sample_interleaved


def row(case: str, contender: str, times: List[float], **params) -> Dict:
    return {
        "case": case,
        "contender": contender,
        **params,
        "median_s": median(times),
        "p99_s": percentile(times, 99),
        "runs": len(times),
    }


def _contenders(names: List[str], capacity: int, plan: Plan, skipped: Dict[str, str]) -> List[Any]:
    found, missing = peers.available(names)
    skipped.update(missing)
    keep = []
    for cls in found:
        if cls is peers.Reference and capacity > plan.reference_limit:
            skipped[f"reference@{capacity:.0e}"] = (
                f"reference twin skipped above capacity {plan.reference_limit:.0e} (about 1 KB of Python objects "
                "per entry, and minutes to fill)"
            )
            continue
        keep.append(cls)
    return keep


def put_case(plan: Plan, skipped: Dict[str, str]) -> List[Dict]:
    """put(B ids, one step stamp) into a full ring that overwrites its oldest entries."""
    rows = []
    names = [
        "pyfast_buffer",
        "pyfast_buffer torch in",
        "copy (floor)",
        "reference",
        "numpy mask",
        "cpprb",
        "cpprb 2 fields",
        "torchrl",
    ]
    for capacity in plan.capacities:
        for batch in plan.batches:
            ids = np.arange(batch, dtype=np.int64)
            timed: Dict[str, Timed] = {}
            fill = np.arange(capacity, dtype=np.int64)
            for cls in _contenders(names, capacity, plan, skipped):
                c = cls(capacity, MAX_AGE)
                for start in range(0, capacity, 1 << 20):
                    c.fill(fill[start : start + (1 << 20)], 0)

                def put(c: Any = c, ids: np.ndarray = ids) -> None:
                    c.put(ids, 1)

                timed[cls.name] = (put, None, calibrate(put))
            for name, times in sample_interleaved(timed, plan.repeat).items():
                rows.append(row("put", name, times, capacity=capacity, batch=batch))
            del timed
    return rows


def take_case(plan: Plan, skipped: Dict[str, str]) -> List[Dict]:
    """take(B) under drop from a full ring where a fraction of entries, shuffled, is stale."""
    rows = []
    names = [
        "pyfast_buffer",
        "copy (floor)",
        "reference",
        "numpy mask",
        "numba loop",
        "cpprb",
        "cpprb 2 fields",
        "cpprb to full",
        "torchrl",
    ]
    rng = np.random.default_rng(0)
    plan = dataclasses.replace(plan, reference_limit=min(plan.reference_limit, 100_000))  # refills take minutes
    for capacity in plan.capacities[:2]:  # the walk, not the ring size, sets the cost
        for stale in plan.stale:
            steps = stamps(capacity, stale, rng)
            ids = np.arange(capacity, dtype=np.int64)
            for batch in plan.batches:
                timed: Dict[str, Timed] = {}
                returned: Dict[str, List[int]] = {}
                for cls in _contenders(names, capacity, plan, skipped):
                    c = cls(capacity, MAX_AGE)

                    def refill(
                        c: Any = c, low: float = 0.6 * capacity, ids: np.ndarray = ids, steps: np.ndarray = steps
                    ) -> None:
                        if len(c) < low:  # keep the ring about full of the same mix
                            c.fill(ids, steps)

                    c.fill(ids, steps)
                    got = returned[cls.name] = []

                    def take(c: Any = c, b: int = batch, got: List[int] = got) -> None:
                        got.append(c.take(b, CURRENT_STEP))

                    # Fast calls are timed in loops, as in put; a loop walks at most half of the ring refilled
                    # to >= 60% before it, so every call of the loop still finds a full batch.
                    most = max(1, int(0.5 * capacity * (1 - stale)) // batch)
                    timed[cls.name] = (take, refill, min(calibrate(take), most))
                for name, times in sample_interleaved(timed, plan.repeat).items():
                    r = row("take", name, times, capacity=capacity, batch=batch, stale=stale)
                    r["returned_mean"] = float(np.mean(returned[name]))  # what one call hands back
                    rows.append(r)
                del timed
    return rows


def evict_case(plan: Plan, skipped: Dict[str, str]) -> List[Dict]:
    """evict_stale over a full ring.

    shuffled: half the entries, scattered, are stale; the ring is refilled before each call (one
    pass over everything, compared with memcpy of the same bytes). non-decreasing: one producer
    stream stamped 0..N-1 over ``steps`` steps; each call advances the clock one step and drops the
    entries that just aged out, as a training loop does, with no refill between calls.
    """
    rows = []
    names = ["pyfast_buffer", "reference", "numpy mask", "numba loop", "memcpy", "memcpy ids+steps"]
    rng = np.random.default_rng(1)
    for capacity in plan.capacities:
        ids = np.arange(capacity, dtype=np.int64)
        repeat = max(3, plan.repeat // (2 if capacity >= 10_000_000 else 1))
        shuffled = stamps(capacity, 0.5, rng)
        stream_steps = repeat + 2
        stream = (np.arange(capacity, dtype=np.int64) * stream_steps // capacity).astype(np.int64)
        for order in ("shuffled", "non-decreasing"):
            for cls in _contenders(names, capacity, plan, skipped):
                copies = (peers.Memcpy, peers.MemcpyIdsSteps)
                if cls in copies and order != "shuffled":
                    continue
                # The stream case: stamps 0..S-1, max_age S-1; each call at step S-1+k drops stamp k-1.
                c = cls(capacity, MAX_AGE if order == "shuffled" else stream_steps - 1)
                if order == "shuffled":

                    def refill(c: Any = c, ids: np.ndarray = ids, shuffled: np.ndarray = shuffled) -> None:
                        c.fill(ids, shuffled)

                    def evict(c: Any = c) -> None:
                        c.evict(CURRENT_STEP)

                    times = sample(evict, repeat, setup=None if cls in copies else refill)
                else:
                    c.fill(ids, stream)  # pyright: ignore[reportAttributeAccessIssue] - every class but the copies has fill
                    clock = iter(range(stream_steps, 2 * stream_steps))

                    def evict_next(c: Any = c, clock: Iterator[int] = clock) -> None:
                        c.evict(next(clock))

                    times = sample(evict_next, repeat)
                rows.append(row("evict_stale", cls.name, times, capacity=capacity, order=order))
                del c
    return rows


def _handoff_latencies(rounds: int, block: Callable[[], object], release: Callable[[int], object]) -> List[float]:
    """Per round: the consumer calls ``block()``; once it waits, the producer calls ``release(i)``.

    Returns the time from just before ``release`` to ``block`` returning in the other thread.
    """
    latencies: List[float] = []
    ready, done, stamp = threading.Event(), threading.Event(), [0]

    def consumer():
        for _ in range(rounds):
            ready.set()
            block()
            latencies.append((time.perf_counter_ns() - stamp[0]) / 1e9)
            done.set()

    thread = threading.Thread(target=consumer)
    thread.start()
    for i in range(rounds):
        ready.wait()
        ready.clear()
        time.sleep(0.002)  # let the consumer block
        stamp[0] = time.perf_counter_ns()
        release(i)
        done.wait()  # blocks without holding the GIL, so the consumer resumes at once
        done.clear()
    thread.join()
    return latencies


def _wake_latencies(buf, rounds: int, poll_interval: Optional[float]) -> List[float]:
    """A consumer blocked in take (or polling it), a producer putting the entry it waits for."""
    ids = [np.array([i], dtype=np.int64) for i in range(rounds)]

    def block():
        if poll_interval is None:
            buf.take(1, CURRENT_STEP, timeout=10)
        else:  # a polled design: ask, sleep, ask again
            while not len(buf.take(1, CURRENT_STEP)):
                time.sleep(poll_interval)

    return _handoff_latencies(rounds, block, lambda i: buf.put(ids[i], CURRENT_STEP))


def _event_floor(rounds: int) -> List[float]:
    """A bare threading.Event handoff between two threads: the floor under any buffer."""
    go = threading.Event()

    def block():
        go.wait()
        go.clear()

    return _handoff_latencies(rounds, block, lambda i: go.set())


def wake_case(plan: Plan, skipped: Dict[str, str]) -> List[Dict]:
    """wait wake-up: a consumer blocked in take, a producer puts the last needed entry."""
    from ..buffer import StalenessBuffer
    from ..reference import ReferenceBuffer

    # The floor and each contender run in alternating chunks, so that a burst of load on this shared
    # machine hits all of them alike and the ratio to the floor compares like with like.
    chunks = 5
    per_chunk = max(2, plan.wake_rounds // chunks)
    contenders = (
        ("pyfast_buffer", StalenessBuffer, None),
        ("reference", ReferenceBuffer, None),
        ("polling 1 ms", StalenessBuffer, 1e-3),
    )
    latencies: Dict[str, List[float]] = {peers.EventFloor.name: []}
    latencies.update({name: [] for name, _, _ in contenders})
    for _ in range(chunks):
        latencies[peers.EventFloor.name] += _event_floor(per_chunk)
        for name, make, poll in contenders:
            latencies[name] += _wake_latencies(make(1024, max_age=MAX_AGE, strategy="wait"), per_chunk, poll)
    rows = []
    for name, lat in latencies.items():
        r = row("wake_latency", name, lat, capacity=1024, batch=1)
        r["p50_s"] = percentile(lat, 50)
        rows.append(r)
    return rows


def throughput_case(plan: Plan, skipped: Dict[str, str]) -> List[Dict]:
    """2 producer threads put(B), 1 consumer thread take(B); entries per second end to end."""
    from ..buffer import StalenessBuffer
    from ..reference import ReferenceBuffer

    rows = []
    for batch in plan.batches:
        for name, make in (("pyfast_buffer", StalenessBuffer), ("reference", ReferenceBuffer)):
            buf = make(max(16 * batch, 65536), max_age=MAX_AGE, on_full="block")
            stop, consumed = threading.Event(), [0]
            ids = np.arange(batch, dtype=np.int64)

            def produce(buf: Any = buf, stop: threading.Event = stop, ids: np.ndarray = ids) -> None:
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):  # full ring: try again until stopped
                        buf.put(ids, CURRENT_STEP, timeout=0.05)

            def consume(
                buf: Any = buf, stop: threading.Event = stop, consumed: List[int] = consumed, batch: int = batch
            ) -> None:
                while not stop.is_set():
                    consumed[0] += len(buf.take(batch, CURRENT_STEP))

            threads = [threading.Thread(target=produce) for _ in range(2)] + [threading.Thread(target=consume)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            time.sleep(plan.throughput_seconds)
            stop.set()
            elapsed = time.perf_counter() - start
            for t in threads:
                t.join()
            rate = consumed[0] / elapsed
            rows.append(
                {
                    "case": "throughput_2p1c",
                    "contender": name,
                    "batch": batch,
                    "entries_per_s": rate,
                    "median_s": 1 / rate if rate else float("inf"),
                    "runs": 1,
                }
            )
    return rows


_MEMORY_PROBE = """
import json, sys, numpy as np
def rss(field):
    for line in open('/proc/self/status'):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
impl, capacity = sys.argv[1], int(sys.argv[2])
import pyfast_buffer as pfb
make = pfb.StalenessBuffer if impl == 'pyfast_buffer' else pfb.ReferenceBuffer
base = rss('VmRSS:')
buf = make(capacity, max_age=10, max_uses=2)
ids = np.arange(min(capacity, 1 << 20), dtype=np.int64)
for start in range(0, capacity, len(ids)):
    buf.put(ids[: capacity - start], 1000)
filled = rss('VmHWM:')
for _ in range(2000):
    buf.take(512, 1000)
print(json.dumps({"peak": filled - base, "after_takes": rss('VmHWM:') - base, "len": len(buf)}))
"""


def memory_case(plan: Plan, skipped: Dict[str, str]) -> List[Dict]:
    """Peak resident bytes per stored entry (all columns), and growth over 2,000 takes."""
    rows = []
    for name, capacity in (("pyfast_buffer", plan.memory_capacity), ("reference", 100_000)):
        # A fresh process, started outside any source tree so it imports the installed package.
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY_PROBE, name, str(capacity)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
            cwd=tempfile.gettempdir(),
        )
        if out.returncode:
            raise RuntimeError(f"memory probe failed: {out.stderr.strip()[-2000:]}")
        m = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(
            {
                "case": "memory",
                "contender": name,
                "capacity": capacity,
                "bytes_per_entry": m["peak"] / capacity,
                "growth_over_takes_bytes": m["after_takes"] - m["peak"],
                "runs": 1,
            }
        )
    return rows


BULK = 65536  # entries per call in the bulk case


def bulk_case(plan: Plan, skipped: Dict[str, str]) -> List[Dict]:
    """put/take of B = 65536 entries per call, ungrouped and in GRPO groups of 8, against a copy of the
    same 64 bytes per entry (the physical floor); plus a new ring's first lap and its construction.

    Every ratio is ``x_floor`` = this time / the copy's time, measured in the same run.
    """
    from ..buffer import StalenessBuffer

    rows = []
    capacity = 1 << 20
    floor_fn = peers.Copy(BULK)
    floor = sample(lambda: floor_fn.take(BULK, 0), plan.repeat)
    rows.append(row("bulk", "copy (floor)", floor, batch=BULK, order="64 B/entry"))
    ids = np.arange(BULK, dtype=np.int64)
    for grouped in (False, True):
        groups = ids // 8 if grouped else None
        label = "grouped(8)" if grouped else "ungrouped"
        buf = StalenessBuffer(capacity, max_age=MAX_AGE)
        for start in range(0, capacity, BULK):  # one lap first: the ring is full and evicts from here on
            buf.put(ids + start, CURRENT_STEP, group_ids=None if groups is None else groups + start)

        def put(b: StalenessBuffer = buf, g: Optional[np.ndarray] = groups) -> None:
            b.put(ids, CURRENT_STEP, group_ids=g)

        def refill(b: StalenessBuffer = buf, g: Optional[np.ndarray] = groups) -> None:
            if len(b) < BULK:
                b.put(ids, CURRENT_STEP, group_ids=g)

        def take(b: StalenessBuffer = buf) -> int:
            return len(b.take(BULK, CURRENT_STEP))

        put_times = sample(put, plan.repeat)
        rows.append(row("bulk", "pyfast_buffer", put_times, batch=BULK, order=f"put {label}"))
        take_times = sample(take, plan.repeat, setup=refill)
        rows.append(row("bulk", "pyfast_buffer", take_times, batch=BULK, order=f"take {label}"))
        del buf
    # A new ring: the first lap (every page touched for the first time unless construction did it).
    laps = 4
    first: List[float] = []
    later: List[float] = []
    built: List[float] = []
    for _ in range(max(3, plan.repeat // 3)):
        t0 = time.perf_counter()
        buf = StalenessBuffer(capacity, max_age=MAX_AGE)
        built.append(time.perf_counter() - t0)
        for lap in range(laps):
            per_put: List[float] = []
            for _ in range(capacity // BULK):
                t0 = time.perf_counter()
                buf.put(ids, CURRENT_STEP)
                per_put.append(time.perf_counter() - t0)
            (first if lap == 0 else later).append(median(per_put))  # the median put of the lap
        del buf
    rows.append(row("bulk", "pyfast_buffer", first, batch=BULK, order="put first lap"))
    rows.append(row("bulk", "pyfast_buffer", later, batch=BULK, order="put later laps"))
    r = row("bulk", "pyfast_buffer", built, capacity=capacity, order="construct")
    r["ns_per_entry"] = median(built) / capacity * 1e9
    rows.append(r)
    return rows


def overhead_case(plan: Plan, skipped: Dict[str, str]) -> List[Dict]:
    """Where the time of a one-entry put or take goes: argument checks, the binding call, the core, and
    the Batch with its metrics. Each part is timed alone in a loop; ``python overhead`` = total - core.
    """
    from .. import _args, _core
    from ..batch import Batch, log_record, metrics_from_stats
    from ..buffer import StalenessBuffer

    buf = StalenessBuffer(1 << 16, max_age=MAX_AGE)
    ring = buf._ring
    one = np.zeros(1, np.int64)
    stamp = np.array([CURRENT_STEP], np.int64)
    out = np.empty(_core.BATCH_COLUMNS, np.int64)
    buf.put(np.arange(1 << 15, dtype=np.int64), CURRENT_STEP)  # half full: take never runs dry in a loop

    def loop(fn: Callable[[], object]) -> float:
        return median(sample(fn, plan.repeat, number=calibrate(fn, limit=50_000)))

    def put_py() -> None:
        buf.put(one, CURRENT_STEP)

    def put_args() -> None:
        _args.as_ids(one, "traj_ids")
        np.array((CURRENT_STEP,), np.int64)

    def put_core() -> None:
        ring.put(one, None, stamp, None)

    def take_py() -> None:  # refilled with one bare put (put_core), subtracted below
        buf.take(1, CURRENT_STEP)
        ring.put(one, None, stamp, None)

    def take_args() -> None:
        _args.as_count(1, "batch_size", 1)
        _args.as_step(CURRENT_STEP, "current_step")
        np.empty(_core.BATCH_COLUMNS, np.int64)

    def take_core() -> None:
        ring.take(out, 1, CURRENT_STEP, None)
        ring.put(one, None, stamp, None)

    binding = loop(lambda: len(ring))  # a bound method that does nothing but lock and return
    parts = {
        "put": {"total": loop(put_py), "argument checks": loop(put_args), "binding + core": loop(put_core)},
        "take": {"total": loop(take_py), "argument checks": loop(take_args), "binding + core": loop(take_core)},
    }
    refill = parts["put"]["binding + core"]
    parts["take"]["total"] -= refill
    parts["take"]["binding + core"] -= refill
    stats = ring.take(out, 1, CURRENT_STEP, None)

    def batch_and_log() -> Batch:
        log_record(stats)
        return Batch(out.reshape(_core.BATCH_COLUMNS, 1), stats=stats)

    parts["take"]["Batch/metrics"] = loop(batch_and_log)
    parts["take"]["metrics on access"] = loop(lambda: metrics_from_stats(stats))
    parts["take"]["tensor on access"] = loop(lambda: Batch(out.reshape(_core.BATCH_COLUMNS, 1), stats=stats).columns)
    rows = []
    for op, p in parts.items():
        core = max(p["binding + core"] - binding, 0.0)
        split = {"argument checks": p["argument checks"], "binding call": binding, "core": core}
        split.update({k: v for k, v in p.items() if k not in ("total", "argument checks", "binding + core")})
        r = {
            "case": "overhead",
            "contender": "pyfast_buffer",
            "batch": 1,
            "order": op,
            "median_s": p["total"],
            "runs": plan.repeat,
            "python_overhead_s": p["total"] - core,
            "split_s": split,
        }
        rows.append(r)
    return rows


def pace_case(plan: Plan, skipped: Dict[str, str]) -> List[Dict]:
    """One training step's cycle: dispatch P prompts, complete G trajectories each, take P * G, next step.

    The same cycle under strategy="pace" (admission at dispatch, the take gate, stamp order) and under "drop",
    timed interleaved in this process, with the floor: a copy of the bytes the cycle moves (the P prompt ids,
    the trajectory and prompt ids of complete, and the batch's int64 columns).
    """
    from .. import _core
    from ..buffer import StalenessBuffer

    del skipped  # every contender is part of the package
    rows = []
    for batch in plan.batches:
        group = 8 if batch >= 8 else 1
        prompts = batch // group
        prompt_ids = np.arange(prompts, dtype=np.int64)
        traj_ids = np.arange(batch, dtype=np.int64)
        prompt_of = np.repeat(prompt_ids, group)
        timed: Dict[str, Timed] = {}
        for strategy in ("pace", "drop"):
            kwargs = {"prompts_per_step": prompts} if strategy == "pace" else {}
            buf = StalenessBuffer(4 * batch, max_age=MAX_AGE, strategy=strategy, pin_memory=False, **kwargs)
            step = [CURRENT_STEP]

            def cycle(
                buf: Any = buf,
                step: List[int] = step,
                prompt_ids: np.ndarray = prompt_ids,
                traj_ids: np.ndarray = traj_ids,
                prompt_of: np.ndarray = prompt_of,
                batch: int = batch,
            ) -> None:
                buf.dispatch(prompt_ids, step[0])
                buf.complete(traj_ids, prompt_of)
                buf.take(batch, step[0])
                step[0] += 1

            timed[strategy] = (cycle, None, calibrate(cycle))
        moved = np.arange(prompts + 2 * batch + _core.BATCH_COLUMNS * batch, dtype=np.int64)
        into = np.empty_like(moved)

        def copy(moved: np.ndarray = moved, into: np.ndarray = into) -> None:
            np.copyto(into, moved)

        timed["copy (floor)"] = (copy, None, calibrate(copy))
        for name, times in sample_interleaved(timed, plan.repeat).items():
            contender = "copy (floor)" if name == "copy (floor)" else "pyfast_buffer"
            order = "floor" if name == "copy (floor)" else name
            rows.append(row("pace_cycle", contender, times, batch=batch, order=order, group=group))
    return rows

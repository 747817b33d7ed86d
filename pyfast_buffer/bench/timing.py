"""Timing helpers: medians of repeated runs with untimed setup, and percentiles."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple


def sample(
    fn: Callable[[], object], repeat: int, setup: Optional[Callable[[], object]] = None, number: int = 1
) -> List[float]:
    """Returns ``repeat`` timings in seconds of ``number`` calls of ``fn`` each (per call), setup untimed."""
    fn()  # warm up (first-touch pages, JIT, caches)
    times = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            if setup is not None:
                setup()
            start = time.perf_counter_ns()
            for _ in range(number):
                fn()
            times.append((time.perf_counter_ns() - start) / number / 1e9)
    finally:
        if gc_was_enabled:
            gc.enable()
    return times


#: A contender's timed call, its untimed setup (or None) and how many calls one timing spans.
Timed = Tuple[Callable[[], object], Optional[Callable[[], object]], int]


def sample_interleaved(contenders: Dict[str, Timed], repeat: int, chunks: int = 3) -> Dict[str, List[float]]:
    """Like sample() for several contenders: ``repeat`` timings each, taken in ``chunks`` alternating blocks.

    A burst of load from other work on the machine then spoils at most one block of one contender,
    which the median of all its timings ignores; each block starts with an untimed call, so a
    contender's caches are warm again after the others ran.
    """
    times: Dict[str, List[float]] = {name: [] for name in contenders}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for chunk in range(chunks):
            per_chunk = repeat // chunks + (1 if chunk < repeat % chunks else 0)
            for name, (fn, setup, number) in contenders.items():
                if setup is not None:
                    setup()
                fn()  # warm up
                for _ in range(per_chunk):
                    if setup is not None:
                        setup()
                    start = time.perf_counter_ns()
                    for _ in range(number):
                        fn()
                    times[name].append((time.perf_counter_ns() - start) / number / 1e9)
    finally:
        if gc_was_enabled:
            gc.enable()
    return times


def calibrate(fn: Callable[[], object], target_s: float = 2e-3, limit: int = 10000) -> int:
    """Returns how many calls of ``fn`` take about ``target_s``, for timing fast calls in loops."""
    fn()  # the first call may be cold (page faults, caches): estimate from the second
    start = time.perf_counter()
    fn()
    one = max(time.perf_counter() - start, 1e-7)
    return max(1, min(limit, int(target_s / one)))


def median(values: List[float]) -> float:
    return statistics.median(values)


def percentile(values: List[float], q: float) -> float:
    """Returns the q-th percentile (0..100) by nearest rank."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]

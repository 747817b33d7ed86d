"""Timing helpers: medians of repeated runs with untimed setup, and percentiles."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Callable, List, Optional


def sample(fn: Callable[[], object], repeat: int, setup: Optional[Callable[[], object]] = None,
           number: int = 1) -> List[float]:
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


def calibrate(fn: Callable[[], object], target_s: float = 2e-3, limit: int = 10000) -> int:
    """Returns how many calls of ``fn`` take about ``target_s``, for timing fast calls in loops."""
    start = time.perf_counter()
    fn()
    one = max(time.perf_counter() - start, 1e-7)
    return max(1, min(limit, int(target_s / one)))


def median(values: List[float]) -> float:
    return statistics.median(values)


def percentile(values: List[float], q: float) -> float:
    """Returns the q-th percentile (0..100) by nearest rank."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[index]

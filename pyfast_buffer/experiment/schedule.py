"""When each dispatched prompt finishes: a seeded long-tailed latency and a small failure rate.

The schedule depends only on the seed, so every arm sees the same sampling-side timing.
"""

from __future__ import annotations

import random
from typing import Optional


class LatencySchedule:
    """``fate()`` returns the extra sampling steps a prompt stays in flight, or None if it fails."""

    def __init__(self, seed: int, latency_mean: float, max_latency: int, fail_prob: float) -> None:
        self._rng = random.Random(seed)
        # geometric on {0, 1, ...} with the requested mean: P(d) = (1 - q) q^d, mean = q / (1 - q)
        self._q = latency_mean / (1.0 + latency_mean)
        self._max = max_latency
        self._fail = fail_prob

    def fate(self) -> Optional[int]:
        failed = self._rng.random() < self._fail
        delay = 0
        while delay < self._max and self._rng.random() < self._q:
            delay += 1
        return None if failed else delay

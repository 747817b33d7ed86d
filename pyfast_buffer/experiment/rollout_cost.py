"""The rollout-cost model of the bias experiment: harder prompts write longer answers, which take longer.

A prompt ``a + b =`` of the digit-sum task has difficulty ``(a + b) / (2 * (digits - 1))`` in [0, 1] (a larger
sum needs larger digits, which the policy finds later). Its modelled response length, in tokens, is
``base_tokens * (1 + 3 * difficulty)`` times a lognormal factor (sigma ``length_sigma``, heavy-tailed), and the
rollout stays in flight ``length / tokens_per_tick`` sampling steps (floored, at most ``max_latency``): the
generation time grows with difficulty and with length. Every draw comes from one generator seeded from the
experiment's seed, in dispatch order, so the cost of each attempt is the same in every arm that makes the same
attempts. The digit task's own answer stays ``length`` digits: the modelled length is the reasoning a real
model would write, the thing a staleness bound sees as time.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch


class RolloutCost:
    """``cost(prompts)`` returns each prompt's (difficulty, length in tokens, delay in sampling steps or None
    when the rollout fails)."""

    def __init__(
        self,
        seed: int,
        digits: int,
        base_tokens: int,
        length_sigma: float,
        tokens_per_tick: float,
        max_latency: int,
        fail_prob: float,
    ) -> None:
        self._rng = np.random.default_rng(seed)
        self._span = 2 * (digits - 1)
        self._base, self._sigma, self._rate = base_tokens, length_sigma, tokens_per_tick
        self._max, self._fail = max_latency, fail_prob

    def difficulty(self, prompts: torch.Tensor) -> np.ndarray:
        """Returns (a + b) / (2 * (digits - 1)) of each ``a + b =`` prompt."""
        return ((prompts[:, 0] + prompts[:, 2]).numpy() / self._span).astype(np.float64)

    def cost(self, prompts: torch.Tensor) -> List[Tuple[float, int, Optional[int]]]:
        d = self.difficulty(prompts)
        noise = self._rng.lognormal(0.0, self._sigma, size=len(d))
        failed = self._rng.random(len(d)) < self._fail
        lengths = np.maximum(1, np.rint(self._base * (1 + 3 * d) * noise)).astype(np.int64)
        delays = np.minimum(self._max, lengths // max(self._rate, 1e-9)).astype(np.int64)
        return [(float(di), int(n), None if f else int(t)) for di, n, f, t in zip(d.tolist(), lengths, failed, delays)]


def ks_statistic(a: np.ndarray, b: np.ndarray) -> Optional[float]:
    """Returns the exact two-sample Kolmogorov-Smirnov statistic of two samples, None when one is empty."""
    a, b = np.sort(np.asarray(a, dtype=np.float64)), np.sort(np.asarray(b, dtype=np.float64))
    if a.size == 0 or b.size == 0:
        return None
    grid = np.concatenate([a, b])
    fa = np.searchsorted(a, grid, side="right") / a.size
    fb = np.searchsorted(b, grid, side="right") / b.size
    return float(np.max(np.abs(fa - fb)))

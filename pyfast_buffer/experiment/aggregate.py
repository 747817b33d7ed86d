"""Across seeds: each arm's mean and 95% bootstrap interval of the per-seed summary numbers.

The interval is the percentile bootstrap of the mean: draw ``RESAMPLES`` samples of the per-seed
values with replacement (numpy, a fixed seed, so the report is reproducible), take each one's mean,
and report the 2.5th and 97.5th percentiles. With few seeds it is narrower than a t interval would be
(it cannot see spread the seeds did not show), so the report treats two arms as different only when
their intervals do not overlap at all, a conservative reading.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

#: Bootstrap resamples per interval.
RESAMPLES = 10_000
#: Seed of the bootstrap's generator (the intervals are a pure function of the data).
BOOTSTRAP_SEED = 20_26
#: Two-sided coverage of the interval.
LEVEL = 0.95

#: The per-seed summary numbers the multi-seed report aggregates: (key, label, digits).
METRICS: Tuple[Tuple[str, str, int], ...] = (
    ("sample_reward_last", "last-20% sampled reward", 3),
    ("eval_last", "greedy eval reward (final)", 3),
    ("entropy_half_tick", "entropy half-life (sampling steps)", 0),
    ("entropy_half_step", "entropy half-life (trainer steps)", 0),
    ("clip_frac_late", "clip fraction (2nd half)", 3),
    ("approx_kl_late", "approx KL (2nd half)", 4),
    ("drop_share", "drop share", 3),
    ("stalled_ticks", "stalls (sampling steps)", 0),
    ("trainer_steps", "trainer steps", 0),
    ("max_age_mean", "mean max_age in force", 2),
)

#: The bias study's numbers (summary.BIAS_KEYS), aggregated for the arms whose runs carry them.
BIAS_METRICS: Tuple[Tuple[str, str, int], ...] = (
    ("goodput", "goodput (trained groups per sampling step)", 3),
    ("generator_idle_share", "generator idle share", 3),
    ("trained_over_age_share", "trained over max_age (share of uses)", 3),
    ("idle_share", "trainer idle share", 3),
    ("wasted_share", "generated, never trained", 3),
    ("regenerations_per_prompt", "regenerations per prompt", 3),
    ("starved_prompts", "starved prompts (end)", 0),
    ("difficulty_ks", "difficulty KS (trained vs generated)", 3),
    ("difficulty_shift", "difficulty mean shift", 4),
    ("length_ks", "length KS", 3),
    ("length_shift", "length mean shift (tokens)", 1),
    ("latency_ks", "latency KS", 3),
    ("latency_shift", "latency mean shift (sampling steps)", 3),
)

_BIAS_KEYS = {key for key, _, _ in BIAS_METRICS}

Interval = Tuple[float, float, float]  # (mean, low, high)


def bootstrap_interval(
    values: Sequence[float], resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED, level: float = LEVEL
) -> Interval:
    """Returns (mean, low, high): the sample mean and its percentile-bootstrap interval at ``level``.

    One value gives (v, v, v). Raises ValueError on no values or a non-finite one.
    """
    x = np.asarray(list(values), dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_interval needs at least one value")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"bootstrap_interval got a non-finite value in {x.tolist()}; drop it first")
    if not 0 < level < 1:
        raise ValueError(f"level={level} must be in (0, 1); pass e.g. 0.95")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(x.mean()), float(low), float(high)


def band(
    curves: np.ndarray, resamples: int = 1000, seed: int = BOOTSTRAP_SEED, level: float = LEVEL
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column of ``curves`` (seeds x points): mean and percentile-bootstrap band, one resampling of the seeds
    shared by every point (so the band is a band of mean curves). NaN cells are left out of the means."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, curves.shape[0], size=(resamples, curves.shape[0]))
    with warnings.catch_warnings():  # points no seed reached are NaN; pytest treats warnings as errors
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(curves[idx], axis=1)
        tail = (1 - level) / 2 * 100
        low, high = np.nanpercentile(means, [tail, 100 - tail], axis=0)
        return np.nanmean(curves, axis=0), low, high


def separated(a: Optional[Interval], b: Optional[Interval]) -> int:
    """+1 when interval ``a`` lies wholly above ``b``, -1 wholly below, 0 when they overlap (or one is missing)."""
    if a is None or b is None:
        return 0
    if a[1] > b[2]:
        return 1
    if a[2] < b[1]:
        return -1
    return 0


def aggregate(summaries: Sequence[Dict[str, Any]], arms: Sequence[Any]) -> List[Dict[str, Any]]:
    """One row per arm: ``{"arm", "seeds", "n", metric: (mean, low, high) or None, metric + "_reached": k}``.

    A per-seed value of None (e.g. entropy never halved within the run) is left out; ``<metric>_reached``
    says on how many seeds the value exists.
    """
    out = []
    for arm in arms:
        mine = [s for s in summaries if s["arm"] == arm.name]
        row: Dict[str, Any] = {
            "arm": arm.name,
            "seeds": [s["seed"] for s in mine],
            "n": len(mine),
            "reuse": arm.reuse,
            "strategy": arm.strategy,
            "max_age_spec": arm.max_age_spec,
            "lag": arm.lag,
            "reconciled": all(s["reconciled"] for s in mine),
        }
        for key, _, _ in METRICS + BIAS_METRICS:
            if key in _BIAS_KEYS and not any(key in s for s in mine):
                continue  # a bias number on a run that is not a bias study: absent, not "never reached"
            values = [float(s[key]) for s in mine if s.get(key) is not None]
            row[key] = bootstrap_interval(values) if values else None
            row[key + "_reached"] = len(values)
        out.append(row)
    return out

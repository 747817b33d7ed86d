"""The batch a take returns, its metrics dict and its one-line log record."""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Tuple

import torch

logger = logging.getLogger("pyfast_buffer")

#: Column order of ``Batch.columns``; the native core writes them in this order.
FIELDS = ("traj_ids", "group_ids", "sample_step", "age", "uses", "policy_version", "dispatch_ns", "complete_ns")
#: Labels of the fixed age-histogram buckets (ages in trainer steps).
AGE_BUCKETS = ("0", "1", "2-3", "4-7", "8-15", "16-31", "32-63", "64+")
#: The log record of every take and evict_stale: dropped_stale and taken per call, buffer_left and sampled_total
#: running, retired and evicted per call, then the max_age in force and the running count of expired prompts.
#: New fields are only ever appended.
LOG_FORMAT = "dropped_stale=%d taken=%d buffer_left=%d sampled_total=%d retired=%d evicted=%d max_age=%d expired=%d"

# (taken, dropped_stale, retired, evicted, blocked_by, age_sum, age_max, age_hist, buffer_left, in_flight,
#  sampled_total, max_age, expired)
Stats = Tuple[int, int, int, int, str, int, int, Tuple[int, ...], int, int, int, int, int]
_HIST_KEYS = tuple(f"age_hist/{b}" for b in AGE_BUCKETS)


def age_bucket(age: int) -> int:
    """Returns the index in AGE_BUCKETS of ``age`` (>= 0)."""
    return min(int(age).bit_length(), len(AGE_BUCKETS) - 1)


def make_metrics(stats: Stats) -> Dict[str, Any]:
    """Returns the stable metrics dict of one take or evict_stale, and logs its record."""
    taken, dropped, retired, evicted, blocked_by, age_sum, age_max, hist, left, in_flight, sampled, max_age, expired = (
        stats)
    metrics: Dict[str, Any] = {
        "taken": taken,
        "dropped_stale": dropped,
        "retired": retired,
        "evicted": evicted,
        "buffer_left": left,
        "sampled_total": sampled,
        "in_flight": in_flight,
        "age_mean": age_sum / taken if taken else 0.0,
        "age_max": age_max,
        "blocked_by": blocked_by,
    }
    metrics.update(zip(_HIST_KEYS, hist))
    if logger.isEnabledFor(logging.INFO):
        logger.info(LOG_FORMAT, dropped, taken, left, sampled, retired, evicted, max_age, expired)
    return metrics


class Batch:
    """Trajectories taken together: int64 tensors of equal length plus the metrics of the take.

    ``columns`` is one contiguous (8, k) int64 tensor whose rows are FIELDS; the named
    attributes are views of it, so ``batch.to("cuda", non_blocking=True)`` is one copy.
    The tensors belong to the caller: no later call overwrites them.
    """

    __slots__ = ("columns", "metrics")

    def __init__(self, columns: torch.Tensor, metrics: Dict[str, Any]) -> None:
        self.columns = columns
        self.metrics = metrics

    traj_ids = property(lambda self: self.columns[0], doc="Trajectory ids (handles into your payload store).")
    group_ids = property(lambda self: self.columns[1], doc="Group (prompt) id of each trajectory.")
    sample_step = property(lambda self: self.columns[2], doc="Step whose weights produced each trajectory.")
    age = property(lambda self: self.columns[3], doc="current_step - sample_step, in trainer steps.")
    uses = property(lambda self: self.columns[4], doc="Times each entry has been taken, this take included.")
    policy_version = property(lambda self: self.columns[5], doc="sample_step // parameter_sync_step, or -1.")
    dispatch_ns = property(lambda self: self.columns[6], doc="Wall clock (ns since the epoch) at dispatch.")
    complete_ns = property(lambda self: self.columns[7], doc="Wall clock (ns since the epoch) at completion.")

    def __len__(self) -> int:
        return int(self.columns.shape[1])

    def age_seconds(self, now_ns: int | None = None) -> torch.Tensor:
        """Returns each trajectory's age in seconds since dispatch, as float64."""
        now = time.time_ns() if now_ns is None else now_ns
        return (now - self.columns[6]).to(torch.float64) / 1e9

    def to(self, *args: Any, **kwargs: Any) -> "Batch":
        """Returns a Batch with the columns moved by ``Tensor.to`` (e.g. ``"cuda", non_blocking=True``)."""
        return Batch(self.columns.to(*args, **kwargs), self.metrics)

    def __repr__(self) -> str:
        m = self.metrics
        return (
            f"Batch(taken={len(self)}, dropped_stale={m['dropped_stale']}, age_mean={m['age_mean']:.2f}, "
            f"blocked_by={m['blocked_by']!r}, device={self.columns.device})"
        )

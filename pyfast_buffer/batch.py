"""The batch a take returns, its metrics dict and its one-line log record."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple, Union

import numpy as np

from . import _torch
from ._devices import check_usable

if TYPE_CHECKING:  # torch loads on the first tensor a batch hands out, not with the package
    import torch

logger = logging.getLogger("pyfast_buffer")

#: Column order of ``Batch.columns``; the native core writes them in this order.
FIELDS = (
    "traj_ids",
    "group_ids",
    "sample_step",
    "age",
    "uses",
    "policy_version",
    "dispatch_ns",
    "complete_ns",
    "finish_step",
    "source",
)
#: Labels of the fixed age-histogram buckets (ages in trainer steps).
AGE_BUCKETS = ("0", "1", "2-3", "4-7", "8-15", "16-31", "32-63", "64+")
#: The log record of every take and evict_stale: dropped_stale and taken per call, buffer_left and sampled_total
#: running, retired and evicted per call, then the max_age in force and the running count of expired prompts,
#: the uses this call trained over max_age, and the running admission counters of strategy="pace"; last the
#: trajectories this call retired below max_uses (pace, max_uses > 1: part of retired).
#: New fields are only ever appended.
LOG_FORMAT = (
    "dropped_stale=%d taken=%d buffer_left=%d sampled_total=%d retired=%d evicted=%d max_age=%d expired=%d "
    "trained_over_age=%d admitted=%d admission_refused=%d admission_waits=%d"
    " retried=%d starved=%d regenerations=%d"
    " protected_admitted=%d admitted_ahead=%d"
    " retired_early=%d"
)

# (taken, dropped_stale, retired, evicted, blocked_by, age_sum, age_max, age_hist, buffer_left, in_flight,
#  sampled_total, max_age, expired, trained_over_age, span_sum, span_max, admitted, admission_refused,
#  admission_waits, attempts, sources, protected_admitted, admitted_ahead, retired_early): attempts is
#  ATTEMPT_FIELDS in order; sources holds (source, taken, dropped) of each source this call took or dropped
#  from (-1: untagged), once any is tagged; then the running pace counters of protected (max_attempts)
#  admissions; last the trajectories this call retired below max_uses (pace, max_uses > 1).
Stats = Tuple[Any, ...]  # the fields above, in that order (typed one by one in _core.pyi's _Stats)
#: The prompt-attempt counters of every take (docs/data-bias.md): retries and prompts_retried, regenerations
#: (trajectories of lost attempts whose prompt was dispatched again), protected groups (max_attempts), the
#: prompts starved now (>= 2 attempts, nothing trained) and the records forgotten at the table's bound.
ATTEMPT_FIELDS = ("retries", "prompts_retried", "regenerations", "protected", "prompts_starved", "attempts_forgotten")
#: The ledger's running counts of protected (max_attempts) admissions under pace, last in the stats and the log
#: line: protected prompts admitted, and protected calls admitted while an unprotected call waited.
PROTECTED_ADMISSION_FIELDS = ("protected_admitted", "admitted_ahead")
#: Names of the ``blocked_by`` codes: ``metrics[prefix + "blocked_by"]`` is an index into this tuple.
BLOCKED_BY = ("none", "too_few_ready", "in_flight_at_max_age")
_BLOCKED_CODE = {name: code for code, name in enumerate(BLOCKED_BY)}
#: The prefix of every metrics key unless set_metrics_prefix() changes it.
DEFAULT_METRICS_PREFIX = "buffer/"
_NAMES = (
    "taken",
    "dropped_stale",
    "retired",
    "evicted",
    "buffer_left",
    "sampled_total",
    "in_flight",
    "age_mean",
    "age_max",
    "blocked_by",
    *tuple(f"age_hist/{b}" for b in AGE_BUCKETS),
    "trained_over_age",
    "span_mean",
    "span_max",
    "admitted",
    "admission_refused",
    "admission_waits",
    *ATTEMPT_FIELDS,
    *PROTECTED_ADMISSION_FIELDS,
    "retired_early",
)
_prefix = DEFAULT_METRICS_PREFIX
_keys = tuple(_prefix + n for n in _NAMES)


def set_metrics_prefix(prefix: str) -> None:
    """Puts every metrics key under ``prefix`` (default ``"buffer/"``; ``""`` for bare names), process-wide.

    Batches whose metrics were not read yet use the new prefix too: metrics are built on first access.
    """
    global _prefix, _keys
    if not isinstance(prefix, str):
        raise TypeError(f"prefix={prefix!r} is not a str; pass e.g. 'buffer/' or 'train/buffer/'")
    _prefix, _keys = prefix, tuple(prefix + n for n in _NAMES)


def metrics_prefix() -> str:
    """Returns the prefix every metrics key starts with (see set_metrics_prefix)."""
    return _prefix


def metric_key(name: str) -> str:
    """Returns the metrics key of ``name`` (e.g. ``"taken"`` -> ``"buffer/taken"``) under the current prefix."""
    if name not in _NAMES:
        raise KeyError(f"{name!r} is not a metric; the metrics are {', '.join(_NAMES)}")
    return _prefix + name


def age_bucket(age: int) -> int:
    """Returns the index in AGE_BUCKETS of ``age`` (>= 0)."""
    return min(int(age).bit_length(), len(AGE_BUCKETS) - 1)


def log_record(stats: Stats) -> None:
    """Writes the one-line log record of one take or evict_stale (LOG_FORMAT), if INFO is enabled."""
    if logger.isEnabledFor(logging.INFO):
        taken, dropped, retired, evicted, _, _, _, _, left, _, sampled, max_age, expired = stats[:13]
        over, _, _, admitted, refused, waits = stats[13:19]
        attempts = stats[19]
        logger.info(
            LOG_FORMAT,
            dropped,
            taken,
            left,
            sampled,
            retired,
            evicted,
            max_age,
            expired,
            over,
            admitted,
            refused,
            waits,
            attempts[1],
            attempts[4],
            attempts[2],
            stats[21],
            stats[22],
            stats[23],
        )


def metrics_from_stats(stats: Stats) -> Dict[str, float]:
    """Returns the metrics dict of one take or evict_stale: numeric values under the current prefix."""
    taken, dropped, retired, evicted, blocked_by, age_sum, age_max, hist, left, in_flight, sampled = stats[:11]
    over, span_sum, span_max, admitted, refused, waits = stats[13:19]
    values = (
        taken,
        dropped,
        retired,
        evicted,
        left,
        sampled,
        in_flight,
        age_sum / taken if taken else 0.0,
        age_max,
        _BLOCKED_CODE[blocked_by],
        *hist,
        over,
        span_sum / taken if taken else 0.0,
        span_max,
        admitted,
        refused,
        waits,
        *stats[19],
        stats[21],
        stats[22],
        stats[23],
    )
    metrics = dict(zip(_keys, values))
    for source, source_taken, source_dropped in stats[20]:
        name = "untagged" if source < 0 else source
        metrics[f"{_prefix}source/{name}/taken"] = source_taken
        metrics[f"{_prefix}source/{name}/dropped"] = source_dropped
    return metrics


def make_metrics(stats: Stats) -> Dict[str, float]:
    """Returns the metrics dict of one take or evict_stale, and logs its record."""
    log_record(stats)
    return metrics_from_stats(stats)


class Batch:
    """Trajectories taken together: int64 tensors of equal length plus the metrics of the take.

    ``columns`` is one contiguous (9, k) int64 tensor whose rows are FIELDS; the named
    attributes are views of it, so ``batch.to("cuda", non_blocking=True)`` is one copy.
    The tensors belong to the caller: no later call overwrites them.
    """

    __slots__ = ("_array", "_columns", "_metrics", "_stats")

    def __init__(
        self,
        columns: Union[torch.Tensor, np.ndarray],
        metrics: Optional[Dict[str, float]] = None,
        *,
        stats: Optional[Stats] = None,
    ) -> None:
        # A (9, k) int64 numpy block (what take fills) becomes a tensor sharing its memory on first access.
        self._columns: Optional[torch.Tensor] = None if isinstance(columns, np.ndarray) else columns
        self._array: Optional[np.ndarray] = columns if isinstance(columns, np.ndarray) else None
        self._metrics = metrics
        self._stats = stats  # what the core returned; the metrics dict is built from it on first access

    @property
    def columns(self) -> torch.Tensor:
        """One contiguous (9, k) int64 tensor whose rows are FIELDS."""
        columns = self._columns
        if columns is None:
            columns = self._columns = _torch.require().from_numpy(self._array)
        return columns

    @property
    def metrics(self) -> Dict[str, float]:
        """The take's numbers under one prefix (default ``buffer/``), every value numeric.

        ``blocked_by`` is a code: ``BLOCKED_BY[code]`` (or ``batch.blocked_by``) is its name. Built on first
        access, so a loop that never reads them does not pay for them.
        """
        if self._metrics is None:
            self._metrics = metrics_from_stats(self._stats) if self._stats is not None else {}
        return self._metrics

    @property
    def blocked_by(self) -> str:
        """Why the batch is short: ``"none"``, ``"too_few_ready"`` or ``"in_flight_at_max_age"``."""
        if self._stats is not None:
            return self._stats[4]
        return BLOCKED_BY[int(self._metric("blocked_by"))]

    def _metric(self, name: str) -> float:
        # A dict built earlier carries the prefix in force then, which set_metrics_prefix may have changed.
        m = self.metrics
        key = _prefix + name
        return m[key] if key in m else next(v for k, v in m.items() if k.endswith(name))

    def _row(self, field: int) -> torch.Tensor:
        # Before `columns` exists, one from_numpy of the numpy row is cheaper than building the block
        # and indexing it; the tensor shares the batch's memory either way.
        if self._columns is None and self._array is not None:
            return _torch.require().from_numpy(self._array[field])
        return self.columns[field]

    @property
    def traj_ids(self) -> torch.Tensor:
        """Trajectory ids (handles into your payload store)."""
        return self._row(0)

    @property
    def group_ids(self) -> torch.Tensor:
        """Group (prompt) id of each trajectory."""
        return self._row(1)

    @property
    def sample_step(self) -> torch.Tensor:
        """Step whose weights produced each trajectory."""
        return self._row(2)

    @property
    def age(self) -> torch.Tensor:
        """current_step - sample_step, in trainer steps."""
        return self._row(3)

    @property
    def uses(self) -> torch.Tensor:
        """Times each entry has been taken, this take included."""
        return self._row(4)

    @property
    def policy_version(self) -> torch.Tensor:
        """sample_step // parameter_sync_step, or -1."""
        return self._row(5)

    @property
    def dispatch_ns(self) -> torch.Tensor:
        """Wall clock (ns since the epoch) at dispatch."""
        return self._row(6)

    @property
    def complete_ns(self) -> torch.Tensor:
        """Wall clock (ns since the epoch) at completion."""
        return self._row(7)

    @property
    def finish_step(self) -> torch.Tensor:
        """Step of the weights in force when each trajectory finished (>= sample_step; complete's finish_step)."""
        return self._row(8)

    @property
    def span(self) -> torch.Tensor:
        """finish_step - sample_step: the weight updates each trajectory's generation crossed (a new tensor)."""
        return self._row(8) - self._row(2)

    @property
    def source(self) -> torch.Tensor:
        """Source tag of each trajectory (``dispatch``/``put`` ``source=``), -1 when untagged."""
        return self._row(9)

    def __len__(self) -> int:
        if self._stats is not None:
            return self._stats[0]
        if self._array is not None:  # no tensor made just to count
            return int(self._array.shape[1])
        return int(self.columns.shape[1])

    def age_seconds(self, now_ns: int | None = None) -> torch.Tensor:
        """Returns each trajectory's age in seconds since dispatch, as float64."""
        now = time.time_ns() if now_ns is None else now_ns
        return (now - self.columns[6]).to(_torch.require().float64) / 1e9

    def to(self, *args: Any, **kwargs: Any) -> Batch:
        """Returns a Batch with the columns moved by ``Tensor.to`` (e.g. ``"cuda", non_blocking=True``).

        Raises RuntimeError when this torch cannot use the device (``"cuda"`` on a CPU-only build), naming
        what to pass instead, and ValueError for a string that is not a device.
        """
        check_usable(args, kwargs)
        return Batch(self.columns.to(*args, **kwargs), self.metrics, stats=self._stats)  # one shared dict

    def __repr__(self) -> str:
        return (
            f"Batch(taken={len(self)}, dropped_stale={self._metric('dropped_stale')}, "
            f"age_mean={self._metric('age_mean'):.2f}, blocked_by={self.blocked_by!r}, device={self.columns.device})"
        )

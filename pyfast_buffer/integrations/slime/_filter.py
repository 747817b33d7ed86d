"""``buffer_filter``: slime's ``--buffer-filter-path`` for its non-fully-async path with
``RolloutDataSourceWithBuffer``, where the buffer holds groups slime put back (partially generated groups under
``--partial-rollout``). Hands out up to ``num_samples`` groups, oldest first, and discards groups older than the
bound.

slime calls the filter with ``rollout_id=None``, so a group's age is counted in weight versions: the engine's
weight version now minus the group's oldest ``weight_versions`` entry. Nothing slime passes names the engine's
version, and the newest version in the buffer lags it by the update made since those tokens were generated, so a
group was trained at ``max_age + 1`` (issue 58, item 8). ``generate_rollout`` (``--rollout-function-path``) wraps
slime's own rollout function and tells the filter: the engine's version at rollout ``k`` is the newest
``weight_versions`` entry of rollout ``k - 1``'s trained output (generated at one version: slime updates weights
between rollouts only) plus the updates made between. train.py updates after training rollout ``j`` when
``(j + 1) % --update-weights-interval == 0``, train_async.py one rollout later; the filter counts the larger of
the two, so with an interval above 1 it may count an update one rollout early (a group discarded one version
early, never trained late). Without the wrapper the filter falls back to the newest version it has seen, and may
lag.
A group with no numeric weight version has unknown age: it is kept, after the versioned ones.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from pyfast_buffer.integrations._slime_family import group_oldest_version, iter_samples
from pyfast_buffer.integrations.slime._options import WHERE, read_options

logger = logging.getLogger(__name__)


class StalenessBufferFilter:
    """Callable as ``(args, rollout_id, buffer, num_samples)``; ``counts`` totals what it handed out and discarded."""

    def __init__(self) -> None:
        self.newest_version: Optional[int] = None
        #: The engine's weight version at the rollout being collected, when ``generate_rollout`` told us (else None).
        self.engine_version: Optional[int] = None
        self.counts: Dict[str, int] = collections.Counter()
        self._lock = threading.Lock()
        self._last: Optional[Tuple[int, int]] = None  # (rollout id, engine version) of the last rollout that ended

    def begin_rollout(self, rollout_id: int, update_interval: int = 1) -> None:
        """Rollout ``rollout_id`` starts: the engine's version is the last ended rollout's plus the updates since."""
        with self._lock:
            if self._last is not None and rollout_id >= self._last[0]:
                ended, version = self._last
                self.engine_version = version + _updates_between(ended, rollout_id, max(1, update_interval))

    def end_rollout(self, rollout_id: int, trained: List[List[Any]]) -> None:
        """Rollout ``rollout_id`` ended with ``trained``: its newest weight version is the engine's at that rollout."""
        newest = [v for g in trained for s in iter_samples(g) if (v := _newest_version(s)) is not None]
        with self._lock:
            # What was seen is exact (every trained group had a turn at this rollout's version); the estimate is
            # the anchor only when nothing carried a version, so a rounded-up count is never carried forward.
            anchor = max(newest) if newest else self.engine_version
            if anchor is not None:
                self._last = (rollout_id, anchor)

    def __call__(self, args: Any, rollout_id: Any, buffer: List[List[Any]], num_samples: int) -> List[List[Any]]:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
            raise TypeError(f"{WHERE}.buffer_filter: num_samples={num_samples!r} must be an int >= 0")
        max_age = read_options(args).max_age
        with self._lock:
            for group in buffer:
                for sample in iter_samples(group):
                    newest = _newest_version(sample)
                    if newest is not None and (self.newest_version is None or newest > self.newest_version):
                        self.newest_version = newest
            stamped = [(group_oldest_version(g), i, g) for i, g in enumerate(buffer)]
            now = max((v for v in (self.newest_version, self.engine_version) if v is not None), default=None)
            cutoff = None if now is None else now - max_age
            stale = [g for v, _, g in stamped if v is not None and cutoff is not None and v < cutoff]
            fresh = sorted(
                ((v, i, g) for v, i, g in stamped if v is None or cutoff is None or v >= cutoff),
                key=lambda e: (e[0] is None, e[0] or 0, e[1]),  # oldest first, unknown age last, then buffer order
            )
            chosen = [g for _, _, g in fresh[:num_samples]]
            keep = [g for _, _, g in fresh[num_samples:]]
            keep_ids = {id(g) for g in keep}
            buffer[:] = [g for g in buffer if id(g) in keep_ids]  # in place: slime holds this very list
            self.counts["discarded_stale"] += len(stale)
            self.counts["handed_out"] += len(chosen)
        if stale:
            logger.info("%s.buffer_filter: discarded %d groups over %d weight versions old", WHERE, len(stale), max_age)
        return chosen


def _updates_between(ended: int, rollout_id: int, interval: int) -> int:
    """Weight updates between rollout ``ended`` and rollout ``rollout_id``: the larger of train.py's count (after
    training rollout j when (j + 1) % interval == 0) and train_async.py's (one rollout later)."""
    train = sum(1 for j in range(ended, rollout_id) if (j + 1) % interval == 0)
    train_async = sum(1 for j in range(ended - 1, rollout_id - 1) if (j + 1) % interval == 0)
    return max(train, train_async)


def _newest_version(sample: Any) -> Optional[int]:
    numeric = [int(v) for v in (getattr(sample, "weight_versions", None) or ()) if str(v).isdigit()]
    return max(numeric) if numeric else None


#: ``--buffer-filter-path pyfast_buffer.integrations.slime.buffer_filter``
buffer_filter = StalenessBufferFilter()


def rollout_telling_the_filter(
    inner: Callable[..., Any], args: Any, rollout_id: int, data_source: Any, evaluation: bool, filt: Any
) -> Any:
    """Runs the rollout function ``inner`` with ``filt`` told the engine's version before, and the trained
    output after (an evaluation rollout is passed through: it trains nothing)."""
    if evaluation:
        return inner(args, rollout_id, data_source, evaluation=True)
    filt.begin_rollout(rollout_id, int(getattr(args, "update_weights_interval", 1) or 1))
    out = inner(args, rollout_id, data_source, evaluation=False)
    filt.end_rollout(rollout_id, list(getattr(out, "samples", None) or ()))
    return out


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """``--rollout-function-path pyfast_buffer.integrations.slime.generate_rollout``: slime's own
    ``generate_rollout`` (its non-fully-async path, with ``--partial-rollout`` and over-sampling), with
    ``buffer_filter`` told the engine's weight version of each rollout. slime is imported on first call only."""
    from slime.rollout.sglang_rollout import generate_rollout as slime_generate_rollout

    return rollout_telling_the_filter(slime_generate_rollout, args, rollout_id, data_source, evaluation, buffer_filter)

"""``buffer_filter``: slime's ``--buffer-filter-path`` for its non-fully-async path with
``RolloutDataSourceWithBuffer``, where the buffer holds groups slime put back (partially generated groups under
``--partial-rollout``). Hands out up to ``num_samples`` groups, oldest first, and discards groups older than the
bound.

slime calls the filter with ``rollout_id=None``, so a group's age is counted in weight versions: the newest weight
version seen (over the buffer now and every call before) minus the group's oldest ``weight_versions`` entry.
A group with no numeric weight version has unknown age: it is kept, after the versioned ones.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Dict, List, Optional

from pyfast_buffer.integrations._slime_family import group_oldest_version, iter_samples
from pyfast_buffer.integrations.slime._options import WHERE, read_options

logger = logging.getLogger(__name__)


class StalenessBufferFilter:
    """Callable as ``(args, rollout_id, buffer, num_samples)``; ``counts`` totals what it handed out and discarded."""

    def __init__(self) -> None:
        self.newest_version: Optional[int] = None
        self.counts: Dict[str, int] = collections.Counter()
        self._lock = threading.Lock()

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
            cutoff = None if self.newest_version is None else self.newest_version - max_age
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


def _newest_version(sample: Any) -> Optional[int]:
    numeric = [int(v) for v in (getattr(sample, "weight_versions", None) or ()) if str(v).isdigit()]
    return max(numeric) if numeric else None


#: ``--buffer-filter-path pyfast_buffer.integrations.slime.buffer_filter``
buffer_filter = StalenessBufferFilter()

"""The report of ids leaving the buffer: what callers who keep payloads by id free them from."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

#: Reason names by code: ``RELEASE_REASONS[code]`` for each code in ``Released.reasons``.
RELEASE_REASONS = ("retired", "dropped_stale", "evicted", "failed", "expired")
#: Records a tracking buffer keeps by default between two released() calls: 2 * capacity + this.
RELEASE_SLACK = 65536
#: What released() raises (ValueError) on a buffer built without tracking.
NOT_TRACKED = "released(): this buffer does not track released ids; construct it with track_released=True"


def default_release_bound(capacity: int) -> int:
    """Returns the records kept by default: everything a full ring can release twice over, plus slack."""
    return 2 * capacity + RELEASE_SLACK


class Released(NamedTuple):
    """Every id that left the buffer since the previous ``released()`` call, oldest first.

    ``ids`` (int64) are trajectory ids for ``retired``, ``dropped_stale`` and ``evicted`` and prompt
    ids for ``failed`` and ``expired``; ``reasons`` (int8) are codes into ``RELEASE_REASONS``.
    """

    ids: np.ndarray
    reasons: np.ndarray

    def of(self, reason: str) -> np.ndarray:
        """Returns the ids released for ``reason`` (one of RELEASE_REASONS), in order."""
        if reason not in RELEASE_REASONS:
            raise ValueError(f"reason={reason!r} is unknown; use one of {RELEASE_REASONS}")
        return self.ids[self.reasons == RELEASE_REASONS.index(reason)]

"""Payload slots recycled through ``released()``: trajectory ids ARE row numbers of a fixed payload tensor.

The buffer holds ids and you hold the data. If every trajectory got a new id, the ids would soon grow past
any payload tensor; instead, take a free row for each trajectory, use the row number as its id, and give
the row back when the buffer reports the id released (retired, dropped stale or evicted). A buffer built
with ``track_released=True`` reports every id exactly once, so no row is freed twice or leaked.

Order matters: the trainer reads the rows of a batch first and drains ``released()`` after, because the
ids it just took are reported as retired by that same take.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Iterable, List

import numpy as np

from pyfast_buffer import RELEASE_REASONS, Released

#: Released reasons whose ids are trajectory ids (failed and expired report prompt ids).
TRAJECTORY_REASONS = tuple(RELEASE_REASONS.index(r) for r in ("retired", "dropped_stale", "evicted"))


class SlotPool:
    """A thread-safe free list of payload rows ``0 .. rows-1``."""

    def __init__(self, rows: int) -> None:
        self._free = deque(range(rows))
        self._cond = threading.Condition()
        self.rows = rows

    def acquire(self, n: int, timeout: float) -> List[int]:
        """Takes ``n`` free rows, waiting up to ``timeout`` seconds for the trainer to give some back."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._free) >= n, timeout):
                raise TimeoutError(f"no {n} free payload rows within {timeout} s; drain released() more often")
            return [self._free.popleft() for _ in range(n)]

    def give_back(self, rows: Iterable[int]) -> None:
        with self._cond:
            self._free.extend(int(r) for r in rows)
            self._cond.notify_all()

    def recycle(self, released: Released) -> int:
        """Gives back the rows of a ``buf.released()`` report's trajectory ids; returns how many."""
        ids = released.ids[np.isin(released.reasons, TRAJECTORY_REASONS)]
        self.give_back(ids.tolist())
        return len(ids)

    def free(self) -> int:
        with self._cond:
            return len(self._free)

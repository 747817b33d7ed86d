"""The report of released ids the index keeps for the caller of ``released()``, bounded as the core's is."""

from __future__ import annotations

import collections
import threading
from typing import Deque, List

import numpy as np

from ..released import Released


class ReleasedReport:
    """The released ids the caller has not fetched yet, oldest first, at most ``bound`` (older ones are counted)."""

    def __init__(self, bound: int) -> None:
        self._chunks: Deque[Released] = collections.deque()
        self._size = 0
        self.bound = bound
        self.overflow = 0
        self._lock = threading.Lock()

    def add(self, released: Released) -> None:
        with self._lock:
            self._chunks.append(released)
            self._size += len(released.ids)
            while self._size > self.bound:  # discard the oldest records, as the core does
                head = self._chunks[0]
                cut = min(len(head.ids), self._size - self.bound)
                self._chunks[0] = Released(head.ids[cut:], head.reasons[cut:])
                self._size -= cut
                self.overflow += cut
                if not len(self._chunks[0].ids):
                    self._chunks.popleft()

    def peek(self) -> Released:
        """The records not fetched yet, without fetching them (the index journals them)."""
        with self._lock:
            return _joined(list(self._chunks))

    def drain(self) -> Released:
        with self._lock:
            chunks, self._chunks, self._size = list(self._chunks), collections.deque(), 0
        return _joined(chunks)


def _joined(chunks: List[Released]) -> Released:
    if not chunks:
        return Released(np.empty(0, np.int64), np.empty(0, np.int8))
    return Released(np.concatenate([c.ids for c in chunks]), np.concatenate([c.reasons for c in chunks]))

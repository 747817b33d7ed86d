"""The payload refs the buffer actor holds, by trajectory id, and their release."""

from __future__ import annotations

import collections
import threading
from typing import Any, Deque, Dict, List, Optional, Sequence

import numpy as np
import ray

from ..released import Released


def own(values: Sequence[Any]) -> List[ray.ObjectRef]:
    """Returns one ref per value; values that are not refs yet are ``ray.put`` here, so this process owns them.

    Called inside the actor, this makes the actor the owner of a producer's trajectory: the object then
    outlives the producer (Ray frees an object when its owner dies, whatever process still needs it).
    A value that is already an ObjectRef is kept as it is, owned by whoever created it.
    """
    return [v if isinstance(v, ray.ObjectRef) else ray.put(v) for v in values]


class PayloadStore:
    """Refs by trajectory id; dropping a ref here lets Ray's object store free it once nobody else holds it."""

    def __init__(self) -> None:
        self._refs: Dict[int, ray.ObjectRef] = {}
        self._lock = threading.Lock()

    def hold(self, traj_ids: np.ndarray, refs: List[ray.ObjectRef]) -> None:
        """Holds ``refs[i]`` for ``traj_ids[i]``, or raises ValueError (holding nothing) if an id holds one already."""
        keys = traj_ids.tolist()
        if len(set(keys)) != len(keys):
            raise ValueError("traj_ids repeats an id in a call with payloads; give every trajectory its own id")
        with self._lock:
            clash = [k for k in keys if k in self._refs]
            if clash:
                raise ValueError(
                    f"traj_ids {clash[:5]} still hold payloads in the buffer; ids with payloads must be "
                    "unique until they leave the buffer (use fresh ids)"
                )
            self._refs.update(zip(keys, refs))

    def lookup(self, traj_ids: np.ndarray) -> List[Optional[ray.ObjectRef]]:
        """Returns the ref of each id (None for an id put without one)."""
        with self._lock:
            return [self._refs.get(k) for k in traj_ids.tolist()]

    def release(self, traj_ids: np.ndarray) -> int:
        """Drops the refs of these ids; returns how many were held."""
        with self._lock:
            return sum(self._refs.pop(k, None) is not None for k in traj_ids.tolist())

    def keep_only(self, traj_ids: np.ndarray) -> int:
        """Drops every ref whose id is not in ``traj_ids``; returns how many were dropped."""
        keep = set(traj_ids.tolist())
        with self._lock:
            gone = [k for k in self._refs if k not in keep]
            for k in gone:
                del self._refs[k]
        return len(gone)

    def __len__(self) -> int:
        return len(self._refs)


class ReleasedReport:
    """The released ids the caller has not fetched yet, oldest first, at most ``bound`` (older ones are counted)."""

    def __init__(self, bound: int) -> None:
        self._chunks: Deque[Released] = collections.deque()
        self._size = 0
        self._bound = bound
        self.overflow = 0
        self._lock = threading.Lock()

    def add(self, released: Released) -> None:
        with self._lock:
            self._chunks.append(released)
            self._size += len(released.ids)
            while self._size > self._bound:  # discard the oldest records, as the core does
                head = self._chunks[0]
                cut = min(len(head.ids), self._size - self._bound)
                self._chunks[0] = Released(head.ids[cut:], head.reasons[cut:])
                self._size -= cut
                self.overflow += cut
                if not len(self._chunks[0].ids):
                    self._chunks.popleft()

    def drain(self) -> Released:
        with self._lock:
            chunks, self._chunks, self._size = list(self._chunks), collections.deque(), 0
        if not chunks:
            return Released(np.empty(0, np.int64), np.empty(0, np.int8))
        return Released(np.concatenate([c.ids for c in chunks]), np.concatenate([c.reasons for c in chunks]))

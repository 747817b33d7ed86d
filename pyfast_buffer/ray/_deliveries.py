"""Takes the index answered whose batch the taking client has not yet confirmed it received.

A take retires its ids in the index before the reply travels to the client, and the client then fetches
the payload refs from the owners. If the client dies (or its call fails for good) in between, nobody
received the batch: counting those ids as ``retired`` would be a lie. So the index keeps each answered take
here, *in delivery*, until the client's receipt arrives (one call the client sends without waiting for it,
after it holds the columns and the refs). A take with no receipt within ``receipt_timeout_s`` is counted
``lost_in_delivery`` and its payloads are let go of; a receipt that comes later still moves its ids back
(``late_receipts``), so at every moment each id taken is in exactly one of ``retired`` (of which
``in_delivery`` await their receipt), ``lost_in_delivery`` or ``payload_lost``.
"""

from __future__ import annotations

import collections
import time
from typing import Any, DefaultDict, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

#: Seconds a take waits for its client's receipt before its ids count as lost_in_delivery (the default).
DEFAULT_RECEIPT_TIMEOUT_S = 60.0
#: Takes declared lost that a late receipt can still move back (older ones stay lost).
REMEMBERED_LOST = 4096


class Delivery(NamedTuple):
    """One answered take: the ids it retired, the owner slot of each (-1: no payload), its deadline."""

    ids: np.ndarray
    slots: np.ndarray
    deadline: float


class Deliveries:
    """The takes in delivery, oldest first; not thread safe (the index calls it under its lock)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._open: collections.OrderedDict[int, Delivery] = collections.OrderedDict()
        self._lost: collections.OrderedDict[int, int] = collections.OrderedDict()  # request -> ids counted lost
        self.in_delivery = 0

    def open(self, request: int, ids: np.ndarray, slots: Optional[np.ndarray]) -> None:
        """Records a take's retired ids (and their owners' slots) as in delivery."""
        if not len(ids) or request in self._open:
            return
        where = np.full(len(ids), -1, np.int64) if slots is None else np.asarray(slots, np.int64)
        self._open[request] = Delivery(ids, where, time.monotonic() + self.timeout_s)
        self.in_delivery += len(ids)

    def receive(self, request: int) -> Optional[int]:
        """The client received take ``request``: returns how many ids it had in delivery, or minus how many it
        had counted lost (a late receipt), or None if it is unknown (a repeated receipt: nothing to do)."""
        delivery = self._open.pop(request, None)
        if delivery is not None:
            self.in_delivery -= len(delivery.ids)
            return len(delivery.ids)
        lost = self._lost.pop(request, None)
        return None if lost is None else -lost

    def expire(self, now: Optional[float] = None) -> Tuple[int, Dict[int, List[int]]]:
        """Closes, as lost, every take whose receipt is overdue: returns how many ids, and those with a
        payload by owner slot (nobody will fetch them: their owners can let go)."""
        now = time.monotonic() if now is None else now
        lost = 0
        by_slot: DefaultDict[int, List[int]] = collections.defaultdict(list)
        while self._open:
            request, delivery = next(iter(self._open.items()))
            if delivery.deadline > now:
                break
            del self._open[request]
            self.in_delivery -= len(delivery.ids)
            self._lost[request] = len(delivery.ids)
            while len(self._lost) > REMEMBERED_LOST:
                self._lost.popitem(last=False)
            lost += len(delivery.ids)
            for k, slot in zip(delivery.ids.tolist(), delivery.slots.tolist()):
                if slot >= 0:
                    by_slot[slot].append(k)
        return lost, dict(by_slot)

    def capture(self) -> Dict[str, Any]:
        """For the journal: the open takes (their deadlines restart at a restore) and those counted lost."""
        return {
            "requests": np.fromiter(self._open.keys(), np.int64, len(self._open)),
            "ids": [d.ids for d in self._open.values()],
            "slots": [d.slots for d in self._open.values()],
            "lost": [[k, n] for k, n in self._lost.items()],
        }

    def restore(self, snap: Optional[Dict[str, Any]]) -> None:
        """Reopens the takes of a journal snapshot (None: a journal from before receipts, nothing to do)."""
        if snap is None:
            return
        for request, ids, slots in zip(np.asarray(snap["requests"]).tolist(), snap["ids"], snap["slots"]):
            self.open(int(request), np.asarray(ids, np.int64), np.asarray(slots, np.int64))
        self._lost.update((int(k), int(n)) for k, n in snap["lost"])

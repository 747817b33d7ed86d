"""Takes the index answered whose batch the taking client has not yet confirmed it received.

A take retires its ids in the index before the reply travels to the client, and the client then fetches
the payload refs from the owners. If the client dies (or its call fails for good) in between, nobody
received the batch: counting those ids as ``retired`` would be a lie. So the index keeps each answered take
here, *in delivery*, until the client's receipt arrives (after it holds the columns and the refs: carried by
its next take, or sent alone without waiting if no take follows soon, ``_receipts``). A take with no receipt
within ``receipt_timeout_s`` is counted ``lost_in_delivery`` and its payloads are let go of; a receipt that
comes later still moves its ids back (``late_receipts``), so at every moment each id taken is in exactly one
of ``retired`` (of which ``in_delivery`` await their receipt), ``lost_in_delivery`` or ``payload_lost``.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, DefaultDict, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

#: Seconds a take waits for its client's receipt before its ids count as lost_in_delivery (the default).
DEFAULT_RECEIPT_TIMEOUT_S = 60.0
#: Takes declared lost that a late receipt can still move back (older ones stay lost).
REMEMBERED_LOST = 256


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

    def cancel(self, request: int) -> Optional[np.ndarray]:
        """Its client dropped take ``request``'s batch (a cancelled awaitable take): returns the ids it had in
        delivery, now closed (none when that take retired none: ``max_uses`` > 1), or None if it was counted
        already (lost after its receipt timeout, or a repeat of this call)."""
        delivery = self._open.pop(request, None)
        if delivery is None:
            if request in self._lost:
                return None
            self._remember_lost(request, 0)
            return np.empty(0, np.int64)
        self.in_delivery -= len(delivery.ids)
        self._remember_lost(request, len(delivery.ids))
        return delivery.ids

    def _remember_lost(self, request: int, count: int) -> None:
        self._lost[request] = count
        while len(self._lost) > REMEMBERED_LOST:
            self._lost.popitem(last=False)

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
            self._remember_lost(request, len(delivery.ids))
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
            "lost_requests": np.fromiter(self._lost.keys(), np.int64, len(self._lost)),
            "lost_counts": np.fromiter(self._lost.values(), np.int64, len(self._lost)),
        }

    def restore(self, snap: Optional[Dict[str, Any]]) -> None:
        """Reopens the takes of a journal snapshot (None: a journal from before receipts, nothing to do)."""
        if snap is None:
            return
        for request, ids, slots in zip(np.asarray(snap["requests"]).tolist(), snap["ids"], snap["slots"]):
            self.open(int(request), np.asarray(ids, np.int64), np.asarray(slots, np.int64))
        lost = zip(np.asarray(snap["lost_requests"]).tolist(), np.asarray(snap["lost_counts"]).tolist())
        self._lost.update((int(k), int(n)) for k, n in lost)


class DeliveryCalls:
    """The index actor's calls about deliveries (a part of BufferActor, which has these attributes)."""

    _lock: threading.RLock
    _deliveries: Deliveries
    _extra: Dict[str, int]
    _journal: Any
    _owners: List[Any]
    _done_puts: Any

    def _receive_all(self, requests: Sequence[int]) -> bool:
        """The receipts a take carried (none with lost payloads: those are sent alone, at once); under the
        lock, journaled with that take. Returns whether any changed the deliveries."""
        changed = False
        for request in requests:
            had = self._deliveries.receive(int(request))
            if had is not None and had < 0:  # counted lost_in_delivery, but the client did receive it
                self._extra["lost_in_delivery"] += had
                self._extra["late_receipts"] += 1
            changed = changed or had is not None
        return changed

    def received(self, request: int, lost_ids: np.ndarray) -> None:
        """The receipt of take ``request``: its client holds the batch; ``lost_ids`` it drew had no payload
        (their owner died), counted as payload_lost. Repeats change nothing (see _deliveries). An ordinary
        receipt does not wait for its snapshot: it was sent without waiting, and rides in the next one."""
        with self._lock:
            had = self._deliveries.receive(request)
            if had is None:
                return
            if had < 0:  # counted lost_in_delivery, but the client did receive it: moved back
                self._extra["lost_in_delivery"] += had
                self._extra["late_receipts"] += 1
            self._extra["payload_lost"] += len(lost_ids)
            waited = had < 0 or len(lost_ids) > 0  # a plain receipt's record is not waited for
            version = self._journal.mark(later=not waited)
        if waited:
            self._journal.wait(version)

    def cancelled(self, request: int, lost_ids: np.ndarray) -> None:
        """Take ``request``'s client dropped its batch unread (an awaitable take cancelled while its attempt
        was at the index): the ids it retired count as ``lost_in_delivery`` now, not after ``receipt_timeout_s``,
        those whose payload was already gone (``lost_ids``) as ``payload_lost``, and ``cancelled_takes`` counts the
        take. Their payloads were let go of at hand-out; ids it did not retire (``max_uses`` > 1) stay in the ring
        with that use spent, as the core counted it. Repeats change nothing."""
        with self._lock:
            ids = self._deliveries.cancel(request)
            if ids is None:
                return
            gone = np.isin(ids, lost_ids)
            self._extra["lost_in_delivery"] += int((~gone).sum())
            self._extra["payload_lost"] += len(lost_ids)
            self._extra["cancelled_takes"] += 1
            version = self._journal.mark()
        self._journal.wait(version)

    def unreadable(self, request: int, traj_ids: np.ndarray) -> None:
        """A trainer could not read these taken ids' payloads (their owner died after hand-out): moved from
        retired to payload_lost, once per request id."""
        with self._lock:
            if request in self._done_puts:
                self._extra["duplicate_requests"] += 1
                return
            self._done_puts[request] = None
            self._extra["payload_lost"] += len(traj_ids)
            version = self._journal.mark()
        self._journal.wait(version)

    def _close_overdue(self) -> None:
        """Counts takes whose receipt is overdue as lost_in_delivery and lets their owners free the payloads."""
        lost, by_slot = self._deliveries.expire()
        if not lost:
            return
        self._extra["lost_in_delivery"] += lost
        for slot, ids in by_slot.items():
            owner = self._owners[slot] if slot < len(self._owners) else None
            if owner is not None:
                owner.release.remote(ids)  # not yet handed out: nobody will fetch them
        self._journal.mark(later=True)

"""Group commit of many callers' items into one call: the payload owner's registrations with the index.

While one call is in flight, items submitted meanwhile queue; when it answers, one of their callers sends
them all in the next call. So a lone producer pays one round trip per item, and under load the index
answers one call for many producers' puts: its cost per payload falls as the producers rise.

Callers may also ``announce`` an item before they have it (a put whose payloads are still being written):
a caller about to send waits up to ``linger_s`` for the announced items, so that they share its call
instead of each paying an index call of its own. Nothing announced (a lone producer): no wait at all.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, Optional


class _Waiter:
    __slots__ = ("done", "error", "item", "outcome")

    def __init__(self, item: Any) -> None:
        self.item = item
        self.done = False
        self.outcome: Any = None
        self.error: Optional[BaseException] = None


class GroupCall:
    """``submit(item)`` returns ``item``'s outcome from ``send(items)``, sending the items queued together.

    ``send`` gets a list of items and returns one outcome per item, in order; an exception it raises is
    raised in the caller of every item of that call.
    """

    def __init__(self, send: Callable[[List[Any]], List[Any]], linger_s: float = 0.0) -> None:
        self._send = send
        self._linger_s = linger_s
        self._cv = threading.Condition()
        self._queue: List[_Waiter] = []
        self._busy = False
        self._announced = 0  # items callers said are coming (``announce``), not yet submitted or withdrawn
        self._mine = threading.local()  # whether this thread's announced item is still to come
        self.calls = 0  # calls sent (the index's cost), next to ``items``: their ratio is the grouping
        self.items = 0

    def announce(self) -> None:
        """Says this thread will submit an item (``submit(..., announced=True)``), or else ``withdraw``."""
        with self._cv:
            if not getattr(self._mine, "pending", False):
                self._mine.pending = True
                self._announced += 1

    def withdraw(self) -> None:
        """This thread's announced item will not come (its put failed first); nothing if it was submitted."""
        with self._cv:
            if getattr(self._mine, "pending", False):
                self._mine.pending = False
                self._announced -= 1
                self._cv.notify_all()

    def submit(self, item: Any, announced: bool = False) -> Any:
        me = _Waiter(item)
        with self._cv:
            if announced and getattr(self._mine, "pending", False):
                self._mine.pending = False
                self._announced -= 1
            self._queue.append(me)
            self._cv.notify_all()  # a caller lingering for announced items counts this one
            while self._busy and not me.done:
                self._cv.wait()
            lead = not me.done
            if lead:  # nothing in flight: this caller sends every queued item, its own among them
                self._busy = True
                mine = 1 if getattr(self._mine, "pending", False) else 0  # its own item to come is not awaited
                if self._announced > mine and self._linger_s > 0:
                    deadline = time.monotonic() + self._linger_s
                    while self._announced > mine and time.monotonic() < deadline:
                        self._cv.wait(deadline - time.monotonic())
                batch, self._queue = self._queue, []
        if lead:
            self._lead(batch)
        if me.error is not None:
            raise me.error
        return me.outcome

    def queued(self) -> int:
        """Items waiting for the call in flight to answer."""
        with self._cv:
            return len(self._queue)

    def _lead(self, batch: List[_Waiter]) -> None:
        error: Optional[BaseException] = None
        outcomes: List[Any] = [None] * len(batch)
        try:
            outcomes = self._send([w.item for w in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"a group call answered {len(outcomes)} outcomes for {len(batch)} items")
        except BaseException as exc:  # every caller of this call gets it (the call may not have been applied)
            error = exc
        with self._cv:
            self.calls += 1
            self.items += len(batch)
            for waiter, outcome in zip(batch, outcomes):
                waiter.outcome, waiter.error, waiter.done = outcome, error, True
            self._busy = False
            self._cv.notify_all()

"""Group commit of many callers' items into one call: the payload owner's registrations with the index.

While one call is in flight, items submitted meanwhile queue; when it answers, one of their callers sends
them all in the next call. So a lone producer pays one round trip per item, and under load the index
answers one call for many producers' puts: its cost per payload falls as the producers rise.

Callers may also ``announce`` an item before they have it (a put whose payloads are still being written):
a caller about to send waits up to ``linger_s`` for the items announced before it began to wait, so that
they share its call instead of each paying an index call of its own. It does not wait for items announced
after that (under a steady stream of puts it would wait its whole ``linger_s`` every time), nor for one
whose caller waits in the queue behind it (a byte budget's reservation goes before its put's admission).
Nothing announced (a lone producer): no wait at all.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, Optional, Set


class _Waiter:
    __slots__ = ("done", "error", "item", "outcome", "ticket")

    def __init__(self, item: Any, ticket: int) -> None:
        self.item = item
        self.ticket = ticket  # its thread's announcement still to come (0: none); it cannot come while this waits
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
        self._announced: Set[int] = set()  # tickets of items said to be coming, not yet submitted or withdrawn
        self._tickets = 0  # the last ticket given: announcements are numbered in order
        self._mine = threading.local()  # ``ticket``: this thread's announced item still to come (0: none)
        self.calls = 0  # calls sent (the index's cost), next to ``items``: their ratio is the grouping
        self.items = 0

    def announce(self) -> None:
        """Says this thread will submit an item (``submit(..., announced=True)``), or else ``withdraw``."""
        with self._cv:
            if not self._ticket():
                self._tickets += 1
                self._mine.ticket = self._tickets
                self._announced.add(self._tickets)

    def withdraw(self) -> None:
        """This thread's announced item will not come (its put failed first); nothing if it was submitted."""
        with self._cv:
            if self._ticket():
                self._drop_ticket()
                self._cv.notify_all()

    def submit(self, item: Any, announced: bool = False) -> Any:
        with self._cv:
            if announced:
                self._drop_ticket()
            me = _Waiter(item, self._ticket())
            self._queue.append(me)
            self._cv.notify_all()  # a caller lingering for announced items counts this one
            while self._busy and not me.done:
                self._cv.wait()
            lead = not me.done
            if lead:  # nothing in flight: this caller sends every queued item, its own among them
                self._busy = True
                horizon = self._tickets  # wait for what is being written now, not for what comes later
                if self._linger_s > 0 and self._awaited(horizon):
                    deadline = time.monotonic() + self._linger_s
                    while self._awaited(horizon) and time.monotonic() < deadline:
                        self._cv.wait(deadline - time.monotonic())
                batch, self._queue = self._queue, []
        if lead:
            self._lead(batch)
        if me.error is not None:
            raise me.error
        return me.outcome

    def _ticket(self) -> int:
        return getattr(self._mine, "ticket", 0)

    def _drop_ticket(self) -> None:
        """This thread's announced item came or will not come (lock held); nothing if none is pending."""
        self._announced.discard(self._ticket())
        self._mine.ticket = 0

    def _awaited(self, horizon: int) -> bool:
        """Whether an item announced up to ticket ``horizon`` may still come before this call goes (lock held):
        not one whose thread waits in the queue (the leader's own included), which comes after this call."""
        queued = {w.ticket for w in self._queue}
        return any(t <= horizon and t not in queued for t in self._announced)

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

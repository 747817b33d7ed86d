"""The taking client's receipts (see ``_deliveries``): carried by its next take, or sent alone.

A receipt is a call of its own to the index, and the index's CPU is per call, so a client that takes again
soon sends the receipts of its earlier takes inside that take's call instead (the index applies them
before the take, in the same journal record). A receipt no take carries within ``RECEIPT_LINGER_S`` is sent
alone by a timer thread, so a trainer that takes seldom confirms as before, and well within the index's
``receipt_timeout_s``. Receipts are idempotent: one sent twice (alone after its take failed, or again
after the index restarted) changes nothing the second time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from . import _errors
from ._calls import call_index

#: Seconds a receipt waits for the client's next take to carry it before it is sent alone.
RECEIPT_LINGER_S = 0.05
#: Receipts sent alone a process leaves uncollected before it looks which are done (ledger() collects all).
MAX_UNSETTLED_RECEIPTS = 64
_NONE_LOST = np.empty(0, np.int64)


class Receipts:
    """One process's receipts for one index actor: those waiting for a take to carry them, and those sent
    alone whose replies are not collected yet."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor
        self._unsent: Dict[int, float] = {}  # take request id -> when the batch was received
        self._sent: Dict[int, ray.ObjectRef] = {}
        self._cancels: Dict[int, Tuple[ray.ObjectRef, np.ndarray]] = {}  # dropped takes' reports, not yet collected
        self.alone = 0  # receipts sent as calls of their own (the index's CPU is per call; benches count them)

    def add(self, request: int) -> None:
        """Take ``request``'s batch is held here: confirmed with the next take, or alone after the linger."""
        with _TIMER.cv:
            self._unsent[request] = time.monotonic()
            _TIMER.watch(self)

    def carry(self) -> List[int]:
        """The receipts the next take carries (they are not sent alone any more)."""
        with _TIMER.cv:
            out, self._unsent = list(self._unsent), {}
        return out

    def send(self, requests: List[int], settle: bool = True) -> None:
        """Sends these receipts alone, without waiting (a take that carried them failed, or the linger ran out);
        only the client's own thread (``settle``) collects replies, the timer's only adds to them."""
        if not ray.is_initialized():
            # This process left the cluster (ray.shutdown): a call now would make Ray start a local cluster in
            # this process (auto-init), after which it cannot create actors in any other. The index counts these
            # ids lost_in_delivery after its receipt_timeout_s, as for a client that died.
            return
        for request in requests:
            self._sent[request] = self._actor.received.remote(request, _NONE_LOST)
        with _TIMER.cv:  # the timer's thread sends too
            self.alone += len(requests)
        if settle and len(self._sent) > MAX_UNSETTLED_RECEIPTS:
            self.settle(wait=False)

    def cancel(self, request: int, lost_ids: np.ndarray) -> None:
        """Reports take ``request``'s batch dropped unread (a cancelled awaitable take), without waiting: sent at
        once, from the thread that cancels, so the next ``ledger()`` of this process (which settles it) counts it."""
        self._cancels[request] = (self._actor.cancelled.remote(request, lost_ids), lost_ids)

    def overdue(self, now: float) -> List[int]:
        """Removes and returns the receipts that waited ``RECEIPT_LINGER_S`` (under the timer's lock)."""
        late = [r for r, at in self._unsent.items() if now - at >= RECEIPT_LINGER_S]
        for request in late:
            del self._unsent[request]
        return late

    def next_due(self) -> Optional[float]:
        """When the oldest unsent receipt is due (under the timer's lock); None if there is none."""
        return min(self._unsent.values()) + RECEIPT_LINGER_S if self._unsent else None

    def settle(self, wait: bool) -> None:
        """Collects the replies of receipts sent (with ``wait``: sends those still unsent first, and collects
        all); one the index died under is sent again, so a restart never turns a received batch into a lost one."""
        if wait:
            self.send(self.carry())
            for request, (ref, lost_ids) in list(self._cancels.items()):
                try:
                    _errors.get(ref)
                except (RayActorError, ActorUnavailableError):  # the index died under it: once more (idempotent)
                    call_index(self._actor, "cancelled", request, lost_ids)
                del self._cancels[request]
        refs = list(self._sent.values())
        if not refs:
            return
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=None if wait else 0, fetch_local=False)
        finished = set(done)
        for request, ref in list(self._sent.items()):
            if ref not in finished:
                continue
            del self._sent[request]
            try:
                _errors.get(ref)
            except (RayActorError, ActorUnavailableError):
                call_index(self._actor, "received", request, _NONE_LOST)


class _Timer:
    """One daemon thread per process that sends the receipts no take carried in time."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self._watched: Dict[int, Receipts] = {}
        self._thread: Optional[threading.Thread] = None

    def watch(self, receipts: Receipts) -> None:
        """(Under ``cv``.) Looks after ``receipts`` until it has nothing unsent; starts the thread once."""
        self._watched[id(receipts)] = receipts
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pyfast_buffer-receipts", daemon=True)
            self._thread.start()
        self.cv.notify_all()

    def _run(self) -> None:
        while True:
            with self.cv:
                due = [d for d in (r.next_due() for r in self._watched.values()) if d is not None]
                if not due:
                    self._watched.clear()
                    self.cv.wait()
                    continue
                now = time.monotonic()
                if min(due) > now:
                    self.cv.wait(min(due) - now)
                    continue
                late = [(r, r.overdue(now)) for r in self._watched.values()]
            for receipts, requests in late:
                if requests:
                    with contextlib.suppress(Exception):  # the index is gone (killed): nothing to confirm to
                        receipts.send(requests, settle=False)


_TIMER = _Timer()
#: Per process: index actor id -> its receipts.
_BY_ACTOR: Dict[str, Receipts] = {}


def receipts_for(actor: Any) -> Receipts:
    """This process's receipts for ``actor`` (made on first use)."""
    key = actor._actor_id.hex()
    found = _BY_ACTOR.get(key)
    if found is None:
        found = _BY_ACTOR[key] = Receipts(actor)
    return found


def forget(actor: Any) -> None:
    """The buffer was killed: its receipts go (nothing is sent for them)."""
    found = _BY_ACTOR.pop(actor._actor_id.hex(), None)
    if found is not None:
        found.carry()

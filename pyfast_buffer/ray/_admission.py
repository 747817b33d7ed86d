"""The index actor's calls that apply changes: the byte budget's reservations, the admission of puts and
completes (one at a time, or a payload owner's group of them in one call), and ``_apply``: one change under
the lock, at most once per request id, settled and journaled before it answers. A part of ``BufferActor``
(``_actor``), which holds the attributes named below.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .._args import is_probe
from ..buffer import StalenessBuffer
from ..config import BufferConfig
from ..errors import BufferFullError, WouldBlock
from ..released import RELEASE_REASONS, Released
from ._calls import DEFER
from ._effects import LoggedDict

#: Request ids of puts/completes the index remembers (a retry older than this many calls is applied again).
REMEMBERED_PUTS = 16384
#: Longest wait of a blocked call between two looks at the core while prompts are in flight: a lease that
#: runs out changes what the call may do, and no call wakes it for that (it is also woken by every change).
RECHECK_S = 0.1
#: The same with no prompt in flight, when only a call can change what a blocked call waits for (and wakes
#: it): a safety net, not a poll. A trainer blocked in ``take`` then costs the index 1 wake-up a second, not 10.
QUIET_RECHECK_S = 1.0
_NO_WAIT = 1e-9  # the core's take/put "timeout" that never blocks but applies the blocking call's rules
_EVICTED = RELEASE_REASONS.index("evicted")


def deadline_of(timeout: Optional[float]) -> Optional[float]:
    """A call's deadline on the monotonic clock (None: none; ``PROBE`` stays itself: try once, never wait)."""
    if timeout is None or is_probe(timeout):
        return timeout
    return time.monotonic() + timeout


class AdmissionCalls:
    """Reservations, admissions and ``_apply`` (a part of BufferActor, which has these attributes)."""

    _lock: threading.RLock
    _changed: threading.Condition
    _epoch: int
    _buf: StalenessBuffer
    _user_config: BufferConfig
    _capacity_bytes: Optional[int]
    _bytes_held: int
    _reserved: Dict[int, int]
    _where: LoggedDict  # traj id -> owner slot
    _sizes: LoggedDict  # traj id -> payload bytes
    _done_puts: collections.OrderedDict[int, None]
    _extra: Dict[str, int]
    _journal: Any
    _settle: Callable[..., bool]

    def reserve(self, request: int, nbytes: int, timeout: Optional[float]) -> None:
        """Holds room for ``nbytes`` of payload before the owner writes them (the byte budget, ``on_full``)."""
        if self._capacity_bytes is None:
            return
        deadline = deadline_of(timeout)
        with self._lock:
            while not self._reserve_now(request, nbytes, timeout):
                if is_probe(deadline):  # an awaitable call's attempt: it waits at the client, not here
                    raise WouldBlock(f"no room for {nbytes} payload bytes now")
                left = deadline - time.monotonic() if deadline is not None else 0.0
                if left <= 0:
                    raise TimeoutError(
                        f"no room for {nbytes} payload bytes within the timeout: the buffer holds "
                        f"{self._bytes_held} of capacity_bytes={self._capacity_bytes}; take faster or raise it"
                    )
                self._changed.wait(min(left, self._recheck_s()))

    def _reserve_now(self, request: int, nbytes: int, timeout: Optional[float]) -> bool:
        """Reserves room now (True), raises what ``on_full`` says, or returns False: wait for room and retry
        (on_full="block" with a timeout). Under the lock."""
        if self._capacity_bytes is None or request in self._reserved or request in self._done_puts:
            return True
        if nbytes > self._capacity_bytes:
            raise ValueError(
                f"one call carries {nbytes} payload bytes, more than capacity_bytes={self._capacity_bytes}; "
                "send fewer payloads per call or raise capacity_bytes"
            )
        on_full = self._user_config.on_full
        while self._bytes_held + sum(self._reserved.values()) + nbytes > self._capacity_bytes:
            if on_full == "evict_oldest" and self._evict_oldest_bytes(nbytes):
                continue
            if on_full != "block" or timeout is None:
                raise BufferFullError(
                    f"the buffer holds {self._bytes_held} payload bytes and this call brings {nbytes}, past "
                    f"capacity_bytes={self._capacity_bytes}; take or evict first, or put with a timeout "
                    "under on_full='block'"
                )
            return False
        self._reserved[request] = nbytes
        return True

    def _evict_oldest_bytes(self, nbytes: int) -> bool:
        """Evicts the oldest whole groups (one core call each, no rebuild) until ``nbytes`` more fit the byte
        budget; False if the ring had nothing to evict."""
        over = self._bytes_held + sum(self._reserved.values()) + nbytes - int(self._capacity_bytes or 0)
        gone: List[Released] = []
        freed = 0
        while freed < over and self._buf.evict_oldest(1):
            gone.append(self._buf.released())
            freed += sum(self._sizes.get(k, 0) for k in gone[-1].ids[gone[-1].reasons == _EVICTED].tolist())
        if not gone:
            return False
        self._extra["evicted_bytes"] += freed
        self._settle(Released(np.concatenate([r.ids for r in gone]), np.concatenate([r.reasons for r in gone])))
        return True

    def admit(self, request: int, call: Dict[str, Any], sizes: Optional[np.ndarray], slot: int) -> None:
        """Puts (``call["kind"] == "put"``) or completes ids whose payloads ``slot``'s owner now holds."""
        run, record, on_repeat = self._admission(request, call, sizes, slot)
        try:
            self._apply(request, run, record=record, timeout=call.get("timeout"), blocking=True, on_repeat=on_repeat)
        except BaseException:
            with self._lock:
                self._unreserve(request)
            raise

    def register(self, items: List[Tuple[Any, ...]]) -> List[Any]:
        """Reservations ``("reserve", request, nbytes, timeout)`` and admissions ``("admit", request, call,
        sizes, slot)`` of many puts (a payload owner's group commit), tried in order without waiting, under one
        lock hold and one journal write. One outcome per item: None (done), the exception it raised (its alone),
        or ``DEFER``: it would wait, nothing of it was applied, and its owner sends it to ``reserve``/``admit``.
        The admitted items share one journal record (the delta since the previous record holds them all)."""
        outcomes: List[Any] = []
        admitted = False
        with self._lock:
            for kind, request, *args in items:
                try:
                    if kind == "reserve":
                        outcomes.append(None if self._reserve_now(request, *args) else DEFER)
                    else:
                        outcomes.append(self._admit_now(request, *args))
                        admitted = admitted or outcomes[-1] is None
                except Exception as exc:  # this item's own error, handed back to its put
                    outcomes.append(exc)
            version = self._journal.mark() if admitted else 0
        self._journal.wait(version)
        return outcomes

    def _admit_now(self, request: int, call: Dict[str, Any], sizes: Optional[np.ndarray], slot: int) -> Any:
        """``admit`` without waiting and without a journal record (under the lock; ``register`` writes one for
        its whole group): None, or DEFER if it would wait for room within its timeout; raises its error, with
        its reserved room freed."""
        run, record, on_repeat = self._admission(request, call, sizes, slot)
        timeout = call.get("timeout")
        timed = timeout is not None and not is_probe(timeout)  # a full ring waits: tried once now, else DEFER
        try:
            self._apply(request, run, record, 0.0 if timed else timeout, True, on_repeat, journal=False)
        except BaseException as exc:
            if timed and isinstance(exc, (TimeoutError, BufferFullError)):
                return DEFER  # it would wait: admit() waits for it, within its timeout
            self._unreserve(request)
            raise
        return None

    def _admission(
        self, request: int, call: Dict[str, Any], sizes: Optional[np.ndarray], slot: int
    ) -> Tuple[Callable[[Optional[float]], None], Callable[[], None], Callable[[], None]]:
        """The core call of one put/complete, what it records once applied, and what a repeat of it changes."""
        kind, trajs = call["kind"], call["traj_ids"]
        if kind == "put":

            def run(wait: Optional[float]) -> None:
                finish, source = call.get("finish_step"), call.get("source")
                self._buf.put(trajs, call["sample_step"], call["group_ids"], wait, finish_step=finish, source=source)
        else:

            def run(wait: Optional[float]) -> None:
                finish, lengths = call.get("finish_step"), call.get("lengths")
                self._buf.complete(trajs, call["prompt_ids"], timeout=wait, finish_step=finish, lengths=lengths)

        def record() -> None:
            self._reserved.pop(request, None)
            if sizes is not None:
                keys, nbytes = trajs.tolist(), sizes.tolist()
                self._where.set_many(keys, [slot] * len(keys))
                self._sizes.set_many(keys, nbytes)
                self._bytes_held += sum(nbytes)

        def on_repeat() -> None:
            if sizes is not None:  # a retry after the first owner died: the new owner holds the payloads
                for k in trajs.tolist():
                    if k in self._where:
                        self._where[k] = slot

        return run, record, on_repeat

    def _unreserve(self, request: int) -> None:
        """Nothing was admitted: the room reserved for this call's bytes is free again (under the lock)."""
        if self._reserved.pop(request, None) is not None:
            self._announce()

    def _announce(self) -> None:
        """Something changed that may let a waiting call go: wakes the calls blocked here and moves the change
        count that the awaitable calls' ``changes`` watches (under the lock)."""
        self._epoch += 1
        self._changed.notify_all()

    def _apply(
        self,
        request: Optional[int],
        run: Callable[..., Any],
        record: Optional[Callable[[], None]] = None,
        timeout: Optional[float] = None,
        blocking: bool = False,
        on_repeat: Optional[Callable[[], None]] = None,
        journal: bool = True,
    ) -> Any:
        """Runs one change under the lock (at most once per request id), settles it, journals it, then returns
        (without ``journal``, neither records nor waits: ``register`` records its whole group once, and a load
        is journaled as a snapshot)."""
        deadline = deadline_of(timeout)
        with self._lock:
            if request is not None and request in self._done_puts:
                self._extra["duplicate_requests"] += 1
                if on_repeat is not None:
                    on_repeat()
                version = self._journal.mark() if journal else 0
                result = None
            else:
                result = self._until(deadline, lambda wait: run(wait) if blocking else run())
                if record is not None:
                    record()
                if request is not None:
                    self._done_puts[request] = None
                    while len(self._done_puts) > REMEMBERED_PUTS:
                        self._done_puts.popitem(last=False)
                self._settle()
                version = self._journal.mark() if journal else 0
                self._announce()
        if journal:
            self._journal.wait(version)
        return result

    def _recheck_s(self) -> float:
        """How long a blocked call waits for a change before it looks at the core again (under the lock)."""
        return RECHECK_S if self._buf.in_flight else QUIET_RECHECK_S

    def _until(self, deadline: Optional[float], attempt: Callable[[Optional[float]], Any]) -> Any:
        """Runs ``attempt`` without blocking in the core; with a deadline, retries on every change until it passes
        (``PROBE``: once, raising WouldBlock if it would wait)."""
        if deadline is None or is_probe(deadline):
            return attempt(deadline)
        while True:
            try:
                return attempt(_NO_WAIT)
            except (TimeoutError, BufferFullError):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                self._changed.wait(min(left, self._recheck_s()))

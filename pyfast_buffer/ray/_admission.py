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
from ..errors import BufferFullError, WouldBlock, timed_out_after
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


class _Repeated(Exception):
    """The request was applied (by a call with the same id) while this one waited: it is a repeat now."""


class OwnerGoneError(RuntimeError):
    """An admission from a payload owner the index has marked dead: its payloads are gone with it, so its ids are
    not admitted (the client sends the same request to its node's new owner)."""


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
    _reserved_by: Dict[int, int]  # request id -> slot of the owner that reserved (its death frees the room)
    _owner_nodes: List[str]
    _where: LoggedDict  # traj id -> owner slot
    _sizes: LoggedDict  # traj id -> payload bytes
    _done_puts: collections.OrderedDict[int, None]
    _extra: Dict[str, int]
    _journal: Any
    _settle: Callable[..., bool]

    def reserve(
        self, request: int, nbytes: int, timeout: Optional[float], slot: int = -1, asked: Optional[float] = None
    ) -> None:
        """Holds room for ``nbytes`` of payload before ``slot``'s owner writes them (the byte budget, ``on_full``);
        ``asked``: the put's whole timeout, which a timeout names (``timeout`` is what is left of it)."""
        if self._capacity_bytes is None:
            return
        deadline = deadline_of(timeout)
        with self._lock:
            while not self._reserve_now(request, nbytes, timeout, slot):
                if is_probe(deadline):  # an awaitable call's attempt: it waits at the client, not here
                    raise WouldBlock(f"no room for {nbytes} payload bytes now")
                left = deadline - time.monotonic() if deadline is not None else 0.0
                if left <= 0:
                    waited = asked if asked is not None else timeout
                    raise TimeoutError(
                        f"put timed out after {waited:g} s waiting for room for {nbytes} payload bytes: the buffer "
                        f"holds {self._bytes_held} of capacity_bytes={self._capacity_bytes}; take faster or raise it"
                    )
                self._changed.wait(min(left, self._recheck_s()))

    def _reserve_now(self, request: int, nbytes: int, timeout: Optional[float], slot: int = -1) -> bool:
        """Reserves room now (True), raises what ``on_full`` says, or returns False: wait for room and retry
        (on_full="block" with a timeout). Under the lock."""
        if self._capacity_bytes is None or request in self._reserved or request in self._done_puts:
            return True
        if not self._slot_alive(slot):
            raise OwnerGoneError(f"payload owner {slot} died: its client sends this put to its node's new owner")
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
        self._reserved_by[request] = slot
        return True

    def _slot_alive(self, slot: int) -> bool:
        """Whether ``slot`` (-1: no owner) names a payload owner the index has not marked dead (under the lock)."""
        return slot < 0 or (slot < len(self._owner_nodes) and self._owner_nodes[slot] != "")

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

    def admit(self, request: int, call: Dict[str, Any], sizes: Optional[np.ndarray], slot: int) -> Optional[List[int]]:
        """Puts (``call["kind"] == "put"``) or completes ids whose payloads ``slot``'s owner now holds. Returns None
        (the owner keeps every payload), or for a repeat of a request already applied the ids whose payloads the
        index counts at this owner (it lets go of the others)."""
        run, record, on_repeat = self._admission(request, call, sizes, slot)
        try:
            timeout, asked = call.get("timeout"), call.get("asked")
            return self._apply(request, run, record, timeout, True, on_repeat, asked=asked)
        except BaseException:
            with self._lock:
                self._unreserve(request)
            raise

    def register(self, items: List[Tuple[Any, ...]]) -> List[Any]:
        """Reservations ``("reserve", request, nbytes, timeout, slot)`` and admissions ``("admit", request, call,
        sizes, slot)`` of many puts (a payload owner's group commit), tried in order without waiting, under one
        lock hold and one journal write. One outcome per item: None (done), the ids to keep of a repeated
        admission (``admit``'s answer), the exception it raised (its alone), or ``DEFER``: it would wait, nothing
        of it was applied, and its owner sends it to ``reserve``/``admit``.
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
                        admitted = admitted or outcomes[-1] != DEFER
                except Exception as exc:  # this item's own error, handed back to its put
                    outcomes.append(exc)
            version = self._journal.mark() if admitted else 0
        self._journal.wait(version)
        return outcomes

    def _admit_now(self, request: int, call: Dict[str, Any], sizes: Optional[np.ndarray], slot: int) -> Any:
        """``admit`` without waiting and without a journal record (under the lock; ``register`` writes one for
        its whole group): ``admit``'s answer, or DEFER if it would wait for room within its timeout; raises its
        error, with its reserved room freed."""
        run, record, on_repeat = self._admission(request, call, sizes, slot)
        timeout = call.get("timeout")
        timed = timeout is not None and not is_probe(timeout)  # a full ring waits: tried once now, else DEFER
        try:
            return self._apply(request, run, record, 0.0 if timed else timeout, True, on_repeat, journal=False)
        except BaseException as exc:
            if timed and isinstance(exc, (TimeoutError, BufferFullError)):
                return DEFER  # it would wait: admit() waits for it, within its timeout
            self._unreserve(request)
            raise

    def _admission(
        self, request: int, call: Dict[str, Any], sizes: Optional[np.ndarray], slot: int
    ) -> Tuple[Callable[[Optional[float]], None], Callable[[], None], Callable[[], Optional[List[int]]]]:
        """The core call of one put/complete, what it records once applied, and what a repeat of it changes."""
        kind, trajs = call["kind"], call["traj_ids"]
        if kind == "put":

            def apply(wait: Optional[float]) -> None:
                finish, source = call.get("finish_step"), call.get("source")
                self._buf.put(trajs, call["sample_step"], call["group_ids"], wait, finish_step=finish, source=source)
        else:

            def apply(wait: Optional[float]) -> None:
                finish, lengths = call.get("finish_step"), call.get("lengths")
                self._buf.complete(trajs, call["prompt_ids"], timeout=wait, finish_step=finish, lengths=lengths)

        def run(wait: Optional[float]) -> None:
            # Looked at on every try: an owner that died while its admission waited has lost the payloads.
            if sizes is not None and not self._slot_alive(slot):
                raise OwnerGoneError(f"payload owner {slot} died: its client sends this put to its node's new owner")
            apply(wait)

        def record() -> None:
            self._reserved.pop(request, None)
            self._reserved_by.pop(request, None)
            if sizes is not None:
                keys, nbytes = trajs.tolist(), sizes.tolist()
                self._where.set_many(keys, [slot] * len(keys))
                self._sizes.set_many(keys, nbytes)
                self._bytes_held += sum(nbytes)

        def on_repeat() -> Optional[List[int]]:
            if sizes is None:
                return None
            keys = trajs.tolist()
            if self._slot_alive(slot):  # a retry after the first owner died: this owner holds the payloads now
                moved = []
                for k in keys:
                    old = self._where.get(k)
                    if old is not None and old != slot and not self._slot_alive(old):
                        self._where[k] = slot
                        moved.append(k)
                if moved:  # the dead owner's bytes were let go of at its death: these are held again
                    nbytes = [int(n) for n in sizes[np.isin(trajs, moved)].tolist()]
                    self._sizes.set_many(moved, nbytes)
                    self._bytes_held += sum(nbytes)
            return [k for k in keys if self._where.get(k) == slot]  # the owner lets go of the others

        return run, record, on_repeat

    def _unreserve(self, request: int) -> None:
        """Nothing was admitted: the room reserved for this call's bytes is free again (under the lock)."""
        self._reserved_by.pop(request, None)
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
        on_repeat: Optional[Callable[[], Any]] = None,
        journal: bool = True,
        asked: Optional[float] = None,
    ) -> Any:
        """Runs one change under the lock (at most once per request id), settles it, journals it, then returns
        (without ``journal``, neither records nor waits: ``register`` records its whole group once, and a load
        is journaled as a snapshot). ``asked``: the caller's whole timeout, which a timeout names, when
        ``timeout`` is what is left of it."""
        deadline = deadline_of(timeout)

        def attempt(wait: Optional[float]) -> Any:
            # The id is looked at before every try, not once: two calls of one request (a retry through a new
            # owner while the first owner's call still waits here) may both wait, and only the first to pass applies.
            if request is not None and request in self._done_puts:
                raise _Repeated
            return run(wait) if blocking else run()

        with self._lock:
            try:
                result = self._until(deadline, attempt, asked if asked is not None else timeout)
            except _Repeated:
                self._extra["duplicate_requests"] += 1
                result = on_repeat() if on_repeat is not None else None
                version = self._journal.mark() if journal else 0
            else:
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

    def _until(
        self, deadline: Optional[float], attempt: Callable[[Optional[float]], Any], timeout: Optional[float] = None
    ) -> Any:
        """Runs ``attempt`` without blocking in the core; with a deadline, retries on every change until it passes
        (``PROBE``: once, raising WouldBlock if it would wait). A TimeoutError at the deadline names ``timeout``,
        the seconds the caller asked to wait, not the attempt's own."""
        if deadline is None or is_probe(deadline):
            return attempt(deadline)
        while True:
            try:
                return attempt(_NO_WAIT)
            except (TimeoutError, BufferFullError) as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    if isinstance(exc, TimeoutError) and timeout is not None and not is_probe(timeout):
                        raise timed_out_after(exc, timeout) from None
                    raise
                self._changed.wait(min(left, self._recheck_s()))

"""The payload owner: one detached actor per node that ``ray.put``s the payloads of that node's producers.

Ray frees an object when the process that put it dies, so whoever puts a payload decides how long it can
live. A producer's own ``ray.put`` dies with the producer; the index actor's would die with the index and
would cost it a store write and a millisecond of CPU per payload. The owner of a node receives the payload
bytes of the producers on its node through their memory files (``_shm``) or inside their calls (``_wire``):
no argument object in the store either way; it puts
each once into its node's store and holds the ref by trajectory id, next to the id's stamp, group and size.
It outlives producers and the index (it is detached, owned by Ray's control store, and never restarts:
an owner that died lost its objects, and a new one takes a new slot). The index keeps ids and stamps only.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

import numpy as np
import ray
from ray.exceptions import OwnerDiedError

from .._args import is_probe
from . import _shm, _wire
from ._calls import call_index
from ._group import GroupCall

#: Seconds between two looks of an owner at its index's state in Ray's control store (it ends with its index).
INDEX_WATCH_S = 5.0
#: Seconds an owner waits for a producer's ObjectRef payload to be readable before failing the put.
ADOPT_TIMEOUT_S = 60.0
#: Seconds staged pieces of a big payload wait for their store call (its producer died meanwhile) before going.
STAGED_S = 600.0
#: Seconds a registration about to go to the index waits for those of puts already being written here, so
#: that they share one index call (the index's CPU is per call): a bound on what it adds to a put's latency.
#: Writing 16 payloads of 64 KiB takes this owner ~20 ms here (``ray.put`` costs ~1 ms per object), so the
#: bound covers a put that began just before; puts that begin during the wait are not waited for.
LINGER_S = 0.03


class PayloadOwner:
    """Holds the payloads of one node's producers by trajectory id (the index actor holds ids and stamps only)."""

    def __init__(self, index: Any, slot: int, budget: bool) -> None:
        self._index = index
        self._slot = slot
        self._budget = budget  # the buffer has capacity_bytes: reserve room before writing
        self._lock = threading.Lock()
        self._held: Dict[int, Tuple[ray.ObjectRef, int]] = {}  # traj id -> (ref, bytes), admitted by the index
        self._pending: Dict[int, Tuple[ray.ObjectRef, int]] = {}  # put here, admission not answered yet
        self._staged: Dict[int, Tuple[float, Dict[int, Tuple[bytes, ...]]]] = {}  # request -> (when, pieces)
        self._paths = {"memory_file_puts": 0, "inline_puts": 0}  # store calls by how their bytes came
        # Reservations and admissions of concurrent puts go to the index together, one call at a time.
        self._group = GroupCall(
            lambda items: call_index(self._index, "register", items, blocking=True), linger_s=LINGER_S
        )
        self._lifeline: Optional[threading.Event] = None  # the current lifeline call waits on it
        threading.Thread(target=self._end_with_index, name="pyfast_buffer-index-watch", daemon=True).start()

    def lifeline(self) -> None:
        """Returns only when a newer lifeline call replaces it (a restarted index calls again): the index holds this
        call, and its failure tells the index this owner died (``BufferActor._watch_owners``). One call at a time
        holds one of this actor's threads, however often the index restarts."""
        mine = threading.Event()
        with self._lock:
            if self._lifeline is not None:
                self._lifeline.set()
            self._lifeline = mine
        mine.wait()

    def _end_with_index(self) -> None:
        """Ends this process once its index is dead for good (killed, restarts exhausted, its creator gone under
        ``lifetime=None``): the owner is detached so that it outlives producers and the index's restarts, and it
        holds the payloads of no buffer after that."""
        from ._calls import actor_state

        while True:
            time.sleep(INDEX_WATCH_S)
            try:
                if actor_state(self._index) == "DEAD":
                    os._exit(0)
            except Exception:  # the control store unreachable for a moment: look again later
                continue

    def store(
        self,
        request: int,
        call: Dict[str, Any],
        headers: List[Optional[_wire.Header]],
        refs: List[Optional[ray.ObjectRef]],
        *pieces: Any,
    ) -> None:
        """Puts the payloads of one put/complete call into this node's store, then admits their ids at the index.

        ``headers[i]`` carries payload ``i`` as a value (its bytes in ``pieces``, after those ``stage``d for
        this request, or in the producer's memory file when ``pieces`` is one ``_shm.Ticket``), or is None
        and ``refs[i]`` is a ray.ObjectRef the producer made: that one is read and put again here, so that
        this owner, not the producer, owns what the buffer hands out.
        """
        began = time.monotonic()
        self._group.announce()  # its admission is coming: one about to go to the index may wait for it
        try:
            self._store(request, call, headers, refs, pieces, began)
        finally:
            self._group.withdraw()  # failed before its admission was sent

    def _store(
        self,
        request: int,
        call: Dict[str, Any],
        headers: List[Optional[_wire.Header]],
        refs: List[Optional[ray.ObjectRef]],
        pieces: Tuple[Any, ...],
        began: float,
    ) -> None:
        present = [h for h in headers if h is not None]
        if len(pieces) == 1 and isinstance(pieces[0], _shm.Ticket):
            buffers = _shm.read(pieces[0])  # views of the producer's file: ray.put below reads them, once
            with self._lock:
                self._paths["memory_file_puts"] += 1
        else:
            with self._lock:
                staged = self._staged.pop(request, None)
                self._paths["inline_puts"] += bool(present)
            if staged is not None:
                pieces = (*(p for _, run in sorted(staged[1].items()) for p in run), *pieces)
            buffers = _wire.join(present, pieces)
        traj_ids: np.ndarray = call["traj_ids"]
        packed = iter(_wire.unpack(present, buffers))
        del buffers
        given = [r for h, r in zip(headers, refs) if h is None]
        adopted = iter(_adopt(traj_ids, given) if given else [])
        values = [next(packed) if h is not None else next(adopted) for h in headers]
        sizes = [_wire.size(h) if h is not None else _nbytes(v) for h, v in zip(headers, values)]
        keys = traj_ids.tolist()
        with self._lock:
            clash = [k for k in keys if k in self._held or k in self._pending]
        if clash or len(set(keys)) != len(keys):
            raise ValueError(
                f"trajectory ids {sorted(set(clash))[:8] or 'repeated in this call'} already hold payloads in this "
                "buffer; ids with payloads must be unique until they leave the buffer (use fresh ids)"
            )
        if self._budget:  # a byte budget: admit the bytes before they are written, so nothing spills
            nbytes = int(sum(sizes))
            self._register(("reserve", request, nbytes, call.get("timeout"), self._slot), began)
        objects = [ray.put(v) for v in values]
        with self._lock:
            self._pending.update(zip(keys, zip(objects, sizes)))
        try:
            kept = self._register(("admit", request, call, np.asarray(sizes, np.int64), self._slot), began)
        except BaseException:
            with self._lock:  # the index did not admit them: hold nothing either
                for k in keys:
                    self._pending.pop(k, None)
            raise
        # Admitted; ids a take already handed out and retired are not pending any more. A repeat of a request
        # the index had applied names the ids it counts here (``kept``): holding others would keep bytes that the
        # index's byte budget no longer counts.
        keep = None if kept is None else set(kept)
        with self._lock:
            for k in keys:
                held = self._pending.pop(k, None)
                if held is not None and (keep is None or k in keep):
                    self._held[k] = held

    def stage(self, request: int, first: int, *pieces: bytes) -> None:
        """Holds pieces ``first``, ``first + 1``, ... of a call too big to send at once, until ``store`` of
        ``request`` takes them (staged pieces no store came for are dropped after ``STAGED_S``)."""
        now = time.monotonic()
        with self._lock:
            for old in [r for r, (at, _) in self._staged.items() if now - at > STAGED_S]:
                del self._staged[old]
            self._staged.setdefault(request, (now, {}))[1][first] = pieces

    def _register(self, item: Tuple[Any, ...], began: float) -> Optional[List[int]]:
        """Sends one reservation or admission with those of concurrent puts (one index call for all); one
        that would wait is sent alone, with what is left of its timeout. Raises the index's error for it;
        returns the index's answer to an admission (None, or the ids to keep of a repeat)."""
        outcome = self._group.submit(item, announced=item[0] == "admit")
        if isinstance(outcome, BaseException):
            raise outcome
        if not isinstance(outcome, str):  # None, or a repeat's ids to keep; a str is DEFER
            return cast(Optional[List[int]], outcome)
        kind, request, *args = item
        if kind == "reserve":
            nbytes, timeout, slot = args
            left = _left(timeout, began)
            call_index(self._index, "reserve", request, nbytes, left, slot, timeout, blocking=True, timeout_arg=2)
            return None
        call, sizes, slot = args
        call = {**call, "timeout": _left(call.get("timeout"), began), "asked": call.get("timeout")}
        return call_index(self._index, "admit", request, call, sizes, slot, blocking=True, timeout_arg=(1, "timeout"))

    def registrations(self) -> Dict[str, int]:
        """Index calls this owner made to register puts, the items they carried (the grouping) and the items
        queued now for the next call."""
        return {"calls": self._group.calls, "items": self._group.items, "queued": self._group.queued()}

    def hand_out(self, traj_ids: np.ndarray, retire: np.ndarray) -> List[Optional[ray.ObjectRef]]:
        """Returns the ref of each id (None: not held here); the ids a take retired are let go of here.

        The trainer's copy of the ref then keeps the object alive while this owner lives (and no longer).
        """
        with self._lock:
            keys = traj_ids.tolist()
            held = [self._held.get(k) or self._pending.get(k) for k in keys]
            refs = [h[0] if h is not None else None for h in held]
            for k, done in zip(keys, retire.tolist()):
                if done:
                    self._held.pop(k, None)
                    self._pending.pop(k, None)
        return refs

    def release(self, traj_ids: Sequence[int]) -> int:
        """Lets go of the payloads of ids that left the buffer untaken; returns how many were held."""
        with self._lock:
            return sum((self._held.pop(k, None) or self._pending.pop(k, None)) is not None for k in traj_ids)

    def holdings(self) -> np.ndarray:
        """The ids this owner holds payloads for (the index reconciles with them after a restart)."""
        with self._lock:
            return np.fromiter(self._held.keys(), np.int64, len(self._held))

    def stats(self) -> Dict[str, int]:
        with self._lock:
            held = {"payloads": len(self._held), "payload_bytes": int(sum(n for _, n in self._held.values()))}
            return {**held, "pending": len(self._pending), **self._paths}

    def where(self) -> Tuple[str, int]:
        """(node id, pid) of this owner (tests kill it by pid)."""
        return ray.get_runtime_context().get_node_id(), os.getpid()


def _left(timeout: Optional[float], began: float) -> Optional[float]:
    """What is left of a put's timeout (None: none) since ``began``: a put's timeout is end to end (an
    awaitable put's attempt, ``PROBE``, stays one: it never waits)."""
    if timeout is None or is_probe(timeout):
        return timeout
    return max(0.0, timeout - (time.monotonic() - began))


def _adopt(traj_ids: np.ndarray, refs: List[Any]) -> List[Any]:
    """Reads payloads passed as refs; a ref whose owner died fails the put here, naming its trajectory."""
    out = []
    for ref in refs:
        try:
            out.append(ray.get(ref, timeout=ADOPT_TIMEOUT_S))
        except OwnerDiedError as exc:
            raise ValueError(
                f"a payload ObjectRef of this put ({ref.hex()[:16]}...) belongs to a process that died, so its "
                f"object is gone; none of trajectories {traj_ids.tolist()[:8]} was stored: put them again with "
                "their values (the buffer's payload owner then keeps them)"
            ) from exc
    return out


def _nbytes(value: Any) -> int:
    n = getattr(value, "nbytes", None)
    return int(n) if isinstance(n, int) else _wire.size(_wire.pack(value)[0])

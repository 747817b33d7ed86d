"""The index actor: one StalenessBuffer of ids and stamps, its ledger, and a journal that outlives the process.

Payload bytes never pass through here: each node's payload owner (``_owner``) puts and holds them, and
admits their ids with ``admit``. Every change is under ``self._lock`` (the core call and the tables next to
it together) and is written to the journal before the call returns, so a restarted actor (Ray's
``max_restarts``) continues from the last answered call. Calls that may block never wait inside the core
while holding the lock: they retry the core's non-blocking call whenever something changed (``_changed``),
up to their deadline, and also every ``RECHECK_S`` while prompts are in flight (a lease that runs out is no
call), else every ``QUIET_RECHECK_S``.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import tempfile
import threading
import time
import urllib.parse
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import ray
from ray.exceptions import RayActorError

from ..buffer import StalenessBuffer, packed_state
from ..config import BufferConfig
from ..released import RELEASE_REASONS, Released, default_release_bound
from . import _effects, _journal, _packed
from ._admission import QUIET_RECHECK_S, REMEMBERED_PUTS, AdmissionCalls, deadline_of
from ._calls import ADMISSION_GROUP, BLOCKING_GROUP
from ._deliveries import DEFAULT_RECEIPT_TIMEOUT_S, Deliveries, DeliveryCalls
from ._owner_calls import OwnerCalls
from ._ring_replay import CoreReplay, trimmed

__all__ = ["ADMISSION_GROUP", "BLOCKING_GROUP", "BufferActor"]

_RETIRED, _DROPPED_STALE, _EVICTED = (RELEASE_REASONS.index(r) for r in ("retired", "dropped_stale", "evicted"))
#: Takes whose replies the index remembers, so that a retried take returns the same batch.
REMEMBERED_TAKES = 64
#: Counters of the remote buffer kept next to the core's ledger (see docs/ray.md, "What survives what").
#: Ids taken but never delivered: out of ``retired`` and ``taken`` in the ledger, each under its reason.
UNDELIVERED = ("payload_lost", "lost_in_restart", "lost_in_delivery")
EXTRA_COUNTERS = (
    *UNDELIVERED,
    "late_receipts",
    "index_restarts",
    "duplicate_requests",
    "evicted_bytes",
    "cancelled_takes",
)


class BufferActor(AdmissionCalls, DeliveryCalls, OwnerCalls):
    """Hosts the index: a StalenessBuffer over trajectory ids, which owner holds each payload, and the journal."""

    def __init__(
        self,
        buffer_kwargs: Dict[str, Any],
        capacity_bytes: Optional[int],
        journal: Union[str, bool, None],
        receipt_timeout_s: float = DEFAULT_RECEIPT_TIMEOUT_S,
        task_events: bool = False,
        namespace: Optional[str] = None,
        buffer_id: str = "",
    ) -> None:
        self._user_config = BufferConfig(**buffer_kwargs)
        self._buf = StalenessBuffer(**{**buffer_kwargs, "track_released": True}, pin_memory=False)
        self._max_uses = self._buf.config.max_uses
        # Under pace every use is a group's last whatever max_uses (docs/design.md, "Reuse under the bound"):
        # each id a take hands out leaves the core at that take, so it is in delivery and its payload let go of.
        self._every_take_retires = self._buf.config.strategy == "pace"
        self._capacity_bytes = capacity_bytes
        self._task_events = task_events  # the payload owners record their calls in Ray's task events as the index does
        self._report = _effects.JournaledReport(
            self._user_config.release_bound or default_release_bound(self._user_config.capacity)
        )
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._epoch = 0  # changes announced (``_announce``): what ``changes`` watches
        self._where = _effects.LoggedDict()  # traj id -> owner slot
        self._sizes = _effects.LoggedDict()  # traj id -> payload bytes
        self._bytes_held = 0
        self._reserved: Dict[int, int] = {}  # request id -> bytes reserved before the owner's ray.put
        self._reserved_by: Dict[int, int] = {}  # request id -> slot of the owner that reserved them
        self._done_puts: collections.OrderedDict[int, None] = _effects.LoggedOrderedDict()
        self._done_takes: collections.OrderedDict[int, Tuple[Any, ...]] = _effects.LoggedOrderedDict()
        self._extra = dict.fromkeys(EXTRA_COUNTERS, 0)
        self._deliveries = Deliveries(receipt_timeout_s)  # answered takes whose client has not confirmed receipt
        self._owner_nodes: List[str] = []  # slot -> node id ("" once that owner died)
        self._owners: List[Any] = []
        context = ray.get_runtime_context()
        self._name = context.get_actor_name() or f"pyfast_buffer-{str(context.get_actor_id())[:12]}"
        # The buffer's namespace as its creator named it: the actor's own context has its job's (an anonymous
        # one, for a driver that named none), where its payload owners would not be found by name.
        self._namespace = namespace if namespace is not None else context.namespace
        self._identity = {
            "name": self._name,
            "namespace": self._namespace,
            "buffer_id": buffer_id,
            "actor_id": context.get_actor_id(),
        }
        self._journal: Union[_journal.Journal, _journal.NoJournal] = _journal.NoJournal()
        # owner slot of each owner's lifeline call: it returns only when that owner dies (``_watch_owners``)
        self._lifelines: Dict[Any, int] = {}
        threading.Thread(target=self._watch_owners, name="pyfast_buffer-owner-watch", daemon=True).start()
        if journal is False:
            return
        path = journal if isinstance(journal, str) else _default_journal(self._namespace, self._name)
        restarted = _restarted(context)
        self._journal_lock = _journal.claim(path, self._identity)  # held for this process's life
        _check_holder(path, self._identity, restarted)
        found = _journal.read(path) if restarted else None
        if restarted and found is None:
            # Restarted where its journal is not (another node, with the default node-local path): coming back
            # empty would reset the ledger silently, so the index stays down and says why.
            raise RuntimeError(
                f"the buffer's index restarted on node {context.get_node_id()} but its journal {path!r} is not "
                "there, so its state cannot be rebuilt and it stays down rather than come back empty; kill() it "
                "and create a new buffer, and pass journal= a path every node can read if the index may restart "
                "on another node"
            )
        if found is not None:
            self._restore(self._replayed(*found[:2]))
        _effects.start_logs(*self._tables())
        self._journal = _journal.Journal(
            path,
            lambda: self._lock,
            self._capture,
            self._record,
            seq=found[2] if found is not None else 0,
            finish=self._finish_capture,
            identity=self._identity,
        )
        if restarted:
            self._journal.commit()  # the restart itself is counted durably

    # -- journal ---------------------------------------------------------------------------------------------------
    def _tables(self) -> Tuple[Any, ...]:
        return self._where, self._sizes, self._done_puts, self._done_takes, self._report

    def _capture(self) -> Dict[str, Any]:
        """The whole state, for a snapshot (under the lock, so the payload tables are only copied here: a dict's
        copy is a block copy, and ``_finish_capture`` makes them arrays after the lock is let go)."""
        with self._lock:
            report = self._report.peek()
            snap = {
                "core": self._buf._journal_delta(full=True),
                "max_age": self._buf.max_age,
                "payload_tables": (dict.copy(self._where), dict.copy(self._sizes)),
                "done_puts": np.fromiter(self._done_puts.keys(), np.int64, len(self._done_puts)),
                "done_takes": [[k, *v] for k, v in self._done_takes.items()],
                "extra": dict(self._extra),
                "owner_nodes": list(self._owner_nodes),
                "report_ids": report.ids,
                "report_reasons": report.reasons.astype(np.int64),
                "report_overflow": self._report.overflow,
                "deliveries": self._deliveries.capture(),
            }
            _effects.start_logs(*self._tables())  # the next record holds what changes after this snapshot
            return snap

    @staticmethod
    def _finish_capture(snap: Dict[str, Any]) -> Dict[str, Any]:
        """A captured state as it is saved (without the lock): the payload tables' copies as arrays."""
        where, sizes = snap.pop("payload_tables")
        ids = np.fromiter(where.keys(), np.int64, len(where))
        snap["payload_ids"] = ids
        snap["payload_slots"] = np.fromiter(where.values(), np.int64, len(ids))
        snap["payload_bytes"] = np.fromiter(map(sizes.get, ids.tolist(), itertools.repeat(0)), np.int64, len(ids))
        return snap

    def _record(self) -> Dict[str, Any]:
        """One change's record (under the lock): the core's delta, the tables' logs, the small counters whole."""
        return {
            "core": trimmed(self._buf._journal_delta()),  # its empty arrays left out: fewer nodes to encode
            "max_age": self._buf.max_age,
            "extra": dict(self._extra),
            "owner_nodes": list(self._owner_nodes),
            "deliveries": self._deliveries.capture(),  # whole: a few open takes and the bounded lost table
            **_effects.take_logs(*self._tables()),
        }

    def _replayed(self, snap: Dict[str, Any], records: List[Dict[str, Any]]) -> Dict[str, Any]:
        """The state after the snapshot and its records, in the layout ``_restore`` loads."""
        core = CoreReplay(snap["core"])
        tables = _effects.TablesReplay(snap, REMEMBERED_PUTS, REMEMBERED_TAKES, self._report.bound)
        deliveries = snap.get("deliveries")
        for record in records:
            core.apply(record["core"])
            tables.apply(record)
            deliveries = record.get("deliveries", deliveries)
        return {**tables.snapshot(), "buffer": packed_state(self._buf.config, core.export()), "deliveries": deliveries}

    def _restore(self, snap: Dict[str, Any]) -> None:
        """Loads the last snapshot; ids that left the ring in a call that never answered are counted, not lost."""
        self._buf.load_state_dict(snap["buffer"])
        self._buf.max_age = int(snap["max_age"])
        self._buf.released()  # the restore's own report: nothing left the buffer
        ids, slots, sizes = (np.asarray(snap[k]).tolist() for k in ("payload_ids", "payload_slots", "payload_bytes"))
        in_ring = set(self._buf.state_dict()["entries"]["traj_id"].tolist())
        self._done_puts.update((int(k), None) for k in np.asarray(snap["done_puts"]).tolist())
        for entry in snap["done_takes"]:
            self._done_takes[int(entry[0])] = tuple(entry[1:])
        self._extra.update({k: int(v) for k, v in snap["extra"].items()})
        self._extra["index_restarts"] += 1
        self._owner_nodes = [str(n) for n in snap["owner_nodes"]]
        self._owners = [self._find_owner(slot) if node else None for slot, node in enumerate(self._owner_nodes)]
        for slot, owner in enumerate(self._owners):
            if owner is not None:
                self._lifelines[owner.lifeline.remote()] = slot
        # An id the snapshot's tables hold but its ring does not left the ring in a take that had not
        # answered when the index died: nobody received it. Counted, and its payload let go of.
        gone: Dict[int, List[int]] = collections.defaultdict(list)
        for k, slot, n in zip(ids, slots, sizes):
            if k in in_ring:
                self._where[k], self._sizes[k] = slot, n
                self._bytes_held += n
            else:
                gone[slot].append(k)
                self._extra["lost_in_restart"] += 1
        self._report.overflow = int(snap["report_overflow"])
        self._deliveries.restore(snap.get("deliveries"))  # takes answered before the death, awaiting receipts
        if len(snap["report_ids"]):
            self._report.add(Released(np.asarray(snap["report_ids"]), np.asarray(snap["report_reasons"], np.int8)))
        # Owners may hold payloads of ids the index let go of before its notice reached them: they let go now.
        for slot, owner in enumerate(self._owners):
            if owner is None:
                continue
            try:
                held: List[int] = np.asarray(ray.get(owner.holdings.remote(), timeout=60)).tolist()
            except RayActorError:
                self._owners[slot], self._owner_nodes[slot] = None, ""
                continue
            stray = [k for k in held if self._where.get(k) != slot] + gone.get(slot, [])
            if stray:
                owner.release.remote(stray)

    # -- admission ---------------------------------------------------------------------------------------------------
    def dispatch(
        self,
        request: int,
        prompt_ids: np.ndarray,
        step: int,
        lease: Optional[float],
        timeout: Optional[float],
        source: Union[int, np.ndarray, None] = None,
    ) -> None:
        if timeout is None:
            self._apply(request, lambda: self._buf.dispatch(prompt_ids, step, lease, source=source))
            return
        with self._lock:
            repeat = request in self._done_puts
        if not repeat:
            # A paced wait for admission blocks in the core (GIL released, woken by take/fail/expiry/close) in the
            # admission group's thread, without the index lock: every other call goes on meanwhile, and the core
            # counts one wait per waiting dispatch. The call is journaled once it is admitted.
            self._buf.dispatch(prompt_ids, step, lease, timeout, source=source)
        self._apply(request, lambda: None)

    def admissible(self, step: int) -> int:
        with self._lock:
            return self._buf.admissible(step)

    def renew(self, request: int, prompt_ids: np.ndarray, lease: float) -> None:
        self._apply(request, lambda: self._buf.renew(prompt_ids, lease))

    def restamp_in_flight(self, step: int) -> int:
        return self._apply(None, lambda: self._buf.restamp_in_flight(step))

    def expire_in_flight(self, older_than_s: float) -> int:
        return self._apply(None, lambda: self._buf.expire_in_flight(older_than_s))

    def fail(self, request: int, prompt_ids: np.ndarray) -> None:
        self._apply(request, lambda: self._buf.fail(prompt_ids))

    # -- taking ------------------------------------------------------------------------------------------------------
    def take(
        self,
        request: int,
        batch_size: int,
        current_step: int,
        timeout: Optional[float],
        receipts: Sequence[int] = (),
    ) -> bytes:
        """One batch: (columns, metrics, owner slot per id or None, which ids this take retired), packed as one
        bytes object (``_packed``). ``receipts``: the client's earlier takes it received (``_receipts``),
        applied first, in this take's journal record."""
        deadline = deadline_of(timeout)
        with self._lock:
            receipted = self._receive_all(receipts)
            if request in self._done_takes:
                self._extra["duplicate_requests"] += 1
                if receipted:
                    self._journal.mark(later=True)  # like a lone receipt: nobody waits for it
                return _packed.pack(self._done_takes[request])
            self._close_overdue()
            try:
                batch = self._until(deadline, lambda wait: self._buf.take(batch_size, current_step, wait), timeout)
            except BaseException:
                if receipted:
                    self._journal.mark(later=True)
                raise
            columns = batch.columns.numpy()
            ids = columns[0]
            retire = (columns[4] >= self._max_uses) | self._every_take_retires
            slots = None
            if self._where:
                slots = np.fromiter(map(self._where.get, ids.tolist(), itertools.repeat(-1)), np.int64, len(ids))
                self._forget(ids[retire], notify=False)  # the owners let go of these at hand-out
            self._deliveries.open(request, ids[retire], None if slots is None else slots[retire])
            reply = (columns, dict(batch.metrics), slots, retire)
            if not self._settle() and not len(ids) and not receipted:
                return _packed.pack(reply)  # nothing changed (an empty take): nothing to journal, a repeat is harmless
            self._done_takes[request] = reply
            while len(self._done_takes) > REMEMBERED_TAKES:
                self._done_takes.popitem(last=False)
            version = self._journal.mark()
            self._announce()
        packed = _packed.pack(reply)  # while its record is written (if another call is writing it)
        self._journal.wait(version)
        return packed

    def evict_stale(self, current_step: int) -> int:
        return self._apply(None, lambda: self._buf.evict_stale(current_step))

    def evict_oldest(self, groups: int) -> int:
        return self._apply(None, lambda: self._buf.evict_oldest(groups))

    def _forget(self, traj_ids: np.ndarray, notify: bool) -> None:
        """Drops the payload bookkeeping of ids that left the buffer; with ``notify`` their owners let go too."""
        keys = traj_ids.tolist()
        held = [(k, slot) for k, slot in zip(keys, self._where.pop_many(keys)) if slot is not None]
        if not held:
            return
        self._bytes_held -= sum(self._sizes.pop_many([k for k, _ in held], 0))
        if notify:
            by_slot: Dict[int, List[int]] = collections.defaultdict(list)
            for k, slot in held:
                by_slot[slot].append(k)
            for slot, ids in by_slot.items():
                owner = self._owners[slot] if slot < len(self._owners) else None
                if owner is not None:
                    owner.release.remote(ids)  # no wait: a missed notice is caught up after a restart

    def _settle(self, released: Optional[Released] = None) -> bool:
        """Drains the core's released ids (or takes ``released``, already drained; under the lock): frees
        untaken payloads, keeps the caller's report. Returns whether any id was released.
        """
        if released is None:
            released = self._buf.released()
        if not len(released.ids):
            return False
        if self._user_config.track_released:
            self._report.add(released)
        untaken = (released.reasons == _DROPPED_STALE) | (released.reasons == _EVICTED)
        if untaken.any() and self._where:
            self._forget(released.ids[untaken], notify=True)
        return True

    def released(self) -> Released:
        if not self._user_config.track_released:
            raise ValueError("released() needs track_released=True; create the RemoteBuffer with track_released=True")
        with self._lock:
            out = self._report.drain()
            version = self._journal.mark()
        self._journal.wait(version)
        return out

    # -- state -------------------------------------------------------------------------------------------------------
    def ledger(self) -> Dict[str, int]:
        """The core's ledger, with ids that were taken but never delivered moved out of retired into their reasons."""
        with self._lock:
            self._close_overdue()
            ledger = self._buf.ledger()
            # in_delivery stays inside retired (the core's identity holds at every moment) until it is received
            # or counted lost_in_delivery.
            undelivered = sum(self._extra[k] for k in UNDELIVERED)
            ledger["retired"] -= undelivered
            ledger["taken"] -= undelivered
            if "released_overflow" in ledger:
                ledger["released_overflow"] += self._report.overflow
            for key, value in self._extra.items():
                ledger[key] = value
            ledger["in_delivery"] = self._deliveries.in_delivery
            ledger["payload_bytes_held"] = self._bytes_held
            if self._capacity_bytes is not None:
                ledger["capacity_bytes"] = self._capacity_bytes
            return ledger

    def size(self) -> int:
        return len(self._buf)

    def in_flight(self) -> int:
        return self._buf.in_flight

    def closed(self) -> bool:
        return self._buf.closed

    def close(self) -> None:
        with self._lock:
            self._buf.close()
            self._announce()

    def get_max_age(self) -> int:
        return self._buf.max_age

    def set_max_age(self, max_age: int) -> None:
        self._apply(None, lambda: setattr(self._buf, "max_age", max_age))

    def config(self) -> Dict[str, Any]:
        now = self._buf.config  # max_age and source_max_age may have changed since construction
        return dataclasses.asdict(
            dataclasses.replace(self._user_config, max_age=now.max_age, source_max_age=now.source_max_age)
        )

    def starved(self, min_attempts: int) -> Dict[int, int]:
        return self._buf.starved(min_attempts)

    def data_metrics(self) -> Dict[str, float]:
        return self._buf.data_metrics()

    def get_source_max_age(self) -> Dict[int, int]:
        return self._buf.source_max_age

    def set_source_max_age(self, bounds: Dict[int, int]) -> None:
        self._buf.source_max_age = bounds

    def payloads_held(self) -> int:
        """Ids in the buffer whose payload a live owner holds (those of a dead owner's are counted lost at take)."""
        with self._lock:
            return sum(1 for slot in self._where.values() if self._slot_alive(slot))

    def state_dict(self) -> Dict[str, Any]:
        return self._buf.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._restore_whole(lambda: self._buf.load_state_dict(state_dict))

    def save(self, path: str) -> None:
        self._buf.save(path)

    def load(self, path: str, in_flight: str) -> Any:
        return self._restore_whole(lambda: self._buf.load(path, in_flight))

    def _restore_whole(self, load: Callable[[], Any]) -> Any:
        """Replaces the whole state by ``load`` and journals it as a snapshot before the call answers, not as a
        record of every entry (encoded under the lock, then written a second time by the snapshot its size
        starts). The load runs inside the snapshot's hold of the lock, so no other call's record comes between
        them. Had the process died before the snapshot was written, the call never answered, and the state
        before it comes back."""

        def change() -> Any:
            result = self._apply(None, load, journal=False)
            # Payloads are not part of a checkpoint: keep only those of ids that are in the buffer again.
            keep = set(self._buf.state_dict()["entries"]["traj_id"].tolist())
            self._forget(np.asarray([k for k in self._where if k not in keep], np.int64), notify=True)
            return result

        return self._journal.snapshot(change)

    def journal_stats(self) -> Dict[str, Any]:
        return self._journal.stats()

    def pid(self) -> int:
        return os.getpid()

    def cpu_seconds(self) -> float:
        """CPU time of this process, every thread (the bench's index CPU per payload)."""
        return time.process_time()

    def changes(self, seen: Optional[int], timeout: float, admission: Sequence[np.ndarray] = ()) -> int:
        """The count of announced changes, once it differs from ``seen`` (None: at once), when a lease may have
        run out, or after ``timeout`` seconds (at most ``QUIET_RECHECK_S``): the one wait of a process's
        awaitable calls (``_aio``). Changes nothing; ``admission`` (the prompt ids of each paced call waiting)
        counts those calls among the core's admission waiters while this waits, as a blocked dispatch is."""
        waiting = [self._buf._begin_admission_wait(prompts) for prompts in admission]
        try:
            with self._lock:
                end = time.monotonic() + min(timeout, QUIET_RECHECK_S)
                while seen is not None and self._epoch == seen:
                    now = time.monotonic()
                    lease_ns = self._buf._next_lease_deadline_ns()  # CLOCK_MONOTONIC, as time.monotonic()
                    if lease_ns >= 0 and lease_ns / 1e9 <= now:
                        self._announce()  # a lease ran out: the waiters' next attempts expire it
                        break
                    left = end - now if lease_ns < 0 else min(end, lease_ns / 1e9) - now
                    if left <= 0:
                        break
                    self._changed.wait(left)
                return self._epoch
        finally:
            for protected in waiting:
                self._buf._end_admission_wait(protected)

    def ping(self) -> int:
        """Does nothing: the round trip of an empty call, the floor under every call to this actor."""
        return threading.get_ident()


def _check_holder(path: str, me: Dict[str, Any], restarted: bool) -> None:
    """Refuses a journal that is another buffer's: on a restart, any snapshot not written by this buffer; on a
    first start, one whose holder Ray does not count dead for good (it may be restarting, and would load it)."""
    from ray._private import state

    found = _journal.holder(path)
    if found is None or found.get("buffer_id") == me["buffer_id"]:
        return
    if restarted:
        raise _journal.JournalInUseError(path, found, me, "took the path while this buffer was down")
    info = state.actors(actor_id=str(found.get("actor_id", ""))) if found.get("actor_id") else None
    if info and info.get("State", "DEAD") != "DEAD":
        raise _journal.JournalInUseError(path, found, me, f"is {str(info['State']).lower()}")


def _restarted(context: Any) -> bool:
    """Whether this actor was restarted: Ray's ``was_current_actor_reconstructed``, without the deprecation
    warning that property raises in every actor (it reads the deprecated ``actor_id`` itself)."""
    from ray._private import state

    info = state.actors(actor_id=context.get_actor_id())
    return bool(info) and info.get("NumRestarts", 0) != 0


def _default_journal(namespace: str, name: str) -> str:
    """The journal of a buffer created without ``journal=``: in this node's session directory, one per name in each
    namespace (two buffers of one name in two namespaces are two buffers)."""
    # quote() keeps "~" as it is, so each part escapes it: the separator "~~" never occurs inside a part, and no two
    # (namespace, name) pairs share a file.
    space, label = (urllib.parse.quote(part or "", safe="").replace("~", "%7E") for part in (namespace, name))
    return os.path.join(_journal_dir(), f"{space}~~{label}.pfb")


def _journal_dir() -> str:
    """This node's Ray session directory (it lives as long as the cluster), or the system temp directory."""
    try:
        from ray._private import worker

        node = worker._global_node
        if node is not None:
            return os.path.join(node.get_session_dir_path(), "pyfast_buffer")
    except (ImportError, AttributeError):
        pass
    return os.path.join(tempfile.gettempdir(), "pyfast_buffer-journals")

"""RemoteBuffer: the client of a StalenessBuffer that lives in a Ray actor."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union, cast

import numpy as np
import ray
from ray.actor import ActorHandle
from ray.exceptions import RayActorError

from .._args import (
    as_count,
    as_ids,
    as_lease,
    as_lengths,
    as_seconds,
    as_slots,
    as_step,
    as_steps,
    as_timeout,
    is_probe,
    same_length,
)
from ..buffer import Ids
from ..config import BufferConfig, SourceMaxAge, config_from_arguments, source_max_age_pairs
from ..released import Released
from ..verl_mapping import config_from_verl
from . import _packed, _wire
from ._actor import BLOCKING_GROUP, BufferActor
from ._aio import RemoteAsyncMethods
from ._arguments import fetch_request as _fetch_request
from ._arguments import finish_steps as _finish_steps
from ._arguments import index_placement as _index_placement
from ._arguments import new_request as _request
from ._arguments import payload_list as _payload_list
from ._arguments import source_tags as _source_tags
from ._batch import RemoteBatch, read_payloads
from ._calls import ADMISSION_GROUP, WATCH_GROUP, BufferUnavailableError, TimeoutAt, call_index
from ._deliveries import DEFAULT_RECEIPT_TIMEOUT_S
from ._lifetime import end_buffer, raise_creation_error, reclaim_if_dead
from ._receipts import forget as _forget_receipts
from ._receipts import receipts_for as _receipts_for
from ._sending import forget_owner as _forget_owner
from ._sending import get_owner as _get_owner
from ._sending import owner_here as _owner_here
from ._sending import send_to_owner as _send_to_owner

if TYPE_CHECKING:  # torch loads on the first tensor made or read, not with the package
    import torch

logger = logging.getLogger(__name__)

#: Threads of the actor for quick calls (ledger, non-blocking put/take, ...).
DEFAULT_MAX_CONCURRENCY = 16
#: Threads of the actor for calls that may block (take/put/complete with a timeout).
DEFAULT_BLOCKING_CALLS = 16
#: Threads of the actor for paced dispatches waiting for admission (more producers wait in Ray's queue).
DEFAULT_ADMISSION_CALLS = 16
#: Threads of the actor for the awaitable calls' watch (one call per client process and event loop at a time).
DEFAULT_WATCH_CALLS = 16
#: Restarts of the index actor allowed by default (-1: as many as it takes); it rebuilds from its journal.
DEFAULT_MAX_RESTARTS = -1


class RemoteBuffer(RemoteAsyncMethods):
    """A StalenessBuffer on a Ray cluster: same methods, same return types, same exceptions.

    Make one with ``RemoteBuffer.create(...)`` or find a named one with ``RemoteBuffer.get(name)``. The
    client only wraps the index actor's handle, so it pickles: pass it to Ray tasks and actors (producers,
    the trainer) and every copy talks to the same buffer. Each method is one round trip to the index; send
    many ids per call.

    Payloads: ``put``/``complete`` take ``payloads=`` aligned with the ids. They go to the payload owner of
    the caller's node, a detached actor that ``ray.put``s them once into that node's object store and keeps
    them by trajectory id, so a trajectory survives its producer and the index actor; ObjectRefs are read
    and put again there. ``take`` returns the refs in ``batch.payloads``. See docs/ray.md.

    ``adispatch``, ``acomplete``, ``aput`` and ``atake`` are the calls that may wait, for asyncio code: they
    await without blocking the event loop or holding a thread (``_aio``; docs/design.md, "Awaiting instead
    of blocking").
    """

    def __init__(self, actor: ActorHandle) -> None:
        self.actor = actor

    # -- making and finding buffers ------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        capacity: int,
        max_age: int = 7,
        strategy: str = "drop",
        max_uses: int = 1,
        on_full: str = "evict_oldest",
        parameter_sync_step: Optional[int] = None,
        track_released: bool = False,
        release_bound: Optional[int] = None,
        unique_ids: bool = False,
        prompts_per_step: Optional[int] = None,
        lookahead: Optional[int] = None,
        age_from: str = "start",
        max_attempts: Optional[int] = None,
        source_max_age: Optional[SourceMaxAge] = None,
        starvation_share: Optional[float] = None,
        *,
        capacity_bytes: Optional[int] = None,
        name: Optional[str] = None,
        namespace: Optional[str] = None,
        lifetime: Optional[str] = "detached",
        num_cpus: float = 1,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        blocking_calls: int = DEFAULT_BLOCKING_CALLS,
        admission_calls: int = DEFAULT_ADMISSION_CALLS,
        watch_calls: int = DEFAULT_WATCH_CALLS,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        journal: Union[str, bool, None] = None,
        receipt_timeout_s: float = DEFAULT_RECEIPT_TIMEOUT_S,
        actor_options: Optional[Dict[str, Any]] = None,
    ) -> RemoteBuffer:
        """Starts the index actor and returns its client.

        The buffer arguments are StalenessBuffer's (checked here, before anything starts; ``pin_memory`` is
        not one: batches leave the actor by pickle). ``capacity_bytes`` bounds the payload bytes the buffer
        holds (``on_full`` applies to it, before the bytes are written). ``name`` (and ``namespace``) make it
        reachable with ``RemoteBuffer.get`` from any driver of the cluster. ``lifetime="detached"`` (the
        default) keeps it alive after this driver exits: end it with ``kill()`` (or a ``with`` block);
        ``lifetime=None`` ties it to this driver. ``max_restarts`` restarts of the index are allowed; it
        rebuilds its state from ``journal`` (a file path on its node; default: in the node's Ray session
        directory), which it rewrites before answering each change; ``journal=False`` writes nothing and
        allows no restart (a dead index stays dead: calls raise BufferUnavailableError).
        ``max_concurrency`` threads serve quick calls and ``blocking_calls`` more serve calls with a timeout,
        ``admission_calls`` more serve paced dispatches waiting for admission (so waiting producers never
        starve the trainer's take), and ``watch_calls`` more the one wait of each process's awaitable calls
        (``atake``, ``adispatch``, ...: one per process and event loop, however many calls await);
        a take's ids count as ``in_delivery`` (within ``retired``) until its client confirms it received the
        batch, and move to ``lost_in_delivery`` if no receipt comes within ``receipt_timeout_s`` (the client
        died: docs/ray.md);
        ``actor_options`` go to ``.options()`` (e.g. ``scheduling_strategy``); the index and its payload
        owners are not listed in Ray's task events (``ray list tasks``, the dashboard's task view) unless
        ``actor_options={"enable_task_events": True}``: recording each call costs it CPU.
        """
        config = config_from_arguments(locals())
        if capacity_bytes is not None:
            as_count(capacity_bytes, "capacity_bytes", 1)
        as_count(max_concurrency, "max_concurrency", 1)
        as_count(blocking_calls, "blocking_calls", 1)
        as_count(admission_calls, "admission_calls", 1)
        as_count(watch_calls, "watch_calls", 1)
        receipt_timeout_s = as_seconds(receipt_timeout_s, "receipt_timeout_s", False, "pass seconds > 0")
        if lifetime not in (None, "detached", "non_detached"):
            raise ValueError(f"lifetime={lifetime!r} is unknown; use 'detached' (the default) or None")
        if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < -1:
            raise ValueError(f"max_restarts={max_restarts!r} must be an int >= -1 (-1: restart without limit)")
        if journal is True or not isinstance(journal, (str, type(None), bool)):
            raise TypeError(f"journal={journal!r} must be a file path, None (the default path) or False (none)")
        if journal is False:
            max_restarts = 0  # without a journal a restarted index would come back empty: it stays dead
        threads: Dict[str, Any] = dict(
            max_concurrency=max_concurrency,
            concurrency_groups={
                BLOCKING_GROUP: blocking_calls,
                ADMISSION_GROUP: admission_calls,
                WATCH_GROUP: watch_calls,
            },
        )
        remote_cls = ray.remote(**threads)(BufferActor)
        # Ray records every call of an actor for its state API and dashboard unless told not to; the index and
        # its payload owners serve thousands of calls per second, and that record costs each call CPU (Ray
        # Serve's actors leave it off for the same reason). actor_options={"enable_task_events": True} lists
        # them in `ray list tasks` again.
        options: Dict[str, Any] = dict(
            num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=0, enable_task_events=False
        )
        if "scheduling_strategy" not in (actor_options or {}):
            options["scheduling_strategy"] = _index_placement(journal)
        options.update(actor_options or {})
        # The namespace the buffer lives in (the driver's, anonymous or not, when none is named): its payload
        # owners are created there too, by name, and end with it.
        space = namespace if namespace is not None else ray.get_runtime_context().namespace
        options.update(name=name or f"pyfast_buffer-{os.urandom(6).hex()}", namespace=space)
        if lifetime is not None:
            options["lifetime"] = lifetime
        if name is not None:
            reclaim_if_dead(name, space)
        # The last argument is this buffer's id: its journal's holder (a restart of the index has the same).
        args = (
            capacity_bytes,
            journal,
            receipt_timeout_s,
            bool(options["enable_task_events"]),
            space,
            os.urandom(8).hex(),
        )
        handle = remote_cls.options(**options).remote(dataclasses.asdict(config), *args)
        client = cls(cast(ActorHandle, handle))
        try:
            client.ping()  # surfaces a failed start here, not at the first call
        except BufferUnavailableError as exc:
            raise_creation_error(exc)
            raise
        return client

    @classmethod
    def from_verl(cls, sampler_cfg: Any, trainer_cfg: Any, **overrides: Any) -> RemoteBuffer:
        """Creates a buffer from verl's sampler and trainer config (see config_from_verl); overrides go to create."""
        return cls.create(**config_from_verl(sampler_cfg, trainer_cfg, **overrides))

    @classmethod
    def get(cls, name: str, namespace: Optional[str] = None) -> RemoteBuffer:
        """Returns the client of the buffer created with ``name`` (ValueError naming where it is, if not here)."""
        try:
            return cls(ray.get_actor(name, namespace=namespace))
        except ValueError as exc:
            named: List[Dict[str, str]] = cast(Any, ray.util.list_named_actors(all_namespaces=True))
            found = sorted(a["namespace"] for a in named if a["name"] == name)
            hint = (
                f"; it exists in namespace(s) {found}: pass namespace={found[0]!r}"
                if found
                else "; no namespace of this cluster has it (was it killed, or created on another cluster?)"
            )
            here = ray.get_runtime_context().namespace
            raise ValueError(f"no buffer named {name!r} in namespace {namespace or here!r}{hint}") from exc

    def __reduce__(self) -> Any:
        return (RemoteBuffer, (self.actor,))

    # -- the StalenessBuffer API ---------------------------------------------------------------------------------
    def dispatch(
        self,
        prompt_ids: Ids,
        step: int,
        lease: Optional[float] = None,
        timeout: Optional[float] = None,
        *,
        source: Union[int, Ids, None] = None,
    ) -> None:
        """Marks prompts as in flight; with ``lease`` (seconds) the buffer fails them if not completed,
        failed or renewed in time, so a producer that died never holds a ``wait`` trainer longer. Under pace
        with ``timeout`` it waits for admission in one of the actor's ``admission_calls`` threads.
        ``source`` tags the prompts (one int in [0, 63] or one per prompt; see StalenessBuffer.dispatch)."""
        prompts, stamp, wait = as_ids(prompt_ids, "prompt_ids"), as_step(step, "step"), as_timeout(timeout)
        tags = _source_tags(as_slots(source, len(prompts), "prompts"))
        group = ADMISSION_GROUP if wait is not None else None
        self._call("dispatch", _request(), prompts, stamp, as_lease(lease), wait, tags, timeout_arg=4, group=group)

    def admissible(self, step: int) -> int:
        """How many prompts stamped ``step`` a dispatch may start now (strategy="pace" only)."""
        return self._call("admissible", as_step(step, "step"))

    def renew(self, prompt_ids: Ids, lease: float) -> None:
        """Gives in-flight prompts a lease of ``lease`` seconds from now (a producer's heartbeat)."""
        lease = as_seconds(lease, "lease", False, "renew with a lease > 0")
        self._call("renew", _request(), as_ids(prompt_ids, "prompt_ids"), lease)

    def restamp_in_flight(self, step: int) -> int:
        """Under ``age_from="finish"``: the weights of ``step`` now write every in-flight prompt (an in-flight weight
        update), so each one stamped below ``step`` is stamped ``step``; returns how many. A retry of the same step
        changes nothing already raised (it returns only the prompts still below ``step``)."""
        return self._call("restamp_in_flight", as_step(step, "step"))

    def expire_in_flight(self, older_than_s: float) -> int:
        """Fails, as expired, every in-flight prompt dispatched at least ``older_than_s`` seconds ago."""
        return self._call("expire_in_flight", as_seconds(older_than_s, "older_than_s", True, "pass seconds >= 0"))

    def complete(
        self,
        traj_ids: Ids,
        prompt_ids: Ids,
        timeout: Optional[float] = None,
        payloads: Optional[Sequence[Any]] = None,
        *,
        finish_step: Union[int, Ids, None] = None,
        lengths: Optional[Ids] = None,
    ) -> None:
        """Moves finished trajectories into the ring, with optional payloads (one per trajectory), finish
        steps and response lengths (the bias monitor's; see StalenessBuffer.complete)."""
        trajs, prompts = as_ids(traj_ids, "traj_ids"), as_ids(prompt_ids, "prompt_ids")
        same_length(trajs, "traj_ids", prompts, "prompt_ids")
        call = {"kind": "complete", "traj_ids": trajs, "prompt_ids": prompts, "timeout": as_timeout(timeout)}
        call["finish_step"] = _finish_steps(finish_step, len(trajs))
        call["lengths"] = as_lengths(lengths, len(trajs))
        self._admit(call, _payload_list(payloads, len(trajs)))

    def fail(self, prompt_ids: Ids) -> None:
        """Marks in-flight prompts as failed."""
        self._call("fail", _request(), as_ids(prompt_ids, "prompt_ids"))

    def put(
        self,
        traj_ids: Ids,
        sample_step: Union[int, Ids],
        group_ids: Optional[Ids] = None,
        timeout: Optional[float] = None,
        payloads: Optional[Sequence[Any]] = None,
        *,
        finish_step: Union[int, Ids, None] = None,
        source: Union[int, Ids, None] = None,
    ) -> None:
        """Dispatch + complete in one call, with optional payloads (one per trajectory), finish steps and
        source tags (one int or one per trajectory; a group shares one, which the index checks)."""
        trajs = as_ids(traj_ids, "traj_ids")
        steps = as_steps(sample_step, "sample_step", len(trajs))
        stamp: Union[int, np.ndarray] = int(steps[0]) if len(steps) == 1 else steps  # one stamp stays one int
        groups = None
        if group_ids is not None:
            groups = as_ids(group_ids, "group_ids")
            same_length(trajs, "traj_ids", groups, "group_ids")
        call: Dict[str, Any] = {"kind": "put", "traj_ids": trajs, "sample_step": stamp, "group_ids": groups}
        call["timeout"] = as_timeout(timeout)
        call["finish_step"] = _finish_steps(finish_step, len(trajs))
        call["source"] = None if source is None else _source_tags(as_slots(source, len(trajs), "trajectories"))
        self._admit(call, _payload_list(payloads, len(trajs)))

    def _admit(self, call: Dict[str, Any], payloads: Optional[List[Any]]) -> None:
        """Sends a put/complete: straight to the index, or with payloads through this node's payload owner."""
        request = _request()
        if payloads is None:
            waits = _waits(call["timeout"])
            self._call("admit", request, call, None, -1, blocking=waits, timeout_arg=(1, "timeout"))
            return
        headers: List[Optional[_wire.Header]] = []
        buffers: List[Any] = []
        refs: List[Optional[ray.ObjectRef]] = []
        for value in payloads:
            if isinstance(value, ray.ObjectRef):
                headers.append(None)
                refs.append(value)
            else:
                header, whole = _wire.pack(value)
                headers.append(header)
                buffers.extend(whole)
                refs.append(None)
        # One store call, one admission, one request id for the whole put, however many bytes it carries
        # (``_send_to_owner``). So a put is applied whole or not at all, its groups arrive together, and it
        # costs the index one registration.
        self._store(request, call, headers, refs, buffers)

    def _store(
        self, request: int, call: Dict[str, Any], headers: List[Any], refs: List[Any], buffers: List[Any]
    ) -> None:
        slot, owner = _owner_here(self.actor)
        try:
            _send_to_owner(owner, request, call, headers, refs, buffers)
        except RayActorError:
            # The owner of this node died (with the payloads it held): the next one gets them, once.
            self._call("owner_died", slot)
            _forget_owner(self.actor)
            slot, owner = _owner_here(self.actor)
            _send_to_owner(owner, request, call, headers, refs, buffers)

    def take(self, batch_size: int, current_step: int, timeout: Optional[float] = None) -> RemoteBatch:
        """Takes up to ``batch_size`` trajectories (see StalenessBuffer.take); refs in ``batch.payloads``."""
        batch, confirm, _ = self._take(batch_size, current_step, timeout)
        confirm()
        return batch

    def _take(self, batch_size: int, current_step: int, timeout: Optional[float]) -> Tuple[RemoteBatch, Any, Any]:
        """``take`` without telling the index whether it was received: returns the batch, the call that confirms
        it, and the call that reports it dropped (an awaitable take cancelled meanwhile: ``cancelled_takes``)."""
        n = as_count(batch_size, "batch_size", 1)
        step = as_step(current_step, "current_step")
        wait = as_timeout(timeout)
        request = _request()
        receipts = _receipts_for(self.actor)
        carried = receipts.carry()  # the receipts of this process's earlier takes ride in this call
        try:
            columns, metrics, slots, retire = _packed.unpack(
                self._call("take", request, n, step, wait, carried, blocking=_waits(wait), timeout_arg=3)
            )
        except BaseException:
            receipts.send(carried)  # it may not have reached the index: they go alone (a repeat is harmless)
            raise
        batch = RemoteBatch(columns, metrics)  # a numpy block: torch loads when the caller reads a tensor
        lost = None
        if slots is not None and (slots >= 0).any():
            batch.payloads, gone = self._hand_out(columns[0], np.asarray(slots), np.asarray(retire, bool))
            if gone.any():
                lost = columns[0][gone]
                logger.warning("take: %d payloads lost with their owner (ids %s...): payload_lost", len(lost), lost[:8])
                batch = batch.without(gone)

        def confirm() -> None:
            if lost is not None:
                self._call("received", request, lost)  # waits: its lost payloads are counted at once
            elif len(columns[0]):
                receipts.add(request)  # this process holds the batch: confirmed by its next take, or alone soon

        def drop() -> None:
            if len(columns[0]):
                receipts.cancel(request, lost if lost is not None else columns[0][:0])

        return batch, confirm, drop

    def fetch(self, batch: RemoteBatch, timeout: Optional[float] = None) -> Tuple[RemoteBatch, List[Any]]:
        """Reads a taken batch's payloads: ``(batch, values)``, ``values[i]`` the payload of ``batch.traj_ids[i]``
        (None for a trajectory put without one).

        A payload that can no longer be read (its owner, or the owner's node, died after the take handed
        its ref out: ``OwnerDiedError``/``ObjectLostError``) is dropped from the returned batch and listed in
        its ``lost``; the index counts it as ``payload_lost``, not ``retired`` (once per batch, however often
        it is fetched). ``timeout`` bounds the whole read (GetTimeoutError past it; nothing is counted then).
        """
        if batch.payloads is None:
            raise ValueError("this batch has no payloads (it was put without payloads=); read its columns")
        values, gone = read_payloads(list(batch.payloads), as_timeout(timeout))
        if not gone.any():
            return batch, values
        ids = batch.traj_ids.numpy()
        self._call("unreadable", _fetch_request(self.actor, ids), ids[gone])
        logger.warning("fetch: %d payloads gone with their owner (ids %s...): payload_lost", gone.sum(), ids[gone][:8])
        return batch.without(gone), [v for v, g in zip(values, gone.tolist()) if not g]

    def _hand_out(
        self, ids: np.ndarray, slots: np.ndarray, retire: np.ndarray
    ) -> Tuple[List[Optional[ray.ObjectRef]], np.ndarray]:
        """Fetches the refs of a batch from the owners that hold them (one call per owner, all at once)."""
        owners = self._owners(int(slots.max()))
        refs: List[Optional[ray.ObjectRef]] = [None] * len(ids)
        lost = np.zeros(len(ids), bool)
        calls = {}
        for slot in np.unique(slots[slots >= 0]).tolist():
            at = np.flatnonzero(slots == slot)
            owner = owners[slot] if slot < len(owners) else None
            if owner is None:
                lost[at] = True
                continue
            calls[slot] = (at, owner.hand_out.remote(ids[at], retire[at]))
        for slot, (at, pending) in calls.items():
            try:
                got = _get_owner(pending)
            except RayActorError:
                lost[at] = True
                self._call("owner_died", slot)
                continue
            for i, ref in zip(at.tolist(), got):
                refs[i] = ref
                lost[i] = ref is None
        return refs, lost

    def _owners(self, need: int) -> List[Any]:
        cached = _OWNERS.get(self.actor._actor_id.hex())
        if cached is None or len(cached) <= need:
            cached = self._call("owners")
            _OWNERS[self.actor._actor_id.hex()] = cached
        return cached

    def evict_stale(self, current_step: int) -> int:
        """Drops every ready entry with age > max_age; returns how many."""
        return self._call("evict_stale", as_step(current_step, "current_step"))

    def evict_oldest(self, groups: int = 1) -> int:
        """Evicts the oldest ``groups`` whole groups now, counted as evicted (their payloads are let go of);
        returns how many entries left."""
        return self._call("evict_oldest", as_count(groups, "groups", 0))

    def released(self) -> Released:
        """Every id that left the buffer since the previous call, with its reason (needs track_released=True)."""
        return self._call("released")

    def ledger(self) -> Dict[str, int]:
        """The ledger, plus the remote buffer's own counters (payload_lost, lost_in_restart, ...; docs/ray.md).

        The receipts of this process's takes are settled first, so none of its own batches shows in_delivery."""
        _receipts_for(self.actor).settle(wait=True)
        return self._call("ledger")

    def __len__(self) -> int:
        return self._call("size")

    @property
    def in_flight(self) -> int:
        return self._call("in_flight")

    @property
    def closed(self) -> bool:
        return self._call("closed")

    @property
    def config(self) -> BufferConfig:
        """The buffer's configuration as the actor has it now (max_age may have changed)."""
        return BufferConfig(**self._call("config"))

    def starved(self, min_attempts: int = 2) -> Dict[int, int]:
        """``{prompt_id: attempts}`` of the prompts with >= ``min_attempts`` attempts and nothing trained."""
        return self._call("starved", as_count(min_attempts, "min_attempts", 1))

    def data_metrics(self) -> Dict[str, float]:
        """What the bound did to the data so far (StalenessBuffer.data_metrics), from the actor's buffer."""
        return self._call("data_metrics")

    @property
    def source_max_age(self) -> Dict[int, int]:
        """The per-source max_age overrides in force; settable (a whole dict) from any process."""
        return self._call("get_source_max_age")

    @source_max_age.setter
    def source_max_age(self, value: Optional[Dict[int, int]]) -> None:
        self._call("set_source_max_age", dict(source_max_age_pairs(value) or ()))

    @property
    def max_age(self) -> int:
        """The largest age that may be trained on; settable (``client.max_age = k``) from any process."""
        return self._call("get_max_age")

    @max_age.setter
    def max_age(self, value: int) -> None:
        self._call("set_max_age", as_count(value, "max_age", 0))

    def close(self) -> None:
        """Closes the buffer: every blocked take/put, in any process, raises BufferClosedError.

        The actors stay (refs already taken stay readable); ``kill()`` ends them.
        """
        self._call("close")

    def state_dict(self) -> Dict[str, Any]:
        return self._call("state_dict")

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._call("load_state_dict", state_dict)

    def save(self, path: Union[str, os.PathLike[str]]) -> None:
        """Writes the buffer atomically to ``path`` on the actor's node (see StalenessBuffer.save)."""
        self._call("save", os.fspath(path))

    def load(self, path: Union[str, os.PathLike[str]], in_flight: str = "fail") -> torch.Tensor:
        """Replaces the state with a file on the actor's node; returns the prompt ids it failed (see
        StalenessBuffer.load). Payloads of ids that are not in the restored buffer are released."""
        return self._call("load", os.fspath(path), in_flight)

    def __enter__(self) -> RemoteBuffer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()

    def __repr__(self) -> str:
        return f"RemoteBuffer(actor={self.actor._actor_id.hex()[:12]})"

    # -- beyond StalenessBuffer ----------------------------------------------------------------------------------
    def payloads_held(self) -> int:
        """Number of ids in the buffer whose payload an owner holds."""
        return self._call("payloads_held")

    def payload_owners(self) -> List[Dict[str, Any]]:
        """One dict per live payload owner: its node id, pid, the payloads and bytes it holds, and how many puts
        brought their bytes through a memory file (``memory_file_puts``) or inside the call (``inline_puts``)."""
        out = []
        for owner in self._call("owners"):
            if owner is None:
                continue
            try:
                node, pid = ray.get(owner.where.remote(), timeout=60)
                stats: Dict[str, int] = ray.get(owner.stats.remote(), timeout=60)
                out.append({"node_id": node, "pid": pid, **stats})
            except RayActorError:
                continue
        return out

    def ping(self) -> None:
        """One empty round trip to the actor (what every call costs at least)."""
        self._call("ping")

    def kill(self) -> None:
        """Ends the index actor and every payload owner at once (the buffer and its payloads go with them), the
        owners found by name too, so a dead index's owners end as well (``_lifetime.end_buffer``)."""
        end_buffer(self.actor)
        _OWNERS.pop(self.actor._actor_id.hex(), None)
        _forget_receipts(self.actor)
        _forget_owner(self.actor)

    def _call(
        self,
        method: str,
        *args: Any,
        blocking: bool = False,
        timeout_arg: TimeoutAt = None,
        group: Optional[str] = None,
    ) -> Any:
        return call_index(self.actor, method, *args, blocking=blocking, timeout_arg=timeout_arg, group=group)


#: Per process: index actor id -> handles of its payload owners by slot (refreshed when a take needs more).
_OWNERS: Dict[str, List[Any]] = {}


def _waits(timeout: Optional[float]) -> bool:
    """Whether a call with this timeout may wait at the index (an awaitable call's attempt never does)."""
    return timeout is not None and not is_probe(timeout)


__all__ = ["BufferUnavailableError", "RemoteBatch", "RemoteBuffer"]

"""RemoteBuffer: the client of a StalenessBuffer that lives in a Ray actor."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence, Union, cast

import numpy as np
import ray
import torch
from ray.actor import ActorHandle

from .._args import as_count, as_ids, as_lease, as_seconds, as_step, as_steps, as_timeout, same_length
from .._devices import check_usable
from ..batch import Batch
from ..buffer import Ids
from ..config import BufferConfig, SourceMaxAge, config_from_arguments, source_max_age_pairs
from ..integrations.verl_mapping import config_from_verl
from ..released import Released
from . import _errors
from ._actor import ADMISSION_GROUP, BLOCKING_GROUP, BufferActor

#: Threads of the actor for quick calls (ledger, non-blocking put/take, ...).
DEFAULT_MAX_CONCURRENCY = 16
#: Threads of the actor for calls that may block (take/put/complete with a timeout).
DEFAULT_BLOCKING_CALLS = 16
#: Threads of the actor for paced dispatches waiting for admission (more producers wait in Ray's queue).
DEFAULT_ADMISSION_CALLS = 16


class RemoteBatch(Batch):
    """A Batch taken through the actor; ``payloads[i]`` is the ObjectRef put with ``traj_ids[i]`` (or None)."""

    __slots__ = ("payloads",)

    def __init__(
        self, columns: torch.Tensor, metrics: Dict[str, Any], payloads: Optional[List[Optional[ray.ObjectRef]]] = None
    ) -> None:
        super().__init__(columns, metrics)
        self.payloads = payloads

    def to(self, *args: Any, **kwargs: Any) -> RemoteBatch:
        check_usable(args, kwargs)
        return RemoteBatch(self.columns.to(*args, **kwargs), self.metrics, self.payloads)


class RemoteBuffer:
    """A StalenessBuffer hosted by a Ray actor: same methods, same return types, same exceptions.

    Make one with ``RemoteBuffer.create(...)`` or find a named one with ``RemoteBuffer.get(name)``. The
    client only wraps the actor handle, so it pickles: pass it to Ray tasks and actors (producers, the
    trainer) and every copy talks to the same buffer. Each method is one round trip to the actor; send
    many ids per call.

    Payloads: ``put``/``complete`` take ``payloads=`` aligned with the ids. Values (e.g. numpy arrays) are
    ``ray.put`` by the actor, which then owns them, so a trajectory survives the producer that made it;
    ObjectRefs are held as given (they live as long as the process that created them). ``take`` returns
    the refs in ``batch.payloads``; the actor drops its ref when an id leaves the buffer, and Ray's object
    store frees the object once the trainer drops its copy too.
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
        name: Optional[str] = None,
        namespace: Optional[str] = None,
        lifetime: Optional[str] = None,
        num_cpus: float = 1,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        blocking_calls: int = DEFAULT_BLOCKING_CALLS,
        admission_calls: int = DEFAULT_ADMISSION_CALLS,
        actor_options: Optional[Dict[str, Any]] = None,
    ) -> RemoteBuffer:
        """Starts the actor and returns its client.

        The buffer arguments are StalenessBuffer's (checked here, before anything starts; ``pin_memory`` is
        not one: batches leave the actor by pickle). ``name`` (and ``namespace``) make it reachable with
        ``RemoteBuffer.get`` from any driver of the cluster; ``lifetime="detached"`` keeps it alive after
        this driver exits. ``max_concurrency`` threads serve quick calls and ``blocking_calls`` more serve
        calls with a timeout, ``admission_calls`` more serve paced dispatches waiting for admission (so waiting
        producers never starve the trainer's take); ``actor_options`` go to ``.options()``.
        """
        config = config_from_arguments(locals())
        as_count(max_concurrency, "max_concurrency", 1)
        as_count(blocking_calls, "blocking_calls", 1)
        as_count(admission_calls, "admission_calls", 1)
        groups = {BLOCKING_GROUP: blocking_calls, ADMISSION_GROUP: admission_calls}
        threads: Dict[str, Any] = dict(max_concurrency=max_concurrency, concurrency_groups=groups)
        remote_cls = ray.remote(**threads)(BufferActor)
        options: Dict[str, Any] = dict(num_cpus=num_cpus, **(actor_options or {}))
        if name is not None:
            options.update(name=name, namespace=namespace)
        if lifetime is not None:
            options["lifetime"] = lifetime
        handle = remote_cls.options(**options).remote(dataclasses.asdict(config))
        client = cls(cast(ActorHandle, handle))
        client.ping()  # surfaces a failed start here, not at the first call
        return client

    @classmethod
    def from_verl(cls, sampler_cfg: Any, trainer_cfg: Any, **overrides: Any) -> RemoteBuffer:
        """Creates a buffer from verl's sampler and trainer config (see config_from_verl); overrides go to create."""
        return cls.create(**config_from_verl(sampler_cfg, trainer_cfg, **overrides))

    @classmethod
    def get(cls, name: str, namespace: Optional[str] = None) -> RemoteBuffer:
        """Returns the client of the buffer created with ``name`` (ValueError if there is none)."""
        return cls(ray.get_actor(name, namespace=namespace))

    def __reduce__(self) -> Any:
        return (RemoteBuffer, (self.actor,))

    # -- the StalenessBuffer API ---------------------------------------------------------------------------------
    def dispatch(
        self, prompt_ids: Ids, step: int, lease: Optional[float] = None, timeout: Optional[float] = None
    ) -> None:
        """Marks prompts as in flight; with ``lease`` (seconds) the buffer fails them if not completed,
        failed or renewed in time, so a producer that died never holds a ``wait`` trainer longer. Under pace
        with ``timeout`` it waits for admission in one of the actor's ``admission_calls`` threads."""
        wait = as_timeout(timeout)
        prompts, stamp = as_ids(prompt_ids, "prompt_ids"), as_step(step, "step")
        group = ADMISSION_GROUP if wait is not None else None
        self._call("dispatch", prompts, stamp, as_lease(lease), wait, group=group)

    def admissible(self, step: int) -> int:
        """How many prompts stamped ``step`` a dispatch may start now (strategy="pace" only)."""
        return self._call("admissible", as_step(step, "step"))

    def renew(self, prompt_ids: Ids, lease: float) -> None:
        """Gives in-flight prompts a lease of ``lease`` seconds from now (a producer's heartbeat)."""
        lease = as_seconds(lease, "lease", False, "renew with a lease > 0")
        self._call("renew", as_ids(prompt_ids, "prompt_ids"), lease)

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
    ) -> None:
        """Moves finished trajectories into the ring, with optional payloads (one per trajectory) and finish
        steps (see StalenessBuffer.complete)."""
        trajs, prompts = as_ids(traj_ids, "traj_ids"), as_ids(prompt_ids, "prompt_ids")
        same_length(trajs, "traj_ids", prompts, "prompt_ids")
        finish = None if finish_step is None else as_steps(finish_step, "finish_step", len(trajs))
        wait = as_timeout(timeout)
        payload_list = _payload_list(payloads, len(trajs))
        self._call("complete", trajs, prompts, wait, payload_list, finish, blocking=wait is not None)

    def fail(self, prompt_ids: Ids) -> None:
        """Marks in-flight prompts as failed."""
        self._call("fail", as_ids(prompt_ids, "prompt_ids"))

    def put(
        self,
        traj_ids: Ids,
        sample_step: Union[int, Ids],
        group_ids: Optional[Ids] = None,
        timeout: Optional[float] = None,
        payloads: Optional[Sequence[Any]] = None,
        *,
        finish_step: Union[int, Ids, None] = None,
    ) -> None:
        """Dispatch + complete in one call, with optional payloads (one per trajectory) and finish steps."""
        trajs = as_ids(traj_ids, "traj_ids")
        steps = as_steps(sample_step, "sample_step", len(trajs))
        stamp: Union[int, np.ndarray] = int(steps[0]) if len(steps) == 1 else steps  # one stamp stays one int
        groups = None
        if group_ids is not None:
            groups = as_ids(group_ids, "group_ids")
            same_length(trajs, "traj_ids", groups, "group_ids")
        finish = None if finish_step is None else as_steps(finish_step, "finish_step", len(trajs))
        wait = as_timeout(timeout)
        payload_list = _payload_list(payloads, len(trajs))
        self._call("put", trajs, stamp, groups, wait, payload_list, finish, blocking=wait is not None)

    def take(self, batch_size: int, current_step: int, timeout: Optional[float] = None) -> RemoteBatch:
        """Takes up to ``batch_size`` trajectories (see StalenessBuffer.take); refs in ``batch.payloads``."""
        n = as_count(batch_size, "batch_size", 1)
        step = as_step(current_step, "current_step")
        wait = as_timeout(timeout)
        columns, metrics, refs = self._call("take", n, step, wait, blocking=wait is not None)
        if not columns.flags.writeable:  # zero-copy from the object store: the caller owns its tensors
            columns = columns.copy()
        return RemoteBatch(torch.from_numpy(columns), metrics, refs)

    def evict_stale(self, current_step: int) -> int:
        """Drops every ready entry with age > max_age; returns how many."""
        return self._call("evict_stale", as_step(current_step, "current_step"))

    def released(self) -> Released:
        """Every id that left the buffer since the previous call, with its reason (needs track_released=True)."""
        return self._call("released")

    def ledger(self) -> Dict[str, int]:
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
        """Closes the buffer: every blocked take/put, in any process, raises BufferClosedError."""
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
        StalenessBuffer.load). Payload refs of ids that are not in the restored buffer are released."""
        return self._call("load", os.fspath(path), in_flight)

    def __enter__(self) -> RemoteBuffer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteBuffer(actor={self.actor._actor_id.hex()[:12]})"

    # -- beyond StalenessBuffer ----------------------------------------------------------------------------------
    def payloads_held(self) -> int:
        """Number of payload refs the actor holds (ids in the buffer that came with a payload)."""
        return self._call("payloads_held")

    def ping(self) -> None:
        """One empty round trip to the actor (what every call costs at least)."""
        self._call("ping")

    def kill(self) -> None:
        """Ends the actor at once (its buffer and held payload refs go with it)."""
        ray.kill(self.actor)

    def _call(self, method: str, *args: Any, blocking: bool = False, group: Optional[str] = None) -> Any:
        fn = getattr(self.actor, method)
        if blocking or group:
            fn = fn.options(concurrency_group=group or BLOCKING_GROUP)
        return _errors.get(fn.remote(*args))


def _payload_list(payloads: Optional[Sequence[Any]], n: int) -> Optional[List[Any]]:
    if payloads is None:
        return None
    if isinstance(payloads, (str, bytes, np.ndarray, torch.Tensor)) or not hasattr(payloads, "__len__"):
        raise TypeError(f"payloads must be a list with one object (or ObjectRef) per trajectory, not {type(payloads)}")
    if len(payloads) != n:
        raise ValueError(f"payloads has {len(payloads)} entries but traj_ids has {n}; pass one per trajectory")
    return list(payloads)

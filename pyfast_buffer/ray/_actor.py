"""The Ray actor that hosts one StalenessBuffer (the class is made remote by ``RemoteBuffer.create``).

Every method runs in one of the actor's threads. Blocking calls (a take, put or complete with a timeout)
wait inside the native core, on its condition variable and with the GIL released, so a put arriving on
another thread wakes them directly; the client sends them to their own concurrency group so that they
can never occupy every thread of the quick calls.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import ray

from ..buffer import StalenessBuffer
from ..config import BufferConfig
from ..released import RELEASE_REASONS, Released, default_release_bound
from ._payloads import PayloadStore, ReleasedReport, own

#: Concurrency group of the calls that may block (take/put/complete with a timeout).
BLOCKING_GROUP = "blocking"
#: Concurrency group of paced dispatches waiting for admission: apart from BLOCKING_GROUP, so that producers
#: blocked at the admission limit can never hold every thread the trainer's blocking take needs to free them.
ADMISSION_GROUP = "admission"
_DROPPED_STALE, _EVICTED = RELEASE_REASONS.index("dropped_stale"), RELEASE_REASONS.index("evicted")


class BufferActor:
    """Hosts a StalenessBuffer and the payload refs of the trajectories it holds."""

    def __init__(self, buffer_kwargs: Dict[str, Any]) -> None:
        self._user_config = BufferConfig(**buffer_kwargs)
        # The actor always tracks released ids: it frees payload refs from that report. The caller sees the
        # report through released() only if it asked for track_released.
        core_kwargs = {**buffer_kwargs, "track_released": True}
        self._buf = StalenessBuffer(**core_kwargs, pin_memory=False)  # batches leave by pickle: no pinning
        self._payloads = PayloadStore()
        self._settle_lock = threading.Lock()
        self._max_uses = self._buf.config.max_uses
        config = self._buf.config
        self._report = ReleasedReport(config.release_bound or default_release_bound(config.capacity))

    # -- in-flight prompts and trajectories ------------------------------------------------------------------------
    def dispatch(self, prompt_ids: np.ndarray, step: int, lease: Optional[float], timeout: Optional[float]) -> None:
        self._buf.dispatch(prompt_ids, step, lease, timeout)  # a paced wait: in the blocking group, GIL released
        self._settle()

    def admissible(self, step: int) -> int:
        return self._buf.admissible(step)

    def renew(self, prompt_ids: np.ndarray, lease: float) -> None:
        self._buf.renew(prompt_ids, lease)
        self._settle()

    def expire_in_flight(self, older_than_s: float) -> int:
        n = self._buf.expire_in_flight(older_than_s)
        self._settle()
        return n

    def complete(
        self,
        traj_ids: np.ndarray,
        prompt_ids: np.ndarray,
        timeout: Optional[float],
        payloads: Optional[Sequence[Any]],
        finish_step: Optional[np.ndarray] = None,
    ) -> None:
        call = lambda: self._buf.complete(traj_ids, prompt_ids, timeout, finish_step=finish_step)  # noqa: E731
        self._with_payloads(traj_ids, payloads, call)

    def fail(self, prompt_ids: np.ndarray) -> None:
        self._buf.fail(prompt_ids)
        self._settle()

    def put(
        self,
        traj_ids: np.ndarray,
        sample_step: Any,
        group_ids: Optional[np.ndarray],
        timeout: Optional[float],
        payloads: Optional[Sequence[Any]],
        finish_step: Optional[np.ndarray] = None,
    ) -> None:
        call = lambda: self._buf.put(traj_ids, sample_step, group_ids, timeout, finish_step=finish_step)  # noqa: E731
        self._with_payloads(traj_ids, payloads, call)

    def _with_payloads(self, traj_ids: np.ndarray, payloads: Optional[Sequence[Any]], call: Any) -> None:
        if payloads is None:
            call()
        else:
            if len(payloads) != len(traj_ids):
                raise ValueError(
                    f"payloads has {len(payloads)} entries but traj_ids has {len(traj_ids)}; "
                    "pass one payload per trajectory"
                )
            self._payloads.hold(traj_ids, own(payloads))  # before the call: a take may see the ids at once
            try:
                call()
            except BaseException:
                self._payloads.release(traj_ids)  # the call changed nothing: hold nothing either
                raise
        self._settle()

    # -- taking ------------------------------------------------------------------------------------------------------
    def take(
        self,
        batch_size: int,
        current_step: int,
        timeout: Optional[float],
    ) -> Tuple[np.ndarray, Dict[str, Any], Optional[List[Optional[ray.ObjectRef]]]]:
        batch = self._buf.take(batch_size, current_step, timeout)
        columns = batch.columns.numpy()
        refs = None
        if len(self._payloads):
            refs = self._payloads.lookup(columns[0])
            # This take retired the entries it used for the last time: it releases them itself, from its own
            # batch, so that no concurrent call can free a ref before it is handed out here.
            self._payloads.release(columns[0][columns[4] >= self._max_uses])
        self._settle()
        return columns, batch.metrics, refs

    def evict_stale(self, current_step: int) -> int:
        n = self._buf.evict_stale(current_step)
        self._settle()
        return n

    def _settle(self) -> None:
        """Drains the core's released ids: frees the payloads of those that left untaken, keeps the report.

        Retired ids are freed by the take that retired them (above); failed and expired ids are prompt ids,
        which never hold payloads.
        """
        with self._settle_lock:  # drain and record in one step, so that the report keeps the core's order
            released = self._buf.released()
            if self._user_config.track_released and len(released.ids):
                self._report.add(released)
        if len(released.ids):
            untaken = (released.reasons == _DROPPED_STALE) | (released.reasons == _EVICTED)
            if untaken.any() and len(self._payloads):
                self._payloads.release(released.ids[untaken])

    def released(self) -> Released:
        if not self._user_config.track_released:
            raise ValueError("released() needs track_released=True; create the RemoteBuffer with track_released=True")
        self._settle()
        return self._report.drain()

    # -- state -------------------------------------------------------------------------------------------------------
    def ledger(self) -> Dict[str, int]:
        ledger = self._buf.ledger()
        if "released_overflow" in ledger:
            ledger["released_overflow"] += self._report.overflow
        return ledger

    def size(self) -> int:
        return len(self._buf)

    def in_flight(self) -> int:
        return self._buf.in_flight

    def closed(self) -> bool:
        return self._buf.closed

    def close(self) -> None:
        self._buf.close()

    def get_max_age(self) -> int:
        return self._buf.max_age

    def set_max_age(self, max_age: int) -> None:
        self._buf.max_age = max_age

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
        return len(self._payloads)

    def state_dict(self) -> Dict[str, Any]:
        return self._buf.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._buf.load_state_dict(state_dict)
        self._after_restore()

    def save(self, path: str) -> None:
        self._buf.save(path)

    def load(self, path: str, in_flight: str) -> Any:
        failed = self._buf.load(path, in_flight)
        self._after_restore()
        return failed

    def _after_restore(self) -> None:
        # Payloads are not part of a checkpoint: keep only the refs of ids that are in the buffer again.
        self._settle()  # whatever the restore reported (e.g. restored in-flight prompts it failed)
        self._payloads.keep_only(self._buf.state_dict()["entries"]["traj_id"].numpy())

    def ping(self) -> int:
        """Does nothing: the round trip of an empty call, the floor under every call to this actor."""
        return threading.get_ident()

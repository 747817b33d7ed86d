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
from ._payloads import PayloadStore, own

#: Concurrency group of the calls that may block (take/put/complete with a timeout).
BLOCKING_GROUP = "blocking"


class BufferActor:
    """Hosts a StalenessBuffer and the payload refs of the trajectories it holds."""

    def __init__(self, buffer_kwargs: Dict[str, Any]) -> None:
        self._buf = StalenessBuffer(**buffer_kwargs, pin_memory=False)  # batches leave by pickle: no pinning
        self._payloads = PayloadStore()
        self._max_uses = self._buf.config.max_uses

    # -- in-flight prompts and trajectories ------------------------------------------------------------------------
    def dispatch(self, prompt_ids: np.ndarray, step: int, kwargs: Dict[str, Any]) -> None:
        self._buf.dispatch(prompt_ids, step, **kwargs)
        self._settle()

    def complete(self, traj_ids: np.ndarray, prompt_ids: np.ndarray, timeout: Optional[float],
                 payloads: Optional[Sequence[Any]]) -> None:
        self._with_payloads(traj_ids, payloads, lambda: self._buf.complete(traj_ids, prompt_ids, timeout))

    def fail(self, prompt_ids: np.ndarray) -> None:
        self._buf.fail(prompt_ids)
        self._settle()

    def put(self, traj_ids: np.ndarray, sample_step: Any, group_ids: Optional[np.ndarray], timeout: Optional[float],
            payloads: Optional[Sequence[Any]]) -> None:
        self._with_payloads(traj_ids, payloads, lambda: self._buf.put(traj_ids, sample_step, group_ids, timeout))

    def _with_payloads(self, traj_ids: np.ndarray, payloads: Optional[Sequence[Any]], call: Any) -> None:
        if payloads is None:
            call()
        else:
            if len(payloads) != len(traj_ids):
                raise ValueError(f"payloads has {len(payloads)} entries but traj_ids has {len(traj_ids)}; "
                                 "pass one payload per trajectory")
            self._payloads.hold(traj_ids, own(payloads))  # before the call: a take may see the ids at once
            try:
                call()
            except BaseException:
                self._payloads.release(traj_ids)  # the call changed nothing: hold nothing either
                raise
        self._settle()

    # -- taking ------------------------------------------------------------------------------------------------------
    def take(self, batch_size: int, current_step: int, timeout: Optional[float],
             ) -> Tuple[np.ndarray, Dict[str, Any], Optional[List[Optional["ray.ObjectRef"]]]]:
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
        """Frees the payloads of the ids that left the buffer without being taken (dropped stale, evicted)."""

    # -- state -------------------------------------------------------------------------------------------------------
    def ledger(self) -> Dict[str, int]:
        return self._buf.ledger()

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
        return dataclasses.asdict(self._buf.config)

    def payloads_held(self) -> int:
        return len(self._payloads)

    def state_dict(self) -> Dict[str, Any]:
        return self._buf.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._buf.load_state_dict(state_dict)
        # Payloads are not part of a state_dict: keep only the refs of ids that are in the buffer again.
        self._payloads.keep_only(self._buf.state_dict()["entries"]["traj_id"].numpy())

    def call(self, method: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """Runs any other public StalenessBuffer method (save, load, ...), then settles the payloads."""
        if method.startswith("_") or not callable(getattr(self._buf, method, None)):
            raise AttributeError(f"StalenessBuffer has no public method {method!r}")
        out = getattr(self._buf, method)(*args, **kwargs)
        self._settle()
        return out

    def ping(self) -> int:
        """Does nothing: the round trip of an empty call, the floor under every call to this actor."""
        return threading.get_ident()

"""RemoteBatch: a Batch taken through the index actor, with the payload refs of its trajectories."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, ObjectLostError

from .._devices import check_usable
from ..batch import Batch

if TYPE_CHECKING:  # torch loads on the first tensor made or read, not with the package
    import torch


class RemoteBatch(Batch):
    """A Batch taken through the actor; ``payloads[i]`` is the ObjectRef put with ``traj_ids[i]`` (or None).

    ``lost`` holds the ids this take drew whose payload owner had died: they are not in the batch, and the
    ledger counts them as ``payload_lost`` (not retired).
    """

    __slots__ = ("lost", "payloads")

    def __init__(
        self,
        columns: Union[torch.Tensor, np.ndarray],
        metrics: Dict[str, Any],
        payloads: Optional[List[Optional[ray.ObjectRef]]] = None,
        lost: Optional[np.ndarray] = None,
    ) -> None:
        super().__init__(columns, metrics)
        self.payloads = payloads
        self.lost = np.empty(0, np.int64) if lost is None else lost

    def without(self, gone: np.ndarray) -> RemoteBatch:
        """This batch without the trajectories ``gone`` marks (their payloads are lost): listed in ``lost``."""
        columns = self._array if self._array is not None else self.columns.numpy()  # no tensor made for this
        keep = (~gone).tolist()
        metrics = {**self.metrics, "payload_lost": int(self.metrics.get("payload_lost", 0)) + int(gone.sum())}
        refs = None if self.payloads is None else [r for r, k in zip(self.payloads, keep) if k]
        kept = np.ascontiguousarray(columns[:, ~gone])  # Batch makes the tensor on first access
        return RemoteBatch(kept, metrics, refs, np.concatenate([self.lost, columns[0][gone]]))

    def to(self, *args: Any, **kwargs: Any) -> RemoteBatch:
        check_usable(args, kwargs)
        return RemoteBatch(self.columns.to(*args, **kwargs), self.metrics, self.payloads, self.lost)


def read_payloads(refs: List[Optional[ray.ObjectRef]], timeout: Optional[float]) -> Tuple[List[Any], np.ndarray]:
    """Reads each ref within ``timeout`` (GetTimeoutError past it): the values (None for a trajectory put
    without a payload or whose object is gone) and a mask of those gone for good (owner or node dead).

    One ``ray.get`` of them all (a get per ref costs Ray's fixed overhead each time); only when some object
    is gone are they read one by one, to tell which."""
    at = [i for i, r in enumerate(refs) if r is not None]
    present: List[ray.ObjectRef] = [r for r in refs if r is not None]
    values: List[Any] = [None] * len(refs)
    gone = np.zeros(len(refs), bool)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        got = ray.get(present, timeout=timeout)
    except GetTimeoutError:
        _, waiting = ray.wait(present, num_returns=len(present), timeout=0, fetch_local=False)
        raise GetTimeoutError(f"{len(waiting)} of {len(refs)} payloads were not readable within {timeout} s") from None
    except ObjectLostError:  # OwnerDiedError too: some object is gone for good; the others are read below
        for i, ref in zip(at, present):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                values[i] = ray.get(ref, timeout=left)
            except ObjectLostError:
                gone[i] = True
        return values, gone
    for i, value in zip(at, got):
        values[i] = value
    return values, gone

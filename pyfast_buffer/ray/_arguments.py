"""The checked arguments of RemoteBuffer's calls as they travel to the index, and request ids."""

from __future__ import annotations

import hashlib
import os
from typing import Any, List, Optional, Sequence, Union

import numpy as np
from ray.actor import ActorHandle

from .. import _torch
from .._args import as_steps
from ..buffer import Ids


def new_request() -> int:
    """A fresh request id (63 random bits): a retry of the same call reuses it, so it is applied once."""
    return int.from_bytes(os.urandom(8), "little") >> 1  # not random.random: producers often seed it alike


def index_placement(journal: Union[str, bool, None]) -> Any:
    """Where the index starts and restarts, unless the caller says: on this process's node, where its journal is.

    The default journal (None) is a file of this node, so the index is held here (hard): placed softly, a
    restart under load may land on another node, which finds no journal. A path the caller gave may be shared
    storage, so the index may then restart elsewhere if this node is lost (soft).
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=isinstance(journal, str))


def fetch_request(actor: ActorHandle, ids: np.ndarray) -> int:
    """The request id of a fetch's report: the same for the same batch, so a batch is counted once."""
    digest = hashlib.blake2b(actor._actor_id.binary() + np.ascontiguousarray(ids, np.int64).tobytes(), digest_size=8)
    return int.from_bytes(digest.digest(), "little") >> 1


def source_tags(slots: Optional[np.ndarray]) -> Union[int, np.ndarray, None]:
    """The checked source tags as the index's buffer takes them: one int for all, or one per id (int64)."""
    if slots is None:
        return None
    return int(slots[0]) - 1 if len(slots) == 1 else slots.astype(np.int64) - 1


def finish_steps(finish_step: Union[int, Ids, None], n: int) -> Union[int, np.ndarray, None]:
    """The checked finish steps of a put/complete: one int stays one int (shared), else one per trajectory."""
    if finish_step is None:
        return None
    steps = as_steps(finish_step, "finish_step", n)
    return int(steps[0]) if len(steps) == 1 else steps


def payload_list(payloads: Optional[Sequence[Any]], n: int) -> Optional[List[Any]]:
    if payloads is None:
        return None
    if isinstance(payloads, (str, bytes, np.ndarray)) or _torch.is_tensor(payloads) or not hasattr(payloads, "__len__"):
        raise TypeError(f"payloads must be a list with one object (or ObjectRef) per trajectory, not {type(payloads)}")
    if len(payloads) != n:
        raise ValueError(f"payloads has {len(payloads)} entries but traj_ids has {n}; pass one per trajectory")
    return list(payloads)

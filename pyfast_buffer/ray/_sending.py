"""The client's side of the payload path: which payload owner serves this process's node, and the store
call that hands it a put's bytes (staged first in calls of their own when they are too many for one call).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple, Union

import ray
from ray.actor import ActorHandle

from . import _errors, _wire
from ._calls import call_index

#: Per process: index actor id -> (slot, handle) of the payload owner of this process's node.
_HERE: Dict[str, Tuple[int, Any]] = {}


def owner_here(actor: ActorHandle) -> Tuple[int, Any]:
    """(slot, handle) of the payload owner on this process's node, asked of the index once per process."""
    key = actor._actor_id.hex()
    if key not in _HERE:
        node = ray.get_runtime_context().get_node_id()
        _HERE[key] = call_index(actor, "owner_for", node)
    return _HERE[key]


def forget_owner(actor: ActorHandle) -> None:
    """Forgets this node's owner (it died): the next owner_here asks the index again."""
    _HERE.pop(actor._actor_id.hex(), None)


def get_owner(ref: Union[ray.ObjectRef, List[ray.ObjectRef]]) -> Any:
    """The result of an owner call, with Ray's errors translated as for every buffer call."""
    return _errors.get(ref)


def send_to_owner(
    owner: Any, request: int, call: Dict[str, Any], headers: List[Any], refs: List[Any], pieces: List[bytes]
) -> None:
    """One store call at the owner; pieces past what one call carries inline (CALL_BYTES, from big payloads or many) are
    staged first, in calls of their own, so that no byte goes through an argument object in the store."""
    chunks = _wire.chunk_pieces(pieces)
    if len(chunks) > 1:
        get_owner([owner.stage.remote(request, first, *run) for first, run in chunks[:-1]])
    get_owner(owner.store.remote(request, call, headers, refs, *chunks[-1][1]))

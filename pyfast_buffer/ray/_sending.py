"""The client's side of the payload path: which payload owner serves this process's node, and the store
call that hands it a put's bytes (through a shared memory file, ``_shm``, or inline: cut into pieces under Ray's
inline limit, staged first in calls of their own when they are too many for one call).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple, Union

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayTaskError

from . import _errors, _shm, _wire
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
    owner: Any, request: int, call: Dict[str, Any], headers: List[Any], refs: List[Any], buffers: List[Any]
) -> None:
    """One store call at the owner. The payloads' buffers go through a memory file of this process when they
    are big enough (``_shm``); otherwise, or when that owner cannot open this process's files, inline."""
    key = _shm.key(owner)
    if _shm.usable(key, sum(len(b) for b in buffers)):
        try:
            ticket, region = _shm.write(buffers)
        except OSError:  # no memory file to be had (memory, descriptors): this put goes inline
            region = None
        if region is not None:
            finished = False  # the owner's call returned or raised: it no longer reads the region
            try:
                get_owner(owner.store.remote(request, call, headers, refs, ticket))
                finished = True
                return
            except _shm.Unreachable:  # nothing changed at the owner: the same call goes inline below
                finished = True
                _shm.mark_unreachable(key)
            except _shm.Unreadable:  # the owner's own trouble this time: only this put goes inline
                finished = True
            except BaseException as exc:
                finished = isinstance(exc, RayTaskError) or isinstance(exc.__cause__, RayTaskError)
                raise
            finally:
                _shm.done(region, finished)
    _send_inline(owner, request, call, headers, refs, _wire.cut(buffers))


def _send_inline(
    owner: Any, request: int, call: Dict[str, Any], headers: List[Any], refs: List[Any], pieces: List[Any]
) -> None:
    """Pieces past what one call carries inline (CALL_BYTES, from big payloads or many) are staged first, in
    calls of their own, so that no byte goes through an argument object in the store."""
    chunks = _wire.chunk_pieces(pieces)
    if len(chunks) > 1:
        get_owner([owner.stage.remote(request, first, *run) for first, run in chunks[:-1]])
    get_owner(owner.store.remote(request, call, headers, refs, *chunks[-1][1]))

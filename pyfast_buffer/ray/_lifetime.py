"""How a remote buffer's actors end: reclaiming the name of a buffer whose index is dead for good, ending the
payload owners named after a buffer (exactly ``<name>.payloads.<slot>``, payload owners only), finding under which
names an index is registered, and turning an index's refused start (its journal is another buffer's) into the
ValueError its creator should see.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple, cast

import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError

from ._calls import actor_state


def end_buffer(actor: ActorHandle) -> None:
    """Kills a buffer's payload owners (those its index lists, and those named after it) and then its index."""
    try:
        owners = ray.get(actor.owners.remote(), timeout=30)
    except (RayActorError, GetTimeoutError):
        owners = []
    for owner in owners:
        if owner is not None:
            ray.kill(owner)
    for name, namespace in names_of(actor):
        end_owners(name, namespace)
    ray.kill(actor, no_restart=True)


def reclaim_if_dead(name: str, namespace: str) -> None:
    """Frees ``name`` if the actor holding it is dead for good (its clients may still hold the name), and ends
    the payload owners of the buffer that had it: they are detached and named after it, so they outlive it."""
    try:
        old = ray.get_actor(name, namespace=namespace)
    except ValueError:
        end_owners(name, namespace)
        return
    if actor_state(old) == "DEAD":
        ray.kill(old, no_restart=True)
        end_owners(name, namespace)


def end_owners(name: str, namespace: Optional[str]) -> None:
    """Kills the payload owners of the buffer ``name`` in ``namespace``: actors named exactly ``<name>.payloads.<slot>``
    that are payload owners (another buffer may be named ``<name>.payloads.x``: it is never touched)."""
    from ray._private import state

    pattern = re.compile(re.escape(name) + r"\.payloads\.\d+")
    named: List[Dict[str, str]] = cast(Any, ray.util.list_named_actors(all_namespaces=True))
    for entry in named:
        if entry["namespace"] != namespace or not pattern.fullmatch(entry["name"]):
            continue
        try:
            owner = ray.get_actor(entry["name"], namespace=namespace)
        except ValueError:
            continue  # ended meanwhile
        info = state.actors(owner._actor_id.hex())
        if info and info.get("ActorClassName", "").rpartition(".")[2] == "PayloadOwner":
            ray.kill(owner, no_restart=True)


def names_of(actor: ActorHandle) -> List[Tuple[str, str]]:
    """The (name, namespace) under which this index actor is registered (none if it has no name): Ray's actor
    table has its name but not its namespace, so each namespace holding that name is asked whose it is."""
    from ray._private import state

    info = state.actors(actor._actor_id.hex())
    name = str(info.get("Name") or "") if info else ""
    if not name:
        return []
    out = []
    named: List[Dict[str, str]] = cast(Any, ray.util.list_named_actors(all_namespaces=True))
    for entry in named:
        if entry["name"] != name:
            continue
        try:
            holder = ray.get_actor(name, namespace=entry["namespace"])
        except ValueError:
            continue
        if holder._actor_id == actor._actor_id:
            out.append((name, entry["namespace"]))
    return out


def raise_creation_error(exc: BaseException) -> None:
    """Raises the index's own error if it failed to start because of its journal (JournalInUseError), rather
    than Ray's ActorDiedError around it."""
    text = str(exc.__cause__ or exc)
    if "JournalInUseError" in text:
        start = text.find("journal=")
        message = text[start:].splitlines()[0] if start >= 0 else text
        raise ValueError(message) from exc

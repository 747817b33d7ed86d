"""Calls to the index actor that ride out one restart of it: at most one retry, with the same request id.

Every mutating call carries a request id that the index remembers (durably, in its journal) once it has
applied the call, so a retry after the index died and restarted is applied at most once. A call's timeout
is end to end: the retry gets what is left of it, never a fresh one.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

from .._args import is_probe
from . import _errors

#: Concurrency group of the calls that may block (take/put/complete with a timeout).
BLOCKING_GROUP = "blocking"
#: Concurrency group of paced dispatches waiting for admission: apart from BLOCKING_GROUP, so that producers
#: blocked at the admission limit can never hold every thread the trainer's blocking take needs to free them.
ADMISSION_GROUP = "admission"
#: Concurrency group of ``changes``, the one wait of each client process's awaitable calls (``_aio``): apart from
#: the others, so that watching never holds a thread a blocking call or a quick call needs.
WATCH_GROUP = "watch"
#: What the index's ``register`` answers for an item that would wait: send it alone (``reserve``/``admit``).
DEFER = "defer"
#: Seconds a call without a timeout waits for a restarting index before it gives up.
RESTART_WAIT_S = 120.0
#: Seconds between two liveness checks of a restarting index.
POLL_S = 0.1


class BufferUnavailableError(RuntimeError):
    """The index actor died and did not come back in time (or for good): the call may not have been applied.

    Retrying the same client call is safe: puts, completes and takes carry request ids and are applied at
    most once, but a new call (a new request id) of a put whose first try landed is refused as a repeat of
    its trajectory ids only when they still hold payloads.
    """


def actor_state(actor: Any) -> str:
    """The actor's state in Ray's control store: ALIVE, RESTARTING, DEAD, PENDING_CREATION, ..."""
    from ray._private import state

    info = state.actors(actor._actor_id.hex())
    return str(info.get("State", "DEAD")) if info else "DEAD"


def wait_alive(actor: Any, deadline: float) -> bool:
    """Waits until the actor answers a ping (True) or is dead for good or the deadline passes (False)."""
    while time.monotonic() < deadline:
        if actor_state(actor) == "DEAD":
            return False
        try:
            ray.get(actor.ping.remote(), timeout=max(POLL_S, min(5.0, deadline - time.monotonic())))
            return True
        except (RayActorError, ActorUnavailableError, GetTimeoutError):
            time.sleep(POLL_S)
    return False


def call_index(
    actor: Any,
    method: str,
    *args: Any,
    blocking: bool = False,
    timeout_arg: Optional[int] = None,
    group: Optional[str] = None,
) -> Any:
    """Calls ``actor.method(*args)``; if the actor dies meanwhile, waits for its restart and retries once.

    ``args[timeout_arg]``, if given, is the call's timeout in seconds (or None); the retry passes what is
    left of it, so the call returns within its timeout plus one liveness check and one round trip.
    """
    fn = getattr(actor, method)
    if blocking or group:
        fn = fn.options(concurrency_group=group or BLOCKING_GROUP)
    timeout = args[timeout_arg] if timeout_arg is not None else None
    if is_probe(timeout):  # an awaitable call's attempt never waits at the index, but rides out a restart
        timeout, timeout_arg = None, None
    deadline = time.monotonic() + (timeout if timeout is not None else RESTART_WAIT_S)
    try:
        return _errors.get(fn.remote(*args))
    except (RayActorError, ActorUnavailableError) as first:
        if not wait_alive(actor, deadline if timeout is None else max(deadline, time.monotonic() + POLL_S)):
            raise BufferUnavailableError(
                f"the buffer's index actor died during {method}() and did not come back "
                f"({'dead for good' if actor_state(actor) == 'DEAD' else 'still restarting'}); create it with "
                "max_restarts (the default) and retry the call, or create a new buffer"
            ) from first
    if timeout_arg is not None and timeout is not None:
        args = (*args[:timeout_arg], max(0.0, deadline - time.monotonic()), *args[timeout_arg + 1 :])
    try:
        return _errors.get(fn.remote(*args))
    except (RayActorError, ActorUnavailableError) as second:
        raise BufferUnavailableError(
            f"the buffer's index actor died twice during {method}(); the call was applied at most once: retry it"
        ) from second

"""Calls to the index actor that ride out one restart of it: at most one retry, with the same request id.

Every mutating call carries a request id that the index remembers (durably, in its journal) once it has
applied the call, so a retry after the index died and restarted is applied at most once. A call's timeout
is end to end: the retry gets what is left of it, never a fresh one.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Tuple, Union

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

from .._args import is_probe
from ..errors import WouldBlock, timed_out_after
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


TimeoutAt = Union[int, Tuple[int, str], None]


def _timeout_at(args: Tuple[Any, ...], at: TimeoutAt) -> Optional[float]:
    if at is None:
        return None
    if isinstance(at, tuple):
        return args[at[0]].get(at[1])
    return args[at]


def _with_timeout(args: Tuple[Any, ...], at: TimeoutAt, seconds: float) -> Tuple[Any, ...]:
    if at is None:
        return args
    i = at[0] if isinstance(at, tuple) else at
    value = {**args[i], at[1]: seconds} if isinstance(at, tuple) else seconds
    return (*args[:i], value, *args[i + 1 :])


def call_index(
    actor: Any,
    method: str,
    *args: Any,
    blocking: bool = False,
    timeout_arg: TimeoutAt = None,
    group: Optional[str] = None,
) -> Any:
    """Calls ``actor.method(*args)``; if the actor dies meanwhile, waits for its restart and retries once.

    ``timeout_arg``, if given, says where the call's timeout in seconds (or None) is: ``args[i]``, or
    ``args[i][key]`` for ``(i, key)`` (a put's call dict). The retry passes what is left of it, so the call
    returns within its timeout plus one liveness check and one round trip; a TimeoutError of the retry names the
    whole timeout, the seconds the caller asked for.
    """
    fn = getattr(actor, method)
    if blocking or group:
        fn = fn.options(concurrency_group=group or BLOCKING_GROUP)
    timeout = _timeout_at(args, timeout_arg)
    # What a timeout names: a put's call dict may carry the whole timeout its owner's call is part of ("asked").
    named = args[timeout_arg[0]].get("asked", timeout) if isinstance(timeout_arg, tuple) else timeout
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
        args = _with_timeout(args, timeout_arg, max(0.0, deadline - time.monotonic()))
    try:
        return _errors.get(fn.remote(*args))
    except TimeoutError as exc:
        if named is None or is_probe(named) or isinstance(exc, WouldBlock):
            raise
        raise timed_out_after(exc, named) from None
    except (RayActorError, ActorUnavailableError) as second:
        raise BufferUnavailableError(
            f"the buffer's index actor died twice during {method}(); the call was applied at most once: retry it"
        ) from second

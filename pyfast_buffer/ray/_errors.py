"""Turns an error raised inside the actor back into the exception the caller would get in process."""

from __future__ import annotations

import copyreg
from typing import Any, Dict, List, Tuple, Union

import ray
from ray.exceptions import RayTaskError

from ..checkpoint import CheckpointError


def get(refs: Union[ray.ObjectRef, List[ray.ObjectRef]]) -> Any:
    """``ray.get``, re-raising the actor's own exception (ValueError, TimeoutError, BufferClosedError, ...).

    Ray wraps an exception raised in an actor method in a RayTaskError; the original, with its type and
    message, is its ``cause``. The RayTaskError (remote traceback included) stays chained as ``__cause__``.
    """
    try:
        return ray.get(refs)
    except RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, BaseException) and not isinstance(cause, RayTaskError):
            raise cause.with_traceback(None) from exc
        raise


def _rebuild(cls: type[BaseException], args: Tuple[Any, ...], state: Dict[str, Any]) -> BaseException:
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


def _reduce(exc: BaseException) -> Tuple[Any, ...]:
    return _rebuild, (type(exc), exc.args, dict(exc.__dict__))


def make_portable(*classes: type) -> None:
    """Lets exceptions whose ``__init__`` does not take their ``args`` cross a process boundary unchanged.

    Pickle rebuilds an exception as ``cls(*exc.args)``; a class with its own constructor signature
    (CheckpointError(path, problem)) then fails to unpickle, and Ray can only hand back a RayTaskError.
    """
    for cls in classes:
        copyreg.pickle(cls, _reduce)


make_portable(CheckpointError)

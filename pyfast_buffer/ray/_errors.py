"""Turns an error raised inside the actor back into the exception the caller would get in process."""

from __future__ import annotations

from typing import Any, List, Union

import ray
from ray.exceptions import RayTaskError


def get(refs: Union["ray.ObjectRef", List["ray.ObjectRef"]]) -> Any:
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

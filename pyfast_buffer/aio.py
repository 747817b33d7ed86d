"""The awaitable API: ``adispatch``, ``acomplete``, ``aput`` and ``atake``, for asyncio code.

A blocking call inside a coroutine stalls its whole event loop. These await instead, with no thread per waiter.
Each attempt is the call itself with the probe timeout (``_args.PROBE``): it completes exactly as the blocking
call would, or raises ``WouldBlock`` having changed and counted nothing. Between attempts the coroutine awaits a
wake-up: the buffer writes a byte to a pipe (its wake fd) whenever a change may let a waiter go, the same changes
that wake its blocked calls (a take, a completion, a failure, an expiry, a load, ``close``), and the event loop
reads that pipe; an attempt also wakes at the earliest lease deadline, when a prompt may expire with nothing else
to announce it. A paced dispatch or put that waits is counted among the admission waiters meanwhile, so a
protected one holds the others back as a blocked one does (docs/design.md, "pace: protected attempts first").

Cancelling an awaiting call (``task.cancel()``, ``asyncio.timeout``, ``asyncio.wait_for``) changes nothing in the
buffer. ``timeout`` (seconds) ends the wait as the blocking call's timeout does: the same ``TimeoutError``, naming
what it waited for, and the same counters; ``timeout=None`` waits until the call can go (or is cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import numpy as np

from ._args import PROBE, as_timeout
from .errors import WouldBlock, timed_out_after

if TYPE_CHECKING:  # torch loads on the first tensor made or read, not with the package
    import torch

Ids = Union["torch.Tensor", np.ndarray, Sequence[int]]


class Wakeups:
    """One buffer's wake fd and the futures of its awaiting calls, on one event loop at a time."""

    def __init__(self, buffer: Any) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)  # the core never blocks on it: a full pipe already holds a wake-up
        self._buffer = weakref.ref(buffer)  # the buffer owns this object, not the other way round
        buffer._set_wake_fd(self._write)
        weakref.finalize(self, _close, self._read, self._write)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._futures: list = []

    def arm(self) -> Any:
        """Lets the next change write its byte; called before every attempt, so no change between the attempt and
        the wait is missed. Returns the token ``changed`` takes (none here: the pipe holds the wake-up)."""
        buffer = self._buffer()
        if buffer is not None:
            buffer._arm_wake()
        return None

    async def run(self, attempt: Callable[[Any], Any], timeout: Any, undo: Any = None) -> Any:
        """One attempt: the call itself, in this thread (it never waits, and nothing comes between it and the
        loop, so a cancellation lands before or after it, never inside)."""
        return attempt(timeout)

    def begin_waiting(self, admission: Ids) -> Optional[bool]:
        """Counts a paced call among the core's admission waiters (its answer: whether it is protected)."""
        buffer = self._buffer()
        return None if buffer is None else buffer._begin_admission_wait(admission)

    def end_waiting(self, waiting: Optional[bool]) -> None:
        buffer = self._buffer()
        if buffer is not None and waiting is not None:
            buffer._end_admission_wait(waiting)

    async def changed(self, token: Any, deadline: Optional[float], admission: Optional[Ids] = None) -> None:
        """Returns after the next wake-up, at ``deadline`` (loop time) or at the earliest lease deadline
        (``token``, what ``arm`` returned, and ``admission`` matter to the remote buffer's watch only)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._futures:
                raise RuntimeError(
                    "this buffer's awaitable calls are waiting on another event loop; await them from one loop "
                    "at a time"
                )
            self._loop = loop
        future = loop.create_future()
        if not self._futures:
            loop.add_reader(self._read, self._readable)
        self._futures.append(future)
        wake_at = deadline
        buffer = self._buffer()
        lease_ns = buffer._next_lease_deadline_ns() if buffer is not None else -1
        if lease_ns >= 0:  # the core's lease clock is CLOCK_MONOTONIC, as asyncio's loop.time() is
            wake_at = lease_ns / 1e9 if wake_at is None else min(wake_at, lease_ns / 1e9)
        timer = loop.call_at(wake_at, _resolve, future) if wake_at is not None else None
        try:
            await future
        finally:
            if timer is not None:
                timer.cancel()
            if future in self._futures:
                self._futures.remove(future)
            if not self._futures:
                loop.remove_reader(self._read)

    def _readable(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass
        futures, self._futures = self._futures, []
        for future in futures:
            _resolve(future)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _close(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _wakeups(buffer: Any) -> Wakeups:
    wakeups = buffer.__dict__.get("_wakeups")
    if wakeups is None:
        wakeups = buffer.__dict__["_wakeups"] = Wakeups(buffer)
    return wakeups


async def awaited(
    wakeups: Any,
    attempt: Callable[[Any], Any],
    timeout: Any,
    admission: Optional[Ids] = None,
    undo: Optional[Callable[[Any], None]] = None,
) -> Any:
    """Runs ``attempt(timeout)`` as an awaitable call: probes until it goes, waiting on ``wakeups`` (a buffer's
    ``Wakeups``, or a remote buffer's watch, which has the same methods) between attempts.

    ``admission``: the call's prompt ids (``()`` for a put) when it may wait for admission under pace, so it is
    counted among the admission waiters while it waits. At the deadline the last attempt is the blocking call with
    ``timeout=0``, so a timeout is counted and worded as the blocking call's (with the caller's timeout in it).
    ``undo``: what reverses an attempt that went through after the call was cancelled (remote attempts only).
    """
    limit = as_timeout(timeout)
    loop = asyncio.get_running_loop()
    deadline = None if limit is None else loop.time() + limit
    waiting: Optional[bool] = None  # begin_waiting's answer (protected?) while counted as a waiter
    try:
        while True:
            token = wakeups.arm()
            try:
                return await wakeups.run(attempt, PROBE, undo)
            except WouldBlock:
                pass
            if waiting is None and admission is not None:
                waiting = wakeups.begin_waiting(admission)
            if deadline is not None and loop.time() >= deadline:
                try:
                    return await wakeups.run(attempt, 0.0, undo)
                except TimeoutError as exc:  # the blocking call's words, with this call's timeout
                    raise timed_out_after(exc, limit or 0.0) from None
            await wakeups.changed(token, deadline, admission)
    finally:
        wakeups.end_waiting(waiting)


class AsyncMethods:
    """The awaitable calls of ``StalenessBuffer`` and ``ReferenceBuffer`` (this module's docstring says how)."""

    async def adispatch(
        self,
        prompt_ids: Ids,
        step: int,
        lease: Optional[float] = None,
        timeout: Optional[float] = None,
        *,
        source: Union[int, Ids, None] = None,
    ) -> None:
        """``dispatch``, awaiting admission under pace instead of blocking (the other strategies never wait)."""
        buffer: Any = self
        paced = buffer.config.strategy == "pace"
        await awaited(
            _wakeups(self),
            lambda t: buffer.dispatch(prompt_ids, step, lease, t, source=source),
            timeout,
            prompt_ids if paced else None,
        )

    async def acomplete(
        self,
        traj_ids: Ids,
        prompt_ids: Ids,
        timeout: Optional[float] = None,
        *,
        finish_step: Union[int, Ids, None] = None,
        lengths: Optional[Ids] = None,
    ) -> None:
        """``complete``, awaiting room under ``on_full="block"`` instead of blocking."""
        buffer: Any = self
        await awaited(
            _wakeups(self),
            lambda t: buffer.complete(traj_ids, prompt_ids, t, finish_step=finish_step, lengths=lengths),
            timeout,
        )

    async def aput(
        self,
        traj_ids: Ids,
        sample_step: Union[int, Ids],
        group_ids: Optional[Ids] = None,
        timeout: Optional[float] = None,
        *,
        finish_step: Union[int, Ids, None] = None,
        source: Union[int, Ids, None] = None,
    ) -> None:
        """``put``, awaiting admission under pace and room under ``on_full="block"`` instead of blocking."""
        buffer: Any = self
        paced = buffer.config.strategy == "pace"
        await awaited(
            _wakeups(self),
            lambda t: buffer.put(traj_ids, sample_step, group_ids, t, finish_step=finish_step, source=source),
            timeout,
            () if paced else None,
        )

    async def atake(
        self, batch_size: int, current_step: int, timeout: Optional[float] = None, *, bounded: bool = True
    ) -> Any:
        """``take`` of a full batch, awaited: returns when ``batch_size`` entries may be taken under the strategy
        (``timeout=None``: however long that takes), or raises TimeoutError after ``timeout`` naming the cause.
        ``bounded=False`` is take's: this call takes without max_age (refused under pace, as take refuses it)."""
        buffer: Any = self
        return await awaited(
            _wakeups(self), lambda t: buffer.take(batch_size, current_step, t, bounded=bounded), timeout
        )


async def changed(buffer: Any, timeout: Optional[float]) -> None:
    """Returns after ``buffer``'s next change that may let a waiter go, or after ``timeout`` seconds (None: no
    limit): for an awaiting caller that must also watch something the buffer cannot see (a trainer's step)."""
    wakeups = _wakeups(buffer)
    token = wakeups.arm()
    loop = asyncio.get_running_loop()
    limit = as_timeout(timeout)
    await wakeups.changed(token, None if limit is None else loop.time() + limit)

"""RemoteBuffer's awaitable calls: ``adispatch``, ``acomplete``, ``aput`` and ``atake`` (``pyfast_buffer.aio``'s
loop, with a watch of the index in place of a wake fd).

Each attempt is the blocking call with the probe timeout, which the index answers at once: it goes through, or
raises ``WouldBlock`` having changed and counted nothing. The attempt runs in the event loop's default executor:
it never waits at the index, but a restarting index or a payload owner may hold it, and the loop must not wait for
that. Between attempts the calls await their process's *watch*: one ``changes`` call to the index per buffer and
event loop, however many calls await, answered when the index announces a change (the changes that wake its
blocked calls), when a lease may have run out, or after ``QUIET_RECHECK_S``. An awaiting call holds no thread: the
watch is an awaited ObjectRef. A paced call is counted among the index's admission waiters while the watch waits.

Cancellation: while a call awaits the watch, cancelling it changes nothing. An attempt already sent cannot be
called back, so the call waits for its answer (one round trip) before the cancellation goes on: if it would have
waited, nothing changed; if it went through, what it did is reversed where it can be and counted where it cannot.
A dispatch's prompts are failed (``failed``); a take's batch is dropped unread: the index counts its ids
``lost_in_delivery`` at once and the take in ``cancelled_takes`` (they left the ring when the index answered and
their payloads went with the batch: no call can put them back under their bound, docs/ray.md); a put's or
complete's trajectories stay in the buffer, as asked.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Callable, Dict, Optional

import numpy as np
from ray.exceptions import ActorUnavailableError, RayActorError

from .._args import as_ids
from ..aio import awaited
from ._admission import QUIET_RECHECK_S
from ._calls import POLL_S, WATCH_GROUP


class Immediate:
    """An ``undo`` that only sends a call (it never waits): run in the loop's thread as the cancellation lands."""

    def __init__(self, fn: Callable[[Any], None]) -> None:
        self._fn = fn

    def __call__(self, result: Any) -> None:
        self._fn(result)


class Watch:
    """One index's watch on one event loop: the futures of the calls awaiting a change, and the one ``changes``
    call serving them all."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor
        self.epoch: Optional[int] = None  # the index's change count as last seen here (None: not yet)
        self._futures: Dict[asyncio.Future, Optional[np.ndarray]] = {}  # -> the paced call's prompt ids
        self._task: Optional[asyncio.Task] = None

    def arm(self) -> Optional[int]:
        """The change count an attempt starts from: a later change moves it, and ``changed`` returns at once."""
        return self.epoch

    async def run(self, attempt: Callable[[Any], Any], timeout: Any, undo: Optional[Callable[[Any], None]]) -> Any:
        """One attempt, in the loop's executor; a cancellation meanwhile waits for its answer (module docstring)."""
        loop = asyncio.get_running_loop()
        pending = loop.run_in_executor(None, attempt, timeout)
        try:
            return await asyncio.shield(pending)
        except asyncio.CancelledError:
            try:
                result = await pending
            except BaseException:  # WouldBlock or an error: the attempt changed nothing
                raise asyncio.CancelledError() from None
            if isinstance(undo, Immediate):
                undo(result)  # only sends a call: done here, so this process's next ledger() sees it
            elif undo is not None:
                loop.run_in_executor(None, undo, result)  # not awaited: the cancellation goes on now
            raise

    def begin_waiting(self, admission: Any) -> None:
        return None  # a paced call is counted while the watch waits (``changed``), by the index itself

    def end_waiting(self, waiting: Any) -> None:
        pass

    async def changed(self, token: Optional[int], deadline: Optional[float], admission: Any = None) -> None:
        """Returns after the index's next change since ``token``, or at ``deadline`` (loop time)."""
        if token != self.epoch:  # it changed since the attempt began
            return
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._futures[future] = None if admission is None else as_ids(admission, "prompt_ids")
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._watch())
        timer = loop.call_at(deadline, _resolve, future) if deadline is not None else None
        try:
            await future
        finally:
            if timer is not None:
                timer.cancel()
            self._futures.pop(future, None)

    async def _watch(self) -> None:
        while self._futures:
            paced = [ids for ids in self._futures.values() if ids is not None]
            call = self._actor.changes.options(concurrency_group=WATCH_GROUP)
            try:
                epoch: Optional[int] = await call.remote(self.epoch, QUIET_RECHECK_S, paced)
            except (RayActorError, ActorUnavailableError):
                epoch = None  # the index is restarting: the waiters' next attempts wait for it
                await asyncio.sleep(POLL_S)
            if epoch is None or epoch != self.epoch:
                self.epoch = epoch
                for future in list(self._futures):
                    _resolve(future)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


#: Per event loop: index actor id -> its watch.
_WATCHES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Dict[str, Watch]] = weakref.WeakKeyDictionary()


def watch(actor: Any) -> Watch:
    """The watch of ``actor`` on the running loop."""
    per_loop = _WATCHES.setdefault(asyncio.get_running_loop(), {})
    key = actor._actor_id.hex()
    if key not in per_loop:
        per_loop[key] = Watch(actor)
    return per_loop[key]


class RemoteAsyncMethods:
    """The awaitable calls of ``RemoteBuffer`` (this module's docstring says how)."""

    actor: Any

    async def adispatch(
        self,
        prompt_ids: Any,
        step: int,
        lease: Optional[float] = None,
        timeout: Optional[float] = None,
        *,
        source: Any = None,
    ) -> None:
        """``dispatch``, awaiting admission under pace instead of blocking (the other strategies never wait)."""
        buffer: Any = self
        paced = await _paced(buffer)
        prompts = as_ids(prompt_ids, "prompt_ids")
        await awaited(
            watch(self.actor),
            lambda t: buffer.dispatch(prompts, step, lease, t, source=source),
            timeout,
            prompts if paced else None,
            undo=lambda _: buffer.fail(prompts),
        )

    async def acomplete(
        self,
        traj_ids: Any,
        prompt_ids: Any,
        timeout: Optional[float] = None,
        payloads: Any = None,
        *,
        finish_step: Any = None,
        lengths: Any = None,
    ) -> None:
        """``complete``, awaiting room under ``on_full="block"`` instead of blocking."""
        buffer: Any = self
        await awaited(
            watch(self.actor),
            lambda t: buffer.complete(traj_ids, prompt_ids, t, payloads, finish_step=finish_step, lengths=lengths),
            timeout,
        )

    async def aput(
        self,
        traj_ids: Any,
        sample_step: Any,
        group_ids: Any = None,
        timeout: Optional[float] = None,
        payloads: Any = None,
        *,
        finish_step: Any = None,
        source: Any = None,
    ) -> None:
        """``put``, awaiting admission under pace and room under ``on_full="block"`` instead of blocking."""
        buffer: Any = self
        paced = await _paced(buffer)
        await awaited(
            watch(self.actor),
            lambda t: buffer.put(traj_ids, sample_step, group_ids, t, payloads, finish_step=finish_step, source=source),
            timeout,
            np.empty(0, np.int64) if paced else None,
        )

    async def atake(self, batch_size: int, current_step: int, timeout: Optional[float] = None) -> Any:
        """``take`` of a full batch, awaited (see StalenessBuffer.atake)."""
        buffer: Any = self
        batch, confirm, _ = await awaited(
            watch(self.actor),
            lambda t: buffer._take(batch_size, current_step, t),
            timeout,
            undo=Immediate(lambda taken: taken[2]()),  # cancelled after the index answered: reported at once
        )
        asyncio.get_running_loop().run_in_executor(None, confirm)  # received: confirmed without holding the loop
        return batch


async def _paced(buffer: Any) -> bool:
    """Whether the buffer's strategy is pace (asked once per client, off the loop: the strategy never changes)."""
    strategy = buffer.__dict__.get("_strategy")
    if strategy is None:
        strategy = await asyncio.get_running_loop().run_in_executor(None, lambda: buffer.config.strategy)
        buffer.__dict__["_strategy"] = strategy
    return bool(strategy == "pace")


__all__ = ["RemoteAsyncMethods", "watch"]

"""The rollout worker: one thread running an asyncio loop that keeps up to ``concurrency`` groups generating,
across rollout calls, as slime's fully-async worker does, but dispatching through our data source (so admission
and the capacity decide what starts) and completing into our buffer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any, Awaitable, Callable, Dict, List, Optional

from pyfast_buffer.integrations._slime_family import is_aborted
from pyfast_buffer.integrations.slime._options import WHERE

logger = logging.getLogger(__name__)

#: ``generate(args, group) -> finished group``: slime's generate_and_rm_group with its sampling params, or a fake.
Generate = Callable[[Any, List[Any]], Awaitable[Any]]
#: Seconds between top-up checks when nothing wakes the loop (a completion or our source's listener do).
POLL_S = 0.05


class RolloutWorker:
    def __init__(self, args: Any, source: Any, generate: Generate, concurrency: int) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(
                f"{WHERE}: concurrency={concurrency!r} must be an int >= 1; set pyfast_buffer_concurrency or "
                "--sglang-server-concurrency"
            )
        self.args = args
        self.source = source
        self.generate = generate
        self.concurrency = concurrency
        self._running = True
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._wake: Optional[asyncio.Event] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._main, name="pyfast-buffer-slime-rollout", daemon=True)
        source.add_listener(self.wake)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def check(self) -> None:
        """Raises if the worker died, so a waiting rollout call does not wait for groups that never come."""
        if not self._thread.is_alive():
            raise RuntimeError(f"{WHERE}: the rollout worker stopped") from self._error

    def wake(self) -> None:
        loop, event = self._loop, self._wake
        if loop is not None and event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed between the check and the call
                loop.call_soon_threadsafe(event.set)

    def stop(self, timeout: float = 10.0) -> None:
        """Stops topping up, cancels what is generating (each group failed in the ledger and requeued), joins."""
        self._running = False
        self.wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # kept for check(), which re-raises it in the caller
            self._error = exc
            logger.exception("%s: rollout worker crashed", WHERE)

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        active: Dict[asyncio.Task, int] = {}
        try:
            while self._running:
                while len(active) < self.concurrency and self._running:
                    pairs = self.source.dispatch(1)
                    if not pairs:  # refused (admission, capacity) or no prompt now: wait for a change
                        break
                    for gid, group in pairs:
                        task = asyncio.ensure_future(self.generate(self.args, group))
                        task.add_done_callback(self._on_done(gid, group, active))
                        active[task] = gid
                self._wake.clear()
                waits = [asyncio.ensure_future(self._wake.wait())]
                await asyncio.wait([*active, *waits], timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
                for w in waits:
                    w.cancel()
        finally:
            for task in list(active):
                task.cancel()
            if active:
                await asyncio.gather(*active, return_exceptions=True)

    def _on_done(self, gid: int, group: List[Any], active: Dict[asyncio.Task, int]) -> Callable[[asyncio.Task], None]:
        def done(task: asyncio.Task) -> None:
            active.pop(task, None)
            if task.cancelled():
                self.source.requeue(gid, group, "cancelled_requeued")
                return
            exc = task.exception()
            if exc is not None:
                logger.warning("%s: generating group %d raised %r; it is requeued", WHERE, gid, exc)
                self.source.requeue(gid, group, "errors_requeued")
                return
            result = task.result()
            if not isinstance(result, list):
                logger.warning("%s: generate returned %r, not a list of samples; requeued", WHERE, type(result))
                self.source.requeue(gid, group, "errors_requeued")
            elif is_aborted(result):
                # An aborted group (a weight update interrupted it) is generated again, not trained: as slime's.
                self.source.requeue(gid, group)
            else:
                self.source.complete(gid, result)

        return done

"""The paced producer loop of ``StalenessRolloutFn``, free of Miles so CI runs it: submit while the scheduler has
room *and* our buffer admits, put each finished group, and when refused wait for what can change the answer."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Set, Tuple

Tasks = Set["asyncio.Task[Any]"]


async def run_producer(
    output: Any,
    *,
    resumed: asyncio.Event,
    has_capacity: Callable[[int], bool],
    wait_for_progress: Callable[[Tasks], Awaitable[Tuple[Tasks, Tasks]]],
    submit: Callable[[], asyncio.Task[Any]],
) -> None:
    """Runs until cancelled or a generation raises (the error ends the loop, as in Miles's own producer).

    ``output`` is a ``StalenessDataBuffer`` on the rollout clock; ``has_capacity(pending)`` and
    ``wait_for_progress(active)`` are the submission scheduler's; ``submit()`` takes one prompt group from the data
    source, dispatches it through ``output`` and returns its generation task. A prompt is taken from the data source
    only after admission said yes, so a refused prompt is never lost.
    """
    active: Tasks = set()
    while True:
        await resumed.wait()
        full = False
        while True:
            if not has_capacity(len(active)):
                full = True  # the scheduler armed its own wakeup: wait through it
                break
            if not output.can_admit():
                break
            active.add(submit())
        if full:
            progress: asyncio.Future[Tuple[Tasks, Tasks]] = asyncio.ensure_future(wait_for_progress(active))
        elif active:
            progress = asyncio.ensure_future(asyncio.wait(active, return_when=asyncio.FIRST_COMPLETED))
        else:
            progress = None  # type: ignore[assignment]
        # Refused by admission: a take, a failure or a new step can change the answer; a finished generation must
        # still be put, or no take could ever happen.
        admission = asyncio.ensure_future(output.admission_changed())
        waiters = {admission} if progress is None else {admission, progress}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                if not waiter.done():
                    waiter.cancel()
        if progress is not None and progress.done() and not progress.cancelled():
            done, active = progress.result()
            active = set(active)
            for task in done:
                await output.put(task.result())

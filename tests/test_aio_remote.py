"""RemoteBuffer's awaitable calls on the session's real local Ray cluster: many waiters on one loop that stays
responsive with one watch call and no thread per waiter, cancellation (nothing changes while watching; an attempt
that went through is undone or counted), timeouts worded as the blocking calls', wake-ups from another process,
paced admission and on_full="block" room."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

from pyfast_buffer.ray import RemoteBuffer  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_namespace", "buffers_ended")  # the session's two-node cluster

NAMESPACE = "pyfast_buffer_aio_tests"
LIVENESS_S = 60.0  # a bound on a loaded machine for what must happen, never a performance threshold


@ray.remote(num_cpus=0)
def put_later(buf: RemoteBuffer, ids: list, delay_s: float) -> None:
    """Another process puts, after the waiters wait: its change reaches them through the index's watch."""
    time.sleep(delay_s)
    for i in ids:
        buf.put([i], 0)


def test_many_remote_waiters_share_one_watch_and_the_loop_stays_responsive():
    buf = RemoteBuffer.create(256, max_age=3)

    async def main():
        waiters = [asyncio.create_task(buf.atake(1, 0, timeout=LIVENESS_S)) for _ in range(50)]
        await asyncio.sleep(0.5)  # every waiter made its attempt and awaits the watch
        threads = threading.active_count()
        ticks = 0
        for _ in range(50):  # the loop runs while they all wait
            await asyncio.sleep(0.002)
            ticks += 1
        assert ticks == 50 and not any(w.done() for w in waiters)
        assert threading.active_count() <= threads  # waiting longer made no thread
        done = put_later.remote(buf, list(range(50)), 0.0)
        batches = await asyncio.wait_for(asyncio.gather(*waiters), LIVENESS_S)
        await done
        return sorted(int(b.traj_ids[0]) for b in batches)

    assert asyncio.run(main()) == list(range(50))  # each entry went to exactly one waiter
    assert buf.ledger()["taken"] == 50


def test_a_cancelled_remote_await_changes_nothing_while_it_waits():
    buf = RemoteBuffer.create(4, max_age=3, on_full="block")
    buf.put([1, 2, 3, 4], 0)
    buf.dispatch([7], 0)

    async def main():
        for call in (lambda: buf.atake(8, 0), lambda: buf.aput([9], 0), lambda: buf.acomplete([9], [7])):
            task = asyncio.create_task(call())
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    before = (buf.ledger(), len(buf), buf.in_flight)
    asyncio.run(main())
    assert (buf.ledger(), len(buf), buf.in_flight) == before
    assert buf.take(4, 0).traj_ids.tolist() == [1, 2, 3, 4]


def test_a_remote_timeout_is_the_blocking_calls_words():
    buf = RemoteBuffer.create(8, max_age=1, strategy="pace", prompts_per_step=1)
    buf.dispatch([1, 2], 0)  # the window, (lookahead 1 + 1) * 1, is full
    with pytest.raises(TimeoutError) as sync_error:
        buf.dispatch([3], 0, timeout=0.3)

    async def main():
        with pytest.raises(TimeoutError) as async_error:
            await buf.adispatch([3], 0, timeout=0.3)
        return str(async_error.value)

    message = asyncio.run(main())
    assert message == str(sync_error.value) and "timed out after 0.3 s waiting for admission under pace" in message


def test_a_paced_remote_dispatch_is_admitted_when_a_take_frees_room():
    buf = RemoteBuffer.create(8, max_age=1, strategy="pace", prompts_per_step=1)
    buf.dispatch([1, 2], 0)

    async def main():
        admitted = asyncio.create_task(buf.adispatch([3], 0, timeout=LIVENESS_S))
        await asyncio.sleep(0.5)
        assert not admitted.done()
        await asyncio.get_running_loop().run_in_executor(None, buf.fail, [1])  # a slot frees
        await asyncio.wait_for(admitted, LIVENESS_S)

    asyncio.run(main())
    assert buf.in_flight == 2


def test_a_remote_put_waits_for_room_under_block_then_goes():
    buf = RemoteBuffer.create(2, max_age=5, on_full="block")
    buf.put([1, 2], 0)

    async def main():
        put = asyncio.create_task(buf.aput([3], 0, timeout=LIVENESS_S))
        await asyncio.sleep(0.5)
        assert not put.done()
        taken = await buf.atake(1, 0, timeout=LIVENESS_S)
        await asyncio.wait_for(put, LIVENESS_S)
        return taken

    assert asyncio.run(main()).traj_ids.tolist() == [1]
    assert sorted(buf.take(2, 0).traj_ids.tolist()) == [2, 3]


def test_an_attempt_that_went_through_after_cancel_is_undone_or_counted():
    # A cancel that lands while a dispatch attempt is at the index: the attempt answers first; if it admitted
    # the prompts they are failed at once, so nothing is left in flight that no producer will complete.
    buf = RemoteBuffer.create(64, max_age=1, strategy="pace", prompts_per_step=1)

    async def one(i: int) -> bool:
        task = asyncio.create_task(buf.adispatch([i], 0, timeout=LIVENESS_S))
        await asyncio.sleep(0)  # its first attempt is on its way
        task.cancel()
        try:
            await task
            return True
        except asyncio.CancelledError:
            return False

    async def main():
        outcomes = [await one(i) for i in range(20)]
        await asyncio.sleep(1.0)  # the undo calls run off the loop
        return outcomes

    outcomes = asyncio.run(main())
    deadline = time.monotonic() + LIVENESS_S
    while buf.in_flight > sum(outcomes) and time.monotonic() < deadline:
        time.sleep(0.05)
    led = buf.ledger()
    assert buf.in_flight == sum(outcomes)  # only calls that returned left prompts in flight
    assert led["dispatched"] == led["in_flight"] + led["failed"]

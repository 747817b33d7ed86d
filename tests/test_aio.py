"""The awaitable API (adispatch, acomplete, aput, atake) on both implementations: many waiters on one event loop
that stays responsive, no thread per waiter, cancellation that changes nothing, timeouts and counters as the
blocking calls', wake-ups from other threads, lease expiry and close, protected admission first."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyfast_buffer as pfb

LIVENESS_S = 20.0  # a bound on a loaded machine for what must happen, never a performance threshold


def make(impl, capacity=256, **kwargs):
    extra = {"pin_memory": False} if impl is pfb.StalenessBuffer else {}
    return impl(capacity, **kwargs, **extra)


def state(buf) -> tuple:
    return (buf.ledger(), len(buf), buf.in_flight)


def test_many_waiters_on_one_loop_no_thread_each_and_the_loop_stays_responsive(impl):
    buf = make(impl, max_age=3)

    async def main():
        threads = threading.active_count()
        waiters = [asyncio.create_task(buf.atake(1, 0, timeout=LIVENESS_S)) for _ in range(200)]
        await asyncio.sleep(0.01)
        assert threading.active_count() == threads  # waiting made no thread
        # The loop runs a callback another thread schedules while every waiter waits.
        loop, ran = asyncio.get_running_loop(), threading.Event()
        threading.Thread(target=lambda: loop.call_soon_threadsafe(ran.set)).start()
        while not ran.is_set():
            await asyncio.sleep(0.001)
        assert not any(w.done() for w in waiters)
        producer = threading.Thread(target=lambda: [buf.put([i], 0) for i in range(200)])
        producer.start()
        batches = await asyncio.wait_for(asyncio.gather(*waiters), LIVENESS_S)
        producer.join()
        return sorted(int(b.traj_ids[0]) for b in batches)

    assert asyncio.run(main()) == list(range(200))  # each entry went to exactly one waiter
    assert buf.ledger()["taken"] == 200


def test_a_cancelled_or_timed_out_await_changes_nothing(impl):
    buf = make(impl, capacity=4, max_age=3, on_full="block")
    buf.put([1, 2, 3, 4], 0)
    before = state(buf)

    async def main():
        for call in (lambda: buf.atake(8, 0), lambda: buf.aput([9], 0), lambda: buf.acomplete([9], [7])):
            task = asyncio.create_task(call())
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(buf.atake(8, 0), 0.05)

    buf.dispatch([7], 0)  # acomplete's prompt
    before = state(buf)
    asyncio.run(main())
    assert state(buf) == before
    assert buf.take(4, 0).traj_ids.tolist() == [1, 2, 3, 4]  # the data is still there for the next caller


def test_timeouts_are_the_blocking_calls_with_the_same_words_and_counters(impl):
    blocking, awaiting = (make(impl, capacity=8, max_age=1, strategy="pace", prompts_per_step=1) for _ in range(2))
    for buf in (blocking, awaiting):
        buf.dispatch([1, 2], 0)  # the window, (lookahead 1 + 1) * 1, is full
    with pytest.raises(TimeoutError) as sync_error:
        blocking.dispatch([3], 0, timeout=0.1)

    async def main():
        with pytest.raises(TimeoutError) as async_error:
            await awaiting.adispatch([3], 0, timeout=0.1)
        return str(async_error.value)

    message = asyncio.run(main())
    assert message == str(sync_error.value) and "timed out after 0.1 s waiting for admission under pace" in message
    assert awaiting.ledger() == blocking.ledger()  # admission_refused and admission_waits counted once each


def test_wake_ups_from_other_threads_admit_a_paced_dispatch(impl):
    buf = make(impl, capacity=8, max_age=1, strategy="pace", prompts_per_step=1)
    buf.dispatch([1, 2], 0)

    async def main():
        admitted = asyncio.create_task(buf.adispatch([3], 0, timeout=LIVENESS_S))
        await asyncio.sleep(0.02)
        assert not admitted.done()
        threading.Thread(target=lambda: buf.fail([1])).start()  # a slot frees in another thread
        await asyncio.wait_for(admitted, LIVENESS_S)

    asyncio.run(main())
    assert buf.in_flight == 2 and buf.ledger()["admission_refused"] == 0


def test_a_lease_that_passes_wakes_an_awaiting_take_with_no_other_call(impl):
    buf = make(impl, capacity=8, max_age=0, strategy="wait")
    buf.dispatch([1], 0, lease=0.2)  # at max_age under wait: blocks every take until it ends
    buf.put([10], 0)

    async def main():
        started = time.monotonic()
        batch = await asyncio.wait_for(buf.atake(1, 0), LIVENESS_S)
        return batch, time.monotonic() - started

    batch, waited = asyncio.run(main())
    assert batch.traj_ids.tolist() == [10] and buf.ledger()["expired"] == 1
    assert waited >= 0.2  # it went when the lease passed, not before


def test_close_wakes_every_awaiting_call(impl):
    buf = make(impl, max_age=3)

    async def main():
        waiters = [asyncio.create_task(buf.atake(1, 0)) for _ in range(5)]
        await asyncio.sleep(0.01)
        threading.Thread(target=buf.close).start()
        return await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), LIVENESS_S)

    assert all(isinstance(r, pfb.BufferClosedError) for r in asyncio.run(main()))


def test_bad_arguments_raise_before_anything_is_awaited(impl):
    buf = make(impl, max_age=3)

    async def main():
        with pytest.raises(ValueError, match="timeout=-1"):
            await buf.atake(1, 0, timeout=-1)
        with pytest.raises(ValueError, match="batch_size"):
            await buf.atake(0, 0)
        with pytest.raises(TypeError, match="prompt_ids"):
            await buf.adispatch("abc", 0)

    asyncio.run(main())


def test_an_awaiting_protected_dispatch_holds_the_others_back(impl):
    buf = make(impl, capacity=16, max_age=1, strategy="pace", prompts_per_step=1, max_attempts=2)
    buf.dispatch([5], 0)
    buf.fail([5])  # prompt 5 left untrained once: its next attempt is its 2nd, protected
    buf.dispatch([1, 2], 0)  # the window is full

    async def main():
        protected = asyncio.create_task(buf.adispatch([5], 0, timeout=LIVENESS_S))
        await asyncio.sleep(0.02)
        with pytest.raises(pfb.AdmissionError, match="protected"):
            buf.dispatch([9], 0)  # would not fit anyway, but is refused behind the protected waiter
        buf.fail([1])
        await asyncio.wait_for(protected, LIVENESS_S)
        buf.fail([2])
        buf.dispatch([9], 0)  # the protected waiter left: others go again

    asyncio.run(main())
    assert buf.ledger()["protected_admitted"] == 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["atake", "cancel", "put", "yield"]), st.integers(1, 3)), min_size=4, max_size=30
    )
)
def test_random_awaits_puts_and_cancels_lose_and_duplicate_nothing(impl, ops):
    # Takers await batches while puts arrive and some awaits are cancelled: every entry put is taken by exactly
    # one completed await or still in the buffer, and the ledger balances.
    buf = make(impl, capacity=512, max_age=1000)
    next_id = iter(range(10_000))
    put: list = []

    async def main():
        tasks: list = []
        for op, k in ops:
            if op == "atake":
                tasks.append(asyncio.create_task(buf.atake(k, 0)))
            elif op == "cancel" and tasks:
                tasks[k % len(tasks)].cancel()
            elif op == "put":
                ids = [next(next_id) for _ in range(k)]
                put.extend(ids)
                buf.put(ids, 0)
            await asyncio.sleep(0)  # let the loop run the wake-ups and the waiters
        await asyncio.sleep(0.01)
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return [r for r in results if not isinstance(r, BaseException)]

    batches = asyncio.run(main())
    taken = [i for b in batches for i in b.traj_ids.tolist()]
    left = buf.take(len(put) or 1, 0).traj_ids.tolist() if len(buf) else []
    assert sorted(taken + left) == sorted(put) and len(taken) == len(set(taken))
    led = buf.ledger()
    assert led["sampled_total"] == led["retired"] + led["dropped_stale"] + led["evicted"] + led["buffer_left"]


def test_the_probe_timeout_is_the_cores_and_a_callers_minus_one_is_still_refused(impl):
    from pyfast_buffer import _core
    from pyfast_buffer._args import PROBE

    assert float(PROBE) == _core.PROBE_TIMEOUT < 0
    buf = make(impl, max_age=3)
    with pytest.raises(ValueError, match="timeout=-1"):
        buf.take(1, 0, timeout=-1)


@pytest.mark.parametrize("bounded", [True, False])
def test_atake_passes_bounded_through_as_take_does(impl, bounded):
    # A row of step 0 and one of step 5, taken at step 5 with max_age=1: the bounded atake drops the stale row and
    # returns the fresh one; the unbounded one returns the stale row (oldest first) and counts it over age.
    buf = make(impl, capacity=8, max_age=1)
    buf.put([1], 0)
    buf.put([2], 5)

    async def main():
        return await buf.atake(1, 5, timeout=LIVENESS_S, bounded=bounded)

    batch = asyncio.run(main())
    led = buf.ledger()
    if bounded:
        assert batch.traj_ids.tolist() == [2] and led["dropped_stale"] == 1 and len(buf) == 0
    else:
        assert batch.traj_ids.tolist() == [1] and led["dropped_stale"] == 0 and len(buf) == 1
        assert led["trained_over_age"] == 1
    assert buf.take(1, 5).traj_ids.tolist() == ([] if bounded else [2])  # the next take keeps the bound


def test_an_unbounded_atake_is_refused_under_pace_and_changes_nothing(impl):
    buf = make(impl, capacity=8, max_age=1, strategy="pace", prompts_per_step=1)
    buf.put([1], 0)
    before = state(buf)

    async def main():
        await buf.atake(1, 5, timeout=LIVENESS_S, bounded=False)

    with pytest.raises(ValueError, match="bounded=False is refused under pace"):
        asyncio.run(main())
    with pytest.raises(TypeError, match="bounded='no' must be True"):
        asyncio.run(buf.atake(1, 0, bounded="no"))  # type: ignore[arg-type]
    assert state(buf) == before

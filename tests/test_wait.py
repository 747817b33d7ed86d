"""The wait strategy and blocking takes: condition variables, timeouts naming the cause, close()."""

import threading
import time

import pytest

import pyfast_buffer as pfb
from _helpers import assert_balanced


def test_wait_never_drops_for_staleness(impl):
    buf = impl(16, max_age=1, strategy="wait")
    buf.put([1, 2], 0)
    batch = buf.take(2, current_step=10)
    assert batch.traj_ids.tolist() == [1, 2] and batch.age.tolist() == [10, 10]
    assert buf.ledger()["dropped_stale"] == 0


def test_wait_refuses_to_take_while_an_in_flight_prompt_is_at_max_age(impl):
    buf = impl(16, max_age=2, strategy="wait")
    buf.put([1, 2], 2)
    buf.dispatch([50], step=1)
    assert buf.take(2, current_step=2).traj_ids.tolist() == [1]  + [2]  # age 1 < 2: not blocking
    buf.put([3], 3)
    blocked = buf.take(1, current_step=3)  # prompt 50 has age 2 == max_age
    assert len(blocked) == 0 and blocked.metrics["blocked_by"] == "in_flight_at_max_age"
    assert len(buf) == 1
    buf.fail([50])
    assert buf.take(1, current_step=3).traj_ids.tolist() == [3]


def test_drop_ignores_in_flight_prompts(impl):
    buf = impl(16, max_age=2, strategy="drop")
    buf.dispatch([50], step=0)
    buf.put([1], 5)
    assert buf.take(1, current_step=5).traj_ids.tolist() == [1]


def test_blocking_take_times_out_naming_too_few_ready(impl):
    buf = impl(16, max_age=2)
    buf.put([1], 0)
    before = buf.ledger()
    with pytest.raises(TimeoutError, match=r"only 1 fresh entries are ready for batch_size=4"):
        buf.take(4, current_step=0, timeout=0.05)
    assert buf.ledger() == before and len(buf) == 1


def test_blocking_take_times_out_naming_the_in_flight_prompts(impl):
    buf = impl(16, max_age=1, strategy="wait")
    buf.dispatch([77], step=0)
    buf.put([1], 1)
    with pytest.raises(TimeoutError, match=r"prompt 77 since step 0.*increase max_age"):
        buf.take(1, current_step=1, timeout=0.05)


def test_blocking_take_wakes_when_a_producer_completes_the_batch(impl):
    buf = impl(16, max_age=5)
    buf.dispatch([1, 2], step=0)
    result = {}

    def consume():
        result["batch"] = buf.take(4, current_step=0, timeout=10)

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.02)
    buf.complete([10, 11], [1, 1])
    time.sleep(0.02)
    assert consumer.is_alive()  # half a batch is not enough
    buf.complete([12, 13], [2, 2])
    consumer.join(5)
    assert not consumer.is_alive()
    assert result["batch"].traj_ids.tolist() == [10, 11, 12, 13]


def test_blocking_wait_take_resumes_when_the_stale_prompt_fails(impl):
    buf = impl(16, max_age=1, strategy="wait")
    buf.put([1], 1)
    buf.dispatch([9], step=0)
    result = {}
    consumer = threading.Thread(target=lambda: result.setdefault("b", buf.take(1, 1, timeout=10)))
    consumer.start()
    time.sleep(0.02)
    assert consumer.is_alive()
    buf.fail([9])
    consumer.join(5)
    assert result["b"].traj_ids.tolist() == [1]


def test_close_wakes_every_waiter_with_a_clear_error(impl):
    buf = impl(4, max_age=1, on_full="block")
    buf.put([1, 2, 3, 4], 0)
    errors = []

    def wait_take():
        try:
            buf.take(8, 0, timeout=30)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    def wait_put():
        try:
            buf.put([5], 0, timeout=30)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in (wait_take, wait_take, wait_put)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    buf.close()
    for t in threads:
        t.join(5)  # their own timeouts are 30 s: finishing here means close() woke them
    assert not any(t.is_alive() for t in threads)
    assert len(errors) == 3 and all(isinstance(e, pfb.BufferClosedError) for e in errors)
    assert "closed" in str(errors[0])


def test_timeout_zero_checks_once(impl):
    buf = impl(8)
    buf.put([1, 2], 0)
    assert len(buf.take(2, 0, timeout=0)) == 2
    with pytest.raises(TimeoutError):
        buf.take(1, 0, timeout=0)
    assert_balanced(buf)


def test_a_waiting_take_refuses_a_clock_that_moved_past_it(impl):
    buf = impl(16, max_age=5)
    errors = []

    def consume():
        try:
            buf.take(2, current_step=5, timeout=10)
        except ValueError as exc:
            errors.append(exc)

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.02)
    buf.put([1, 2], 9)  # weights of step 9 exist, so the trainer is past step 5
    consumer.join(5)
    assert errors and "current_step=5 is lower than step 9" in str(errors[0])
    assert len(buf) == 2  # nothing was taken with a negative age


def test_the_longest_accepted_timeout_does_not_overflow(impl):
    buf = impl(4)
    done = []
    consumer = threading.Thread(target=lambda: done.append(buf.take(1, 0, timeout=1e9)))
    consumer.start()
    time.sleep(0.02)
    buf.put([1], 0)
    consumer.join(5)
    assert done and done[0].traj_ids.tolist() == [1]


@pytest.mark.parametrize("timeout", [1e9 + 1, 1e300, 10**400])
def test_huge_timeouts_are_refused_changing_nothing(impl, timeout):
    buf = impl(4, on_full="block")
    buf.put([1, 2, 3, 4], 0)
    before = buf.ledger()
    with pytest.raises(ValueError, match=r"timeout=.* (exceeds the longest accepted|is too large)"):
        buf.take(8, 0, timeout=timeout)
    with pytest.raises(ValueError, match=r"timeout="):
        buf.put([5], 0, timeout=timeout)
    buf.dispatch([9], 0)
    before = buf.ledger()
    with pytest.raises(ValueError, match=r"timeout="):
        buf.complete([6], [9], timeout=timeout)
    assert buf.ledger() == before and len(buf) == 4

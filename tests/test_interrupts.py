"""Ctrl-C interrupts a blocking call: a real SIGINT raises KeyboardInterrupt long before the timeout,
and the interrupted call changes nothing.

The bound checked (half the timeout) is not a performance threshold: without interrupt support the call
would run to its full timeout.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from _helpers import assert_balanced

TIMEOUT = 120.0


def interrupted(call) -> float:
    """Sends this process a real SIGINT 0.3 s from now, runs call, asserts KeyboardInterrupt; returns seconds taken."""
    assert threading.current_thread() is threading.main_thread()  # Python runs signal handlers there
    timer = threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        timer.cancel()
    return time.monotonic() - start


def check_unchanged(buf, call) -> None:
    before, size, in_flight = buf.ledger(), len(buf), buf.in_flight
    assert interrupted(call) < TIMEOUT / 2
    assert buf.ledger() == before and len(buf) == size and buf.in_flight == in_flight
    assert_balanced(buf)


@pytest.fixture(autouse=True)
def default_sigint_handler():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_take_waiting_for_entries(impl):
    buf = impl(8)
    buf.put([1], 0)
    check_unchanged(buf, lambda: buf.take(4, 0, timeout=TIMEOUT))
    assert buf.take(1, 0).traj_ids.tolist() == [1]  # still usable


def test_take_waiting_on_an_in_flight_prompt(impl):
    buf = impl(8, max_age=1, strategy="wait")
    buf.dispatch([50], 0)
    buf.put([1], 1)
    check_unchanged(buf, lambda: buf.take(1, 1, timeout=TIMEOUT))


def test_put_waiting_for_room(impl):
    buf = impl(2, on_full="block")
    buf.put([1, 2], 0)
    check_unchanged(buf, lambda: buf.put([3], 0, timeout=TIMEOUT))


def test_complete_waiting_for_room(impl):
    buf = impl(2, on_full="block")
    buf.put([1, 2], 0)
    buf.dispatch([9], 0)
    check_unchanged(buf, lambda: buf.complete([3], [9], timeout=TIMEOUT))
    buf.take(2, 0)
    buf.complete([3], [9])
    assert assert_balanced(buf)["completed"] == 3  # two put groups and prompt 9


def test_paced_dispatch_waiting_for_admission(impl):
    buf = impl(8, max_age=0, strategy="pace", prompts_per_step=1)
    buf.dispatch([9], 0)
    check_unchanged(buf, lambda: buf.dispatch([1], 0, timeout=TIMEOUT))


def test_a_protected_dispatch_interrupted_lets_the_call_behind_it_in(impl):
    buf = impl(8, max_age=0, strategy="pace", prompts_per_step=2, max_attempts=2)  # admits 2 prompt groups
    buf.dispatch([7], 0)
    buf.fail([7])  # prompt 7's next attempt is its second untrained one: protected
    buf.dispatch([1], 0)  # one slot left, too few for the protected call of prompts 7 and 8
    admitted, interrupted_already = threading.Event(), threading.Event()

    def behind():  # fits the slot, but waits behind the protected call until that one leaves
        while "protected_waiting=1" not in repr(buf) and not interrupted_already.is_set():
            time.sleep(0.005)
        buf.dispatch([3], 0, timeout=TIMEOUT)
        admitted.set()

    other = threading.Thread(target=behind, daemon=True)
    other.start()
    assert interrupted(lambda: buf.dispatch([7, 8], 0, timeout=TIMEOUT)) < TIMEOUT / 2
    interrupted_already.set()
    assert admitted.wait(TIMEOUT / 2)  # woken when the interrupted protected waiter left
    other.join(TIMEOUT / 2)
    led = assert_balanced(buf)
    assert (led["admitted"], led["protected_admitted"], led["admission_refused"]) == (3, 0, 0)
    assert "admission_waiting" not in repr(buf)

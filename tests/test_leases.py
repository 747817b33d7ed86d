"""Leases on in-flight prompts: a lost worker's prompt is failed (as expired) by the buffer, never waited on forever.

Most tests freeze the lease clock through the private hook ``_set_lease_clock`` so that they are exact;
one runs on the real monotonic clock to show a blocked take is woken by a lease that passes.
"""

import logging
import math
import threading

import pytest
from _helpers import assert_balanced

import pyfast_buffer as pfb

S = 1_000_000_000  # ns per second


def frozen(impl, *args, **kwargs):
    buf = impl(*args, **kwargs)
    buf._set_lease_clock(0)
    return buf


@pytest.mark.parametrize(
    "lease, error",
    [
        (0, ValueError),
        (-1, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (1e10, ValueError),
        (10**400, ValueError),
        ("1", TypeError),
        (True, TypeError),
    ],
)
def test_bad_lease_is_refused_changing_nothing(impl, lease, error):
    buf = frozen(impl, 8)
    buf.dispatch([1], 0, lease=2)
    before = buf.ledger()
    with pytest.raises(error, match="lease"):
        buf.dispatch([2], 0, lease=lease)
    with pytest.raises(error, match="lease"):
        buf.renew([1], lease)
    assert buf.ledger() == before and buf.in_flight == 1


def test_a_passed_lease_fails_the_prompt_as_expired(impl):
    buf = frozen(impl, 8)
    buf.dispatch([1, 2], 0, lease=5)
    buf.dispatch([3], 0)  # no lease: never expires by itself
    buf._set_lease_clock(5 * S - 1)
    assert buf.in_flight == 3
    buf._set_lease_clock(5 * S)
    led = assert_balanced(buf)
    assert led["failed"] == 2 and led["expired"] == 2 and led["in_flight"] == 1
    with pytest.raises(ValueError, match=r"prompt 1 is not in flight.*expired"):
        buf.complete([10], [1])
    buf.complete([10], [3])
    assert assert_balanced(buf)["completed"] == 1


def test_renew_extends_a_lease_and_gives_one_to_a_prompt_without(impl):
    buf = frozen(impl, 8)
    buf.dispatch([1, 2], 0, lease=5)
    buf.dispatch([3], 0)
    buf._set_lease_clock(4 * S)
    buf.renew([1, 3], 5)
    buf._set_lease_clock(6 * S)
    assert buf.ledger()["expired"] == 1  # prompt 2
    buf._set_lease_clock(9 * S)
    led = assert_balanced(buf)
    assert led["expired"] == 3 and led["in_flight"] == 0


@pytest.mark.parametrize("prompts, match", [([1, 1], "prompt 1 appears twice"), ([1, 7], "prompt 7 is not in flight")])
def test_bad_renew_changes_nothing(impl, prompts, match):
    buf = frozen(impl, 8)
    buf.dispatch([1], 0, lease=5)
    with pytest.raises(ValueError, match=match):
        buf.renew(prompts, 10)
    buf._set_lease_clock(5 * S)
    assert buf.ledger()["expired"] == 1  # the lease of prompt 1 was not extended


def test_expire_in_flight_fails_prompts_older_than_the_bound(impl):
    buf = frozen(impl, 8)
    buf.dispatch([1], 0)
    buf._set_lease_clock(3 * S)
    buf.dispatch([2], 0)
    buf._set_lease_clock(5 * S)
    assert buf.expire_in_flight(3) == 1  # prompt 1 is 5 s old, prompt 2 only 2 s
    assert buf.in_flight == 1
    assert buf.expire_in_flight(0) == 1
    led = assert_balanced(buf)
    assert led["failed"] == led["expired"] == 2


@pytest.mark.parametrize(
    "bad, error", [(-1, ValueError), (math.nan, ValueError), (1e12, ValueError), (None, TypeError), ("3", TypeError)]
)
def test_bad_expire_in_flight_is_refused(impl, bad, error):
    buf = frozen(impl, 8)
    buf.dispatch([1], 0)
    with pytest.raises(error, match="older_than_s"):
        buf.expire_in_flight(bad)
    assert buf.in_flight == 1


def test_a_waiting_take_is_unblocked_when_the_lease_passes_on_the_real_clock(impl):
    buf = impl(8, max_age=1, strategy="wait")
    buf.dispatch([50], 0, lease=0.2)  # its worker is lost: nobody completes or fails it
    buf.put([1], 1)
    batch = buf.take(1, current_step=1, timeout=60)  # would block for the whole timeout without the lease
    assert batch.traj_ids.tolist() == [1]
    led = assert_balanced(buf)
    assert led["expired"] == 1 and led["failed"] == 1


def test_a_waiting_take_rechecks_when_the_lease_clock_moves(impl):
    buf = frozen(impl, 8, max_age=1, strategy="wait")
    buf.dispatch([50], 0, lease=3)
    buf.put([1], 1)
    result = {}
    consumer = threading.Thread(target=lambda: result.update(batch=buf.take(1, current_step=1, timeout=60)))
    consumer.start()
    buf._set_lease_clock(3 * S)
    consumer.join(60)
    assert not consumer.is_alive() and result["batch"].traj_ids.tolist() == [1]


def test_the_log_record_carries_the_expired_count(impl, caplog):
    caplog.set_level(logging.INFO, logger="pyfast_buffer")
    buf = frozen(impl, 8)
    buf.dispatch([1, 2], 0, lease=1)
    buf._set_lease_clock(S)
    buf.take(1, 0)
    assert " expired=2 " in caplog.records[-1].getMessage()


@pytest.mark.parametrize("source", ["StalenessBuffer", "ReferenceBuffer"])
def test_a_restored_lease_keeps_the_time_it_had_left(impl, source):
    src = frozen(getattr(pfb, source), 8)
    src.dispatch([1], 0, lease=5)
    src.dispatch([2], 0)
    src._set_lease_clock(2 * S)
    sd = src.state_dict()
    assert sd["in_flight"]["lease_left_ns"].tolist() == [3 * S, -1]
    assert sd["in_flight"]["held_ns"].tolist() == [2 * S, 2 * S]
    dst = impl(8)
    dst._set_lease_clock(100 * S)
    dst.load_state_dict(sd)
    dst._set_lease_clock(103 * S - 1)
    assert dst.in_flight == 2
    dst._set_lease_clock(103 * S)
    assert dst.in_flight == 1 and dst.ledger()["expired"] == 1
    assert dst.expire_in_flight(5) == 1  # prompt 2 had been in flight 2 s when saved, 5 s now


def test_a_state_dict_without_lease_columns_loads_without_leases(impl):
    buf = frozen(impl, 8)
    buf.dispatch([1], 0, lease=1)
    sd = buf.state_dict()
    for key in ("lease_left_ns", "held_ns"):
        del sd["in_flight"][key]
    del sd["ledger"]["expired"]
    other = frozen(impl, 8)
    other.load_state_dict(sd)
    other._set_lease_clock(10**6 * S)
    assert other.in_flight == 1 and other.ledger()["expired"] == 0


def test_a_corrupt_expired_count_is_refused(impl):
    buf = frozen(impl, 8)
    buf.dispatch([1], 0)
    sd = buf.state_dict()
    sd["ledger"]["expired"] = 1  # more expired than failed
    with pytest.raises(ValueError, match="ledger does not balance"):
        impl(8).load_state_dict(sd)

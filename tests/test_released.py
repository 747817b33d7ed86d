"""Every id that leaves the buffer is reported once, in order, with its reason; ids are unique where asked."""

import numpy as np
import pytest

import pyfast_buffer as pfb
from _helpers import assert_balanced

RETIRED, DROPPED_STALE, EVICTED, FAILED, EXPIRED = range(5)


def drain(buf):
    r = buf.released()
    assert r.ids.dtype == np.int64 and r.reasons.dtype == np.int8
    return list(zip(r.ids.tolist(), r.reasons.tolist()))


def test_reason_names():
    assert pfb.RELEASE_REASONS == ("retired", "dropped_stale", "evicted", "failed", "expired")


def test_released_without_tracking_says_how_to_turn_it_on(impl):
    with pytest.raises(ValueError, match="track_released=True"):
        impl(4).released()


def test_each_reason_in_order_and_each_once(impl):
    buf = impl(3, max_age=2, track_released=True)
    buf._set_lease_clock(0)
    buf.put([1], 0)
    buf.put([2, 3], 5)  # the ring is full: nothing evicted yet
    buf.put([4], 5)  # evicts the oldest group, trajectory 1
    assert drain(buf) == [(1, EVICTED)]
    buf.put([5], 1)  # evicts 2
    assert buf.take(8, 5).traj_ids.tolist() == [3, 4]  # 5 (age 4) dropped on the way
    assert drain(buf) == [(2, EVICTED), (3, RETIRED), (4, RETIRED), (5, DROPPED_STALE)]
    assert drain(buf) == []
    buf.dispatch([70, 71], 5, lease=1)
    buf.dispatch([72], 5)
    buf.fail([72])
    buf._set_lease_clock(10**9)
    assert buf.in_flight == 0
    assert drain(buf) == [(72, FAILED), (70, EXPIRED), (71, EXPIRED)]
    assert_balanced(buf)


def test_reuse_releases_only_at_the_last_use(impl):
    buf = impl(4, max_uses=2, track_released=True)
    buf.put([1, 2], 0)
    buf.take(2, 0)
    assert drain(buf) == []
    buf.take(2, 0)
    assert drain(buf) == [(1, RETIRED), (2, RETIRED)]


def test_evict_stale_reports_the_dropped_ids(impl):
    buf = impl(8, max_age=1, track_released=True)
    buf.put([1, 2, 3], [3, 0, 1])
    assert buf.evict_stale(3) == 2
    assert drain(buf) == [(2, DROPPED_STALE), (3, DROPPED_STALE)]


def test_of_selects_one_reason(impl):
    buf = impl(2, track_released=True)
    buf.put([1, 2], 0)
    buf.put([3], 0)
    buf.take(1, 0)
    released = buf.released()
    assert released.of("evicted").tolist() == [1] and released.of("retired").tolist() == [2]
    with pytest.raises(ValueError, match="reason='lost' is unknown"):
        released.of("lost")


def test_past_the_bound_the_oldest_records_are_discarded_and_counted(impl):
    buf = impl(4, track_released=True, release_bound=3)
    for i in range(5):
        buf.put([i], 0)
        buf.take(1, 0)
    assert drain(buf) == [(2, RETIRED), (3, RETIRED), (4, RETIRED)]
    assert buf.ledger()["released_overflow"] == 2


def test_release_bound_needs_tracking(impl):
    with pytest.raises(ValueError, match="release_bound=5 needs track_released=True"):
        impl(4, release_bound=5)
    with pytest.raises(TypeError, match="track_released=1 must be True or False"):
        impl(4, track_released=1)


def test_load_state_dict_keeps_the_pending_records(impl):
    buf = impl(4, track_released=True)
    buf.put([1, 2], 0)
    buf.take(1, 0)
    buf.load_state_dict(buf.state_dict())
    assert drain(buf) == [(1, RETIRED)]


@pytest.mark.parametrize("call, match", [
    (lambda b: b.put([5, 5, 5], 0), "trajectory 5 appears twice"),
    (lambda b: b.put([5, 6, 5], 0, group_ids=[1, 1, 1]), "trajectory 5 appears twice"),
    (lambda b: b.complete([7, 7], [100, 100]), "trajectory 7 appears twice"),
    (lambda b: b.dispatch([3, 3], 0), "prompt 3 appears twice"),
    (lambda b: b.fail([100, 100]), "prompt 100 appears twice"),
    (lambda b: b.renew([100, 100], 1), "prompt 100 appears twice"),
])
def test_duplicate_ids_in_one_call_are_refused_naming_the_id(impl, call, match):
    buf = impl(8)
    buf.dispatch([100], 0)
    before = buf.ledger()
    with pytest.raises(ValueError, match=match):
        call(buf)
    assert buf.ledger() == before and len(buf) == 0


def test_unique_ids_refuses_an_id_already_ready(impl):
    buf = impl(8, unique_ids=True)
    buf.put([1, 2], 0)
    buf.dispatch([9], 0)
    before = buf.ledger()
    with pytest.raises(ValueError, match="trajectory 2 is already in the buffer and unique_ids=True"):
        buf.put([3, 2], 0)
    with pytest.raises(ValueError, match="trajectory 1 is already in the buffer"):
        buf.complete([1], [9])
    assert buf.ledger() == before
    buf.take(1, 0)  # 1 retires: its id may come back
    buf.complete([1], [9])
    assert sorted(buf.state_dict()["entries"]["traj_id"].tolist()) == [1, 2]


def test_without_unique_ids_an_id_may_be_ready_twice(impl):
    buf = impl(8)
    buf.put([1], 0)
    buf.put([1], 0)
    assert len(buf) == 2


def test_unique_ids_refuses_a_state_dict_holding_an_id_twice(impl):
    src = impl(8)
    src.put([1], 0)
    src.put([1], 0)
    dst = impl(8, unique_ids=True)
    dst.put([4], 0)
    with pytest.raises(ValueError, match="trajectory 1 is ready twice"):
        dst.load_state_dict(src.state_dict())
    assert len(dst) == 1
    src_ok = impl(8)
    src_ok.put([2], 0)
    dst.load_state_dict(src_ok.state_dict())
    dst.put([4], 0)  # 4 left with the old contents
    with pytest.raises(ValueError, match="trajectory 2 is already in the buffer"):
        dst.put([2], 0)

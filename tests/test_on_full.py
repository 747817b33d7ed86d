"""on_full: evict_oldest (counted), block (with timeout), error; all-or-nothing."""

import threading
import time

import pytest
from _helpers import assert_balanced

import pyfast_buffer as pfb


def test_evict_oldest_pushes_out_whole_groups_and_counts_them(impl):
    buf = impl(5, max_age=9)
    buf.put([1, 2], 0, group_ids=[1, 1])
    buf.put([3, 4], 0, group_ids=[2, 2])
    buf.put([5, 6], 0, group_ids=[3, 3])  # needs 1 slot: evicts group 1 whole
    led = assert_balanced(buf)
    assert led["evicted"] == 2 and len(buf) == 4
    batch = buf.take(4, 0)
    assert batch.traj_ids.tolist() == [3, 4, 5, 6]
    assert batch.metrics["buffer/evicted"] == 2  # reported once, by the next take
    assert buf.take(1, 0).metrics["buffer/evicted"] == 0


def test_evict_oldest_call_evicts_the_oldest_whole_groups_in_order_and_counts_them(impl):
    buf = impl(8, max_age=9, track_released=True)
    buf.put([1, 2], 0, group_ids=[1, 1])
    buf.put([3], 0)
    buf.put([4, 5, 6], 0, group_ids=[2, 2, 2])
    assert buf.evict_oldest(0) == 0 and len(buf) == 6
    assert buf.evict_oldest(2) == 3  # group 1 (two entries), then trajectory 3: whole groups, oldest first
    assert buf.released().ids.tolist() == [1, 2, 3]
    led = assert_balanced(buf)
    assert led["evicted"] == 3 and len(buf) == 3
    assert buf.evict_oldest(5) == 3 and len(buf) == 0  # more groups than held: all of them
    assert buf.evict_oldest() == 0
    buf.put([7], 0)
    assert buf.take(1, 0).metrics["buffer/evicted"] == 6  # reported once, by the next take
    with pytest.raises(ValueError, match="groups"):
        buf.evict_oldest(-1)


def test_error_raises_buffer_full_and_changes_nothing(impl):
    buf = impl(3, on_full="error")
    buf.put([1, 2], 0)
    buf.dispatch([9], 0)
    before = buf.ledger()
    with pytest.raises(pfb.BufferFullError, match="ring full: 2 entries do not fit"):
        buf.put([3, 4], 0)
    with pytest.raises(pfb.BufferFullError):
        buf.complete([3, 4], [9, 9])
    assert buf.ledger() == before and buf.in_flight == 1


@pytest.mark.parametrize("room_from", ["take", "evict_oldest"])
def test_block_waits_for_room_then_puts(impl, room_from):
    buf = impl(2, max_age=9, on_full="block")
    buf.put([1, 2], 0)
    done = threading.Event()

    def produce():
        buf.put([3], 0, timeout=10)
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    time.sleep(0.02)
    assert not done.is_set()
    if room_from == "take":
        assert buf.take(1, 0).traj_ids.tolist() == [1]
    else:  # an eviction on demand wakes the blocked put as a take does
        assert buf.evict_oldest(1) == 1
    producer.join(5)
    assert done.is_set()
    assert buf.take(2, 0).traj_ids.tolist() == [2, 3]
    assert assert_balanced(buf)["evicted"] == (room_from == "evict_oldest")


def test_block_times_out_naming_the_room_needed(impl):
    buf = impl(2, on_full="block")
    buf.put([1, 2], 0)
    with pytest.raises(TimeoutError, match="waiting for room: 1 entries need room, 2 of capacity=2"):
        buf.put([3], 0, timeout=0.02)
    with pytest.raises(pfb.BufferFullError, match="pass timeout="):
        buf.put([3], 0)  # no timeout: never blocks
    assert len(buf) == 2


def test_blocked_complete_revalidates_after_waiting(impl):
    buf = impl(1, on_full="block")
    buf.put([1], 0)
    buf.dispatch([5], 0)
    errors = []

    def produce():
        try:
            buf.complete([2], [5], timeout=10)
        except ValueError as exc:
            errors.append(exc)

    producer = threading.Thread(target=produce)
    producer.start()
    time.sleep(0.02)
    buf.fail([5])  # another thread fails the prompt while complete waits for room
    buf.take(1, 0)
    producer.join(5)
    assert errors and "not in flight" in str(errors[0])
    assert_balanced(buf)


def test_more_entries_than_capacity_is_a_value_error(impl):
    buf = impl(2)
    with pytest.raises(ValueError, match="exceed capacity=2"):
        buf.put([1, 2, 3], 0)
    assert buf.ledger()["put_total"] == 0

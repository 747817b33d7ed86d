"""put/take under drop: oldest first, stale entries dropped in the same walk, groups whole."""

import pytest
from _helpers import assert_balanced, rows

import pyfast_buffer as pfb


def test_take_returns_oldest_first_with_age_and_uses(impl):
    buf = impl(16, max_age=3)
    buf.put([10, 11, 12], 0)
    buf.put([13], 2)
    batch = buf.take(3, current_step=2)
    assert batch.traj_ids.tolist() == [10, 11, 12]
    assert batch.sample_step.tolist() == [0, 0, 0]
    assert batch.age.tolist() == [2, 2, 2]
    assert batch.uses.tolist() == [1, 1, 1]
    assert batch.metrics["buffer/taken"] == 3 and batch.metrics["buffer/buffer_left"] == 1
    assert assert_balanced(buf)["retired"] == 3


def test_drop_discards_stale_and_keeps_walking_to_fill_the_batch(impl):
    buf = impl(16, max_age=2)
    buf.put([1, 2, 3, 4], 0)  # age 5 at step 5: stale
    buf.put([5, 6, 7], 4)  # age 1: fresh
    batch = buf.take(2, current_step=5)
    assert batch.traj_ids.tolist() == [5, 6]
    assert batch.metrics["buffer/dropped_stale"] == 4
    assert batch.blocked_by == "none"
    led = assert_balanced(buf)
    assert led["dropped_stale"] == 4 and led["buffer_left"] == 1


def test_drop_boundary_is_age_greater_than_max_age(impl):
    buf = impl(8, max_age=3)
    buf.put([1], 0)
    buf.put([2], 1)
    batch = buf.take(8, current_step=4)  # ages 4 and 3
    assert batch.traj_ids.tolist() == [2]
    assert batch.metrics["buffer/dropped_stale"] == 1


def test_partial_batch_without_timeout_says_why(impl):
    buf = impl(8, max_age=3)
    buf.put([1, 2], 0)
    batch = buf.take(5, current_step=0)
    assert len(batch) == 2
    assert batch.blocked_by == "too_few_ready"
    empty = buf.take(5, current_step=0)
    assert len(empty) == 0 and empty.traj_ids.shape == (0,)


def test_stale_entries_beyond_a_full_batch_stay(impl):
    buf = impl(8, max_age=1)
    buf.put([1, 2], 3)
    buf.put([3], 0)  # out of order stamp, stale at step 3
    batch = buf.take(2, current_step=3)
    assert batch.traj_ids.tolist() == [1, 2]
    assert batch.metrics["buffer/dropped_stale"] == 0 and len(buf) == 1


def test_groups_are_taken_whole_and_never_split(impl):
    buf = impl(32, max_age=5)
    buf.put([1, 2, 3], 0, group_ids=[7, 7, 7])
    buf.put([4, 5, 6], 0, group_ids=[8, 8, 8])
    batch = buf.take(4, current_step=0)
    assert batch.traj_ids.tolist() == [1, 2, 3]
    assert batch.group_ids.tolist() == [7, 7, 7]
    assert batch.blocked_by == "none"  # full: the next group does not fit
    assert buf.take(6, current_step=0).traj_ids.tolist() == [4, 5, 6]


def test_group_members_are_gathered_in_first_appearance_order(impl):
    buf = impl(32, max_age=5)
    buf.put([1, 2, 3, 4], 0, group_ids=[5, 6, 5, 6])
    assert rows(buf.take(4, 0))[:2] == [[1, 3, 2, 4], [5, 5, 6, 6]]


def test_stale_group_is_dropped_whole(impl):
    buf = impl(32, max_age=1)
    buf.put([1, 2], [0, 0], group_ids=[9, 9])
    buf.put([3, 4], 2, group_ids=[8, 8])
    batch = buf.take(4, current_step=2)
    assert batch.traj_ids.tolist() == [3, 4]
    assert batch.metrics["buffer/dropped_stale"] == 2


def test_group_larger_than_batch_size_is_an_error_that_changes_nothing(impl):
    buf = impl(32, max_age=5)
    buf.put([1, 2, 3], 0, group_ids=[4, 4, 4])
    before = buf.ledger()
    with pytest.raises(ValueError, match=r"batch_size=2 .*raise batch_size to at least 3"):
        buf.take(2, current_step=0)
    assert buf.ledger() == before and len(buf) == 3


def test_per_entry_stamps_must_agree_within_a_group(impl):
    buf = impl(8)
    with pytest.raises(ValueError, match="group 4 has entries stamped 0 and 1"):
        buf.put([1, 2], [0, 1], group_ids=[4, 4])
    assert len(buf) == 0 and buf.ledger()["put_total"] == 0


def test_put_per_entry_stamps(impl):
    buf = impl(8, max_age=1)
    buf.put([1, 2, 3], [0, 2, 2])
    assert buf.take(8, 2).traj_ids.tolist() == [2, 3]


def test_policy_version_from_parameter_sync_step(impl):
    buf = impl(8, max_age=10, parameter_sync_step=4)
    buf.put([1], 7)
    buf.put([2], 8)
    assert buf.take(2, 8).policy_version.tolist() == [1, 2]
    plain = impl(8, max_age=10)
    plain.put([1], 7)
    assert plain.take(1, 8).policy_version.tolist() == [-1]


def test_returned_tensors_are_never_overwritten(impl):
    buf = impl(8, max_age=10)
    buf.put([1, 2], 0)
    first = buf.take(2, 0)
    kept = first.traj_ids.clone()
    buf.put([3, 4], 0)
    second = buf.take(2, 0)
    assert first.traj_ids.tolist() == kept.tolist() == [1, 2]
    assert second.traj_ids.tolist() == [3, 4]
    assert first.columns.data_ptr() != second.columns.data_ptr()


def test_batch_columns_are_contiguous_int64(impl):
    import torch

    buf = impl(8)
    buf.put([1, 2, 3], 0)
    batch = buf.take(8, 0)
    assert batch.columns.dtype == torch.int64 and batch.columns.is_contiguous()
    assert batch.columns.shape == (len(pfb.FIELDS), 3)
    moved = batch.to("cpu", non_blocking=True)
    assert moved.traj_ids.tolist() == [1, 2, 3] and moved.metrics is batch.metrics


def test_wall_clock_stamps_and_age_seconds(impl):
    import time

    buf = impl(8)
    before = time.time_ns()
    buf.put([1], 0)
    batch = buf.take(1, 0)
    assert before <= batch.dispatch_ns.item() <= batch.complete_ns.item() <= time.time_ns()
    assert 0 <= batch.age_seconds().item() < 60

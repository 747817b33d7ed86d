"""dispatch / complete / fail: in-flight prompts, groups and the prompt half of the ledger."""

import pytest
from _helpers import assert_balanced


def test_complete_moves_a_prompt_group_into_the_ring_with_its_dispatch_step(impl):
    buf = impl(16, max_age=4)
    buf.dispatch([100, 101], step=3)
    assert buf.in_flight == 2 and len(buf) == 0
    buf.complete([1, 2, 3], [100, 100, 100])
    assert buf.in_flight == 1 and len(buf) == 3
    batch = buf.take(3, current_step=5)
    assert batch.group_ids.tolist() == [100] * 3
    assert batch.sample_step.tolist() == [3] * 3 and batch.age.tolist() == [2] * 3
    led = assert_balanced(buf)
    assert (led["dispatched"], led["completed"], led["in_flight"]) == (2, 1, 1)


def test_fail_accounts_the_prompt_and_adds_nothing(impl):
    buf = impl(16)
    buf.dispatch([1, 2, 3], step=0)
    buf.fail([2])
    led = assert_balanced(buf)
    assert (led["failed"], led["in_flight"], led["buffer_left"]) == (1, 2, 0)


def test_complete_of_several_prompts_groups_each(impl):
    buf = impl(16, max_age=9)
    buf.dispatch([7], step=0)
    buf.dispatch([8], step=1)
    buf.complete([1, 2, 3, 4], [8, 7, 8, 7])
    batch = buf.take(4, 1)
    assert batch.traj_ids.tolist() == [1, 3, 2, 4]
    assert batch.sample_step.tolist() == [1, 1, 0, 0]
    assert buf.ledger()["completed"] == 2


def test_dispatch_stamp_is_kept_from_dispatch_to_completion(impl):
    buf = impl(16, max_age=9)
    buf.dispatch([5], step=0)
    buf.put([9], 2)
    buf.complete([1], [5])
    batch = buf.take(2, 2)
    # prompt 5 was dispatched before the put and completed after it
    assert batch.dispatch_ns[1] <= batch.dispatch_ns[0] <= batch.complete_ns[1]
    assert batch.sample_step.tolist() == [2, 0]


@pytest.mark.parametrize("call", ["complete", "fail"])
def test_finishing_a_prompt_not_in_flight_is_a_value_error(impl, call):
    buf = impl(16)
    buf.dispatch([1], 0)
    before = buf.ledger()
    with pytest.raises(ValueError, match="prompt 2 is not in flight"):
        buf.complete([5], [2]) if call == "complete" else buf.fail([2])
    assert buf.ledger() == before and buf.in_flight == 1


def test_dispatching_a_prompt_twice_is_a_value_error(impl):
    buf = impl(16)
    buf.dispatch([1], 0)
    with pytest.raises(ValueError, match="prompt 1 is already in flight"):
        buf.dispatch([2, 1], 0)
    with pytest.raises(ValueError, match="prompt 3 appears twice"):
        buf.dispatch([3, 3], 0)
    assert buf.in_flight == 1 and buf.ledger()["dispatched"] == 1


def test_a_completed_prompt_may_be_dispatched_again(impl):
    buf = impl(16)
    buf.dispatch([1], 0)
    buf.complete([1], [1])
    buf.dispatch([1], 1)
    assert buf.in_flight == 1


def test_empty_calls_change_nothing(impl):
    buf = impl(4)
    buf.dispatch([], 0)
    buf.complete([], [])
    buf.fail([])
    buf.put([], 0)
    assert buf.ledger()["dispatched"] == 0 and len(buf) == 0

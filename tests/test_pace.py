"""strategy="pace": admission at dispatch, the take gate, stalest first, nothing dropped, resume exact."""

import threading
import time

import pytest
from _helpers import assert_balanced

import pyfast_buffer as pfb


def paced(impl, max_age=2, per_step=2, lookahead=None, capacity=64, **kwargs):
    return impl(capacity, max_age=max_age, strategy="pace", prompts_per_step=per_step, lookahead=lookahead, **kwargs)


def test_pace_needs_prompts_per_step_and_refuses_it_elsewhere(impl):
    with pytest.raises(ValueError, match="prompts_per_step"):
        impl(8, strategy="pace")
    with pytest.raises(ValueError, match=r"prompts_per_step.*strategy='pace'"):
        impl(8, strategy="drop", prompts_per_step=4)
    with pytest.raises(ValueError, match=r"lookahead.*strategy='pace'"):
        impl(8, strategy="wait", lookahead=1)
    with pytest.raises(ValueError, match=r"lookahead=5.*max_age=2"):
        paced(impl, max_age=2, lookahead=5)
    with pytest.raises(ValueError, match="prompts_per_step"):
        paced(impl, per_step=0)
    with pytest.raises(ValueError, match=r"admissible.*strategy='pace'"):
        impl(8, strategy="drop").admissible(0)


def test_the_limit_is_lookahead_plus_one_steps_of_prompts(impl):
    assert paced(impl, max_age=2, per_step=2).admissible(0) == 6  # lookahead defaults to max_age
    assert paced(impl, max_age=4, per_step=3, lookahead=1).admissible(0) == 6
    assert paced(impl, max_age=0, per_step=5).admissible(0) == 5


def test_a_dispatch_that_does_not_fit_admits_nothing_and_names_the_counts(impl):
    buf = paced(impl, max_age=2, per_step=2)
    buf.dispatch([0, 1, 2, 3], step=0)
    buf.complete([10, 11], [0, 0])
    before = buf.ledger()
    with pytest.raises(
        pfb.AdmissionError, match=r"3 prompts.*limit.*6.*4 outstanding \(3 in flight, 1 ready\).*2 admissible"
    ):
        buf.dispatch([4, 5, 6], step=0)
    assert issubclass(pfb.AdmissionError, pfb.BufferFullError)
    after = buf.ledger()
    assert after["admission_refused"] == before["admission_refused"] + 3
    assert {k: v for k, v in after.items() if k != "admission_refused"} == {
        k: v for k, v in before.items() if k != "admission_refused"
    }
    assert buf.in_flight == 3 and buf.admissible(0) == 2
    buf.dispatch([4, 5], step=0)  # exactly the room left
    assert buf.admissible(0) == 0
    assert assert_balanced(buf)["admitted"] == 6


def test_a_call_larger_than_the_whole_limit_is_a_value_error(impl):
    buf = paced(impl, max_age=1, per_step=2)
    with pytest.raises(ValueError, match=r"5 prompts exceed the admission limit 4"):
        buf.dispatch([1, 2, 3, 4, 5], step=0, timeout=1)
    assert buf.ledger()["admission_refused"] == 0


def test_a_take_frees_slots_and_moves_the_deadlines(impl):
    buf = paced(impl, max_age=2, per_step=2)
    buf.dispatch(range(6), step=0)
    buf.complete([10, 11, 12, 13], [0, 0, 1, 1])
    assert len(buf.take(4, current_step=0)) == 4
    # The next take is at step 1: a prompt stamped 1 has 3 steps of slots (6), four groups are outstanding.
    assert buf.admissible(1) == 2
    # A lagged prompt stamped 0 is due at step 2: the trainer has 2 takes (4 slots) before it, all four in use.
    assert buf.admissible(0) == 0
    with pytest.raises(pfb.AdmissionError, match="step 0"):
        buf.dispatch([6], step=0)
    buf.dispatch([6, 7], step=1)


def test_a_prompt_stamped_past_its_deadline_is_refused_at_once_even_with_a_timeout(impl):
    buf = paced(impl, max_age=1, per_step=1)
    for step in range(3):
        buf.take(1, current_step=step)  # the next take is at step 3: a prompt stamped 1 would be 2 old
    start = time.monotonic()
    with pytest.raises(pfb.AdmissionError, match=r"stamped 1 would pass max_age=1.*next take at step 3.*step >= 2"):
        buf.dispatch([1], step=1, timeout=30)
    assert time.monotonic() - start < 10  # refused, not waited for
    assert buf.admissible(1) == 0 and buf.ledger()["admission_refused"] == 1
    buf.dispatch([1], step=2)


def test_pace_never_drops_and_takes_the_stalest_group_first(impl):
    buf = paced(impl, max_age=3, per_step=1)
    buf.dispatch([1], step=0)
    buf.take(1, current_step=0)
    buf.dispatch([2], step=1)
    buf.complete([20], [2])  # stamped 1, completes first
    buf.complete([10], [1])  # stamped 0, completes second
    batch = buf.take(1, current_step=3)
    assert batch.traj_ids.tolist() == [10] and batch.age.tolist() == [3]
    assert buf.take(1, current_step=3).traj_ids.tolist() == [20]
    assert buf.ledger()["dropped_stale"] == 0


def test_the_take_gate_waits_for_a_prompt_that_would_otherwise_pass_max_age(impl):
    # Three prompts stamped 0 with one training slot per step: after step 0 two remain, and they are due at
    # step 2; taking the newer group at step 1 would leave two due groups for one slot. wait would not block here.
    buf = paced(impl, max_age=2, per_step=1)
    buf.dispatch([0, 1, 2], step=0)
    buf.complete([100], [0])
    assert buf.take(1, current_step=0).traj_ids.tolist() == [100]
    buf.dispatch([3], step=1)
    buf.complete([130], [3])
    blocked = buf.take(1, current_step=1)
    assert len(blocked) == 0 and blocked.blocked_by == "in_flight_at_max_age"
    with pytest.raises(
        TimeoutError, match=r"under pace.*prompt 1 since step 0.*prompt 2 since step 0.*would pass max_age=2"
    ):
        buf.take(1, current_step=1, timeout=0.05)
    buf.complete([110], [1])
    assert buf.take(1, current_step=1).traj_ids.tolist() == [110]  # the stalest, not the newer 130
    assert buf.take(1, current_step=2).blocked_by == "in_flight_at_max_age"  # prompt 2 is due now
    buf.complete([120], [2])
    batch = buf.take(1, current_step=2)
    assert batch.traj_ids.tolist() == [120] and batch.age.tolist() == [2]
    led = assert_balanced(buf)
    assert led["dropped_stale"] == 0 and led["trained_over_age"] == 0


def test_a_blocking_dispatch_is_admitted_when_a_take_frees_room(impl):
    buf = paced(impl, max_age=1, per_step=2)
    buf.dispatch([0, 1, 2, 3], step=0)
    buf.complete([10, 11], [0, 1])
    done = {}

    def produce():  # stamped 1: the weights the trainer's take at step 0 is about to publish
        buf.dispatch([4, 5], step=1, timeout=10)
        done["at"] = time.monotonic()

    producer = threading.Thread(target=produce)
    producer.start()
    time.sleep(0.05)
    assert producer.is_alive()
    buf.take(2, current_step=0)
    producer.join(5)
    assert not producer.is_alive() and "at" in done
    led = assert_balanced(buf)
    assert led["admission_waits"] == 1 and led["admitted"] == 6 and led["admission_refused"] == 0


def test_a_blocking_dispatch_is_woken_by_fail_and_by_close(impl):
    buf = paced(impl, max_age=0, per_step=1)
    buf.dispatch([0], step=0)
    result = {}

    def produce(prompt):
        try:
            buf.dispatch([prompt], step=0, timeout=10)
            result[prompt] = "admitted"
        except pfb.BufferClosedError:
            result[prompt] = "closed"

    first = threading.Thread(target=produce, args=(1,))
    first.start()
    time.sleep(0.05)
    buf.fail([0])
    first.join(5)
    assert result[1] == "admitted"
    second = threading.Thread(target=produce, args=(2,))
    second.start()
    time.sleep(0.05)
    buf.close()
    second.join(5)
    assert result[2] == "closed"


def test_a_blocking_dispatch_times_out_naming_the_limit(impl):
    buf = paced(impl, max_age=0, per_step=1)
    buf.dispatch([0], step=0)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"dispatch timed out after 0.05 s.*limit.*1 outstanding"):
        buf.dispatch([1], step=0, timeout=0.05)
    assert time.monotonic() - start < 5
    led = buf.ledger()
    assert led["admission_waits"] == 1 and led["admission_refused"] == 1 and buf.in_flight == 1


def test_put_is_admitted_like_a_dispatch(impl):
    buf = paced(impl, max_age=0, per_step=2)
    buf.put([1, 2], 0, group_ids=[7, 7])
    buf.put([3], 0)
    with pytest.raises(pfb.AdmissionError):
        buf.put([4, 5], 0, group_ids=[8, 9])
    assert len(buf) == 3 and buf.ledger()["admitted"] == 2


def test_reuse_retires_early_and_a_lowered_max_age_is_trained_and_counted_not_dropped(impl):
    buf = paced(impl, max_age=3, per_step=1, max_uses=2)
    buf.dispatch([1, 2], step=0)
    buf.complete([10], [1])
    assert buf.take(1, current_step=0).traj_ids.tolist() == [10]  # its only use: under pace it retires now
    assert assert_balanced(buf)["retired_early"] == 1
    buf.complete([20], [2])
    buf.max_age = 0
    batch = buf.take(1, current_step=2)  # first use, age 2 > max_age 0: trained (pace never drops), counted
    assert batch.traj_ids.tolist() == [20] and batch.age.tolist() == [2]
    led = assert_balanced(buf)
    assert led["dropped_stale"] == 0 and led["trained_over_age"] == 1
    assert batch.metrics[pfb.batch.metric_key("trained_over_age")] == 1


def test_resume_keeps_the_admission_state_exactly(impl, tmp_path):
    buf = paced(impl, max_age=3, per_step=2)
    buf.dispatch(range(8), step=0)
    buf.complete([10, 11, 12], [0, 1, 2])
    buf.take(2, current_step=0)
    buf.dispatch([8], step=1)
    with pytest.raises(pfb.AdmissionError):
        buf.dispatch(range(20, 23), step=1)
    path = tmp_path / "paced.pt"
    buf.save(path)
    admissible, ledger = [buf.admissible(s) for s in range(5)], buf.ledger()
    assert admissible == [0, 1, 1, 1, 1]
    for cls in (pfb.StalenessBuffer, pfb.ReferenceBuffer):
        fresh = paced(cls, max_age=3, per_step=2)
        fresh.load(path, in_flight="keep")
        assert [fresh.admissible(s) for s in range(5)] == admissible
        assert fresh.ledger() == ledger
        assert fresh.take(2, current_step=3).blocked_by == "in_flight_at_max_age"  # six prompts stamped <= 1


def test_the_counters_are_in_the_metrics_and_the_log_line(impl, caplog):
    buf = paced(impl, max_age=0, per_step=1)
    buf.dispatch([0], step=0)
    with pytest.raises(pfb.AdmissionError):
        buf.dispatch([1], step=0)
    buf.complete([10], [0])
    with caplog.at_level("INFO", logger="pyfast_buffer"):
        batch = buf.take(1, current_step=0)
    m = batch.metrics
    key = pfb.batch.metric_key
    assert m[key("admitted")] == 1 and m[key("admission_refused")] == 1 and m[key("admission_waits")] == 0
    assert m[key("trained_over_age")] == 0
    assert all(isinstance(v, (int, float)) for v in m.values())
    line = caplog.records[-1].getMessage()
    assert "admitted=1" in line and "admission_refused=1" in line and "trained_over_age=0" in line

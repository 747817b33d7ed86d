"""Version spans: finish_step on complete and put, the batch's finish_step and span, age_from, checkpoints."""

import pytest
from _helpers import assert_balanced

import pyfast_buffer as pfb


def test_finish_step_defaults_to_the_dispatch_step(impl):
    buf = impl(16, max_age=5)
    buf.dispatch([1], step=2)
    buf.complete([10, 11], [1, 1])
    batch = buf.take(2, current_step=3)
    assert batch.finish_step.tolist() == [2, 2] and batch.span.tolist() == [0, 0]
    assert batch.metrics[pfb.batch.metric_key("span_mean")] == 0.0


def test_one_finish_step_per_trajectory_gives_each_its_span(impl):
    buf = impl(16, max_age=5)
    buf.dispatch([1, 2], step=2)
    buf.complete([10, 11, 20], [1, 1, 2], finish_step=[2, 4, 3])
    batch = buf.take(3, current_step=4)
    assert batch.traj_ids.tolist() == [10, 11, 20]
    assert batch.sample_step.tolist() == [2, 2, 2]
    assert batch.finish_step.tolist() == [2, 4, 3] and batch.span.tolist() == [0, 2, 1]
    assert batch.age.tolist() == [2, 2, 2]  # age_from="start": measured from the dispatch step
    key = pfb.batch.metric_key
    assert batch.metrics[key("span_mean")] == 1.0 and batch.metrics[key("span_max")] == 2


def test_a_finish_step_before_the_dispatch_step_is_refused(impl):
    buf = impl(16, max_age=5)
    buf.dispatch([1], step=3)
    before = buf.ledger()
    with pytest.raises(ValueError, match=r"finish_step=2.*before step 3, the stamp of prompt"):
        buf.complete([10], [1], finish_step=2)
    with pytest.raises(ValueError, match=r"finish_step has 2 stamps for 1 trajectories"):
        buf.complete([10], [1], finish_step=[3, 4])
    assert buf.ledger() == before and buf.in_flight == 1


def test_complete_keeps_its_positional_timeout(impl):
    buf = impl(16, max_age=5)
    buf.dispatch([1], step=0)
    buf.complete([10], [1], 1.0)  # (traj_ids, prompt_ids, timeout) as before spans existed
    assert len(buf) == 1


def test_age_from_finish_measures_age_from_the_finish_step(impl):
    buf = impl(16, max_age=1, age_from="finish")
    buf.dispatch([1, 2], step=0)
    buf.complete([10], [1], finish_step=3)
    buf.complete([20], [2], finish_step=0)
    batch = buf.take(2, current_step=4)  # 20 is 4 steps from its finish: dropped; 10 is 1 step from its finish
    assert batch.traj_ids.tolist() == [10] and batch.age.tolist() == [1] and batch.span.tolist() == [3]
    assert buf.ledger()["dropped_stale"] == 1


def test_age_from_finish_needs_one_finish_step_per_group(impl):
    buf = impl(16, max_age=1, age_from="finish")
    buf.dispatch([1], step=0)
    with pytest.raises(ValueError, match=r"age_from='finish'.*group 1.*finish_step 1 and 2"):
        buf.complete([10, 11], [1, 1], finish_step=[1, 2])
    with pytest.raises(ValueError, match="age_from"):
        impl(16, age_from="middle")


def test_put_accepts_finish_step(impl):
    buf = impl(16, max_age=5)
    buf.put([1, 2], 1, finish_step=[1, 3])
    batch = buf.take(2, current_step=3)
    assert batch.finish_step.tolist() == [1, 3] and batch.span.tolist() == [0, 2]
    with pytest.raises(ValueError, match="finish_step"):
        buf.put([3], 2, finish_step=1)


def test_pace_with_age_from_finish_sorts_by_the_finish_step(impl):
    buf = impl(16, max_age=3, strategy="pace", prompts_per_step=2, age_from="finish")
    buf.dispatch([1, 2], step=0)
    buf.complete([10], [1], finish_step=2)
    buf.complete([20], [2], finish_step=1)
    assert buf.take(2, current_step=2).traj_ids.tolist() == [20, 10]


def test_spans_survive_a_checkpoint(impl, tmp_path):
    buf = impl(16, max_age=5)
    buf.dispatch([1], step=1)
    buf.complete([10, 11], [1, 1], finish_step=[2, 3])
    path = tmp_path / "spans.pt"
    buf.save(path)
    for cls in (pfb.StalenessBuffer, pfb.ReferenceBuffer):
        fresh = cls(16, max_age=5)
        fresh.load(path)
        batch = fresh.take(2, current_step=3)
        assert batch.finish_step.tolist() == [2, 3] and batch.span.tolist() == [1, 2]
        assert_balanced(fresh)

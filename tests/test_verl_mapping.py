"""Staleness formulas against verl's.

verl's replay buffers today measure staleness as ``global_steps - step + 1`` against
``max_off_policy_threshold``, with no ``parameter_sync_step`` in the span; ``StalenessBuffer.from_verl``
and the verl sampler (pyfast_buffer.integrations.verl) both follow that. Checked here against the
formulas written out, for several ``parameter_sync_step`` values, which must not move the cutoff.
"""

import pytest

import pyfast_buffer as pfb
from pyfast_buffer.config import config_from_verl, max_age_from_threshold


def verl_drops(age, threshold):
    """verl's eviction rule for a finished group: global_steps - step + 1 > threshold."""
    return age + 1 > threshold


def verl_waits(age, threshold):
    """verl's wait rule for an in-flight prompt: global_steps - step + 1 >= threshold."""
    return age + 1 >= threshold


@pytest.mark.parametrize("sync", [1, 2, 3, 4])
@pytest.mark.parametrize("threshold", range(1, 11))
def test_drop_and_wait_decisions_equal_verls_formulas(impl, threshold, sync):
    ages = range(0, threshold * sync + 3)
    drop = impl.from_verl(
        {"max_off_policy_threshold": threshold, "max_off_policy_strategy": "drop"},
        {"parameter_sync_step": sync},
        capacity=len(ages),
    )
    assert drop.config.max_age == threshold - 1
    now = max(ages)
    for age in ages:
        drop.put([age], now - age)
    kept = set(drop.take(len(ages), now).age.tolist())
    assert kept == {a for a in ages if not verl_drops(a, threshold)}

    for age in ages:
        wait = impl.from_verl(
            {"max_off_policy_threshold": threshold, "max_off_policy_strategy": "wait"},
            {"parameter_sync_step": sync},
            capacity=4,
        )
        wait.dispatch([1], step=now - age)
        wait.put([7], now)
        blocked = wait.take(1, now).blocked_by == "in_flight_at_max_age"
        assert blocked == verl_waits(age, threshold), (age, threshold, sync)


def test_verl_defaults_and_missing_parameter_sync_step():
    kwargs = config_from_verl({}, {})
    assert kwargs["max_age"] == 8 - 1 and kwargs["strategy"] == "drop"
    assert config_from_verl({"sampler_kwargs": {"capacity": 123}}, None)["capacity"] == 123


def test_verl_config_objects_with_attributes():
    class Cfg:
        max_off_policy_threshold = 2
        max_off_policy_strategy = "wait"

    class Trainer:
        parameter_sync_step = 3

    buf = pfb.StalenessBuffer.from_verl(Cfg(), Trainer(), capacity=8)
    assert (buf.config.max_age, buf.config.strategy, buf.config.parameter_sync_step) == (1, "wait", 1)


@pytest.mark.parametrize(
    "sampler, trainer, error, match",
    [
        ({"max_off_policy_threshold": 0}, {}, ValueError, "max_off_policy_threshold=0 must be >= 1"),
        ({"max_off_policy_threshold": -2}, {}, ValueError, "max_off_policy_threshold=-2"),
        ({"max_off_policy_threshold": 2.5}, {}, TypeError, "max_off_policy_threshold=2.5 is not an int"),
        ({"max_off_policy_threshold": True}, {}, TypeError, "max_off_policy_threshold=True"),
        ({}, {"parameter_sync_step": 0}, ValueError, "parameter_sync_step=0 must be an int >= 1"),
        ({}, {"parameter_sync_step": -1}, ValueError, "parameter_sync_step=-1"),
        ({"max_off_policy_strategy": "skip"}, {}, ValueError, "max_off_policy_strategy='skip' is unknown"),
    ],
)
def test_bad_verl_settings(impl, sampler, trainer, error, match):
    with pytest.raises(error, match=match):
        impl.from_verl(sampler, trainer)


def test_max_age_from_threshold_checks_its_arguments():
    assert max_age_from_threshold(8) == 7
    with pytest.raises(ValueError, match="max_off_policy_threshold=0"):
        max_age_from_threshold(0)


def test_tag_without_global_steps_is_a_clear_value_error():
    assert pfb.sample_step_from_tag({"global_steps": 4, "status": "finished"}) == 4
    with pytest.raises(ValueError, match="has no 'global_steps'; stamp global_steps"):
        pfb.sample_step_from_tag({"status": "finished"})
    with pytest.raises(ValueError, match="global_steps'\\]=-1 is negative"):
        pfb.sample_step_from_tag({"global_steps": -1})
    with pytest.raises(TypeError, match="not a mapping"):
        pfb.sample_step_from_tag(3)


def today_verl_drops(global_steps, step, threshold):
    """verl's async drop rule today (finished groups): global_steps - step + 1 > threshold."""
    return global_steps - step + 1 > threshold


def today_verl_blocks(global_steps, step, threshold):
    """verl's async wait rule today (in-flight prompts): global_steps - step + 1 >= threshold."""
    return global_steps - step + 1 >= threshold


@pytest.mark.parametrize("threshold", range(1, 11))
def test_verl_sampler_cut_and_wait_gate_equal_todays_verl(threshold):
    pytest.importorskip("transfer_queue", reason="the verl extra is not installed: pip install '.[verl]'")
    verl = pytest.importorskip("pyfast_buffer.integrations.verl", reason="the verl extra is not installed")
    now = 14
    steps = range(0, now + 3)  # includes prompts stamped ahead of the trainer, as verl's tests write them
    finished = {f"f{s}": {"is_prompt": True, "status": "finished", "global_steps": s} for s in steps}
    running = {f"r{s}": {"is_prompt": True, "status": "running", "global_steps": s} for s in steps}
    for strategy in ("drop", "wait"):
        rb = verl.FastReplayBuffer("separate_async", {}, threshold, strategy, {})
        rb._apply_listing("train", {**finished, **running})  # a listing applied without TransferQueue
        stale = rb._stale_groups(now, "train")
        blocking = set(rb._blocked_by_wait(now, "train"))
        if strategy == "drop":
            assert stale == {f"f{s}" for s in steps if today_verl_drops(now, s, threshold)} and not blocking
        else:
            assert blocking == {f"r{s}" for s in steps if today_verl_blocks(now, s, threshold)} and not stale
    sync = verl.FastReplayBuffer("sync", {}, threshold, "drop", {})
    sync._apply_listing("train", {**finished, **running})
    assert not sync._stale_groups(now, "train") and not sync._blocked_by_wait(now, "train")


def test_pace_from_verl_needs_the_prompts_per_step_and_builds_a_paced_buffer(impl):
    with pytest.raises(ValueError, match=r"pace.*needs the prompt groups one trainer step takes.*prompts_per_step"):
        config_from_verl({"max_off_policy_strategy": "pace"}, {})
    sampler = {
        "max_off_policy_threshold": 3,
        "max_off_policy_strategy": "pace",
        "sampler_kwargs": {"prompts_per_step": 4},
    }
    buf = impl.from_verl(sampler, {}, capacity=64)
    assert (buf.config.strategy, buf.config.max_age, buf.config.prompts_per_step) == ("pace", 2, 4)
    assert buf.admissible(0) == (2 + 1) * 4  # lookahead defaults to max_age
    assert impl.from_verl({**sampler, "sampler_kwargs": {}}, {}, capacity=64, prompts_per_step=2).admissible(0) == 6


def test_a_null_threshold_is_refused_by_from_verl_unless_max_age_is_given(impl):
    # verl 0.9.1: max_off_policy_threshold: null turns staleness control off; a buffer always has a bound.
    with pytest.raises(ValueError, match=r"max_off_policy_threshold=null turns verl's staleness control off.*max_age="):
        impl.from_verl({"max_off_policy_threshold": None}, {})
    assert impl.from_verl({"max_off_policy_threshold": None}, {}, capacity=8, max_age=3).config.max_age == 3
    assert impl.from_verl({}, {}, capacity=8).config.max_age == 7  # absent (not null): verl's default 8

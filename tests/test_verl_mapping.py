"""from_verl: threshold * parameter_sync_step - 1, proven equal to verl's own formulas."""

import pytest

import pyfast_buffer as pfb
from pyfast_buffer.config import config_from_verl, max_age_from_threshold


def verl_drops(age, threshold, sync):
    """verl's drop rule: (age + 1) / parameter_sync_step > threshold (true division, as in verl)."""
    return (age + 1) / sync > threshold


def verl_waits(age, threshold, sync):
    """verl's wait rule for an in-flight prompt: (age + 1) / parameter_sync_step >= threshold."""
    return (age + 1) / sync >= threshold


@pytest.mark.parametrize("sync", [1, 2, 3, 4])
@pytest.mark.parametrize("threshold", range(1, 11))
def test_drop_and_wait_decisions_equal_verls_formulas(impl, threshold, sync):
    ages = range(0, threshold * sync + 3)
    drop = impl.from_verl({"max_off_policy_threshold": threshold, "max_off_policy_strategy": "drop"},
                          {"parameter_sync_step": sync}, capacity=len(ages))
    assert drop.config.max_age == threshold * sync - 1
    now = max(ages)
    for age in ages:
        drop.put([age], now - age)
    kept = set(drop.take(len(ages), now).age.tolist())
    assert kept == {a for a in ages if not verl_drops(a, threshold, sync)}

    for age in ages:
        wait = impl.from_verl({"max_off_policy_threshold": threshold, "max_off_policy_strategy": "wait"},
                              {"parameter_sync_step": sync}, capacity=4)
        wait.dispatch([1], step=now - age)
        wait.put([7], now)
        blocked = wait.take(1, now).blocked_by == "in_flight_at_max_age"
        assert blocked == verl_waits(age, threshold, sync), (age, threshold, sync)


def test_verl_defaults_and_missing_parameter_sync_step():
    kwargs = config_from_verl({}, {})
    assert kwargs["max_age"] == 8 * 1 - 1 and kwargs["strategy"] == "drop"
    assert config_from_verl({"sampler_kwargs": {"capacity": 123}}, None)["capacity"] == 123


def test_verl_config_objects_with_attributes():
    class Cfg:
        max_off_policy_threshold = 2
        max_off_policy_strategy = "wait"

    class Trainer:
        parameter_sync_step = 3

    buf = pfb.StalenessBuffer.from_verl(Cfg(), Trainer(), capacity=8)
    assert (buf.config.max_age, buf.config.strategy, buf.config.parameter_sync_step) == (5, "wait", 3)


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
    assert max_age_from_threshold(8, 2) == 15
    with pytest.raises(ValueError, match="parameter_sync_step=0"):
        max_age_from_threshold(8, 0)


def test_tag_without_global_steps_is_a_clear_value_error():
    assert pfb.sample_step_from_tag({"global_steps": 4, "status": "finished"}) == 4
    with pytest.raises(ValueError, match="has no 'global_steps'; stamp global_steps"):
        pfb.sample_step_from_tag({"status": "finished"})
    with pytest.raises(ValueError, match="global_steps'\\]=-1 is negative"):
        pfb.sample_step_from_tag({"global_steps": -1})
    with pytest.raises(TypeError, match="not a mapping"):
        pfb.sample_step_from_tag(3)

"""The asynchrony is real: rollout weights trail the trainer by the lag, trained data is at least
``lag`` steps old, drop arms train on full batches, and the report's thresholds are explicit."""

import pytest
from _experiment_helpers import rows, tiny_run

from pyfast_buffer.experiment import preset, report

ARMS = preset("tiny").arms
CFG = preset("tiny").config


@pytest.mark.parametrize("arm", ARMS, ids=lambda a: a.name)
def test_rollout_weights_are_the_previous_trainer_step_minus_lag(arm):
    assert CFG.parameter_sync_step == 1  # the identity below assumes a push every trainer step
    ticks = rows(tiny_run(), "tick", arm)
    previous = 0  # trainer step at the end of the previous sampling step
    for r in ticks:
        assert r["weights_step"] == max(0, previous - arm.lag), r["tick"]
        previous = r["step"]
    assert previous > arm.lag  # the trainer really moved ahead of the rollout weights


@pytest.mark.parametrize("arm", ARMS, ids=lambda a: a.name)
def test_first_use_age_is_at_least_the_lag_after_warm_up(arm):
    steps = [r for r in rows(tiny_run(), "step", arm) if r["step"] >= arm.lag]
    ages = [r["age_min_first_use"] for r in steps if r["age_min_first_use"] is not None]
    assert ages and min(ages) >= arm.lag


@pytest.mark.parametrize("arm", [a for a in ARMS if a.strategy == "drop"], ids=lambda a: a.name)
def test_drop_arms_always_train_on_a_full_batch(arm):
    steps = rows(tiny_run(), "step", arm)
    assert steps and all(r["batch_size"] == CFG.batch_size for r in steps)
    dropped_before = sum(r["dropped_stale_before_take"] for r in rows(tiny_run(), "tick", arm))
    if arm.reuse > 1:
        assert dropped_before > 0  # stale entries were dropped before the take, not inside it


def test_wait_arm_reports_age_past_max_age():
    result = tiny_run()
    wait = next(s for s in result.summaries if s["strategy"] == "wait")
    assert wait["age_max"] > wait["max_age"]  # wait trains ready entries past max_age (library contract)
    assert f"past max_age {wait['max_age']}" in result.report
    assert "age max" in result.table and "!" in result.table


def _summary(**kw):
    base = {
        "reuse": 1,
        "strategy": "drop",
        "max_age": 4,
        "lag": 1,
        "loss_first_fresh": 0.0,
        "loss_last_fresh": 0.0,
        "sample_reward_first": 0.1,
        "sample_reward_last": 0.5,
        "entropy_half_tick": 100,
        "entropy_half_step": 100,
        "clip_frac_late": 0.05,
    }
    return {**base, **kw}


def test_loss_sign_needs_a_within_arm_fall_not_a_lower_level():
    base = _summary()
    # lower loss level throughout (as reuse passes give), flat trend, reward rose less: no sign
    level = _summary(reuse=4, loss_first_fresh=-0.5, loss_last_fresh=-0.5, sample_reward_last=0.3)
    assert not any("loss falls" in line for line in report.signs(level, base))
    falls = _summary(reuse=4, loss_first_fresh=0.0, loss_last_fresh=-0.1, sample_reward_last=0.3)
    lines = [line for line in report.signs(falls, base) if "loss falls" in line]
    assert lines and f"{report.LOSS_MARGIN}" in lines[0] and f"{report.REWARD_MARGIN}" in lines[0]
    rises = _summary(reuse=4, loss_first_fresh=0.0, loss_last_fresh=-0.1, sample_reward_last=0.8)
    assert not any("loss falls" in line for line in report.signs(rises, base))


def test_entropy_sign_must_hold_per_trainer_step_too():
    base = _summary()
    per_tick_only = _summary(reuse=4, entropy_half_tick=40, entropy_half_step=120)
    lines = report.signs(per_tick_only, base)
    assert not any(line.startswith("entropy falls faster") for line in lines)
    assert any("per sampling step only" in line for line in lines)
    both = _summary(reuse=4, entropy_half_tick=40, entropy_half_step=60)
    assert any(line.startswith("entropy falls faster") and "80%" in line for line in report.signs(both, base))

"""The experiment's pace arms: the producer generates only what admission lets in, and nothing trains stale."""

from dataclasses import replace

from _experiment_helpers import fresh_dir, ledger_of

from pyfast_buffer.experiment import ArmConfig, preset, run_experiment


def test_a_pace_arm_trains_nothing_past_max_age_and_drops_nothing():
    p = preset("tiny")
    arm = ArmConfig(reuse=1, strategy="pace", max_age=2, lag=1)
    result = run_experiment(replace(p.config, ticks=40), [arm], fresh_dir(), make_figure=False, say=None)
    steps = [r for r in result.records if r["kind"] == "step" and r["arm"] == arm.name]
    assert steps, "the pace arm trained"
    assert max(r["age_max"] for r in steps) <= arm.max_age
    last = ledger_of(steps[-1])
    assert last["dropped_stale"] == 0 and last["trained_over_age"] == 0
    assert last["admitted"] == last["dispatched"] > 0

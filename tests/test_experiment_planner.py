"""The rhythm planner's predicted FIFO age distribution against the ages the experiment measures at the same rates.

Tolerance: total variation distance <= 0.05 and mean ages within 0.1 trainer steps, in steady state (the second
half of the sampling steps). The planner simulates a finite window, so a rhythm whose period does not divide it
(sync 3 below) leaves a small residue (measured 0.017); a periodic one agrees exactly.
"""

from dataclasses import replace

import pytest
from _experiment_helpers import fresh_dir

from pyfast_buffer.experiment import preset, run_experiment
from pyfast_buffer.experiment.planner_check import compare, render

TV_TOLERANCE = 0.05
MEAN_TOLERANCE = 0.1


@pytest.mark.parametrize(
    "overrides", [{}, {"prompts_per_tick": 5, "capacity": 200, "parameter_sync_step": 3}], ids=["fifo-preset", "sync3"]
)
def test_planner_matches_measured_ages_in_the_fifo_steady_state(overrides):
    p = preset("fifo")
    cfg = replace(p.config, **overrides)
    arm = p.arms[1]  # lag 1: the constant latency the planner adds
    result = run_experiment(cfg, [arm], fresh_dir(), make_figure=False, say=None)
    check = compare(result.records, cfg, arm, seed=cfg.seed)
    assert check is not None and check["buffer_full_share"] == 1.0  # the planner's assumption holds here
    assert len(check["measured"]) >= 3  # a real distribution, not one age
    assert check["tv_distance"] <= TV_TOLERANCE, check
    assert abs(check["planned_mean"] - check["measured_mean"]) <= MEAN_TOLERANCE, check
    assert result.planner == [check]
    assert "Rhythm planner (rhythm.plan) vs measured" in result.report
    lines = render([check])
    assert any(line.strip().startswith("planned") for line in lines)
    assert any(line.strip().startswith("measured") for line in lines)


def test_planner_is_not_compared_for_reuse_above_one():
    p = preset("fifo")
    arm = replace(p.arms[0], reuse=2)
    result = run_experiment(replace(p.config, ticks=8), [arm], fresh_dir(), make_figure=False, say=None)
    assert compare(result.records, p.config, arm) is None
    assert "no reuse-1 arm ran" in result.report

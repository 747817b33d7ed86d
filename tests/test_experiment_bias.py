"""The bias study: the rollout-cost model, requeued prompts, and the per-arm numbers of --preset bias-tiny."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import torch
from _experiment_helpers import fresh_dir
from scipy import stats

from pyfast_buffer.experiment import preset
from pyfast_buffer.experiment.aggregate import BIAS_METRICS
from pyfast_buffer.experiment.rollout_cost import RolloutCost, ks_statistic
from pyfast_buffer.experiment.summary import BIAS_KEYS
from pyfast_buffer.experiment.task import DigitSumTask


def _cost(seed=3):
    return RolloutCost(
        seed, digits=10, base_tokens=32, length_sigma=0.6, tokens_per_tick=64.0, max_latency=12, fail_prob=0.02
    )


def test_the_rollout_cost_is_deterministic_per_seed_and_grows_with_difficulty():
    prompts = DigitSumTask(10, 2).sample_prompts(4000, torch.Generator().manual_seed(1))
    a, b, other = _cost().cost(prompts), _cost().cost(prompts), _cost(4).cost(prompts)
    assert a == b and a != other
    difficulty = np.array([c[0] for c in a])
    length = np.array([c[1] for c in a])
    delay = np.array([c[2] if c[2] is not None else -1 for c in a])
    hard, easy = difficulty >= 0.75, difficulty <= 0.25
    assert length[hard].mean() > 2 * length[easy].mean()  # (1 + 3d): about 3.3x on average
    done = delay >= 0
    assert delay[hard & done].mean() > delay[easy & done].mean()
    assert (delay[done] == np.minimum(12, length[done] // 64)).all()
    assert np.quantile(length, 0.99) > 3 * np.median(length)  # heavy-tailed
    assert 0.005 < (delay < 0).mean() < 0.04  # fail_prob 0.02


def test_ks_statistic_is_scipys():
    rng = np.random.default_rng(2)
    x, y = rng.lognormal(size=300), rng.lognormal(0.3, size=200)
    assert ks_statistic(x, y) == stats.ks_2samp(x, y, method="asymp").statistic
    assert ks_statistic(x, []) is None


@functools.cache
def _bias_tiny():
    out = fresh_dir()
    cmd = [sys.executable, "-m", "pyfast_buffer", "experiment", "--preset", "bias-tiny", "--out", out, "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=out)
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        return json.load(f), out


def test_preset_bias_tiny_writes_every_bias_number_with_intervals():
    summary, out = _bias_tiny()
    p = preset("bias-tiny")
    assert summary["seeds"] == list(p.seeds) and len(summary["runs"]) == len(p.seeds) * len(p.arms)
    for run in summary["runs"]:
        assert set(BIAS_KEYS) <= set(run), sorted(set(BIAS_KEYS) - set(run))
        assert run["reconciled"], run["arm"]
        assert 0 <= run["idle_share"] <= 1 and 0 <= run["wasted_share"] <= 1
    for row in summary["aggregate"]:
        for key, _, _ in BIAS_METRICS:
            mean, low, high = row[key]
            assert low <= mean <= high, (row["arm"], key)
    # The figure needs the demo extra (matplotlib); without it the run says so and writes none.
    assert os.path.exists(os.path.join(out, "figure.png")) == (importlib.util.find_spec("matplotlib") is not None)
    with open(os.path.join(out, "report.txt"), encoding="utf-8") as f:
        assert "length KS" in f.read()


def test_drop_requeues_lost_prompts_and_max_attempts_protects_the_second_attempt():
    summary, _ = _bias_tiny()
    runs = {(r["arm"], r["seed"]): r for r in summary["runs"]}
    for seed in preset("bias-tiny").seeds:
        drop = runs[("reuse1-drop-age2-lag1", seed)]
        capped = runs[("reuse1-drop-att2-age2-lag1", seed)]
        assert drop["regenerations_per_prompt"] > 0 and drop["ledger"]["dropped_stale"] > 0
        assert drop["protected_groups"] == 0 and capped["protected_groups"] > 0
        assert drop["max_attempts"] is None and capped["max_attempts"] == 2

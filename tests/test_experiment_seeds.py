"""Many seeds: the same records serially and in worker processes, per-seed and aggregate files, the figure, and
an adaptive arm whose max_age really moves inside its bounds."""

import json
import os

from _experiment_helpers import SEEDED_ARMS, seeded_run

from pyfast_buffer.experiment import preset


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def test_serial_and_parallel_runs_give_identical_records_and_summaries():
    serial, parallel = seeded_run(1), seeded_run(2)
    assert _read(serial.files["jsonl"]) == _read(parallel.files["jsonl"])
    assert _read(serial.files["summary.jsonl"]) == _read(parallel.files["summary.jsonl"])
    # and the two seeds are really different runs
    arm = SEEDED_ARMS[0].name
    first = [r for r in serial.records if r["seed"] == 0 and r["kind"] == "tick" and r["arm"] == arm]
    second = [r for r in serial.records if r["seed"] == 1 and r["kind"] == "tick" and r["arm"] == arm]
    assert len(first) == len(second) == 16
    assert [r["sample_reward"] for r in first] != [r["sample_reward"] for r in second]


def test_summary_files_keep_every_seed_and_the_aggregate_with_intervals():
    result = seeded_run(1)
    rows = [json.loads(line) for line in _read(result.files["summary.jsonl"]).decode().splitlines()]
    runs = [r for r in rows if r["kind"] == "run"]
    aggregate = [r for r in rows if r["kind"] == "aggregate"]
    assert sorted((r["seed"], r["arm"]) for r in runs) == sorted((s, a.name) for s in (0, 1) for a in SEEDED_ARMS)
    assert [r["arm"] for r in aggregate] == [a.name for a in SEEDED_ARMS]
    for row in aggregate:
        per_seed = [r["sample_reward_last"] for r in runs if r["arm"] == row["arm"]]
        assert row["sample_reward_last_mean"] == sum(per_seed) / 2
        assert min(per_seed) <= row["sample_reward_last_low"] <= row["sample_reward_last_high"] <= max(per_seed)
    header = _read(result.files["summary.csv"]).decode().splitlines()[0]
    assert "approx_kl_late_low" in header and "drop_share_high" in header and "ledger/dropped_stale" in header
    assert "95% percentile-bootstrap interval" in result.report and "Differences" in result.report
    assert "last-20% sampled reward" in result.table
    if "figure" in result.files:
        assert _read(result.files["figure"])[:8] == b"\x89PNG\r\n\x1a\n"


def test_adaptive_arm_moves_max_age_within_bounds_and_drop_respects_it():
    cfg = preset("tiny").config
    result = seeded_run(1)
    arm = SEEDED_ARMS[1]
    for seed in (0, 1):
        steps = [r for r in result.records if r["kind"] == "step" and r["arm"] == arm.name and r["seed"] == seed]
        bounds = [r["max_age"] for r in steps]
        assert set(bounds) <= set(range(cfg.adaptive_min_age, cfg.adaptive_max_age + 1))
        changes = sum(1 for a, b in zip(bounds, bounds[1:]) if a != b)
        assert changes > 0, bounds
        assert all(r["age_max"] <= r["max_age"] for r in steps)  # drop: nothing older than the bound in force
        assert steps[-1]["ledger/max_age_changes"] >= changes  # the buffer counted them (the last may follow)
    fixed = [r for r in result.records if r["kind"] == "step" and r["arm"] == SEEDED_ARMS[0].name]
    assert {r["max_age"] for r in fixed} == {4} and fixed[-1]["ledger/max_age_changes"] == 0
    assert os.path.basename(result.files["summary.csv"]) == "summary.csv"

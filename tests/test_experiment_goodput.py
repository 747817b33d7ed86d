"""The goodput study: the fixed-capacity generator (slots.py), the in-flight-update arm, the per-run goodput and
generator-idle numbers, the frontier with its ratios to drop, ``--preset goodput-tiny`` end to end, and the demo's
report of which arms kept the bound."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
from _experiment_helpers import fresh_dir, ledger_of, rows

from pyfast_buffer.experiment import ArmConfig, preset, run_experiment
from pyfast_buffer.experiment.arms import parse_arm
from pyfast_buffer.experiment.config import ExperimentConfig
from pyfast_buffer.experiment.frontier import frontier, goal_lines
from pyfast_buffer.experiment.loop import ArmRun
from pyfast_buffer.experiment.report import bound_line
from pyfast_buffer.experiment.slots import SlotProducer

TINY = preset("goodput-tiny").config


def _run_arm(arm: ArmConfig, ticks: int = 60, **overrides):
    run = ArmRun(replace(TINY, ticks=ticks, **overrides), arm)
    return run, run.run()


@pytest.mark.parametrize("strategy", ["drop", "wait", "pace"])
def test_no_more_attempts_run_than_there_are_slots_and_only_pace_leaves_a_slot_idle(strategy):
    run, records = _run_arm(ArmConfig(strategy=strategy, max_age=2, lag=1))
    producer = run.producer
    assert isinstance(producer, SlotProducer)
    ticks = [r for r in records if r["kind"] == "tick"]
    assert all(0 <= r["slots_busy"] <= TINY.slots for r in ticks)
    # Every slot-step is either busy or idle, and in flight is what the buffer holds in flight.
    assert producer.busy_slot_steps + producer.idle_slot_steps == TINY.slots * len(ticks)
    assert all(r["slots_busy"] == r["in_flight"] for r in ticks)
    if strategy == "pace":
        assert producer.idle_slot_steps > 0  # admission held slots back at max_age 2
    else:
        assert producer.idle_slot_steps == 0 and all(r["slots_idle"] == 0 for r in ticks)
        # Without admission every slot is refilled at once: busy after the dispatch of each step is K.
        assert producer.busy_slot_steps == TINY.slots * len(ticks)
    assert ledger_of(ticks[-1])["dispatched"] == producer.next_serial


def test_the_fresh_prompt_stream_is_the_same_in_every_arm():
    drop, _ = _run_arm(ArmConfig(strategy="drop", max_age=1, lag=1), ticks=30)
    pace, _ = _run_arm(ArmConfig(strategy="pace", max_age=1, lag=1), ticks=30)

    def fresh(producer):  # a fresh prompt's id is its first attempt's serial: in serial order, the k-th fresh one
        return [producer.tokens[p].tolist() for p in sorted(producer.tokens)]

    a, b = fresh(drop.producer), fresh(pace.producer)
    n = min(len(a), len(b))
    assert n > 10 and a[:n] == b[:n]
    assert len(a) != len(b)  # the arms did draw different numbers of fresh prompts


def _spy_generation(run):
    """Records the weights each attempt's tokens were sampled with ({serial: step}) and, per completed group,
    (serial, finish_step passed to complete, the prompt's dispatch stamp)."""
    sampled, completed, stamps = {}, [], {}
    generate, complete, dispatch = run.producer._generate, run.buf.complete, run.buf.dispatch

    def spy_generate(serials, prompt_ids):
        reward, weights = generate(serials, prompt_ids)
        sampled.update({s: weights for s in serials})
        return reward, weights

    def spy_dispatch(prompt_ids, step, *args, **kwargs):
        stamps.update({int(p): step for p in prompt_ids})
        return dispatch(prompt_ids, step, *args, **kwargs)

    def spy_complete(traj_ids, prompt_ids, *args, **kwargs):
        serial, prompt = int(traj_ids[0]) // run.cfg.group_size, int(prompt_ids[0])
        completed.append((serial, kwargs.get("finish_step"), stamps[prompt]))
        return complete(traj_ids, prompt_ids, *args, **kwargs)

    run.producer._generate, run.buf.dispatch, run.buf.complete = spy_generate, spy_dispatch, spy_complete
    return sampled, completed


def test_in_flight_updates_sample_with_the_finish_weights_and_age_from_the_finish():
    arm = ArmConfig(strategy="pace", max_age=2, lag=1, in_flight_updates=True)
    run = ArmRun(replace(TINY, ticks=80), arm)
    sampled, completed = _spy_generation(run)
    records = run.run()
    assert run.buf.config.age_from == "finish"
    # Every group's tokens were sampled with the weights in force at its finish, and it completed with that step;
    # some of those finishes came after a weight push (the arm really sampled late).
    assert completed and all(finish is not None and sampled[serial] == finish for serial, finish, _ in completed)
    assert any(finish > stamp for _, finish, stamp in completed)
    steps = [r for r in records if r["kind"] == "step"]
    assert steps and max(r["age_max"] for r in steps) <= arm.max_age
    led = ledger_of(steps[-1])
    assert led["trained_over_age"] == 0 and led["dropped_stale"] == 0
    # The weight pushes restamped running generations; without in-flight updates nothing is restamped, and every
    # group keeps its dispatch stamp.
    assert sum(r["restamped"] for r in steps) > 0
    plain = ArmRun(replace(TINY, ticks=80), ArmConfig(strategy="pace", max_age=2, lag=1))
    plain_sampled, plain_completed = _spy_generation(plain)
    plain_records = plain.run()
    assert plain.buf.config.age_from == "start"
    assert all(r["restamped"] == 0 and r["span_max"] == 0 for r in plain_records if r["kind"] == "step")
    # Sampled at the dispatch, with the weights it was stamped with; completed with the default finish (the stamp).
    assert plain_completed and all(f is None and plain_sampled[s] == st for s, f, st in plain_completed)


def test_a_slot_run_reports_goodput_and_generator_idle_that_match_the_ledger():
    arm = ArmConfig(strategy="drop", max_age=2, lag=1)
    result = run_experiment(replace(TINY, ticks=60), [arm], fresh_dir(), make_figure=False, say=None)
    (summary,) = result.summaries
    led = summary["ledger"]
    # reuse 1: every take is a first use, so trained groups per sampling step is taken / group size / ticks.
    assert summary["goodput"] == pytest.approx(led["taken"] / TINY.group_size / 60)
    assert summary["generator_idle_share"] == 0.0
    assert summary["wasted_share"] == pytest.approx((led["dropped_stale"] + led["evicted"]) / led["sampled_total"])


def test_slot_configuration_errors_name_the_fix():
    with pytest.raises(ValueError, match="--slots=-1 must be >= 0"):
        ExperimentConfig(slots=-1, requeue=True)
    with pytest.raises(ValueError, match="needs the requeue producer"):
        ExperimentConfig(slots=4)
    with pytest.raises(TypeError, match="in_flight_updates"):
        ArmConfig(in_flight_updates=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="in_flight_updates needs the slot generator"):
        run_experiment(
            preset("tiny").config, [ArmConfig(strategy="pace", in_flight_updates=True)], fresh_dir(), say=None
        )
    assert parse_arm("strategy=pace,max_age=2,in_flight_updates=1").in_flight_updates
    with pytest.raises(ValueError, match="in_flight_updates='yes' is not 0 or 1"):
        parse_arm("strategy=pace,in_flight_updates=yes")


def _fake_run(seed, strategy, max_age, goodput, inflight=False, ks=0.01, over=0.0, lag=1):
    return {
        "seed": seed,
        "lag": lag,
        "strategy": strategy,
        "max_age": max_age,
        "reuse": 1,
        "in_flight_updates": inflight,
        "goodput": goodput,
        "length_ks": ks,
        "trained_over_age_share": over,
        **{k: 0.0 for k in ("generator_idle_share", "idle_share", "wasted_share", "age_mean", "age_max", "eval_last")},
    }


def test_the_frontier_takes_pace_over_drop_seed_by_seed_and_checks_the_goal():
    runs = [_fake_run(s, "drop", 2, g) for s, g in ((0, 4.0), (1, 8.0))]
    runs += [_fake_run(s, "pace", 2, g) for s, g in ((0, 3.9), (1, 7.8))]  # 0.975 of drop on both seeds
    runs += [_fake_run(s, "pace", 2, g, inflight=True) for s, g in ((0, 4.0), (1, 8.0))]
    runs += [_fake_run(s, "drop", 2, g, inflight=True) for s, g in ((0, 5.0), (1, 10.0))]
    runs += [_fake_run(s, "drop", 2, 1.0, lag=0) for s in (0, 1)]  # another lag: its own point, never a reference
    points = {(p["kind"], p["lag"]): p for p in frontier(runs)}
    assert set(points) == {("drop", 1), ("pace", 1), ("drop+inflight", 1), ("pace+inflight", 1), ("drop", 0)}
    assert points["pace", 1]["goodput_vs_drop"] == pytest.approx((0.975, 0.975, 0.975))
    assert points["pace", 1]["goodput"][0] == pytest.approx(5.85)  # the mean of the goodputs, not of the ratios
    assert points["pace+inflight", 1]["goodput_vs_drop"] == pytest.approx((1.0, 1.0, 1.0))
    assert points["pace+inflight", 1]["goodput_vs_drop_same_updates"] == pytest.approx((0.8, 0.8, 0.8))
    lines = goal_lines(list(points.values()))
    assert any("lag 1, pace:" in x and "goal met" in x for x in lines)
    # Judged like for like: 0.8x drop with the same in-flight updates misses the goal, though it is 1.0x plain drop.
    inflight = [x for x in lines if "pace+inflight:" in x]
    assert len(inflight) == 1 and "goal NOT met" in inflight[0] and "1.000 [1.000, 1.000] x plain drop" in inflight[0]


def test_a_capped_drop_arm_is_its_own_point_and_never_the_drop_reference():
    runs = [_fake_run(s, "drop", 2, g) for s, g in ((0, 4.0), (1, 8.0))]
    runs += [{**_fake_run(s, "drop", 2, g), "max_attempts": 2} for s, g in ((0, 2.0), (1, 2.0))]
    points = {p["kind"]: p for p in frontier(runs)}
    assert set(points) == {"drop", "drop+att2"}
    assert points["drop+att2"]["goodput_vs_drop"] == pytest.approx((0.375, 0.25, 0.5))
    assert points["drop"]["goodput_vs_drop"] == pytest.approx((1.0, 1.0, 1.0))


@functools.cache
def _goodput_tiny():
    out = fresh_dir()
    cmd = [sys.executable, "-m", "pyfast_buffer", "experiment", "--preset", "goodput-tiny", "--out", out]
    subprocess.run([*cmd, "--no-progress"], check=True, capture_output=True, text=True, cwd=out)
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        return json.load(f), out


def test_preset_goodput_tiny_writes_the_frontier_with_intervals():
    summary, out = _goodput_tiny()
    p = preset("goodput-tiny")
    assert len(summary["runs"]) == len(p.seeds) * len(p.arms) == 2 * 20
    for run in summary["runs"]:
        assert {k for k in run if "goodput" in k} and {k for k in run if "generator_idle" in k}
        assert run["reconciled"], run["arm"]
        if run["strategy"] == "pace" and run["reuse"] == 1:  # the hard bound: nothing dropped, nothing over
            assert run["trained_over_age_share"] == 0 and run["ledger"]["dropped_stale"] == 0
            assert run["age_max"] is None or run["age_max"] <= run["max_age"]
        if run["strategy"] != "pace":
            assert run["generator_idle_share"] == 0
    points = summary["frontier"]
    assert {(pt["max_age"], pt["kind"]) for pt in points} == {
        (a, k) for a in (1, 2, 4, 8) for k in ("drop", "wait", "pace", "drop+inflight", "pace+inflight")
    }
    for pt in points:
        mean, low, high = pt["goodput"]
        assert 0 < low <= mean <= high
        if pt["kind"].startswith("drop"):  # each drop arm is its own like-for-like reference
            assert pt["goodput_vs_drop_same_updates"] == [1.0, 1.0, 1.0]
        if pt["kind"] == "drop":
            assert pt["goodput_vs_drop"] == [1.0, 1.0, 1.0]
    with open(os.path.join(out, "report.txt"), encoding="utf-8") as f:
        text = f.read()
    assert "Goodput frontier" in text and "goodput vs drop" in text and "max_age 2, lag 1, pace:" in text
    assert os.path.exists(os.path.join(out, "goodput.png")) == (importlib.util.find_spec("matplotlib") is not None)


def test_the_demo_has_pace_arms_and_its_report_says_which_arms_kept_the_bound():
    assert {a.strategy for a in preset("demo").arms} == {"drop", "wait", "pace"}
    arms = [ArmConfig(reuse=1, strategy=s, max_age=2, lag=1) for s in ("drop", "wait", "pace")]
    arms.append(ArmConfig(reuse=4, strategy="pace", max_age=2, lag=1))
    result = run_experiment(replace(preset("tiny").config, ticks=60), arms, fresh_dir(), make_figure=False, say=None)
    by_arm = {s["arm"]: s for s in result.summaries}
    for arm in arms:
        line = bound_line(by_arm[arm.name])
        steps = rows(result, "step", arm)
        over = any(r["age_max"] > arm.max_age for r in steps)
        assert ("did NOT keep it" in line) == over, (arm.name, line)
        assert f"- {arm.name}: {line}" in result.report
    assert "kept the bound" in bound_line(by_arm[arms[2].name])  # pace, reuse 1
    assert "held back by admission" in bound_line(by_arm[arms[2].name])
    assert "dropped stale" in bound_line(by_arm[arms[0].name])

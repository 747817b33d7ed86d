"""``pyfast-buffer experiment`` end to end with the tiny preset, and bad flags."""

import importlib.util
import os

import pytest
from _experiment_helpers import fresh_dir

from pyfast_buffer.cli import main


def test_experiment_cli_writes_records_report_and_figure(capsys):
    out = fresh_dir()
    rc = main(["experiment", "--preset", "tiny", "--ticks", "30", "--out", out, "--no-progress"])
    printed = capsys.readouterr().out
    assert rc == 0
    for name in ("metrics.jsonl", "steps.csv", "ticks.csv", "evals.csv", "report.txt", "summary.json"):
        assert os.path.getsize(os.path.join(out, name)) > 0
    assert "In this configuration and step range" in printed and "ledger" in printed
    if importlib.util.find_spec("matplotlib") is None:
        assert "no figure: matplotlib is not installed" in printed
    else:
        with open(os.path.join(out, "figure.png"), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_experiment_cli_product_of_axes(capsys):
    out = fresh_dir()
    rc = main(
        [
            "experiment",
            "--preset",
            "tiny",
            "--ticks",
            "8",
            "--reuse",
            "1,2",
            "--strategy",
            "drop,wait",
            "--out",
            out,
            "--no-progress",
            "--no-figure",
        ]
    )
    assert rc == 0
    assert "4 arms" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--reuse", "0"], "reuse=0 must be >= 1"),
        (["--reuse", "1,x"], "--reuse='1,x' is not a comma-separated list of ints"),
        (["--strategy", "drop,later"], "pass a comma list of drop, wait and pace"),
        (["--batch-size", "30"], "batch_size=30 is not a multiple of group_size=8"),
        (["--arm", "reuse=2,speed=3"], "'speed=3' is not KEY=VALUE"),
        (["--lr", "-1"], "--lr=-1.0 must be a finite number > 0"),
        (["--lr", "nan"], "--lr=nan must be a finite number > 0"),
        (["--digits", "1"], "--digits=1 leaves nothing to learn"),
        (["--length", "1"], "--length=1 cannot reach every sum"),
        (["--arm", "reuse=2", "--arm", "reuse=2"], "--arm: arm reuse2-drop-age4-lag0 is listed twice"),
        (["--tick-seconds", "-1"], "--tick-seconds=-1.0 must be a finite number >= 0"),
        (["--out", "/etc/passwd/x"], "--out='/etc/passwd/x' is not a writable directory"),
        (["--clip-eps", "-0.5"], "--clip-eps=-0.5 must be a finite number > 0"),
        (["--latency-mean", "nan"], "--latency-mean=nan must be a finite number >= 0"),
        (["--reuse", ""], "--reuse is empty"),
        (["--strategy", ""], "--strategy is empty"),
        (["--seeds", "0-x"], "--seeds='0-x': '0-x' is not a seed or a range"),
        (["--seed", "1", "--seeds", "0-1"], "--seed and --seeds are both given"),
        (["--seeds", "0-1", "--jobs", "0"], "--jobs=0 must be an int >= 1"),
        (["--max-age", "adaptive:speed=1"], "'speed' is not kl or clip"),
        (["--max-age", "adaptive:x"], "'x' is not a number"),
        (["--max-age", "adaptive:-1"], "target_kl=-1.0 must be a finite number > 0"),
        (["--max-age", "2,adaptive2"], "'adaptive2' is not adaptive[:TARGET]"),
        (["--arm", "max_age=adaptive:clip=y"], "--arm 'max_age=adaptive:clip=y'"),
        (["--adaptive-min-age", "5", "--adaptive-max-age", "2"], "must satisfy 0 <= min <= max"),
    ],
)
def test_bad_flags_name_the_argument_and_the_fix(capsys, flags, message):
    rc = main(["experiment", "--preset", "tiny", "--out", fresh_dir(), "--no-progress", *flags])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_one_axis_flag_keeps_the_presets_other_axes():
    import argparse

    from pyfast_buffer.experiment.cli import add_parser, resolve

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["experiment", "--preset", "demo", "--reuse", "1,4"])
    _, arms = resolve(args)
    assert sorted((a.reuse, a.strategy, a.max_age, a.lag) for a in arms) == [
        (1, "drop", 4, 1),
        (1, "pace", 4, 1),
        (1, "wait", 4, 1),
        (4, "drop", 4, 1),
        (4, "pace", 4, 1),
        (4, "wait", 4, 1),
    ]


def test_max_age_axis_takes_adaptive_items():
    import argparse

    from pyfast_buffer.experiment.cli import add_parser, resolve, resolve_seeds

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "experiment",
            "--reuse",
            "4",
            "--max-age",
            "2,adaptive,adaptive:clip=0.05",
            "--arm",
            "reuse=4,max_age=adaptive:kl=0.02+clip=0.1",
        ]
    )
    _, arms = resolve(args)
    assert [(a.max_age_spec, a.target_kl, a.target_clip) for a in arms] == [("adaptive:kl=0.02+clip=0.1", 0.02, 0.1)]
    args.arm = None
    cfg, arms = resolve(args)
    assert [a.max_age_spec for a in arms] == ["2", "adaptive:kl=0.01", "adaptive:clip=0.05"]
    assert arms[1].name == "reuse4-drop-adaptive-kl=0.01-lag0"
    assert resolve_seeds(args, cfg, arms) == ([0], 1)
    args.seeds, args.jobs = "0-4", None
    seeds, jobs = resolve_seeds(args, cfg, arms)
    assert seeds == [0, 1, 2, 3, 4] and 1 <= jobs <= 15


def test_study_preset_runs_its_seeds_by_default():
    import argparse

    from pyfast_buffer.experiment.cli import add_parser, resolve, resolve_seeds

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["experiment", "--preset", "study"])
    cfg, arms = resolve(args)
    seeds, _ = resolve_seeds(args, cfg, arms)
    assert seeds == [0, 1, 2, 3, 4]
    assert sorted(a.max_age_spec for a in arms if a.reuse == 4) == ["1", "2", "4", "8", "adaptive:kl=0.01"]
    args = parser.parse_args(["experiment", "--preset", "study", "--seed", "3"])
    assert resolve_seeds(args, *resolve(args))[0] == [3]

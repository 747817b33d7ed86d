"""``pyfast-buffer experiment``: argument parsing, and the printed report and summary table."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List

from .arms import axis_values, parse_arm, product_arms, unique
from .config import MODES, PRESETS, ArmConfig, ExperimentConfig, preset, with_overrides
from .runner import run_experiment
from .seeds import default_jobs, parse_seeds

#: Flags that override one ExperimentConfig field: (flag, field, type, help).
CONFIG_FLAGS = (
    ("--seed", "seed", int, "random seed for weights, prompts, sampling and timing"),
    ("--ticks", "ticks", int, "total sampling steps per arm (the fixed sampling budget)"),
    ("--digits", "digits", int, "task: digits are 0..DIGITS-1"),
    ("--length", "length", int, "task: digits per response"),
    ("--group-size", "group_size", int, "GRPO n: samples per prompt"),
    ("--prompts-per-tick", "prompts_per_tick", int, "prompts dispatched per sampling step"),
    ("--batch-size", "batch_size", int, "trajectories per trainer step (a multiple of --group-size)"),
    ("--capacity", "capacity", int, "ready trajectories the buffer holds"),
    ("--eval-interval", "eval_interval", int, "sampling steps between greedy evaluations"),
    ("--eval-prompts", "eval_prompts", int, "fixed eval prompts per evaluation (drawn from the training distribution)"),
    ("--parameter-sync-step", "parameter_sync_step", int, "trainer steps between weight pushes to the rollout side"),
    ("--latency-mean", "latency_mean", float, "mean extra sampling steps a prompt stays in flight"),
    ("--max-latency", "max_latency", int, "longest a prompt stays in flight, in sampling steps"),
    ("--fail-prob", "fail_prob", float, "share of prompts that fail"),
    ("--lr", "lr", float, "Adam learning rate"),
    ("--clip-eps", "clip_eps", float, "PPO clip range"),
    ("--hidden", "hidden", int, "GRU hidden size"),
    ("--tick-seconds", "tick_seconds", float, "thread mode: producer pause per sampling step"),
    ("--max-steps-per-tick", "max_steps_per_tick", int, "trainer steps per sampling step at most (0: no cap)"),
    ("--adaptive-min-age", "adaptive_min_age", int, "adaptive arms: lowest max_age the controller sets"),
    ("--adaptive-max-age", "adaptive_max_age", int, "adaptive arms: highest max_age the controller sets"),
    ("--slots", "slots", int, "generation slots of the fixed-capacity generator (0: the open-loop producer)"),
)
AXES = ("reuse", "strategy", "max_age", "lag")


def add_arguments(p: argparse.ArgumentParser, default_out: str) -> None:
    p.add_argument("--out", default=default_out, help=f"output directory (default {default_out})")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--no-figure", action="store_true", help="skip the PNG")


def add_seed_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--seeds",
        help="run every arm once per seed: a range 0-4, a list 0,3,7 or both 0-2,9 "
        "(default: --seed, or the preset's seeds); more than one adds 95%% bootstrap intervals",
    )
    p.add_argument(
        "--jobs",
        type=int,
        help="worker processes for the runs (default: min(cores, runs)); the results are the same for any value",
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "experiment",
        help="async GRPO runs on the buffer comparing reuse and staleness arms",
        description="Runs a real asynchronous GRPO loop (tiny GRU policy, digit-sum task) once per "
        "arm with everything else fixed, and writes JSONL/CSV records, a figure and a report. Arms are "
        "the cartesian product of --reuse x --strategy x --max-age x --lag, or the --arm list.",
    )
    p.add_argument("--preset", choices=sorted(PRESETS), help="start from a preset's configuration and arms")
    p.add_argument("--reuse", help="comma list of max_uses values (default 1,2,4)")
    p.add_argument("--strategy", help="comma list of drop/wait (default drop)")
    p.add_argument(
        "--max-age",
        dest="max_age",
        help="comma list of max_age values (default 4); an item "
        "adaptive[:TARGET] is an arm whose max_age an AdaptiveMaxAge controller moves to hold approx KL "
        "TARGET (adaptive:kl=X, adaptive:clip=Y for the clip fraction; default adaptive:kl=0.01)",
    )
    p.add_argument("--lag", help="comma list of rollout weight lags in trainer steps (default 0)")
    p.add_argument(
        "--arm",
        action="append",
        metavar="SPEC",
        help="an explicit arm, e.g. 'reuse=4,strategy=wait,max_age=2,lag=1' (repeatable; replaces the product)",
    )
    p.add_argument("--mode", choices=MODES, help="interleave (deterministic, default) or thread (a producer thread)")
    for flag, field, kind, text in CONFIG_FLAGS:
        p.add_argument(flag, dest=field, type=kind, help=text)
    add_seed_arguments(p)
    add_arguments(p, "experiment-out")
    p.set_defaults(run=run)


def resolve_seeds(args: argparse.Namespace, cfg: ExperimentConfig, arms: List[ArmConfig]) -> tuple[List[int], int]:
    """The seeds and worker count the flags ask for: --seeds, else --seed, else the preset's seeds."""
    text = getattr(args, "seeds", None)
    if text is not None:
        if getattr(args, "seed", None) is not None:
            raise ValueError("--seed and --seeds are both given; pass one (--seeds 0-4, or --seed 3)")
        seeds = parse_seeds(text)
    elif getattr(args, "seed", None) is not None or not getattr(args, "preset", None):
        seeds = [cfg.seed]
    else:
        seeds = list(preset(args.preset).seeds)
    jobs = getattr(args, "jobs", None)
    if jobs is None:
        jobs = default_jobs(len(seeds) * len(arms)) if len(seeds) > 1 else 1
    elif isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs={jobs!r} must be an int >= 1; pass e.g. --jobs 2")
    return seeds, jobs


def resolve(args: argparse.Namespace) -> tuple[ExperimentConfig, List[ArmConfig]]:
    """The configuration and arms the flags ask for; raises ValueError/TypeError naming a bad flag."""
    base = preset(args.preset) if getattr(args, "preset", None) else None
    overrides: Dict[str, Any] = {field: getattr(args, field, None) for _, field, _, _ in CONFIG_FLAGS}
    overrides["mode"] = getattr(args, "mode", None)
    cfg = with_overrides(base.config if base else ExperimentConfig(), **overrides)
    if getattr(args, "arm", None):
        arms = [parse_arm(spec) for spec in args.arm]
    elif base and all(getattr(args, a, None) is None for a in AXES):
        arms = list(base.arms)
    else:  # unset axes keep the preset's values (or the defaults without a preset)
        reuse, strategy, max_age, lag = (getattr(args, a, None) for a in AXES)
        arms = product_arms(reuse, strategy, max_age, lag, defaults=axis_values(base.arms) if base else None)
    return cfg, unique(arms)


def execute(args: argparse.Namespace, label: str) -> int:
    """Shared by ``experiment`` and ``demo``: run, print the report and table, say where files are."""
    try:
        cfg, arms = resolve(args)
        seeds, jobs = resolve_seeds(args, cfg, arms)
    except (ValueError, TypeError) as exc:
        print(f"pyfast-buffer {label}: error: {exc}", file=sys.stderr)
        return 2
    try:
        os.makedirs(args.out, exist_ok=True)
        probe = os.path.join(args.out, ".pyfast-buffer-write-test")
        with open(probe, "w", encoding="utf-8"):
            pass
        os.remove(probe)
    except OSError as exc:
        print(
            f"pyfast-buffer {label}: error: --out={args.out!r} is not a writable directory "
            f"({exc.strerror or exc}); pass a directory you can write to",
            file=sys.stderr,
        )
        return 2
    runs = f" x {len(seeds)} seeds ({jobs} worker processes)" if len(seeds) > 1 else ""
    print(
        f"{label}: {len(arms)} arms{runs} x {cfg.ticks} sampling steps ({cfg.mode} mode): "
        + ", ".join(a.name for a in arms),
        flush=True,
    )
    result = run_experiment(
        cfg, arms, args.out, show_progress=not args.no_progress, make_figure=not args.no_figure, seeds=seeds, jobs=jobs
    )
    print()
    print(result.report)
    print()
    print(result.table)
    print()
    for kind, path in result.files.items():
        print(f"{kind:>10}: {path}")
    print(f"wall time {result.wall_seconds:.1f} s")
    return 0 if all(s["reconciled"] for s in result.summaries) else 1


def run(args: argparse.Namespace) -> int:
    return execute(args, "experiment")

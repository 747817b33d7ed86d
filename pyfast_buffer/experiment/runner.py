"""Runs every arm of an experiment and writes its records, figure and report under one directory."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import bias_plot, frontier, goodput_plot, planner_check, plots, progress, records, report, report_seeds
from .aggregate import aggregate
from .arms import unique
from .config import ArmConfig, ExperimentConfig
from .seeds import run_all
from .summary import summarise


@dataclass
class ExperimentResult:
    records: List[Dict[str, Any]]
    summaries: List[Dict[str, Any]]  # one per (seed, arm), seed-major
    report: str
    table: str
    files: Dict[str, str]
    wall_seconds: float
    seeds: List[int] = field(default_factory=list)
    aggregate: List[Dict[str, Any]] = field(default_factory=list)  # one per arm: mean and 95% bootstrap interval
    planner: List[Dict[str, Any]] = field(default_factory=list)  # rhythm.plan vs measured ages, reuse-1 runs


def run_experiment(
    cfg: ExperimentConfig,
    arms: Sequence[ArmConfig],
    out_dir: str,
    show_progress: bool = False,
    make_figure: bool = True,
    say: Optional[Callable[[str], None]] = print,
    seeds: Optional[Sequence[int]] = None,
    jobs: int = 1,
) -> ExperimentResult:
    """Runs every arm once per seed (default: ``cfg.seed`` only) with everything else in ``cfg`` fixed, in
    ``jobs`` worker processes (1: in this process; the records are the same either way), and writes under
    ``out_dir``: ``metrics.jsonl`` (every record; identical for identical inputs in interleave mode),
    ``steps.csv``/``ticks.csv``/``evals.csv``, ``summary.jsonl``/``summary.csv`` (one row per seed and arm,
    then one aggregate row per arm), ``summary.json``, ``report.txt`` and ``figure.png``.
    """
    arms = unique(arms)
    if not arms:
        raise ValueError("no arms to run; pass --reuse/--strategy/--max-age/--lag lists or --arm")
    for arm in arms:
        if arm.in_flight_updates and not cfg.slots:
            raise ValueError(
                f"arm {arm.name}: in_flight_updates needs the slot generator (--slots K); "
                "use --preset goodput or goodput-tiny, or pass --slots"
            )
    seeds = list(seeds) if seeds is not None else [cfg.seed]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds={seeds!r} must list at least one seed, each once")
    say = say or (lambda _: None)
    os.makedirs(out_dir, exist_ok=True)
    progress.note_if_missing(show_progress and jobs == 1, say)
    started = time.perf_counter()
    all_records = run_all(cfg, arms, seeds, jobs, show_progress, say)
    summaries = [summarise(all_records, arm, cfg.ticks, seed) for seed in seeds for arm in arms]
    agg = aggregate(summaries, arms)
    checks = [
        c
        for seed in seeds
        for arm in arms
        if (c := planner_check.compare(all_records, replace(cfg, seed=seed), arm, seed)) is not None
    ]
    multi = len(seeds) > 1
    if multi:
        text, tbl = report_seeds.render(agg, summaries, cfg, seeds), report_seeds.table(agg)
    else:
        text, tbl = report.render(summaries, cfg), report.table(summaries)
    text += "\n\n" + "\n".join(planner_check.render([c for c in checks if c["seed"] == seeds[0]]))
    points = frontier.frontier(summaries)
    if points:  # the goodput study: pace against drop at equal generation hardware
        text += "\n\n" + "\n".join(
            [
                "Goodput frontier (mean over seeds [95% bootstrap interval]; 'goodput vs drop' is the per-seed "
                "ratio to the drop arm at the same max_age):",
                frontier.table(points),
                "",
                f"The goal (pace >= {frontier.GOAL_RATIO}x drop's goodput at every max_age >= "
                f"{frontier.GOAL_MIN_AGE}, nothing trained over max_age, length KS < {frontier.GOAL_KS}):",
                *frontier.goal_lines(points),
            ]
        )
    files = {
        "jsonl": os.path.join(out_dir, "metrics.jsonl"),
        "report": os.path.join(out_dir, "report.txt"),
        "summary": os.path.join(out_dir, "summary.json"),
    }
    records.write_jsonl(files["jsonl"], all_records)
    for path in records.write_csvs(out_dir, all_records):
        files[os.path.basename(path)] = path
    for path in records.write_summaries(out_dir, summaries, agg):
        files[os.path.basename(path)] = path
    with open(files["report"], "w", encoding="utf-8") as f:
        f.write(text + "\n\n" + tbl + "\n")
    if make_figure:
        what = f"seeds {_seed_text(seeds)} (mean, 95% bootstrap band)" if multi else f"seed {seeds[0]}"
        title = (
            f"digit-sum GRPO on StalenessBuffer: {cfg.ticks} sampling steps, {what}, "
            f"parameter_sync_step {cfg.parameter_sync_step}, batch {cfg.batch_size}, capacity {cfg.capacity}"
        )
        path = os.path.join(out_dir, "figure.png")
        made = (
            plots.plot_bands(all_records, agg, seeds, path, title)
            if multi
            else plots.plot(all_records, summaries, path, title)
        )
        if made.startswith("no figure"):
            say(made)
        else:
            files["figure"] = made
        if multi and any("difficulty_ks" in a for a in agg):  # the bias study: its own figure
            bias_path = bias_plot.plot_bias(
                agg, os.path.join(out_dir, "bias.png"), f"what max_age does to the trained data: {what}"
            )
            if not bias_path.startswith("no figure"):
                files["bias_figure"] = bias_path
        if len({p["max_age"] for p in points}) > 1:  # the goodput study: the frontier against max_age
            made = goodput_plot.plot_frontier(
                points,
                os.path.join(out_dir, "goodput.png"),
                f"the throughput price of a hard bound: {cfg.slots or cfg.prompts_per_tick} generation "
                f"{'slots' if cfg.slots else 'prompts per step'}, {what}",
            )
            if not made.startswith("no figure"):
                files["goodput_figure"] = made
    wall = time.perf_counter() - started
    with open(files["summary"], "w", encoding="utf-8") as f:
        json.dump(
            {
                "config": cfg.to_dict(),
                "seeds": seeds,
                "jobs": jobs,
                "runs": summaries,
                "aggregate": agg,
                "planner_vs_measured": checks,
                "frontier": points,
                "wall_seconds": wall,
            },
            f,
            indent=1,
            default=str,
        )
    return ExperimentResult(all_records, summaries, text, tbl, files, wall, seeds, agg, checks)


def _seed_text(seeds: Sequence[int]) -> str:
    if list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))

"""Runs every arm of an experiment and writes its records, figure and report under one directory."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from . import plots, progress, records, report
from .arms import unique
from .config import ArmConfig, ExperimentConfig
from .loop import ArmRun
from .summary import summarise


@dataclass
class ExperimentResult:
    records: List[Dict[str, Any]]
    summaries: List[Dict[str, Any]]
    report: str
    table: str
    files: Dict[str, str]
    wall_seconds: float


def run_experiment(cfg: ExperimentConfig, arms: Sequence[ArmConfig], out_dir: str, show_progress: bool = False,
                   make_figure: bool = True, say: Optional[Callable[[str], None]] = print) -> ExperimentResult:
    """Runs ``arms`` one after another with everything in ``cfg`` fixed and writes under ``out_dir``:

    ``metrics.jsonl`` (every record; identical for identical inputs in interleave mode),
    ``steps.csv``/``ticks.csv``/``evals.csv``, ``summary.json``, ``report.txt`` and ``figure.png``.
    """
    arms = unique(arms)
    if not arms:
        raise ValueError("no arms to run; pass --reuse/--strategy/--max-age/--lag lists or --arm")
    say = say or (lambda _: None)
    os.makedirs(out_dir, exist_ok=True)
    progress.note_if_missing(show_progress, say)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reproducible kernels, and every arm gets the same compute
    started = time.perf_counter()
    all_records: List[Dict[str, Any]] = []
    try:
        for arm in arms:
            all_records.extend(ArmRun(cfg, arm, show_progress).run())
    finally:
        torch.set_num_threads(threads)
    summaries = [summarise(all_records, arm, cfg.ticks) for arm in arms]
    text, tbl = report.render(summaries, cfg), report.table(summaries)
    files = {"jsonl": os.path.join(out_dir, "metrics.jsonl"), "report": os.path.join(out_dir, "report.txt"),
             "summary": os.path.join(out_dir, "summary.json")}
    records.write_jsonl(files["jsonl"], all_records)
    for path in records.write_csvs(out_dir, all_records):
        files[os.path.basename(path)] = path
    with open(files["report"], "w", encoding="utf-8") as f:
        f.write(text + "\n\n" + tbl + "\n")
    if make_figure:
        title = (f"digit-sum GRPO on StalenessBuffer: {cfg.ticks} sampling steps, seed {cfg.seed}, "
                 f"parameter_sync_step {cfg.parameter_sync_step}, batch {cfg.batch_size}, capacity {cfg.capacity}")
        made = plots.plot(all_records, summaries, os.path.join(out_dir, "figure.png"), title)
        if made.startswith("no figure"):
            say(made)
        else:
            files["figure"] = made
    wall = time.perf_counter() - started
    with open(files["summary"], "w", encoding="utf-8") as f:
        json.dump({"config": cfg.to_dict(), "arms": summaries, "wall_seconds": wall}, f, indent=1, default=str)
    return ExperimentResult(all_records, summaries, text, tbl, files, wall)

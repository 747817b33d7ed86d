"""One run of the experiment's tiny preset, shared by the test_experiment_* files (a few seconds)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from dataclasses import replace
from typing import Any, Dict, List

from pyfast_buffer.experiment import ArmConfig, preset, run_experiment
from pyfast_buffer.experiment.runner import ExperimentResult


def fresh_dir() -> str:
    path = tempfile.mkdtemp(prefix="pfb-experiment-")
    atexit.register(shutil.rmtree, path, True)
    return path


@functools.cache
def tiny_run() -> ExperimentResult:
    """The tiny preset as shipped: reuse 1 and 4 under drop, reuse 4 under wait; no figure."""
    p = preset("tiny")
    return run_experiment(p.config, p.arms, fresh_dir(), make_figure=False, say=None)


def run_small(ticks: int, **overrides: Any) -> ExperimentResult:
    """The tiny preset's arms over ``ticks`` sampling steps, with config overrides."""
    p = preset("tiny")
    return run_experiment(replace(p.config, ticks=ticks, **overrides), p.arms, fresh_dir(), make_figure=False, say=None)


def rows(result: ExperimentResult, kind: str, arm: ArmConfig) -> List[Dict[str, Any]]:
    return [r for r in result.records if r["kind"] == kind and r["arm"] == arm.name]


def ledger_of(row: Dict[str, Any]) -> Dict[str, int]:
    return {k[len("ledger/") :]: v for k, v in row.items() if k.startswith("ledger/")}


#: A multi-seed run small enough for the test suite: a reuse-1 arm and an adaptive reuse-4 arm, two seeds.
SEEDED_ARMS = (
    ArmConfig(reuse=1, strategy="drop", max_age=4, lag=1),
    ArmConfig(reuse=4, strategy="drop", max_age=4, lag=1, target_kl=0.003),
)


@functools.cache
def seeded_run(jobs: int) -> ExperimentResult:
    """The tiny preset's configuration over 16 sampling steps, seeds 0 and 1, in ``jobs`` processes."""
    cfg = replace(preset("tiny").config, ticks=16)
    return run_experiment(cfg, SEEDED_ARMS, fresh_dir(), make_figure=jobs == 1, say=None, seeds=[0, 1], jobs=jobs)

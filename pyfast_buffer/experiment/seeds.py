"""Many seeds: the ``--seeds`` list, and running every (seed, arm) run serially or in worker processes.

Each run depends only on its configuration (seed included) and runs with one torch thread, so a worker
process computes the same records the parent would: ``jobs`` changes the wall time, never the results.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .config import ArmConfig, ExperimentConfig
from .loop import ArmRun

Record = Dict[str, Any]


def parse_seeds(text: str) -> List[int]:
    """``"0-4"`` -> [0, 1, 2, 3, 4]; ``"0,3,7"`` -> [0, 3, 7]; ``"0-2,9"`` -> [0, 1, 2, 9]; ValueError names --seeds."""
    example = "pass e.g. --seeds 0-4 or --seeds 0,3,7"
    out: List[int] = []
    for part in str(text).split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        try:
            first, last = (int(lo), int(hi)) if dash else (int(part), int(part))
        except ValueError:
            raise ValueError(f"--seeds={text!r}: {part!r} is not a seed or a range A-B of seeds; {example}") from None
        if first < 0 or last < first:
            raise ValueError(f"--seeds={text!r}: {part!r} is not a range of seeds >= 0 with A <= B; {example}")
        out.extend(range(first, last + 1))
    if len(set(out)) != len(out):
        raise ValueError(f"--seeds={text!r} lists a seed twice; list each once")
    return out


def default_jobs(runs: int) -> int:
    """Worker processes by default: one per core (the cores this process may use), at most one per run."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, runs))


def run_one(cfg: ExperimentConfig, arm: ArmConfig, show_progress: bool = False) -> List[Record]:
    """One arm on one seed (``cfg.seed``), on one torch thread (reproducible kernels, equal compute per run)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return ArmRun(cfg, arm, show_progress).run()
    finally:
        torch.set_num_threads(threads)


def run_all(
    cfg: ExperimentConfig,
    arms: Sequence[ArmConfig],
    seeds: Sequence[int],
    jobs: int = 1,
    show_progress: bool = False,
    say: Optional[Callable[[str], None]] = None,
) -> List[Record]:
    """Every arm on every seed; records in (seed, arm) order whatever ``jobs`` is.

    ``jobs == 1`` runs in this process (with progress bars when asked); more runs in that many
    spawned worker processes and reports each finished run through ``say``.
    """
    runs: List[Tuple[int, ArmConfig]] = [(seed, arm) for seed in seeds for arm in arms]
    if jobs < 1:
        raise ValueError(f"--jobs={jobs} must be >= 1")
    if jobs == 1 or len(runs) == 1:
        out: List[Record] = []
        for seed, arm in runs:
            out.extend(run_one(replace(cfg, seed=seed), arm, show_progress))
        return out
    results: Dict[Tuple[int, str], List[Record]] = {}
    # spawn: a fresh interpreter per worker, never a fork of a process that holds torch's thread pools.
    with ProcessPoolExecutor(max_workers=min(jobs, len(runs)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_one, replace(cfg, seed=seed), arm): (seed, arm.name) for seed, arm in runs}
        for done, future in enumerate(as_completed(futures), 1):
            seed, name = futures[future]
            results[(seed, name)] = future.result()
            if say is not None:
                say(f"  done {done}/{len(runs)}: seed {seed} {name}")
    return [r for seed, arm in runs for r in results[(seed, arm.name)]]

"""Goodput at equal generation capacity in TRL 1.16's real AsyncGRPOTrainer: TRL's per-sample drop against our
drop, wait and pace, for max_age 1, 2 and 4, on the CPU latency model of tests/_trl_helpers.py.

TRL's arm is TRL's own filter on the same generation: our worker with a bound it never reaches (so it dispatches
freely and keeps everything, as TRL's worker does) and TRL's ``max_staleness`` set to the arm's max_age, so TRL's
``RolloutQueueDataset`` drops per sample exactly as it does behind its own worker. Every arm has the same generation
capacity: ``max(max_age, 1)`` times the groups of one step generating at once (TRL's own default), the same seeded
latency and the same number of optimizer steps.

Reported per arm (median over seeds): completions trained per completion generated, the wasted share (generated,
then dropped by either filter; what is still ready when the run ends counts as neither), groups trained whole,
groups trained in part (TRL's per-sample drop splits groups), the largest staleness TRL logged, seconds per step.

    python benchmarks/trl_goodput.py [--steps 16] [--seeds 0 1 2] [--ages 1 2 4]   (~3 min here)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from _trl_helpers import G, Run, uneven

ARMS = ("trl", "drop", "wait", "pace")
UNBOUNDED = 10_000  # our bound in TRL's arm: never reached, so only TRL's filter acts


def one(folder: str, arm: str, max_age: int, steps: int, seed: int, model: Any) -> Dict[str, float]:
    groups_per_step = 2  # tests/_trl_helpers.py: 8 samples a step, groups of 4
    slots = max(max_age, 1) * groups_per_step
    strategy = "drop" if arm == "trl" else arm
    ours = UNBOUNDED if arm == "trl" else max_age
    run = Run(
        folder,
        strategy,
        max_age=ours,
        steps=steps,
        model=model,
        seed=seed,
        max_staleness=max(ours, max_age),
        latency=uneven(0.0, 0.08, 0.2, 0.4),
        worker_kwargs={"max_inflight_groups": slots},
    )
    if arm == "trl":
        run.trainer.args.max_staleness = max_age  # TRL's filter reads it when the dataloader is built, at train()
    kept: Counter = Counter()  # group id -> samples TRL trained (not dropped by its filter)
    lost: Counter = Counter()  # group id -> samples TRL's filter dropped
    get = run.worker.rollout_buffer.get

    def judged(*args: Any, **kwargs: Any) -> Any:
        sample = get(*args, **kwargs)
        # TRL's own rule, applied by its RolloutQueueDataset right after this get, at the same version
        stale = run.worker.model_version - sample.model_version > max_age
        (lost if stale else kept)[sample.group_id] += 1
        return sample

    run.worker.rollout_buffer.get = judged
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the trainer prints its log lines when tqdm is off
            history = run.train()
    finally:
        run.close()
    wall = time.perf_counter() - started
    trained_samples = sum(h.get("batch/samples_per_step", 0) for h in history if "loss" in h)
    generated = run.worker.counts["groups_completed"] * G
    ledger = run.worker.buffer.ledger()
    # what the run ended with, ready or half handed out, is neither trained nor wasted: it is not counted
    left = ledger["buffer_left"] + len(run.worker.rollout_buffer._staged)
    wasted = ledger["dropped_stale"] + sum(lost.values())
    used = generated - left
    whole = sum(1 for g, n in kept.items() if n == G and not lost[g])
    partial = sum(1 for g in kept if lost[g])
    staleness = max((h.get("sample/staleness_max") or 0) for h in history)
    return {
        "trained_per_generated": trained_samples / used if used else 0.0,
        "wasted_share": wasted / used if used else 0.0,
        "groups_trained": float(whole),
        "groups_partial": float(partial),
        "staleness_max": float(staleness),
        "s_per_step": wall / steps,
    }


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ages", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args(argv)
    from pyfast_buffer.integrations.trl.tiny import tiny_policy

    root = tempfile.mkdtemp(prefix="pfb-trl-goodput-")
    model = tiny_policy(os.path.join(root, "model"))
    rows = []
    for max_age in args.ages:
        for arm in ARMS:
            runs = [
                one(os.path.join(root, f"{arm}-{max_age}-{s}"), arm, max_age, args.steps, s, model) for s in args.seeds
            ]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            rows.append((max_age, arm, med))
            print(f"max_age={max_age} {arm:5s} " + " ".join(f"{k}={v:.3f}" for k, v in med.items()), flush=True)
    print()
    print(
        "| max_age | arm | trained / generated | wasted share | groups trained whole | groups in part "
        "| TRL staleness max | s / step |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for max_age, arm, m in rows:
        name = "TRL per-sample drop" if arm == "trl" else f"ours, {arm}"
        print(
            f"| {max_age} | {name} | {m['trained_per_generated']:.3f} | {m['wasted_share']:.1%} | "
            f"{m['groups_trained']:.0f} | {m['groups_partial']:.0f} | {m['staleness_max']:.0f} | "
            f"{m['s_per_step']:.2f} |"
        )


if __name__ == "__main__":
    main()

"""drop, wait and pace measured inside verl 0.9.1's real trainer loop on CPU, with the fake backend of the tests.

    python benchmarks/verl_loop.py [--mode colocate_async] [--steps 40] [--seeds 3] [--threshold 2] [--warmup 1]

Needs verl 0.9.1 (the verl stage's venv: ``bash .ci/verl-stage.sh --keep`` leaves one in .ci-venv-verl). Each arm
is verl's trainer (``tests/_verl_cpu_trainer.py``) with our sampler, the same seeded backend for every arm
(heavy-tailed latencies, one straggler session every ``--straggler-every`` prompts, a few failures), run for
``--steps`` steps; the table gives the median over seeds and the range:

- evicted stale / failed: groups evicted (the sampler's ledger), stale ones are generation thrown away;
- largest age: the oldest trajectory trained, in steps since its prompt was dispatched (re-stamped at release
  under pace), and by verl's own measure (versions behind the trained policy, from the oldest weights);
- trainer idle: the share of step time the trainer waited in ``sample`` for a batch (verl's ``gen`` timer);
- never trained: prompts generated that no step trained (evicted, or still held when the run ended);
- steps/s: wall-clock training rate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def arm_overrides(strategy: str, threshold: int) -> list:
    from _verl_cpu_trainer import PACED, SAMPLER

    overrides = [*SAMPLER, f"trainer.v1.sampler.max_off_policy_threshold={threshold}"]
    if strategy == "pace":
        return overrides + PACED
    return [*overrides, f"trainer.v1.sampler.max_off_policy_strategy={strategy}"]


def one_run(mode: str, strategy: str, threshold: int, steps: int, seed: int, server: dict, warmup: int) -> dict:
    import time

    from _verl_cpu_trainer import base_overrides, clear_transfer_queue, compose, stop, train

    clear_transfer_queue()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = base_overrides(Path(tmp), mode, steps) + arm_overrides(strategy, threshold)
        overrides.append(f"trainer.v1.{mode}.num_warmup_batches={warmup}")
        if mode == "separate_async":
            overrides.append("trainer.v1.separate_async.hybrid_rollout.enable_switch=true")
        config = compose(overrides)
        started = time.monotonic()
        run = train(config, {**server, "seed": seed})
        wall = time.monotonic() - started
        stop(run)
    led = run.trainer.replay_buffer.ledger("train")
    rows = [(step, tag) for step, tags in run.record.trained for tag in tags]
    gen = sum(s["gen_s"] for s in run.record.steps)
    total = sum(s["step_s"] for s in run.record.steps)
    return {
        "evicted_stale": led["evicted_stale"],
        "evicted_failure": led["evicted_failure"],
        "largest_age": max(step - tag["global_steps"] for step, tag in rows),
        "largest_version_age": max((step - 1) - tag["min_global_steps"] for step, tag in rows),
        "idle": gen / total if total else 0.0,
        "never_trained": led["seen"] - led["taken"],
        "steps_per_s": steps / wall,
    }


def summary(values: list) -> str:
    if isinstance(values[0], float):
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"
    return f"{statistics.median(values):g} ({min(values)}-{max(values)})"


def main(argv: list | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="colocate_async", choices=["colocate_async", "separate_async"])
    parser.add_argument("--strategies", nargs="+", default=["drop", "wait", "pace"])
    parser.add_argument("--threshold", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--straggler-every", type=int, default=13)
    parser.add_argument("--straggler-s", type=float, default=0.4)
    parser.add_argument("--fail-rate", type=float, default=0.05)
    parser.add_argument("--warmup", type=int, default=1, help="verl's num_warmup_batches (batches submitted ahead)")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    from _verl_cpu_trainer import import_verl, verl_on_cpu

    import_verl()
    server = {"fail_rate": args.fail_rate, "straggler_every": args.straggler_every, "straggler_s": args.straggler_s}
    results: dict = {}
    with verl_on_cpu():
        for seed in range(args.seeds):
            for strategy in args.strategies:
                result = one_run(args.mode, strategy, args.threshold, args.steps, seed, server, args.warmup)
                print(f"seed {seed} {strategy}: {result}", file=sys.stderr, flush=True)
                for key, value in result.items():
                    results.setdefault(strategy, {}).setdefault(key, []).append(value)
    columns = list(next(iter(results.values())))
    print(
        f"\n{args.mode}, max_off_policy_threshold={args.threshold}, num_warmup_batches={args.warmup}, "
        f"{args.steps} steps, {args.seeds} seeds"
    )
    print("| strategy | " + " | ".join(columns) + " |")
    print("| --- |" + " ---: |" * len(columns))
    for strategy, values in results.items():
        print(f"| {strategy} | " + " | ".join(summary(values[c]) for c in columns) + " |")


if __name__ == "__main__":
    main()

"""drop, wait and pace as NeMo RL's sampler, in NeMo's call order, with the straggler of NeMo RL #3238.

    python benchmarks/nemo_loop.py [--steps 30] [--seeds 5] [--straggler-s 0.3] [--real-nemo /path/to/RL]

The pumps of ``tests/_nemo_fake.NemoLoop`` (NeMo's rollout and train pumps and weight sync, written from its
source) run our ``StalenessSampler`` over the fake of NeMo's buffer (or, with ``--real-nemo``, NeMo's own
``TQReplayBuffer``, imported as ``tests/nemo_upstream/run_nemo_suite.py`` does). Every rollout is seeded
(heavy-tailed latencies of ~4 ms, 5% failures retried twice) and every 16th prompt's rollout is a straggler that
takes ``--straggler-s``. Median over seeds, with the range:

- trained: groups trained; aborted / dropped: attempts NeMo cancelled on our ``should_abort_inflight`` / groups
  evicted stale (generation thrown away); unadmitted evicted: under pace, retries NeMo started without an
  ``admit`` that still did not fit the rule when they finished (thrown away too); failed: attempts that failed or
  were cancelled (retries included);
- largest lag: the oldest group trained, in trainer versions behind (NeMo's own measure, per row);
- trainer idle: the share of wall time the train pump waited for groups; steps/s: the training rate.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

TARGET = "pyfast_buffer.integrations.nemo_rl:StalenessSampler"


def one_run(strategy: str, steps: int, seed: int, straggler_s: float, buffer_factory) -> dict:
    from _nemo_fake import NemoLoop, Rollout, create_sampler

    buffer = buffer_factory()
    sampler = create_sampler(buffer, TARGET, strategy=strategy, max_age=1)
    sampler.set_dispatch_index(0)
    per_step = 4
    capacity = sampler.required_buffer_capacity(per_step) or per_step * 3
    rollout = Rollout(seed=seed, fail_rate=0.05, straggler=lambda p: straggler_s if p % 16 == 5 else None)
    loop = NemoLoop(sampler, buffer, per_step, rollout, max_buffered=capacity)
    began = time.perf_counter()
    asyncio.run(loop.run(steps))
    wall = time.perf_counter() - began
    led = sampler.ledger()
    lags = [lag for _, _, lags in loop.trained for lag in lags]
    return {
        "trained": sum(n for _, n, _ in loop.trained),
        "aborted": led["aborted"],
        "dropped": led["dropped_stale"],
        "unadmitted evicted": led["evicted_unadmitted"],
        "failed": led["failed"],
        "largest lag": max(lags),
        "trainer idle": loop.idle_s / wall,
        "steps/s": steps / wall,
    }


def real_nemo_buffer(src: str):
    """NeMo's TQReplayBuffer over an in-memory DataPlane (the runner's import of NeMo's sampler modules)."""
    import types

    sys.path.insert(0, src)
    import nemo_rl.algorithms  # noqa: F401

    package = types.ModuleType("nemo_rl.algorithms.async_utils")
    package.__path__ = [str(Path(src) / "nemo_rl/algorithms/async_utils")]
    sys.modules[package.__name__] = package
    sys.path.insert(0, str(HERE.parent / "tests" / "nemo_upstream"))
    import in_nemo_checks as nemo

    nemo.replay_buffer_module.record_to_train_batch = nemo._rows
    return nemo.nemo_buffer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--straggler-s", type=float, default=0.3)
    parser.add_argument("--real-nemo", help="a NeMo RL checkout: run over its real TQReplayBuffer")
    args = parser.parse_args()
    if args.real_nemo:
        factory = real_nemo_buffer(args.real_nemo)
    else:
        from _nemo_fake import FakeTQReplayBuffer as factory
    print(
        f"NeMo's call order, {args.steps} steps x 4 groups, straggler {args.straggler_s} s every 16th prompt, "
        f"{args.seeds} seeds; {'NeMo TQReplayBuffer' if args.real_nemo else 'fake buffer'}"
    )
    rows = {
        s: [one_run(s, args.steps, seed, args.straggler_s, factory) for seed in range(args.seeds)]
        for s in ("drop", "wait", "pace")
    }
    keys = list(rows["drop"][0])
    print("| strategy | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for strategy, runs in rows.items():
        cells = []
        for k in keys:
            values = [r[k] for r in runs]
            med = statistics.median(values)
            fmt = "{:.2f}" if isinstance(med, float) else "{}"
            cells.append(f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})")
        print(f"| {strategy} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

"""``pyfast-buffer demo``: a simulated asynchronous rollout/trainer rhythm through both strategies.

Rollout workers receive prompts with the weights of the last sync, finish them after a
long-tailed latency (some fail), and the trainer takes a batch each tick. The same seeded
schedule runs under ``drop`` and ``wait``; the table shows what each strategy trades
(fresh data vs trainer stalls) and that the ledger reconciles exactly.
"""

from __future__ import annotations

import argparse
import random
from typing import Dict, List

from .buffer import StalenessBuffer


def simulate(strategy: str, steps: int, seed: int, max_age: int = 3, sync: int = 2, group: int = 4,
             prompts_per_tick: int = 2, batch_size: int = 8) -> Dict[str, float]:
    """Runs ``steps`` trainer ticks and returns the trainer's view and the buffer's ledger."""
    rng = random.Random(seed)
    buf = StalenessBuffer(capacity=256, max_age=max_age, strategy=strategy, parameter_sync_step=sync)
    finishing: Dict[int, List[int]] = {}  # tick -> prompts finishing then
    next_prompt = next_traj = step = trained = stalled = age_sum = 0
    for tick in range(steps):
        weights_step = step - step % sync  # rollouts use the last pushed weights
        prompts = list(range(next_prompt, next_prompt + prompts_per_tick))
        next_prompt += prompts_per_tick
        buf.dispatch(prompts, weights_step)
        for p in prompts:  # long-tailed generation latency, in ticks
            finishing.setdefault(tick + min(int(rng.expovariate(0.5)), 12), []).append(p)
        for p in finishing.pop(tick, []):
            if rng.random() < 0.05:
                buf.fail([p])
            else:
                buf.complete(list(range(next_traj, next_traj + group)), [p] * group)
                next_traj += group
        batch = buf.take(batch_size, step)
        if len(batch):
            trained += len(batch)
            age_sum += int(batch.age.sum())
            step += 1  # an optimiser step happened
        elif batch.metrics["blocked_by"] == "in_flight_at_max_age":
            stalled += 1
    led = buf.ledger()
    balanced = led["sampled_total"] == led["retired"] + led["dropped_stale"] + led["evicted"] + led["buffer_left"]
    return {"strategy": strategy, "trainer_steps": step, "trained": trained, "stalled_ticks": stalled,
            "mean_age": age_sum / trained if trained else 0.0, **led, "balanced": balanced}


def run(args: argparse.Namespace) -> int:
    rows = [simulate(s, args.steps, args.seed) for s in ("drop", "wait")]
    cols = ["strategy", "trainer_steps", "trained", "mean_age", "stalled_ticks", "sampled_total", "retired",
            "dropped_stale", "evicted", "buffer_left", "failed", "in_flight", "balanced"]
    print(f"simulated async rollouts: {args.steps} ticks, seed {args.seed}, max_age=3, parameter_sync_step=2")
    print("  ".join(f"{c:>13}" for c in cols))
    for r in rows:
        print("  ".join(f"{r[c]:>13.2f}" if isinstance(r[c], float) else f"{str(r[c]):>13}" for c in cols))
    print("ledger: sampled_total == retired + dropped_stale + evicted + buffer_left for every row:",
          all(r["balanced"] for r in rows))
    return 0 if all(r["balanced"] for r in rows) else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="simulate async rollouts through drop and wait and print the ledgers")
    p.add_argument("--steps", type=int, default=400, help="trainer ticks to simulate (default 400)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)

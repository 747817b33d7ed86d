"""slime's fully-async rollout on CPU: slime's own (no staleness bound) against ours under drop, wait and pace.

slime's arm is its real ``generate_rollout_fully_async`` (its ``AsyncRolloutWorker`` thread, its completed-group
queue) over its real ``RolloutDataSourceWithBuffer``; ours is ``collect_rollout`` (what
``pyfast_buffer.integrations.slime.generate_rollout_fully_async`` runs) over ``StalenessDataSource``. Both get the
same generate function: a lognormal latency, seeded, each group stamped with the weight version current when it
started. The same concurrency (groups generating at once), batch and number of rollout calls; each call is followed
by a train step (a sleep) and a weight push. slime's worker polls every second; it is set to poll every 5 ms here so
its producer keeps up (that is the only change to slime's arm).

Reported per arm (median over seeds): generations finished, the share of them dropped stale (wasted), the largest
and mean age trained (in weight versions), seconds per rollout call.

    python benchmarks/slime_goodput.py --slime-src /path/to/THUDM/slime [--steps 20] [--seeds 0 1 2] [--ages 1 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from types import SimpleNamespace
from typing import Any, Dict, List

ARMS = ("slime default", "drop", "wait", "pace")
BATCH, GROUP, CONCURRENCY = 4, 2, 8


def make_args(strategy: str, max_age: int) -> SimpleNamespace:
    return SimpleNamespace(
        pyfast_buffer_strategy=strategy,
        pyfast_buffer_max_age=max_age,
        pyfast_buffer_take_timeout=120.0,
        rollout_batch_size=BATCH,
        n_samples_per_prompt=GROUP,
        rollout_global_dataset=True,
        prompt_data=None,  # slime's source hands out fresh, numbered Sample() groups
        buffer_filter_path=None,
        rollout_shuffle=False,
        save=None,
        load=None,
        sglang_server_concurrency=CONCURRENCY,
    )


class Generation:
    """The generate function both arms call; counts finished groups and stamps each with its start version."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.version = 0
        self.finished = 0

    async def __call__(self, args: Any, group: List[Any], **_: Any) -> List[Any]:
        from slime.utils.types import Sample

        started = self.version
        await asyncio.sleep(0.02 * self.rng.lognormvariate(0.0, 1.0))
        for sample in group:
            sample.status = Sample.Status.COMPLETED
            sample.weight_versions = [str(started)]
            sample.response, sample.reward, sample.tokens, sample.response_length = "r", 1.0, [1, 2], 1
        self.finished += 1
        return group


def one(arm: str, max_age: int, steps: int, seed: int) -> Dict[str, float]:
    import slime.rollout.fully_async_rollout as slime_async
    from slime.rollout import data_source as slime_ds
    from slime.rollout.base_types import RolloutFnTrainOutput

    from pyfast_buffer.integrations.slime import StalenessDataSource, stop_worker
    from pyfast_buffer.integrations.slime._rollout import collect_rollout

    gen = Generation(seed)
    ages: List[int] = []
    dropped = 0
    started = time.perf_counter()
    if arm == "slime default":
        slime_async.generate_and_rm_group = gen  # type: ignore[attr-defined]
        slime_async.GenerateState = lambda args: SimpleNamespace(sampling_params={})  # type: ignore[attr-defined]
        slime_async.get_rollout_num_engines = lambda args: 1  # type: ignore[attr-defined]
        args = make_args("drop", max_age)
        source: Any = slime_ds.RolloutDataSourceWithBuffer(args)
        slime_async._get_global_worker(args, source).poll_interval = 0.005
        try:
            for rollout_id in range(steps):
                groups = slime_async.generate_rollout_fully_async(args, rollout_id, source)
                ages += [gen.version - min(int(v) for s in g for v in s.weight_versions) for g in groups]
                time.sleep(0.03)  # the train step; generation goes on
                gen.version += 1
        finally:
            slime_async._stop_global_worker()
    else:
        args = make_args(arm, max_age)
        source = StalenessDataSource(args)
        try:
            for rollout_id in range(steps):
                out = collect_rollout(
                    args, rollout_id, source, generate=gen, concurrency=CONCURRENCY, output=RolloutFnTrainOutput
                )
                ages += [gen.version - min(int(v) for s in g for v in s.weight_versions) for g in out.samples]
                time.sleep(0.03)
                gen.version += 1
        finally:
            stop_worker()
        dropped = source.store.buffer.ledger()["dropped_stale"]
    seconds = (time.perf_counter() - started) / steps
    return {
        "finished": gen.finished,
        "wasted": dropped / gen.finished if gen.finished else 0.0,
        "largest age": max(ages),
        "mean age": statistics.mean(ages),
        "s per call": seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slime-src", required=True, help="a checkout of THUDM/slime")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ages", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.slime_src))
    print("| max_age | arm | generations finished | wasted | largest age trained | mean age | s per call |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for max_age in args.ages:
        for arm in ARMS:
            runs = [one(arm, max_age, args.steps, seed) for seed in args.seeds]
            med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            print(
                f"| {max_age} | {arm} | {med['finished']:.0f} | {med['wasted']:.0%} |"
                f" {max(r['largest age'] for r in runs)} | {med['mean age']:.2f} | {med['s per call']:.3f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

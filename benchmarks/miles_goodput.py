"""Miles's fully-async rollout on CPU: its default data buffer against ours under drop, wait and pace.

Every arm runs Miles's real ``FullyAsyncRolloutFn`` machinery (its submission scheduler and drain; ours is
``StalenessRolloutFn``, a subclass) over the same seeded uneven generation latency, the same in-flight budget
(``rollout_batch_size`` groups, Miles's default), the same number of rollout calls and
``--async-unused-samples-handler retry``, so a group filtered stale is regenerated. The loop is
``tests/miles_upstream/miles_loop.py`` (rollout call, train step, weight push, as ``train_async.py`` orders them).

Reported per arm (median over seeds): groups trained per step, generations finished, the share of them filtered
stale (wasted: generated, never trained), the largest weight staleness trained, prompt groups recycled.

    python benchmarks/miles_goodput.py --miles-src /path/to/radixark/miles [--steps 24] [--seeds 0 1 2] [--ages 1 2]

Needs what ``tests/miles_upstream/run_miles_suite.py`` needs (sglang is stood in for).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
UPSTREAM = os.path.join(HERE, "..", "tests", "miles_upstream")
ARMS = ("miles default", "drop", "wait", "pace")


def one(arm: str, max_age: int, steps: int, seed: int) -> Dict[str, float]:
    import miles.rollout.fully_async_rollout as fully_async
    import miles_loop

    from pyfast_buffer.integrations.miles import StalenessRolloutFn

    default = arm == "miles default"
    args = miles_loop.miles_args(max_weight_staleness=max_age, pyfast_buffer_strategy=None if default else arm)
    fn_cls = fully_async.FullyAsyncRolloutFn if default else StalenessRolloutFn
    report = asyncio.run(miles_loop.train_loop(fn_cls, args, steps, seed))
    return {
        "trained per step": report.trained / steps,
        "finished": report.finished,
        "wasted": report.wasted,
        "largest age": max(report.ages),
        "recycled": report.recycled,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--miles-src", required=True, help="a checkout of radixark/miles")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ages", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    sys.path[:0] = [os.path.abspath(args.miles_src), UPSTREAM]
    import stubs

    stubs.install(["sglang"])
    print("| max_age | arm | trained per step | generations finished | wasted | largest age trained | recycled |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for max_age in args.ages:
        for arm in ARMS:
            runs: List[Dict[str, Any]] = [one(arm, max_age, args.steps, seed) for seed in args.seeds]
            med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            print(
                f"| {max_age} | {arm} | {med['trained per step']:.0f} | {med['finished']:.0f} | {med['wasted']:.0%} |"
                f" {max(r['largest age'] for r in runs)} | {med['recycled']:.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A Miles training loop on CPU: Miles's real ``FullyAsyncRolloutFn`` (or our ``StalenessRolloutFn``), its real
submission scheduler, drain and data buffer, over a prompt source and a generate function whose latency varies, so
that groups really go stale. Needs Miles importable (the upstream runner and ``benchmarks/miles_goodput.py`` put a
checkout on the path and stand in for sglang first).

The trainer side follows ``train_async.py`` in order: a rollout call at weight version ``v``, a train step (a sleep),
a weight push (``v + 1``); generation never stops in between. Only the generate function is ours (no engine here).
"""

from __future__ import annotations

import asyncio
import random
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import miles.rollout.fully_async_rollout as fully_async
from miles.rollout.base_types import RolloutFnConstructorInput, RolloutFnTrainInput
from miles.utils.types import Sample

GROUP = 2  # samples per prompt


def miles_args(**overrides: Any) -> Namespace:
    """The arguments FullyAsyncRolloutFn and its data buffer read, with Miles's names and defaults."""
    values: Dict[str, Any] = dict(
        rollout_global_dataset=True,
        rollout_batch_size=4,
        n_samples_per_prompt=GROUP,
        max_weight_staleness=1,
        async_max_concurrent_samples=None,
        async_data_buffer_capacity_factor=4.0,
        async_unused_samples_handler="retry",
        custom_async_data_buffer_path=None,
        rollout_submission_granularity=None,
        dynamic_sampling_filter_path=None,
        rollout_sample_filter_path=None,
        sglang_router_ip="127.0.0.1",
        sglang_router_port=30000,
        eval_num_gpus=0,
        save=None,
        load=None,
        save_interval=None,
        num_rollout=None,
    )
    values.update(overrides)
    return Namespace(**values)


class PromptSource:
    """Miles's data-source seam: hands out fresh prompt groups, recycled ones first."""

    def __init__(self) -> None:
        self.next_index = 0
        self.recycled: List[List[Sample]] = []
        self.handed_out = 0
        self.recycled_total = 0

    def get_samples(self, num_samples: int) -> List[List[Sample]]:
        groups = []
        for _ in range(num_samples):
            self.handed_out += 1
            if self.recycled:
                groups.append(self.recycled.pop(0))
                continue
            self.next_index += 1
            i = self.next_index
            groups.append([Sample(group_index=i, index=i * 10 + k, prompt=f"p{i}", label="x") for k in range(GROUP)])
        return groups

    def add_samples(self, groups: List[List[Sample]]) -> None:
        self.recycled.extend(groups)
        self.recycled_total += len(groups)


@dataclass
class Engine:
    """Stands in for generate_and_rm_group: a group takes a lognormal time and is stamped with the weight version
    current when it started (its oldest turn), as sglang stamps each turn."""

    rng: random.Random
    mean_s: float = 0.02
    sigma: float = 1.0
    version: int = 0
    finished: int = 0
    #: Each sample finishes on its own (the last one much later: a long tail), reported to the scheduler as it does,
    #: as an engine's samples do; else the whole group at once.
    staggered: bool = False

    async def generate(
        self, state: Any, group: List[Sample], sampling_params: Any, evaluation: bool = False, **kw: Any
    ) -> List[Sample]:
        started = self.version
        done = kw.get("sample_done_callback")
        if not self.staggered:
            await asyncio.sleep(self.mean_s * self.rng.lognormvariate(0.0, self.sigma))
        for k, sample in enumerate(group):
            if self.staggered:
                tail = 8.0 if k == len(group) - 1 else 0.25
                await asyncio.sleep(tail * self.mean_s * self.rng.lognormvariate(0.0, self.sigma))
            sample.response, sample.reward, sample.status = "ok", 1.0, Sample.Status.COMPLETED
            sample.weight_versions = [str(started)]
            if done is not None:
                done()
        self.finished += 1
        return group


class _State:
    def __init__(self, args: Any) -> None:
        self.args, self.sampling_params, self.aborted = args, {}, False


@dataclass
class Report:
    trained_per_step: List[int] = field(default_factory=list)
    trained_ids: List[List[int]] = field(default_factory=list)  # per step, each group's group_index
    ages: List[int] = field(default_factory=list)
    finished: int = 0
    stale_filtered: int = 0
    recycled: int = 0
    metrics: List[Dict[str, float]] = field(default_factory=list)
    rollout_fn: Optional[Any] = None
    source: Optional[PromptSource] = None

    @property
    def trained(self) -> int:
        return sum(self.trained_per_step)

    @property
    def wasted(self) -> float:
        """Share of finished generations filtered stale (regenerated or discarded, never trained)."""
        return self.stale_filtered / self.finished if self.finished else 0.0


def install_engine(engine: Engine) -> None:
    """Points Miles's rollout module at our generate function and a GenerateState that needs no server."""
    fully_async.GenerateState = _State  # type: ignore[attr-defined]
    fully_async.generate_and_rm_group = engine.generate  # type: ignore[attr-defined]


async def train_loop(
    fn_cls: Any,
    args: Namespace,
    steps: int,
    seed: int,
    train_s: float = 0.03,
    start: int = 0,
    source: Optional[PromptSource] = None,
    staggered: bool = False,
) -> Report:
    """Runs ``steps`` rollout calls of ``fn_cls`` from rollout ``start``; returns what was trained and wasted."""
    engine = Engine(random.Random(seed), version=start, staggered=staggered)
    install_engine(engine)
    source = source or PromptSource()
    fn = fn_cls(RolloutFnConstructorInput(args=args, data_source=source))
    report = Report(rollout_fn=fn, source=source)
    for rollout_id in range(start, start + steps):
        out = await asyncio.wait_for(
            fn(RolloutFnTrainInput(rollout_id=rollout_id, weight_version=engine.version)), timeout=60
        )
        report.trained_per_step.append(len(out.samples))
        report.trained_ids.append([g[0].group_index for g in out.samples])
        report.ages += [engine.version - min(int(v) for s in g for v in s.weight_versions) for g in out.samples]
        report.metrics.append(out.metrics)
        report.stale_filtered += int(out.metrics.get("rollout/fully_async/stale_groups_filtered", 0))
        await asyncio.sleep(train_s)  # the train step; generation goes on
        engine.version += 1  # the weight push after it
    report.finished = engine.finished
    report.recycled = source.recycled_total
    if fn._worker is not None:
        fn._worker.cancel()
    return report

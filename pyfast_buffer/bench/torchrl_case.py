"""The TorchRL case: our StalenessSampler beside TorchRL's StalenessAwareSampler and RandomSampler, in one process.

A LazyTensorStorage of 65,536 rows (observation [4], action [2], policy_version = the chunk it came in) filled by
128 ``extend(512)``; the consumer is at version 128, so ages run 1..128.

- ``sample``: ``sampler.sample(storage, 512)``, the sampler's own work (TorchRL's gather of the rows is the
  same for every sampler). StalenessAwareSampler rescans the version column and draws without replacement; ours
  takes from its core (``max_uses`` unbounded here, so every call has the same rows to choose from, as TorchRL's
  samplers do). With no bound (``max_age`` of 128 for ours, ``max_staleness=-1`` for TorchRL's) and a bound of 64
  (half the rows too old: our first call drops them, counted; that call is warm-up). RandomSampler is the floor:
  512 random indices, no staleness at all.
- ``extend``: ``rb.extend(512)`` of a TensorDictReplayBuffer, the whole write path, with each sampler; the
  floor is the copy of the same 512 rows into the storage's columns (``storage.set``), which every write does.
  Ours reads the rows' versions there and applies the write to its core at the next sample, so:
- ``cycle``: one ``extend(512)`` and one ``sample(512)``, the whole cost of a write and a read.
"""

from __future__ import annotations

from typing import Any, Dict, List

from .plan import Plan
from .timing import median, percentile, sample_interleaved

ROWS, BATCH, VERSIONS = 65_536, 512, 128


def _rows(version: int, torch: Any, TensorDict: Any) -> Any:
    return TensorDict(
        {
            "observation": torch.randn(BATCH, 4),
            "action": torch.randn(BATCH, 2),
            "policy_version": torch.full((BATCH,), version, dtype=torch.int64),
        },
        [BATCH],
    )


def torchrl_case(plan: Plan, skipped: Dict[str, str]) -> List[Dict]:
    try:
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        from torchrl.data.replay_buffers.samplers import RandomSampler, StalenessAwareSampler

        from ..integrations.torchrl import StalenessSampler
    except ImportError as exc:
        skipped["torchrl"] = f"torchrl is not installed ({exc}): pip install 'pyfast_buffer[torchrl]'"
        return []
    torch.set_num_threads(1)  # TorchRL's own measurements of its samplers are single-threaded; 2 cores are noisy
    rows: List[Dict] = []
    repeat = max(plan.repeat, 15)

    def filled(sampler: Any) -> Any:
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(ROWS), sampler=sampler, batch_size=BATCH)
        for v in range(VERSIONS):
            rb.extend(_rows(v, torch, TensorDict))
        return rb

    for bound in (None, 64):
        ours = StalenessSampler(max_age=VERSIONS if bound is None else bound, max_uses=2**31 - 1, info_key="staleness")
        theirs = StalenessAwareSampler(max_staleness=-1 if bound is None else bound)
        contenders: Dict[str, Any] = {}
        sampler: Any
        for name, sampler in (
            ("pyfast_buffer", ours),
            ("StalenessAwareSampler", theirs),
            ("RandomSampler (floor)", RandomSampler()),
        ):
            rb = filled(sampler)
            if not isinstance(sampler, RandomSampler):
                sampler.consumer_version = VERSIONS
            storage = rb.storage
            contenders[name] = ((lambda s=sampler, st=storage: s.sample(st, BATCH)), None, 1)
        times = sample_interleaved(contenders, repeat)
        for name, t in times.items():
            rows.append(_row("sample", name, t, bound))
    write = _rows(0, torch, TensorDict)
    contenders = {}
    for name, sampler in (
        ("pyfast_buffer", StalenessSampler(max_age=VERSIONS)),
        ("StalenessAwareSampler", StalenessAwareSampler()),
        ("RandomSampler", RandomSampler()),
    ):
        rb = filled(sampler)
        contenders[name] = ((lambda rb=rb: rb.extend(write)), None, 1)
    floor_rb = filled(RandomSampler())
    index = torch.arange(BATCH)
    contenders["copy (floor)"] = ((lambda s=floor_rb.storage: s.set(index, write)), None, 1)
    for name, t in sample_interleaved(contenders, repeat).items():
        rows.append(_row("extend", name, t, None))
    # A write is recorded at extend and applied to our core at the next sample: the cycle counts both.
    contenders = {}
    for name, sampler in (
        ("pyfast_buffer", StalenessSampler(max_age=VERSIONS, max_uses=2**31 - 1)),
        ("StalenessAwareSampler", StalenessAwareSampler()),
        ("RandomSampler", RandomSampler()),
    ):
        rb = filled(sampler)
        if not isinstance(sampler, RandomSampler):
            sampler.consumer_version = VERSIONS

        def cycle(rb: Any = rb, sampler: Any = sampler) -> None:
            rb.extend(write)
            sampler.sample(rb.storage, BATCH)

        contenders[name] = (cycle, None, 1)
    for name, t in sample_interleaved(contenders, repeat).items():
        rows.append(_row("cycle", name, t, None))
    return rows


def _row(op: str, contender: str, times: List[float], bound: Any) -> Dict:
    return {
        "case": "torchrl",
        "op": op,
        "contender": contender,
        "batch": BATCH,
        "capacity": ROWS,
        "order": "no bound" if bound is None else f"max_age {bound}",
        "median_s": median(times),
        "p99_s": percentile(times, 99),
        "runs": len(times),
    }

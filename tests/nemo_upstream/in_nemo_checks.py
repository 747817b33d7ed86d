"""pyfast_buffer's NeMo RL sampler with NeMo's real classes (run by run_nemo_suite.py, which imports NeMo).

NeMo's pydantic ``SamplerConfig`` parses our config, NeMo's ``create_sampler`` builds the sampler and checks it
against NeMo's ``PromptGroupSampler`` protocol, and NeMo's call order (``_nemo_fake.NemoLoop``) drives it over
NeMo's real ``TQReplayBuffer``, whose DataPlane is an in-memory client; a resume goes through NeMo's own
``state_dict``/``load_state_dict``. Not collected by the project's pytest run (it needs a NeMo checkout).
"""

from __future__ import annotations

import asyncio
from typing import Any

import nemo_rl.algorithms.async_utils.replay_buffer as replay_buffer_module
import pytest
import torch
from _nemo_fake import NemoLoop, Rollout, balanced
from nemo_rl.algorithms.async_utils.replay_buffer import TQReplayBuffer
from nemo_rl.algorithms.async_utils.staleness_sampler import PromptGroupSampler, SamplerConfig, create_sampler
from nemo_rl.data_plane import KVBatchMeta
from nemo_rl.distributed.batched_data_dict import BatchedDataDict
from nemo_rl.experience.interfaces import PromptGroupRecord
from pydantic import TypeAdapter

from pyfast_buffer.integrations.nemo_rl import StalenessSampler

TARGET = "pyfast_buffer.integrations.nemo_rl:StalenessSampler"
ROWS = 2  # num_generations_per_prompt
LIVENESS_S = 120.0
PARTITION = "rollout_data"


class MemoryDataPlane:
    """An in-memory DataPlane client with the calls TQReplayBuffer makes (put, get, clear)."""

    def __init__(self) -> None:
        self.rows: dict = {}

    def put_samples(self, sample_ids, partition_id, fields=None, tags=None):
        for i, sid in enumerate(sample_ids):
            self.rows[sid] = (fields, None if tags is None else tags[i])
        return KVBatchMeta(
            partition_id=partition_id, task_name=None, sample_ids=list(sample_ids), fields=None, tags=tags
        )

    def get_samples(self, sample_ids, partition_id, select_fields=None):
        return {"rows": list(sample_ids)}

    def clear_samples(self, sample_ids, partition_id):
        for sid in list(sample_ids) if sample_ids is not None else list(self.rows):
            self.rows.pop(sid, None)


def _rows(record: PromptGroupRecord, *, pad_value_dict: Any) -> BatchedDataDict:
    """A record's training rows (NeMo's own buffer tests replace the tokenizing converter the same way)."""
    return BatchedDataDict(
        {
            "input_ids": torch.ones((ROWS, 3), dtype=torch.long),
            "input_lengths": torch.full((ROWS,), 3, dtype=torch.long),
            "total_reward": torch.zeros(ROWS),
        }
    )


@pytest.fixture(autouse=True)
def _converter(monkeypatch):
    monkeypatch.setattr(replay_buffer_module, "record_to_train_batch", _rows)


class NemoBuffer(TQReplayBuffer):
    """NeMo's TQReplayBuffer; ``commit`` takes the fake loop's arguments and builds a record for NeMo's."""

    n_rows = ROWS

    async def commit(self, group_id, lengths, start_weight_version, end_weight_version):  # type: ignore[override]
        record = PromptGroupRecord(
            prompt_idx=0, prompt=[], extra_env_info=None, metadata={}, completions=[], rollout_metrics={}
        )
        return await super().commit(group_id, record, start_weight_version, end_weight_version)


def nemo_buffer() -> NemoBuffer:
    return NemoBuffer(MemoryDataPlane(), PARTITION, pad_value_dict={"token_ids": 0})


def build(buffer: Any, **extras: Any) -> StalenessSampler:
    config = TypeAdapter(SamplerConfig).validate_python({"name": "custom", "target": TARGET, **extras})
    sampler = create_sampler(buffer, config)  # NeMo's factory: importlib, cls(buffer, **extras), the protocol check
    assert isinstance(sampler, PromptGroupSampler) and isinstance(sampler, StalenessSampler)
    return sampler


def loop_for(strategy: str, buffer: Any = None, rollout: Any = None, per_step: int = 4, **extras: Any) -> NemoLoop:
    buffer = buffer if buffer is not None else nemo_buffer()
    sampler = build(buffer, strategy=strategy, max_age=1, **extras)
    sampler.set_dispatch_index(0)
    capacity = sampler.required_buffer_capacity(per_step) or per_step * 3
    return NemoLoop(sampler, buffer, per_step, rollout or Rollout(seed=1), max_buffered=capacity)


def test_nemos_config_and_factory_build_ours_and_pass_extras():
    sampler = build(nemo_buffer(), strategy="pace", max_age=2, lookahead=1)
    assert sampler.options.strategy == "pace" and sampler.options.max_age == 2
    assert sampler.required_buffer_capacity(4) == 8
    with pytest.raises(TypeError, match="unknown key 'max_ages'"):
        build(nemo_buffer(), max_ages=2)


@pytest.mark.parametrize("strategy", ["drop", "wait", "pace"])
def test_nemos_call_order_over_its_real_buffer_accounts_for_every_attempt(strategy):
    loop = loop_for(strategy, rollout=Rollout(seed=3, fail_rate=0.1))
    asyncio.run(asyncio.wait_for(loop.run(20), LIVENESS_S))
    led = balanced(loop)
    lags = [lag for _, _, lags in loop.trained for lag in lags]
    assert sum(n for _, n, _ in loop.trained) == 20 * 4
    if strategy != "wait":
        assert max(lags) <= 1
    if strategy == "pace":
        assert led["dropped_stale"] == 0 and led["trained_over_age"] == 0
    cleared = set(loop.buffer._dp_client.rows)
    held = {sid for meta in loop.buffer.meta_list if meta is not None for sid in meta.sample_ids}
    assert held <= cleared  # the groups still buffered still have their rows; evicted ones were cleared


@pytest.mark.parametrize("strategy", ["drop", "wait", "pace"])
def test_the_3238_straggler_over_nemos_buffer_never_wedges_training(strategy):
    rollout = Rollout(seed=2, fail_rate=0.0, straggler=lambda p: 0.3 if p == 5 else None)
    loop = loop_for(strategy, rollout=rollout)
    asyncio.run(asyncio.wait_for(loop.run(15), LIVENESS_S))
    led = balanced(loop)
    assert sum(n for _, n, _ in loop.trained) == 15 * 4
    if strategy == "drop":
        assert led["aborted"] + led["dropped_stale"] >= 1
    else:
        assert led["dropped_stale"] == 0


def test_a_resume_through_nemos_buffer_checkpoint_keeps_pace_bounded(tmp_path):
    state = str(tmp_path / "sampler.pfb")
    loop = loop_for("pace", state_path=state)
    asyncio.run(asyncio.wait_for(loop.run(6), LIVENESS_S))
    saved = asyncio.run(loop.buffer.state_dict(saved_capacity=loop.max_buffered))
    buffer = nemo_buffer()  # a new process: buffer, sampler (same state_path), NeMo's restore, resume at step 6
    sampler = build(buffer, strategy="pace", max_age=1, state_path=state)
    sampler.set_dispatch_index(6)
    sampler.required_buffer_capacity(4)
    asyncio.run(
        buffer.load_state_dict(
            saved, max_groups=loop.max_buffered, expected_partition_id=PARTITION, expected_group_size=ROWS
        )
    )
    resumed = NemoLoop(sampler, buffer, 4, Rollout(seed=5), max_buffered=loop.max_buffered, start_version=6)
    resumed.capacity = asyncio.Semaphore(loop.max_buffered - len(buffer))  # NeMo holds a permit per restored group
    asyncio.run(asyncio.wait_for(resumed.run(6), LIVENESS_S))
    led = sampler.ledger()
    assert led["trained_over_age"] == 0 and led["dropped_stale"] == 0
    assert max(lag for _, _, lags in resumed.trained for lag in lags) <= 1

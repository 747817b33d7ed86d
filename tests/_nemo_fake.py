"""NeMo RL's replay-buffer surface and its single-controller call order, written from NeMo's source (HEAD 7ea279abf,
``nemo_rl/algorithms/async_utils/replay_buffer.py`` ``TQReplayBuffer``, ``staleness_sampler.py`` ``create_sampler``,
``single_controller.py`` the rollout and train pumps), so the NeMo sampler is tested where NeMo cannot be installed.

- ``KVBatchMeta``: the fields and ``concat`` of NeMo's ``nemo_rl.data_plane.interfaces.KVBatchMeta``.
- ``FakeTQReplayBuffer``: the six parallel lists, ``reserve`` (sync), ``commit`` (async: writes the rows, then
  re-finds the entry and marks it ready), ``remove_group``, ``remove`` (deletes synchronously before its one await,
  ``IndexError`` past the end), ``state_dict``/``load_state_dict`` (ready groups only, as NeMo's).
- ``create_sampler``: ``"module:Class"`` imported, ``Class(buffer, **extras)``, the protocol check by member presence.
- ``NemoLoop``: the rollout pump (``admit`` per batch, a capacity permit and the dispatch gate per prompt, attempts
  with retries: reserve -> generate -> commit or remove_group), the train pump (``evict`` then ``select`` until a step
  has its groups, permits released by their counts) and the weight sync (``should_abort_inflight`` over the
  unfinished attempts, cancelled ones removed and lost, as NeMo's).
"""

from __future__ import annotations

import asyncio
import importlib
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

#: NeMo's PromptGroupSampler members (``typing._get_protocol_attrs`` of the Protocol at HEAD).
PROTOCOL = (
    "admit",
    "select",
    "evict",
    "should_abort_inflight",
    "is_on_policy",
    "required_buffer_capacity",
    "set_dispatch_index",
)


@dataclass
class KVBatchMeta:
    partition_id: str
    sample_ids: List[str]
    task_name: Optional[str] = "train"
    fields: Optional[List[str]] = None
    sequence_lengths: Optional[List[int]] = None
    extra_info: Dict[str, Any] = field(default_factory=dict)
    tags: Optional[List[dict]] = None

    def __post_init__(self) -> None:
        if self.tags is not None and len(self.tags) != len(self.sample_ids):
            raise ValueError("tags must be one per sample id")

    @property
    def size(self) -> int:
        return len(self.sample_ids)

    def concat(self, *others: KVBatchMeta) -> KVBatchMeta:
        metas = (self, *others)
        if any(m.partition_id != self.partition_id for m in metas):
            raise ValueError("cannot concat metas of different partitions")
        lengths = [x for m in metas for x in m.sequence_lengths] if all(m.sequence_lengths for m in metas) else None
        tags = [t for m in metas for t in m.tags] if all(m.tags is not None for m in metas) else None
        return KVBatchMeta(
            self.partition_id, [s for m in metas for s in m.sample_ids], self.task_name, self.fields, lengths, {}, tags
        )


class FakeTQReplayBuffer:
    """NeMo's TQReplayBuffer surface (see the module docstring); ``cleared`` records the rows cleared."""

    def __init__(self, n_rows: int = 2, partition_id: str = "train") -> None:
        self.n_rows, self.partition_id = n_rows, partition_id
        self.meta_list: List[Optional[KVBatchMeta]] = []
        self.start_weight_list: List[int] = []
        self.end_weight_list: List[int] = []
        self.target_step_list: List[Optional[int]] = []
        self.ready_list: List[bool] = []
        self._group_ids: List[str] = []
        self.cleared: List[str] = []

    def size(self) -> int:
        return len(self.ready_list)

    def __len__(self) -> int:
        return self.size()

    def reserve(self, *, weight_version: int, target_step: Optional[int] = None, group_id: Optional[str] = None) -> str:
        gid = group_id or uuid.uuid4().hex
        self.meta_list.append(None)
        self.start_weight_list.append(weight_version)
        self.end_weight_list.append(-1)
        self.target_step_list.append(target_step)
        self.ready_list.append(False)
        self._group_ids.append(gid)
        return gid

    async def commit(
        self, group_id: str, lengths: List[int], start_weight_version: int, end_weight_version: int
    ) -> Any:
        if group_id not in self._group_ids:
            raise ValueError(f"unknown group_id {group_id!r}")
        await asyncio.sleep(0)  # NeMo awaits the DataPlane put here, then finds the entry again
        i = self._group_ids.index(group_id)
        ids = [f"{group_id}_g{k}" for k in range(len(lengths))]
        meta = KVBatchMeta(
            self.partition_id,
            ids,
            fields=["input_ids"],
            sequence_lengths=list(lengths),
            tags=[{"weight_version": start_weight_version}] * len(ids),
        )
        self.meta_list[i], self.end_weight_list[i], self.ready_list[i] = meta, end_weight_version, True
        return meta

    async def remove_group(self, group_id: str, *, remove_in_dp: bool = False) -> int:
        if group_id not in self._group_ids:
            raise ValueError(f"unknown group_id {group_id!r}")
        return await self.remove([self._group_ids.index(group_id)], remove_in_dp)

    async def remove(self, idxs: List[int], remove_in_dp: bool) -> int:
        if not idxs:
            return 0
        if max(idxs) >= self.size():
            raise IndexError(f"index {max(idxs)} out of range for a buffer of {self.size()}")
        rows = []
        for i in sorted(idxs, reverse=True):  # deleted synchronously, before the one await
            meta = self.meta_list[i]
            rows += meta.sample_ids if meta is not None else []
            for column in (
                self.meta_list,
                self.start_weight_list,
                self.end_weight_list,
                self.target_step_list,
                self.ready_list,
                self._group_ids,
            ):
                del column[i]
        if remove_in_dp:
            self.cleared += rows
        await asyncio.sleep(0)
        return len(idxs)

    async def state_dict(self) -> dict:
        keep = [i for i, ready in enumerate(self.ready_list) if ready]  # in-flight (unready) slots are not saved
        return {
            "groups": [
                (
                    self._group_ids[i],
                    self.start_weight_list[i],
                    self.end_weight_list[i],
                    self.meta_list[i].sequence_lengths,
                )
                for i in keep
            ]
        }

    async def load_state_dict(self, state: dict) -> int:
        for gid, start, end, lengths in state["groups"]:  # appended ready, never reserved
            self._group_ids.append(gid)
            self.start_weight_list.append(start)
            self.end_weight_list.append(end)
            self.target_step_list.append(None)
            self.ready_list.append(False)
            self.meta_list.append(None)
            await self.commit(gid, lengths, start, end)
        return len(state["groups"])


def create_sampler(buffer: Any, target: str, **extras: Any) -> Any:
    """NeMo's ``create_sampler`` for ``name: custom``: imports ``module:Class``, builds it, checks the protocol."""
    module, sep, name = target.partition(":")
    if not sep:
        raise ValueError(f"custom sampler target must be 'module:ClassName', got {target!r}")
    sampler = getattr(importlib.import_module(module), name)(buffer, **extras)
    missing = [m for m in PROTOCOL if not hasattr(sampler, m)]
    if missing:
        raise TypeError(f"{target} does not implement the PromptGroupSampler interface: missing {missing}")
    return sampler


@dataclass
class Rollout:
    """The fake engine: per attempt a latency (seconds) and whether it fails; seeded."""

    seed: int = 0
    median_s: float = 0.004
    fail_rate: float = 0.05
    straggler: Optional[Callable[[int], Optional[float]]] = None  # prompt index -> a latency that overrides
    timeout_s: Optional[float] = None  # NeMo's generation_timeout_s: an attempt past it fails
    #: prompt index -> the latency after which its first attempt fails (None: as the others)
    fail_first: Optional[Callable[[int], Optional[float]]] = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.attempts: Counter = Counter()

    def plan(self, prompt: int) -> tuple:
        self.attempts[prompt] += 1
        latency = min(0.2, self.median_s * self.rng.lognormvariate(0.0, 1.0))
        fails = self.rng.random() < self.fail_rate
        if self.fail_first is not None and self.attempts[prompt] == 1 and self.fail_first(prompt) is not None:
            return self.fail_first(prompt), True
        if self.straggler is not None and self.straggler(prompt) is not None:
            latency = self.straggler(prompt)
        return latency, fails


class NemoLoop:
    """NeMo's single-controller pumps around one sampler and one buffer (see the module docstring)."""

    def __init__(
        self,
        sampler: Any,
        buffer: FakeTQReplayBuffer,
        prompts_per_step: int,
        rollout: Rollout,
        max_buffered: int,
        train_s: float = 0.002,
        retries: int = 2,
        start_version: int = 0,
    ) -> None:
        self.sampler, self.buffer, self.per_step, self.rollout = sampler, buffer, prompts_per_step, rollout
        self.train_s, self.retries = train_s, retries
        self.trainer_version = self.generation_version = start_version
        self.capacity = asyncio.Semaphore(max_buffered)
        self.max_buffered = max_buffered
        self.permitted = asyncio.Event()
        self.permitted.set()
        self.inflight: Dict[str, tuple] = {}  # group id -> (task, start weight)
        self.trained: List[tuple] = []  # (trainer version, min start weight of the chunk, ages)
        self.counts: Counter = Counter()
        self.idle_s = 0.0
        self.next_prompt = 0
        self.tasks: set = set()
        self.shortfall: Counter = Counter()  # NeMo's _batch_shortfall: target step -> groups given up on

    async def _dispatch_one(self, prompt: int, target: Optional[int] = None) -> None:
        owns_permit = True
        try:
            for _attempt in range(self.retries + 1):
                gid = self.buffer.reserve(weight_version=self.generation_version)
                start = self.generation_version
                self.inflight[gid] = (asyncio.current_task(), start)
                self.counts["attempts"] += 1
                latency, fails = self.rollout.plan(prompt)
                try:
                    if self.rollout.timeout_s is not None and latency > self.rollout.timeout_s:
                        await asyncio.sleep(self.rollout.timeout_s)
                        raise TimeoutError("generation_timeout_s")
                    await asyncio.sleep(latency)
                    if fails:
                        raise RuntimeError("rollout failed")
                    del self.inflight[gid]  # past abort's reach: NeMo's commit awaits the DataPlane put
                    await self.buffer.commit(gid, [3] * self.buffer.n_rows, start, self.generation_version)
                except Exception:  # infra or data failure: the slot goes, the prompt is retried
                    self.inflight.pop(gid, None)
                    await self.buffer.remove_group(gid)
                    self.counts["failed_attempts"] += 1
                    continue
                except BaseException:  # cancelled (should_abort_inflight, or the run ends): removed, lost, not retried
                    self.inflight.pop(gid, None)
                    if gid in self.buffer._group_ids and not self.buffer.ready_list[self.buffer._group_ids.index(gid)]:
                        await self.buffer.remove_group(gid)
                    raise
                owns_permit = False  # the train pump releases it, by select's and evict's counts
                self.counts["committed"] += 1
                return
            self.counts["skipped_prompts"] += 1
            if target is not None:  # NeMo's _credit_shortfall: that step closes one group short
                self.shortfall[target] += 1
        finally:
            if owns_permit:
                self.capacity.release()

    async def rollout_pump(self) -> None:
        # NeMo's pump runs until the trainer stops it: a fixed number of batches would run dry
        # when aborts, skips and drops eat the attempts.
        while True:
            target = await self.sampler.admit(trainer_version_fn=lambda: self.trainer_version)
            for _ in range(self.per_step):
                await self.capacity.acquire()
                try:
                    await self.permitted.wait()
                except BaseException:  # stopped between the permit and the dispatch: give the permit back
                    self.capacity.release()
                    raise
                task = asyncio.create_task(self._dispatch_one(self.next_prompt, target))
                self.next_prompt += 1
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def train_step(self) -> None:
        v = self.trainer_version
        dispatched = 0
        loop = asyncio.get_running_loop()
        waited_from = loop.time()
        while dispatched < self.per_step - self.shortfall[v]:  # NeMo's _target_groups_for_step
            await asyncio.sleep(0)
            for _ in range(await self.sampler.evict(current_train_weight=v)):
                self.capacity.release()
            want = self.per_step - self.shortfall[v] - dispatched
            meta, n = await self.sampler.select(current_train_weight=v, min_prompt_groups=1, max_prompt_groups=want)
            if meta is None:
                await asyncio.sleep(0.002)
                continue
            for _ in range(n):
                self.capacity.release()
            self.idle_s += loop.time() - waited_from
            lags = [v - tag["weight_version"] for tag in meta.tags]
            self.trained.append((v, n, lags))
            await asyncio.sleep(self.train_s)
            waited_from = loop.time()
            dispatched += n
        self.trainer_version += 1
        await self.sync_weights()

    async def sync_weights(self) -> None:
        self.permitted.clear()
        stale = [
            task
            for task, start in list(self.inflight.values())
            if self.sampler.should_abort_inflight(start_weight_version=start, current_train_weight=self.trainer_version)
        ]
        for task in stale:
            task.cancel()
        self.counts["aborted"] += len(stale)
        await asyncio.gather(*stale, return_exceptions=True)
        self.generation_version = self.trainer_version
        self.permitted.set()

    async def run(self, steps: int) -> None:
        pump = asyncio.create_task(self.rollout_pump())
        try:
            for _ in range(steps):
                await self.train_step()
        finally:
            pump.cancel()
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(pump, *self.tasks, return_exceptions=True)


def balanced(loop: NemoLoop) -> dict:
    """Every attempt NeMo started is in the core once; each is trained, dropped, failed or still held; the
    permits NeMo's pumps hold are exactly its groups still buffered."""
    led = loop.sampler.ledger()
    trained = sum(n for _, n, _ in loop.trained)
    assert led["taken"] == trained, (led, trained)
    # Under pace a failed attempt's slot goes back to its retry (one core entry, several attempts), and a slot
    # given back that NeMo then gave up on is failed without another attempt.
    takes = led["dispatched"] + led["slots_returned"] - led["slots_open"] - led["given_up"]
    started = takes + led["started_unadmitted"]
    assert started == loop.counts["attempts"], led
    assert led["dispatched"] == led["completed"] + led["failed"] + led["in_flight"], led
    assert led["sampled_total"] == led["retired"] + led["dropped_stale"] + led["evicted"] + led["buffer_left"], led
    assert len(loop.buffer) == sum(loop.buffer.ready_list)  # the run's end cancelled every unfinished attempt
    assert loop.capacity._value == loop.max_buffered - len(loop.buffer), "a capacity permit leaked"
    return led

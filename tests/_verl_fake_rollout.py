"""A fake generation backend for verl's real trainer on CPU: an LLM server and an agent-loop worker of our own.

``FakeLLMServer`` stands for the inference engines: it holds the weight version the trainer last pushed,
pauses while verl sleeps or aborts the replicas and resumes when they wake (so a generation can span a weight
update, as verl's partial rollout does), and draws, from one seeded generator, each prompt's plan: a
heavy-tailed latency per session (lognormal, capped), a few failures, a response length that grows with the
latency, and a 0/1 accuracy per session (some groups all equal, so DAPO filters them).

``FakeAgentLoopWorker`` does what verl's ``AgentLoopWorkerTQ`` does with TransferQueue, nothing more: the prompt
tag goes ``running``, each session's trajectory is written as ``{uid}_{session}_0`` with verl's tags
(``status``, ``prompt_len``, ``response_len``, ``seq_len``, ``global_steps``, ``min_global_steps``,
``max_global_steps``) and fields (``rm_scores`` with the reward at the last token,
``extra_fields.reward_extra_info`` with ``acc`` and ``score``), and the prompt ends ``finished``, or ``failure``
once every session has settled. ``with_fake_workers(manager_cls)`` makes any verl agent-loop manager class
(verl's own, or ours) start these workers instead of verl's.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import ray
import torch

SESSION_SLICE_S = 0.005  # a generation advances in slices, so a pause stops it within one


@ray.remote(num_cpus=0)
class FakeLLMServer:
    """The engines: weight version, awake or paused, and every prompt's generation plan (seeded)."""

    def __init__(
        self,
        seed: int,
        median_s: float = 0.01,
        sigma: float = 1.0,
        cap_s: float = 0.3,
        fail_rate: float = 0.04,
        fail_always: bool = False,
        straggler_every: int = 0,  # every k-th prompt has one session of straggler_s
        straggler_s: float = 1.5,
        all_same_rate: float = 0.2,  # prompts every session of which gets the same 0/1 accuracy (DAPO filters them)
        slots: int = 0,  # concurrent sessions (an engine's max_num_seqs); 0: unlimited. The rest queue.
    ) -> None:
        self.rng = random.Random(seed)
        self.median_s, self.sigma, self.cap_s = median_s, sigma, cap_s
        self.fail_rate, self.fail_always = fail_rate, fail_always
        self.straggler_every, self.straggler_s = straggler_every, straggler_s
        self.all_same_rate = all_same_rate
        self.planned = 0
        self.version = 0
        self.awake = asyncio.Event()
        self.awake.set()
        self.slots = asyncio.Semaphore(slots) if slots else None
        self.generated = 0  # sessions that ran to the end
        self.started = 0

    def set_version(self, version: int) -> None:
        self.version = int(version)

    def pause(self) -> None:
        self.awake.clear()

    def resume(self) -> None:
        self.awake.set()

    def plan(self, n: int) -> dict:
        """One prompt's plan: latencies (s), the session that fails (or -1), accuracies, response lengths."""
        latencies = [min(self.cap_s, self.median_s * math.exp(self.rng.gauss(0.0, self.sigma))) for _ in range(n)]
        self.planned += 1
        if self.straggler_every and self.planned % self.straggler_every == 0:
            latencies[0] = self.straggler_s  # one slow session holds its whole group (verl waits for every session)
        fails = self.fail_always or self.rng.random() < self.fail_rate
        p_correct = self.rng.choice([0.0, 1.0]) if self.rng.random() < self.all_same_rate else 0.5
        return {
            "latencies": latencies,
            "failing": self.rng.randrange(n) if fails else -1,
            "acc": [float(self.rng.random() < p_correct) for _ in range(n)],
            "response_len": [2 + int(40 * min(lat, self.cap_s) / self.cap_s) for lat in latencies],
        }

    async def generate(self, latency_s: float) -> tuple[int, int]:
        """Runs one session for ``latency_s`` of awake time; returns (first, last) weight version it ran with."""
        if self.slots is not None:
            async with self.slots:  # queued sessions start later, with whatever weights are in force then
                return await self._run(latency_s)
        return await self._run(latency_s)

    async def _run(self, latency_s: float) -> tuple[int, int]:
        self.started += 1
        first = None
        left = latency_s
        while left > 0:
            await self.awake.wait()
            if first is None:
                first = self.version
            step = min(left, SESSION_SLICE_S)
            await asyncio.sleep(step)
            left -= step
        self.generated += 1
        return (self.version if first is None else first), self.version

    def counts(self) -> dict:
        return {"started": self.started, "generated": self.generated, "version": self.version}


class SessionFailed(RuntimeError):
    """A planned generation failure (verl's worker marks the prompt ``failure`` once all sessions settle)."""


@ray.remote(num_cpus=0)
class FakeAgentLoopWorker:
    """verl's AgentLoopWorkerTQ, TransferQueue side only; the server plays the engine and the reward."""

    def __init__(self, config: Any, llm_client: Any, teacher_client: Any = None, reward_handles: Any = None) -> None:
        import transfer_queue as tq

        tq.init()
        self.tq = tq
        self.server = llm_client
        self.n = int(config.actor_rollout_ref.rollout.n)
        self.val_n = int(config.actor_rollout_ref.rollout.val_kwargs.n)
        self.tasks: set = set()

    async def generate_sequences(self, batch: Any) -> None:
        """Starts every prompt of ``batch`` in the background and returns at once (as verl's worker does)."""
        validate = bool(non_tensor(batch, "validate", False))
        step = int(non_tensor(batch, "global_steps", 0))
        for i in range(len(batch)):
            uid = str(batch["uid"][i])
            task = asyncio.create_task(self._run_prompt(uid, step, validate))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _run_prompt(self, uid: str, step: int, validate: bool) -> None:
        partition = "val" if validate else "train"
        await self.tq.async_kv_put(key=uid, partition_id=partition, tag={"status": "running"})
        n = self.val_n if validate else self.n
        plan = await self.server.plan.remote(n)
        sessions = [asyncio.create_task(self._run_session(uid, step, i, plan, partition)) for i in range(n)]
        results = await asyncio.gather(*sessions, return_exceptions=True)
        status = "failure" if any(isinstance(r, BaseException) for r in results) else "finished"
        await self.tq.async_kv_put(key=uid, partition_id=partition, tag={"status": status})

    async def _run_session(self, uid: str, step: int, session: int, plan: dict, partition: str) -> None:
        first, last = await self.server.generate.remote(plan["latencies"][session])
        if session == plan["failing"]:
            raise SessionFailed(f"{uid}_{session}")
        prompt_len, response_len = 4, plan["response_len"][session]
        acc = plan["acc"][session]
        prompts = torch.ones(prompt_len, dtype=torch.int64)
        responses = torch.full((response_len,), 2, dtype=torch.int64)
        rm_scores = torch.zeros(response_len, dtype=torch.float32)
        rm_scores[-1] = acc
        field = {
            "prompts": prompts,
            "responses": responses,
            "response_mask": torch.ones(response_len, dtype=torch.int64),
            "input_ids": torch.cat([prompts, responses]),
            "attention_mask": torch.ones(prompt_len + response_len, dtype=torch.int64),
            "rm_scores": rm_scores,
            "extra_fields": {
                "reward_extra_info": {"acc": acc, "score": acc},
                "min_global_steps": first,
                "max_global_steps": last,
            },
            "uid": uid,
            "session_id": session,
            "global_steps": step,
        }
        tag = {
            "status": "success",
            "prompt_len": prompt_len,
            "response_len": response_len,
            "seq_len": prompt_len + response_len,
            "global_steps": step,
            "min_global_steps": first,
            "max_global_steps": last,
        }
        await self.tq.async_kv_batch_put(
            keys=[f"{uid}_{session}_0"], fields=one_row(field), tags=[tag], partition_id=partition
        )

    def busy(self) -> int:
        return len(self.tasks)


def non_tensor(batch: Any, key: str, default: Any) -> Any:
    """A batch's non-tensor value (verl wraps them in NonTensorData), or ``default``."""
    value = batch.get(key, default) if key in batch.keys() else default  # noqa: SIM118 (a TensorDict)
    return getattr(value, "data", value)


def one_row(field: dict) -> Any:
    """A one-row TensorDict of ``field`` as verl's ``list_of_dict_to_tensordict`` builds it (tensors stacked,
    other values in a NonTensorStack), without importing verl into the worker process."""
    from tensordict import NonTensorStack, TensorDict

    data = {k: v.unsqueeze(0) if isinstance(v, torch.Tensor) else NonTensorStack(v) for k, v in field.items()}
    return TensorDict(data, batch_size=[1])


def with_fake_workers(manager_cls: type) -> type:
    """A subclass of the agent-loop manager ``manager_cls`` whose workers are ``FakeAgentLoopWorker``s."""

    class WithFakeWorkers(manager_cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.agent_loop_workers_class = FakeAgentLoopWorker  # after verl's __init__ set its own

    WithFakeWorkers.__name__ = f"{manager_cls.__name__}WithFakeWorkers"
    return WithFakeWorkers

"""A generator with fixed capacity: ``slots`` concurrent generations, as an engine's maximum concurrent sequences.

The open-loop producers (producer.py, requeue.py) dispatch a fixed number of prompts every sampling step, and
under ``pace`` they *skip* the prompts admission refuses, so generation capacity that pace leaves unused is
thrown away and the comparison with ``drop`` is not at equal hardware. Here the hardware is fixed: each attempt
holds a slot from its dispatch until the step it completes or fails (``delay + 1`` sampling steps, the delay
from the rollout-cost model, so a longer answer holds its slot longer), and a freed slot takes the next prompt:
a lost prompt first (the requeue loop), else a fresh one. Under ``pace`` a free slot takes a prompt only when
admission lets it in, and otherwise waits (counted as generator idle, in slot-steps); under ``drop`` and
``wait`` every free slot generates, whatever becomes of what it generates (waste is counted by the ledger).

With ``in_flight_updates`` a weight push reaches generations already running (PipelineRL's in-flight update):
the trained tokens (the digit answer, written last, after the modelled reasoning) are sampled with the rollout
weights in force when the attempt finishes, the group completes with ``finish_step`` = those weights' step, and
the arm's buffer measures age from it (``age_from="finish"``). Without it the answer is sampled at dispatch, with
the weights of that moment, and age runs from the dispatch step.

Fresh prompts come from one stream in fixed chunks, so the k-th fresh prompt is the same in every arm whatever
the arm's admission did; every attempt's cost is drawn in dispatch order from the rollout-cost stream.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

import torch

from pyfast_buffer import StalenessBuffer

from .config import ExperimentConfig
from .objective import group_advantages
from .requeue import RequeueProducer
from .rollout import RolloutWorker
from .store import TrajectoryStore
from .task import DigitSumTask

#: Fresh prompts are drawn this many at a time; any fixed size keeps the stream identical across arms.
PROMPT_CHUNK = 64


class SlotProducer(RequeueProducer):
    """``tick(t)`` fills the free slots and completes what is due; ``idle_slot_steps`` and ``busy_slot_steps``
    count the slot capacity that waited for admission and that generated."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        task: DigitSumTask,
        buf: StalenessBuffer,
        store: TrajectoryStore,
        rollout: RolloutWorker,
        in_flight_updates: bool = False,
    ) -> None:
        super().__init__(cfg, task, buf, store, rollout)
        self.in_flight_updates = in_flight_updates
        self.busy = 0  # slots holding an attempt now
        self.idle_slot_steps = 0  # free slots that waited for admission (pace), summed over sampling steps
        self.busy_slot_steps = 0  # slots that held an attempt, summed over sampling steps
        self.next_serial = 0  # attempt serial s owns trajectory ids s * n .. s * n + n - 1
        self._fresh: Deque[torch.Tensor] = deque()

    def slot_capacity(self, ticks: int) -> int:
        return ticks * self.cfg.slots

    def _fresh_prompt(self) -> torch.Tensor:
        if not self._fresh:
            self._fresh.extend(self.task.sample_prompts(PROMPT_CHUNK, self.prompt_gen))
        return self._fresh.popleft()

    def _generate(self, serials: List[int], prompt_ids: List[int]) -> Tuple[torch.Tensor, int]:
        """Samples the groups of these attempts with the rollout weights of now, writes them to the store and
        returns (rewards, weights step)."""
        n = self.cfg.group_size
        prompts = torch.stack([self.tokens[p] for p in prompt_ids])
        repeated, responses, logp, weights_step = self.rollout.generate(prompts, n, self.cfg.length, self.sample_gen)
        reward = self.task.reward(repeated, responses)
        traj_ids = (torch.tensor(serials).unsqueeze(1) * n + torch.arange(n)).view(-1)
        self.store.write(traj_ids, repeated, responses, logp, reward, group_advantages(reward, n))
        return reward, weights_step

    def tick(self, t: int) -> Dict[str, Optional[float]]:
        n = self.cfg.group_size
        self._collect_losses()
        free = self.cfg.slots - self.busy
        k = free
        if self.buf.config.strategy == "pace":  # a free slot waits until admission lets its prompt in
            k = min(free, self.buf.admissible(self.rollout.weights_step))
        self.idle_slot_steps += free - k
        self.busy_slot_steps += self.busy + k
        retry = [self.queue.popleft() for _ in range(min(k, len(self.queue)))]
        serials = list(range(self.next_serial, self.next_serial + k))
        self.next_serial += k
        prompt_ids = retry + serials[len(retry) :]  # a fresh prompt's id is its first attempt's serial
        for p in serials[len(retry) :]:
            self.tokens[p] = self._fresh_prompt()
        self.prompts_seen += k - len(retry)
        rewards: List[torch.Tensor] = []
        if k:
            stamp = self.rollout.weights_step
            if not self.in_flight_updates:  # the answer is sampled now, with the weights of the dispatch
                reward, stamp = self._generate(serials, prompt_ids)
                rewards.append(reward)
            self.buf.dispatch(prompt_ids, stamp)
            self.busy += k
            prompts = torch.stack([self.tokens[p] for p in prompt_ids])
            for s, p, (difficulty, length, delay) in zip(serials, prompt_ids, self.cost.cost(prompts)):
                self.prompt_of[s] = p
                if delay is None:  # a failed attempt still held its slot for this step
                    self.pending.setdefault(t, []).append((s, p, 0, True))
                else:
                    self.costs[s] = (difficulty, length, delay)
                    self.pending.setdefault(t + delay, []).append((s, p, length, False))
        completed = failed = 0
        for s, p, length, is_failed in self.pending.pop(t, []):
            self.busy -= 1
            if is_failed:
                self.buf.fail([p])
                failed += 1
                continue
            finish: Optional[int] = None
            if self.in_flight_updates:  # the answer is written last, with the weights in force at the finish
                reward, finish = self._generate([s], [p])
                rewards.append(reward)
            self.buf.complete(torch.arange(s * n, (s + 1) * n), [p] * n, lengths=[length] * n, finish_step=finish)
            self.generated += [self.costs[s]] * n
            completed += 1
        sampled = torch.cat(rewards) if rewards else torch.zeros(0)
        return {
            "sample_reward": float(sampled.mean()) if len(sampled) else None,  # None: nothing was sampled this step
            "weights_step": self.rollout.weights_step,
            "prompts_completed": completed,
            "prompts_failed": failed,
            "prompts_requeued": len(retry),
            "slots_busy": self.busy,
            "slots_idle": free - k,
        }

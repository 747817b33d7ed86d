"""The bias experiment's sampling side: lost prompts are dispatched again, each attempt costs what its prompt
costs (rollout_cost.py), and every attempt's difficulty, length and latency is remembered for the summary.

A prompt whose attempt left untrained (dropped stale, evicted, failed) goes back to a FIFO queue and is
dispatched again, with the same prompt id, before any fresh prompt: the discard-and-requeue loop that starves
slow rollouts under ``drop`` (tinker-cookbook PR #822). Each sampling step dispatches ``prompts_per_tick``
attempts; attempt ``s`` (its serial, ``t * prompts_per_tick + k``) owns trajectory ids ``s * n .. s * n + n - 1``.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

import numpy as np
import torch

from pyfast_buffer import StalenessBuffer

from .config import ExperimentConfig
from .objective import group_advantages
from .producer import Producer
from .rollout import RolloutWorker
from .rollout_cost import RolloutCost, ks_statistic
from .store import TrajectoryStore
from .task import DigitSumTask


class RequeueProducer(Producer):
    """``tick(t)`` runs sampling step ``t``; ``cost_of(traj_ids)`` gives trained trajectories' costs. The
    prompt and sampling streams are Producer's; the geometric schedule is replaced by the rollout cost."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        task: DigitSumTask,
        buf: StalenessBuffer,
        store: TrajectoryStore,
        rollout: RolloutWorker,
    ) -> None:
        super().__init__(cfg, task, buf, store, rollout)
        self.cost = RolloutCost(
            cfg.seed * 1000 + 5,
            cfg.digits,
            cfg.base_tokens,
            cfg.length_sigma,
            cfg.tokens_per_tick,
            cfg.max_latency,
            cfg.fail_prob,
        )
        self.queue: Deque[int] = deque()  # lost prompts, oldest first
        self.tokens: Dict[int, torch.Tensor] = {}  # prompt id -> its (4,) tokens
        self.prompt_of: Dict[int, int] = {}  # attempt serial -> prompt id
        self.costs: Dict[int, Tuple[float, int, int]] = {}  # serial -> (difficulty, length, delay) of completed ones
        self.generated: List[Tuple[float, int, int]] = []  # one per completed trajectory
        self.pending: Dict[int, List[Tuple[int, int, int, bool]]] = {}  # tick -> [(serial, prompt, length, failed)]
        self.prompts_seen = 0
        self.idle_slot_steps = 0  # pace: prompts admission kept out, skipped (the open loop does not hold them)

    def slot_capacity(self, ticks: int) -> int:
        """Attempts the generator could have started in ``ticks`` sampling steps (its capacity, in slot-steps)."""
        return ticks * self.cfg.prompts_per_tick

    def _collect_losses(self) -> None:
        ids, reasons = self.buf.released()
        n = self.cfg.group_size
        lost: Dict[int, None] = {}
        for i, r in zip(ids.tolist(), reasons.tolist()):
            if r in (1, 2):  # a trajectory of a dropped or evicted group
                lost.setdefault(self.prompt_of[i // n])
            elif r in (3, 4):  # a failed or expired prompt
                lost.setdefault(i)
        self.queue.extend(lost)

    def tick(self, t: int) -> Dict[str, Optional[float]]:
        cfg, n, per_tick = self.cfg, self.cfg.group_size, self.cfg.prompts_per_tick
        self._collect_losses()
        fresh = self.task.sample_prompts(per_tick, self.prompt_gen)  # always drawn: the same stream in every arm
        k = per_tick
        if self.buf.config.strategy == "pace":  # admission: only as many as the pace rule lets start now
            k = min(per_tick, self.buf.admissible(self.rollout.weights_step))
            self.idle_slot_steps += per_tick - k
        retry = [self.queue.popleft() for _ in range(min(k, len(self.queue)))]
        serials = list(range(t * per_tick, t * per_tick + k))
        prompt_ids = retry + serials[len(retry) :]  # a fresh prompt's id is its first attempt's serial
        for j, p in enumerate(serials[len(retry) :]):
            self.tokens[p] = fresh[j]
        self.prompts_seen += k - len(retry)
        reward = torch.zeros(0)
        weights_step = self.rollout.weights_step
        if k:
            prompts = torch.stack([self.tokens[p] for p in prompt_ids])
            repeated, responses, logp, weights_step = self.rollout.generate(prompts, n, cfg.length, self.sample_gen)
            self.buf.dispatch(prompt_ids, weights_step)
            reward = self.task.reward(repeated, responses)
            traj_ids = (torch.tensor(serials).unsqueeze(1) * n + torch.arange(n)).view(-1)
            self.store.write(traj_ids, repeated, responses, logp, reward, group_advantages(reward, n))
            for s, p, (difficulty, length, delay) in zip(serials, prompt_ids, self.cost.cost(prompts)):
                self.prompt_of[s] = p
                if delay is None:
                    self.pending.setdefault(t, []).append((s, p, 0, True))
                else:
                    self.costs[s] = (difficulty, length, delay)
                    self.pending.setdefault(t + delay, []).append((s, p, length, False))
        completed = failed = 0
        for s, p, length, is_failed in self.pending.pop(t, []):
            if is_failed:
                self.buf.fail([p])
                failed += 1
            else:
                self.buf.complete(torch.arange(s * n, (s + 1) * n), [p] * n, lengths=[length] * n)
                self.generated += [self.costs[s]] * n
                completed += 1
        return {
            "sample_reward": float(reward.mean()) if len(reward) else None,  # None: pace admitted nothing
            "weights_step": weights_step,
            "prompts_completed": completed,
            "prompts_failed": failed,
            "prompts_requeued": len(retry),
            "prompts_skipped": per_tick - k,  # pace: prompts admission refused this step (the open loop skips them)
        }

    def cost_of(self, traj_ids: torch.Tensor) -> List[Tuple[float, int, int]]:
        """Returns (difficulty, length, delay) of each trajectory id."""
        n = self.cfg.group_size
        return [self.costs[i // n] for i in traj_ids.tolist()]


def shift(trained: List[Tuple[float, int, int]], generated: List[Tuple[float, int, int]]) -> Dict[str, object]:
    """The trained-vs-generated shift of difficulty, length and latency: exact KS and mean difference."""
    out: Dict[str, object] = {}
    t = np.asarray(trained, dtype=np.float64).reshape(-1, 3)
    g = np.asarray(generated, dtype=np.float64).reshape(-1, 3)
    for i, name in enumerate(("difficulty", "length", "latency")):
        out[f"{name}_ks"] = ks_statistic(t[:, i], g[:, i])
        out[f"{name}_shift"] = float(t[:, i].mean() - g[:, i].mean()) if len(t) and len(g) else None
    return out

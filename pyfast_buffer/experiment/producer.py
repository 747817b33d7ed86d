"""The sampling side of one arm: dispatch prompts, generate groups, complete or fail them later.

Generation happens at dispatch with the rollout weights of that moment (stamped as the
prompts' ``sample_step``); the finished group reaches the buffer ``delay`` sampling steps
later, as in an engine where some requests take longer, and a few prompts fail.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from pyfast_buffer import StalenessBuffer

from .config import ExperimentConfig
from .objective import group_advantages
from .rollout import RolloutWorker
from .schedule import LatencySchedule
from .store import TrajectoryStore
from .task import DigitSumTask


class Producer:
    """``tick(t)`` runs sampling step ``t`` and returns its sampling-side record."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        task: DigitSumTask,
        buf: StalenessBuffer,
        store: TrajectoryStore,
        rollout: RolloutWorker,
    ) -> None:
        self.cfg, self.task, self.buf, self.store, self.rollout = cfg, task, buf, store, rollout
        # Separate streams, all from the seed: prompts and timing are identical in every arm.
        self.prompt_gen = torch.Generator().manual_seed(cfg.seed * 1000 + 1)
        self.sample_gen = torch.Generator().manual_seed(cfg.seed * 1000 + 2)
        self.schedule = LatencySchedule(cfg.seed * 1000 + 3, cfg.latency_mean, cfg.max_latency, cfg.fail_prob)
        self.due: Dict[int, List[Tuple[int, bool]]] = {}  # tick -> [(prompt id, failed)]

    def tick(self, t: int) -> Dict[str, Optional[float]]:
        cfg, n = self.cfg, self.cfg.group_size
        prompts = self.task.sample_prompts(cfg.prompts_per_tick, self.prompt_gen)
        prompt_ids = torch.arange(t * cfg.prompts_per_tick, (t + 1) * cfg.prompts_per_tick)
        skipped = 0
        if self.buf.config.strategy == "pace":  # generate only what admission lets in now (the rest is skipped)
            # At least one prompt is generated (and, if refused, not dispatched), so every tick has a sample reward.
            admitted = min(cfg.prompts_per_tick, self.buf.admissible(self.rollout.weights_step))
            prompts, prompt_ids = prompts[: max(admitted, 1)], prompt_ids[:admitted]
            skipped = cfg.prompts_per_tick - admitted
        repeated, responses, logp, weights_step = self.rollout.generate(prompts, n, cfg.length, self.sample_gen)
        self.buf.dispatch(prompt_ids, weights_step)
        reward = self.task.reward(repeated, responses)
        traj_ids = (prompt_ids.unsqueeze(1) * n + torch.arange(n)).view(-1)  # prompt p owns ids p*n .. p*n+n-1
        kept = len(traj_ids)  # pace: the generated prompts that were admitted (all of them otherwise)
        advantages = group_advantages(reward, n)[:kept]
        if kept:
            self.store.write(traj_ids, repeated[:kept], responses[:kept], logp[:kept], reward[:kept], advantages)
        for p in prompt_ids.tolist():
            delay = self.schedule.fate()
            self.due.setdefault(t + (delay or 0), []).append((p, delay is None))
        completed = failed = 0
        for p, is_failed in self.due.pop(t, []):
            if is_failed:
                self.buf.fail([p])
                failed += 1
            else:
                self.buf.complete(torch.arange(p * n, (p + 1) * n), [p] * n)
                completed += 1
        return {
            "sample_reward": float(reward.mean()),
            "weights_step": weights_step,
            "prompts_completed": completed,
            "prompts_failed": failed,
            "prompts_skipped": skipped,  # pace: prompts admission refused this step (the open loop skips them)
        }

"""The trainer: one GRPO/PPO optimiser step on a batch the buffer handed out."""

from __future__ import annotations

from typing import Dict

import torch

from .objective import clipped_loss
from .policy import GRUPolicy
from .store import TrajectoryStore


class Trainer:
    """Owns the trained policy and its Adam optimiser; ``train_step`` returns the step's diagnostics."""

    def __init__(self, policy: GRUPolicy, lr: float, clip_eps: float) -> None:
        self.policy = policy
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
        self.clip_eps = clip_eps
        self.step = 0

    def train_step(self, store: TrajectoryStore, traj_ids: torch.Tensor) -> Dict[str, float]:
        """Trains once on the trajectories ``traj_ids`` and advances ``step`` by one."""
        rows = store.gather(traj_ids)
        logp, entropy = self.policy.score(rows["prompts"], rows["responses"])
        loss, stats = clipped_loss(logp, rows["behaviour_logp"], rows["advantage"], entropy, self.clip_eps)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.step += 1
        stats["train_reward"] = float(rows["reward"].mean())
        return stats

"""The rollout side: a copy of the policy whose weights are pushed every parameter_sync_step steps.

The trainer calls ``on_step(step)`` after every optimiser step with its current weights. At a
sync step ``s`` the rollout copy loads the weights of step ``max(0, s - lag)``, so with
``lag > 0`` generation runs on weights that were already old when they arrived. The step
those weights belong to is the ``sample_step`` stamped on every trajectory they produce.
"""

from __future__ import annotations

import copy
import threading
from typing import Dict, Tuple

import torch
from torch import nn

from .policy import GRUPolicy


class RolloutWorker:
    """Holds the rollout weights and generates groups of samples with them."""

    def __init__(self, policy: GRUPolicy, parameter_sync_step: int, lag: int) -> None:
        self.policy = copy.deepcopy(policy).eval()
        self.sync = parameter_sync_step
        self.lag = lag
        self.weights_step = 0
        self._history: Dict[int, Dict[str, torch.Tensor]] = {0: _snapshot(policy)}
        self._lock = threading.Lock()  # thread mode: a sync never lands in the middle of a generate

    def on_step(self, step: int, trainer_policy: nn.Module) -> None:
        """Records the trainer's weights after ``step``; at a sync step, pushes those of ``step - lag``."""
        if self.lag:
            self._history[step] = _snapshot(trainer_policy)
        if step % self.sync:
            return
        source = max(0, step - self.lag)
        weights = self._history[source] if self.lag else _snapshot(trainer_policy)
        with self._lock:
            self.policy.load_state_dict(weights)
            self.weights_step = source
        for old in [s for s in self._history if s < source]:  # later syncs only look forward
            del self._history[old]

    def generate(
        self, prompts: torch.Tensor, group_size: int, length: int, generator: torch.Generator
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """Returns (prompts repeated per sample, responses, behaviour log-probs, weights step)."""
        repeated = prompts.repeat_interleave(group_size, dim=0)
        with self._lock:
            responses, logp = self.policy.sample(repeated, length, generator)
            return repeated, responses, logp, self.weights_step


def _snapshot(module: nn.Module) -> Dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}

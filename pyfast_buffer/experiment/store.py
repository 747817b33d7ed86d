"""Trajectory payloads in preallocated torch tensors, indexed by the buffer's trajectory ids.

The buffer holds only int64 ids; everything the loss needs (tokens, the behaviour policy's
log-probs, reward, group-relative advantage) lives here, one row per trajectory id.
"""

from __future__ import annotations

from typing import Dict

import torch


class TrajectoryStore:
    """Rows ``0..size-1``; ``write`` fills rows at given ids, ``gather`` reads them back.

    Sized for every trajectory the run will sample, so an id is never reused and a row is
    never overwritten while the buffer may still hand its id out.
    """

    def __init__(self, size: int, prompt_len: int, length: int) -> None:
        self.prompts = torch.zeros(size, prompt_len, dtype=torch.int64)
        self.responses = torch.zeros(size, length, dtype=torch.int64)
        self.behaviour_logp = torch.zeros(size, length, dtype=torch.float32)
        self.reward = torch.zeros(size, dtype=torch.float32)
        self.advantage = torch.zeros(size, dtype=torch.float32)
        self.size = size

    def write(
        self,
        ids: torch.Tensor,
        prompts: torch.Tensor,
        responses: torch.Tensor,
        behaviour_logp: torch.Tensor,
        reward: torch.Tensor,
        advantage: torch.Tensor,
    ) -> None:
        if int(ids.max()) >= self.size:
            raise ValueError(f"trajectory id {int(ids.max())} is outside the store (size {self.size})")
        self.prompts[ids] = prompts
        self.responses[ids] = responses
        self.behaviour_logp[ids] = behaviour_logp
        self.reward[ids] = reward
        self.advantage[ids] = advantage

    def gather(self, ids: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Returns copies of the rows at ``ids`` (an int64 tensor, e.g. ``batch.traj_ids``)."""
        return {
            "prompts": self.prompts[ids],
            "responses": self.responses[ids],
            "behaviour_logp": self.behaviour_logp[ids],
            "reward": self.reward[ids],
            "advantage": self.advantage[ids],
        }

"""The README's minimal training loop, runnable as is on a CPU: a toy sampler, rollout and loss stand in
for yours. The loop between the two ``# --- README`` markers is the README's, word for word (a test checks).

    python examples/minimal_loop.py --steps 50
"""

from __future__ import annotations

import argparse
import random
from typing import Dict, List, Optional, Tuple

import torch

from pyfast_buffer import StalenessBuffer

GROUP = 4  # GRPO: trajectories per prompt
BATCH = 512  # trajectories per trainer step


class ToySampler:
    """Hands out fresh prompt ids, half again as many as a batch needs, so a full batch is always ready."""

    def __init__(self) -> None:
        self.next_id = 0

    def next_prompts(self) -> List[int]:
        ids = list(range(self.next_id, self.next_id + BATCH // GROUP * 3 // 2))
        self.next_id += len(ids)
        return ids


class ToyRollout:
    """Finishes most prompts in the step they are dispatched and the rest one step later; fails a few."""

    def __init__(self, sampler: ToySampler, seed: int) -> None:
        self.sampler, self.rng = sampler, random.Random(seed)
        self.late: List[int] = []
        self.failures: List[int] = []
        self.next_traj = 0
        self.seen = 0

    def _groups(self, prompts: List[int]) -> List[Tuple[int, List[int]]]:
        out = []
        for prompt in prompts:
            out.append((prompt, list(range(self.next_traj, self.next_traj + GROUP))))
            self.next_traj += GROUP
        return out

    def finished(self) -> List[Tuple[int, List[int]]]:
        new = list(range(self.seen, self.sampler.next_id))
        self.seen = self.sampler.next_id
        now, later, failed = [], [], []
        for prompt in new:
            roll = self.rng.random()
            (failed if roll < 0.02 else later if roll < 0.2 else now).append(prompt)
        done, self.late, self.failures = self.late + now, later, failed
        return self._groups(done)

    def failed(self) -> List[int]:
        return self.failures


def policy_loss(tokens: torch.Tensor, age: torch.Tensor) -> torch.Tensor:
    """A stand-in loss that reads the batch's payload rows and ages (older data weighs less)."""
    return (tokens.float().mean(dim=1) * torch.exp(-age.float().to(tokens.device))).mean()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    num_steps = args.steps
    sampler = ToySampler()
    rollout = ToyRollout(sampler, args.seed)
    history: List[Dict[str, float]] = []
    log = history.append
    # ids stay below the payload's rows here; when yours grow past it, see examples/recycle_slots.py

    # fmt: off
    # --- README: the minimal loop
    device = "cuda" if torch.cuda.is_available() else "cpu"
    buf = StalenessBuffer(capacity=65536, max_age=7, strategy="drop", max_uses=1)
    payload = torch.empty(65536, 512, dtype=torch.long)          # your storage; the buffer holds ids
    for step in range(num_steps):
        prompt_ids = sampler.next_prompts()                       # ints (or a tensor / numpy array)
        buf.dispatch(prompt_ids, step)                            # in flight, stamped with this step
        for prompt, traj_ids in rollout.finished():               # GRPO: n trajectories per prompt
            buf.complete(traj_ids, [prompt] * len(traj_ids))      # they enter the ring as one group
        for prompt in rollout.failed():
            buf.fail([prompt])
        batch = buf.take(512, current_step=step, timeout=30.0)    # blocks until a full fresh batch
        batch = batch.to(device, non_blocking=True)               # one async copy when pinned
        loss = policy_loss(payload[batch.traj_ids.cpu()], batch.age)
        log(batch.metrics)                                        # numbers only: dropped_stale, age_mean, ...
    # --- README: end
    # fmt: on

    assert rollout.next_traj <= payload.shape[0], "more trajectories than payload rows: recycle slots"
    taken = sum(m["buffer/taken"] for m in history)
    print(f"{num_steps} trainer steps on {device}: {taken:.0f} trajectories trained on (last loss {float(loss):.3g})")
    print("ledger:", buf.ledger())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

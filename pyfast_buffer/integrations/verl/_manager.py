"""``PacedAgentLoopManager``: verl's agent-loop manager with admission control in front of generation.

verl's trainer tags every prompt ``pending`` with its ``global_steps`` and hands the batch to the manager
named by ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (verl's ``main_ppo.py`` loads a user class
there; every prompt it dispatches, warm-up, per-step batch, refill or resume re-issue, goes through it, in the
process that holds the sampler). This manager keeps the training prompts in arrival order and asks the paced
sampler to admit them (``_pace.py``): an admitted prompt is re-stamped with the trainer's step at release, in
TransferQueue and in the batch handed on, so its age counts from when it really started; then the batch goes
to verl's ``AgentLoopManagerTQ`` unchanged. Validation batches, and every batch when no paced sampler is in the
process (the sync trainer, or ``drop``/``wait``), go straight through.

It never blocks the trainer: a prompt that does not fit now waits in the manager and is released when a take,
a failure or an eviction makes room (the sampler calls ``release``). Prompts still waiting when the trainer
stops are counted in the sampler's ledger (``awaiting_admission``).

This module imports verl; ``pyfast_buffer.integrations.verl`` loads it only when ``PacedAgentLoopManager`` is
asked for. Absolute imports only.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
from verl.utils import tensordict_utils as tu

from pyfast_buffer.integrations.verl._pace import LINK

logger = logging.getLogger("pyfast_buffer.verl")


class PacedAgentLoopManager(AgentLoopManagerTQ):
    """verl's ``AgentLoopManagerTQ`` that starts a training prompt only once the pace sampler admits it.

    Same constructor as verl's manager (verl builds it with ``create(config=..., llm_client=...)``). Name it in
    ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` with ``max_off_policy_strategy: pace``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: deque = deque()  # (batch, uids) in arrival order; the first may be partly released
        self._release_lock = threading.Lock()
        LINK.attach_manager(self)

    @property
    def held(self) -> int:
        """Training prompts received and not yet admitted."""
        with self._release_lock:
            return sum(len(uids) for _, uids in self._held)

    def generate_sequences(self, prompts: Any) -> None:
        """Holds a training batch until the sampler admits its prompts (validation and unpaced batches pass)."""
        sampler = LINK.sampler()
        if sampler is None or tu.get_non_tensor_data(prompts, "validate", False):
            return super().generate_sequences(prompts)
        sampler.observe_step(int(tu.get_non_tensor_data(prompts, "global_steps", 0)))
        uids = [str(uid) for uid in prompts["uid"]]
        with self._release_lock:
            self._held.append((prompts, uids))
        self.release()
        return None

    def release(self) -> int:
        """Hands generation every held prompt the sampler admits now, oldest first; returns how many."""
        sampler = LINK.sampler()
        if sampler is None:
            return 0
        released = 0
        with self._release_lock:
            while self._held:
                batch, uids = self._held[0]
                step = sampler.trainer_step
                k = sampler.admit(uids, step)
                if k == 0:
                    break
                if k == len(uids):
                    self._held.popleft()
                    admitted = batch
                else:
                    admitted = tu.index_select_tensor_dict(batch, list(range(k)))
                    rest = tu.index_select_tensor_dict(batch, list(range(k, len(uids))))
                    self._held[0] = (rest, uids[k:])
                tu.assign_non_tensor_data(admitted, "global_steps", step)  # re-stamped at release, as its tag
                super().generate_sequences(admitted)
                released += k
        if released:
            logger.debug("released %d prompts for generation at step %d", released, sampler.trainer_step)
        return released

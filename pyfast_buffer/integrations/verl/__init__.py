"""pyfast_buffer inside verl's ``trainer.v1``: a drop-in sampler and, for ``pace``, an agent-loop manager.

Two lines point verl at the sampler (``FastReplayBuffer`` acts as verl's sync or async buffer by
``trainer_mode``, as verl itself chooses)::

    trainer.v1.sampler.custom_sampler.path=pkg://pyfast_buffer.integrations.verl
    trainer.v1.sampler.custom_sampler.name=FastReplayBuffer

and two more turn on ``pace`` (admission control: nothing dropped, nothing trained past the bound)::

    trainer.v1.sampler.max_off_policy_strategy=pace
    +actor_rollout_ref.rollout.agent.agent_loop_manager_class=pyfast_buffer.integrations.verl.PacedAgentLoopManager

``ReplayBuffer``, ``ReplayBufferAsync`` and ``FastReplayBuffer`` need TransferQueue (``pip install
"pyfast_buffer[verl]"``); ``PacedAgentLoopManager`` needs verl itself and is imported only when asked for.
docs/verl.md has the setup per strategy, the verl versions matched and what each verl key does.

Absolute imports only: verl may load this file by path, outside the package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyfast_buffer.integrations.verl._metrics import (
    DAPO_FILTERED_REWARD_COUNTS_KEY,
    LEDGER_PREFIX,
    _accumulate_eviction_metrics,
)
from pyfast_buffer.integrations.verl._options import VerlConfigError
from pyfast_buffer.integrations.verl._sampler import FastReplayBuffer, ReplayBuffer, ReplayBufferAsync

if TYPE_CHECKING:  # at run time it is loaded by __getattr__, on first use (it imports verl)
    from pyfast_buffer.integrations.verl._manager import PacedAgentLoopManager

__all__ = [
    "DAPO_FILTERED_REWARD_COUNTS_KEY",
    "LEDGER_PREFIX",
    "FastReplayBuffer",
    "PacedAgentLoopManager",
    "ReplayBuffer",
    "ReplayBufferAsync",
    "VerlConfigError",
    "_accumulate_eviction_metrics",
]


def __getattr__(name: str) -> Any:
    """``PacedAgentLoopManager`` subclasses verl's ``AgentLoopManagerTQ``, so verl is imported only for it."""
    if name == "PacedAgentLoopManager":
        from pyfast_buffer.integrations.verl._manager import PacedAgentLoopManager

        return PacedAgentLoopManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

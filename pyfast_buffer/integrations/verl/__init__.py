"""pyfast_buffer inside verl's ``trainer.v1``: a drop-in sampler and, for ``pace``, an agent-loop manager.

Two lines point verl at the sampler (``FastReplayBuffer`` acts as verl's sync or async buffer by
``trainer_mode``, as verl itself chooses)::

    trainer.v1.sampler.custom_sampler.path=pkg://pyfast_buffer.integrations.verl
    trainer.v1.sampler.custom_sampler.name=FastReplayBuffer

and two more turn on ``pace`` (admission control: nothing dropped, nothing trained past the bound)::

    trainer.v1.sampler.max_off_policy_strategy=pace
    +actor_rollout_ref.rollout.agent.agent_loop_manager_class=pyfast_buffer.integrations.verl.PacedAgentLoopManager

``ReplayBuffer``, ``ReplayBufferAsync`` and ``FastReplayBuffer`` need TransferQueue (``pip install
"pyfast_buffer[verl]"``), ``PacedAgentLoopManager`` needs verl itself: each is imported when first asked for, so
this module imports, star-imports and ``help()``s without either (a missing one is named, with its install line,
when its class is asked for).
docs/verl.md has the setup per strategy, the verl versions matched and what each verl key does.

Absolute imports only: verl may load this file by path, outside the package.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any, List

from pyfast_buffer.integrations.verl._metrics import (
    DAPO_FILTERED_REWARD_COUNTS_KEY,
    LEDGER_PREFIX,
    _accumulate_eviction_metrics,
)
from pyfast_buffer.integrations.verl._options import VerlConfigError

if TYPE_CHECKING:  # at run time they are loaded by __getattr__, on first use (they import TransferQueue / verl)
    from pyfast_buffer.integrations.verl._manager import PacedAgentLoopManager  # noqa: F401 - for type checkers
    from pyfast_buffer.integrations.verl._sampler import FastReplayBuffer, ReplayBuffer, ReplayBufferAsync  # noqa: F401

_TQ = ("_sampler", "transfer_queue", "TransferQueue", "pip install 'pyfast_buffer[verl]'")
_VERL = ("_manager", "verl", "verl", "pip install verl (docs/verl.md has the versions matched)")
#: This package's import name, spelled out: verl may load this file by path under another module name.
_PACKAGE = "pyfast_buffer.integrations.verl"
#: Names loaded on first use: the module that defines each, the module it needs, its name, and how to install it.
_LAZY = {"FastReplayBuffer": _TQ, "ReplayBuffer": _TQ, "ReplayBufferAsync": _TQ, "PacedAgentLoopManager": _VERL}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# The names a star import binds: those that need nothing, and the lazy ones whose package is installed here, so
# `from pyfast_buffer.integrations.verl import *` works with or without TransferQueue and verl.
__all__ = [
    "DAPO_FILTERED_REWARD_COUNTS_KEY",
    "LEDGER_PREFIX",
    "VerlConfigError",
    "_accumulate_eviction_metrics",
    *sorted(name for name, needs in _LAZY.items() if _installed(needs[1])),
]


def __getattr__(name: str) -> Any:
    """Imports the module behind a lazy name on first use; without its package, says what to install."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, _, needs, how = _LAZY[name]
    try:
        module = importlib.import_module(f"{_PACKAGE}.{module_name}")
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{_PACKAGE}.{name} needs {needs}, not installed here (no module named {exc.name!r}): {how}", name=exc.name
        ) from exc
    return getattr(module, name)


def __dir__() -> List[str]:
    # help() and IDEs read every name listed here: a lazy one is listed only where it can be loaded.
    return sorted([*globals(), *(name for name in __all__ if name in _LAZY)])

"""Adapters that plug pyfast_buffer into training frameworks, one subpackage per framework.

- ``integrations.verl``: verl's ``trainer.v1`` sampler and agent-loop manager (docs/verl.md);
  ``pip install "pyfast_buffer[verl]"``.
- ``integrations.nemo_rl``: NeMo RL's ``PromptGroupSampler`` (docs/nemo_rl.md); NeMo RL itself (not on PyPI).
- ``integrations.torchrl``: TorchRL's replay-buffer ``Sampler`` (docs/torchrl.md);
  ``pip install "pyfast_buffer[torchrl]"``.
- ``integrations.trl``: a ``rollout_worker`` for TRL's ``AsyncGRPOTrainer`` (docs/trl.md);
  ``pip install "pyfast_buffer[trl]"``.
- ``integrations.slime``: slime's data source, fully-async rollout function and buffer filter, loaded by path
  (docs/slime.md); slime itself (a checkout: not on PyPI).
- ``integrations.miles``: Miles's fully-async data buffer and a paced rollout function, loaded by path
  (docs/miles.md); Miles itself (a checkout: its PyPI release predates the fully-async buffer).

None of them is imported here, and the library imports none of them: each imports its framework only inside its
own subpackage. The flags below say which frameworks this environment has, without importing any.
"""

from __future__ import annotations

import importlib.util


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


#: Whether TransferQueue (the verl sampler's store) is installed.
_has_transfer_queue = _has("transfer_queue")
#: Whether verl is installed (the verl agent-loop manager needs it; the sampler needs TransferQueue only).
_has_verl = _has("verl")
#: Whether NeMo RL is importable (from a checkout on the path: it is not on PyPI).
_has_nemo_rl = _has("nemo_rl")
#: Whether TorchRL is installed.
_has_torchrl = _has("torchrl")
#: Whether TRL is installed (the TRL worker subclasses nothing of it, but runs inside its trainer).
_has_trl = _has("trl")
#: Whether slime is importable (from a checkout on the path).
_has_slime = _has("slime")
#: Whether Miles is importable (from a checkout on the path).
_has_miles = _has("miles")

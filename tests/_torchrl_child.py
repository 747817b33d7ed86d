"""What a spawned process runs in tests/test_torchrl_sampler.py: importable by name from the tests folder (on
sys.path through pytest's ``pythonpath``, which a spawned child inherits), unlike the test module itself."""

from __future__ import annotations

import torch
from tensordict import TensorDict


def write_rows(rb, version: int, start: int, n: int = 8) -> None:
    """Extends ``rb`` with ``n`` rows stamped ``version``, ``obs`` numbered from ``start``."""
    obs = torch.arange(start, start + n, dtype=torch.float32)[:, None]
    rb.extend(TensorDict({"obs": obs, "policy_version": torch.full((n,), version)}, [n]))

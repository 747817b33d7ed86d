"""pyfast_buffer in TorchRL: ``StalenessSampler``, a replay-buffer ``Sampler`` that trains only fresh-enough data.

    from pyfast_buffer.integrations.torchrl import StalenessSampler
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(65_536), batch_size=512,
                                sampler=StalenessSampler(max_age=2))
    ...
    sampler.consumer_version = collector.policy_version   # after each weight update

docs/torchrl.md has the arguments, what maps to what, and what was measured. Needs ``pip install
"pyfast_buffer[torchrl]"``; torchrl is imported here and nowhere else in the library.
"""

from __future__ import annotations

from pyfast_buffer.integrations.torchrl._sampler import StalenessSampler

__all__ = ["StalenessSampler"]

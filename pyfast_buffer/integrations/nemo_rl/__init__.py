"""pyfast_buffer in NeMo RL: ``StalenessSampler``, a ``PromptGroupSampler`` for NeMo's single-controller async GRPO.

    async_rl:
      sampler:
        name: custom
        target: "pyfast_buffer.integrations.nemo_rl:StalenessSampler"
        strategy: drop          # or wait, pace
        max_age: 2

docs/nemo_rl.md has the keys, what maps to what, and what was measured. No NeMo import here: NeMo checks the
protocol by the presence of its members, and NeMo RL is not on PyPI.
"""

from __future__ import annotations

from pyfast_buffer.integrations.nemo_rl._sampler import StalenessSampler

__all__ = ["StalenessSampler"]

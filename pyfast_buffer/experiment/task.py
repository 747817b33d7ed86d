"""The task: write ``length`` digits that add up to ``a + b``; reward 1 when they do, else 0.

A prompt is the token sequence ``a + b =`` (two digit tokens, then PLUS and EQUALS); the
response is ``length`` digit tokens. The rule is checked exactly, like a math verifier
checking a final answer, and it has many correct responses per prompt, so group sampling
sees a mix of rewards from the start and the policy can collapse onto a few of them.
"""

from __future__ import annotations

import torch


class DigitSumTask:
    """Prompts ``a + b =`` with ``a, b`` in ``[0, digits)``; responses are ``length`` digits.

    Token ids: ``0..digits-1`` are digits, ``digits`` is ``+``, ``digits + 1`` is ``=``.
    The policy only emits digit tokens, so every response is well-formed.
    """

    def __init__(self, digits: int, length: int) -> None:
        if digits < 2:
            raise ValueError(f"digits={digits} is too small; pass at least 2")
        if length < 1:
            raise ValueError(f"length={length} must be >= 1")
        if 2 * (digits - 1) > length * (digits - 1):
            raise ValueError(f"length={length} cannot reach every sum of two digits; pass length >= 2")
        self.digits = digits
        self.length = length
        self.plus = digits
        self.equals = digits + 1
        self.vocab_size = digits + 2
        self.prompt_len = 4

    def sample_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Returns ``n`` prompts as an (n, 4) int64 tensor, drawn from ``generator``."""
        ab = torch.randint(0, self.digits, (n, 2), generator=generator)
        ops = torch.tensor([self.plus, self.equals]).expand(n, 2)
        return torch.stack([ab[:, 0], ops[:, 0], ab[:, 1], ops[:, 1]], dim=1)

    def reward(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Returns 1.0 where the response digits sum to ``a + b``, else 0.0 (float32, one per row)."""
        target = prompts[:, 0] + prompts[:, 2]
        return (responses.sum(dim=1) == target).to(torch.float32)

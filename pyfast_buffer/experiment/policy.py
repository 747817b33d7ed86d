"""The policy: a tiny GRU language model over the task's tokens that emits digit tokens."""

from __future__ import annotations

from typing import Tuple

import torch
from torch import nn


class GRUPolicy(nn.Module):
    """Embedding -> one-layer GRU -> linear head over the ``n_actions`` response tokens.

    ``sample`` generates autoregressively and returns the behaviour log-probs;
    ``score`` re-reads (prompt, response) in one teacher-forced pass for the loss.
    """

    def __init__(self, vocab_size: int, n_actions: int, hidden: int = 64, embed: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed)
        self.gru = nn.GRU(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, n_actions)

    def score(self, prompts: torch.Tensor, responses: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Returns per-token (log-prob of each response token, entropy), both (B, length)."""
        length = responses.shape[1]
        tokens = torch.cat([prompts, responses[:, :-1]], dim=1)
        out, _ = self.gru(self.embed(tokens))
        logits = self.head(out[:, -length:])  # the state after '=' predicts the first digit
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy

    @torch.no_grad()
    def sample(
        self, prompts: torch.Tensor, length: int, generator: torch.Generator, greedy: bool = False
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Returns (responses (B, length) int64, behaviour log-probs (B, length) float32)."""
        out, h = self.gru(self.embed(prompts))
        last = out[:, -1]
        tokens, logps = [], []
        for _ in range(length):
            logp_all = torch.log_softmax(self.head(last), dim=-1)
            if greedy:
                tok = logp_all.argmax(-1)
            else:
                tok = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
            tokens.append(tok)
            logps.append(logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1))
            out, h = self.gru(self.embed(tok.unsqueeze(-1)), h)
            last = out[:, -1]
        return torch.stack(tokens, 1), torch.stack(logps, 1)

"""GRPO: group-relative advantages and the PPO clipped surrogate against the behaviour policy."""

from __future__ import annotations

from typing import Dict, Tuple

import torch


def group_advantages(reward: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Returns ``(r - mean_group) / (std_group + eps)`` for rewards laid out group by group.

    A group whose samples all scored the same gets advantage 0: it carries no signal.
    """
    r = reward.view(-1, group_size)
    centred = r - r.mean(dim=1, keepdim=True)
    return (centred / (r.std(dim=1, unbiased=False, keepdim=True) + eps)).view(-1)


def clipped_loss(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, advantage: torch.Tensor, entropy: torch.Tensor, clip_eps: float
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Returns the token-mean clipped surrogate (to minimise) and its diagnostics.

    ``ratio = pi(a)/mu(a)`` with ``mu`` the (possibly stale) policy that sampled the token, so
    reuse and lag both show up as ratios away from 1. ``approx_kl`` is the k3 estimator of
    KL(mu || pi) on the sampled tokens; ``clip_frac`` is the share of tokens with
    ``|ratio - 1| > clip_eps``.
    """
    log_ratio = logp - behaviour_logp
    ratio = log_ratio.exp()
    adv = advantage.unsqueeze(1).expand_as(ratio)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    loss = -surrogate.mean()
    with torch.no_grad():
        stats = {
            "policy_loss": float(loss),
            "entropy": float(entropy.mean()),
            "approx_kl": float(((ratio - 1) - log_ratio).mean()),
            "clip_frac": float(((ratio - 1).abs() > clip_eps).float().mean()),
            "ratio_mean": float(ratio.mean()),
        }
    return loss, stats

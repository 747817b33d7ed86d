"""Exact small cases for the GRPO pieces: group advantages, the clipped surrogate, the k3 KL."""

import math

import pytest
import torch

from pyfast_buffer.experiment.objective import clipped_loss, group_advantages


def test_group_advantages_normalise_within_each_group():
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]), group_size=4)
    # group 1: mean 0.5, population std 0.5 -> +-1; group 2: all equal -> 0 (no signal)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0]), atol=1e-5)


def _loss(logp, behaviour, adv, eps=0.2):
    logp, behaviour = torch.tensor([logp]), torch.tensor([behaviour])
    return clipped_loss(logp, behaviour, torch.tensor([adv]), torch.zeros_like(logp), eps)


def test_clipped_loss_ratio_is_against_the_behaviour_log_probs():
    # one token, ratio = exp(-0.1) / exp(-0.2) = e^0.1 (inside the clip range), advantage 1
    loss, stats = _loss([-0.1], [-0.2], 1.0)
    assert float(loss) == pytest.approx(-math.exp(0.1), rel=1e-6)
    assert stats["ratio_mean"] == pytest.approx(math.exp(0.1), rel=1e-6)
    assert stats["clip_frac"] == 0.0
    # a different behaviour log-prob with the same current log-prob must change the loss
    other, _ = _loss([-0.1], [-0.5], 1.0)
    assert float(other) != pytest.approx(float(loss))


def test_clipped_loss_clips_positive_and_keeps_pessimistic_negative_advantages():
    # ratio e^0.5 ~ 1.65 > 1.2: positive advantage is clipped to 1.2, negative keeps the unclipped ratio
    pos, stats = _loss([0.0], [-0.5], 1.0)
    assert float(pos) == pytest.approx(-1.2, rel=1e-6)
    assert stats["clip_frac"] == 1.0
    neg, _ = _loss([0.0], [-0.5], -1.0)
    assert float(neg) == pytest.approx(math.exp(0.5), rel=1e-6)


def test_approx_kl_is_the_k3_estimator():
    # k3 = (r - 1) - log r with log r = logp - behaviour; mean over tokens
    logp, behaviour = torch.tensor([[-0.1, -1.0]]), torch.tensor([[-0.3, -0.8]])
    _, stats = clipped_loss(logp, behaviour, torch.tensor([0.0]), torch.zeros_like(logp), 0.2)
    expected = sum((math.exp(d) - 1) - d for d in (0.2, -0.2)) / 2
    assert stats["approx_kl"] == pytest.approx(expected, rel=1e-5)
    _, same = clipped_loss(logp, logp.clone(), torch.tensor([0.0]), torch.zeros_like(logp), 0.2)
    assert same["approx_kl"] == 0.0

"""Advantages and the decoupled PPO loss against hand-computed values."""

import math

import pytest
import torch

from areal_cli.trainer.advantages import (
    broadcast_to_tokens,
    global_normalized_token_advantages,
    group_normalized_advantages,
)
from areal_cli.trainer.decoupled_ppo import DecoupledPPOConfig, decoupled_ppo_loss


def test_group_advantages_hand_computed():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv = group_normalized_advantages(r, eps=0.0)
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]))
    std = math.sqrt(0.75 * 0.25)
    assert torch.allclose(adv[1], torch.tensor([0.25, 0.25, 0.25, -0.75]) / std, atol=1e-6)


@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, 1e6])
def test_zero_variance_group_yields_zero_advantages_never_huge_ones(value):
    r = torch.full((1, 8), value, dtype=torch.float32)
    r[0, 3] = value * (1 + 1e-9)  # float noise must not blow up
    adv = group_normalized_advantages(r)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_global_normalisation_over_valid_tokens_only():
    a = torch.tensor([[1.0, 1.0, 99.0], [0.0, 99.0, 99.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.float32)
    out = global_normalized_token_advantages(a, m, eps=0.0)
    # valid values [1, 1, 0]: mean 2/3, biased std sqrt(2/9)
    mean, std = 2 / 3, math.sqrt(2 / 9)
    expected = torch.tensor([[(1 - mean) / std, (1 - mean) / std, 0.0], [(0 - mean) / std, 0.0, 0.0]])
    assert torch.allclose(out, expected, atol=1e-6)
    assert torch.equal(global_normalized_token_advantages(torch.ones(2, 3), m), torch.zeros(2, 3))


def test_broadcast_puts_sequence_advantage_on_response_tokens_only():
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[0, 1, 1], [1, 0, 0]]))
    assert torch.equal(out, torch.tensor([[0.0, 2.0, 2.0], [-1.0, 0.0, 0.0]]))


def _lp(*p):
    return torch.log(torch.tensor([list(p)], dtype=torch.float64))


def test_loss_value_hand_computed_with_clip_and_iw_cap():
    # token0: u = .5/.4 = 1.25 -> clipped to 1.2, A=1, w=1  => -1.2
    # token1: u = .2/.25 = .8, A=-2 => 1.6; w = .25/.04 = 6.25 > cap 5 => masked out
    # token2: not a response token
    lp, prox, behav = _lp(0.5, 0.2, 0.9), _lp(0.4, 0.25, 0.3), _lp(0.4, 0.04, 0.1)
    adv = torch.tensor([[1.0, -2.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, stats = decoupled_ppo_loss(lp, prox, behav, adv, mask, 4, DecoupledPPOConfig(0.2, 5.0))
    assert loss.item() == pytest.approx(-1.2 / 4)
    assert stats["n_iw_capped"] == 1 and stats["n_clipped"] == 1 and stats["n_tokens"] == 2
    loss_nocap, _ = decoupled_ppo_loss(lp, prox, behav, adv, mask, 4, DecoupledPPOConfig(0.2, None))
    assert loss_nocap.item() == pytest.approx((-1.2 + 1.6 * 6.25) / 4)


def test_gradient_hand_computed_and_masked_tokens_get_none():
    # token0 unclipped: u = 1.1, A = 1, w = 2 -> loss -A*w*u, d/dlp = -A*w*u = -2.2 (du/dlp = u)
    # token1 masked (prompt), token2 above the IW cap, token3 clipped (u=1.5, A=1): no gradient
    lp = _lp(0.55, 0.3, 0.2, 0.6).requires_grad_(True)
    prox = _lp(0.5, 0.3, 0.2, 0.4)
    behav = _lp(0.25, 0.3, 0.01, 0.4)
    adv = torch.tensor([[1.0, 5.0, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    loss, _ = decoupled_ppo_loss(lp, prox, behav, adv, mask, 10)
    loss.backward()
    expected = torch.tensor([[-2.2 / 10, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(lp.grad, expected, atol=1e-12)


def test_on_policy_loss_is_minus_mean_advantage():
    # when pi_theta == pi_prox == pi_behav, the loss is -sum(A)/n_valid and w = u = 1
    lp = torch.log(torch.rand(3, 5, dtype=torch.float64).clamp_min(0.01))
    adv = torch.randn(3, 5, dtype=torch.float64)
    mask = (torch.rand(3, 5) > 0.3).double()
    loss, stats = decoupled_ppo_loss(lp, lp, lp, adv, mask, mask.sum().item())
    assert loss.item() == pytest.approx(-(adv * mask).sum().item() / mask.sum().item())
    assert stats["imp_weight_sum"] == pytest.approx(mask.sum().item())


def test_microbatch_losses_sum_to_global_token_mean():
    torch.manual_seed(0)
    lp, prox, behav = (torch.log(torch.rand(4, 6, dtype=torch.float64)) for _ in range(3))
    adv = torch.randn(4, 6, dtype=torch.float64)
    mask = (torch.rand(4, 6) > 0.4).double()
    n = mask.sum().item()
    full, _ = decoupled_ppo_loss(lp, prox, behav, adv, mask, n)
    parts = sum(decoupled_ppo_loss(lp[i : i + 1], prox[i : i + 1], behav[i : i + 1], adv[i : i + 1], mask[i : i + 1], n)[0] for i in range(4))
    assert full.item() == pytest.approx(parts.item())


def test_shape_mismatch_is_rejected():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        decoupled_ppo_loss(x, x, x, torch.zeros(2, 4), x, 1)
    with pytest.raises(ValueError):
        decoupled_ppo_loss(x, x, x, x, x, 0)


def test_one_minibatch_naive_ppo_has_the_decoupled_gradient_except_on_tokens_it_clips():
    """Why the staleness ablation needs several PPO minibatches per step (AReaL's math configs: 4): with one, the
    update's gradient is taken at theta = theta_prox, where the decoupled loss is w * A * grad log pi (u = 1, never
    clipped) and naive PPO's ratio r = pi_theta / pi_behav equals w, so its gradient A * r * grad log pi is the same
    unless r lies outside [1 - eps, 1 + eps] on the side A pushes it to; naive PPO then drops the token. By hand:
    d(loss)/d(logp_t) = -A_t * w_t / N (N = 6 loss tokens) or 0."""
    w = torch.tensor([[1.0, 1.1, 1.5, 0.5, 0.5, 1.5]])  # pi_prox / pi_behav
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0, -1.0, -1.0]])
    prox = torch.log(torch.tensor([[0.3, 0.2, 0.4, 0.1, 0.25, 0.5]]))
    behav = prox - torch.log(w)
    mask = torch.ones_like(w)
    cfg = DecoupledPPOConfig(eps_clip=0.2, behav_imp_weight_cap=5.0)

    def grad(proximal):
        logp = prox.clone().requires_grad_(True)  # theta = theta_prox: the one minibatch's gradient point
        loss, stats = decoupled_ppo_loss(logp, proximal, behav, adv, mask, 6, cfg)
        loss.backward()
        return logp.grad, stats

    g_decoupled, s_decoupled = grad(prox)
    g_naive, s_naive = grad(behav)  # naive PPO: proximal := behaviour, so w = 1 and r = pi_theta / pi_behav
    expected = -adv * w / 6
    assert torch.allclose(g_decoupled, expected, atol=1e-6)
    assert s_decoupled["n_clipped"] == 0
    # naive: tokens 2 (r 1.5 > 1.2, A > 0) and 4 (r 0.5 < 0.8, A < 0) are clipped; the rest equal the decoupled ones
    kept = torch.tensor([[True, True, False, True, False, True]])
    assert torch.allclose(g_naive, torch.where(kept, expected, torch.zeros_like(expected)), atol=1e-6)
    assert s_naive["n_clipped"] == 2

"""Advantage estimation for outcome rewards (one scalar reward per sample).

With GAE at gamma = lambda = 1 and no critic (AReaL v0.3, ``ppo_math_exp``; reference (e)), every
response token of a sample gets the sample's reward as its advantage; the advantages are then
normalised either per group (GRPO) or over all valid tokens of the global batch.
"""

from __future__ import annotations

import torch

#: Groups whose reward standard deviation is below this have *zero* advantage. Dividing by a
#: near-zero std would turn float noise into huge advantages.
ZERO_STD_TOL = 1e-6


def group_normalized_advantages(rewards: torch.Tensor, eps: float = 1e-5, scale_by_std: bool = True) -> torch.Tensor:
    """GRPO group normalisation: ``A_i = (r_i - mean(r)) / (std(r) + eps)`` within each group.

    Source: Shao et al. 2024 (DeepSeekMath), §4.1.2 "outcome supervision". ``std`` is the biased
    (population) standard deviation, as AReaL's ``masked_normalization``.

    Args:
        rewards: float tensor [G, n]: G groups of n samples of one prompt each.
        eps: added to the std in the denominator.
        scale_by_std: if False, only subtract the group mean (Dr. GRPO style).

    Returns:
        float tensor [G, n]. A group with (near) zero reward variance gets exactly 0 for every sample.

    Raises:
        ValueError: if ``rewards`` is not 2-D or has a non-finite value.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, group_size], got shape {tuple(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")
    r = rewards.to(torch.float64)
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, unbiased=False, keepdim=True)
    adv = r - mean
    if scale_by_std:
        adv = adv / (std + eps)
    adv = torch.where(std < ZERO_STD_TOL, torch.zeros_like(adv), adv)
    return adv.to(rewards.dtype)


def broadcast_to_tokens(seq_values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Give every response token its sequence's value (GAE with gamma = lambda = 1, zero values).

    Args:
        seq_values: float tensor [B] (one advantage or reward per sequence).
        loss_mask: float/bool tensor [B, T], nonzero on response-token positions.

    Returns:
        float tensor [B, T]: ``seq_values[b]`` where ``loss_mask[b, t]`` else 0.
    """
    if seq_values.dim() != 1 or seq_values.shape[0] != loss_mask.shape[0]:
        raise ValueError(f"seq_values {tuple(seq_values.shape)} does not match loss_mask {tuple(loss_mask.shape)}")
    mask = loss_mask.to(seq_values.dtype)
    return seq_values[:, None] * mask


def global_normalized_token_advantages(
    token_advantages: torch.Tensor, loss_mask: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    """Normalise advantages over all valid tokens of the global batch (AReaL ``masked_normalization``).

    ``A' = (A - mean) / (std + eps)`` with mean and biased std over positions where ``loss_mask`` is set,
    computed in float64 (reference (e)). Longer responses weigh more, as in AReaL. If the valid tokens
    have (near) zero variance, all advantages are 0.

    Args:
        token_advantages: float tensor [B, T].
        loss_mask: tensor [B, T], nonzero on valid tokens.
        eps: added to the std.

    Returns:
        float tensor [B, T], 0 at masked positions.

    Raises:
        ValueError: if shapes differ or no token is valid.
    """
    if token_advantages.shape != loss_mask.shape:
        raise ValueError(f"shape mismatch {tuple(token_advantages.shape)} vs {tuple(loss_mask.shape)}")
    m = loss_mask.to(torch.float64)
    n = m.sum()
    if n == 0:
        raise ValueError("no valid token to normalise over")
    a = token_advantages.to(torch.float64)
    mean = (a * m).sum() / n
    var = (((a - mean) * m) ** 2).sum() / n
    std = var.sqrt()
    if std < ZERO_STD_TOL:
        return torch.zeros_like(token_advantages)
    out = (a - mean) / (std + eps) * m
    return out.to(token_advantages.dtype)

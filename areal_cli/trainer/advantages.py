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


NORM_LEVELS = ("group", "batch", "none")


def _group_stats(r: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample: its group's reward sum, size and biased std ([N] each, float64)."""
    n_groups = int(group_ids.max()) + 1
    sums = torch.zeros(n_groups, dtype=r.dtype).index_add_(0, group_ids, r)
    sizes = torch.zeros(n_groups, dtype=r.dtype).index_add_(0, group_ids, torch.ones_like(r))
    mean = sums / sizes
    sq = torch.zeros(n_groups, dtype=r.dtype).index_add_(0, group_ids, (r - mean[group_ids]) ** 2)
    return sums[group_ids], sizes[group_ids], (sq / sizes).sqrt()[group_ids]


def reward_norm_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, mean_level: str = "group",
                           std_level: str = "group", leave1out: bool = False, eps: float = 1e-5) -> torch.Tensor:
    """Sample advantages by AReaL's ``reward_norm: {mean_level, mean_leave1out, std_level}`` rule
    (``areal/api/cli_args.py:NormConfig``; ``areal/utils/functional`` ``Normalization``):
    ``A_i = (r_i - b_i) / (std + eps)``.

    * baseline b_i: ``group`` mean of i's group (Shao et al. 2024, GRPO); with ``leave1out`` the mean of the
      group's *other* samples, ``(sum_g - r_i) / (n_g - 1)`` (RLOO: Ahmadian et al. 2024, "Back to Basics:
      Revisiting REINFORCE Style Optimization for Learning from Human Feedback", §3.2 eq. 9); ``batch`` mean of
      all samples; ``none``: 0.
    * scale: ``group`` biased std of i's group (GRPO, as :func:`group_normalized_advantages`); ``batch`` biased std
      of all the batch's rewards (LitePPO: Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM
      Reasoning", §4.1: group mean, batch std); ``none``: no division (Dr.GRPO: Liu et al. 2025, "Understanding
      R1-Zero-Like Training", §3.2). The biased std is the kit's (AReaL's ``std_unbiased`` default is True).

    Zero-variance ("dead") groups: with a group baseline their samples get exactly 0 (b_i = r_i, also
    leave-one-out); with a ``batch`` baseline they keep ``r - batch mean`` (they carry signal against the batch).
    A batch whose rewards all agree gives 0 everywhere under a batch std.

    Args:
        rewards: [N] shaped rewards, one per sample. group_ids: [N] long, the group of each sample (0..G-1).
        mean_level, std_level: in :data:`NORM_LEVELS`. leave1out: needs ``mean_level == "group"`` and groups of
        at least 2. eps: added to the std.
    Returns:
        [N] advantages in ``rewards``' dtype (computed in float64).
    Raises:
        ValueError: an unknown level, leave1out with another mean level or a group of one, non-finite rewards.
    """
    if mean_level not in NORM_LEVELS or std_level not in NORM_LEVELS:
        raise ValueError(f"mean_level and std_level must be in {NORM_LEVELS}, got {mean_level!r}, {std_level!r}")
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be [N] each")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")
    r, g = rewards.to(torch.float64), group_ids.long()
    g_sum, g_size, g_std = _group_stats(r, g)
    if leave1out and (mean_level != "group" or bool((g_size < 2).any())):
        raise ValueError("leave1out needs mean_level 'group' and groups of at least 2 samples")
    if mean_level == "group":
        base = (g_sum - r) / (g_size - 1) if leave1out else g_sum / g_size
    else:
        base = r.mean().expand_as(r) if mean_level == "batch" else torch.zeros_like(r)
    adv = r - base
    if std_level == "group":
        adv = adv / (g_std + eps)
    elif std_level == "batch":
        std = r.std(unbiased=False)
        adv = torch.zeros_like(adv) if std < ZERO_STD_TOL else adv / (std + eps)
    if mean_level == "group":
        adv = torch.where(g_std < ZERO_STD_TOL, torch.zeros_like(adv), adv)
    return adv.to(rewards.dtype)


def zero_std_group_fraction(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Share of groups whose rewards ([N], groups by ``group_ids`` [N]) have a std below :data:`ZERO_STD_TOL`
    ("dead" groups: zero advantage under a group baseline)."""
    r, g = rewards.to(torch.float64), group_ids.long()
    _, _, g_std = _group_stats(r, g)
    n_groups = int(g.max()) + 1
    dead = torch.zeros(n_groups, dtype=torch.bool)
    dead[g] = g_std < ZERO_STD_TOL
    return float(dead.double().mean())


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, overlong_tokens: int,
                     factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, DAPO §3.4 eq. 13; AReaL
    ``areal/utils/functional/functional.py:reward_overlong_penalty``), added to the raw reward:
    ``min(-(len - (L_max - L_cache)) / L_cache * factor, 0)``: 0 up to ``L_max - L_cache`` tokens, then linear
    down to ``-factor`` at ``L_max``.

    Args:
        lengths: [N] response tokens (loss tokens) per sample. max_new_tokens: L_max. overlong_tokens: L_cache
            (> 0). factor: the penalty at L_max.
    Returns:
        [N] float penalties (<= 0).
    """
    if overlong_tokens <= 0:
        raise ValueError(f"overlong_tokens must be > 0, got {overlong_tokens}")
    exceed = lengths.to(torch.float64) - (max_new_tokens - overlong_tokens)
    return (-exceed / overlong_tokens * factor).clamp(max=0.0).to(torch.float32)


def last_token_rewards(seq_rewards: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Token rewards of outcome-reward PPO: each sequence's reward on its last loss token, 0 elsewhere (AReaL
    ``PPOActor._compute_advantages``: ``rewards[i, seqlen_i - 2] += reward_score``).

    Args:
        seq_rewards: [B] one reward per row (one sequence per row, right-padded). loss_mask: [B, T].
    Returns:
        [B, T] float32; a row without loss tokens gets nothing.
    """
    m = loss_mask.to(torch.bool)
    t = torch.arange(m.shape[1]).expand_as(m)
    last = torch.where(m, t, torch.full_like(t, -1)).max(dim=1).values  # [B], -1: no loss token
    out = torch.zeros(m.shape, dtype=torch.float32)
    rows = torch.nonzero(last >= 0).flatten()
    out[rows, last[rows]] = seq_rewards.to(torch.float32)[rows]
    return out


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, discount: float,
                   gae_lambda: float, sequence_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over each row's loss tokens (Schulman et al. 2016, "High-Dimensional
    Continuous Control Using Generalized Advantage Estimation", §3 eq. 16; the recursion of AReaL
    ``areal/trainer/ppo/actor.py:PPOActor._compute_advantages``)::

        delta_t = r_t + gamma * V_next(t) - V_t
        A_t     = delta_t + gamma * lambda * A_next(t)
        R_t     = A_t + V_t                          (the critic's target, "returns")

    ``next(t)`` is the sequence's next loss position (positions with loss mask 0, e.g. tool output between two
    assistant turns, are skipped: values and advantages carry over them, as in AReaL); after the last loss token
    the episode ends (V = 0, A = 0: the reward is given on truncated responses too, so nothing is bootstrapped).
    With values 0 and lambda 1 this is the discounted return-to-go of the rewards (the KL rewards of
    :func:`areal_cli.trainer.kl.kl_reward_to_go`).

    Args:
        rewards: [B, T] token rewards (outcome reward on the last loss token, :func:`last_token_rewards`; plus any
            per-token rewards). values: [B, T] V(s_t) of the critic before the update (detached).
        loss_mask: [B, T], nonzero on loss tokens. discount: gamma in [0, 1]. gae_lambda: lambda in [0, 1].
        sequence_ids: [B, T] sequence of each token within its row for packed rows (the recursion restarts where
            it changes); None: one sequence per row.
    Returns:
        ``(advantages, returns)``: [B, T] each in ``rewards``' dtype and device, 0 off the mask (computed in float64).
    Raises:
        ValueError: shapes differ, or gamma / lambda outside [0, 1].
    """
    if rewards.shape != values.shape or rewards.shape != loss_mask.shape or rewards.dim() != 2:
        raise ValueError(f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and loss_mask "
                         f"{tuple(loss_mask.shape)} must be the same [B, T]")
    if not (0.0 <= discount <= 1.0 and 0.0 <= gae_lambda <= 1.0):
        raise ValueError(f"discount and gae_lambda must be in [0, 1], got {discount}, {gae_lambda}")
    r, v = rewards.to(torch.float64), values.detach().to(device=rewards.device, dtype=torch.float64)
    m = loss_mask.to(device=rewards.device, dtype=torch.bool)
    B, T = r.shape
    adv = torch.zeros_like(r)
    last_adv = torch.zeros(B, dtype=torch.float64, device=r.device)
    next_v = torch.zeros_like(last_adv)
    for t in range(T - 1, -1, -1):
        if sequence_ids is not None and t + 1 < T:  # a new sequence starts at t + 1: nothing carries back
            cut = sequence_ids[:, t] != sequence_ids[:, t + 1]
            last_adv = torch.where(cut, torch.zeros_like(last_adv), last_adv)
            next_v = torch.where(cut, torch.zeros_like(next_v), next_v)
        delta = r[:, t] + discount * next_v - v[:, t]
        new = delta + discount * gae_lambda * last_adv
        mt = m[:, t]
        last_adv = torch.where(mt, new, last_adv)
        next_v = torch.where(mt, v[:, t], next_v)
        adv[:, t] = torch.where(mt, new, torch.zeros_like(new))
    returns = torch.where(m, adv + v, torch.zeros_like(adv))
    return adv.to(rewards.dtype), returns.to(rewards.dtype)


def sequence_rewards(shaped: torch.Tensor, group_ids: torch.Tensor, ppo) -> torch.Tensor:
    """The sequence rewards GAE starts from (:func:`gae_advantages`, with a critic or with ``ppo.discount`` /
    ``ppo.gae_lambda`` < 1): the shaped rewards [N], normalised by the ``ppo.reward_norm_*`` rule when one is set
    (AReaL's ``reward_norm`` applies before GAE); keys left "" follow ``ppo.adv_norm`` (group: group mean and std;
    global: none, the batch normalisation then applies to the GAE advantages). Returns [N] float32."""
    default = "group" if ppo.adv_norm == "group" else "none"
    mean, std = ppo.reward_norm_mean_level or default, ppo.reward_norm_std_level or default
    if (mean, std, ppo.reward_norm_mean_leave1out) == ("none", "none", False):
        return shaped.to(torch.float32)
    return reward_norm_advantages(shaped, group_ids, mean, std, ppo.reward_norm_mean_leave1out).to(torch.float32)

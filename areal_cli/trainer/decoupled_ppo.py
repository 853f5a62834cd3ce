"""The decoupled PPO objective of AReaL (boba², "AReaL: A Large-Scale Asynchronous Reinforcement
Learning System for Language Reasoning", Fu et al. 2025, §5.2 eq. 5).

Three policies per token t:

* behaviour ``pi_behav``: the policy (possibly several versions, after interruptions) that sampled the
  token; its logprob comes back from the rollout server.
* proximal ``pi_prox``: the trainer's weights *before* this update, recomputed by the trainer.
* current ``pi_theta``: the weights being optimised.

    J(theta) = E[ sum_t w_t * min(u_t A_t, clip(u_t, 1 - eps, 1 + eps) A_t) ]
    w_t = pi_prox / pi_behav   (importance weight; tokens with w_t > cap are masked out, not clipped)
    u_t = pi_theta / pi_prox

The loss is the negative objective summed over valid tokens and divided by the number of valid tokens in
the *global* batch (all micro-batches, all data-parallel ranks), AReaL's token-level aggregation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecoupledPPOConfig:
    """Hyper-parameters of the loss.

    Attributes:
        eps_clip: PPO clip range eps (AReaL default 0.2).
        behav_imp_weight_cap: tokens whose w = pi_prox/pi_behav exceeds this are masked out
            (AReaL default 5.0); None disables the cap.
    """

    eps_clip: float = 0.2
    behav_imp_weight_cap: float | None = 5.0


def decoupled_ppo_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    n_valid_tokens_global: int | float,
    config: DecoupledPPOConfig = DecoupledPPOConfig(),
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO loss for one micro-batch, normalised by the global valid-token count.

    Args:
        logprobs: [B, T] log pi_theta of the sampled tokens (with grad).
        proximal_logprobs: [B, T] log pi_prox (no grad needed; detached here).
        behaviour_logprobs: [B, T] log pi_behav from the rollout server.
        advantages: [B, T] per-token advantages.
        loss_mask: [B, T] 1 on response tokens that count, 0 elsewhere (prompt, padding).
        n_valid_tokens_global: number of tokens with loss_mask set over the whole global batch (> 0).
        config: clip eps and importance-weight cap.

    Returns:
        (loss, stats): ``loss`` is a scalar = sum over this micro-batch's tokens / n_valid_tokens_global,
        so summing micro-batch losses gives the global token mean. ``stats`` holds token counts (not
        normalised) of clipped and cap-masked tokens and sums of importance weights, for logging.

    Raises:
        ValueError: on mismatched shapes or a non-positive ``n_valid_tokens_global``.
    """
    shape = logprobs.shape
    for name, t in (
        ("proximal_logprobs", proximal_logprobs),
        ("behaviour_logprobs", behaviour_logprobs),
        ("advantages", advantages),
        ("loss_mask", loss_mask),
    ):
        if t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if n_valid_tokens_global <= 0:
        raise ValueError(f"n_valid_tokens_global must be > 0, got {n_valid_tokens_global}")

    mask = loss_mask.to(torch.bool)
    prox = proximal_logprobs.detach()
    behav = behaviour_logprobs.detach()
    adv = advantages.detach()

    # u_t = pi_theta / pi_prox, zero log-ratio on masked tokens so exp() never overflows there.
    log_ratio = torch.where(mask, logprobs - prox, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - config.eps_clip, 1.0 + config.eps_clip)
    pg_loss = torch.maximum(-adv * ratio, -adv * clipped)

    # w_t = pi_prox / pi_behav; above the cap the token is masked out (weight 0), not clipped.
    imp_weight = torch.exp(torch.where(mask, prox - behav, torch.zeros_like(prox)))
    keep = mask
    if config.behav_imp_weight_cap is not None:
        keep = mask & (imp_weight <= config.behav_imp_weight_cap)
    weight = torch.where(keep, imp_weight, torch.zeros_like(imp_weight))

    per_token = torch.where(mask, pg_loss * weight, torch.zeros_like(pg_loss))
    loss = per_token.sum() / float(n_valid_tokens_global)

    with torch.no_grad():
        was_clipped = mask & ((-adv * clipped) > (-adv * ratio))
        stats = {
            "n_tokens": float(mask.sum()),
            "n_clipped": float(was_clipped.sum()),
            "n_iw_capped": float((mask & ~keep).sum()),
            "imp_weight_sum": float(torch.where(mask, imp_weight, torch.zeros_like(imp_weight)).sum()),
            "imp_weight_max": float(imp_weight[mask].max()) if mask.any() else 0.0,
        }
    return loss, stats

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

Off-policy corrections of the behaviour weight ``w`` (``ppo.behav_imp_weight_mode``, :func:`behaviour_weights`):

* ``token_mask`` (default; AReaL boba² §5.2): tokens with ``w > cap`` (or ``w < lower``) get weight 0.
  With ``lower`` set this is IcePop's two-sided token masking (Ling team, "Every Step Evolves: Scaling RL
  for Trillion-Scale Thinking Model" (Ring-1T), 2025, §IcePop: mask tokens whose training/inference
  probability ratio is outside ``[alpha, beta]``, e.g. 0.5 and 5).
* ``token_truncate``: truncated importance sampling, ``w := min(w, cap)`` (Yao, Liu et al., "Your Efficient
  RL Framework Secretly Brings You Off-Policy RL Training", 2025; AReaL's ``token_truncate``).
* ``sequence_mask``: masked importance sampling at the sequence level: every token of a sequence whose
  sequence weight ``w_seq = exp(mean_t log w_t)`` (geometric mean over its loss tokens, as AReaL's
  ``sequence_*`` modes) is above ``cap`` or below ``lower`` gets weight 0; kept sequences use ``w_seq``
  (Liu, Li et al., "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
  Mismatch", 2025, sequence-level MIS; AReaL 2.0 ``rejection_sampling: {level: sequence, action: mask,
  metric: ratio}``).
* ``sequence_truncate``: ``w := min(w_seq, cap)`` per sequence (AReaL's ``sequence_truncate``).
* ``disabled``: ``w := 1`` (the behaviour policy is ignored: PPO against the proximal policy only).

Algorithm keys (``ppo.*``, :mod:`areal_cli.config.algorithms`; the pieces in :mod:`areal_cli.trainer.loss_terms`,
with their sources): ``eps_clip_higher`` clips u to ``[1 - eps, 1 + eps_high]`` (DAPO §3.1, Yu et al. 2025);
``c_clip`` bounds the loss of A < 0 tokens by ``c |A|`` (dual clip, Ye et al. 2020); ``importance_sampling_level:
sequence`` replaces u_t by GSPO's ``s_i = exp(mean_t log u_t)`` (Zheng et al. 2025, eq. 7) and A_t by the sequence
mean of A; ``loss_fn: cispo`` replaces the clipped objective by ``sg(clip(u)) A log pi_theta`` (MiniMax-M1 2025
eq. 4); ``loss_agg_mode`` picks the normaliser (token-mean above; seq-mean-token-mean; seq-mean-token-sum-norm).
Each keeps the behaviour weight w as a factor, so it combines with the decoupled loss and eta > 0: GSPO with a
*token* weight w_t is refused (the config's check), since sum_t w_t f(s_i) weighs the sequence by the arithmetic
mean of its token weights, which is no importance weight of the sequence; the sequence modes give the sequence one
weight, the length-normalised (geometric-mean) sequence likelihood ratio, as GSPO's s_i is for pi_theta / pi_prox.

Naive PPO (proximal := behaviour, ``ppo.recompute_proximal: false``) makes ``w = 1`` by construction. Its ratio is
then ``pi_theta / pi_behav``, which at ``theta = theta_prox`` (the first minibatch of a step) equals the decoupled
``w``: with one minibatch per step the two gradients differ only on the tokens naive PPO clips.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from areal_cli.trainer.loss_terms import (LOSS_AGG_MODES, aggregate, cispo_loss_terms, dual_clip,
                                          sequence_level_ratio, sequence_mean)

__all__ = ["BEHAV_IMP_WEIGHT_MODES", "DecoupledPPOConfig", "behaviour_weights", "decoupled_ppo_loss", "sequence_mean"]

BEHAV_IMP_WEIGHT_MODES = ("token_mask", "token_truncate", "sequence_mask", "sequence_truncate", "disabled")


@dataclass(frozen=True)
class DecoupledPPOConfig:
    """Hyper-parameters of the loss.

    Attributes:
        eps_clip: PPO clip range eps (AReaL default 0.2).
        behav_imp_weight_cap: upper bound of the behaviour weight w = pi_prox/pi_behav (AReaL default 5.0):
            above it a token (or sequence) is masked out, or its weight truncated, per ``ppo.behav_imp_weight_mode``;
            None disables the bound.
        behav_imp_weight_mode: one of :data:`BEHAV_IMP_WEIGHT_MODES` (see the module docstring).
        behav_imp_weight_lower: lower bound for the mask modes (IcePop's alpha, e.g. 0.5); None: no lower bound.
        eps_clip_higher: upper clip range (DAPO clip-higher); None: ``eps_clip``.
        c_clip: dual clip (> 1); None: off.
        importance_sampling_level: ``token`` or ``sequence`` (GSPO).
        loss_fn: ``ppo`` or ``cispo``.
        loss_agg_mode: one of :data:`~areal_cli.trainer.loss_terms.LOSS_AGG_MODES`.
        loss_agg_norm_tokens: Dr.GRPO's constant for ``seq-mean-token-sum-norm`` (rollout.max_new_tokens).
    Raises:
        ValueError: an unknown mode, a cap <= 1 with a mask/truncate mode, or a lower bound outside (0, 1), a
            c_clip <= 1, an unknown level, loss or aggregation.
    """

    eps_clip: float = 0.2
    behav_imp_weight_cap: float | None = 5.0
    behav_imp_weight_mode: str = "token_mask"
    behav_imp_weight_lower: float | None = None
    eps_clip_higher: float | None = None
    c_clip: float | None = None
    importance_sampling_level: str = "token"
    loss_fn: str = "ppo"
    loss_agg_mode: str = "token-mean"
    loss_agg_norm_tokens: int = 0

    def __post_init__(self) -> None:
        if self.c_clip is not None and not self.c_clip > 1.0:
            raise ValueError(f"c_clip must be > 1 (or None), got {self.c_clip}")
        for name, value, allowed in (("importance_sampling_level", self.importance_sampling_level, ("token", "sequence")),
                                     ("loss_fn", self.loss_fn, ("ppo", "cispo")),
                                     ("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        if self.behav_imp_weight_mode not in BEHAV_IMP_WEIGHT_MODES:
            raise ValueError(f"behav_imp_weight_mode must be one of {', '.join(BEHAV_IMP_WEIGHT_MODES)}, "
                             f"got {self.behav_imp_weight_mode!r}")
        if self.behav_imp_weight_cap is not None and not self.behav_imp_weight_cap > 1.0:
            raise ValueError(f"behav_imp_weight_cap must be > 1 (or None), got {self.behav_imp_weight_cap}")
        if self.behav_imp_weight_lower is not None:
            if not 0.0 < self.behav_imp_weight_lower < 1.0:
                raise ValueError(f"behav_imp_weight_lower must be in (0, 1), got {self.behav_imp_weight_lower}")
            if not self.behav_imp_weight_mode.endswith("_mask"):
                raise ValueError("behav_imp_weight_lower applies to the mask modes only "
                                 f"(behav_imp_weight_mode is {self.behav_imp_weight_mode!r})")


def behaviour_weights(
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    config: DecoupledPPOConfig,
    sequence_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The behaviour weight of each token after the configured off-policy correction.

    Args:
        proximal_logprobs, behaviour_logprobs: [B, T] nats.
        mask: [B, T] bool, loss tokens.
        config: mode, cap and lower bound (module docstring for the rules and their sources).
        sequence_ids: [B, T] sequence of each token within its row (packed rows), for the sequence modes.
    Returns:
        (weight, kept, truncated): ``weight`` [B, T] (0 off the mask and on masked-out tokens); ``kept`` [B, T]
        bool, loss tokens the rule keeps; ``truncated`` [B, T] bool, kept tokens whose weight was truncated.
    """
    log_w = torch.where(mask, proximal_logprobs - behaviour_logprobs, torch.zeros_like(proximal_logprobs))
    mode, cap, lower = config.behav_imp_weight_mode, config.behav_imp_weight_cap, config.behav_imp_weight_lower
    zeros = torch.zeros_like(log_w)
    no = torch.zeros_like(mask)
    if mode == "disabled":
        return torch.where(mask, torch.ones_like(log_w), zeros), mask.clone(), no
    if mode.startswith("sequence"):
        log_w = torch.where(mask, sequence_mean(log_w, mask, sequence_ids), zeros)
    w = torch.exp(log_w)
    if mode.endswith("_truncate"):
        truncated = mask & (w > cap) if cap is not None else no
        w = w.clamp(max=cap) if cap is not None else w
        return torch.where(mask, w, zeros), mask.clone(), truncated
    kept = mask
    if cap is not None:
        kept = kept & (w <= cap)
    if lower is not None:
        kept = kept & (w >= lower)
    return torch.where(kept, w, zeros), kept, no


def decoupled_ppo_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    n_valid_tokens_global: int | float,
    config: DecoupledPPOConfig = DecoupledPPOConfig(),
    sequence_ids: torch.Tensor | None = None,
    n_sequences_global: int | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO loss for one micro-batch, normalised by the global valid-token count (``token-mean``; the
    other ``config.loss_agg_mode``s: :func:`~areal_cli.trainer.loss_terms.aggregate`).

    Args:
        logprobs: [B, T] log pi_theta of the sampled tokens (with grad).
        proximal_logprobs: [B, T] log pi_prox (no grad needed; detached here).
        behaviour_logprobs: [B, T] log pi_behav from the rollout server.
        advantages: [B, T] per-token advantages.
        loss_mask: [B, T] 1 on response tokens that count, 0 elsewhere (prompt, padding).
        n_valid_tokens_global: number of tokens with loss_mask set over the whole global batch (> 0).
        config: clip eps and the behaviour-weight correction (mode, cap, lower bound).
        sequence_ids: [B, T] sequence of each token within its row, for packed rows and the sequence modes
            (None: one sequence per row).
        n_sequences_global: sequences with a loss token in the global batch (the ``seq-*`` aggregation modes).

    Returns:
        (loss, stats): ``loss`` is a scalar = sum over this micro-batch's tokens / n_valid_tokens_global,
        so summing micro-batch losses gives the global token mean. ``stats`` holds token counts (not
        normalised): ``n_tokens``, ``n_clipped`` (CISPO: weights clipped), ``n_dual_clipped`` (tokens the dual clip
        bound), ``n_iw_capped`` (loss tokens the correction masked out),
        ``n_iw_truncated`` (weights truncated), and ``imp_weight_sum`` / ``imp_weight_max`` of the weights
        applied, for logging.

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
    if sequence_ids is not None and sequence_ids.shape != shape:
        raise ValueError(f"sequence_ids has shape {tuple(sequence_ids.shape)}, expected {tuple(shape)}")
    if n_valid_tokens_global <= 0:
        raise ValueError(f"n_valid_tokens_global must be > 0, got {n_valid_tokens_global}")

    mask = loss_mask.to(torch.bool)
    prox = proximal_logprobs.detach()
    behav = behaviour_logprobs.detach()
    adv = advantages.detach()

    # u_t = pi_theta / pi_prox, zero log-ratio on masked tokens so exp() never overflows there.
    log_ratio = torch.where(mask, logprobs - prox, torch.zeros_like(logprobs))
    if config.importance_sampling_level == "sequence":  # GSPO: u_t := s_i, A_t := mean_t A (loss_terms)
        log_ratio, adv = sequence_level_ratio(log_ratio, adv, mask, sequence_ids)
    ratio = torch.exp(log_ratio)
    high = config.eps_clip if config.eps_clip_higher is None else config.eps_clip_higher
    clipped = torch.clamp(ratio, 1.0 - config.eps_clip, 1.0 + high)
    dual = torch.zeros_like(mask)
    if config.loss_fn == "cispo":
        pg_loss = cispo_loss_terms(logprobs, clipped, adv)
    else:
        pg_loss = torch.maximum(-adv * ratio, -adv * clipped)
        if config.c_clip is not None:
            pg_loss, dual = dual_clip(pg_loss, adv, config.c_clip)

    # w_t = pi_prox / pi_behav after the off-policy correction (masked-out tokens: weight 0).
    weight, kept, truncated = behaviour_weights(prox, behav, mask, config, sequence_ids)

    per_token = torch.where(mask, pg_loss * weight, torch.zeros_like(pg_loss))
    loss = aggregate(per_token, mask, config.loss_agg_mode, n_valid_tokens_global, n_sequences_global,
                     config.loss_agg_norm_tokens, sequence_ids)

    with torch.no_grad():
        if config.loss_fn == "cispo":
            was_clipped = mask & (clipped != ratio)
        else:
            was_clipped = mask & ((-adv * clipped) > (-adv * ratio))
        stats = {
            "n_tokens": float(mask.sum()),
            "n_clipped": float(was_clipped.sum()),
            "n_dual_clipped": float((mask & dual).sum()),
            "n_iw_capped": float((mask & ~kept).sum()),
            "n_iw_truncated": float(truncated.sum()),
            "imp_weight_sum": float(weight[mask].sum()) if mask.any() else 0.0,
            "imp_weight_max": float(weight[mask].max()) if mask.any() else 0.0,
        }
    return loss, stats

"""The pieces of the policy loss that the algorithm keys change (:mod:`areal_cli.config.algorithms`): per-sequence
reductions, GSPO's sequence ratio, the dual clip, CISPO's per-token term, and the loss aggregation.

Sources:

* sequence ratio: Zheng et al. 2025, "Group Sequence Policy Optimization", §4.1 eq. 7,
  ``s_i(theta) = exp(1/|y_i| sum_t log(pi_theta(y_it) / pi_old(y_it)))``; AReaL
  ``areal/utils/functional/functional.py:_compute_sequence_level_ratio_and_advantages`` (which also averages the
  advantages over the sequence, as here).
* dual clip: Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL", §3.3 eq. 4 (for A < 0 the
  objective is bounded below by c * A); AReaL ``ppo_actor_loss_fn``: ``min(pg_loss, c * |A|)``.
* CISPO: MiniMax 2025, "MiniMax-M1", §3.1 eq. 4-5: ``J = E[sum_t sg(r_hat_t) A_t log pi_theta(y_t)]`` with
  ``r_hat = clip(r, 1 - eps_low, 1 + eps_high)``.
* aggregation: verl ``verl/trainer/ppo/core_algos.py:agg_loss`` (token-mean, seq-mean-token-mean,
  seq-mean-token-sum-norm); Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", §3.2, their code's
  constant ``generate_max_length`` normaliser).

Zero-variance ("dead") groups: their advantages are 0, so their tokens add 0 to every numerator, and they count in
every denominator: their loss tokens in ``token-mean``, their sequences in ``seq-mean-token-mean`` and
``seq-mean-token-sum-norm`` (a batch with more dead groups takes a smaller step; drop them before the loss with
``rollout.success_rate_lb/ub``, DAPO's dynamic sampling). ``zero_std_group_frac`` in metrics.jsonl is their share.
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def sequence_sums(values: torch.Tensor, mask: torch.Tensor,
                  sequence_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token, the sum of ``values`` and the number of tokens over the masked tokens of the token's sequence.

    Args:
        values: [B, T] floats. mask: [B, T] bool, tokens that count.
        sequence_ids: [B, T] long, which sequence of its row a token belongs to (packed rows: the segment id,
            -1 on padding); None: one sequence per row.
    Returns:
        ``(sums, counts)``, both [B, T] in ``values``' dtype (differentiable in ``values``).
    """
    B, _ = values.shape
    seg = torch.zeros_like(values, dtype=torch.long) if sequence_ids is None else sequence_ids.clamp(min=0).long()
    n_seg = int(seg.max()) + 1 if seg.numel() else 1
    key = torch.arange(B, device=values.device).unsqueeze(1) * n_seg + seg  # [B, T] global sequence index
    m = mask.to(values.dtype)
    sums = torch.zeros(B * n_seg, dtype=values.dtype, device=values.device).index_add(0, key.flatten(),
                                                                                       (values * m).flatten())
    counts = torch.zeros(B * n_seg, dtype=values.dtype, device=values.device).index_add_(0, key.flatten(), m.flatten())
    return sums[key], counts[key]


def sequence_mean(values: torch.Tensor, mask: torch.Tensor, sequence_ids: torch.Tensor | None) -> torch.Tensor:
    """[B, T]: for each token, the mean of ``values`` [B, T] over the masked tokens of its sequence (0 for a
    sequence with no masked token); arguments as :func:`sequence_sums`."""
    sums, counts = sequence_sums(values, mask, sequence_ids)
    return sums / counts.clamp(min=1.0)


def sequence_level_ratio(log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                         sequence_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO's ratio (module docstring): ``log s_i = mean_t log u_t`` and the sequence-mean advantage.

    Args:
        log_ratio: [B, T] ``log pi_theta - log pi_prox`` (0 off the mask), with grad.
        advantages: [B, T] (detached). mask, sequence_ids: as :func:`sequence_sums`.
    Returns:
        ``(log_s, adv)``: [B, T] each, every token of a sequence carrying its sequence's value (0 off the mask).
    """
    zero = torch.zeros_like(log_ratio)
    log_s = torch.where(mask, sequence_mean(log_ratio, mask, sequence_ids), zero)
    adv = torch.where(mask, sequence_mean(advantages, mask, sequence_ids), torch.zeros_like(advantages))
    return log_s, adv


def dual_clip(pg_loss: torch.Tensor, advantages: torch.Tensor, c_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Dual-clip PPO (module docstring): ``min(pg_loss, c * |A|)``, which binds only where A < 0.

    Args:
        pg_loss: [B, T] the clipped PPO loss ``max(-A u, -A clip(u))``. advantages: [B, T]. c_clip: > 1.
    Returns:
        ``(loss, bound)``: [B, T] the bounded loss and a bool mask of the tokens the bound changed.
    """
    cap = c_clip * advantages.abs()
    return torch.minimum(pg_loss, cap), (pg_loss.detach() > cap) & (advantages < 0)


def cispo_loss_terms(logprobs: torch.Tensor, clipped_ratio: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """CISPO's per-token loss (module docstring): ``-sg(clip(u)) * A * log pi_theta``.

    Its gradient is ``-clip(u) * A * grad log pi_theta``: at u = 1 (theta = theta_prox) that is the PPO gradient, and
    a token whose u left the clip range still gets a gradient (PPO's is 0 there), with a bounded weight.

    Args:
        logprobs: [B, T] log pi_theta (with grad). clipped_ratio: [B, T] ``clip(u, 1 - eps_low, 1 + eps_high)``
            (detached here). advantages: [B, T].
    Returns:
        [B, T] per-token loss (mask it before aggregating).
    """
    return -clipped_ratio.detach() * advantages * logprobs


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, n_tokens_global: float,
              n_sequences_global: float | None = None, norm_tokens: float | None = None,
              sequence_ids: torch.Tensor | None = None) -> torch.Tensor:
    """A micro-batch's share of the minibatch loss, so that summing over micro-batches (and data-parallel ranks)
    gives the mode's loss over the minibatch (module docstring: sources, and how dead groups count).

    ``token-mean``: ``sum_it l_it / N_tokens``; ``seq-mean-token-mean``: ``sum_i (sum_t l_it / |y_i|) / N_seqs``;
    ``seq-mean-token-sum-norm``: ``sum_it l_it / (N_seqs * norm_tokens)``.

    Args:
        per_token: [B, T] loss per token (0 off the mask). mask: [B, T] bool.
        n_tokens_global: loss tokens of the minibatch (> 0).
        n_sequences_global: sequences with a loss token in the minibatch (the seq-* modes).
        norm_tokens: Dr.GRPO's constant (rollout.max_new_tokens), for seq-mean-token-sum-norm.
        sequence_ids: [B, T] for packed rows (:func:`sequence_sums`).
    Returns:
        scalar tensor.
    Raises:
        ValueError: unknown mode, or a count the mode needs missing or <= 0.
    """
    if mode == "token-mean":
        return per_token.sum() / float(n_tokens_global)
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES)}, got {mode!r}")
    if not n_sequences_global or n_sequences_global <= 0:
        raise ValueError(f"{mode} needs n_sequences_global > 0, got {n_sequences_global}")
    if mode == "seq-mean-token-mean":
        _, counts = sequence_sums(torch.ones_like(per_token.detach()), mask, sequence_ids)
        return (per_token / counts.clamp(min=1.0)).sum() / float(n_sequences_global)
    if not norm_tokens or norm_tokens <= 0:
        raise ValueError(f"seq-mean-token-sum-norm needs norm_tokens > 0, got {norm_tokens}")
    return per_token.sum() / (float(n_sequences_global) * float(norm_tokens))

"""KL to a frozen reference policy (``ppo.kl_ctl``, ``ppo.kl_estimator``, ``ppo.kl_in``; AReaL's key names).

The reference pi_ref is the run's initial policy (the weights after the warm start, before the first RL step),
frozen. Its logprobs are computed by the trainer's own forward (:meth:`MegatronEngine.logprobs`, at
``rollout.temperature``) with the reference parameters swapped in for the duration of a no-grad forward
(:func:`reference_logprobs`): one extra copy of the parameters, no optimiser state, no second engine.

Estimators of KL(pi_theta || pi_ref) from tokens sampled by the policy (Schulman, "Approximating KL Divergence",
2020, http://joschu.net/blog/kl-approx.html: x ~ q, r = p(x) / q(x), estimators of KL[q, p]), here q = pi_theta,
p = pi_ref, so ``log r = log pi_ref - log pi_theta``:

* ``k1 = -log r = log pi_theta - log pi_ref`` (unbiased, high variance, can be negative);
* ``k2 = (log r)^2 / 2`` (biased, low variance, >= 0);
* ``k3 = (r - 1) - log r`` (unbiased, low variance, >= 0).

The sign convention is verl's ``verl/trainer/ppo/core_algos.py:kl_penalty_forward(logprob, ref_logprob)``:
``k1``/``kl`` = ``logprob - ref_logprob``, ``k2``/``mse`` = ``0.5 * (logprob - ref_logprob)^2``, ``k3``/``low_var_kl``
= ``exp(ref - logprob) - (ref - logprob) - 1`` with ``ref - logprob`` clamped to [-20, 20] and the result to
[-10, 10] (kept here, for k3 only); AReaL's ``KLEstimator(kl_estimator)`` computes the same three.

Where the KL goes (``ppo.kl_in``):

* ``reward`` (AReaL ``PPOActor.compute_advantages``; verl ``algorithm.use_kl_in_reward``): each loss token gets the
  reward ``-kl_ctl * k(pi_prox, pi_ref)`` (pi_prox: the policy before this step, detached), and with no critic and
  discount 1 (AReaL's GAE with gamma = lambda = 1, values 0) token t's advantage gains the sum of those rewards
  over its sequence's loss tokens s >= t (:func:`kl_reward_to_go`), added to the sample-level advantage; with
  ``ppo.discount * ppo.gae_lambda`` < 1 (GAE with values 0) each reward discounted by that factor per token.
* ``loss`` (verl ``actor.use_kl_loss`` / ``kl_loss_coef`` / ``kl_loss_type``): ``kl_ctl * k(pi_theta, pi_ref)``
  per loss token, aggregated as the policy loss (``ppo.loss_agg_mode``), not weighted by the behaviour weight
  (as verl), and added to the loss (:func:`kl_loss`).

``kl_mean`` in metrics.jsonl: the mean of ``k(pi_prox, pi_ref)`` over the step's loss tokens (0 at the first step,
where pi_prox = pi_ref). The tokens are the behaviour policy's samples, not pi_prox's, so k1's mean can be
negative (with eta > 0 they may come from pi_ref itself: E_pi_ref[k1] = -KL(pi_ref || pi_prox)); k2 and k3 are >= 0.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from areal_cli.trainer.advantages import gae_advantages
from areal_cli.trainer.loss_terms import aggregate

KL_ESTIMATORS = ("k1", "k2", "k3")
KL_PLACES = ("reward", "loss")


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) (module docstring: Schulman 2020, verl's sign convention).

    Args:
        logprobs: [B, T] log pi_theta of the sampled tokens (with or without grad).
        ref_logprobs: [B, T] log pi_ref of the same tokens (detached here).
        estimator: ``k1``, ``k2`` or ``k3``.
    Returns:
        [B, T] in ``logprobs``' dtype (not masked).
    Raises:
        ValueError: an unknown estimator.
    """
    log_ratio = logprobs - ref_logprobs.detach()  # = -log r, r = pi_ref / pi_theta
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        log_r = (-log_ratio).clamp(-20.0, 20.0)
        return (log_r.exp() - 1.0 - log_r).clamp(-10.0, 10.0)
    raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}, got {estimator!r}")


def kl_reward_to_go(old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, kl_ctl: float,
                    estimator: str, sequence_ids: torch.Tensor | None = None, discount: float = 1.0) -> torch.Tensor:
    """The advantage shaping of ``ppo.kl_in: reward``: ``sum_{s >= t, s in seq(t)} discount^n(t,s) * -kl_ctl * k_s``
    per loss token, ``n(t, s)`` the loss tokens from t to s (GAE with values 0, as AReaL without a critic: discount =
    ``ppo.discount * ppo.gae_lambda``; tokens off the mask are skipped, as in
    :func:`~areal_cli.trainer.advantages.gae_advantages`).

    Args:
        old_logprobs: [B, T] log pi_prox (the policy before the update; detached).
        ref_logprobs: [B, T] log pi_ref. mask: [B, T] bool, loss tokens.
        kl_ctl: the coefficient (>= 0). estimator: as :func:`kl_estimate`.
        sequence_ids: [B, T] sequence of each token in its row (packed rows: contiguous segments 0, 1, ..., -1 on
            padding); None: one sequence per row.
        discount: in [0, 1]; 1: the plain return-to-go.
    Returns:
        [B, T] float, 0 off the mask: the (discounted) return-to-go of the per-token KL rewards within the sequence.
    """
    m = mask.to(torch.bool)
    r = torch.where(m, -float(kl_ctl) * kl_estimate(old_logprobs.detach(), ref_logprobs, estimator),
                    torch.zeros_like(old_logprobs))
    if discount != 1.0:  # GAE with values 0 and lambda 1: the discounted return-to-go, within each sequence
        return gae_advantages(r, torch.zeros_like(r), m, float(discount), 1.0, sequence_ids)[0]
    rev = r.flip(1).cumsum(1).flip(1)  # sum over the row's tokens s >= t
    if sequence_ids is None:
        return torch.where(m, rev, torch.zeros_like(rev))
    # subtract what later segments of the row contribute: row total - (sum over segments <= seg(t))
    seg = sequence_ids.clamp(min=0).long()
    n_seg = int(seg.max()) + 1 if seg.numel() else 1
    per_seg = torch.zeros(r.shape[0], n_seg, dtype=r.dtype, device=r.device).scatter_add_(1, seg, r)
    after = r.sum(1, keepdim=True) - per_seg.cumsum(1).gather(1, seg)
    return torch.where(m, rev - after, torch.zeros_like(rev))


def kl_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, kl_ctl: float, estimator: str,
            loss_agg_mode: str, n_tokens_global: float, n_sequences_global: float | None = None,
            norm_tokens: float | None = None, sequence_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The loss term of ``ppo.kl_in: loss``: ``kl_ctl * agg(k(pi_theta, pi_ref))`` (verl ``use_kl_loss``).

    Args:
        logprobs: [B, T] log pi_theta (with grad). ref_logprobs: [B, T] log pi_ref. mask: [B, T] bool.
        kl_ctl, estimator: as :func:`kl_reward_to_go`.
        loss_agg_mode, n_tokens_global, n_sequences_global, norm_tokens, sequence_ids: as
            :func:`~areal_cli.trainer.loss_terms.aggregate` (the micro-batch's share of the minibatch's term).
    Returns:
        scalar tensor, differentiable in ``logprobs``.
    """
    m = mask.to(torch.bool)
    per_token = torch.where(m, float(kl_ctl) * kl_estimate(logprobs, ref_logprobs, estimator),
                            torch.zeros_like(logprobs))
    return aggregate(per_token, m, loss_agg_mode, n_tokens_global, n_sequences_global, norm_tokens, sequence_ids)


def kl_sum(old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, estimator: str) -> float:
    """Sum over the loss tokens of ``k(pi_prox, pi_ref)`` ([B, T] tensors each; for ``kl_mean``)."""
    m = mask.to(torch.bool)
    with torch.no_grad():
        k = kl_estimate(old_logprobs.detach().double(), ref_logprobs.double(), estimator)
        return float(k[m].sum()) if m.any() else 0.0


# --------------------------------------------------------------------------------------------------
# The frozen reference on the engine
# --------------------------------------------------------------------------------------------------
def freeze_reference(engine, hf_dir: str | Path | None = None, save_to: str | Path | None = None) -> None:
    """Keep a frozen copy of the reference parameters on ``engine`` (``engine.stage_state["reference"]``). Under
    data / tensor / pipeline parallelism every rank keeps a copy of its own parameters (its shard, its stage);
    ``load_hf`` / ``save_hf`` are the engine's collective ones, so every rank calls this.

    Args:
        engine: the trainer engine (``engine.model``: torch module; ``load_hf`` / ``save_hf``).
        hf_dir: None: the current weights are the reference (a new run, after the warm start); else the reference
            is this HF directory's weights (a resumed run: :data:`REFERENCE_DIR` of the run), loaded, copied, and
            the current weights put back.
        save_to: also write the reference as an HF directory here (so that a resumed run can reload it).
    """
    params = list(engine.model.parameters())
    if hf_dir is not None:
        current = [p.detach().clone() for p in params]
        engine.load_hf(Path(hf_dir))
    ref = [p.detach().clone() for p in params]
    if save_to is not None:
        engine.save_hf(Path(save_to))
    if hf_dir is not None:
        with torch.no_grad():
            for p, c in zip(params, current):
                p.copy_(c)
    st = getattr(engine, "stage_state", None)
    if st is None:
        st = engine.stage_state = {}
    st["reference"] = ref


@contextmanager
def _reference_swapped_in(engine):
    """Swap the reference tensors into ``engine.model``'s parameters (``.data``, no copy) and back on exit."""
    ref = getattr(engine, "stage_state", {}).get("reference")
    if ref is None:
        raise RuntimeError("no reference policy on the engine (freeze_reference was not called)")
    params = list(engine.model.parameters())
    for i, p in enumerate(params):
        p.data, ref[i] = ref[i], p.data
    try:
        yield
    finally:
        for i, p in enumerate(params):
            p.data, ref[i] = ref[i], p.data


def reference_logprobs(engine, batch, temperature: float) -> torch.Tensor:
    """log pi_ref of ``batch``'s next tokens: the engine's no-grad :meth:`logprobs` with the frozen reference
    swapped in (module docstring).

    Args:
        engine: with a reference from :func:`freeze_reference`. batch: a TrainBatch [B, L]. temperature: the run's.
    Returns:
        FloatTensor[B, L-1] (nats, CPU), 0 where the target is padding.
    Raises:
        RuntimeError: no reference on the engine.
    """
    with _reference_swapped_in(engine):
        return engine.logprobs(batch, temperature=temperature)


#: Where a run with ``ppo.kl_ctl > 0`` and checkpoints keeps its reference weights (relative to the run folder).
REFERENCE_DIR = "reference"


"""PPO with a critic (``critic.enabled``; AReaL's ``critic`` block, ``areal/trainer/ppo/critic.py``).

The critic is a second megatron-core GPTModel with the policy's architecture and the run's initial weights
(AReaL and verl initialise the critic from the actor's model), its LM head replaced by :class:`ValueHead`, a
zero-initialised linear map hidden -> 1 (so every value starts at 0, GRPO's "no baseline"). It lives on the trainer
ranks beside the policy (``engine.critic``), with its own AdamW (``critic.lr``, ``critic.weight_decay``,
``critic.grad_clip``) and the policy's tensor / data parallel layout (the value head is replicated on the tensor
parallel ranks, as the hidden states it reads are).

Per training step (:func:`critic_advantages`, then the policy update, then :func:`critic_update`):

1. values ``V_t`` of the batch's loss positions under the critic before its update (position t: the state
   ``input_ids[:, :t+1]`` before token t+1 is emitted, the alignment of the logprobs);
2. the sequence's reward (shaped, and normalised by ``ppo.reward_norm_*`` when set) on its last loss token
   (:func:`~areal_cli.trainer.advantages.last_token_rewards`), GAE with ``ppo.discount`` / ``ppo.gae_lambda``
   (:func:`~areal_cli.trainer.advantages.gae_advantages`) -> advantages and returns; ``ppo.adv_norm: global``
   normalises the advantages over the batch's loss tokens (AReaL ``adv_norm: {mean_level: batch, std_level: batch}``);
3. the critic regresses the returns with the clipped value loss (:func:`value_loss`), ``critic.n_minibatches``
   optimiser steps, micro-batches as the policy's (``ppo.max_tokens_per_mb``).

Checkpoints (``loop.checkpoint_every``) hold the critic's weights and AdamW state (``critic.pt``,
:func:`critic_state` / :func:`load_critic_state`, :mod:`areal_cli.train_loop.checkpoint`), so a resumed run
continues with the same critic.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from areal_cli.trainer.batch import TrainBatch
from areal_cli.trainer.megatron_engine import MegatronEngine


class ValueHead(torch.nn.Module):
    """Stands in for GPTModel's ``output_layer``: hidden states [S, B, H] -> values [S, B, 1] (``Linear(H, 1)``,
    zero-initialised). Called as megatron calls its output layer (``weight=``, ``runtime_gather_output=`` are
    ignored) and returns ``(values, None)`` like it, so the GPTModel returns [B, S, 1]."""

    def __init__(self, hidden_size: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.linear = torch.nn.Linear(int(hidden_size), 1, dtype=dtype, device=device)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, hidden_states: Tensor, weight: Tensor | None = None, runtime_gather_output=None,
                **_: object) -> tuple[Tensor, None]:
        return self.linear(hidden_states), None


class CriticEngine(MegatronEngine):
    """A :class:`MegatronEngine` whose model ends in a :class:`ValueHead`: ``values(batch)`` where the policy
    engine has ``logprobs(batch)``, and the same ``train_step(micro_batches, loss_fn)`` with ``loss_fn(values, mb)``.

    Args:
        hf_model_dir: the HF directory of the run's initial policy (weights of the trunk).
        lr, weight_decay, grad_clip, betas, eps, seed, params_dtype, tensor_parallel: as :class:`MegatronEngine`.
    Raises:
        as :class:`MegatronEngine`; UserError for pipeline_parallel > 1 is the config's (critic.enabled).
    """

    def __init__(self, hf_model_dir: str | Path, **kwargs) -> None:
        super().__init__(hf_model_dir, **kwargs)
        p = next(self.model.parameters())
        self.model.output_layer = ValueHead(int(self.hf_config.hidden_size), p.dtype, p.device)
        g = self.optimizer.param_groups[0]  # the settings the engine was built with; the head is new
        self.optimizer = self.build_optimizer(g["lr"], g["weight_decay"], g["betas"], g["eps"])

    def _lp_from_logits(self, logits: Tensor, ids: Tensor, temperature: float) -> Tensor:
        """The value head's output [B, L, 1] -> V [B, L-1] (float32): position t is the state before token t+1."""
        return logits[:, :-1, 0].float()

    def values(self, batch: TrainBatch, n_micro: int = 1) -> Tensor:
        """V [B, L-1] (float32, CPU, no gradient) of ``batch``'s positions, 0 where the target is padding;
        collective as :meth:`MegatronEngine.logprobs` (every rank returns all rows)."""
        return self.logprobs(batch, temperature=1.0, n_micro=n_micro)


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, eps_clip: float,
               n_tokens_global: float) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped value loss (AReaL ``areal/utils/functional``: ``ppo_critic_loss_fn`` with ``loss_fn_type:
    mse``; OpenAI baselines ``ppo2``; verl ``compute_value_loss``)::

        V_clip = V_old + clip(V - V_old, -eps, eps)
        l_t    = max(0.5 (V - R)^2, 0.5 (V_clip - R)^2)        (eps = 0: l_t = 0.5 (V - R)^2)

    summed over the loss tokens and divided by the minibatch's loss tokens (token mean, as AReaL).

    Args:
        values: [B, T] V of the critic being trained (with grad). old_values: [B, T] V before the update.
        returns: [B, T] GAE returns. mask: [B, T] bool, loss tokens. eps_clip: >= 0.
        n_tokens_global: loss tokens of the minibatch (> 0).
    Returns:
        ``(loss, stats)``: scalar tensor; ``n_tokens``, ``n_clipped`` (tokens where the clipped term is the larger),
        ``sq_err_sum`` (sum of (V - R)^2 before the update's effect: of ``values``).
    """
    m = mask.to(torch.bool)
    old, ret = old_values.detach(), returns.detach()
    plain = 0.5 * (values - ret).square()
    if eps_clip > 0:
        clipped_v = old + (values - old).clamp(-eps_clip, eps_clip)
        clipped = 0.5 * (clipped_v - ret).square()
        per_token = torch.maximum(plain, clipped)
        n_clipped = float((m & (clipped.detach() > plain.detach())).sum())
    else:
        per_token, n_clipped = plain, 0.0
    loss = torch.where(m, per_token, torch.zeros_like(per_token)).sum() / float(n_tokens_global)
    with torch.no_grad():
        stats = {"n_tokens": float(m.sum()), "n_clipped": n_clipped,
                 "sq_err_sum": float((2 * plain.detach())[m].sum()) if m.any() else 0.0}
    return loss, stats


# --------------------------------------------------------------------------------------------------
# Trainer calls (``areal_cli.trainer.critic:...`` through the trainer group)
# --------------------------------------------------------------------------------------------------
def attach_critic(engine, *, lr: float, weight_decay: float, grad_clip: float, seed: int,
                  state_file: str | Path | None = None) -> None:
    """Build the critic on this rank as ``engine.critic`` (module docstring), from ``engine.model_dir`` with the
    engine's tensor parallel size; the process's RNG states are kept (building seeds torch and Megatron). With
    ``state_file`` (a checkpoint's ``critic.pt``) its weights and AdamW state are loaded."""
    from megatron.core import tensor_parallel

    p = next(engine.model.parameters())
    rng = torch.get_rng_state()
    try:
        tracker = tensor_parallel.get_cuda_rng_tracker().get_states()
    except Exception:  # noqa: BLE001 - tracker not initialised
        tracker = None
    kwargs = {"tensor_parallel": engine.tp} if getattr(engine, "tp", 1) > 1 else {}
    try:
        engine.critic = CriticEngine(engine.model_dir, lr=lr, weight_decay=weight_decay, grad_clip=grad_clip,
                                     seed=seed, params_dtype=p.dtype, device=p.device, **kwargs)
    finally:
        torch.set_rng_state(rng)
        if tracker is not None:
            tensor_parallel.get_cuda_rng_tracker().set_states(tracker)
    if state_file is not None:
        load_critic_state(engine, torch.load(Path(state_file), map_location="cpu", weights_only=True))


def critic_state(engine) -> dict:
    """``{"model": state_dict, "optimizer": AdamW state_dict, "steps": int}`` of ``engine.critic`` (CPU tensors)."""
    c = engine.critic
    model = {k: v.detach().cpu().clone() for k, v in c.model.state_dict().items() if "_extra_state" not in k}
    return {"model": model, "optimizer": c.optimizer.state_dict(), "steps": int(c.steps)}


def load_critic_state(engine, state: dict) -> None:
    """Load :func:`critic_state`'s dict into ``engine.critic``."""
    c = engine.critic
    c.model.load_state_dict(state["model"], strict=False)
    c.optimizer.load_state_dict(state["optimizer"])
    c.steps = int(state.get("steps", 0))


def critic_advantages(engine, batch: TrainBatch, seq_rewards: Tensor, cfg) -> dict[str, float]:
    """Steps 1-2 of the module docstring: set ``batch.values``, ``batch.returns`` and ``batch.advantages``.

    Args:
        engine: with ``engine.critic`` (:func:`attach_critic`). batch: one sequence per row, right-padded.
        seq_rewards: [B] (:func:`~areal_cli.trainer.advantages.sequence_rewards`). cfg: the run's config (``ppo.discount``, ``ppo.gae_lambda``,
            ``ppo.adv_norm``, ``ppo.max_tokens_per_mb``).
    Returns:
        ``value_mean`` and ``return_mean`` over the loss tokens, and ``explained_variance`` =
        1 - Var(R - V) / Var(R) of the values before the update (1: perfect, 0: no better than a constant).
    """
    from areal_cli.trainer.advantages import gae_advantages, global_normalized_token_advantages, last_token_rewards

    p = cfg.ppo
    budget = int(p.max_tokens_per_mb or 0)
    n_micro = 1 if not budget else max(1, min(batch.batch_size, -(-int(batch.attention_mask.sum()) // budget)))
    mask = batch.loss_mask
    values = engine.critic.values(batch, n_micro=n_micro) * mask
    adv, ret = gae_advantages(last_token_rewards(seq_rewards, mask), values, mask, p.discount, p.gae_lambda)
    if p.adv_norm == "global":
        adv = global_normalized_token_advantages(adv, mask)
    batch.values, batch.returns, batch.advantages = values.float(), ret, adv
    m = mask.bool()
    v, r = values[m].double(), ret[m].double()
    var_r = float(r.var(unbiased=False)) if r.numel() else 0.0
    return {"value_mean": float(v.mean()) if v.numel() else 0.0, "return_mean": float(r.mean()) if r.numel() else 0.0,
            "explained_variance": 1.0 - float((r - v).var(unbiased=False)) / var_r if var_r > 1e-12 else 0.0}


def critic_update(engine, batch: TrainBatch, cfg) -> dict[str, float]:
    """Step 3 of the module docstring: ``critic.n_minibatches`` optimiser steps of :func:`value_loss` on ``batch``
    (with ``values`` and ``returns`` from :func:`critic_advantages`), micro-batches of ``ppo.max_tokens_per_mb``.

    Returns:
        ``value_loss`` (the last minibatch's), ``critic_grad_norm``, ``value_clip_frac`` (share of loss tokens whose
        clipped term was the larger) and ``value_mse`` ((V - R)^2 over the step's tokens, as trained).
    """
    from areal_cli.trainer.collectives import sum_over_data_parallel
    from areal_cli.trainer.micro_batches import split_by_tokens

    c, budget, eps = engine.critic, int(cfg.ppo.max_tokens_per_mb or 0), float(cfg.critic.eps_clip)
    totals = {"n_tokens": 0.0, "n_clipped": 0.0, "sq_err_sum": 0.0}
    out: dict[str, float] = {}
    for mb in batch.split(cfg.critic.n_minibatches):
        micro = split_by_tokens(mb, budget, pack=True) if budget else [mb]
        n_valid = max(mb.n_loss_tokens, 1)

        def loss_fn(v: Tensor, m: TrainBatch) -> Tensor:
            loss, st = value_loss(v, m.values, m.returns, m.loss_mask.bool(), eps, n_valid)
            for k in totals:
                totals[k] += st[k]
            return loss

        out = c.train_step(micro, loss_fn)
    sum_over_data_parallel(totals)
    n = max(totals["n_tokens"], 1.0)
    return {"value_loss": out["loss"], "critic_grad_norm": out["grad_norm"],
            "value_clip_frac": totals["n_clipped"] / n, "value_mse": totals["sq_err_sum"] / n}

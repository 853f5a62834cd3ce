"""Trainer-side step functions of ``areal train``: what the loop asks the trainer to do, by name, through the
trainer group (:mod:`areal_cli.trainer.group`: ``await trainer.call("areal_cli.trainer.steps:ppo_update",
...)``). Each runs on every trainer rank with the same arguments, ``function(engine, *args)``.

- RL: :func:`train_on_groups` = :func:`make_train_batch` (advantages, reward shaping) + :func:`ppo_update`
  (proximal logprobs, decoupled PPO per minibatch, micro-batches by token budget).
- Warm start: :func:`sft_begin` / :func:`sft_step` / :func:`keep_weights` / :func:`sft_end`; their state (the
  SFT stage, the rollback copy of the weights) lives on the engine (``engine.stage_state``), so it is
  per-engine and goes away with it.
"""

from __future__ import annotations

import time

import torch

from areal_cli.api.types import Group
from areal_cli.trainer.advantages import (
    broadcast_to_tokens,
    gae_advantages,
    global_normalized_token_advantages,
    group_normalized_advantages,
    last_token_rewards,
    overlong_penalty,
    reward_norm_advantages,
    sequence_rewards,
    zero_std_group_fraction,
)
from areal_cli.trainer.batch import TrainBatch, build_train_batch
from areal_cli.trainer.decoupled_ppo import DecoupledPPOConfig, decoupled_ppo_loss
from areal_cli.trainer.kl import kl_loss, kl_reward_to_go, kl_sum, reference_logprobs
from areal_cli.trainer.loss_terms import aggregate


def _state(engine) -> dict:
    """The engine's dict for multi-call stages (created on first use)."""
    st = getattr(engine, "stage_state", None)
    if st is None:
        st = engine.stage_state = {}
    return st


# --------------------------------------------------------------------------------------------------
# Warm start (SFT stage)
# --------------------------------------------------------------------------------------------------
def sft_begin(engine, examples: list, sft_cfg, pad_id: int) -> None:
    """Create the warm start's :class:`~areal_cli.sft.stage.SftStage` on ``engine``."""
    from areal_cli.sft.stage import SftStage

    _state(engine)["sft"] = SftStage(engine, examples, sft_cfg, pad_id=pad_id)


def sft_step(engine) -> dict[str, float]:
    """One SFT optimiser step of the stage made by :func:`sft_begin`."""
    return _state(engine)["sft"].step()


def keep_weights(engine) -> None:
    """Keep a copy of this rank's weights (the warm start's rollback point)."""
    _state(engine)["kept"] = {k: v.clone() for k, v in engine.model.state_dict().items() if "_extra_state" not in k}


def sft_end(engine, rollback: bool) -> None:
    """End the warm start: with ``rollback``, load the weights kept by :func:`keep_weights`; drop the stage."""
    st = _state(engine)
    kept = st.pop("kept", None)
    st.pop("sft", None)
    if rollback and kept is not None:
        engine.model.load_state_dict(kept, strict=False)


# --------------------------------------------------------------------------------------------------
# RL step
# --------------------------------------------------------------------------------------------------
def shaped_rewards(raw: torch.Tensor, cfg) -> torch.Tensor:
    """``clip((r + reward_bias) * reward_scaling, -max_reward_clip, max_reward_clip)`` (AReaL
    ``areal/trainer/ppo/actor.py``; realhf's ``((s - 0.5) * 2 - b) * c`` is bias ``-0.5 - b/2``, scaling ``2c``).
    ``max_reward_clip <= 0`` disables the clip. FloatTensor of ``raw``'s shape."""
    r = (raw + float(cfg.ppo.reward_bias)) * float(cfg.ppo.reward_scaling)
    if cfg.ppo.max_reward_clip > 0:
        r = r.clamp(-float(cfg.ppo.max_reward_clip), float(cfg.ppo.max_reward_clip))
    return r


#: Version label of a token whose prefix's KV cache was computed by older weights than the token itself (an
#: in-place weight update happened while its sample was generating): not comparable with any trainer version.
MIXED_KV_VERSION = -2


def kv_versions(versions: list[int]) -> list[int]:
    """Per-token versions for ``rollout.pause_mode: in_place`` runs, where a weight update leaves the KV cache
    of in-flight samples as the old weights computed it: a generated token keeps its version only when every
    generated token before it has the same one (then the prompt's KV, prefilled with the sample's first
    token, and the whole prefix came from those weights); later tokens get :data:`MIXED_KV_VERSION`, so the
    engine-vs-trainer mismatch (:func:`off_policy_diagnostics`) compares only tokens the trainer can reproduce.
    Entries < 0 (not generated: environment / template tokens) are kept. The trainer uses ``versions`` for
    nothing else. Conservative for multi-turn samples (each turn is re-prefilled, yet only the first
    version's tokens count)."""
    first = next((v for v in versions if v >= 0), None)
    return [v if v < 0 or v == first else MIXED_KV_VERSION for v in versions]


def reward_norm_levels(ppo) -> tuple[str, str, bool] | None:
    """The sample-level advantage rule ``(mean_level, std_level, leave1out)`` of the ``ppo`` settings, or None for
    ``ppo.adv_norm: global`` (token-level normalisation over the batch). ``ppo.reward_norm_*`` left "" follow
    ``ppo.adv_norm: group`` (group mean and std: GRPO)."""
    if ppo.adv_norm == "global":
        return None
    return ppo.reward_norm_mean_level or "group", ppo.reward_norm_std_level or "group", ppo.reward_norm_mean_leave1out


def make_train_batch(groups: list[Group], cfg, pad_id: int) -> TrainBatch:
    """Pack groups into a right-padded TrainBatch with per-token advantages (:func:`_batch_and_rewards`)."""
    return _batch_and_rewards(groups, cfg, pad_id)[0]


def _batch_and_rewards(groups: list[Group], cfg, pad_id: int) -> tuple[TrainBatch, torch.Tensor, torch.Tensor]:
    """Pack groups into a right-padded TrainBatch with per-token advantages; also the shaped rewards [N] and the
    group of each sample [N].

    Advantages: group normalisation (GRPO) of the shaped rewards (:func:`shaped_rewards`), or rewards
    broadcast to tokens and normalised over all valid tokens of the batch (``ppo.adv_norm = global``), or the
    ``ppo.reward_norm_*`` rule (:func:`reward_norm_levels`, :func:`~areal_cli.trainer.advantages.reward_norm_advantages`:
    Dr.GRPO, RLOO, LitePPO). With ``ppo.discount`` or ``ppo.gae_lambda`` < 1 and no critic, GAE with values 0 (as
    AReaL without a critic): the :func:`~areal_cli.trainer.advantages.sequence_rewards` on each sequence's last
    loss token, discounted back by (gamma lambda)^k, then ``ppo.adv_norm: global``'s batch normalisation. With
    ``ppo.overlong_reward_penalty`` DAPO's length penalty is added to the raw
    rewards first (:func:`~areal_cli.trainer.advantages.overlong_penalty`, AReaL's order: before bias and scaling).
    Groups may differ in size (a workflow decides how many samples an episode has); group normalisation
    is then per group. A sample's own ``loss_mask`` (the concatenated multi-turn / agent layout) is written
    into the batch, so its environment and template tokens get loss mask 0 and advantage 0. With
    ``rollout.pause_mode: in_place`` the batch's versions are :func:`kv_versions`.
    """
    samples = [s for g in groups for s in g.samples]
    in_place = cfg.rollout.pause_mode == "in_place"
    batch = build_train_batch(
        [(s.prompt_ids, s.output_ids, s.behaviour_logprobs, kv_versions(s.versions) if in_place else s.versions,
          getattr(s, "loss_mask", None)) for s in samples], pad_id=pad_id
    )
    sizes = {len(g.samples) for g in groups}
    p = cfg.ppo
    group_ids = torch.tensor([i for i, g in enumerate(groups) for _ in g.samples], dtype=torch.long)
    raw = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    if p.overlong_reward_penalty:
        tail = p.overlong_tokens or max(1, cfg.rollout.max_new_tokens // 5)
        raw = raw + overlong_penalty(batch.loss_mask.sum(dim=1), cfg.rollout.max_new_tokens, tail,
                                     p.overlong_penalty_factor)
    shaped = shaped_rewards(raw, cfg)
    levels = reward_norm_levels(p)
    if (p.discount, p.gae_lambda) != (1.0, 1.0) and not cfg.critic.enabled:  # GAE with values 0 (AReaL, no critic)
        adv, _ = gae_advantages(last_token_rewards(sequence_rewards(shaped, group_ids, p), batch.loss_mask),
                                torch.zeros_like(batch.loss_mask), batch.loss_mask, p.discount, p.gae_lambda)
        batch.advantages = global_normalized_token_advantages(adv, batch.loss_mask) if p.adv_norm == "global" else adv
    elif levels is not None and levels != ("group", "group", False):
        batch.advantages = broadcast_to_tokens(reward_norm_advantages(shaped, group_ids, *levels), batch.loss_mask)
    elif levels is not None:  # GRPO: today's group normalisation
        if len(sizes) == 1:
            adv = group_normalized_advantages(shaped.view(len(groups), -1)).flatten()
        else:
            adv = torch.cat([group_normalized_advantages(shaped[group_ids == i][None]).flatten()
                             for i in range(len(groups))])
        batch.advantages = broadcast_to_tokens(adv, batch.loss_mask)
    else:
        batch.advantages = global_normalized_token_advantages(broadcast_to_tokens(shaped, batch.loss_mask),
                                                              batch.loss_mask)
    return batch, shaped, group_ids


def train_on_groups(engine, groups: list[Group], cfg, pad_id: int, trainer_version: int | None = None) -> dict:
    """One RL training step in the trainer: :func:`make_train_batch` then :func:`ppo_update`. Returns
    ppo_update's stats plus ``tokens`` (prompt + response tokens of the batch), ``response_tokens`` and
    ``batch_s`` (seconds building the batch). ``trainer_version``: the policy version the trainer's weights
    hold (for the engine-vs-trainer mismatch of :func:`off_policy_diagnostics`). ``zero_std_group_frac``: the share
    of groups whose shaped rewards all agree ("dead" groups, :mod:`areal_cli.trainer.loss_terms` for how they
    count in the loss), a metric of every step. With ``critic.enabled`` the advantages come from GAE over the
    critic's values and the critic is trained after the policy (:mod:`areal_cli.trainer.critic`: ``value_mean``,
    ``return_mean``, ``explained_variance``, ``value_loss``, ``critic_grad_norm``, ``value_clip_frac``,
    ``value_mse``)."""
    t0 = time.monotonic()
    batch, rewards, group_ids = _batch_and_rewards(groups, cfg, pad_id)
    batch_s = time.monotonic() - t0
    critic: dict = {}
    if cfg.critic.enabled:  # advantages from GAE over the critic's values (areal_cli.trainer.critic)
        from areal_cli.trainer.critic import critic_advantages, critic_update

        critic = critic_advantages(engine, batch, sequence_rewards(rewards, group_ids, cfg.ppo), cfg)
    stats = ppo_update(engine, batch, cfg, trainer_version=trainer_version)
    if cfg.critic.enabled:
        critic.update(critic_update(engine, batch, cfg))
    return {**stats, **critic, "tokens": float(batch.attention_mask.sum()), "response_tokens": float(batch.loss_mask.sum()),
            "batch_s": batch_s, "zero_std_group_frac": zero_std_group_fraction(rewards, group_ids)}


#: Engine-vs-trainer logprob mismatch above this, in float32, is a bug (the same weights must give the same
#: logprobs up to float summation order; measured here ~1e-6, tests/test_server_trainer_agreement.py).
MISMATCH_FLAG_NATS = 1e-4


def off_policy_diagnostics(batches: list[TrainBatch], trainer_version: int | None, recomputed: bool,
                           float32: bool) -> dict:
    """How far the batch is from on-policy, before the update (AReaL 2.0 and verl log the same quantities).

    Args:
        batches: the micro-batches (or the one batch) with ``proximal_logprobs`` set; [B, T] tensors each.
        trainer_version: the policy version of the trainer's weights, or None (mismatch not measured).
        recomputed: proximal logprobs were recomputed by the trainer (else they are the behaviour ones, and
            there is nothing to compare).
        float32: the trainer computes in float32 (the mismatch flag applies only then).
    Returns:
        ``iw_mean``, ``iw_p50``, ``iw_p90``, ``iw_p99``, ``iw_min``, ``iw_max``: mean and quantiles of the raw
        behaviour weight w = pi_prox / pi_behav over loss tokens (before any correction); ``logprob_mismatch_mean`` /
        ``logprob_mismatch_max`` (nats): mean and max |log pi_behav - log pi_prox| over the tokens generated by
        ``trainer_version`` itself (engine vs trainer numerics on the same weights), with
        ``logprob_mismatch_tokens`` their count and ``logprob_mismatch_flagged`` True when the max exceeds
        :data:`MISMATCH_FLAG_NATS` in float32; the mismatch values are None when not measurable.
    """
    log_w, diff = [], []
    for b in batches:
        mask = b.loss_mask.bool()
        lw = (b.proximal_logprobs - b.behaviour_logprobs)[mask]
        log_w.append(lw.double())
        if trainer_version is not None:
            own = mask & (b.versions == trainer_version)
            diff.append((b.proximal_logprobs - b.behaviour_logprobs)[own].abs().double())
    lw = torch.cat(log_w) if log_w else torch.zeros(0, dtype=torch.float64)
    out: dict = {}
    if lw.numel():
        w = lw.exp()
        q = torch.quantile(w, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64))
        out.update(iw_mean=float(w.mean()), iw_p50=float(q[0]), iw_p90=float(q[1]), iw_p99=float(q[2]),
                   iw_min=float(w.min()), iw_max=float(w.max()))
    d = torch.cat(diff) if diff else torch.zeros(0, dtype=torch.float64)
    measurable = recomputed and d.numel() > 0
    out["logprob_mismatch_tokens"] = int(d.numel()) if recomputed else 0
    out["logprob_mismatch_mean"] = float(d.mean()) if measurable else None
    out["logprob_mismatch_max"] = float(d.max()) if measurable else None
    out["logprob_mismatch_flagged"] = bool(measurable and float32 and float(d.max()) > MISMATCH_FLAG_NATS)
    return out


def proximal_source(cfg) -> str:
    """Where :func:`ppo_update` takes the proximal logprobs from: ``"behaviour"`` (``ppo.recompute_proximal:
    false``, naive PPO), ``"recompute"`` or ``"reuse"`` (``ppo.prox_logp_method``; ``auto`` = reuse when
    ``ppo.n_minibatches`` is 1, the only case where the training forward's weights are the proximal policy's)."""
    if not cfg.ppo.recompute_proximal:
        return "behaviour"
    method = cfg.ppo.prox_logp_method
    if method == "auto":
        return "reuse" if cfg.ppo.n_minibatches == 1 else "recompute"
    return method


def ppo_update(engine, batch: TrainBatch, cfg, trainer_version: int | None = None) -> dict:
    """Proximal logprobs, then one decoupled-PPO optimiser step per minibatch (runs in a thread).

    Proximal logprobs (:func:`proximal_source`): ``recompute`` runs a forward pass with the weights before the
    step; ``reuse`` takes the training forward's own logprobs, detached (AReaL's ``ppo.prox_logp_method``
    ``reuse_train_logp``): with one optimiser step per batch the weights of that forward ARE the proximal
    policy, so the loss and its gradient are the recomputed ones (tests/test_ppo_update.py) for one forward
    pass fewer. ``behaviour`` (``ppo.recompute_proximal: false``) is naive PPO.

    KL to the frozen reference (``ppo.kl_ctl > 0``, :mod:`areal_cli.trainer.kl`): reference logprobs are computed
    with the proximal ones, per (micro-)batch; ``ppo.kl_in: reward`` adds ``kl.kl_reward_to_go`` to the
    advantages, ``loss`` adds ``kl.kl_loss`` to the loss; the stats then hold ``kl_mean`` (mean of the estimator
    of pi_prox vs pi_ref over the step's loss tokens). With kl_ctl 0 none of this runs.

    Entropy bonus (``ppo.entropy_coeff > 0``): the engine also returns the entropy H of the whole-vocabulary
    distribution at each position (``train_step(..., entropy=True)``, at rollout.temperature), and the loss gets
    ``- entropy_coeff * agg(H)`` aggregated as the policy loss (``ppo.loss_agg_mode``; verl ``entropy_coeff``, not
    weighted by the behaviour weight); the stats then hold ``entropy_mean`` (token mean over the step).

    Minibatches: ``ppo.n_minibatches`` contiguous row splits. With ``max_tokens_per_mb > 0`` each minibatch is
    split into micro-batches of at most that many tokens and packed (:func:`~areal_cli.trainer.micro_batches.
    split_by_tokens`; right-padded instead under pipeline parallelism); proximal logprobs are recomputed per
    micro-batch with the weights from before the step, and gradients accumulate over the micro-batches of a
    minibatch; packed, a micro-batch is further split into width classes (``ppo.pack_width_classes``,
    :func:`~areal_cli.trainer.micro_batches.width_classes`). The loss of each micro-batch is normalised by the
    minibatch's number of loss tokens, so the step equals the unsplit one up to float summation order
    (tests/test_micro_batches.py).

    Returns loss, grad_norm, clip_frac, iw_capped_frac (loss tokens the off-policy correction masked out),
    iw_truncated_frac, the :func:`off_policy_diagnostics`, ``n_micro_batches`` and ``cpu_s``: CPU seconds of
    the calling thread (compared with wall time it shows whether the trainer had its core to itself).
    Raises:
        UserError: a sequence longer than ``ppo.max_tokens_per_mb``.
    """
    from areal_cli.trainer.collectives import sum_over_data_parallel
    from areal_cli.trainer.micro_batches import attention_cost, split_by_tokens

    cpu0 = time.thread_time()
    budget = int(cfg.ppo.max_tokens_per_mb or 0)
    source = proximal_source(cfg)
    kl_on = cfg.ppo.kl_ctl > 0

    def proximal(b: TrainBatch) -> None:
        if source == "recompute":
            b.proximal_logprobs = engine.logprobs(b, temperature=cfg.rollout.temperature) * b.loss_mask
        elif source == "behaviour":
            b.proximal_logprobs = b.behaviour_logprobs.clone()
        # reuse: set by loss_fn from the training forward
        if kl_on:
            b.ref_logprobs = reference_logprobs(engine, b, cfg.rollout.temperature) * b.loss_mask

    if budget:
        minibatches = batch.split(cfg.ppo.n_minibatches)
        pack = getattr(engine, "pp", 1) == 1
        hf_config = getattr(engine, "hf_config", None)
        classes = pack and cfg.ppo.pack_width_classes and hf_config is not None
        cost = attention_cost(hf_config) if classes else 0.0
        plan = [(mb, split_by_tokens(mb, budget, pack=pack, attention_cost=cost)) for mb in minibatches]
        for _, micro in plan:  # all proximal logprobs before the first update
            for m in micro:
                proximal(m)
        diagnosed = [m for _, micro in plan for m in micro]
    else:
        proximal(batch)
        plan = [(mb, [mb]) for mb in batch.split(cfg.ppo.n_minibatches)]
        diagnosed = [batch]
    try:
        params = next(iter(engine.model.parameters()), None)
    except (AttributeError, TypeError):  # an engine without one torch module (test doubles)
        params = None
    float32 = params is None or params.dtype == torch.float32
    if source != "reuse":
        diagnostics = off_policy_diagnostics(diagnosed, trainer_version, source == "recompute", float32)
    seen: list[TrainBatch] = []  # reuse: the (micro-)batches loss_fn saw, with their proximal logprobs
    p = cfg.ppo
    loss_cfg = DecoupledPPOConfig(p.eps_clip, p.behav_imp_weight_cap, p.behav_imp_weight_mode,
                                  p.behav_imp_weight_lower or None, eps_clip_higher=p.eps_clip_higher,
                                  c_clip=p.c_clip, importance_sampling_level=p.importance_sampling_level,
                                  loss_fn=p.loss_fn, loss_agg_mode=p.loss_agg_mode,
                                  loss_agg_norm_tokens=cfg.rollout.max_new_tokens)
    totals: dict[str, float] = {"n_tokens": 0.0, "n_clipped": 0.0, "n_dual_clipped": 0.0, "n_iw_capped": 0.0,
                                "n_iw_truncated": 0.0}
    if kl_on:
        totals["kl_sum"] = 0.0
    ent_on = p.entropy_coeff > 0
    if ent_on:
        totals["entropy_sum"] = 0.0
    out: dict[str, float] = {}
    for mb, micro in plan:
        n_valid = max(mb.n_loss_tokens, 1)
        n_seqs = max(int((mb.loss_mask.sum(dim=1) > 0).sum()), 1)  # rows of a minibatch are its sequences

        def loss_fn(lp: torch.Tensor, m: TrainBatch, entropy: torch.Tensor | None = None) -> torch.Tensor:
            if source == "reuse":
                m.proximal_logprobs = lp.detach() * m.loss_mask
                seen.append(m)
            seq_ids = m.segment_ids[:, 1:] if m.segment_ids is not None else None
            adv = m.advantages
            if kl_on:
                mask = m.loss_mask.bool()
                st_kl = kl_sum(m.proximal_logprobs, m.ref_logprobs, mask, p.kl_estimator)
                if p.kl_in == "reward":
                    adv = adv + kl_reward_to_go(m.proximal_logprobs, m.ref_logprobs, mask, p.kl_ctl, p.kl_estimator,
                                                seq_ids, p.discount * p.gae_lambda).to(adv.dtype)
            loss, st = decoupled_ppo_loss(lp, m.proximal_logprobs, m.behaviour_logprobs, adv,
                                          m.loss_mask, n_valid, loss_cfg, sequence_ids=seq_ids,
                                          n_sequences_global=n_seqs)
            if kl_on:
                st["kl_sum"] = st_kl
                if p.kl_in == "loss":
                    loss = loss + kl_loss(lp, m.ref_logprobs, mask, p.kl_ctl, p.kl_estimator, p.loss_agg_mode,
                                          n_valid, n_seqs, cfg.rollout.max_new_tokens, seq_ids)
            if ent_on:  # the entropy bonus: - coeff * agg(H) (verl's entropy_coeff)
                ent = torch.where(m.loss_mask.bool(), entropy, torch.zeros_like(entropy))
                st["entropy_sum"] = float(ent.detach().sum())
                loss = loss - p.entropy_coeff * aggregate(ent, m.loss_mask.bool(), p.loss_agg_mode, n_valid, n_seqs,
                                                          cfg.rollout.max_new_tokens, seq_ids)
            for k in totals:
                totals[k] += st[k]
            return loss

        extra = {"entropy": True} if ent_on else {}
        out = engine.train_step(micro, loss_fn, temperature=cfg.rollout.temperature, **extra)
    if source == "reuse":  # (under data parallelism: this rank's rows)
        diagnostics = off_policy_diagnostics(seen, trainer_version, True, float32)
    sum_over_data_parallel(totals)
    n = max(totals["n_tokens"], 1.0)
    kl = {"kl_mean": totals["kl_sum"] / n} if kl_on else {}
    if ent_on:
        kl["entropy_mean"] = totals["entropy_sum"] / n
    return {**kl, "loss": out["loss"], "grad_norm": out["grad_norm"], "clip_frac": totals["n_clipped"] / n,
            "dual_clip_frac": totals["n_dual_clipped"] / n,
            "iw_capped_frac": totals["n_iw_capped"] / n, "iw_truncated_frac": totals["n_iw_truncated"] / n,
            **diagnostics, "n_micro_batches": float(sum(len(m) for _, m in plan)),
            "cpu_s": time.thread_time() - cpu0}

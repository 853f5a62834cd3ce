"""A published (``trainer: gpu``) recipe as an ``areal train`` run: its :class:`~areal_cli.recipes.schema.PublishedTrainSpec`
mapped onto :class:`~areal_cli.config.TrainConfig`, with every difference from AReaL's run said in one line.

The run is AReaL's system rebuilt here: SGLang servers (``rollout.engine: sglang``, one per
``tp x pp`` generation GPUs of the allocation), the Megatron-core trainer as torchrun ranks (data x tensor x
pipeline parallel of the allocation's training part), the recipe's task reading the published records and
rewarding them with the ``areal eval`` graders, decoupled PPO with AReaL's settings. Names:

========================  ===============================================================================
recipe key                TrainConfig
========================  ===============================================================================
``recompute_logprob`` +   ``ppo.recompute_proximal`` (the decoupled loss needs the trainer's proximal logprobs;
``use_decoupled_loss``    without it PPO's old policy is the behaviour policy)
``reward_scaling/bias``   realhf's ``((s - 0.5) * 2 - bias) * scaling`` = ``(s + reward_bias) * reward_scaling``
                          with ``ppo.reward_bias = -0.5 - bias / 2``, ``ppo.reward_scaling = 2 * scaling`` (+-5 for boba)
``max_concurrent_rollouts``  null -> ``rollout.batch_size`` (AReaL's default)
``top_k``                 >= 10^6 -> -1 (off: larger than any vocabulary)
``epochs``                ``loop.epochs`` (steps = epochs x records / batch_size) when ``loop.max_steps`` is null
``save_freq_steps``       ``loop.checkpoint_every``
``kl_ctl``                ``ppo.kl_ctl`` with realhf's estimator and place: ``kl_estimator: k1`` (log pi - log pi_ref),
                          ``kl_in: reward`` (per-token reward -kl_ctl * k1); the reference is the initial policy
``discount, gae_lambda``  ``ppo.discount``, ``ppo.gae_lambda`` (GAE with values 0: realhf without a critic)
``c_clip``                ``ppo.c_clip`` (dual clip)
``sglang_*``              ``rollout.sglang_mem_fraction_static``, ``rollout.sglang_dtype``,
                          ``rollout.sglang_context_length``; attention backend and schedule policy as SGLang
                          flags (``rollout.sglang_extra_args``)
========================  ===============================================================================

Not reproduced (listed by :func:`gpu_train_config` as deviations, recorded in the manifest): fp16 training with
dynamic loss scaling (the trainer keeps float32 weights), gradient checkpointing, ``early_stop_imp_ratio``,
checkpoints by epoch or by wall time. Settings the kit cannot run at all (sample reuse, masking truncated samples)
are refused in one line.
"""

from __future__ import annotations

import shlex
from typing import Any

from areal_cli.config import TrainConfig
from areal_cli.config.sections import LoopSection, ModelSection, PPOSection, RolloutSection, SftSection, TaskSection
from areal_cli.foundations.errors import UserError

#: top_k at or above this is "off" (AReaL writes 10^6 or 10^8 for "no top-k").
TOP_K_OFF = 1_000_000


def gpu_train_config(recipe: Any, variant: str | None = None, *, placement: Any = None
                     ) -> tuple[TrainConfig, list[str]]:
    """``(TrainConfig, deviations)`` of a ``trainer: gpu`` RL recipe (module docstring).

    Args:
        placement: a :class:`~areal_cli.recipes.placement.Placement` of the allocation (its servers and trainer
            degrees); None: the recipe's published allocation, or none (then ``rollout.n_servers`` / ``parallel.*``
            stay 1 and the caller sets them).
    Returns:
        the config with ``model.path`` None and ``task.dataset`` empty (the caller sets the downloaded paths),
        and one line per setting areal runs differently.
    Raises:
        UserError: an SFT recipe, a setting the kit cannot run (sample reuse, masking truncated samples, ...).
    """
    if recipe.kind == "sft":
        raise UserError(f"{recipe.path}: recipe '{recipe.name}' is supervised fine-tuning (areal_cli.sft.job), "
                        f"not an RL run")
    spec = recipe.variant(variant)

    def refuse(name: str, why: str) -> UserError:
        file, lines, line = getattr(spec, "__source__", (recipe.path, {}, 1))  # set by areal_cli.recipes.build.build
        return UserError(f"{file}:{lines.get(name, line)}: field 'train.{name}': {why} (got {getattr(spec, name)!r}); "
                         f"areal cannot run this recipe as published")

    if spec.actor_sample_reuse != 1:
        raise refuse("actor_sample_reuse", "each sample is trained once")
    if spec.mask_too_long:
        raise refuse("mask_too_long", "masking truncated samples is not implemented")
    if spec.adv_norm not in ("group", "global"):
        raise refuse("adv_norm", "advantages are normalised per group or over the batch")
    notes: list[str] = []
    cfg = TrainConfig(recipe=recipe.name, seed=spec.seed)
    cfg.model = ModelSection(path=None)
    cfg.task = TaskSection(
        preset=spec.task, prompt_template=spec.prompt_template, dataset="", heldout_fraction=0.0,
        shuffle_dataset=spec.shuffle_dataset, max_prompt_len=spec.max_prompt_len,
        reward_timeout_s=90.0 if spec.task == "code-rl" else 10.0, reward_workers=8)
    cfg.sft = SftSection(max_steps=0)
    cfg.rollout = RolloutSection(
        batch_size=spec.batch_size, group_size=spec.group_size, max_new_tokens=spec.max_new_tokens,
        min_new_tokens=spec.min_new_tokens, temperature=spec.temperature, top_p=spec.top_p,
        top_k=-1 if spec.top_k >= TOP_K_OFF else spec.top_k, max_head_offpolicyness=spec.max_head_offpolicyness,
        max_concurrent_rollouts=spec.max_concurrent_rollouts or spec.batch_size,
        success_rate_lb=spec.success_rate_lb, success_rate_ub=spec.success_rate_ub,
        engine="sglang", sglang_mem_fraction_static=spec.sglang_mem_fraction_static,
        sglang_dtype=spec.sglang_dtype, sglang_context_length=spec.sglang_context_length,
        server_max_total_tokens=0, server_max_running_requests=spec.sglang_max_running_requests or 0,
        sglang_extra_args=shlex.join(["--attention-backend", spec.sglang_attention_backend,
                                      "--schedule-policy", spec.sglang_schedule_policy]))
    cfg.ppo = PPOSection(
        n_minibatches=spec.ppo_n_minibatches, eps_clip=spec.eps_clip,
        recompute_proximal=bool(spec.use_decoupled_loss),
        behav_imp_weight_cap=spec.behav_imp_weight_cap if spec.behav_imp_weight_cap is not None else 1e9,
        adv_norm=spec.adv_norm, reward_bias=-0.5 - spec.reward_bias / 2, reward_scaling=2 * spec.reward_scaling,
        max_reward_clip=spec.max_reward_clip, lr=spec.lr, lr_scheduler=spec.lr_scheduler,
        warmup_proportion=spec.warmup_proportion, weight_decay=spec.weight_decay, adam_beta1=spec.adam_beta1,
        adam_beta2=spec.adam_beta2, adam_eps=spec.adam_eps, grad_clip=spec.grad_clip,
        max_tokens_per_mb=spec.max_tokens_per_mb, c_clip=spec.c_clip, discount=spec.discount,
        gae_lambda=spec.gae_lambda, kl_ctl=spec.kl_ctl, kl_estimator="k1", kl_in="reward")
    cfg.loop = LoopSection(
        target_accuracy=0.0, eval_every=0, eval_n_prompts=0, max_steps=spec.max_steps or 0,
        epochs=0 if spec.max_steps else int(spec.epochs or 0), checkpoint_every=spec.save_freq_steps or 0)
    if spec.recompute_logprob and not spec.use_decoupled_loss:
        notes.append("recompute_logprob without the decoupled loss: AReaL's PPO old policy is the trainer's "
                     "recomputation; areal's is the behaviour policy (recompute_proximal false)")
    if spec.behav_imp_weight_cap is None:
        notes.append("behav_imp_weight_cap null: no cap (1e9)")
    if spec.dtype == "fp16":
        notes.append("dtype fp16 with dynamic loss scaling: the trainer keeps float32 weights (no loss scaling)")
    elif spec.dtype == "bf16":
        notes.append("dtype bf16: the trainer keeps float32 weights")
    if spec.gradient_checkpointing:
        notes.append("gradient_checkpointing: not implemented (activation memory is not recomputed)")
    if spec.early_stop_imp_ratio is not None:
        notes.append(f"early_stop_imp_ratio {spec.early_stop_imp_ratio}: not implemented (one minibatch pass)")
    if spec.save_freq_epochs or spec.ckpt_freq_secs:
        notes.append("checkpoints by epoch or wall time (save_freq_epochs, ckpt_freq_secs): only every "
                     "save_freq_steps steps (checkpoint_every)")
    if spec.new_tokens_per_chunk is not None:
        notes.append("new_tokens_per_chunk: generation is not chunked (servers are interrupted instead)")
    if placement is None and recipe.file.resources.allocation:
        from areal_cli.recipes.placement import parse_allocation, place

        r = recipe.file.resources
        placement = place(parse_allocation(r.allocation), nodes=r.nodes, gpus_per_node=r.gpus_per_node)
    if placement is not None:
        cfg = apply_placement(cfg, placement)
    if cfg.loop.checkpoint_every and cfg.parallel.tensor * cfg.parallel.pipeline > 1:
        notes.append(f"save_freq_steps {cfg.loop.checkpoint_every}: no resumable checkpoints with a tensor- or "
                     f"pipeline-parallel trainer (sharded optimizer state); weights of the last step only")
        cfg.loop.checkpoint_every = 0
    cfg.validate(str(recipe.path))
    return cfg, notes


def apply_placement(cfg: TrainConfig, placement: Any) -> TrainConfig:
    """``cfg`` with the allocation's servers (count, tensor parallel size) and trainer degrees."""
    a = placement.allocation
    changes = {"rollout.n_servers": max(a.n_servers, 1), "parallel.data": a.train.dp, "parallel.tensor": a.train.tp,
               "parallel.pipeline": a.train.pp}
    if a.gen is not None:
        changes["rollout.sglang_tp_size"] = a.gen.tp
    return cfg.with_values(changes)

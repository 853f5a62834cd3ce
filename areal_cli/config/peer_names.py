"""The names peers give to the kit's settings, so that an unknown key a user brings from TRL, verl or AReaL is
answered with the kit's name (``-o ppo.learning_rate=1e-5`` -> "TRL's learning_rate is ppo.lr here").

Sources: TRL ``GRPOConfig`` (and the ``transformers.TrainingArguments`` it extends); verl's
``ppo_trainer.yaml`` (``actor_rollout_ref.*``, ``data.*``, ``trainer.*``); AReaL's ``GRPOConfig`` YAML
(``actor.*``, ``gconfig.*``, ``train_dataset.*``, ``saver.*``). Only names whose meaning is the same here are
listed: where a peer counts differently (TRL's per-device batch counts completions, not prompts) there is none.
"""

from __future__ import annotations

#: a peer's key (full dotted path, or its last component) -> (the kit's key, whose name it is)
PEER_NAMES: dict[str, tuple[str, str]] = {
    # TRL GRPOConfig / TrainingArguments
    "learning_rate": ("ppo.lr", "TRL"),
    "num_generations": ("rollout.group_size", "TRL"),
    "max_completion_length": ("rollout.max_new_tokens", "TRL"),
    "max_prompt_length": ("task.max_prompt_len", "TRL"),
    "epsilon": ("ppo.eps_clip", "TRL"),
    "max_grad_norm": ("ppo.grad_clip", "TRL"),
    "adam_epsilon": ("ppo.adam_eps", "TRL"),
    "warmup_ratio": ("ppo.warmup_proportion", "TRL"),
    "lr_scheduler_type": ("ppo.lr_scheduler", "TRL/AReaL"),
    "num_train_epochs": ("loop.epochs", "TRL"),
    "report_to": ("loop.loggers", "TRL"),
    "save_steps": ("loop.checkpoint_every", "TRL"),
    "save_total_limit": ("loop.keep_checkpoints", "TRL"),
    "eval_steps": ("loop.eval_every", "TRL"),
    "model_name_or_path": ("model.path", "TRL"),
    "dataset_name": ("task.dataset", "TRL"),
    # verl ppo_trainer.yaml
    "actor_rollout_ref.actor.optim.lr": ("ppo.lr", "verl"),
    "actor_rollout_ref.rollout.n": ("rollout.group_size", "verl"),
    "actor_rollout_ref.rollout.temperature": ("rollout.temperature", "verl"),
    "actor_rollout_ref.rollout.name": ("rollout.engine", "verl"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": ("rollout.sglang_tp_size", "verl"),
    "actor_rollout_ref.actor.clip_ratio": ("ppo.eps_clip", "verl"),
    "actor_rollout_ref.actor.grad_clip": ("ppo.grad_clip", "verl"),
    "actor_rollout_ref.model.path": ("model.path", "verl"),
    "max_response_length": ("rollout.max_new_tokens", "verl"),
    "data.max_prompt_length": ("task.max_prompt_len", "verl"),
    "train_batch_size": ("rollout.batch_size", "verl"),
    "train_files": ("task.dataset", "verl"),
    "val_files": ("task.eval_dataset", "verl"),
    "total_epochs": ("loop.epochs", "verl"),
    "total_training_steps": ("loop.max_steps", "verl"),
    "save_freq": ("loop.checkpoint_every", "verl"),
    "test_freq": ("loop.eval_every", "verl"),
    "clip_ratio": ("ppo.eps_clip", "verl"),
    # AReaL (lite) GRPOConfig
    "actor.optimizer.lr": ("ppo.lr", "AReaL"),
    "actor.optimizer.weight_decay": ("ppo.weight_decay", "AReaL"),
    "gradient_clipping": ("ppo.grad_clip", "AReaL"),
    "warmup_steps_proportion": ("ppo.warmup_proportion", "AReaL"),
    "gconfig.n_samples": ("rollout.group_size", "AReaL"),
    "n_samples": ("rollout.group_size", "AReaL"),
    "gconfig.max_new_tokens": ("rollout.max_new_tokens", "AReaL"),
    "gconfig.temperature": ("rollout.temperature", "AReaL"),
    "actor.eps_clip": ("ppo.eps_clip", "AReaL"),
    "actor.behav_imp_weight_cap": ("ppo.behav_imp_weight_cap", "AReaL"),
    "actor.recompute_logprob": ("ppo.recompute_proximal", "AReaL"),
    "recompute_logprob": ("ppo.recompute_proximal", "AReaL"),
    "ppo_n_minibatches": ("ppo.n_minibatches", "AReaL"),
    "actor.group_size": ("rollout.group_size", "AReaL"),
    "actor.path": ("model.path", "AReaL"),
    "train_dataset.path": ("task.dataset", "AReaL"),
    "train_dataset.batch_size": ("rollout.batch_size", "AReaL"),
    "valid_dataset.path": ("task.eval_dataset", "AReaL"),
    "total_train_epochs": ("loop.epochs", "AReaL"),
    "saver.freq_steps": ("loop.checkpoint_every", "AReaL"),
    # the algorithm keys (issue 41): peers' spellings of what ppo.* now holds
    "trainer.logger": ("loop.loggers", "verl"),
    "beta": ("ppo.kl_ctl", "TRL"),
    "epsilon_high": ("ppo.eps_clip_higher", "TRL"),
    "loss_type": ("ppo.loss_agg_mode", "TRL"),
    "importance_sampling_level": ("ppo.importance_sampling_level", "TRL/AReaL"),
    "actor_rollout_ref.actor.clip_ratio_high": ("ppo.eps_clip_higher", "verl"),
    "clip_ratio_high": ("ppo.eps_clip_higher", "verl"),
    "clip_ratio_c": ("ppo.c_clip", "verl"),
    "loss_agg_mode": ("ppo.loss_agg_mode", "verl"),
    "kl_loss_coef": ("ppo.kl_ctl", "verl"),
    "kl_loss_type": ("ppo.kl_estimator", "verl"),
    "use_kl_loss": ("ppo.kl_in", "verl"),
    "algorithm.adv_estimator": ("ppo.algorithm", "verl"),
    "adv_estimator": ("ppo.algorithm", "verl"),
    "actor.eps_clip_higher": ("ppo.eps_clip_higher", "AReaL"),
    "actor.c_clip": ("ppo.c_clip", "AReaL"),
    "actor.kl_ctl": ("ppo.kl_ctl", "AReaL"),
    "kl_estimator": ("ppo.kl_estimator", "AReaL"),
}


def peer_hint(key: str) -> str | None:
    """``"TRL's learning_rate is ppo.lr here"`` for a key a peer uses, else None.

    The full dotted key is looked up first (``actor_rollout_ref.rollout.n``), then each shorter tail of it
    (``ppo.learning_rate`` -> ``learning_rate``), so a peer's name put under one of the kit's sections is found too.
    """
    parts = key.split(".")
    for i in range(len(parts)):
        tail = ".".join(parts[i:])
        if tail in PEER_NAMES:
            kit, who = PEER_NAMES[tail]
            return f"{who}'s {tail} is {kit} here"
    return None

"""Algorithm presets (``ppo.algorithm``) and the checks of the algorithm keys of the ``ppo`` section.

A preset is only defaults, like a task preset: it fills the keys of :data:`ALGORITHMS` that the recipe and the
``-o`` overrides leave unset (a preset chosen with ``-o ppo.algorithm=...`` over a recipe also replaces the values the
recipe set for its keys, :func:`prefer_preset`: they were the recipe's algorithm's) (a key is *set* once a recipe, an override or :meth:`TrainConfig.with_values` wrote
it, whatever the value; :func:`fill_algorithm` runs when a config is validated, so ``config.json`` and
``--list-settings`` show the values a run trains with). ``grpo`` sets nothing: today's loss and advantages.

=========  ====================================================================================================
grpo       group mean/std advantages, symmetric clip, token-mean loss (Shao et al. 2024; AReaL boba² defaults)
ppo        a critic, GAE (gamma 1, lambda 0.95), raw rewards, advantages normalised over the batch's tokens
           (Schulman et al. 2017 with GAE, Schulman et al. 2016; Ouyang et al. 2022; AReaL
           ``examples/math/gsm8k_ppo.yaml``: critic, ``adv_norm: {mean_level: batch, std_level: batch}``, no
           reward_norm)
dr_grpo    no std, Dr.GRPO's constant normaliser (Liu et al. 2025, "Understanding R1-Zero-Like Training", §3.2)
dapo       clip-higher 0.2/0.28, overlong reward shaping, token-mean (Yu et al. 2025, DAPO §3.1, §3.3, §3.4;
           AReaL ``examples/math/gsm8k_dapo_dynamic_bs.yaml``); dynamic sampling is ``rollout.success_rate_lb/ub``,
           which the preset leaves alone
gspo       sequence ratio, clip 3e-4/4e-4, sequence mean, sequence-level behaviour correction (Zheng et al. 2025,
           GSPO §4.1 eq. 5-7, §5.1)
rloo       leave-one-out mean, no std (Ahmadian et al. 2024, "Back to Basics", §3.2; AReaL ``gsm8k_rloo.yaml``)
cispo      clipped, stop-gradient IS weight times log pi (MiniMax-M1 2025 §3.1 eq. 4); eps_low 1 (no lower bound,
           as the paper), eps_high 0.28 (Trinity-RFT's ``CISPOPolicyLossFn`` default)
=========  ====================================================================================================
"""

from __future__ import annotations

from typing import Any, Callable

from areal_cli.config.sections import SECTIONS

#: ``ppo.algorithm`` -> the dotted keys it fills and their values.
ALGORITHMS: dict[str, dict[str, Any]] = {
    "grpo": {},
    "ppo": {"critic.enabled": True, "ppo.gae_lambda": 0.95, "ppo.adv_norm": "global"},
    "dr_grpo": {"ppo.reward_norm_std_level": "none", "ppo.loss_agg_mode": "seq-mean-token-sum-norm"},
    "dapo": {"ppo.eps_clip": 0.2, "ppo.eps_clip_higher": 0.28, "ppo.overlong_reward_penalty": True,
             "ppo.loss_agg_mode": "token-mean"},
    "gspo": {"ppo.importance_sampling_level": "sequence", "ppo.eps_clip": 3e-4, "ppo.eps_clip_higher": 4e-4,
             "ppo.loss_agg_mode": "seq-mean-token-mean", "ppo.behav_imp_weight_mode": "sequence_mask"},
    "rloo": {"ppo.reward_norm_mean_leave1out": True, "ppo.reward_norm_std_level": "none"},
    "cispo": {"ppo.loss_fn": "cispo", "ppo.eps_clip": 1.0, "ppo.eps_clip_higher": 0.28},
}

#: Every key some preset fills (a preset's other keys go back to their defaults when the algorithm changes).
PRESET_KEYS = tuple(dict.fromkeys(k for values in ALGORITHMS.values() for k in values))


def _default(dotted: str) -> Any:
    sec, name = dotted.split(".", 1)
    return getattr(SECTIONS[sec](), name)


def fill_algorithm(cfg: Any) -> None:
    """Fill, in place, the keys of ``cfg.ppo.algorithm``'s preset that were not set (see the module docstring);
    the keys an earlier fill set and this preset does not go back to their defaults. A key counts as set when a
    recipe, ``-o`` or :meth:`~areal_cli.config.train.TrainConfig.with_values` wrote it (``cfg._set_keys``), or
    when it holds a value other than its default that no fill put there (a config built in code)."""
    state = vars(cfg)
    explicit, filled = state.get("_set_keys", set()), state.setdefault("_filled_keys", set())
    chosen = ALGORITHMS[cfg.ppo.algorithm] if cfg.ppo.algorithm in ALGORITHMS else {}
    for key in PRESET_KEYS:
        sec, name = key.split(".", 1)
        if key in explicit or (key not in filled and getattr(getattr(cfg, sec), name) != _default(key)):
            continue
        setattr(getattr(cfg, sec), name, chosen.get(key, _default(key)))
        filled.add(key)


def prefer_preset(cfg: Any, same_layer: set[str]) -> None:
    """``ppo.algorithm`` set by a later layer than the recipe (``-o ppo.algorithm=ppo`` over a recipe): the keys of
    its preset win over the values the recipe set for them (a recipe's ``adv_norm: group`` was written for the
    recipe's algorithm), not over keys set in the same layer (``same_layer``: ``-o ppo.adv_norm=group`` stays).
    A recipe that names its algorithm itself keeps its values: the preset fills only the keys it leaves unset."""
    state = vars(cfg)
    explicit, filled = state.setdefault("_set_keys", set()), state.setdefault("_filled_keys", set())
    for key in ALGORITHMS.get(cfg.ppo.algorithm, {}):
        if key not in same_layer:
            explicit.discard(key)
            filled.add(key)


def describe_presets() -> list[str]:
    """One line per preset: ``name: key=value, ...`` (``--list-settings``)."""
    return [f"{name}: " + (", ".join(f"{k}={v}" for k, v in values.items()) or "nothing (today's defaults)")
            for name, values in ALGORITHMS.items()]


def check_algorithm(cfg: Any, bad: Callable[[str, str], Exception]) -> None:
    """Refuse, in one line naming the keys, algorithm settings out of range or that make no sense together.

    Args:
        bad: ``bad(dotted key, why)`` -> the UserError to raise (``file:line: field 'key': why (got value)``).
    """
    p, r = cfg.ppo, cfg.rollout
    by = f" (ppo.algorithm {p.algorithm})" if p.algorithm != "grpo" else ""
    if p.eps_clip_higher is not None and not p.eps_clip_higher > 0:
        raise bad("ppo.eps_clip_higher", "must be > 0 (or null: symmetric clipping)")
    if p.c_clip is not None and not p.c_clip > 1.0:
        raise bad("ppo.c_clip", "the dual clip must be > 1 (or null: off)")
    if p.importance_sampling_level == "sequence" and p.behav_imp_weight_mode.startswith("token"):
        raise bad("ppo.importance_sampling_level", f"sequence (GSPO){by} needs a sequence-level behaviour "
                  f"correction: set ppo.behav_imp_weight_mode to sequence_mask, sequence_truncate or disabled (it is "
                  f"{p.behav_imp_weight_mode}: token weights would weigh each sequence by their arithmetic mean, "
                  f"not by its likelihood ratio)")
    if p.loss_fn == "cispo" and p.importance_sampling_level != "token":
        raise bad("ppo.loss_fn", f"cispo{by} clips token IS weights (MiniMax-M1 eq. 4): it needs "
                                 f"ppo.importance_sampling_level token")
    if p.loss_fn == "cispo" and p.c_clip is not None:
        raise bad("ppo.c_clip", f"the dual clip bounds the PPO min-objective; ppo.loss_fn cispo{by} has none "
                                f"(its IS weight is clipped by ppo.eps_clip / ppo.eps_clip_higher)")
    levels = [n for n in ("ppo.reward_norm_mean_level", "ppo.reward_norm_std_level") if getattr(p, n[4:])]
    if p.reward_norm_mean_leave1out:
        levels.append("ppo.reward_norm_mean_leave1out")
    if levels and p.adv_norm == "global" and not cfg.critic.enabled:
        raise bad(levels[0], f"the reward_norm keys{by} set the advantage rule of ppo.adv_norm group; "
                             "ppo.adv_norm global normalises tokens over the batch (REINFORCE++): set one or the other")
    if p.reward_norm_mean_leave1out and (p.reward_norm_mean_level or "group") != "group":
        raise bad("ppo.reward_norm_mean_leave1out", f"the leave-one-out mean{by} is a group mean: needs "
                                                    "ppo.reward_norm_mean_level group")
    if p.reward_norm_mean_leave1out and r.group_size < 2:
        raise bad("ppo.reward_norm_mean_leave1out", f"the leave-one-out mean{by} needs rollout.group_size >= 2")
    _check_critic(cfg, bad, by)
    if p.entropy_coeff < 0:
        raise bad("ppo.entropy_coeff", "must be >= 0 (0: no entropy term)")
    if p.entropy_coeff > 0 and cfg.parallel.tensor > 1:
        raise bad("ppo.entropy_coeff", f"the entropy over the vocabulary is computed with the whole vocabulary on "
                                       f"one rank: needs parallel.tensor 1 (it is {cfg.parallel.tensor}), or "
                                       f"ppo.entropy_coeff 0")
    if p.kl_ctl < 0:
        raise bad("ppo.kl_ctl", "must be >= 0 (0: no KL, no reference policy)")
    if p.overlong_tokens < 0 or p.overlong_tokens > r.max_new_tokens:
        raise bad("ppo.overlong_tokens", f"must be in [0, rollout.max_new_tokens={r.max_new_tokens}] (0: a fifth)")
    if p.overlong_penalty_factor < 0:
        raise bad("ppo.overlong_penalty_factor", "must be >= 0")


def _check_critic(cfg: Any, bad: Callable[[str, str], Exception], by: str) -> None:
    """The critic's keys (``critic.*``, ``ppo.discount``, ``ppo.gae_lambda``; :mod:`areal_cli.trainer.critic`)."""
    p, c = cfg.ppo, cfg.critic
    for key, value in (("ppo.discount", p.discount), ("ppo.gae_lambda", p.gae_lambda)):
        if not 0.0 <= value <= 1.0:
            raise bad(key, "must be in [0, 1]")
        if value != 1.0 and p.importance_sampling_level == "sequence":
            raise bad(key, f"discounted advantages differ per token; GSPO's sequence ratio{by} averages them over "
                           f"the sequence: use 1, or ppo.importance_sampling_level token")
    if not c.enabled:
        return
    if c.lr < 0 or c.weight_decay < 0 or c.eps_clip < 0 or not c.grad_clip > 0:
        name = next(n for n, ok in (("critic.lr", c.lr >= 0), ("critic.weight_decay", c.weight_decay >= 0),
                                    ("critic.eps_clip", c.eps_clip >= 0), ("critic.grad_clip", c.grad_clip > 0))
                    if not ok)
        raise bad(name, "must be >= 0" if name != "critic.grad_clip" else "must be > 0")
    if c.n_minibatches < 1 or cfg.rollout.batch_size % c.n_minibatches:
        raise bad("critic.n_minibatches", f"must be >= 1 and divide rollout.batch_size ({cfg.rollout.batch_size})")
    if p.kl_ctl > 0 and p.kl_in == "reward":
        raise bad("ppo.kl_in", f"ppo.kl_ctl={p.kl_ctl} puts the KL in the reward (ppo.kl_in reward, the default); "
                               f"with the critic{by} it would enter GAE as per-token rewards before the update, "
                               f"where the proximal logprobs are not computed yet: set ppo.kl_in loss")
    if p.importance_sampling_level == "sequence":
        raise bad("ppo.importance_sampling_level", f"sequence (GSPO) averages the advantage over the sequence; with "
                                                   f"the critic{by} GAE gives each token its own: use token")

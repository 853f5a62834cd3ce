"""The checks of a :class:`~areal_cli.config.train.TrainConfig`: enumerations, ranges and settings that exclude
each other, each reported as ``source:line: field 'section.key': why (got value)``."""

from __future__ import annotations

import math
import typing
from typing import Any

from areal_cli.config.algorithms import check_algorithm
from areal_cli.config.cpus import parse_cpu_list
from areal_cli.config.keys import KEYS, get_value
from areal_cli.config.sections import RolloutSection
from areal_cli.foundations.errors import UserError

_POSITIVE = ("rollout.batch_size", "rollout.group_size", "rollout.max_new_tokens", "rollout.n_servers",
             "sft.batch_size", "loop.eval_n_samples", "ppo.n_minibatches", "parallel.torch_threads",
             "task.reward_workers", "sft.max_tokens_per_mb", "loop.keep_checkpoints", "parallel.data",
             "parallel.tensor", "parallel.pipeline", "rollout.sglang_tp_size", "sft.eval_every", "sft.n_examples",
             "model.hidden_size", "model.num_layers", "model.vocab_size")
_NON_NEGATIVE = ("rollout.max_head_offpolicyness", "loop.max_steps", "sft.max_steps", "rollout.max_concurrent_rollouts",
                 "loop.eval_every", "loop.time_limit_s", "sft.pack_row_tokens", "loop.checkpoint_every",
                 "ppo.max_reward_clip", "loop.eval_benchmark_every", "loop.eval_max_problems", "loop.eval_n_prompts",
                 "rollout.server_max_restarts", "rollout.temperature", "loop.eval_temperature", "ppo.weight_decay",
                 "loop.log_samples_every", "loop.log_samples_n")
_POSITIVE_FLOAT = ("ppo.lr", "sft.lr", "ppo.grad_clip", "ppo.eps_clip", "ppo.behav_imp_weight_cap",
                   "task.reward_timeout_s", "ppo.reward_scaling", "rollout.server_stall_timeout_s",
                   "rollout.weight_update_chunk_mb", "ppo.adam_eps")
_NO_LIMIT_ZERO = ("task.max_prompt_len", "ppo.max_tokens_per_mb", "loop.epochs", "rollout.sglang_context_length",
                  "rollout.filter_patience_batches")


#: Float settings where +inf means "no limit" (any other float must be finite: nan and +-inf are refused).
_MAY_BE_INF = ("ppo.grad_clip", "critic.grad_clip", "ppo.behav_imp_weight_cap", "ppo.max_reward_clip",
               "loop.time_limit_s")


def validate(cfg: Any, source: str = "config", lines: dict[str, int] | None = None,
             where: dict[str, str] | None = None) -> None:
    """Check ``cfg``: every ``Literal`` setting holds one of its values, ranges, and combinations.

    Args:
        source: where the values come from (a file path or "overrides").
        lines: dotted key -> line number in ``source``, to report ``file:line``.
        where: dotted key -> the whole location (``-o rollout.group_size=0``), before ``lines``.
    Raises:
        UserError: naming the setting and the bad value.
    """
    def loc(name: str) -> str | None:
        return (where[name] if where and name in where else
                f"{source}:{lines[name]}" if lines and name in lines else None)

    def bad(name: str, why: str) -> UserError:
        return UserError(f"{loc(name) or source}: field '{name}': {why} (got {get_value(cfg, name)!r})")

    v = lambda name: get_value(cfg, name)  # noqa: E731
    for name, key in KEYS.items():
        if typing.get_origin(key.type) is typing.Literal and v(name) not in typing.get_args(key.type):
            raise bad(name, f"must be one of {', '.join(typing.get_args(key.type))}")
        value = v(name)
        if isinstance(value, float) and not math.isfinite(value) and not (name in _MAY_BE_INF and value > 0):
            raise bad(name, "must be a finite number" + (" (inf: no limit)" if name in _MAY_BE_INF else ""))
    for name in _POSITIVE:
        if v(name) <= 0:
            raise bad(name, "must be > 0")
    for name in _NON_NEGATIVE:
        if v(name) < 0:
            raise bad(name, "must be >= 0")
    for name in _POSITIVE_FLOAT:
        if not v(name) > 0:
            raise bad(name, "must be > 0")
    for name in _NO_LIMIT_ZERO:
        if v(name) < 0:
            raise bad(name, "must be >= 0 (0: no limit)")
    r, p, s, loop, par = cfg.rollout, cfg.ppo, cfg.sft, cfg.loop, cfg.parallel
    if not 0.0 <= s.stop_accuracy <= 0.5:
        raise bad("sft.stop_accuracy", "the warm start must stop at or below 0.5 accuracy")
    if not 0.0 <= r.success_rate_lb <= r.success_rate_ub <= 1.0:
        raise bad("rollout.success_rate_lb", "need 0 <= success_rate_lb <= success_rate_ub <= 1")
    if not p.behav_imp_weight_cap > 1.0:
        raise bad("ppo.behav_imp_weight_cap", "must be > 1 (a weight of 1 is on-policy)")
    if not 0.0 <= p.behav_imp_weight_lower < 1.0:
        raise bad("ppo.behav_imp_weight_lower", "must be in [0, 1) (0: no lower bound)")
    if p.behav_imp_weight_lower and not p.behav_imp_weight_mode.endswith("_mask"):
        raise bad("ppo.behav_imp_weight_lower", "applies to the mask modes only (token_mask, sequence_mask)")
    if not 0.0 < r.top_p <= 1.0:
        raise bad("rollout.top_p", "must be in (0, 1]")
    if r.top_p < 1.0:
        raise bad("rollout.top_p", "training samples must come from the untruncated policy: with top_p < 1 the "
                                   "rollout servers report logprobs of the untruncated distribution (as SGLang "
                                   "does), so pi_prox/pi_behav would ignore the truncation; use 1.0")
    if r.pause_mode == "in_place" and not r.interruptible:
        raise bad("rollout.pause_mode", "in_place pauses an interruptible weight update; with rollout.interruptible "
                                        "false in-flight samples finish on the old weights (use abort)")
    if p.prox_logp_method == "reuse" and p.n_minibatches != 1:
        raise bad("ppo.prox_logp_method", "'reuse' needs ppo.n_minibatches = 1 (after the first minibatch's update "
                                          "the weights are no longer the proximal policy); use 'recompute' or 'auto'")
    if not 0.0 < r.sglang_mem_fraction_static < 1.0:
        raise bad("rollout.sglang_mem_fraction_static", "must be in (0, 1)")
    if r.top_k != -1 and r.top_k < 1:
        raise bad("rollout.top_k", "must be -1 (off) or >= 1")
    if not 0 <= r.min_new_tokens <= r.max_new_tokens:
        raise bad("rollout.min_new_tokens", "must be in [0, max_new_tokens]")
    if not 0.0 <= loop.target_accuracy <= 1.0:
        raise bad("loop.target_accuracy", "must be in [0, 1] (0 disables early stopping)")
    if s.pack_row_tokens > s.max_tokens_per_mb:
        raise bad("sft.pack_row_tokens", f"must be <= sft.max_tokens_per_mb={s.max_tokens_per_mb}")
    if loop.eval_deferred:
        for name, on in (("loop.target_accuracy", loop.target_accuracy > 0), ("loop.checkpoint_every", loop.checkpoint_every),
                         ("loop.eval_benchmarks", loop.eval_benchmarks)):
            if on:
                raise bad(name, "must be off with loop.eval_deferred (early stopping, checkpoints and in-loop "
                                f"benchmarks need the accuracy during the loop; set -o {name}="
                                f"{'[]' if name == 'loop.eval_benchmarks' else 0})")
    for entry in loop.eval_benchmarks:  # benchmark names are checked when the run loads them (areal_cli.eval)
        if not isinstance(entry, str) or not entry.strip() or "," in entry:
            raise bad("loop.eval_benchmarks", "every entry must be one benchmark name or task file (a list, not "
                                              "a comma-separated string)")
        if entry.strip().lower().endswith((".yaml", ".yml", ".jsonl", ".json", ".parquet")):
            from pathlib import Path

            if not Path(entry).is_file():
                raise bad("loop.eval_benchmarks", f"task file {entry} not found (a task YAML or a records file; "
                                                  f"relative to the recipe's folder)")
    if loop.checkpoint_every and par.rollout_process:
        raise bad("loop.checkpoint_every", "checkpoints need the controller in this process "
                                           "(parallel.rollout_process: false)")
    if loop.checkpoint_every and par.tensor * par.pipeline > 1:
        raise bad("loop.checkpoint_every", "checkpoints need parallel.tensor = parallel.pipeline = 1 "
                                           "(the optimizer state of model-parallel ranks is sharded)")
    if cfg.critic.enabled and par.pipeline > 1:  # impossible whatever the warm start: say it first
        raise bad("critic.enabled", "the critic runs with tensor and data parallelism, not the pipeline-parallel "
                                    f"trainer: needs parallel.pipeline 1 (it is {par.pipeline})")
    if s.max_steps and par.pipeline > 1:
        raise bad("sft.max_steps", "the warm start (packed SFT) needs parallel.pipeline = 1; "
                                   "use sft.max_steps=0 with a warm model.path")
    if not 0.0 <= cfg.task.heldout_fraction < 1.0:
        raise bad("task.heldout_fraction", "must be in [0, 1)")
    server_caps = ("rollout.server_max_running_requests", "rollout.server_max_total_tokens")
    for name in server_caps:
        if v(name) < 0:
            raise bad(name, "must be > 0 (0, SGLang's default, only with rollout.engine sglang)")
        if v(name) == 0 and r.engine == "embedded":  # e.g. a GPU recipe's SGLang settings moved to the CPU engine
            zero = [n for n in server_caps if v(n) == 0]
            fix = " ".join(f"-o {n}={getattr(RolloutSection(), n.split('.')[1])}" for n in zero)
            at = loc(name) or loc("rollout.engine") or source  # the value, or the engine that makes it wrong
            raise UserError(f"{at}: field '{name}': must be > 0 with rollout.engine embedded (0, SGLang's "
                            f"default, only with rollout.engine sglang); {fix} sets the embedded "
                            f"default{'s' if len(zero) > 1 else ''} (got 0)")
    if r.sglang_context_length and r.sglang_context_length <= r.max_new_tokens:
        raise bad("rollout.sglang_context_length", f"must exceed max_new_tokens={r.max_new_tokens} (0: derived)")
    unknown = [n.strip() for n in loop.loggers.split(",") if n.strip() not in ("", "tensorboard", "wandb")]
    if unknown:
        raise bad("loop.loggers", f"unknown logger {unknown[0]!r} (known: tensorboard, wandb; comma-separated)")
    for name in ("ppo.adam_beta1", "ppo.adam_beta2"):
        if not 0.0 <= v(name) < 1.0:
            raise bad(name, "must be in [0, 1)")
    if not 0.0 <= p.warmup_proportion <= 1.0:
        raise bad("ppo.warmup_proportion", "must be in [0, 1]")
    if not all(isinstance(x, str) and x for x in cfg.task.required_fields):
        raise bad("task.required_fields", "must be a list of field names")
    args = cfg.task.workflow_args
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise bad("task.workflow_args", "must be a mapping of argument names to values")
    if r.batch_size % p.n_minibatches:
        raise bad("ppo.n_minibatches", f"must divide rollout.batch_size={r.batch_size}")
    check_algorithm(cfg, bad)  # the ppo algorithm keys (areal_cli.config.algorithms)
    for name in ("parallel.trainer_cpus", "parallel.server_cpus", "parallel.controller_cpus"):
        try:
            parse_cpu_list(v(name))
        except ValueError as e:
            raise bad(name, str(e)) from None

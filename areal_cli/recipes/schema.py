"""The sections of a locked recipe file as dataclasses: source, Hub references, data, the published training
settings (:class:`PublishedTrainSpec`, with :data:`AREAL_KEYS` naming AReaL's keys), SFT settings, variants,
resources, evaluation, and the file's top level (:class:`RecipeFile`).

Every field without a default is a required key (:func:`areal_cli.recipes.build.build`); range checks that
need more than a type live in each section's ``validate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from areal_cli.foundations.errors import UserError
from areal_cli.recipes.build import where


@dataclass
class Source:
    """Where the recipe's settings and numbers come from (a public repository at a tag)."""

    repo: str  # e.g. "inclusionAI/AReaL" (GitHub)
    tag: str | None
    paths: list[str]
    note: str | None = None


@dataclass
class HubRef:
    """A model or dataset: a Hugging Face repo pinned to a commit, or a built-in (no download).

    ``revision: null`` is allowed only with ``revision_note`` (why it is not pinned); downloads then need
    ``--allow-unpinned``.
    """

    repo: str | None = None
    revision: str | None = None
    revision_note: str | None = None
    builtin: str | None = None
    note: str | None = None


@dataclass
class DataFile:
    """One file of a dataset repo. ``sha256`` is verified after download when given."""

    path: str
    sha256: str | None = None


@dataclass
class DataRef(HubRef):
    """Training data. ``files``: what to download (allow-patterns); ``complete: false`` when part of the
    published training data was never released (a full retrain is then impossible from public data)."""

    files: list[DataFile] = field(default_factory=list)
    card: str = ""
    complete: bool = True
    checksum_note: str | None = None


@dataclass
class PublishedTrainSpec:
    """Every training setting of an AReaL (Megatron trainer + SGLang servers) run, as published.

    Names follow :class:`areal_cli.config.TrainConfig` where the concept is the same (``batch_size`` =
    prompts per step = AReaL ``dataset.train_bs_n_seqs``; ``group_size``; ``max_head_offpolicyness`` = η;
    ``eps_clip``; ``behav_imp_weight_cap``; ``success_rate_lb/ub``; ``adv_norm``; ``lr``; ...) and AReaL's
    otherwise (see ``AREAL_KEYS``). Every key is required: ``null`` means "not set" with the meaning given
    in the comment (never "unknown").
    """

    task: str  # the areal task that reads the recipe's data and rewards it (areal_cli/tasks: math-rl, code-rl)
    prompt_template: str  # how prompts are rendered (an `areal eval` protocol; a template in a record is used as is)
    seed: int
    max_steps: int | None  # PPO steps; null: run `epochs`
    epochs: int | None  # exp_ctrl.total_train_epochs
    batch_size: int  # prompts per step
    group_size: int  # answers per prompt
    shuffle_dataset: bool
    max_prompt_len: int  # tokens
    max_new_tokens: int
    min_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    max_head_offpolicyness: int  # eta; 0 = synchronous
    max_concurrent_rollouts: int | None  # null: AReaL default = batch_size
    new_tokens_per_chunk: int | None  # null: no chunked generation (interruptible servers)
    flush_request_timeout: int | None  # s; null: not applicable (synchronous)
    ppo_n_minibatches: int
    actor_sample_reuse: int  # PPO epochs over each batch
    eps_clip: float
    c_clip: float | None  # dual clip; null: off
    recompute_logprob: bool  # proximal logprobs recomputed by the trainer
    use_decoupled_loss: bool  # decoupled PPO objective (needs recompute_logprob)
    behav_imp_weight_cap: float | None  # null: no cap
    early_stop_imp_ratio: float | None  # null: no early stop
    kl_ctl: float
    adv_norm: Literal["global", "group", "none"]  # AReaL adv_norm + group_adv_norm
    discount: float
    gae_lambda: float
    reward_scaling: float  # ppo.reward_output_scaling
    reward_bias: float  # ppo.reward_output_bias
    max_reward_clip: float
    success_rate_lb: float
    success_rate_ub: float
    mask_too_long: bool
    lr: float
    lr_scheduler: Literal["constant", "linear", "cosine"]
    warmup_proportion: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    grad_clip: float
    dtype: Literal["fp16", "bf16", "fp32"]  # training precision (AReaL actor.bf16)
    initial_loss_scale: float | None  # fp16 loss scaling; null with bf16
    loss_scale_window: float | None
    hysteresis: int | None
    gradient_checkpointing: bool
    max_tokens_per_mb: int  # micro-batch token budget (actor_train / actor_inf / ref_inf)
    sglang_context_length: int
    sglang_mem_fraction_static: float
    sglang_dtype: Literal["float16", "bfloat16"]
    sglang_max_running_requests: int | None
    sglang_attention_backend: str
    sglang_schedule_policy: str
    save_freq_steps: int | None
    save_freq_epochs: int | None
    ckpt_freq_secs: int | None

    def validate(self, *, kind: str | None = None) -> None:
        """Range checks; ``kind`` ("async-ppo"/"sync-ppo") also checks η against the kind.

        Raises:
            UserError: ``file:line: field 'train.x': why (got v)``.
        """
        def bad(name: str, why: str) -> UserError:
            return UserError(f"{where(self, name)}: field 'train.{name}': {why} (got {getattr(self, name)!r})")

        for name in ("batch_size", "group_size", "max_prompt_len", "max_new_tokens", "top_k",
                     "ppo_n_minibatches", "actor_sample_reuse", "max_tokens_per_mb", "sglang_context_length"):
            if getattr(self, name) <= 0:
                raise bad(name, "must be > 0")
        for name in ("max_head_offpolicyness", "min_new_tokens", "kl_ctl", "weight_decay", "warmup_proportion"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        for name in ("max_steps", "epochs", "max_concurrent_rollouts", "new_tokens_per_chunk",
                     "flush_request_timeout", "behav_imp_weight_cap", "early_stop_imp_ratio"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise bad(name, "must be > 0 or null")
        for name in ("lr", "eps_clip", "temperature", "grad_clip", "adam_eps", "max_reward_clip", "reward_scaling"):
            if not getattr(self, name) > 0:
                raise bad(name, "must be > 0")
        if self.max_steps is None and self.epochs is None:
            raise bad("max_steps", "set max_steps or epochs")
        if not 0 < self.top_p <= 1:
            raise bad("top_p", "must be in (0, 1]")
        for name in ("adam_beta1", "adam_beta2", "discount", "gae_lambda", "sglang_mem_fraction_static"):
            if not 0 <= getattr(self, name) <= 1:
                raise bad(name, "must be in [0, 1]")
        if not 0.0 <= self.success_rate_lb <= self.success_rate_ub <= 1.0:
            raise bad("success_rate_lb", "need 0 <= success_rate_lb <= success_rate_ub <= 1")
        if self.use_decoupled_loss and not self.recompute_logprob:
            raise bad("use_decoupled_loss", "the decoupled loss needs recompute_logprob: true")
        if self.c_clip is not None and self.c_clip <= 1:
            raise bad("c_clip", "dual clip must be > 1 or null")
        if self.dtype == "fp16" and None in (self.initial_loss_scale, self.loss_scale_window, self.hysteresis):
            raise bad("initial_loss_scale", "fp16 training needs initial_loss_scale, loss_scale_window, hysteresis")
        if self.max_prompt_len + self.max_new_tokens > self.sglang_context_length:
            raise bad("max_new_tokens", f"max_prompt_len + max_new_tokens exceeds "
                                        f"sglang_context_length={self.sglang_context_length}")
        from areal_cli.eval.protocols import PROTOCOLS
        from areal_cli.tasks.registry import PRESETS

        synthetic = ("custom", "tiny-arith", "tiny-arith-multiturn", "tiny-longtail")  # no data set to train a GPU recipe on
        if self.task not in PRESETS or self.task in synthetic:
            raise bad("task", f"must be a built-in data task ({', '.join(t for t in PRESETS if t not in synthetic)})")
        if self.prompt_template not in PROTOCOLS and self.prompt_template not in ("chat", "none"):
            raise bad("prompt_template", f"must be chat, none or an areal eval protocol ({', '.join(PROTOCOLS)})")
        if kind == "async-ppo" and self.max_head_offpolicyness == 0:
            raise bad("max_head_offpolicyness", "kind async-ppo needs eta > 0 (eta = 0 is sync-ppo)")
        if kind == "sync-ppo" and self.max_head_offpolicyness != 0:
            raise bad("max_head_offpolicyness", "kind sync-ppo needs eta = 0")


#: PublishedTrainSpec field -> AReaL v0.3 (realhf) config key, for fields whose names differ.
AREAL_KEYS = {
    "task": "(dataset.type math_code_prompt + the math/code reward of the agent)",
    "prompt_template": "(AReaL v0.3 tokenises the record's prompt as is)",
    "max_steps": "(PPO steps; exp_ctrl has epochs only)", "epochs": "exp_ctrl.total_train_epochs",
    "batch_size": "dataset.train_bs_n_seqs", "max_prompt_len": "dataset.max_prompt_len",
    "max_new_tokens": "ppo.gen.max_new_tokens", "min_new_tokens": "ppo.gen.min_new_tokens",
    "temperature": "ppo.gen.temperature", "top_p": "ppo.gen.top_p", "top_k": "ppo.gen.top_k",
    "ppo_n_minibatches": "ppo.ppo_n_minibatches", "actor_sample_reuse": "ppo.actor_sample_reuse",
    "eps_clip": "ppo.eps_clip", "c_clip": "ppo.c_clip", "recompute_logprob": "ppo.recompute_logprob",
    "use_decoupled_loss": "ppo.use_decoupled_loss", "behav_imp_weight_cap": "ppo.behav_imp_weight_cap",
    "early_stop_imp_ratio": "ppo.early_stop_imp_ratio", "kl_ctl": "ppo.kl_ctl",
    "adv_norm": "ppo.adv_norm + group_adv_norm", "discount": "ppo.discount", "gae_lambda": "ppo.gae_lambda",
    "reward_scaling": "ppo.reward_output_scaling", "reward_bias": "ppo.reward_output_bias",
    "max_reward_clip": "ppo.max_reward_clip", "lr": "actor.optimizer.lr",
    "lr_scheduler": "actor.optimizer.lr_scheduler_type", "warmup_proportion": "actor.optimizer.warmup_steps_proportion",
    "weight_decay": "actor.optimizer.weight_decay", "adam_beta1": "actor.optimizer.beta1",
    "adam_beta2": "actor.optimizer.beta2", "adam_eps": "actor.optimizer.eps",
    "grad_clip": "actor.optimizer.gradient_clipping", "dtype": "actor.bf16",
    "initial_loss_scale": "actor.optimizer.initial_loss_scale", "loss_scale_window": "actor.optimizer.loss_scale_window",
    "hysteresis": "actor.optimizer.hysteresis", "gradient_checkpointing": "actor.gradient_checkpointing",
    "max_tokens_per_mb": "actor_train/actor_inf/ref_inf.mb_spec.max_tokens_per_mb",
    "sglang_context_length": "actor.sglang.context_length",
    "sglang_mem_fraction_static": "actor.sglang.mem_fraction_static", "sglang_dtype": "actor.sglang.dtype",
    "sglang_max_running_requests": "actor.sglang.max_running_requests",
    "sglang_attention_backend": "actor.sglang.attention_backend", "sglang_schedule_policy": "actor.sglang.schedule_policy",
    "save_freq_steps": "exp_ctrl.save_freq_steps", "save_freq_epochs": "exp_ctrl.save_freq_epochs",
    "ckpt_freq_secs": "exp_ctrl.ckpt_freq_secs",
}


@dataclass
class SftSpec:
    """Supervised fine-tuning settings (AReaL ``sft`` experiment). Every key required."""

    seed: int
    epochs: int  # exp_ctrl.total_train_epochs
    batch_size: int  # sequences per step (dataset.train_bs_n_seqs)
    max_seqlen: int  # prompt + answer tokens
    lr: float
    lr_scheduler: Literal["constant", "linear", "cosine"]
    warmup_proportion: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    grad_clip: float
    dtype: Literal["fp16", "bf16", "fp32"]
    initial_loss_scale: float | None
    loss_scale_window: float | None
    hysteresis: int | None
    max_tokens_per_mb: int
    save_freq_epochs: int | None
    ckpt_freq_secs: int | None

    def validate(self) -> None:
        """Raises: UserError ``file:line: field 'sft.x': why``."""
        def bad(name: str, why: str) -> UserError:
            return UserError(f"{where(self, name)}: field 'sft.{name}': {why} (got {getattr(self, name)!r})")

        for name in ("epochs", "batch_size", "max_seqlen", "max_tokens_per_mb"):
            if getattr(self, name) <= 0:
                raise bad(name, "must be > 0")
        for name in ("lr", "adam_eps", "grad_clip"):
            if not getattr(self, name) > 0:
                raise bad(name, "must be > 0")
        for name in ("warmup_proportion", "adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) <= 1:
                raise bad(name, "must be in [0, 1]")
        if self.weight_decay < 0:
            raise bad("weight_decay", "must be >= 0")


@dataclass
class Variant:
    """A named twin of the recipe: ``train`` overrides (e.g. ``sync``: eta 0, standard PPO)."""

    description: str
    train: dict


@dataclass
class Resources:
    """Hardware of the published run. ``allocation``: AReaL's allocation string, whose GPU count
    (sum over parts of the product of d/p/m/t degrees) must equal ``gpus``."""

    gpus: int
    nodes: int
    gpus_per_node: int
    allocation: str | None
    note: str | None = None


@dataclass
class EvalSpec:
    """How the published numbers were measured. ``date_windows``: benchmark -> ``FROM..TO``
    (``YYYY-MM-DD``, both inclusive, the ``--date-from`` / ``--date-to`` of ``areal eval``)."""

    protocol: str
    benchmarks: list[str]
    n_samples: int
    temperature: float
    top_p: float
    max_new_tokens: int
    date_windows: dict[str, str] = field(default_factory=dict)
    note: str | None = None


@dataclass
class RecipeFile:
    """The raw top level of a recipe file (``train`` kept as a mapping until ``trainer`` is known)."""

    recipe: str
    description: str
    source: Source
    kind: Literal["async-ppo", "sync-ppo", "sft"]
    trainer: Literal["cpu", "gpu"]
    model: HubRef
    data: DataRef
    resources: Resources
    eval: EvalSpec
    expected: str
    published_model: HubRef | None = None
    train: dict | None = None
    variants: dict[str, Variant] = field(default_factory=dict)
    sft: SftSpec | None = None

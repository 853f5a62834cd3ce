"""Locked recipes: one YAML file per published result, its expected metrics, and the pass/fail comparison.

A *locked recipe* (``recipes/<name>.yaml``) pins everything needed to re-run one published number: the
model and data (Hub repo + 40-hex commit, or a built-in), every training hyperparameter, the resources
and the evaluation protocol. Its *expected-metrics file* (``recipes/<name>.expected.yaml``) carries each
published number with its source and a tolerance derived from sampling error (``recipes/README.md``).

Sections of a recipe (all keys are checked; unknown keys, wrong types and missing required keys are a
:class:`~areal_cli.errors.UserError` ``file:line: field 'section.key': ...`` at every nesting level):

- ``recipe`` (name = file stem), ``description``, ``source`` (where the settings come from),
  ``kind`` (``async-ppo`` | ``sync-ppo`` | ``sft``), ``trainer`` (``cpu`` | ``gpu``).
- ``model`` / ``published_model`` / ``data``: Hub references. ``revision`` is a 40-hex commit or
  ``null`` with a ``revision_note`` saying why (``areal download`` then refuses without ``--allow-unpinned``).
- ``train``: for ``trainer: cpu`` the keys of :class:`areal_cli.config.TrainConfig` (coerced and
  validated by config.py itself, so the CPU trainer and the recipe can never disagree); for
  ``trainer: gpu`` the keys of :class:`PublishedTrainSpec` (AReaL's settings, every key required:
  a locked recipe states each value, even when it is AReaL's default).
- ``variants`` (optional): named ``train`` overrides, e.g. the synchronous twin of an async run.
- ``sft``: :class:`SftSpec` (for ``kind: sft`` instead of ``train``).
- ``resources``: GPUs, nodes, AReaL allocation string (its GPU count must equal ``gpus``).
- ``eval``: protocol, benchmarks, samples, sampling settings.
- ``expected``: the expected-metrics file, relative to the recipe's folder (else the recipes folder).

Why the ``trainer`` key decides the schema of ``train``: the CPU trainer and AReaL's GPU system have
different settings; one file format with two strict schemas keeps both locked without a grab-bag of
optional keys. Imports: yaml and stdlib only (``areal --help`` stays fast).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from areal_cli.config import _FIELDS as TRAIN_CONFIG_FIELDS
from areal_cli.config import TrainConfig, _coerce, find_recipe_file, known_recipes, resolve_paths
from areal_cli.errors import UserError
from areal_cli.resources import shipped_dir

# --- vocabularies ------------------------------------------------------------------------------------
# Protocol names come from areal_cli/eval/protocols.py and eval benchmark names from evaluation/benchmarks.json
# (read when a recipe is validated, see eval_vocabulary()), so recipes cannot name what `areal eval` lacks.

#: Benchmarks with published numbers that ``areal eval`` cannot run yet: entries must say ``evaluated: false``.
UNSUPPORTED_BENCHMARKS = {"gpqa_diamond": "not yet supported by areal eval"}
#: Held-out sets measured inside a training run (not by ``areal eval``).
TRAINING_BENCHMARKS = ("tiny-arith", "mini-math", "mini-code", "tiny-longtail")
#: Pseudo-benchmark for wall-clock figures of a training run.
TRAINING_FIGURES = "training"
#: The data card (``data_cards/``) of every benchmark a recipe may name.
BENCHMARK_CARDS = {
    "aime24": "math-eval.md", "aime25": "math-eval.md", "amc23": "math-eval.md", "math_500": "math-eval.md",
    "lcb_v5": "lcb_v5.md", "codecontests": "codecontests.md", "codeforces": "codeforces.md",
    "gpqa_diamond": "gpqa-diamond.md", "tiny-arith": "tiny-arith.md", "mini-math": "boba-106k-mini.md",
    "mini-code": "boba2-rl-code-mini.md", "tiny-longtail": "tiny-longtail.md",
}


def eval_vocabulary() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(protocol names, benchmark names a recipe may use): ``areal eval``'s protocols; its declared
    benchmarks plus :data:`UNSUPPORTED_BENCHMARKS` and :data:`TRAINING_BENCHMARKS`."""
    from areal_cli.eval.benchmarks import load_benchmark_specs
    from areal_cli.eval.protocols import PROTOCOLS

    benchmarks = tuple(sorted(load_benchmark_specs())) + tuple(UNSUPPORTED_BENCHMARKS) + TRAINING_BENCHMARKS
    return tuple(PROTOCOLS), benchmarks


_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


# --- YAML with line numbers --------------------------------------------------------------------------


class LineDict(dict):
    """A mapping from YAML that remembers where it is: ``line`` (its first line) and ``lines[key]``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.line: int = 1
        self.lines: dict = {}

    def at(self, key: str) -> int:
        return self.lines.get(key, self.line)


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # the C parser when PyYAML has libyaml
    """SafeLoader whose mappings are :class:`LineDict` and that rejects duplicate keys.

    Dates stay strings (no implicit timestamp resolver): ``2024-10-01`` in a recipe is text.
    """


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_mapping(loader: _Loader, node: yaml.MappingNode):
    data = LineDict()
    data.line = node.start_mark.line + 1
    yield data
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in data.lines:
            raise _DuplicateKey(str(key), line, data.lines[key])
        data.lines[key] = line
        data[key] = loader.construct_object(value_node, deep=True)


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def read_yaml(path: Path) -> Any:
    """Parse ``path`` into plain values whose mappings are :class:`LineDict`.

    Raises:
        UserError: unreadable file, not UTF-8, invalid YAML (with line), duplicate key (with both lines).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not a UTF-8 text file (byte {e.start})") from None
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except _DuplicateKey as e:
        raise UserError(f"{path}:{e.line}: field '{e.key}': duplicate key (first at line {e.first})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise UserError(f"{path}{line}: invalid YAML: {getattr(e, 'problem', None) or e}") from None


# --- typed sections, built from LineDicts ------------------------------------------------------------


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if typing.get_origin(tp) is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if typing.get_origin(tp) is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, file: Path, name: str, line: int) -> Any:
    """Check ``value`` against the annotation ``tp`` (strict: YAML types must match; int is accepted for
    float). Returns the value (dataclasses built, floats made float).

    Raises:
        UserError: ``file:line: field 'name': expected T, got V``.
    """
    def bad() -> UserError:
        got = "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list) else repr(value)
        return UserError(f"{file}:{line}: field '{name}': expected {_type_name(tp)}, got {got}")

    origin = typing.get_origin(tp)
    if isinstance(tp, types.UnionType) or origin is typing.Union:
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise bad()
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, file, name, line)
            except UserError:
                continue
        raise bad()
    if value is None:
        raise UserError(f"{file}:{line}: field '{name}': must not be null (expected {_type_name(tp)})")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise UserError(f"{file}:{line}: field '{name}': must be one of {_type_name(tp)}, got {value!r}")
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad()
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise bad()
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad()
    if origin is list:
        if not isinstance(value, list):
            raise bad()
        (item_tp,) = typing.get_args(tp)
        return [_convert(v, item_tp, file, f"{name}[{i}]", getattr(v, "line", line)) for i, v in enumerate(value)]
    if tp is dict:  # a raw section (validated later by its own schema): keep its line numbers
        if not isinstance(value, dict):
            raise bad()
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise bad()
        val_tp = typing.get_args(tp)[1] if typing.get_args(tp) else Any
        return {str(k): _convert(v, val_tp, file, f"{name}.{k}", value.at(k) if isinstance(value, LineDict)
                                 else line) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, file, name, line)
    raise TypeError(f"unsupported annotation {tp!r}")  # a schema bug, not bad input


def build(cls: type, data: Any, file: Path, prefix: str = "", line: int = 1) -> Any:
    """Build dataclass ``cls`` from the YAML mapping ``data``, checking every key.

    Every dataclass field without a default is required. The built object remembers where it came from
    (``obj.__source__ = (file, {field: line}, line)``) so later checks can report ``file:line``.

    Raises:
        UserError: not a mapping, unknown key (lists the known keys), missing required key, wrong type.
    """
    if not isinstance(data, dict):
        what = f"field '{prefix}'" if prefix else "the file"
        raise UserError(f"{file}:{line}: {what}: expected a mapping of key: value, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    lines = dict(data.lines) if isinstance(data, LineDict) else {}
    here = data.line if isinstance(data, LineDict) else line
    kwargs = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        kline = lines.get(key, here)
        if key not in fields:
            known = ", ".join(fields)
            raise UserError(f"{file}:{kline}: field '{name}': unknown key (known: {known})")
        kwargs[key] = _convert(value, hints[key], file, name, kline)
    for f in fields.values():
        if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            name = f"{prefix}.{f.name}" if prefix else f.name
            raise UserError(f"{file}:{here}: field '{name}': required key missing")
    obj = cls(**kwargs)
    object.__setattr__(obj, "__source__", (file, lines, here))
    return obj


def where(obj: Any, key: str | None = None) -> str:
    """``file:line`` of ``obj`` (built by :func:`build`) or of one of its keys."""
    file, lines, line = getattr(obj, "__source__", ("?", {}, 1))
    return f"{file}:{lines.get(key, line) if key else line}"


# --- recipe sections ---------------------------------------------------------------------------------


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


@dataclass
class Recipe:
    """A validated locked recipe. ``train`` is a :class:`TrainConfig` (trainer cpu) or a
    :class:`PublishedTrainSpec` (trainer gpu); None for ``kind: sft`` (see ``file.sft``). ``expected`` is
    its validated expected-metrics file."""

    name: str
    path: Path
    file: RecipeFile
    train: TrainConfig | PublishedTrainSpec | None
    expected_path: Path
    expected: ExpectedFile | None = None

    @property
    def kind(self) -> str:
        return self.file.kind

    @property
    def trainer(self) -> str:
        return self.file.trainer

    def variant(self, name: str | None) -> TrainConfig | PublishedTrainSpec | None:
        """The train settings of variant ``name`` (None: the recipe's own).

        Raises:
            UserError: unknown variant (lists the known ones).
        """
        if name is None:
            return self.train
        if name not in self.file.variants:
            known = ", ".join(self.file.variants) or "none"
            raise UserError(f"{self.path}: recipe '{self.name}' has no variant '{name}' (known: {known})")
        return _apply_variant(self, name)


# --- loading -----------------------------------------------------------------------------------------


def recipe_names() -> list[str]:
    """Names of the recipes in the user's recipe folders and the shipped ones (``<name>.yaml``, not
    ``*.expected.yaml``; :mod:`areal_cli.resources`)."""
    return known_recipes()


def recipe_path(name_or_path: str | Path) -> Path:
    """Resolve a recipe name (``recipes/NAME.yaml``) or a path to a ``.yaml`` file.

    Raises:
        UserError: unknown recipe name (lists the known ones) or missing file.
    """
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise UserError(f"{p}: recipe file not found")
        return p
    p = find_recipe_file(str(name_or_path))
    if p is not None and not str(name_or_path).endswith(".expected"):
        return p
    raise UserError(f"unknown recipe '{name_or_path}' (known: {', '.join(recipe_names()) or 'none'})")


def load_recipe(name_or_path: str | Path) -> Recipe:
    """Load and validate a locked recipe (and check its expected-metrics file exists and agrees).

    Raises:
        UserError: ``file:line: field 'x.y': what`` for any unknown key, wrong type, missing key or bad
            value at any nesting level; unknown recipe name.
    """
    path = recipe_path(name_or_path)
    raw = read_yaml(path)
    rf: RecipeFile = build(RecipeFile, raw if raw is not None else {}, path)
    name = path.name[: -len(path.suffix)]
    if rf.recipe != name:
        raise UserError(f"{where(rf, 'recipe')}: field 'recipe': must equal the file name '{name}' "
                        f"(got {rf.recipe!r})")
    _check_hub(rf.model, "model")
    if rf.published_model is not None:
        _check_hub(rf.published_model, "published_model")
    _check_hub(rf.data, "data")
    _check_data(rf.data)
    _check_resources(rf)
    _check_eval(rf.eval)

    train: TrainConfig | PublishedTrainSpec | None = None
    if rf.kind == "sft":
        if rf.sft is None:
            raise UserError(f"{path}:{raw.line}: field 'sft': required key missing (kind is sft)")
        if rf.train is not None:
            raise UserError(f"{where(rf, 'train')}: field 'train': not allowed with kind sft (use 'sft')")
        rf.sft.validate()
    else:
        if rf.train is None:
            raise UserError(f"{path}:{raw.line}: field 'train': required key missing (kind is {rf.kind})")
        if rf.sft is not None:
            raise UserError(f"{where(rf, 'sft')}: field 'sft': only allowed with kind sft")
        train = _build_train(rf, rf.train, path, kind=rf.kind, prefix="train")
    if rf.variants and rf.kind == "sft":
        raise UserError(f"{where(rf, 'variants')}: field 'variants': variants override 'train'; kind sft has none")
    recipe = Recipe(name=name, path=path, file=rf, train=train, expected_path=_expected_path(rf, path))
    for vname in rf.variants:
        _apply_variant(recipe, vname)  # validates every variant now
    recipe.expected = load_expected(recipe)  # the expected file must exist and agree with the recipe
    return recipe


def _expected_path(rf: RecipeFile, path: Path) -> Path:
    rel = Path(rf.expected)
    shipped = shipped_dir("recipes")
    for base in (path.parent, shipped):
        if (base / rel).is_file():
            return base / rel
    raise UserError(f"{where(rf, 'expected')}: field 'expected': file '{rf.expected}' not found next to the "
                    f"recipe or in {shipped}")


def _check_hub(ref: HubRef, section: str) -> None:
    if (ref.repo is None) == (ref.builtin is None):
        raise UserError(f"{where(ref)}: field '{section}': give exactly one of 'repo' (Hugging Face) or 'builtin'")
    if ref.builtin is not None:
        if ref.revision is not None:
            raise UserError(f"{where(ref, 'revision')}: field '{section}.revision': a builtin has no revision")
        return
    if not _REPO_ID.match(ref.repo):
        raise UserError(f"{where(ref, 'repo')}: field '{section}.repo': not a Hub repo id 'owner/name' "
                        f"(got {ref.repo!r})")
    if ref.revision is None:
        if not ref.revision_note:
            raise UserError(f"{where(ref, 'revision')}: field '{section}.revision': null revision needs a "
                            f"'revision_note' saying why it is not pinned")
    elif not _SHA1.match(ref.revision):
        raise UserError(f"{where(ref, 'revision')}: field '{section}.revision': must be a 40-hex commit SHA or "
                        f"null (got {ref.revision!r})")


def _check_data(data: DataRef) -> None:
    if data.repo is not None and not data.files:
        raise UserError(f"{where(data)}: field 'data.files': list the files the recipe trains on")
    for i, f in enumerate(data.files):
        if f.sha256 is not None and not _SHA256.match(f.sha256):
            raise UserError(f"{where(f, 'sha256')}: field 'data.files[{i}].sha256': must be 64 lowercase hex "
                            f"digits or null (got {f.sha256!r})")
    if data.repo is not None and any(f.sha256 is None for f in data.files) and not data.checksum_note:
        raise UserError(f"{where(data)}: field 'data.checksum_note': files without sha256 need a note saying why")
    if not data.card:
        raise UserError(f"{where(data)}: field 'data.card': name the data card (data_cards/<card>)")


def allocation_gpus(allocation: str) -> int:
    """GPUs used by an AReaL allocation string: ``sglang.d80m2p1+d4m2p4`` -> 80*2*1 + 4*2*4 = 192
    (parsed by :func:`areal_cli.placement.parse_allocation`, the one parser of these strings).

    Raises:
        ValueError: not of that form (the message names the bad part).
    """
    from areal_cli.placement import parse_allocation

    try:
        return parse_allocation(allocation).total
    except UserError as e:
        raise ValueError(str(e)) from None


def _check_resources(rf: RecipeFile) -> None:
    r = rf.resources
    if r.gpus != r.nodes * r.gpus_per_node:
        raise UserError(f"{where(r, 'gpus')}: field 'resources.gpus': must equal nodes * gpus_per_node = "
                        f"{r.nodes * r.gpus_per_node} (got {r.gpus})")
    if rf.trainer == "cpu":
        if r.gpus != 0 or r.allocation is not None:
            raise UserError(f"{where(r, 'gpus')}: field 'resources.gpus': trainer cpu uses no GPUs and no allocation")
        return
    if r.allocation is None:
        if not r.note:
            raise UserError(f"{where(r, 'allocation')}: field 'resources.allocation': null needs a 'note' saying why")
        return
    try:
        n = allocation_gpus(r.allocation)
    except ValueError as e:
        raise UserError(f"{where(r, 'allocation')}: field 'resources.allocation': {e}") from None
    if n != r.gpus:
        raise UserError(f"{where(r, 'allocation')}: field 'resources.allocation': uses {n} GPUs but "
                        f"resources.gpus is {r.gpus}")


def _check_eval(ev: EvalSpec) -> None:
    protocols, benchmarks = eval_vocabulary()
    if ev.protocol not in protocols:
        raise UserError(f"{where(ev, 'protocol')}: field 'eval.protocol': unknown protocol {ev.protocol!r} "
                        f"(known: {', '.join(protocols)})")
    for b in ev.benchmarks:
        if b not in benchmarks:
            raise UserError(f"{where(ev, 'benchmarks')}: field 'eval.benchmarks': unknown benchmark {b!r} "
                            f"(known: {', '.join(benchmarks)})")
    for b, window in ev.date_windows.items():
        if b not in ev.benchmarks:
            raise UserError(f"{where(ev, 'date_windows')}: field 'eval.date_windows.{b}': not in eval.benchmarks")
        if not re.match(r"^\d{4}-\d{2}-\d{2}\.\.\d{4}-\d{2}-\d{2}$", window):
            raise UserError(f"{where(ev, 'date_windows')}: field 'eval.date_windows.{b}': expected "
                            f"'YYYY-MM-DD..YYYY-MM-DD' (got {window!r})")
    if ev.n_samples <= 0 or ev.max_new_tokens <= 0:
        raise UserError(f"{where(ev, 'n_samples')}: field 'eval.n_samples': n_samples and max_new_tokens must be > 0")
    if ev.temperature < 0 or not 0 < ev.top_p <= 1:
        raise UserError(f"{where(ev, 'temperature')}: field 'eval.temperature': need temperature >= 0 and "
                        f"0 < top_p <= 1")


def _build_train(rf: RecipeFile, data: dict, path: Path, *, kind: str | None,
                 prefix: str) -> TrainConfig | PublishedTrainSpec:
    """Build the train settings for ``rf.trainer``; ``kind`` (None: no kind rule) checks eta."""
    if rf.trainer == "gpu":
        line = data.line if isinstance(data, LineDict) else 1
        spec = build(PublishedTrainSpec, data, path, prefix, line)
        spec.validate(kind=kind)
        return spec
    return _build_cpu_train(data, path, prefix, name=rf.recipe, kind=kind)


def _build_cpu_train(data: dict, path: Path, prefix: str, *, name: str, kind: str | None) -> TrainConfig:
    """The ``train`` section of a ``trainer: cpu`` recipe, with config.py's own coercion (``_coerce``) and
    validation (``TrainConfig.validate``), so a recipe and ``areal train -o`` accept the same values."""
    cfg = TrainConfig()
    lines: dict[str, int] = {}
    for key, value in data.items():
        line = data.at(key) if isinstance(data, LineDict) else 1
        if key == "recipe":
            raise UserError(f"{path}:{line}: field '{prefix}.recipe': unknown key (the recipe name is the "
                            f"top-level 'recipe')")
        if key not in TRAIN_CONFIG_FIELDS:
            raise UserError(f"{path}:{line}: field '{prefix}.{key}': unknown key (known: TrainConfig fields, "
                            f"see areal_cli/config.py)")
        setattr(cfg, key, _coerce(key, value, f"{path}:{line}"))
        lines[key] = line
    cfg.recipe = name
    cfg.validate(str(path), lines)
    resolve_paths(cfg, path.parent, set(data))
    eta_line = f"{path}:{lines.get('max_head_offpolicyness', data.line if isinstance(data, LineDict) else 1)}"
    if kind == "sync-ppo" and cfg.max_head_offpolicyness != 0:
        raise UserError(f"{eta_line}: field '{prefix}.max_head_offpolicyness': kind sync-ppo needs eta = 0")
    if kind == "async-ppo" and cfg.max_head_offpolicyness == 0:
        raise UserError(f"{eta_line}: field '{prefix}.max_head_offpolicyness': kind async-ppo needs eta > 0")
    return cfg


def _apply_variant(recipe: Recipe, name: str) -> TrainConfig | PublishedTrainSpec:
    """The recipe's ``train`` with variant ``name``'s overrides, validated (no kind/eta rule: a variant
    may be the synchronous twin of an async recipe)."""
    rf = recipe.file
    base, over = rf.train or LineDict(), rf.variants[name].train
    merged = LineDict({**base, **over})
    merged.line = getattr(base, "line", 1)
    merged.lines = {**getattr(base, "lines", {}), **getattr(over, "lines", {})}
    return _build_train(rf, merged, recipe.path, kind=None, prefix=f"variants.{name}.train")


def train_config_from_recipe(recipe: Recipe | str | Path, variant: str | None = None) -> TrainConfig:
    """The :class:`TrainConfig` of a recipe (what ``areal train`` runs): a ``trainer: cpu`` recipe's ``train``
    section, or a published RL recipe mapped by :func:`areal_cli.gpu_recipe.gpu_train_config` (SGLang servers
    and trainer degrees of its allocation; ``model_path`` and ``dataset`` left for the caller: the downloaded
    base model and data file).

    Raises:
        UserError: an SFT recipe (``areal reproduce`` runs it); a setting areal cannot run; unknown variant.
    """
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe)
    if recipe.trainer != "cpu":
        if recipe.kind == "sft":
            raise UserError(f"{recipe.path}: recipe '{recipe.name}' is supervised fine-tuning; `areal reproduce "
                            f"{recipe.name}` runs it (`areal train` runs RL)")
        from areal_cli.gpu_recipe import gpu_train_config

        return gpu_train_config(recipe, variant)[0]
    cfg = recipe.variant(variant)
    assert isinstance(cfg, TrainConfig)
    return dataclasses.replace(cfg)


# --- expected metrics --------------------------------------------------------------------------------

#: Default z for tolerances: |measured - published| <= z * sd(difference).
Z_DEFAULT = 3.0
#: Codeforces: contests in AReaL's Codeforces set (docs/tutorial/eval.md "57 Codeforces contests").
CF_CONTESTS = 57
#: Codeforces: assumed SD of one contest's performance rating, Elo points (Elo's per-game performance
#: model: each player's performance ~ Normal(sd 200), so a difference has sd 200*sqrt(2) ~= 283).
CF_SIGMA_CONTEST = 200 * math.sqrt(2)
#: Codeforces percentile per Elo point near 1880-2050, from the published (rating, percentile) pairs
#: Qwen3-8B 1879/96.7 and AReaL-boba2-14B 2044/98.2: (98.2 - 96.7) / (2044 - 1879).
CF_PERCENTILE_PER_ELO = (98.2 - 96.7) / (2044 - 1879)

Mode = Literal["eval_only", "retrain"]


def binomial_tolerance(p: float, n_problems: int, n_samples: int, z: float = Z_DEFAULT) -> dict[str, float]:
    """Tolerance for a mean-of-samples score (pass@1, accuracy), as a fraction.

    The published value and a re-measurement are two independent draws of the same estimator, so the
    tolerance bounds their difference: ``z * sqrt(2 * var)``.

    - eval_only (re-evaluating the fixed published checkpoint): the estimator averages k samples on each
      of N problems; Var = (1/N^2) sum_i p_i(1-p_i)/k <= p(1-p)/(N k) (concavity of p(1-p)).
    - retrain (a retrained model): per-problem scores are any [0,1] variables with mean m_i, whose variance
      is at most m_i(1-m_i), so Var <= p(1-p)/N if problems are independent (systematic run-to-run
      shifts are not covered).

    Args:
        p: the published value as a fraction in [0, 1]; n_problems: N; n_samples: k per problem.
    Returns:
        ``{"eval_only": z*sqrt(2 p(1-p)/(N k)), "retrain": z*sqrt(2 p(1-p)/N)}`` (fractions).
    """
    if not 0 <= p <= 1 or n_problems <= 0 or n_samples <= 0:
        raise ValueError(f"need 0 <= p <= 1, N > 0, k > 0 (got p={p}, N={n_problems}, k={n_samples})")
    var = p * (1 - p)
    return {"eval_only": z * math.sqrt(2 * var / (n_problems * n_samples)),
            "retrain": z * math.sqrt(2 * var / n_problems)}


def codeforces_rating_tolerance(n_contests: int = CF_CONTESTS, z: float = Z_DEFAULT,
                                sigma: float = CF_SIGMA_CONTEST) -> float:
    """Tolerance on the Codeforces rating (Elo points) = z * sqrt(2) * sigma / sqrt(C).

    AReaL's rating is the mean over C contests of a per-contest performance rating; assuming those are
    independent with SD ``sigma`` (:data:`CF_SIGMA_CONTEST`), the mean has SD sigma/sqrt(C), and the
    difference of two such means sqrt(2) times that. Same for eval_only and retrain (the contest-level
    spread dominates). With C = 57, z = 3: 159 Elo.
    """
    return z * math.sqrt(2) * sigma / math.sqrt(n_contests)


@dataclass
class Tolerance:
    """Allowed |measured - published| in the metric's unit, per reproduction mode."""

    eval_only: float
    retrain: float


@dataclass
class ExpectedMetric:
    """One published number.

    ``model``: which weights the number belongs to: ``published`` (the released checkpoint; also the target
    of a retrain), ``base`` (the starting model), ``trained`` (only obtainable by retraining: no released
    checkpoint). ``check``: ``within`` (|m - v| <= tol), ``at_least`` (m >= v - tol), ``report`` (shown,
    never pass/fail: e.g. hardware-dependent wall-clock hours).
    """

    benchmark: str
    metric: str
    unit: Literal["percent", "fraction", "elo", "hours", "ratio", "count"]
    value: float
    model: Literal["published", "base", "trained"]
    check: Literal["within", "at_least", "report"]
    source: str
    tolerance_formula: Literal["binomial-mean", "codeforces-rating", "codeforces-percentile", "target", "none"]
    variant: str | None = None
    headline: bool = False
    evaluated: bool = True
    evaluated_note: str | None = None
    n_problems: int | None = None
    n_samples: int | None = None
    n_contests: int | None = None
    tolerance: Tolerance | None = None
    eval_overrides: dict = field(default_factory=dict)
    note: str | None = None

    @property
    def key(self) -> str:
        """``benchmark/metric`` plus ``@variant`` and ``#model`` when not the defaults: the key of
        measured values passed to :func:`compare`."""
        k = f"{self.benchmark}/{self.metric}"
        if self.variant:
            k += f"@{self.variant}"
        if self.model == "base":
            k += "#base"
        return k


@dataclass
class ExpectedFile:
    recipe: str
    z: float
    metrics: list[ExpectedMetric]


_EVAL_OVERRIDE_KEYS = {"temperature": float, "top_p": float, "n_samples": int, "protocol": str, "max_new_tokens": int}


def load_expected(recipe: Recipe) -> ExpectedFile:
    """Load and validate ``recipe``'s expected-metrics file.

    Checks, each reported as ``file:line: field 'metrics[i].x'``: schema; recipe name; benchmarks named
    by the recipe's eval section (or ``training`` / in-training sets); variants exist; ``published`` needs a
    published checkpoint; unsupported benchmarks say ``evaluated: false``; every stored tolerance equals
    its formula (so the file cannot drift from recipes/README.md).
    """
    path = recipe.expected_path
    raw = read_yaml(path)
    ef: ExpectedFile = build(ExpectedFile, raw if raw is not None else {}, path)
    if ef.recipe != recipe.name:
        raise UserError(f"{where(ef, 'recipe')}: field 'recipe': must be '{recipe.name}' (got {ef.recipe!r})")
    if not ef.metrics:
        raise UserError(f"{where(ef, 'metrics')}: field 'metrics': at least one expected metric")
    ev = recipe.file.eval
    seen: dict[str, int] = {}
    for i, m in enumerate(ef.metrics):
        def bad(key: str, why: str, m=m, i=i) -> UserError:
            return UserError(f"{where(m, key)}: field 'metrics[{i}].{key}': {why}")

        if m.key in seen:
            raise bad("benchmark", f"duplicate entry {m.key} (first is metrics[{seen[m.key]}])")
        seen[m.key] = i
        if m.benchmark != TRAINING_FIGURES and m.benchmark not in ev.benchmarks:
            raise bad("benchmark", f"{m.benchmark!r} is not in the recipe's eval.benchmarks {ev.benchmarks}")
        if m.variant is not None and m.variant not in recipe.file.variants:
            raise bad("variant", f"unknown variant {m.variant!r} (recipe has: {', '.join(recipe.file.variants) or 'none'})")
        if m.model == "published" and recipe.file.published_model is None:
            raise bad("model", "'published' needs a published_model in the recipe (use 'trained')")
        if m.benchmark in UNSUPPORTED_BENCHMARKS and m.evaluated:
            raise bad("evaluated", f"{m.benchmark} is {UNSUPPORTED_BENCHMARKS[m.benchmark]}: set evaluated: false")
        if not m.evaluated and not m.evaluated_note:
            raise bad("evaluated_note", "evaluated: false needs a note saying why")
        for k, v in m.eval_overrides.items():
            if k not in _EVAL_OVERRIDE_KEYS or not isinstance(v, _EVAL_OVERRIDE_KEYS[k]) or isinstance(v, bool):
                raise bad("eval_overrides", f"{k}={v!r}: allowed keys {sorted(_EVAL_OVERRIDE_KEYS)} with their eval types")
        _check_tolerance(m, ef.z, recipe, bad)
    return ef


def _scale(unit: str) -> float:
    return 100.0 if unit == "percent" else 1.0


def expected_tolerance(m: ExpectedMetric, z: float) -> Tolerance | None:
    """The tolerance ``m`` must carry according to its formula (None when it has none).

    Raises:
        ValueError: the entry lacks what the formula needs (N, k, C).
    """
    f = m.tolerance_formula
    if f == "binomial-mean":
        if m.n_problems is None or m.n_samples is None:
            return None  # derived at compare time from the measured N (see compare)
        s = _scale(m.unit)
        t = binomial_tolerance(m.value / s, m.n_problems, m.n_samples, z)
        return Tolerance(eval_only=t["eval_only"] * s, retrain=t["retrain"] * s)
    if f == "codeforces-rating":
        t = codeforces_rating_tolerance(m.n_contests or CF_CONTESTS, z)
        return Tolerance(t, t)
    if f == "codeforces-percentile":
        t = CF_PERCENTILE_PER_ELO * codeforces_rating_tolerance(m.n_contests or CF_CONTESTS, z)
        return Tolerance(t, t)
    if f == "target":
        return Tolerance(0.0, 0.0)
    return None


def _check_tolerance(m: ExpectedMetric, z: float, recipe: Recipe, bad) -> None:
    if m.tolerance_formula == "binomial-mean":
        if m.unit not in ("percent", "fraction"):
            raise bad("unit", "binomial-mean needs unit percent or fraction")
        if not 0 <= m.value / _scale(m.unit) <= 1:
            raise bad("value", f"{m.value} is not a {m.unit} in [0, 1]")
        if m.n_samples is None:
            raise bad("n_samples", "binomial-mean needs n_samples (samples per problem)")
    if m.tolerance_formula.startswith("codeforces") and m.n_contests is None:
        raise bad("n_contests", "a Codeforces tolerance needs n_contests")
    if m.check == "report":
        if m.tolerance is not None or m.tolerance_formula != "none":
            raise bad("check", "a 'report' entry has tolerance: null and tolerance_formula: none")
        return
    if m.tolerance_formula == "none":
        raise bad("tolerance_formula", f"check '{m.check}' needs a tolerance formula")
    want = expected_tolerance(m, z)
    if want is None:
        if m.tolerance is not None:
            raise bad("tolerance", "must be null when n_problems is unknown (derived from the measured run)")
        if m.tolerance_formula == "binomial-mean" and m.n_problems is None and not m.note:
            raise bad("note", "n_problems: null needs a note saying why")
        return
    if m.tolerance is None:
        raise bad("tolerance", f"missing; the formula gives eval_only={want.eval_only:.2f}, retrain={want.retrain:.2f}")
    for mode in ("eval_only", "retrain"):
        got, exp = getattr(m.tolerance, mode), getattr(want, mode)
        if abs(got - exp) > 0.01 * abs(exp) + 1e-9:  # files store 4 significant digits
            raise bad("tolerance", f"{mode}={got} disagrees with {m.tolerance_formula} (z={z}): {exp:.4g}")


# --- comparison --------------------------------------------------------------------------------------


@dataclass
class Measured:
    """One measured figure: value in the expected entry's unit; ``n_problems`` lets :func:`compare`
    derive a tolerance when the expected entry cannot (unknown N)."""

    value: float
    n_problems: int | None = None
    n_samples: int | None = None


@dataclass
class Check:
    """One row of a reproduction report."""

    key: str
    benchmark: str
    metric: str
    expected: float
    measured: float | None
    tolerance: float | None
    status: Literal["pass", "fail", "skipped"]
    reason: str
    source: str
    unit: str


def compare(expected: ExpectedFile, measured: dict[str, Measured | float], *, mode: Mode = "eval_only",
            subject: Literal["published", "base"] = "published", variant: str | None = None) -> list[Check]:
    """Compare measured figures with the expected ones: one :class:`Check` per relevant entry.

    Relevant entries: mode ``eval_only`` -> entries of ``subject`` (the checkpoint that was evaluated);
    mode ``retrain`` -> entries of the published and trained-only models; both restricted to ``variant``.
    A row is ``skipped`` (never pass) when the benchmark is not evaluated by areal, the entry is
    report-only, the figure was not measured, or no tolerance can be derived; ``pass``/``fail`` otherwise.

    Args:
        measured: ``ExpectedMetric.key`` -> :class:`Measured` or a bare value, in the entry's unit.
    """
    models = {subject} if mode == "eval_only" else {"published", "trained"}
    rows = []
    for m in expected.metrics:
        if m.model not in models or m.variant != variant:
            continue
        got = measured.get(m.key)
        if got is not None and not isinstance(got, Measured):
            got = Measured(float(got))
        row = dict(key=m.key, benchmark=m.benchmark, metric=m.metric, expected=m.value,
                   measured=None if got is None else got.value, source=m.source, unit=m.unit)
        tol = getattr(m.tolerance, mode) if m.tolerance is not None else None
        if not m.evaluated:
            rows.append(Check(**row, tolerance=tol, status="skipped", reason=m.evaluated_note or "not evaluated"))
            continue
        if m.check == "report":
            why = "reported, not checked" + (f": {m.note}" if m.note else "")
            rows.append(Check(**row, tolerance=None, status="skipped", reason=why))
            continue
        if got is None:
            rows.append(Check(**row, tolerance=tol, status="skipped", reason="not measured"))
            continue
        if tol is None and m.tolerance_formula == "binomial-mean":
            n = got.n_problems
            k = m.n_samples if got.n_samples is None else got.n_samples
            if n and k:
                s = _scale(m.unit)
                tol = binomial_tolerance(min(max(m.value / s, 0.0), 1.0), n, k, expected.z)[mode] * s
        if tol is None:
            rows.append(Check(**row, tolerance=None, status="skipped",
                              reason="no tolerance: n_problems unknown in the expected file and the measurement"))
            continue
        if m.check == "within":
            ok = abs(got.value - m.value) <= tol
            reason = f"|{got.value:g} - {m.value:g}| {'<=' if ok else '>'} {tol:.3g}"
        else:
            ok = got.value >= m.value - tol
            reason = f"{got.value:g} {'>=' if ok else '<'} {m.value:g}" + (f" - {tol:.3g}" if tol else "")
        rows.append(Check(**row, tolerance=tol, status="pass" if ok else "fail", reason=reason))
    return rows


def headline(recipe: Recipe, expected: ExpectedFile | None = None) -> list[ExpectedMetric]:
    """The entries marked ``headline: true`` (what ``areal ls`` shows)."""
    expected = expected or recipe.expected or load_expected(recipe)
    return [m for m in expected.metrics if m.headline]

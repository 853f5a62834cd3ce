"""Training configuration: one typed dataclass, set from a recipe's keys and ``-o key=value`` overrides.

The keys come from a locked recipe's ``train`` section (:mod:`areal_cli.recipes`) or from a flat YAML mapping
whose keys are the fields of :class:`TrainConfig` (a quick user recipe, :func:`flat_config`);
:func:`areal_cli.recipes.load_train_config` tells the two apart. Values are converted by the one rule of
:func:`areal_cli.typed_yaml.coerce`. Unknown keys and wrong types are reported as
:class:`~areal_cli.errors.UserError` with ``file:line: field 'key'``. A foundation: it imports no torch and
nothing above the typed YAML reader.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_cli.errors import UserError
from areal_cli.typed_yaml import LineDict, coerce, parse_override

#: Off-policy corrections of the behaviour weight (the loss's own list: areal_cli.trainer.decoupled_ppo; a test
#: keeps the two equal without importing torch here).
BEHAV_IMP_WEIGHT_MODES = ("token_mask", "token_truncate", "sequence_mask", "sequence_truncate", "disabled")


@dataclass
class TrainConfig:
    """Every setting of an ``areal train`` run. Names follow AReaL where one exists."""

    # --- identity / model -------------------------------------------------------------------
    recipe: str = "tiny-arith"
    seed: int = 1
    model_path: str | None = None  # None: build the embedded tiny Qwen3 (no download)
    model_hidden_size: int = 128
    model_num_layers: int = 2
    model_vocab_size: int = 512
    # chat template of the embedded tiny model: "chatml" (<|im_start|>...), "qwen3" (chatml + <think> tokens) or
    # "r1" (DeepSeek-R1's <｜User｜>/<｜Assistant｜>, BOS, <think>), so miniatures read the upstream record formats
    model_chat_template: str = "chatml"

    # --- task: dataset, reward, rollout workflow (areal_cli.api; presets in areal_cli.tasks.registry) ------
    # "" = the preset's value. Names of user code: "package.module:attr" or "path/file.py:attr" (relative
    # paths: to the recipe's folder; -o overrides: to the current directory).
    task: str = "tiny-arith"  # preset: tiny-arith | math-rl | code-rl | custom
    # records: a .jsonl/.parquet file or folder, hf:OWNER/NAME[/file] (at dataset_revision), or
    # module:function(split, seed) -> Iterable[dict]
    dataset: str = ""
    dataset_revision: str = ""  # hf: a 40-hex commit of the dataset repo
    dataset_split: str = "train"  # hf: the split
    eval_dataset: str = ""  # held-out records (same forms); "": heldout_fraction of dataset, by a hash of the id
    heldout_fraction: float = 0.1
    shuffle_dataset: bool = True  # a new seeded order every epoch
    prompt_field: str = ""  # the record field with the prompt (a string, or a messages list)
    prompt_template: str = ""  # "chat" | "none" | an `areal eval` protocol (r1-distill, qwen3-think, ...)
    id_field: str = ""  # the record field that identifies it ("": "id" if present, else file:line)
    required_fields: list[str] = field(default_factory=list)  # records without them: file:line error
    reward: str = ""  # reward(prompt, completion, prompt_ids, completion_ids, **fields) -> float
    workflow: str = ""  # async arun_episode(client, item) -> Group | None; "": areal_cli.workflows.rlvr:RLVRWorkflow
    workflow_args: dict = field(default_factory=dict)  # keyword arguments of the workflow class
    max_prompt_len: int = 0  # tokens; longer prompts are dropped and counted (0: no limit)
    sft_target_field: str = ""  # the record field whose text is the warm start's target completion
    code_dir: str = ""  # put first on sys.path for module:attr names ("": the recipe's folder)

    # --- supervised warm start (part of the recipe) -------------------------------------------
    sft_n_examples: int = 4000
    sft_batch_size: int = 64
    sft_lr: float = 1e-3
    sft_max_steps: int = 400
    sft_eval_every: int = 10
    sft_stop_accuracy: float = 0.4  # stop as soon as held-out greedy accuracy reaches this (<= 0.5)
    # packing (areal_cli.sft): micro-batches of at most this many tokens (first-fit decreasing), sequences
    # packed end to end into rows of sft_pack_row_tokens (0: as wide as the micro-batch's longest sequence)
    sft_max_tokens_per_mb: int = 16384
    sft_pack_row_tokens: int = 0

    # --- rollout ------------------------------------------------------------------------------
    n_servers: int = 1
    batch_size: int = 16  # prompt groups consumed per training step
    group_size: int = 8  # samples per prompt (n)
    max_head_offpolicyness: int = 4  # eta; 0 = synchronous PPO
    max_concurrent_rollouts: int = 0  # 0: batch_size * (eta + 1)
    # a group finished after later ones (a long answer, a re-issued straggler) may be older than eta when the
    # trainer takes it: "drop" it (staleness_max <= eta for every trained batch; counted, its slot goes back to
    # admission) or "train" on it (AReaL's rule: staleness bounded at admission only; no selection against long
    # answers, realised staleness in staleness_hist)
    stale_groups: str = "drop"
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8
    min_new_tokens: int = 0  # end tokens are masked until this many tokens were generated
    top_k: int = -1  # -1: off
    success_rate_lb: float = 0.0  # groups with success rate < lb are dropped (counted)
    success_rate_ub: float = 1.0  # groups with success rate > ub are dropped (counted)
    reward_timeout_s: float = 5.0
    reward_workers: int = 1
    sandbox_isolation: str = "auto"  # code tasks: 'strict' refuses to grade without every sandbox layer
    server_max_running_requests: int = 256  # 0: SGLang decides (rollout_engine sglang only)
    server_max_total_tokens: int = 65536  # KV-cache cap per server, tokens; 0: SGLang decides (sglang only)
    interruptible: bool = True  # weight updates abort in-flight samples (resumed); False: wait for them
    rollout_process: bool = False  # run the rollout controller in its own process (no GIL shared with the trainer)
    # rollout engine: "embedded" (our CPU server, n_servers of them), "sglang" (n_servers real SGLang servers
    # launched as children; GPUs), "external" (servers already running: server_urls or $AREAL_LLM_SERVER_ADDRS)
    rollout_engine: str = "embedded"
    server_urls: str = ""  # external: comma-separated host:port
    sglang_tp_size: int = 1  # GPUs per SGLang server (tensor parallel)
    sglang_mem_fraction_static: float = 0.8  # share of GPU memory SGLang reserves (weights + KV cache)
    sglang_dtype: str = "bfloat16"
    sglang_extra_args: str = ""  # appended verbatim (shell-split) to python -m sglang.launch_server
    sglang_context_length: int = 0  # 0: max_prompt_len (or 1024) + max_new_tokens
    # weight sync after each step: "disk" (save HF weights, /update_weights_from_disk) or "xccl"
    # (AReaL's name: /update_weights_from_distributed: bucketed broadcast from the trainer's head rank; nccl on GPUs, gloo on CPU)
    weight_update_mode: str = "disk"
    # rollout servers that die or stop answering are restarted with the current weights (areal_cli.rollout.
    # supervisor), at most this many times each; a server with requests in flight and no answer for
    # server_stall_timeout_s seconds is probed with /model_info and restarted when that fails too
    server_max_restarts: int = 3
    server_stall_timeout_s: float = 60.0
    weight_update_chunk_mb: float = 1024.0  # bucket size of the distributed weight sync

    # --- trainer ------------------------------------------------------------------------------
    lr: float = 3e-4
    lr_scheduler: str = "constant"  # RL learning rate: constant | linear | cosine (areal_cli.sft.lr_at), over max_steps
    warmup_proportion: float = 0.0  # linear warmup over this fraction of max_steps
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    eps_clip: float = 0.2
    behav_imp_weight_cap: float = 5.0
    # off-policy correction of w = pi_prox / pi_behav (areal_cli.trainer.decoupled_ppo): token_mask (AReaL),
    # token_truncate (TIS), sequence_mask (MIS), sequence_truncate, disabled
    behav_imp_weight_mode: str = "token_mask"
    behav_imp_weight_lower: float = 0.0  # mask modes: also mask w below this (IcePop's alpha, e.g. 0.5); 0: off
    adv_norm: str = "group"  # "group" (GRPO) or "global" (all valid tokens of the batch)
    # reward shaping before advantages (AReaL actor): clip((r + reward_bias) * reward_scaling, +-max_reward_clip)
    reward_bias: float = 0.0
    reward_scaling: float = 1.0
    max_reward_clip: float = 20.0  # 0: no clip
    ppo_n_minibatches: int = 1
    # micro-batches of at most this many tokens per forward/backward (first fit decreasing, sequences packed;
    # areal_cli.trainer.micro_batches); 0: one micro-batch per minibatch, right-padded
    max_tokens_per_mb: int = 0
    recompute_proximal: bool = True  # decoupled PPO; False: proximal := behaviour (standard PPO)
    # where decoupled PPO's proximal logprobs come from (AReaL actor.prox_logp_method): "recompute" = a forward pass
    # with the weights before the step; "reuse" = the training forward's own logprobs, detached (exact when the
    # step is one optimiser step, ppo_n_minibatches = 1: the weights are the proximal policy's; one forward pass
    # fewer per step); "auto" = reuse when ppo_n_minibatches = 1, else recompute
    prox_logp_method: str = "auto"
    # trainer parallelism (areal_cli.trainer.group): world = data x tensor x pipeline ranks; world 1 = the
    # trainer thread in this process (default), else torchrun ranks on this machine (logs/trainer-rank*.log)
    trainer_data_parallel: int = 1
    trainer_tensor_parallel: int = 1
    trainer_pipeline_parallel: int = 1

    # --- loop / evaluation --------------------------------------------------------------------
    max_steps: int = 200
    epochs: int = 0  # > 0: max_steps = epochs * (training records // batch_size), as AReaL counts (file datasets)
    target_accuracy: float = 0.9  # stop early once held-out accuracy reaches it (0 disables)
    eval_every: int = 1
    eval_n_prompts: int = 128  # held-out prompts of the task evaluated every eval_every steps (0: none)
    eval_n_samples: int = 1  # samples per held-out prompt
    eval_temperature: float = 0.0  # 0: greedy
    # `areal eval` benchmarks evaluated in the loop (areal_cli.eval.in_loop), every eval_benchmark_every steps
    # (0: every eval_every) and after the warm start, with the held-out evaluation's sampling
    eval_benchmarks: list[str] = field(default_factory=list)
    eval_data_dir: str = ""  # benchmark files (like `areal eval --data-dir`; relative to the recipe)
    eval_protocol: str = ""  # "": chat-template for the embedded tiny model, else the benchmarks' default
    eval_benchmark_every: int = 0
    eval_max_problems: int = 0  # the first N problems of each benchmark (0: all)
    time_limit_s: float = 0.0  # 0: no limit
    # experiment tracking (areal_cli.tracking): "tensorboard", "wandb" or both, comma-separated ("" = none)
    loggers: str = ""
    wandb_project: str = "areal"
    # checkpoints (areal_cli.checkpoint): every N RL steps into DIR/checkpoints/step-NNNNNN (0 = off);
    # the newest keep_checkpoints are kept. `areal train --resume DIR` continues from the newest.
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    torch_threads: int = 1
    # CPU pinning ("" = none): Linux cpu lists such as "0" or "0-3,6". trainer_cpus: the trainer thread
    # (forward/backward, optimizer, weight saving); server_cpus: every embedded server process;
    # controller_cpus: the rollout controller (HTTP client, reward dispatch) and its reward workers: the
    # rest of this process, or with rollout_process: true the rollout process (this process's other
    # threads then go with trainer_cpus).
    trainer_cpus: str = ""
    server_cpus: str = ""
    controller_cpus: str = ""

    extra: dict = field(default_factory=dict, repr=False, compare=False)

    def validate(self, source: str = "config", lines: dict[str, int] | None = None) -> None:
        """Check value ranges.

        Args:
            source: where the values come from (a file path or "overrides").
            lines: field -> line number in ``source``, to report ``file:line``.
        Raises:
            UserError: naming the field and the bad value.
        """
        def bad(name: str, why: str) -> UserError:
            loc = f"{source}:{lines[name]}" if lines and name in lines else source
            return UserError(f"{loc}: field '{name}': {why} (got {getattr(self, name)!r})")

        for name in ("batch_size", "group_size", "max_new_tokens", "n_servers", "sft_batch_size", "eval_n_samples",
                     "ppo_n_minibatches", "torch_threads", "reward_workers",
                     "sft_max_tokens_per_mb", "keep_checkpoints", "trainer_data_parallel",
                     "trainer_tensor_parallel", "trainer_pipeline_parallel"):
            if getattr(self, name) <= 0:
                raise bad(name, "must be > 0")
        for name in ("max_head_offpolicyness", "max_steps", "sft_max_steps", "max_concurrent_rollouts",
                     "eval_every", "time_limit_s", "sft_pack_row_tokens", "checkpoint_every", "max_reward_clip",
                     "eval_benchmark_every", "eval_max_problems", "eval_n_prompts", "server_max_restarts"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        for name in ("lr", "sft_lr", "grad_clip", "eps_clip", "behav_imp_weight_cap", "reward_timeout_s",
                     "reward_scaling", "server_stall_timeout_s"):
            if not getattr(self, name) > 0:
                raise bad(name, "must be > 0")
        if not 0.0 <= self.sft_stop_accuracy <= 0.5:
            raise bad("sft_stop_accuracy", "the warm start must stop at or below 0.5 accuracy")
        if not 0.0 <= self.success_rate_lb <= self.success_rate_ub <= 1.0:
            raise bad("success_rate_lb", "need 0 <= success_rate_lb <= success_rate_ub <= 1")
        if self.rollout_engine not in ("embedded", "sglang", "external"):
            raise bad("rollout_engine", "must be 'embedded', 'sglang' or 'external'")
        if self.behav_imp_weight_mode not in BEHAV_IMP_WEIGHT_MODES:
            raise bad("behav_imp_weight_mode", f"must be one of {', '.join(BEHAV_IMP_WEIGHT_MODES)}")
        if not self.behav_imp_weight_cap > 1.0:
            raise bad("behav_imp_weight_cap", "must be > 1 (a weight of 1 is on-policy)")
        if not 0.0 <= self.behav_imp_weight_lower < 1.0:
            raise bad("behav_imp_weight_lower", "must be in [0, 1) (0: no lower bound)")
        if self.behav_imp_weight_lower and not self.behav_imp_weight_mode.endswith("_mask"):
            raise bad("behav_imp_weight_lower", "applies to the mask modes only (token_mask, sequence_mask)")
        if self.top_p < 1.0:
            raise bad("top_p", "training samples must come from the untruncated policy: with top_p < 1 the rollout "
                               "servers report logprobs of the untruncated distribution (as SGLang does), so "
                               "pi_prox/pi_behav would ignore the truncation; use 1.0")
        if self.prox_logp_method not in ("auto", "recompute", "reuse"):
            raise bad("prox_logp_method", "must be 'auto', 'recompute' or 'reuse'")
        if self.prox_logp_method == "reuse" and self.ppo_n_minibatches != 1:
            raise bad("prox_logp_method", "'reuse' needs ppo_n_minibatches = 1 (after the first minibatch's update "
                                          "the weights are no longer the proximal policy); use 'recompute' or 'auto'")
        if self.stale_groups not in ("drop", "train"):
            raise bad("stale_groups", "must be 'drop' or 'train'")
        if self.sandbox_isolation not in ("auto", "strict"):
            raise bad("sandbox_isolation", "must be 'auto' or 'strict'")
        if self.weight_update_mode not in ("disk", "xccl"):
            raise bad("weight_update_mode", "must be 'disk' or 'xccl'")
        if self.sglang_tp_size <= 0 or self.weight_update_chunk_mb <= 0:
            raise bad("sglang_tp_size" if self.sglang_tp_size <= 0 else "weight_update_chunk_mb", "must be > 0")
        if not 0.0 < self.sglang_mem_fraction_static < 1.0:
            raise bad("sglang_mem_fraction_static", "must be in (0, 1)")
        if self.sglang_dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise bad("sglang_dtype", "must be auto, bfloat16, float16 or float32")
        if self.adv_norm not in ("group", "global"):
            raise bad("adv_norm", "must be 'group' or 'global'")
        for name in ("temperature", "eval_temperature"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "must be in (0, 1]")
        if self.top_k != -1 and self.top_k < 1:
            raise bad("top_k", "must be -1 (off) or >= 1")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise bad("min_new_tokens", "must be in [0, max_new_tokens]")
        if not 0.0 <= self.target_accuracy <= 1.0:
            raise bad("target_accuracy", "must be in [0, 1] (0 disables early stopping)")
        if self.sft_pack_row_tokens > self.sft_max_tokens_per_mb:
            raise bad("sft_pack_row_tokens", f"must be <= sft_max_tokens_per_mb={self.sft_max_tokens_per_mb}")
        if self.checkpoint_every and self.rollout_process:
            raise bad("checkpoint_every", "checkpoints need the controller in this process (rollout_process: false)")
        if self.checkpoint_every and self.trainer_tensor_parallel * self.trainer_pipeline_parallel > 1:
            raise bad("checkpoint_every", "checkpoints need trainer_tensor_parallel = trainer_pipeline_parallel = 1 "
                                          "(the optimizer state of model-parallel ranks is sharded)")
        if self.sft_max_steps and self.trainer_pipeline_parallel > 1:
            raise bad("sft_max_steps", "the warm start (packed SFT) needs trainer_pipeline_parallel = 1; "
                                       "use sft_max_steps=0 with a warm model_path")
        if self.model_chat_template not in ("chatml", "qwen3", "r1"):
            raise bad("model_chat_template", "must be 'chatml', 'qwen3' or 'r1'")
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise bad("heldout_fraction", "must be in [0, 1)")
        for name in ("server_max_running_requests", "server_max_total_tokens"):
            if getattr(self, name) < 0 or (getattr(self, name) == 0 and self.rollout_engine == "embedded"):
                raise bad(name, "must be > 0 (0, SGLang's default, only with rollout_engine sglang)")
        if self.sglang_context_length and self.sglang_context_length <= self.max_new_tokens:
            raise bad("sglang_context_length", f"must exceed max_new_tokens={self.max_new_tokens} (0: derived)")
        unknown = [n.strip() for n in self.loggers.split(",") if n.strip() not in ("", "tensorboard", "wandb")]
        if unknown:
            raise bad("loggers", f"unknown logger {unknown[0]!r} (known: tensorboard, wandb; comma-separated)")
        if self.lr_scheduler not in ("constant", "linear", "cosine"):
            raise bad("lr_scheduler", "must be constant, linear or cosine")
        if not 0.0 <= self.warmup_proportion <= 1.0:
            raise bad("warmup_proportion", "must be in [0, 1]")
        if not self.adam_eps > 0:
            raise bad("adam_eps", "must be > 0")
        for name in ("max_prompt_len", "max_tokens_per_mb", "epochs", "sglang_context_length"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0 (0: no limit)")
        if not all(isinstance(x, str) and x for x in self.required_fields):
            raise bad("required_fields", "must be a list of field names")
        if not isinstance(self.workflow_args, dict) or not all(isinstance(k, str) for k in self.workflow_args):
            raise bad("workflow_args", "must be a mapping of argument names to values")
        if self.batch_size % self.ppo_n_minibatches:
            raise bad("ppo_n_minibatches", f"must divide batch_size={self.batch_size}")
        for name in ("trainer_cpus", "server_cpus", "controller_cpus"):
            try:
                parse_cpu_list(getattr(self, name))
            except ValueError as e:
                raise bad(name, str(e)) from None

    @property
    def trainer_world_size(self) -> int:
        """Trainer ranks: trainer_data_parallel x trainer_tensor_parallel x trainer_pipeline_parallel."""
        return self.trainer_data_parallel * self.trainer_tensor_parallel * self.trainer_pipeline_parallel

    @property
    def effective_max_concurrent(self) -> int:
        """Concurrency cap on running groups: the configured value, or batch_size * (eta + 1)."""
        return self.max_concurrent_rollouts or self.batch_size * (self.max_head_offpolicyness + 1)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("extra")
        return d


def parse_cpu_list(spec: str) -> frozenset[int]:
    """Parse a Linux cpu list (``"0"``, ``"0-3,6"``; ``""`` = no pinning -> empty set).

    Raises:
        ValueError: not a comma list of non-negative ints / ``a-b`` ranges with a <= b.
    """
    cpus: set[int] = set()
    for part in (p.strip() for p in spec.split(",")) if spec.strip() else ():
        lo, sep, hi = part.partition("-")
        if not lo.strip().isdigit() or (sep and not hi.strip().isdigit()):
            raise ValueError(f"not a cpu list like '0' or '0-3,6': bad item '{part}'")
        a, b = int(lo), int(hi) if sep else int(lo)
        if a > b:
            raise ValueError(f"range '{part}' is decreasing")
        cpus.update(range(a, b + 1))
    return frozenset(cpus)


#: The fields of :class:`TrainConfig` a recipe or ``-o`` may set (name -> dataclass field).
TRAIN_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig) if f.name != "extra"}
_TYPES = typing.get_type_hints(TrainConfig)


def coerce_field(name: str, value: object, where: str) -> object:
    """Convert ``value`` to the declared type of field ``name`` (:func:`areal_cli.typed_yaml.coerce`).

    Raises:
        UserError: ``where: field 'name': expected T, got V``.
    """
    return coerce(name, value, _TYPES[name], where)


def flat_config(data: Any, path: Path) -> TrainConfig:
    """The config of a flat recipe file: ``data`` (read by :func:`areal_cli.typed_yaml.read_yaml`) is a mapping
    whose keys are fields of :class:`TrainConfig`; relative paths are made absolute against the file's folder.
    The config is named by the file's stem unless it sets ``recipe``.

    Raises:
        UserError: not a mapping, unknown key, wrong type or bad value (``file:line: field 'key': ...``).
    """
    p = path
    if not isinstance(data, dict):
        raise UserError(f"{p}:1: a recipe must be a mapping of key: value")
    lines: dict[str, int] = dict(data.lines) if isinstance(data, LineDict) else {}
    cfg = TrainConfig(recipe=p.stem)  # a flat recipe is named by its file unless it says otherwise
    for key, value in data.items():
        where = f"{p}:{lines.get(key, 1)}"
        if key not in TRAIN_FIELDS:
            raise UserError(f"{where}: field '{key}': unknown key")
        setattr(cfg, key, coerce_field(key, value, where))
    cfg.validate(str(p), lines)
    resolve_paths(cfg, p.parent, set(data), where=lambda k: f"{p}:{lines.get(k, 1)}")
    return cfg


#: Fields naming user code or data by path: made absolute when the recipe is read (see resolve_paths).
PATH_FIELDS = ("dataset", "eval_dataset", "reward", "workflow", "code_dir", "model_path", "eval_data_dir")


def resolve_paths(cfg: TrainConfig, base_dir: Path, keys: set[str], *, set_code_dir: bool = True,
                  where=None) -> None:
    """Make the relative paths of ``cfg``'s fields in ``keys`` absolute against ``base_dir`` (the recipe's
    folder, or the current directory for ``-o``): data files and folders, ``file.py:attr`` names, ``code_dir``,
    ``model_path``. ``code_dir`` defaults to ``base_dir`` (``set_code_dir``). Module names, ``hf:`` sources and
    absolute paths are unchanged."""
    from areal_cli.api.loading import absolute_spec, is_file_spec

    base = Path(base_dir).resolve()
    for key in PATH_FIELDS:
        value = getattr(cfg, key)
        if key not in keys or not value:
            continue
        if key in ("reward", "workflow") or (key in ("dataset", "eval_dataset") and is_file_spec(value)):
            setattr(cfg, key, absolute_spec(value, base))
        elif key in ("dataset", "eval_dataset"):
            if value.startswith("hf:") or (":" in value and "/" not in value.rpartition(":")[0]
                                           and not value.endswith((".jsonl", ".json", ".parquet"))):
                continue  # a Hub dataset or a module:function
            setattr(cfg, key, str((base / Path(value).expanduser()).resolve()))
        else:
            setattr(cfg, key, str((base / Path(value).expanduser()).resolve()))
    if set_code_dir and not cfg.code_dir:
        cfg.code_dir = str(base)


def apply_overrides(cfg: TrainConfig, overrides: list[str]) -> TrainConfig:
    """Apply ``key=value`` overrides (value parsed as YAML scalar) to a copy of ``cfg``.

    Raises:
        UserError: malformed override, unknown key, wrong type or out-of-range value.
    """
    cfg = dataclasses.replace(cfg)
    for item in overrides:
        where = f"-o {item}"
        key, value = parse_override(item)
        if key not in TRAIN_FIELDS:
            raise UserError(f"{where}: field '{key}': unknown key")
        setattr(cfg, key, coerce_field(key, value, where))
        if key in PATH_FIELDS:
            resolve_paths(cfg, Path.cwd(), {key}, set_code_dir=False)
    cfg.validate("overrides")
    return cfg

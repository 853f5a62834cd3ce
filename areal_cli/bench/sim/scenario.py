"""A simulation scenario: a cluster, a workload and the cost constants, and its YAML files.

Every field of :class:`Scenario` is a key of a ``benchmarks/scenarios/*.yaml`` file with ``kind: simulate``;
:func:`load_scenario` reads one (errors name ``file:line: field``), :func:`apply_overrides` applies ``-o key=value``
and :func:`scenario_yaml` writes one back.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path

from areal_cli.foundations.errors import UserError


@dataclass
class Scenario:
    """A cluster, a workload and the cost constants. Every field is a key of a scenario YAML file."""

    kind: str = "simulate"  # scenario files of other benchmarks share benchmarks/scenarios/
    name: str = "unnamed"
    description: str = ""
    # --- cluster ------------------------------------------------------------------------------------
    device: str = "GPU"  # what gen_gpus and train_gpus count, for reports ("CPU core" for this machine's scenarios)
    gen_gpus: int = 64  # GPUs running generation servers
    gen_tp: int = 1  # GPUs per generation server (tensor parallel); servers = gen_gpus // gen_tp
    train_gpus: int = 64
    # --- workload -----------------------------------------------------------------------------------
    batch_size: int = 512  # prompts (groups) per training step, B
    group_size: int = 16  # samples per prompt
    prompt_tokens: int = 256
    max_new_tokens: int = 8192
    response_median_tokens: float = 1300.0
    response_sigma: float = 1.0  # log-sd of the (untruncated) lognormal response length
    response_prompt_corr: float = 0.5  # share of log-length variance common to a prompt's samples
    response_lengths_file: str | None = None  # empirical lengths (one integer per line); overrides lognormal
    response_length_counts: dict = field(default_factory=dict)  # {length: samples}, e.g. measured; overrides both
    response_strata: int = 0  # prompts drawn in blocks of this many, one per length stratum (tiny-longtail); 0: iid
    accept_fraction: float = 1.0  # fraction of finished groups kept for training (success-rate filter)
    # --- model and GPU (for derived costs) ------------------------------------------------------------
    model_params_b: float = 1.78  # parameters, billions
    model_layers: int = 28
    model_hidden: int = 1536
    model_kv_bytes_per_token: float = 28672.0  # layers * 2 * kv_heads * head_dim * 2 bytes
    gpu_tflops: float = 989.0  # dense fp16/bf16 TFLOP/s per GPU
    gpu_hbm_tb_s: float = 3.35  # memory bandwidth per GPU, TB/s
    # --- efficiency constants (calibrated) ------------------------------------------------------------
    decode_overhead_s: float = 0.004  # per decode step: scheduling, sampling, kernel launches
    decode_bw_efficiency: float = 0.6  # achieved / peak memory bandwidth when decoding
    decode_flops_efficiency: float = 0.3  # achieved / peak FLOP/s for the per-sequence decode work
    prefill_flops_efficiency: float = 0.5
    train_mfu: float = 0.3  # model FLOP utilisation of training (incl. pipeline bubbles, packing)
    train_fixed_s: float = 5.0  # per training step: optimizer, all-reduce, data movement
    weight_io_gb_s: float = 2.0  # weight save/load bandwidth (disk or network), GB/s
    sync_overhead_s: float = 2.0  # fixed part of a server's weight load (cache flush, ...)
    # --- explicit costs (null: derived, see derive_costs) ---------------------------------------------
    decode_step_fixed_s: float | None = None  # a
    decode_step_per_seq_s: float | None = None  # b
    decode_step_per_ctx_token_s: float | None = None  # c
    prefill_s_per_token: float | None = None  # p
    # how a decode step reads the KV cache: "sum" = every running context (SGLang's paged attention: c * S);
    # "padded" = every sequence up to the batch's longest context (the embedded CPU engine before its length
    # groups: c * n * L_max); "grouped" = the same per group of similar lengths (areal_cli.rollout.decode_groups,
    # the embedded engine now: c * sum_g n_g * L_g)
    decode_attention: typing.Literal["sum", "padded", "grouped"] = "sum"
    prefix_cache: bool = True  # a prompt's samples share its KV on a server (SGLang's radix cache); false: each prefills
    request_overhead_s: float = 0.0  # server-core seconds per sample outside the engine step (HTTP, reward, ...)
    batch_handoff_s_per_token: float = 0.0  # trainer blocked per trained token to receive its batch (IPC)
    overlap_train_factor: float = 1.0  # training + saving time factor while generation overlaps (eta > 0)
    train_gpu_s_per_token: float | None = None  # GPU-seconds per trained token (fwd+bwd)
    train_gpu_s_per_token_sq: float | None = None  # GPU-seconds per squared sequence length (attention)
    sync_save_s: float | None = None  # trainer blocked per update
    sync_load_s: float | None = None  # each server blocked per update
    # --- servers and rollout control ------------------------------------------------------------------
    max_running_per_server: int = 1024
    eta: int = 4  # max_head_offpolicyness of the async modes; -1 = unbounded
    max_concurrent_groups: int = 0  # 0: batch_size (AReaL's default max_concurrent_rollouts)
    chunk_tokens: int = 0  # non-interruptible ablation: new tokens per request chunk; 0 = whole request
    decoupled_recompute: bool = True  # async/overlap: extra forward pass for proximal logprobs
    trainer_overhead_s: float = 0.0  # per step, trainer blocked after publishing (evaluation, logging)
    weight_poll_s: float = 0.0  # servers learn of new weights at the next multiple of this (AReaL polls)
    # --- simulation -----------------------------------------------------------------------------------
    steps: int = 1000  # steps the hours are reported for
    sim_steps: int = 30  # steps simulated
    warmup_steps: int = 10  # steps excluded from the steady-state averages
    seed: int = 0
    # --- reference figures (for comparison only; never read by the model) ------------------------------
    published: dict = field(default_factory=dict)
    eta_sweep: list = field(default_factory=list)  # etas for the staleness sweep (-1 = unbounded)
    scaling_gpus: list = field(default_factory=lambda: [32, 64, 128, 256, 512, 1024])
    scaling_gen_fraction: float = 0.0  # 0: gen_gpus / (gen_gpus + train_gpus)
    scaling_reference: dict = field(default_factory=dict)  # label -> {gpus: [...], tokens_per_s: [...]}

    source: str = field(default="", repr=False, compare=False)  # file it was loaded from
    lines: dict = field(default_factory=dict, repr=False, compare=False)  # field -> line in source

    @property
    def n_servers(self) -> int:
        return max(1, self.gen_gpus // self.gen_tp)

    def validate(self) -> None:
        """Check ranges. Raises: UserError ``file:line: field 'x': ...``."""
        def bad(name: str, why: str) -> UserError:
            loc = f"{self.source or 'scenario'}"
            if name in self.lines:
                loc += f":{self.lines[name]}"
            return UserError(f"{loc}: field '{name}': {why} (got {getattr(self, name)!r})")

        if self.kind != "simulate":
            raise bad("kind", "not a simulation scenario (expected kind: simulate)")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise bad(f.name, "must be a finite number")
        for name in ("gen_gpus", "gen_tp", "train_gpus", "batch_size", "group_size", "max_new_tokens",
                     "max_running_per_server", "steps", "sim_steps"):
            if getattr(self, name) <= 0:
                raise bad(name, "must be > 0")
        if not isinstance(self.device, str) or not 0 < len(self.device.strip()) <= 32:
            raise bad("device", "must be a short name (1-32 characters), e.g. GPU or CPU core")
        if self.gen_gpus < self.gen_tp:
            raise bad("gen_gpus", f"need at least gen_tp={self.gen_tp} GPUs")
        for name in ("prompt_tokens", "max_concurrent_groups", "chunk_tokens", "warmup_steps",
                     "train_fixed_s", "sync_overhead_s", "trainer_overhead_s", "decode_overhead_s",
                     "weight_poll_s", "response_strata", "request_overhead_s", "batch_handoff_s_per_token"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        for name in ("response_median_tokens", "model_params_b", "gpu_tflops", "gpu_hbm_tb_s",
                     "model_kv_bytes_per_token", "weight_io_gb_s", "model_layers", "model_hidden"):
            if not getattr(self, name) > 0:
                raise bad(name, "must be > 0")
        for name in ("decode_bw_efficiency", "decode_flops_efficiency", "prefill_flops_efficiency", "train_mfu"):
            if not 0 < getattr(self, name) <= 1:
                raise bad(name, "must be in (0, 1]")
        if self.response_sigma < 0:
            raise bad("response_sigma", "must be >= 0")
        if not 0 <= self.response_prompt_corr <= 1:
            raise bad("response_prompt_corr", "must be in [0, 1]")
        if not self.overlap_train_factor > 0:
            raise bad("overlap_train_factor", "must be > 0")
        if not 0 < self.accept_fraction <= 1:
            raise bad("accept_fraction", "must be in (0, 1]")
        if self.eta < -1:
            raise bad("eta", "must be >= 0, or -1 for unbounded")
        if self.warmup_steps >= self.sim_steps:
            raise bad("warmup_steps", f"must be < sim_steps={self.sim_steps}")
        if not 0 <= self.scaling_gen_fraction < 1:
            raise bad("scaling_gen_fraction", "must be in [0, 1)")
        for name in ("decode_step_fixed_s", "decode_step_per_seq_s", "decode_step_per_ctx_token_s",
                     "prefill_s_per_token", "train_gpu_s_per_token", "train_gpu_s_per_token_sq",
                     "sync_save_s", "sync_load_s"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise bad(name, "must be >= 0 or null (derived)")
        if any(not isinstance(k, int) or isinstance(k, bool) or k < 1 or not isinstance(v, int) or isinstance(v, bool)
               or v < 0 for k, v in self.response_length_counts.items()) or (
                self.response_length_counts and not 0 < sum(self.response_length_counts.values()) <= 10_000_000):
            raise bad("response_length_counts", "must map lengths >= 1 to sample counts >= 0, 1 to 10,000,000 in all")
        if self.response_strata > 1024:
            raise bad("response_strata", "must be <= 1024 (prompts per stratified block)")
        for key in ("async_over_sync", "async_noninterruptible_over_sync", "async_in_place_over_sync"):
            v = self.published.get(key) if isinstance(self.published, dict) else None
            if key in (self.published or {}) and (not isinstance(v, (int, float)) or isinstance(v, bool)
                                                    or not 0 < v < 1e6):
                raise bad("published", f"'{key}' must be a positive number (a measured ratio)")
        if any((not isinstance(g, int)) or isinstance(g, bool) or g < 2 for g in self.scaling_gpus):
            raise bad("scaling_gpus", "must be a list of integers >= 2")
        if any((not isinstance(e, int)) or isinstance(e, bool) or e < -1 for e in self.eta_sweep):
            raise bad("eta_sweep", "must be a list of integers >= 0 (-1 = unbounded)")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("lines")
        return d


# --------------------------------------------------------------------------------------------------------
# scenario files


_FIELDS = {f.name: f for f in dataclasses.fields(Scenario) if f.name not in ("source", "lines")}
_TYPES = typing.get_type_hints(Scenario)


#: The command that reads each ``kind:`` of scenario file in :func:`scenarios_dir` (measured benchmarks' files may
#: leave their kind out; the cluster model's say ``kind: simulate``).
SCENARIO_KINDS = {"throughput": "areal bench throughput", "staleness": "areal bench staleness",
                  "simulate": "areal bench simulate"}


def scenarios_dir() -> Path:
    """``$AREAL_SCENARIOS_DIR`` or the shipped ``benchmarks/scenarios/`` (:mod:`areal_cli.foundations.resources`)."""
    import os

    from areal_cli.foundations.resources import shipped_dir

    env = os.environ.get("AREAL_SCENARIOS_DIR")
    return Path(env) if env else shipped_dir("scenarios")


def known_scenarios() -> list[str]:
    """Names of the simulation scenarios in :func:`scenarios_dir` (files with ``kind: simulate``)."""
    import yaml

    d = scenarios_dir()
    out = []
    for p in sorted(d.glob("*.yaml")) if d.is_dir() else []:
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and data.get("kind") == "simulate":
            out.append(p.stem)
    return out


def load_scenario(name_or_path: str) -> Scenario:
    """A scenario by name (``benchmarks/scenarios/NAME.yaml``) or path.

    Raises:
        UserError: unknown name, unreadable/invalid YAML, unknown key, wrong type or bad value (``file:line:
        field 'x': ...``).
    """
    from areal_cli.foundations.typed_yaml import coerce, read_yaml, unknown_key

    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml"):
        p = scenarios_dir() / f"{name_or_path}.yaml"
        if not p.is_file():
            raise UserError(f"unknown scenario '{name_or_path}' (known: {', '.join(known_scenarios()) or 'none'})")
    if not p.is_file():
        raise UserError(f"{p}: scenario file not found")
    data = read_yaml(p, "scenario")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{p}:1: a scenario must be a mapping of key: value")
    lines: dict[str, int] = {str(k): n for k, n in getattr(data, "lines", {}).items()}
    sc = Scenario(source=str(p), lines=lines)
    if data.get("kind", "simulate") != "simulate" or ("kind" not in data and "recipe" in data):
        other = data.get("kind") or "throughput"  # a measured benchmark's scenario names a recipe
        reads = SCENARIO_KINDS.get(str(other)) if other != "simulate" else None
        raise UserError(f"{p}:{lines.get('kind' if 'kind' in data else 'recipe', 1)}: field 'kind': "
                        + (f"a scenario of `{reads} --scenario {p}`, not a cluster-model one (kind: simulate)" if reads
                           else f"expected simulate, got {other!r}"))
    for key, value in data.items():
        where = f"{p}:{lines.get(str(key), 1)}"
        if key not in _FIELDS:
            raise unknown_key(where, key, _FIELDS)
        setattr(sc, key, coerce(key, value, _TYPES[key], where))
    if "name" not in data:
        sc.name = p.stem
    sc.validate()
    return sc


def apply_overrides(sc: Scenario, overrides: typing.Sequence[str]) -> Scenario:
    """``key=value`` overrides (value parsed as YAML). Raises: UserError naming the override."""
    from areal_cli.foundations.typed_yaml import coerce, parse_override, unknown_key

    sc = dataclasses.replace(sc, lines=dict(sc.lines))
    for item in overrides:
        where = f"-o {item}"
        key, value = parse_override(item)
        if key not in _FIELDS:
            raise unknown_key(where, key, _FIELDS)
        setattr(sc, key, coerce(key, value, _TYPES[key], where))
        sc.lines.pop(key, None)
    src = sc.source
    sc.source = f"{src} with overrides" if overrides and src else (src or "overrides")
    sc.validate()
    sc.source = src
    return sc


def scenario_yaml(sc: Scenario, header: str = "") -> str:
    """The scenario as YAML text (fields that differ from the defaults, plus the identity fields)."""
    import yaml

    base = Scenario()
    d = {k: v for k, v in sc.to_dict().items()
         if k != "source" and (k in ("kind", "name", "description") or v != getattr(base, k))}
    head = "".join(f"# {line}\n" for line in header.splitlines())
    return head + yaml.safe_dump(d, sort_keys=False, width=110)

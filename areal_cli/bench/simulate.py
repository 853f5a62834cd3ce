"""Discrete-event model of an RL cluster: synchronous vs one-step-overlap vs fully asynchronous throughput.

What is simulated (one event loop, ``heapq``; pure Python + numpy):

* ``G`` generation servers (``gen_gpus // gen_tp``), each with continuous batching. All running requests of a
  server advance one token per decode step; a step with ``n`` running requests whose contexts (prompt +
  generated) sum to ``S`` tokens takes ``t = a + b*n + c*S`` seconds (``a``: per-step overhead + reading the
  weights; ``b``: per-sequence compute; ``c``: reading the KV cache). Between two events ``n`` is constant and
  ``S`` grows by ``n`` per step, so the time for ``k`` steps is ``k*(a+b*n+c*S) + c*n*k*(k-1)/2`` and the loop
  jumps from event to event (a request finishing, a prefill, a weight update) without stepping tokens; token
  counts are treated as continuous between events. Admitting requests costs a prefill of ``p`` seconds per
  prompt (or re-computed prefix) token, during which the server does not decode. At most
  ``max_running_per_server`` requests run at once (a stand-in for the KV-cache limit); the rest queue (FIFO).
  Requests are dispatched round-robin over servers (AReaL's default ``round_robin`` schedule policy), one
  request per sample (``n=1``), as in AReaL.
* Response lengths: lognormal with median ``response_median_tokens`` and log-sd ``response_sigma`` (or an
  empirical list), truncated at ``max_new_tokens`` (truncated samples end at the cap: the long tail that makes a
  synchronous batch wait for its longest sample). ``response_prompt_corr`` is the share of the log-length
  variance common to the samples of one prompt (hard prompts give long answers for all their samples).
* Admission control: AReaL's staleness rule (:mod:`areal_cli.rollout.staleness`)
  ``capacity = min(max_concurrent - running, (eta + version + 1)*B - (accepted + running))`` in groups.
  A finished group is kept with probability ``accept_fraction`` (success-rate filter); a dropped group gives its
  slot back.
* ``T`` training GPUs: one step on ``B`` accepted groups (FIFO) takes
  ``train_fixed_s + (tokens*cost_tok + sum(len^2)*cost_attn) * (1 + 1/3 if decoupled) / T`` seconds
  (dense 6N FLOPs per token and causal attention ``6*layers*hidden*len^2`` per sequence at ``train_mfu``; the
  decoupled PPO objective adds a forward pass for the proximal log-probs, +1/3). Parallel efficiency is folded
  into ``train_mfu``; strong-scaling loss comes from ``train_fixed_s``.
* Weight update after each step: the trainer saves (``sync_save_s``, trainer blocked), then every server loads
  (``sync_load_s``, generation blocked). *Interruptible* (AReaL boba²): running requests are aborted, the weights
  load, and the aborted requests resume with their prefix re-prefilled with the new weights. *Non-interruptible*
  (SGLang ``update_weights_from_disk`` without interrupt: the weight-update lock waits for in-flight requests):
  the server stops admitting, drains its running requests, then loads. With ``chunk_tokens > 0`` requests run
  in chunks of that many new tokens (AReaL ``new_tokens_per_chunk``), so a drain waits at most one chunk.

Modes (:func:`mode_spec`): ``sync`` (eta 0: generate a batch, train, update; no recompute pass, as in standard
PPO), ``overlap`` (eta 1, whole batches: batch k+1 is generated while batch k trains, with weights one version
old; updates between batches), ``async`` (eta from the scenario, streaming admission, interruptible), and
``async_nointerrupt`` (the same with non-interruptible updates: the ablation of boba² Fig. 5). The synchronous
baselines always admit a whole batch (their concurrency cap is at least the batch size).

Outputs (:func:`simulate`): effective training throughput (tokens of trained sequences per second, as in
boba²: generated-but-unused tokens do not count), generation throughput, idle fractions, staleness histogram,
seconds per step and hours for ``steps`` steps. Units: seconds, tokens.

Costs can be given directly (``decode_step_fixed_s`` ...) or derived (:func:`derive_costs`) from the model size,
the GPU's FLOP/s and memory bandwidth and a few efficiency constants, so a scenario for other hardware or another
model size changes only the physical numbers. Source of the rule and the metric: AReaL v0.3 (boba²)
``gserver_manager.py::is_staled``, ``patch/sglang/v0.4.6.post4.patch``, ``benchmark/verl_v0_3_0_post1_76084d3``.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import typing
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from areal_cli.errors import UserError
from areal_cli.rollout.staleness import StalenessManager

MODES = ("sync", "overlap", "async", "async_nointerrupt")
ALL_MODES = MODES + ("sync_colocated",)
UNBOUNDED_ETA = 1 << 40


@dataclass
class Scenario:
    """A cluster, a workload and the cost constants. Every field is a key of a scenario YAML file."""

    kind: str = "simulate"  # scenario files of other benchmarks share benchmarks/scenarios/
    name: str = "unnamed"
    description: str = ""
    # --- cluster ------------------------------------------------------------------------------------
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
        for name in ("gen_gpus", "gen_tp", "train_gpus", "batch_size", "group_size", "max_new_tokens",
                     "max_running_per_server", "steps", "sim_steps"):
            if getattr(self, name) <= 0:
                raise bad(name, "must be > 0")
        if self.gen_gpus < self.gen_tp:
            raise bad("gen_gpus", f"need at least gen_tp={self.gen_tp} GPUs")
        for name in ("prompt_tokens", "max_concurrent_groups", "chunk_tokens", "warmup_steps",
                     "train_fixed_s", "sync_overhead_s", "trainer_overhead_s", "decode_overhead_s",
                     "weight_poll_s"):
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
        if any((not isinstance(g, int)) or isinstance(g, bool) or g < 2 for g in self.scaling_gpus):
            raise bad("scaling_gpus", "must be a list of integers >= 2")
        if any((not isinstance(e, int)) or isinstance(e, bool) or e < -1 for e in self.eta_sweep):
            raise bad("eta_sweep", "must be a list of integers >= 0 (-1 = unbounded)")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("lines")
        return d


@dataclass(frozen=True)
class Costs:
    """Per-operation costs in seconds (see the module docstring for the formulas)."""

    decode_a: float  # s per decode step
    decode_b: float  # s per decode step per running sequence
    decode_c: float  # s per decode step per context token of the running sequences
    prefill_per_token: float  # s per prefilled token
    train_gpu_s_per_token: float  # GPU-s per trained token (fwd + bwd)
    train_gpu_s_per_token_sq: float  # GPU-s per squared sequence length (causal attention, fwd + bwd)
    train_fixed_s: float
    sync_save_s: float
    sync_load_s: float

    def decode_tokens_per_s(self, batch: int, ctx: float) -> float:
        """Tokens/s of one server decoding ``batch`` sequences of mean context ``ctx`` tokens."""
        return batch / (self.decode_a + self.decode_b * batch + self.decode_c * batch * ctx)


def derive_costs(sc: Scenario) -> Costs:
    """Costs from the physical numbers (explicit cost fields of the scenario win).

    Roofline-style formulas, fp16 weights (2 bytes/parameter), ``N`` = parameters:
      a = decode_overhead_s + 2N / (HBM * bw_eff) ; b = 2N / (FLOPs * flops_eff) ;
      c = kv_bytes_per_token / (HBM * bw_eff) ; p = 2N / (FLOPs * prefill_eff) ;
      train per token = 6N / (FLOPs * MFU) ; train per len^2 = 6 * layers * hidden / (FLOPs * MFU) ;
      save = 2N / io ; load = sync_overhead_s + 2N / io.
    Per server the FLOPs and bandwidth are ``gen_tp`` GPUs' worth.
    """
    n = sc.model_params_b * 1e9
    flops = sc.gpu_tflops * 1e12
    hbm = sc.gpu_hbm_tb_s * 1e12 * sc.gen_tp
    wbytes = 2.0 * n
    io = sc.weight_io_gb_s * 1e9

    def pick(explicit: float | None, derived: float) -> float:
        return float(explicit) if explicit is not None else derived

    return Costs(
        decode_a=pick(sc.decode_step_fixed_s, sc.decode_overhead_s + wbytes / (hbm * sc.decode_bw_efficiency)),
        decode_b=pick(sc.decode_step_per_seq_s, 2 * n / (flops * sc.gen_tp * sc.decode_flops_efficiency)),
        decode_c=pick(sc.decode_step_per_ctx_token_s, sc.model_kv_bytes_per_token / (hbm * sc.decode_bw_efficiency)),
        prefill_per_token=pick(sc.prefill_s_per_token, 2 * n / (flops * sc.gen_tp * sc.prefill_flops_efficiency)),
        train_gpu_s_per_token=pick(sc.train_gpu_s_per_token, 6 * n / (flops * sc.train_mfu)),
        train_gpu_s_per_token_sq=pick(sc.train_gpu_s_per_token_sq,
                                      6 * sc.model_layers * sc.model_hidden / (flops * sc.train_mfu)),
        train_fixed_s=sc.train_fixed_s,
        sync_save_s=pick(sc.sync_save_s, wbytes / io),
        sync_load_s=pick(sc.sync_load_s, sc.sync_overhead_s + wbytes / io),
    )


@dataclass(frozen=True)
class ModeSpec:
    """How a mode generates and updates weights."""

    name: str
    eta: int
    batch_admission: bool  # admit only when no group is running (whole batches)
    interruptible: bool
    recompute: bool  # decoupled PPO: extra forward pass for proximal logprobs
    chunk_tokens: int


def mode_spec(sc: Scenario, mode: str, eta: int | None = None) -> ModeSpec:
    """The :class:`ModeSpec` of ``mode`` (one of :data:`MODES`); ``eta`` overrides the async modes' eta.

    Raises:
        ValueError: unknown mode.
    """
    e = sc.eta if eta is None else eta
    e = UNBOUNDED_ETA if e < 0 else e
    rec = sc.decoupled_recompute
    if mode == "sync":
        return ModeSpec("sync", 0, True, False, False, 0)
    if mode == "sync_colocated":
        return ModeSpec("sync_colocated", 0, True, False, False, 0)
    if mode == "overlap":
        return ModeSpec("overlap", 1, True, False, rec, 0)
    if mode == "async":
        return ModeSpec("async", e, False, True, rec and e > 0, 0)
    if mode == "async_nointerrupt":
        return ModeSpec("async_nointerrupt", e, False, False, rec and e > 0, sc.chunk_tokens)
    raise ValueError(f"unknown mode {mode!r} (known: {', '.join(ALL_MODES)})")


def scaled(sc: Scenario, scale: int) -> Scenario:
    """The same cluster shrunk ``scale`` times (servers, training GPUs, batch, concurrency).

    Per-server load, per-GPU training work and step times are unchanged in expectation, so steady-state step
    times match the full cluster up to the spread of the slowest server (fewer servers: a slightly shorter
    synchronous tail). Used to make sweeps fast.
    """
    if scale <= 1:
        return sc
    mc = sc.max_concurrent_groups or sc.batch_size
    return dataclasses.replace(
        sc,
        gen_gpus=max(sc.gen_tp, round(sc.n_servers / scale) * sc.gen_tp),
        train_gpus=max(1, round(sc.train_gpus / scale)),
        batch_size=max(1, round(sc.batch_size / scale)),
        max_concurrent_groups=max(1, round(mc / scale)),
    )


# --------------------------------------------------------------------------------------------------------
# response lengths


class _Lengths:
    """Draws response lengths group by group (numpy blocks, so per-group cost stays small)."""

    def __init__(self, sc: Scenario, rng: np.random.Generator, empirical: np.ndarray | None):
        self.sc, self.rng, self.empirical = sc, rng, empirical
        self.block: list[list[int]] = []

    def _refill(self, n_groups: int = 1024) -> None:
        sc, g = self.sc, self.sc.group_size
        if self.empirical is not None:
            arr = self.rng.choice(self.empirical, size=(n_groups, g))
        else:
            rho = sc.response_prompt_corr
            z = (math.sqrt(rho) * self.rng.standard_normal((n_groups, 1))
                 + math.sqrt(1 - rho) * self.rng.standard_normal((n_groups, g)))
            arr = np.exp(math.log(sc.response_median_tokens) + sc.response_sigma * z)
        arr = np.clip(np.rint(arr), 1, sc.max_new_tokens).astype(np.int64)
        self.block = arr.tolist()[::-1]

    def group(self) -> list[int]:
        if not self.block:
            self._refill()
        return self.block.pop()


def load_empirical_lengths(sc: Scenario) -> np.ndarray | None:
    """The scenario's ``response_lengths_file`` (relative to the scenario file), or None.

    Raises:
        UserError: missing file or a line that is not a positive integer (file:line).
    """
    if not sc.response_lengths_file:
        return None
    p = Path(sc.response_lengths_file)
    if not p.is_absolute() and sc.source:
        p = Path(sc.source).parent / p
    if not p.is_file():
        loc = f"{sc.source}:{sc.lines.get('response_lengths_file', 1)}" if sc.source else "scenario"
        raise UserError(f"{loc}: field 'response_lengths_file': file not found: {p}")
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            v = int(line)
        except ValueError:
            v = -1
        if v <= 0:
            raise UserError(f"{p}:{i}: expected a positive integer response length, got {line.strip()!r}")
        out.append(v)
    if not out:
        raise UserError(f"{p}:1: no response lengths")
    return np.asarray(out, dtype=np.int64)


def length_stats(sc: Scenario, n: int = 200_000, seed: int = 0) -> dict:
    """Mean, percentiles and truncated fraction of the response-length distribution (Monte Carlo)."""
    rng = np.random.default_rng(seed)
    emp = load_empirical_lengths(sc)
    if emp is not None:
        x = np.minimum(rng.choice(emp, n), sc.max_new_tokens)
    else:
        x = np.clip(np.rint(np.exp(math.log(sc.response_median_tokens) + sc.response_sigma * rng.standard_normal(n))),
                    1, sc.max_new_tokens)
    return {"mean": float(x.mean()), "p50": float(np.percentile(x, 50)), "p90": float(np.percentile(x, 90)),
            "p99": float(np.percentile(x, 99)), "truncated_frac": float((x >= sc.max_new_tokens).mean()),
            "mean_sequence_tokens": float(x.mean() + sc.prompt_tokens)}


# --------------------------------------------------------------------------------------------------------
# the event loop

_SRV, _LOAD, _TRAIN_DONE, _PUBLISH, _TRAINER_FREE, _NOTIFY = range(6)
_READY, _DRAINING, _LOADING = range(3)


class _Req:
    __slots__ = ("group", "prompt", "length", "gen", "head", "kv_sid", "kv_version", "k_admit", "gen_admit", "stop")

    def __init__(self, group: "_Group", prompt: int, length: int):
        self.group, self.prompt, self.length = group, prompt, length
        self.gen = 0.0
        self.head = -1  # policy version at the first generated token
        self.kv_sid = -1
        self.kv_version = -1
        self.k_admit = 0.0
        self.gen_admit = 0.0
        self.stop = 0.0


class _Group:
    __slots__ = ("left", "tokens", "sq", "heads", "kv_sid", "kv_version")

    def __init__(self, n: int):
        self.left = n
        self.kv_sid = -1  # server and weight version whose radix cache holds the prompt's KV
        self.kv_version = -1
        self.tokens = 0
        self.sq = 0.0
        self.heads: list[int] = []


class _Server:
    """One generation server. ``k``: decode steps done (continuous), valid at time ``t``; when ``t`` is in
    the future the server is prefilling until ``t``."""

    __slots__ = ("sid", "t", "k", "n", "s", "heap", "queue", "version", "target", "state", "epoch",
                 "decode_s", "prefill_s", "load_s", "tokens", "interrupted")

    def __init__(self, sid: int):
        self.sid = sid
        self.t = 0.0
        self.k = 0.0
        self.n = 0
        self.s = 0.0
        self.heap: list = []
        self.queue: deque = deque()
        self.version = 0
        self.target = 0
        self.state = _READY
        self.epoch = 0
        self.decode_s = self.prefill_s = self.load_s = self.tokens = 0.0
        self.interrupted = 0


class _Sim:
    def __init__(self, sc: Scenario, spec: ModeSpec, costs: Costs, seed: int, empirical: np.ndarray | None):
        self.sc, self.spec, self.c = sc, spec, costs
        self.rng = np.random.default_rng(seed)
        self.lengths = _Lengths(sc, self.rng, empirical)
        self.A, self.B, self.C = costs.decode_a, costs.decode_b, costs.decode_c
        self.servers = [_Server(i) for i in range(sc.n_servers)]
        self.events: list = []
        self.seq = 0
        self.rr = 0
        # controller (groups); ``version`` is the weight version the rollout manager knows of
        self.version = 0
        self.trainer_version = 0
        max_conc = sc.max_concurrent_groups or sc.batch_size
        if spec.batch_admission:  # the synchronous baselines always generate a whole batch at once
            max_conc = max(max_conc, sc.batch_size)
        self.stale = StalenessManager(sc.batch_size, spec.eta, max_conc)
        self.buffer: deque = deque()
        # trainer
        self.trainer_busy = False
        self.train_s = self.save_s = self.overhead_s = 0.0
        self.step_times: list[float] = []
        self.step_tokens: list[int] = []
        self.stale_hist: dict[int, int] = {}
        self.trained_tokens = 0
        self.snap: dict | None = None
        self.snap_end: dict | None = None
        self.gen_requests = 0

    # ---- helpers -----------------------------------------------------------------------------------
    def push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, a, b))

    def advance(self, sv: _Server, now: float) -> None:
        """Bring server ``sv`` to time ``now`` (decode steps done meanwhile)."""
        if now <= sv.t:
            return
        if sv.n:
            dt = now - sv.t
            a1 = self.A + self.B * sv.n + self.C * sv.s - 0.5 * self.C * sv.n
            beta = self.C * sv.n
            dk = dt / a1 if beta == 0 else 2 * dt / (a1 + math.sqrt(a1 * a1 + 2 * beta * dt))
            sv.k += dk
            sv.s += sv.n * dk
            sv.tokens += sv.n * dk
            sv.decode_s += dt
        sv.t = now

    def schedule(self, sv: _Server) -> None:
        """(Re)schedule the server's next request completion."""
        sv.epoch += 1
        if sv.n and sv.state != _LOADING:
            dk = max(0.0, sv.heap[0][0] - sv.k)
            a1 = self.A + self.B * sv.n + self.C * sv.s - 0.5 * self.C * sv.n
            self.push(sv.t + a1 * dk + 0.5 * self.C * sv.n * dk * dk, _SRV, sv.sid, sv.epoch)

    def try_admit(self, sv: _Server, now: float) -> None:
        """Move queued requests into the running batch (continuous batching), paying their prefill."""
        if sv.state != _READY or not sv.queue or sv.n >= self.sc.max_running_per_server:
            return
        self.advance(sv, now)
        chunk = self.spec.chunk_tokens
        prefill = 0.0
        while sv.queue and sv.n < self.sc.max_running_per_server:
            rq = sv.queue.popleft()
            g = rq.group
            if not (g.kv_sid == sv.sid and g.kv_version == sv.version):  # prompt not in the radix cache
                prefill += rq.prompt
                g.kv_sid, g.kv_version = sv.sid, sv.version
            if rq.gen and not (rq.kv_sid == sv.sid and rq.kv_version == sv.version):
                prefill += rq.gen  # a resumed prefix whose KV was discarded
            if rq.head < 0:
                rq.head = sv.version
            rq.k_admit, rq.gen_admit = sv.k, rq.gen
            rq.stop = rq.length if not chunk else min(rq.length, (int(rq.gen + 1e-6) // chunk + 1) * chunk)
            self.seq += 1
            heapq.heappush(sv.heap, (sv.k + rq.stop - rq.gen, self.seq, rq))
            sv.n += 1
            sv.s += rq.prompt + rq.gen
        if prefill:
            dt = prefill * self.c.prefill_per_token
            sv.t = max(sv.t, now) + dt
            sv.prefill_s += dt
        self.schedule(sv)

    def begin_load(self, sv: _Server, now: float) -> None:
        self.advance(sv, now)
        sv.state = _LOADING
        sv.epoch += 1
        start = max(now, sv.t)
        sv.load_s += self.c.sync_load_s
        self.push(start + self.c.sync_load_s, _LOAD, sv.sid, sv.target)

    # ---- controller --------------------------------------------------------------------------------
    def admit(self, now: float) -> None:
        """AReaL's staleness rule (:class:`StalenessManager`, the one the real controller uses): start as many
        groups as capacity allows; in whole-batch modes only when no group is running."""
        if self.spec.batch_admission and self.stale.running:
            return
        cap = self.stale.capacity()
        if cap <= 0:
            return
        servers, ns = self.servers, len(self.servers)
        prompt = self.sc.prompt_tokens
        for _ in range(cap):
            g = _Group(self.sc.group_size)
            self.stale.on_submit()
            sv = servers[self.rr]  # round-robin over servers; a prompt's samples share one server (AReaL qid)
            self.rr = (self.rr + 1) % ns
            for length in self.lengths.group():
                sv.queue.append(_Req(g, prompt, length))
            self.gen_requests += self.sc.group_size
            self.try_admit(sv, now)

    def group_done(self, g: _Group, now: float) -> None:
        if self.sc.accept_fraction >= 1 or self.rng.random() < self.sc.accept_fraction:
            self.stale.on_accept()
            self.buffer.append(g)
            self.try_train(now)
        else:
            self.stale.on_reject()

    # ---- events ------------------------------------------------------------------------------------
    def on_server(self, sv: _Server, now: float) -> None:
        self.advance(sv, now)
        heap = sv.heap
        if heap and heap[0][0] > sv.k:  # snap to the exact completion step (float round-off)
            d = heap[0][0] - sv.k
            sv.k += d
            sv.s += sv.n * d
            sv.tokens += sv.n * d
        finished_groups = []
        while heap and heap[0][0] <= sv.k + 1e-6:
            _, _, rq = heapq.heappop(heap)
            sv.n -= 1
            sv.s -= rq.prompt + rq.stop
            rq.gen = rq.stop
            if rq.stop < rq.length:  # end of a chunk: back to the queue, prefix still cached here
                rq.kv_sid, rq.kv_version = sv.sid, sv.version
                sv.queue.append(rq)
                continue
            g = rq.group
            g.left -= 1
            seq_len = rq.prompt + rq.length
            g.tokens += seq_len
            g.sq += float(seq_len) * seq_len
            g.heads.append(rq.head)
            if g.left == 0:
                finished_groups.append(g)
        if sv.n == 0:
            sv.s = 0.0
        if sv.state == _DRAINING and sv.n == 0:
            self.begin_load(sv, now)
        else:
            self.try_admit(sv, now)  # no-op unless the server is ready
            self.schedule(sv)
        for g in finished_groups:
            self.group_done(g, now)
        if finished_groups:
            self.admit(now)

    def on_load(self, sv: _Server, version: int, now: float) -> None:
        sv.version = version
        sv.t = max(sv.t, now)
        if sv.target > sv.version:
            self.begin_load(sv, now)
            return
        sv.state = _READY
        self.try_admit(sv, now)
        self.schedule(sv)

    def try_train(self, now: float) -> None:
        b = self.sc.batch_size
        if self.trainer_busy or len(self.buffer) < b:
            return
        groups = [self.buffer.popleft() for _ in range(b)]
        tokens = sum(g.tokens for g in groups)
        sq = sum(g.sq for g in groups)
        hist = self.stale_hist
        for g in groups:
            for h in g.heads:
                lag = self.trainer_version - h
                hist[lag] = hist.get(lag, 0) + 1
        c = self.c
        factor = 4.0 / 3.0 if self.spec.recompute else 1.0
        dt = c.train_fixed_s + factor * (tokens * c.train_gpu_s_per_token + sq * c.train_gpu_s_per_token_sq) / self.sc.train_gpus
        self.trainer_busy = True
        self.train_s += dt
        self.step_tokens.append(tokens)
        self.push(now + dt, _TRAIN_DONE)

    def on_publish(self, now: float) -> None:
        """The trainer has saved new weights."""
        self.trainer_version += 1
        v = self.trainer_version
        self.step_times.append(now)
        if v == self.sc.warmup_steps:
            self.snap = self.snapshot(now)
        if v == self.sc.sim_steps:
            self.snap_end = self.snapshot(now)
            return
        poll = self.sc.weight_poll_s
        if poll > 0:
            self.push(math.ceil(now / poll) * poll, _NOTIFY, v)
        else:
            self.on_notify(v, now)
        if self.sc.trainer_overhead_s > 0:
            self.overhead_s += self.sc.trainer_overhead_s
            self.push(now + self.sc.trainer_overhead_s, _TRAINER_FREE)
        else:
            self.trainer_busy = False
            self.try_train(now)

    def on_notify(self, v: int, now: float) -> None:
        """The rollout manager sees weight version ``v``: servers update, admission capacity grows."""
        if v <= self.version:
            return
        self.version = v
        self.stale.set_version(v)
        for sv in self.servers:
            sv.target = v
            if sv.state == _LOADING:
                continue  # loads the newest version when the current load finishes
            if self.spec.interruptible:
                self.interrupt(sv, now)
            elif sv.state == _READY:
                if sv.n == 0:
                    self.begin_load(sv, now)
                else:
                    sv.state = _DRAINING
        self.admit(now)

    def interrupt(self, sv: _Server, now: float) -> None:
        """Abort running requests (they resume after the load, prefix re-prefilled), then load."""
        self.advance(sv, now)
        if sv.n:
            running = sorted(sv.heap, key=lambda e: e[1])  # admission order
            for _, _, rq in running:
                rq.gen = min(rq.stop, rq.gen_admit + (sv.k - rq.k_admit))
                rq.kv_sid = -1
            sv.queue.extendleft(rq for _, _, rq in reversed(running))
            sv.interrupted += sv.n
            sv.heap = []
            sv.n = 0
            sv.s = 0.0
        self.begin_load(sv, now)

    def snapshot(self, now: float) -> dict:
        for sv in self.servers:
            self.advance(sv, now)
        return {
            "t": now,
            "decode_s": sum(sv.decode_s for sv in self.servers),
            "prefill_s": sum(sv.prefill_s for sv in self.servers),
            "load_s": sum(sv.load_s for sv in self.servers),
            "tokens": sum(sv.tokens for sv in self.servers),
            "decode_steps": sum(sv.k for sv in self.servers),
            "interrupted": sum(sv.interrupted for sv in self.servers),
            "train_s": self.train_s, "save_s": self.save_s, "overhead_s": self.overhead_s,
            "stale_hist": dict(self.stale_hist),
            "requests": self.gen_requests,
        }

    def run(self) -> None:
        self.admit(0.0)
        ev = self.events
        servers = self.servers
        while self.snap_end is None:
            if not ev:
                raise RuntimeError("simulation stalled: no pending event")  # a model bug, not user input
            now, _, kind, a, b = heapq.heappop(ev)
            if kind == _SRV:
                sv = servers[a]
                if b == sv.epoch:
                    self.on_server(sv, now)
            elif kind == _LOAD:
                self.on_load(servers[a], b, now)
            elif kind == _TRAIN_DONE:
                self.save_s += self.c.sync_save_s
                self.push(now + self.c.sync_save_s, _PUBLISH)
            elif kind == _PUBLISH:
                self.on_publish(now)
            elif kind == _NOTIFY:
                self.on_notify(a, now)
            else:  # _TRAINER_FREE
                self.trainer_busy = False
                self.try_train(now)


def simulate(sc: Scenario, mode: str, *, eta: int | None = None, scale: int = 1, seed: int | None = None,
             costs: Costs | None = None) -> dict:
    """Simulate ``sc.sim_steps`` training steps of ``mode`` and report steady-state figures.

    Args:
        sc: the scenario.
        mode: one of :data:`ALL_MODES` (``sync_colocated``: synchronous with every GPU generating and then
            every GPU training, as verl does; the weight load cost stays).
        eta: overrides the scenario's eta for the async modes (-1 = unbounded).
        scale: shrink the cluster this many times (:func:`scaled`) for speed.
        seed: random seed (default: the scenario's).
        costs: explicit costs (default: :func:`derive_costs` of the scaled scenario).
    Returns:
        dict with ``step_s`` (mean seconds per step after warm-up), ``effective_tokens_per_s`` (trained
        tokens / s), ``gen_tokens_per_s``, ``gen_idle_frac`` / ``gen_prefill_frac`` / ``gen_load_frac`` /
        ``gen_decode_frac`` (fractions of server time), ``trainer_idle_frac`` / ``trainer_train_frac`` /
        ``trainer_save_frac``, ``staleness`` (lag -> fraction of trained samples), ``staleness_mean``,
        ``staleness_max``, ``interrupted_per_step``, ``tokens_per_step``, ``mean_running_per_server``,
        ``fill_s`` (time to the end of warm-up) and ``hours`` (predicted hours for ``sc.steps`` steps), all scaled
        back to the full cluster for throughputs.
    Raises:
        ValueError: unknown mode.
    """
    spec = mode_spec(sc, mode, eta)
    if mode == "sync_colocated":  # verl-style: every GPU generates, then every GPU trains
        total = sc.gen_gpus + sc.train_gpus
        sc = dataclasses.replace(sc, gen_gpus=total // sc.gen_tp * sc.gen_tp, train_gpus=total)
    s = scaled(sc, scale)
    c = costs or derive_costs(s)
    sim = _Sim(s, spec, c, sc.seed if seed is None else seed, load_empirical_lengths(sc))
    sim.run()
    a, z = sim.snap, sim.snap_end
    if a is None or z is None:  # pragma: no cover - run() only returns once both exist
        raise RuntimeError("missing snapshots")
    window = z["t"] - a["t"]
    n_steps = s.sim_steps - s.warmup_steps
    srv_time = window * len(sim.servers)
    hist = {k: z["stale_hist"].get(k, 0) - a["stale_hist"].get(k, 0) for k in z["stale_hist"]}
    n_samples = sum(hist.values()) or 1
    stale = {int(k): v / n_samples for k, v in sorted(hist.items()) if v}
    up = sc.n_servers / len(sim.servers)  # throughputs back to the full cluster
    # trained tokens: steps warmup+1..sim_steps are those whose training started after the first snapshot
    trained = sum(sim.step_tokens[s.warmup_steps:s.sim_steps])
    step_s = window / n_steps
    decode_s = z["decode_s"] - a["decode_s"]
    gen_tokens = z["tokens"] - a["tokens"]
    out = {
        "mode": spec.name,
        "eta": None if spec.eta >= UNBOUNDED_ETA else spec.eta,
        "interruptible": spec.interruptible,
        "step_s": step_s,
        "effective_tokens_per_s": trained / window * up,
        "gen_tokens_per_s": gen_tokens / window * up,
        "tokens_per_step": trained / n_steps * up,
        "gen_decode_frac": decode_s / srv_time,
        "gen_prefill_frac": (z["prefill_s"] - a["prefill_s"]) / srv_time,
        "gen_load_frac": (z["load_s"] - a["load_s"]) / srv_time,
        "trainer_train_frac": (z["train_s"] - a["train_s"]) / window,
        "trainer_save_frac": (z["save_s"] - a["save_s"]) / window,
        "trainer_overhead_frac": (z["overhead_s"] - a["overhead_s"]) / window,
        "staleness": stale,
        "staleness_mean": sum(k * v for k, v in stale.items()),
        "staleness_max": max(stale, default=0),
        "interrupted_per_step": (z["interrupted"] - a["interrupted"]) / n_steps * up,
        "mean_running_per_server": gen_tokens / max(z["decode_steps"] - a["decode_steps"], 1e-9),
        "fill_s": a["t"],
        "hours": (a["t"] + (sc.steps - s.warmup_steps) * step_s) / 3600.0,
        "scale": scale,
    }
    out["gen_idle_frac"] = max(0.0, 1.0 - out["gen_decode_frac"] - out["gen_prefill_frac"] - out["gen_load_frac"])
    out["trainer_idle_frac"] = max(0.0, 1.0 - out["trainer_train_frac"] - out["trainer_save_frac"]
                                   - out["trainer_overhead_frac"])
    return out


def compare_modes(sc: Scenario, modes: typing.Sequence[str] = MODES, *, scale: int = 1) -> dict:
    """Simulate each mode; adds ``speedup_vs_sync`` (sync step time / mode step time) to each result."""
    res = {m: simulate(sc, m, scale=scale) for m in modes}
    if "sync" in res:
        for r in res.values():
            r["speedup_vs_sync"] = res["sync"]["step_s"] / r["step_s"]
    return res


def async_sync_ratio(sc: Scenario, *, scale: int = 1) -> float:
    """Predicted speed-up of fully asynchronous over synchronous RL (sync step time / async step time)."""
    return simulate(sc, "sync", scale=scale)["step_s"] / simulate(sc, "async", scale=scale)["step_s"]


# --------------------------------------------------------------------------------------------------------
# sweeps

SENSITIVITY_INPUTS = (
    "response_median_tokens", "response_sigma", "response_prompt_corr", "max_new_tokens", "prompt_tokens",
    "decode_overhead_s", "decode_bw_efficiency", "decode_flops_efficiency", "prefill_flops_efficiency",
    "train_mfu", "train_fixed_s", "weight_io_gb_s", "sync_overhead_s", "gen_gpus", "train_gpus",
    "max_concurrent_groups",
)


def sensitivity(sc: Scenario, *, rel: float = 0.2, inputs: typing.Sequence[str] = SENSITIVITY_INPUTS,
                scale: int = 1) -> dict:
    """Change each input by -rel and +rel (one at a time) and report the async/sync ratio.

    Efficiency constants are capped at 1. Integer inputs are rounded (``gen_gpus`` to a multiple of
    ``gen_tp``). ``max_concurrent_groups`` 0 is read as ``batch_size``. The same random seed is used for every
    run (common random numbers), so differences are not sampling noise.

    Returns:
        ``{"base": ratio, "rel": rel, "inputs": {name: {"base_value", "low_value", "high_value", "low", "high",
        "max_change"}}}`` sorted by decreasing ``max_change`` = max |ratio(+-rel) - base| (not |high - low|:
        near a balance point of generation and training both directions can lower the ratio).
    """
    base = async_sync_ratio(sc, scale=scale)
    rows = {}
    for name in inputs:
        v0 = getattr(sc, name)
        if name == "max_concurrent_groups" and not v0:
            v0 = sc.batch_size
        vals = []
        for f in (1 - rel, 1 + rel):
            v = v0 * f
            if name.endswith("efficiency") or name == "train_mfu" or name == "response_prompt_corr":
                v = min(v, 1.0)
            if isinstance(getattr(Scenario(), name), int):
                v = max(1, round(v))
                if name == "gen_gpus":
                    v = max(sc.gen_tp, round(v / sc.gen_tp) * sc.gen_tp)
            vals.append(v)
        ratios = [async_sync_ratio(dataclasses.replace(sc, **{name: v}), scale=scale) for v in vals]
        rows[name] = {"base_value": v0, "low_value": vals[0], "high_value": vals[1],
                      "low": ratios[0], "high": ratios[1],
                      "max_change": max(abs(ratios[0] - base), abs(ratios[1] - base))}
    rows = dict(sorted(rows.items(), key=lambda kv: -kv[1]["max_change"]))
    return {"base": base, "rel": rel, "inputs": rows}


def split_gpus(sc: Scenario, total: int) -> tuple[int, int]:
    """(generation GPUs, training GPUs) for ``total`` GPUs at the scenario's generation fraction."""
    frac = sc.scaling_gen_fraction or sc.gen_gpus / (sc.gen_gpus + sc.train_gpus)
    gen = max(sc.gen_tp, round(total * frac / sc.gen_tp) * sc.gen_tp)
    gen = min(gen, total - 1)
    return gen, total - gen


def scaling(sc: Scenario, gpus: typing.Sequence[int], modes: typing.Sequence[str] = ("sync", "async"),
            *, scale: int = 1) -> dict:
    """Effective throughput vs total GPUs (same workload, same generation fraction).

    Returns:
        ``{"gpus": [...], "gen_gpus": [...], "train_gpus": [...], mode: [tokens/s, ...], mode+"_step_s": [...]}``.
    """
    out: dict = {"gpus": list(gpus), "gen_gpus": [], "train_gpus": []}
    for m in modes:
        out[m] = []
        out[m + "_step_s"] = []
    for total in gpus:
        g, t = split_gpus(sc, total)
        out["gen_gpus"].append(g)
        out["train_gpus"].append(t)
        s2 = dataclasses.replace(sc, gen_gpus=g, train_gpus=t)
        for m in modes:
            r = simulate(s2, m, scale=scale)
            out[m].append(r["effective_tokens_per_s"])
            out[m + "_step_s"].append(r["step_s"])
    return out


def eta_sweep(sc: Scenario, etas: typing.Sequence[int], *, scale: int = 1) -> dict:
    """Effective throughput of the interruptible async mode for each eta (eta 0 = the sync mode)."""
    rows = {}
    for e in etas:
        r = simulate(sc, "sync", scale=scale) if e == 0 else simulate(sc, "async", eta=e, scale=scale)
        rows["inf" if e < 0 else str(e)] = {"effective_tokens_per_s": r["effective_tokens_per_s"],
                                            "step_s": r["step_s"], "staleness_mean": r["staleness_mean"]}
    return rows


# --------------------------------------------------------------------------------------------------------
# scenario files


_FIELDS = {f.name: f for f in dataclasses.fields(Scenario) if f.name not in ("source", "lines")}
_TYPES = typing.get_type_hints(Scenario)


def scenarios_dir() -> Path:
    """``$AREAL_SCENARIOS_DIR`` or the shipped ``benchmarks/scenarios/`` (:mod:`areal_cli.resources`)."""
    import os

    from areal_cli.resources import shipped_dir

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
    from areal_cli.typed_yaml import coerce, read_yaml

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
    for key, value in data.items():
        where = f"{p}:{lines.get(str(key), 1)}"
        if key not in _FIELDS:
            raise UserError(f"{where}: field '{key}': unknown key")
        setattr(sc, key, coerce(key, value, _TYPES[key], where))
    if "name" not in data:
        sc.name = p.stem
    sc.validate()
    return sc


def apply_overrides(sc: Scenario, overrides: typing.Sequence[str]) -> Scenario:
    """``key=value`` overrides (value parsed as YAML). Raises: UserError naming the override."""
    from areal_cli.typed_yaml import coerce, parse_override

    sc = dataclasses.replace(sc, lines=dict(sc.lines))
    for item in overrides:
        where = f"-o {item}"
        key, value = parse_override(item)
        if key not in _FIELDS:
            raise UserError(f"{where}: field '{key}': unknown key")
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


# --------------------------------------------------------------------------------------------------------
# calibration


def fit_constants(sc: Scenario, targets: dict[str, float], params: typing.Sequence[str] = ("decode_overhead_s",
                  "train_mfu"), *, scale: int = 8, iters: int = 12, tol: float = 0.005) -> tuple[Scenario, dict]:
    """Fit positive scenario constants so simulated step times match ``targets`` (mode -> seconds per step).

    Gauss-Newton on logarithms (finite differences, the same random seed for every run), step halving when
    the error grows; efficiencies are capped at 1. With as many targets as parameters this solves the
    equations when a solution exists; otherwise it returns the least-squares compromise.

    Returns:
        (fitted scenario, ``{"params": {name: value}, "targets": ..., "achieved": {mode: s}, "rel_error":
        {mode: e}, "iterations": n}``).
    Raises:
        ValueError: no targets / no params, or a parameter that is not a positive float field.
    """
    if not targets or not params:
        raise ValueError("need at least one target and one parameter")
    for p in params:
        if _TYPES.get(p) is not float or not getattr(sc, p) > 0:
            raise ValueError(f"cannot fit {p!r}: must be a positive float field")
    modes = list(targets)
    y = np.log([targets[m] for m in modes])

    def clamp(name: str, v: float) -> float:
        return min(v, 1.0) if name.endswith("efficiency") or name == "train_mfu" else v

    def run(x: np.ndarray) -> tuple[Scenario, np.ndarray]:
        s2 = dataclasses.replace(sc, **{p: clamp(p, float(math.exp(v))) for p, v in zip(params, x)})
        return s2, np.log([simulate(s2, m, scale=scale)["step_s"] for m in modes])

    x = np.log([getattr(sc, p) for p in params])
    cur_sc, f = run(x)
    it = 0
    for it in range(1, iters + 1):
        r = f - y
        if np.max(np.abs(r)) < tol:
            break
        h = 0.05
        jac = np.empty((len(modes), len(params)))
        for j in range(len(params)):
            xj = x.copy()
            xj[j] += h
            jac[:, j] = (run(xj)[1] - f) / h
        step, *_ = np.linalg.lstsq(jac, -r, rcond=None)
        step = np.clip(step, -1.0, 1.0)
        for _ in range(6):
            cand_sc, cand_f = run(x + step)
            if np.sum((cand_f - y) ** 2) < np.sum(r ** 2):
                x, f, cur_sc = x + step, cand_f, cand_sc
                break
            step = step / 2
        else:
            break
    achieved = {m: float(math.exp(v)) for m, v in zip(modes, f)}
    return cur_sc, {
        "params": {p: getattr(cur_sc, p) for p in params},
        "targets": dict(targets), "achieved": achieved,
        "rel_error": {m: achieved[m] / targets[m] - 1 for m in modes}, "iterations": it, "scale": scale,
    }


def fit_to_published(sc: Scenario, **kw) -> tuple[Scenario, dict]:
    """Fit ``decode_overhead_s`` and ``train_mfu`` to the scenario's ``published`` sync and async hours
    (seconds per step = hours * 3600 / ``steps``). Raises: UserError if the scenario has no such figures."""
    pub = sc.published or {}
    if "sync_hours" not in pub or "async_hours" not in pub:
        raise UserError(f"{sc.source or 'scenario'}: field 'published': needs sync_hours and async_hours to fit")
    targets = {"sync": pub["sync_hours"] * 3600 / sc.steps, "async": pub["async_hours"] * 3600 / sc.steps}
    return fit_constants(sc, targets, **kw)


def _read_run_records(path: Path) -> dict[str, tuple[int | None, list[dict]]]:
    """Per-step records of the runs in ``path``: ``{run name: (eta or None, [step dicts])}``.

    Accepts an ``areal train`` ``metrics.jsonl`` (one run) or a JSON file with ``runs``: a list or mapping of
    runs, each with ``steps`` / ``metrics`` (a list of step dicts) or ``metrics_jsonl`` (a path, relative to the
    JSON file) or ``dir`` (a run folder with ``metrics.jsonl`` and optionally ``timeline.json``, as in
    ``areal bench throughput`` results), and optionally ``name`` / ``label`` and ``eta``.

    Raises:
        UserError: unreadable file, bad JSON, or no step records (``file:line`` for JSONL).
    """
    import json

    if not path.is_file():
        raise UserError(f"{path}: file not found")

    def jsonl(p: Path) -> list[dict]:
        rows = []
        try:
            text = p.read_text()
        except OSError as e:
            raise UserError(f"{p}: cannot read: {e.strerror}") from None
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise UserError(f"{p}:{i}: invalid JSON: {e.msg}") from None
        return rows

    if path.suffix == ".jsonl":
        return {path.stem: (None, jsonl(path))}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    runs = data.get("runs") if isinstance(data, dict) else None
    if isinstance(runs, dict):
        runs = [dict(v, name=v.get("name", k)) for k, v in runs.items() if isinstance(v, dict)]
    if not isinstance(runs, list) or not runs:
        raise UserError(f"{path}: field 'runs': expected a list or mapping of runs with per-step records")
    out = {}
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise UserError(f"{path}: field 'runs[{i}]': expected a mapping")
        name = str(run.get("name", run.get("label", run.get("mode", f"run{i}"))))
        steps = run.get("steps") or run.get("metrics")
        if steps is None and run.get("metrics_jsonl"):
            mp = Path(run["metrics_jsonl"])
            steps = jsonl(mp if mp.is_absolute() else path.parent / mp)
        if steps is None and run.get("dir"):  # `areal bench throughput`: the run's own folder
            d = Path(run["dir"])
            cands = [d, path.parent / d, path.parent / "runs" / d.name]
            d = next((c for c in cands if (c / "metrics.jsonl").is_file()), None)
            if d is None:
                raise UserError(f"{path}: field 'runs[{i}].dir': no metrics.jsonl in {run['dir']}")
            steps = jsonl(d / "metrics.jsonl")
            if (d / "timeline.json").is_file():  # exact tokens trained per step
                tl = json.loads((d / "timeline.json").read_text())
                tok = {t["step"]: t["tokens"] for t in tl.get("steps", []) if "tokens" in t}
                for r in steps:
                    if r.get("step") in tok:
                        r["trained_tokens"] = tok[r["step"]]
        if not isinstance(steps, list):
            raise UserError(f"{path}: field 'runs[{i}]': no 'steps', 'metrics', 'metrics_jsonl' or 'dir'")
        eta = run.get("eta", run.get("max_head_offpolicyness"))
        out[name] = (int(eta) if isinstance(eta, int) else None, steps)
    return out


def measured_step_figures(records: list[dict]) -> dict:
    """Means over the RL steps of one run (records as in ``metrics.jsonl``): seconds per step, training,
    publishing, waiting and other (evaluation) time per step, tokens and samples generated per step,
    accepted fraction, mean response length, truncated fraction. The first RL step (pipeline fill) and the last
    (final evaluation) are left out.

    Raises:
        UserError: fewer than 3 RL steps, or a record without the needed fields.
    """
    rl = [r for r in records if r.get("phase", "rl") == "rl" and "step" in r]
    if len(rl) < 4:
        raise UserError(f"need at least 4 RL steps with per-step timings, got {len(rl)}")
    need = ("elapsed_s", "train_s", "sync_s", "wait_s", "tokens_generated", "samples_generated")
    for r in rl:
        miss = [k for k in need if k not in r]
        if miss:
            raise UserError(f"step {r.get('step')}: field '{miss[0]}' missing")
    rows = rl[1:-1]  # the first step fills the pipeline; the last often carries the final evaluation
    n = len(rows) - 1
    dt = (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]) / n
    d = lambda k: (rows[-1][k] - rows[0][k]) / n  # noqa: E731 - cumulative counters per step
    train = float(np.mean([r["train_s"] for r in rows[1:]]))
    sync = float(np.mean([r["sync_s"] for r in rows[1:]]))
    wait = float(np.mean([r["wait_s"] for r in rows[1:]]))
    sub = d("groups_submitted") if "groups_submitted" in rows[0] else None
    acc = d("groups_accepted") if "groups_accepted" in rows[0] else None
    return {
        "steps": n, "step_s": dt, "train_s": train, "sync_s": sync, "wait_s": wait,
        "other_s": max(0.0, dt - train - sync - wait),
        "tokens_generated_per_step": d("tokens_generated"), "samples_per_step": d("samples_generated"),
        "response_mean_tokens": d("tokens_generated") / max(d("samples_generated"), 1e-9),
        "accept_fraction": (acc / sub) if sub and acc else 1.0,
        "truncated_frac": float(np.mean([r.get("truncated_frac", 0.0) for r in rows])),
        "staleness_mean": float(np.mean([r.get("staleness_mean", 0.0) for r in rows])),
    }


def calibrate_from_run(results_json: str | Path, base: Scenario | None = None, *, sync_run: str | None = None,
                       scale: int = 1) -> tuple[Scenario, dict]:
    """Fit a scenario to a measured run on this machine.

    From the synchronous run (eta 0: generation, training and publishing do not overlap) the trainer side is
    read directly: ``train_fixed_s`` + per-token cost from a least-squares line of ``train_s`` against the
    tokens trained per step; ``sync_save_s`` = mean publish time (the loop saves and loads inside it;
    ``sync_load_s`` = 0); ``trainer_overhead_s`` = mean of the rest of the step (held-out evaluation);
    ``accept_fraction`` and the mean response length from the counters. The generation side is fitted by
    simulation: ``decode_step_fixed_s`` (one decode step of the CPU server, batch-independent on the tiny
    model) is solved so that the simulated synchronous step time equals the measured one.

    Args:
        results_json: ``metrics.jsonl`` of an ``areal train`` run with ``max_head_offpolicyness=0`` or a
            results JSON with several runs (see :func:`_read_run_records`).
        base: scenario to start from (cluster shape, batch, group size, max_new_tokens, prompt length).
        sync_run: name of the synchronous run in a multi-run file (default: the one whose staleness is 0).
    Returns:
        (fitted scenario, report with the measured figures of every run, the fitted values, and for each
        other run the simulated vs measured step time).
    Raises:
        UserError: unreadable input, no synchronous run, missing fields.
    """
    path = Path(results_json)
    runs = _read_run_records(path)
    figs = {name: measured_step_figures(rows) for name, (_, rows) in runs.items()}
    if sync_run is None:
        cands = [n for n, f in figs.items() if runs[n][0] == 0 or (runs[n][0] is None and f["staleness_mean"] == 0.0)]
        if not cands:
            raise UserError(f"{path}: no synchronous run (eta 0, staleness 0 in every step) to calibrate on")
        sync_run = cands[0]
    if sync_run not in figs:
        raise UserError(f"{path}: no run named {sync_run!r} (runs: {', '.join(figs)})")
    f = figs[sync_run]
    sync_rows = [r for r in runs[sync_run][1] if r.get("phase", "rl") == "rl" and "step" in r][1:-1]
    sc = dataclasses.replace(base or Scenario(), lines={})
    seq = sc.prompt_tokens + f["response_mean_tokens"]
    default_tokens = sc.batch_size * sc.group_size * seq  # when a record does not say how many tokens it trained
    tokens = np.array([r.get("trained_tokens", default_tokens) for r in sync_rows], dtype=float)
    train_s = np.array([r["train_s"] for r in sync_rows], dtype=float)
    slope, intercept = np.polyfit(tokens, train_s, 1) if np.ptp(tokens) > 0 else (0.0, 0.0)
    if slope <= 0 or intercept < 0:  # no usable spread in tokens: all cost per token
        slope, intercept = float(train_s.mean() / tokens.mean()), 0.0
    sigma = sc.response_sigma
    med = f["response_mean_tokens"] / math.exp(sigma * sigma / 2)
    sc = dataclasses.replace(
        sc, train_fixed_s=float(intercept), train_gpu_s_per_token=float(slope) * sc.train_gpus,
        train_gpu_s_per_token_sq=0.0, sync_save_s=f["sync_s"], sync_load_s=0.0, trainer_overhead_s=f["other_s"],
        accept_fraction=min(1.0, max(1e-3, f["accept_fraction"])), response_median_tokens=max(1.0, med),
        decode_step_per_seq_s=sc.decode_step_per_seq_s or 0.0, decode_step_per_ctx_token_s=sc.decode_step_per_ctx_token_s or 0.0,
        prefill_s_per_token=sc.prefill_s_per_token or 0.0, decode_step_fixed_s=sc.decode_step_fixed_s or 0.01,
    )
    # solve decode_step_fixed_s: simulated sync step time = measured (bisection on a monotone function)
    lo, hi = 1e-6, 1.0
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        t = simulate(dataclasses.replace(sc, decode_step_fixed_s=mid), "sync", scale=scale)["step_s"]
        lo, hi = (mid, hi) if t < f["step_s"] else (lo, mid)
        if hi / lo < 1.002:
            break
    sc = dataclasses.replace(sc, decode_step_fixed_s=math.sqrt(lo * hi))
    checks = {}
    for name, fig in figs.items():
        eta = runs[name][0]
        if eta is None:
            eta = 0 if name == sync_run else sc.eta
        r = simulate(sc, "sync", scale=scale) if eta == 0 else simulate(sc, "async", eta=eta, scale=scale)
        checks[name] = {"eta": eta, "measured_step_s": fig["step_s"], "simulated_step_s": r["step_s"],
                        "rel_error": r["step_s"] / fig["step_s"] - 1,
                        "measured_staleness_mean": fig["staleness_mean"], "simulated_staleness_mean": r["staleness_mean"]}
    report = {"source": str(path), "sync_run": sync_run, "measured": figs,
              "fitted": {k: getattr(sc, k) for k in ("decode_step_fixed_s", "train_fixed_s", "train_gpu_s_per_token",
                                                       "sync_save_s", "trainer_overhead_s", "accept_fraction",
                                                       "response_median_tokens")},
              "checks": checks}
    return sc, report

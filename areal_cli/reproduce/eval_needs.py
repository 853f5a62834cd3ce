"""What the evaluation of a reproduction needs (:func:`eval_needs`): GPUs, memory, the token budget, a time
estimate with its assumptions, the Codeforces data; and the exact commands that pin an unpinned checkpoint
(:func:`pin_commands`). Everything is derived offline from the recipe, the benchmark declarations and the model's
shape; nothing is downloaded.

How the figures are derived (each is printed with its basis):

- **model shape**: the local ``--model DIR``'s ``config.json`` when given, else the published ``config.json`` of the
  recipe's base model (:data:`KNOWN_SHAPES`; a published checkpoint is a fine-tune of it: same shape). Parameters
  are counted from the shape (embeddings, attention, SwiGLU MLP), so they can be checked against the model card.
- **memory**: weights at bf16 (2 bytes a parameter) + the KV cache of :data:`EVAL_CONCURRENCY` sequences in flight
  (``areal eval``'s ``max_concurrency``), each at its longest (prompt allowance + ``max_new_tokens``): the worst case.
- **GPUs**: 80 GB GPUs (AReaL's runs used H800s) of which SGLang's ``mem_fraction_static`` is usable, rounded up to
  a power of two (a tensor-parallel size).
- **tokens**: problems x (samples + a greedy completion when the protocol runs one) x ``max_new_tokens``, an upper
  bound (every completion at its budget). Problems: the expected file's ``n_problems``, else the count in the
  benchmark's declaration, else a bound from its data card (:data:`DATA_CARD_BOUNDS`).
- **time**: the slower of two bounds of decoding throughput on the GPUs: compute (:data:`PEAK_TFLOPS` at
  :data:`ASSUMED_UTILISATION`, per token 2 x parameters + attention 4 x layers x heads x head_dim x mean context) and
  memory (each decode step reads the weights and every running sequence's KV cache at :data:`HBM_TB_S` x
  :data:`BANDWIDTH_UTILISATION`). With 64 sequences of 10k+ tokens the memory bound decides.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Generation requests in flight during ``areal reproduce``'s evaluations (passed to ``areal eval``).
EVAL_CONCURRENCY = 64
#: Memory of one GPU (GB); AReaL's published runs used 80 GB H800s.
GPU_MEMORY_GB = 80.0
#: NVIDIA H100 SXM datasheet: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3 (an H800 has the same compute and memory).
PEAK_TFLOPS = 989.0
HBM_TB_S = 3.35
#: Assumed fraction of peak compute reached while decoding (conservative: decode is not compute bound).
ASSUMED_UTILISATION = 0.30
#: Assumed fraction of peak memory bandwidth reached while decoding.
BANDWIDTH_UTILISATION = 0.70
#: SGLang's default ``mem_fraction_static`` (when the recipe sets none): the share of GPU memory for weights + KV.
DEFAULT_MEM_FRACTION = 0.88
#: Prompt tokens allowed per sequence when the recipe sets no ``max_prompt_len``.
DEFAULT_PROMPT_TOKENS = 2048
BF16_BYTES = 2

#: Upper bounds on problem counts the declarations do not give: benchmark -> (default window, bound, source).
DATA_CARD_BOUNDS = {
    "lcb_v5": ("2024-10-01..2025-02-01", 279,
               "at most: data_cards/lcb_v5.md gives 279 problems for the wider 2024-08-01..2025-02-01 window"),
}


@dataclass(frozen=True)
class ModelShape:
    """The shape of a decoder-only transformer (Qwen2 / Qwen3 / Llama: GQA attention, SwiGLU MLP)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    source: str

    @property
    def params(self) -> int:
        """Parameters counted from the shape: embeddings (twice when untied), per layer q/k/v/o projections and
        the three SwiGLU matrices (norms and biases are below 0.1% and left out)."""
        attn = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        mlp = 3 * self.hidden * self.intermediate
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2) + self.layers * (attn + mlp)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token holds at bf16: K and V x layers x KV heads x head_dim x 2 bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * BF16_BYTES

    def flops_per_token(self, context: float) -> float:
        """Forward FLOPs of one decoded token: 2 x parameters + attention over ``context`` tokens (q.k and the
        weighted sum of v: 4 x layers x heads x head_dim x context)."""
        return 2.0 * self.params + 4.0 * self.layers * self.heads * self.head_dim * context

    @classmethod
    def from_config(cls, cfg: dict[str, Any], source: str) -> "ModelShape | None":
        """The shape in a Hugging Face ``config.json`` dict; None when a field is missing."""
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            return cls(int(cfg["num_hidden_layers"]), hidden, heads, int(cfg.get("num_key_value_heads", heads)),
                       int(cfg.get("head_dim") or hidden // heads), int(cfg["intermediate_size"]),
                       int(cfg["vocab_size"]), bool(cfg.get("tie_word_embeddings", False)), source)
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        """``14.77 B parameters (40 layers, hidden 5120, 40 heads, 8 KV heads x 128)``."""
        return (f"{self.params / 1e9:.2f} B parameters ({self.layers} layers, hidden {self.hidden}, {self.heads} "
                f"heads, {self.kv_heads} KV heads x {self.head_dim})")


def _hub(repo: str, layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int) -> ModelShape:
    return ModelShape(layers, hidden, heads, kv, 128, inter, vocab, False, f"{repo} config.json")


#: The published ``config.json`` shapes of the recipes' base models (their counts match the model cards: 14.8B,
#: 8.2B, 1.78B, 7.62B, 32.8B).
KNOWN_SHAPES = {s.source.split()[0]: s for s in (
    _hub("Qwen/Qwen3-14B", 40, 5120, 40, 8, 17408, 151936),
    _hub("Qwen/Qwen3-8B", 36, 4096, 32, 8, 12288, 151936),
    _hub("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 28, 1536, 12, 2, 8960, 151936),
    _hub("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 28, 3584, 28, 4, 18944, 152064),
    _hub("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", 64, 5120, 40, 8, 27648, 152064),
)}


@dataclass
class BenchmarkBudget:
    """One evaluation run's token budget: ``problems`` (None: unknown) x ``completions`` x ``max_new_tokens``."""

    name: str
    problems: int | None
    problems_basis: str
    at_most: bool
    completions: int  # samples + 1 greedy completion when the protocol runs a greedy pass
    greedy: bool
    max_new_tokens: int

    @property
    def tokens(self) -> int | None:
        """The new-token budget (every completion at ``max_new_tokens``); None when the problems are unknown."""
        return None if self.problems is None else self.problems * self.completions * self.max_new_tokens


@dataclass
class EvalNeeds:
    """What the evaluation of a plan needs (see the module docstring); ``lines()`` renders it."""

    shape: ModelShape | None
    shape_note: str
    budgets: list[BenchmarkBudget]
    prompt_tokens: int
    mem_fraction: float
    cf_data: str | None
    weights_gb: float | None = None
    kv_gb: float | None = None
    gpus: int | None = None
    tokens_per_s: float | None = None
    bound: str = ""
    hours: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def total_tokens(self) -> int | None:
        """The token budget of every run together (None when a benchmark's problem count is unknown)."""
        parts = [b.tokens for b in self.budgets]
        return None if any(t is None for t in parts) else sum(parts)  # type: ignore[misc]

    def lines(self) -> list[tuple[str, str]]:
        """``(label, text)`` rows for the plan panel."""
        rows: list[tuple[str, str]] = []
        if self.shape is not None:
            rows.append(("eval model", f"{self.shape.describe()}; {self.shape_note}"))
        else:
            rows.append(("eval model", f"shape unknown ({self.shape_note}): memory and time are not estimated"))
        ctx = self.prompt_tokens + max((b.max_new_tokens for b in self.budgets), default=0)
        if self.shape is not None and self.weights_gb is not None and self.kv_gb is not None:
            usable = GPU_MEMORY_GB * self.mem_fraction
            rows.append(("eval memory", (
                f"{self.weights_gb + self.kv_gb:.1f} GB = weights {self.weights_gb:.1f} GB at bf16 + KV cache "
                f"{self.kv_gb:.1f} GB for {EVAL_CONCURRENCY} sequences in flight (areal eval's max_concurrency "
                f"in a reproduction) x {ctx:,} tokens ({self.prompt_tokens:,} prompt + "
                f"{ctx - self.prompt_tokens:,} new) x {self.shape.kv_bytes_per_token / 1024:.0f} KiB/token "
                f"(worst case: every sequence at full length)")))
            rows.append(("eval GPUs", (
                f"{self.gpus} x {GPU_MEMORY_GB:.0f} GB (tensor parallel {self.gpus}; {usable:.0f} GB usable each at "
                f"SGLang mem_fraction_static {self.mem_fraction:g}); the weights alone fit on "
                f"{max(1, math.ceil(self.weights_gb / usable))} (with fewer sequences in flight, slower)")))
        parts = []
        for b in self.budgets:
            n = "?" if b.problems is None else f"{'≤ ' if b.at_most else ''}{b.problems:,}"
            what = f"({b.completions - 1} samples + 1 greedy)" if b.greedy else f"{b.completions} samples"
            tok = "?" if b.tokens is None else f"{b.tokens / 1e6:,.1f} M"
            parts.append(f"{b.name}: {n} problems x {what} x {b.max_new_tokens:,} tokens = {tok} "
                         f"(problems: {b.problems_basis})")
        total = self.total_tokens
        at_most = any(b.at_most for b in self.budgets)
        parts.append(("total: ?" if total is None else f"total: {'≤ ' if at_most else ''}{total / 1e6:,.1f} M") +
                     " new tokens (upper bound: every completion at its max_new_tokens)")
        rows.append(("eval tokens", "\n".join(parts)))
        if self.hours is not None and self.tokens_per_s is not None:
            rows.append(("eval time", (
                f"{'≤ ' if at_most else ''}{self.hours:.1f} h on {self.gpus} GPUs ({self.hours * (self.gpus or 0):.0f} "
                f"GPU-hours) at {self.tokens_per_s:,.0f} tokens/s ({self.tokens_per_s / (self.gpus or 1):,.0f} per "
                f"GPU), {self.bound}")))
        elif self.shape is not None:
            rows.append(("eval time", "not estimated: a benchmark's problem count is unknown"))
        if self.cf_data:
            rows.append(("eval --cf-data", self.cf_data))
        rows += [("eval note", n) for n in self.notes]
        return rows


def problem_count(benchmark: str, date_window: tuple[str, str] | None, entries: list[Any],
                  specs: dict[str, Any]) -> tuple[int | None, str, bool]:
    """``(problems, basis, at_most)`` of one benchmark: the expected file's ``n_problems``, else the count in the
    declaration's ``source`` (``"... (165 problems)"``; an upper bound when the declaration excludes problems or has a
    date window), else :data:`DATA_CARD_BOUNDS` for its default window; ``(None, why, False)`` otherwise."""
    for m in entries:
        if m.benchmark == benchmark and getattr(m, "n_problems", None):
            return int(m.n_problems), "the expected file's n_problems", False
    spec = specs.get(benchmark)
    found = re.search(r"\(([^()]*?\b)?([\d,]+) problems\)", getattr(spec, "source", "") or "")
    if found:
        n = int(found.group(2).replace(",", ""))
        excludes = bool(getattr(spec, "exclude", None))
        dated = bool(getattr(spec, "date_field", None)) and date_window is not None
        why = "evaluation/benchmarks.json" + (
            ", before it excludes " + ", ".join(spec.exclude) if excludes else "") + (
            ", before the date window" if dated else "")
        return n, why, excludes or dated
    window = "..".join(date_window) if date_window else None
    if benchmark in DATA_CARD_BOUNDS and DATA_CARD_BOUNDS[benchmark][0] == window:
        _, n, why = DATA_CARD_BOUNDS[benchmark]
        return n, why, True
    return None, "not declared: count it with `areal eval --data " + benchmark + " --limit 1` (its load report)", False


def model_shape(recipe: Any, subject: str, model_dir: Path | None) -> tuple[ModelShape | None, str]:
    """The shape of the model the evaluation loads and where it comes from (see the module docstring)."""
    if model_dir is not None:
        cfg_path = Path(model_dir) / "config.json"
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cfg = None
        shape = ModelShape.from_config(cfg, str(cfg_path)) if isinstance(cfg, dict) else None
        if shape is not None:
            return shape, f"from {cfg_path}"
        return None, f"no readable config.json in {model_dir}"
    base = recipe.file.model.repo if recipe.file.model is not None else None
    shape = KNOWN_SHAPES.get(base or "")
    if shape is None:
        return None, f"no published shape known for {base or 'a built-in model'}"
    what = {"published": f"the published checkpoint is a fine-tune of {base}, same shape",
            "base": f"the base model {base}", "trained": f"the trained model: a fine-tune of {base}, same shape"}
    return shape, f"{what.get(subject, base)} ({shape.source})"


def eval_needs(plan: Any, model_dir: Path | None = None) -> EvalNeeds | None:
    """What the evaluation runs of ``plan`` (:class:`areal_cli.reproduce.plan.Plan`) need; None without any.

    The GPU count is the smallest power of two whose usable memory holds the weights and the worst-case KV cache;
    the time assumes that many GPUs decode :data:`EVAL_CONCURRENCY` sequences at once (module docstring).
    """
    if not plan.eval_groups:
        return None
    from areal_cli.eval.benchmarks import load_benchmark_specs
    from areal_cli.eval.protocols import get_protocol
    from areal_cli.foundations.errors import UserError

    recipe = plan.recipe
    specs = load_benchmark_specs()
    budgets = []
    for g in plan.eval_groups:
        s = g.settings
        try:
            greedy = bool(get_protocol(s["protocol"]).greedy_pass)
        except UserError:
            greedy = False
        n, basis, at_most = problem_count(g.benchmark, g.date_window, plan.expected, specs)
        budgets.append(BenchmarkBudget(g.name, n, basis, at_most, int(s["n_samples"]) + int(greedy), greedy,
                                       int(s["max_new_tokens"])))
    train = recipe.train
    prompt = int(getattr(train, "max_prompt_len", 0) or DEFAULT_PROMPT_TOKENS)
    fraction = float(getattr(train, "sglang_mem_fraction_static", 0) or DEFAULT_MEM_FRACTION)
    shape, note = model_shape(recipe, plan.subject, model_dir)
    cf = None
    rated = [m.key for m in plan.expected if m.benchmark == "codeforces" and m.metric in ("rating", "percentile")
             and any(g.benchmark == "codeforces" for g in plan.eval_groups)]
    if rated:
        cf = (f"needed for {', '.join(rated)}: pass --cf-data DIR (contest data: evaluation/codeforces/README.md); "
              f"without it these checks are skipped, pass@1 is still measured")
    needs = EvalNeeds(shape, note, budgets, prompt, fraction, cf)
    if shape is None:
        return needs
    ctx = prompt + max(b.max_new_tokens for b in budgets)
    needs.weights_gb = shape.params * BF16_BYTES / 1e9
    needs.kv_gb = EVAL_CONCURRENCY * ctx * shape.kv_bytes_per_token / 1e9
    usable = GPU_MEMORY_GB * fraction
    needs.gpus = 2 ** math.ceil(math.log2(max(1.0, (needs.weights_gb + needs.kv_gb) / usable)))
    total = needs.total_tokens
    if total is None:
        return needs
    mean_ctx = prompt + (ctx - prompt) / 2  # the prompt, then half the budget on average
    compute = needs.gpus * PEAK_TFLOPS * 1e12 * ASSUMED_UTILISATION / shape.flops_per_token(mean_ctx)
    step_s = ((needs.weights_gb + EVAL_CONCURRENCY * mean_ctx * shape.kv_bytes_per_token / 1e9)
              / (needs.gpus * HBM_TB_S * 1e3 * BANDWIDTH_UTILISATION))
    memory = EVAL_CONCURRENCY / step_s
    needs.tokens_per_s = min(compute, memory)
    which = "memory" if memory <= compute else "compute"
    needs.bound = (
        f"{which} bound (the slower of: compute {compute:,.0f} tokens/s = {needs.gpus} x {PEAK_TFLOPS:g} TFLOP/s "
        f"(H100/H800 bf16 dense, datasheet) x {ASSUMED_UTILISATION:.0%} assumed utilisation / "
        f"{shape.flops_per_token(mean_ctx) / 1e9:.1f} GFLOP per token (2 x parameters + attention at a mean context of "
        f"{mean_ctx:,.0f}); memory {memory:,.0f} tokens/s = {EVAL_CONCURRENCY} sequences per decode step reading the "
        f"weights and their KV cache at {HBM_TB_S:g} TB/s x {BANDWIDTH_UTILISATION:.0%} per GPU)")
    needs.hours = total / needs.tokens_per_s / 3600
    return needs


def pin_commands(item: Any, recipe: Any) -> str:
    """The exact commands that pin the unpinned download ``item`` (:class:`areal_cli.reproduce.download.DownloadItem`)
    of ``recipe``: print the repo's current commit, fetch that commit with ``areal download``, and use it (a
    checkpoint: ``--model DIR``; any: write the SHA into the recipe's ``revision`` field)."""
    import shlex
    import sys

    dataset = item.repo_type == "dataset"
    info = "dataset_info" if dataset else "model_info"
    local = f"checkpoints/{item.repo_id.split('/')[-1]}"
    # the kit's own interpreter: it has huggingface_hub (a bare `python` may not)
    lines = [
        f"{shlex.quote(sys.executable)} -c \"from huggingface_hub import HfApi; "
        f"print(HfApi().{info}('{item.repo_id}').sha)\"  # -> SHA",
        f"areal download {'datasets/' if dataset else ''}{item.repo_id} --revision SHA --local-dir {local}",
    ]
    if item.role == "published":
        rated = "codeforces" in recipe.file.eval.benchmarks
        lines.append(f"areal reproduce {recipe.name} --eval-only --model {local}"
                     + (" --cf-data DIR  # DIR: evaluation/codeforces/README.md" if rated else ""))
    lines.append(f"(or, in a copy of the recipe, write SHA as the revision of the field at {item.origin}, then "
                 f"`areal download COPY.yaml --what {item.role}`)")
    return "\n".join(lines)

"""``areal eval``: datasets -> prompts -> generation -> grading -> metrics -> results files.

Protocol (adapted from AReaL ``evaluation/eval_and_aggregate.py`` + ``math_eval.py``, see
shared/reference/areal_v03_published.md section (d)): for every problem of every selected benchmark,
``n`` samples are generated from the model's chat-template prompt (:mod:`areal_cli.eval.prompts`), each
sample's last ``\\boxed{}`` answer is graded against the gold answer with math-verify in a process pool
with a hard per-answer timeout (:mod:`areal_cli.reward.math_grader`, :class:`RewardPool`), and the
dataset reports mean pass@1, unbiased pass@k for k = powers of two <= n, and maj@n
(:mod:`areal_cli.eval.metrics`). A grader timeout or error counts as wrong AND is counted in the
results (``n_grader_timeouts`` / ``n_grader_errors``); it is never a silent zero.

Differences from AReaL, on purpose: one generation pass of ``n`` samples (AReaL adds a separate greedy
pass); the chat template comes from the model's tokenizer instead of a per-family hard-coded string;
grading is math-verify instead of the Qwen2.5-Math ``math_equal``; gold answers come from the
``answer`` field for all four files (AReaL extracts math_500's from ``solution``: same values).

Outputs (both written atomically, only after everything succeeded):
- ``out_dir/results.json``: ``{"config": {...}, "<dataset>": {"pass@1": .., "pass@2": .., ...,
  "maj@N": .., "n_problems": .., "n_samples": N, ...}}``; metric values are fractions in [0, 1].
- ``out_dir/samples.jsonl``: one line per sample: dataset, problem_id, sample_index, output_ids, text,
  extracted, correct, grader_status, grader_message, finish_reason, gold.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

from areal_cli.atomic import write_atomic_many
from areal_cli.errors import UserError
from areal_cli.eval.datasets import Problem, load_datasets
from areal_cli.eval.metrics import majority_vote, mean_pass_at_k, pass_k_values
from areal_cli.eval.prompts import USER_TEMPLATE, prompt_text, tokenize_prompt
from areal_cli.reward.pool import RewardPool, RewardResult

GRADE_FN = "areal_cli.reward.math_grader:grade"
EQUIVALENT_FN = "areal_cli.reward.math_grader:equivalent"
DEFAULT_GRADER_TIMEOUT_S = 10.0
DEFAULT_GRADER_WORKERS = 2
TINY_MODEL_SEED = 0


# ---------------------------------------------------------------------------------------------- grading
def _verdict_fields(result: RewardResult) -> dict[str, Any]:
    """Per-sample grading fields from a pool result of ``math_grader.grade``."""
    if result.status == "ok":
        extracted, correct = result.value
        return {"extracted": extracted, "correct": bool(correct), "grader_status": "ok", "grader_message": ""}
    return {"extracted": None, "correct": False, "grader_status": result.status, "grader_message": result.message}


def grade_completions(
    records: Iterable[dict[str, Any]],
    *,
    pool: RewardPool | None = None,
    timeout_s: float = DEFAULT_GRADER_TIMEOUT_S,
    n_workers: int = DEFAULT_GRADER_WORKERS,
) -> list[dict[str, Any]]:
    """Grade completions with the math grader in a process pool (hard timeout per answer).

    Args:
        records: dicts with at least ``text`` (the completion) and ``gold`` (the gold answer); other
            keys (dataset, problem_id, sample_index, output_ids, ...) are passed through.
        pool: an open pool running ``areal_cli.reward.math_grader:grade``; if None, one is created with
            ``n_workers`` workers and ``timeout_s`` and closed afterwards.

    Returns:
        copies of the records, in order, with ``extracted`` (str | None), ``correct`` (bool),
        ``grader_status`` ("ok" | "error" | "timeout") and ``grader_message`` added. Timeouts and errors
        are graded wrong and visible in ``grader_status``.
    """
    items = [dict(r) for r in records]
    for i, r in enumerate(items):
        if "text" not in r or "gold" not in r:
            raise ValueError(f"record {i} needs 'text' and 'gold' keys, has {sorted(r)}")
    own = pool is None
    if own:
        pool = RewardPool(GRADE_FN, n_workers=n_workers, timeout_s=timeout_s)
    try:
        results = pool.score_many([(r["text"], r["gold"]) for r in items], fn=GRADE_FN)
    finally:
        if own:
            pool.close()
    for r, res in zip(items, results):
        r.update(_verdict_fields(res))
    return items


class _PoolEquivalence:
    """``(reference, candidate) -> bool`` through the pool (math-verify, hard timeout); failures count
    as "not equivalent" and are counted in :attr:`failures`."""

    def __init__(self, pool: RewardPool) -> None:
        self.pool = pool
        self.failures = 0

    def __call__(self, reference: str, candidate: str) -> bool:
        (res,) = self.pool.score_many([(reference, candidate)], fn=EQUIVALENT_FN)
        if res.status != "ok":
            self.failures += 1
            return False
        return bool(res.value)


def summarize(graded: Sequence[dict[str, Any]], *, pool: RewardPool | None = None) -> dict[str, dict[str, Any]]:
    """Per-dataset metrics from graded samples.

    Args:
        graded: records with ``dataset``, ``problem_id``, ``sample_index``, ``extracted``, ``correct``,
            ``grader_status`` (from :func:`grade_completions`); optional ``output_ids``, ``finish_reason``.
            Every problem of a dataset must have the same number n of samples, indices 0..n-1.
        pool: if given, maj@n also merges answers that math-verify finds equivalent (pool calls of
            ``math_grader:equivalent``); without it, answers group by normalised string and by shared
            correctness against the gold answer only.

    Returns:
        ``{dataset: {"pass@1", "pass@2", ..., "pass@K" (K = powers of two <= n), "maj@n",
        "n_problems", "n_samples" (= n per problem), "n_no_answer", "n_grader_errors",
        "n_grader_timeouts", "n_equivalence_failures", ["mean_output_tokens", "n_truncated"]}}``,
        in order of first appearance. Metric values are fractions in [0, 1].

    Raises:
        ValueError: inconsistent sample counts or indices.
    """
    from areal_cli.reward.math_grader import normalize_answer_string

    by_ds: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in graded:
        by_ds.setdefault(str(r["dataset"]), {}).setdefault(str(r["problem_id"]), []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for ds, problems in by_ds.items():
        sizes = {len(s) for s in problems.values()}
        if len(sizes) != 1:
            raise ValueError(f"dataset {ds}: problems have different numbers of samples {sorted(sizes)}")
        (n,) = sizes
        equiv = _PoolEquivalence(pool) if pool is not None else None
        counts: list[int] = []
        maj_correct = 0
        for pid, samples in problems.items():
            samples = sorted(samples, key=lambda s: int(s["sample_index"]))
            if [int(s["sample_index"]) for s in samples] != list(range(n)):
                raise ValueError(f"dataset {ds} problem {pid}: sample indices are not 0..{n - 1}")
            verdicts = [bool(s["correct"]) for s in samples]
            counts.append(sum(verdicts))
            vote = majority_vote(
                [s.get("extracted") for s in samples], verdicts, normalize=normalize_answer_string, equivalent=equiv
            )
            maj_correct += int(vote.correct)
        flat = [s for ss in problems.values() for s in ss]
        metrics: dict[str, Any] = {f"pass@{k}": mean_pass_at_k(counts, n, k) for k in pass_k_values(n)}
        metrics[f"maj@{n}"] = maj_correct / len(problems)
        metrics["n_problems"] = len(problems)
        metrics["n_samples"] = n
        metrics["n_no_answer"] = sum(s.get("extracted") is None for s in flat)
        metrics["n_grader_errors"] = sum(s.get("grader_status") == "error" for s in flat)
        metrics["n_grader_timeouts"] = sum(s.get("grader_status") == "timeout" for s in flat)
        metrics["n_equivalence_failures"] = equiv.failures if equiv is not None else 0
        if all("output_ids" in s for s in flat):
            metrics["mean_output_tokens"] = sum(len(s["output_ids"]) for s in flat) / len(flat)
        if all("finish_reason" in s for s in flat):
            metrics["n_truncated"] = sum(s["finish_reason"] == "length" for s in flat)
        out[ds] = metrics
    return out


# ---------------------------------------------------------------------------------------------- files
def write_results(out_dir: Path, results: dict[str, Any], samples: Sequence[dict[str, Any]]) -> None:
    """Write ``results.json`` and ``samples.jsonl`` into ``out_dir`` atomically (see :func:`areal_cli.atomic.write_atomic_many`)."""
    samples_text = "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples)
    write_atomic_many(
        {
            out_dir / "samples.jsonl": samples_text,
            out_dir / "results.json": json.dumps(results, indent=2, ensure_ascii=False) + "\n",
        }
    )


# ---------------------------------------------------------------------------------------------- model
def default_cache_dir() -> Path:
    """``$AREAL_CACHE_DIR`` or ``~/.cache/areal``."""
    env = os.environ.get("AREAL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "areal"


def ensure_tiny_model(cache_dir: Path | None = None, seed: int = TINY_MODEL_SEED) -> Path:
    """The tiny default model (``areal_cli.models.tiny.build_tiny_model``), built once into
    ``cache_dir/models/tiny-seed{seed}`` (built in a temp dir, then renamed: never half-written)."""
    from areal_cli.models.tiny import build_tiny_model

    root = (cache_dir or default_cache_dir()) / "models"
    final = root / f"tiny-seed{seed}"
    if (final / "config.json").is_file() and (final / "model.safetensors").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tiny-seed{seed}.", dir=root))
    try:
        build_tiny_model(tmp, seed=seed)
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / "model.safetensors").is_file():  # a concurrent build won the race otherwise
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _read_model_config(model_dir: Path) -> dict[str, Any]:
    cfg_path = model_dir / "config.json"
    if not model_dir.is_dir():
        raise UserError(f"{model_dir}: model directory not found")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{cfg_path}: not found (a Hugging Face model directory needs config.json)") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{cfg_path}: malformed JSON: {exc}") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("vocab_size"), int):
        raise UserError(f"{cfg_path}: field 'vocab_size' missing or not an integer")
    return cfg


def _eos_ids(model_dir: Path, cfg: dict[str, Any], tokenizer: Any) -> list[int]:
    """Stop token ids: eos ids of config.json, generation_config.json and the tokenizer (deduplicated)."""
    ids: list[int] = []

    def add(v: Any) -> None:
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, int) and not isinstance(x, bool) and x not in ids:
                ids.append(x)

    add(cfg.get("eos_token_id"))
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        try:
            add(json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id"))
        except (json.JSONDecodeError, AttributeError):
            pass
    add(getattr(tokenizer, "eos_token_id", None))
    return ids


def _load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as exc:  # noqa: BLE001 - any loader failure is a bad model dir
        from areal_cli.reward.pool import one_line

        raise UserError(f"{model_dir}: cannot load tokenizer: {one_line(exc)}") from None


# ---------------------------------------------------------------------------------------------- run
def sample_seed(seed: int, dataset: str, problem_id: str, sample_index: int) -> int:
    """Per-request sampling seed (SGLang ``sampling_seed``), a 31-bit integer from SHA-256 of
    ``"{seed}:{dataset}:{problem_id}:{sample_index}"``: each sample's randomness depends only on its own
    identity, not on request order, concurrency or which other datasets are evaluated."""
    digest = hashlib.sha256(f"{seed}:{dataset}:{problem_id}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _validate_settings(n: int, temperature: float, top_p: float, max_new_tokens: int, seed: int,
                       grader_timeout_s: float, grader_workers: int, max_concurrency: int) -> None:
    def bad(name: str, value: Any, what: str) -> UserError:
        return UserError(f"option '{name}': {what}, got {value!r}")

    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise bad("n", n, "must be an integer >= 1")
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise bad("temperature", temperature, "must be a number >= 0")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise bad("top_p", top_p, "must be in (0, 1]")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise bad("max_new_tokens", max_new_tokens, "must be an integer >= 1")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise bad("seed", seed, "must be an integer")
    if not isinstance(grader_timeout_s, (int, float)) or not grader_timeout_s > 0:
        raise bad("grader_timeout_s", grader_timeout_s, "must be > 0 seconds")
    if not isinstance(grader_workers, int) or grader_workers < 1:
        raise bad("grader_workers", grader_workers, "must be an integer >= 1")
    if not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise bad("max_concurrency", max_concurrency, "must be an integer >= 1")


async def _generate_and_grade(
    jobs: list[tuple[Problem, list[int], bool]],
    n: int,
    params: Any,
    seed: int,
    server_url: str,
    vocab_size: int,
    tokenizer: Any,
    pool: RewardPool,
    max_concurrency: int,
    progress: Any,
    task_ids: dict[str, Any],
) -> list[dict[str, Any]]:
    from areal_cli.rollout.client import RolloutClient

    client = RolloutClient([server_url], vocab_size=vocab_size)
    sem = asyncio.Semaphore(max_concurrency)

    async def one(problem: Problem, ids: list[int], think_open: bool, i: int) -> dict[str, Any]:
        async with sem:
            sample_params = dataclasses.replace(params, seed=sample_seed(seed, problem.dataset, problem.id, i))
            comp = await client.generate(ids, sample_params, rid=f"eval-{problem.dataset}-{problem.id}-{i}")
            text = tokenizer.decode(comp.output_ids, skip_special_tokens=True)
            # A prompt that ends inside an open <think> (R1-style templates): the completion continues
            # the thinking, so the grader must see the opening tag to ignore boxes before </think>.
            result = await pool.score(("<think>" + text) if think_open else text, problem.answer)
        record = {
            "dataset": problem.dataset,
            "problem_id": problem.id,
            "sample_index": i,
            "output_ids": [int(t) for t in comp.output_ids],
            "text": text,
            "finish_reason": comp.finish_reason,
            "gold": problem.answer,
        }
        record.update(_verdict_fields(result))
        if progress is not None:
            progress.advance(task_ids[problem.dataset])
        return record

    try:
        tasks = [asyncio.ensure_future(one(p, ids, think, i)) for p, ids, think in jobs for i in range(n)]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
    finally:
        await client.aclose()


def render_table(results: dict[str, Any], console: Any = None) -> None:
    """Print the per-dataset metrics as a rich table: one column per dataset, one row per metric
    (pass@k / maj@n in percent with 1 decimal, as AReaL prints them; counts as integers)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    datasets = [k for k in results if k != "config"]
    if not datasets:
        return
    metric_keys: list[str] = []
    for ds in datasets:
        for k in results[ds]:
            if (k.startswith("pass@") or k.startswith("maj@")) and k not in metric_keys:
                metric_keys.append(k)
    table = Table(title="areal eval", caption="pass@k / maj@n in % of problems; grader failures are graded wrong")
    table.add_column("", no_wrap=True)
    for ds in datasets:
        table.add_column(ds, justify="right", no_wrap=True)

    def row(label: str, fmt: Any) -> None:
        table.add_row(label, *[fmt(results[ds]) for ds in datasets])

    row("problems", lambda m: str(m.get("n_problems", "-")))
    row("samples / problem", lambda m: str(m.get("n_samples", "-")))
    for k in metric_keys:
        row(k, lambda m, k=k: f"{100 * m[k]:.1f}" if k in m else "-")
    row("no boxed answer", lambda m: str(m.get("n_no_answer", "-")))
    row("grader errors", lambda m: str(m.get("n_grader_errors", 0)))
    row("grader timeouts", lambda m: str(m.get("n_grader_timeouts", 0)))
    console.print(table)


def run_eval(
    datasets: Sequence[str] | str,
    data_dir: str | Path,
    model_dir: str | Path | None,
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    out_dir: str | Path,
    seed: int,
    server_url: str | None = None,
    *,
    grader_timeout_s: float = DEFAULT_GRADER_TIMEOUT_S,
    grader_workers: int = DEFAULT_GRADER_WORKERS,
    max_concurrency: int = 64,
    cache_dir: str | Path | None = None,
    console: Any = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Evaluate a model on math benchmarks and write ``results.json`` + ``samples.jsonl``.

    Args:
        datasets: names (``["aime24", "aime25"]`` or ``"aime24,aime25"``) from evaluation/benchmarks.json.
        data_dir: directory holding ``<name>.jsonl`` files.
        model_dir: Hugging Face model directory; None -> the tiny default model, built once into
            ``cache_dir`` (default ``$AREAL_CACHE_DIR`` or ``~/.cache/areal``).
        n: samples per problem (pass@k for k = 1, 2, 4, ... <= n; maj@n).
        temperature: sampling temperature (0 = greedy). top_p: nucleus mass in (0, 1].
        max_new_tokens: generation budget per sample (tokens).
        out_dir: output directory (created).
        seed: sampling seed: request i of problem p gets ``sample_seed(seed, dataset, p, i)`` (sent as
            SGLang's ``sampling_seed``); also the embedded server's engine seed.
        server_url: use an already running SGLang-protocol server instead of launching the embedded one;
            ``model_dir`` must then be the served model's directory (tokenizer, vocabulary).
        grader_timeout_s: hard timeout per graded answer (seconds). grader_workers: grader processes.
        max_concurrency: generation requests in flight at once.
        console: a ``rich.console.Console`` for the table and progress (default: a new one).
        show_progress: show a rich progress bar.

    Returns:
        the results dict also written to ``out_dir/results.json`` (see module docstring).

    Raises:
        UserError: any bad input (datasets, files, records, options, model directory, a prompt longer
            than the model's context); all are checked BEFORE any generation starts, and nothing is
            written to ``out_dir`` on error.
    """
    t_start = time.monotonic()
    _validate_settings(n, temperature, top_p, max_new_tokens, seed, grader_timeout_s, grader_workers,
                       max_concurrency)
    problems_by_ds = load_datasets(datasets, data_dir)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir}: output path exists and is not a directory")
    if (out_dir / "results.json").exists():
        raise UserError(f"{out_dir}: already holds results.json; choose another --out")
    if server_url is not None and not str(server_url).startswith(("http://", "https://")):
        raise UserError(f"option 'server_url': must start with http:// or https://, got {server_url!r}")
    if server_url is not None and model_dir is None:
        raise UserError("option 'server_url' needs option 'model' (the directory of the served model, for its "
                        "tokenizer and vocabulary)")

    if model_dir is None:
        model_path = ensure_tiny_model(Path(cache_dir) if cache_dir is not None else None)
        model_label = f"tiny-default (areal_cli.models.tiny, seed {TINY_MODEL_SEED})"
    else:
        model_path = Path(model_dir)
        model_label = str(model_path)
    cfg = _read_model_config(model_path)
    tokenizer = _load_tokenizer(model_path)
    max_pos = cfg.get("max_position_embeddings")

    jobs: list[tuple[Problem, list[int], bool]] = []
    for ds, problems in problems_by_ds.items():
        for p in problems:
            text = prompt_text(tokenizer, p.problem)
            ids = tokenize_prompt(tokenizer, text)
            if isinstance(max_pos, int) and len(ids) + max_new_tokens > max_pos:
                raise UserError(
                    f"{p.path}:{p.line}: prompt ({len(ids)} tokens) + max_new_tokens "
                    f"({max_new_tokens}) exceeds the model's max_position_embeddings ({max_pos})"
                )
            think_open = text.rstrip().endswith("<think>")
            jobs.append((p, ids, think_open))
    vocab_size = int(cfg["vocab_size"])
    bad_ids = [i for _, ids, _ in jobs for i in ids if not 0 <= i < vocab_size]
    if bad_ids:
        raise UserError(f"{model_path}: tokenizer produces ids outside the model vocabulary ({vocab_size})")

    from areal_cli.rollout.protocol import SamplingParams

    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=float(temperature),
        top_p=float(top_p),
        stop_token_ids=_eos_ids(model_path, cfg, tokenizer) or None,
    )

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console()
    pool = RewardPool(GRADE_FN, n_workers=grader_workers, timeout_s=grader_timeout_s)
    server = None
    try:
        url = server_url
        if url is None:
            from areal_cli.rollout.server import EmbeddedServer

            out_dir.mkdir(parents=True, exist_ok=True)
            server = EmbeddedServer.launch(model_path, seed=seed, log_path=out_dir / "eval_server.log")
            url = server.url
        progress = None
        task_ids: dict[str, Any] = {}
        if show_progress:
            progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=console, transient=False,
            )
            for ds, problems in problems_by_ds.items():
                task_ids[ds] = progress.add_task(f"{ds} (generate+grade)", total=len(problems) * n)
            progress.start()
        try:
            samples = asyncio.run(
                _generate_and_grade(jobs, n, params, seed, url, vocab_size, tokenizer, pool, max_concurrency,
                                    progress, task_ids)
            )
        finally:
            if progress is not None:
                progress.stop()
        if server is not None:
            server.stop()
            server = None
        metrics = summarize(samples, pool=pool)
        counters = pool.counters
    finally:
        if server is not None:
            server.stop()
        pool.close()

    results: dict[str, Any] = {
        "config": {
            "datasets": list(problems_by_ds),
            "data_dir": str(data_dir),
            "model": model_label,
            "model_dir": str(model_path),
            "server_url": server_url,
            "n": n,
            "temperature": float(temperature),
            "top_p": float(top_p),
            "max_new_tokens": max_new_tokens,
            "seed": seed,
            "prompt_user_template": USER_TEMPLATE.format(problem="{problem}"),
            "stop_token_ids": params.stop_token_ids,
            "grader": "areal_cli.reward.math_grader:grade (last \\boxed{} after </think>; math-verify 0.9.0)",
            "grader_timeout_s": float(grader_timeout_s),
            "grader_calls": counters,
            "elapsed_s": round(time.monotonic() - t_start, 3),
        }
    }
    results.update(metrics)
    write_results(out_dir, results, samples)
    render_table(results, console)
    return results

"""``areal eval``: benchmarks -> prompts -> generation -> grading -> metrics -> result files.

Protocol (adapted from AReaL ``evaluation/eval_and_aggregate.py`` + ``math_eval.py`` / ``code_eval.py``,
see shared/reference/areal_v03_published.md section (d)): every problem of every selected benchmark gets
the protocol's prompt (:mod:`areal_cli.eval.settings`); when the protocol asks for it, one greedy completion
(AReaL's separate greedy run: temperature 0, n 1, top_p 1); then n sampled completions, each with its own
seed (:func:`areal_cli.eval.generate.sample_seed`). Math completions are graded with math-verify, code
completions with the sandboxed test runner, both in process pools with hard timeouts
(:mod:`areal_cli.eval.grading`); metrics per benchmark are in :mod:`areal_cli.eval.summary`.

Workflows:
- ``run_eval``: generate and grade. Each finished sample is appended to ``OUT/samples.partial.jsonl``;
  an interrupted run started again with the same ``--out`` and the same configuration resumes without
  regenerating finished samples (:mod:`areal_cli.eval.resume`). ``server_url`` uses an already running
  SGLang-protocol server instead of the embedded one.
- ``run_regrade``: grade saved completions again, no model (:mod:`areal_cli.eval.regrade`).

Outputs (written together and atomically at the end only; :func:`areal_cli.eval.report.write_outputs`):
``results.json`` (``{"config": {... "protocol": {"name", "preset", "overrides"}, "config_hash" ...},
"<dataset>": {metrics}}``, metric values are fractions in [0, 1]), ``report.md`` and ``samples.jsonl``
(one line per completion: pass, dataset, problem_id, sample_index, prompt, output_ids, text, finish_reason, gold,
extracted, correct, grader_status, grader_message, and for code the test verdict). Bad input (unknown
benchmark, malformed record, undecodable tests, bad option, model directory, a prompt that does not fit)
is a :class:`UserError`, raised before anything is written.

Differences from AReaL, on purpose: grading is math-verify instead of the Qwen2.5-Math ``math_equal``;
gold answers come from the ``answer`` field (AReaL extracts math_500's from ``solution``: same values);
the ``chat-template`` protocol (tiny model) uses the tokenizer's chat template.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any, Sequence

from areal_cli import __version__
from areal_cli.foundations.errors import UserError
from areal_cli.foundations.manifest import git_info
from areal_cli.eval.generate import (
    TINY_MODEL_SEED,
    Generator,
    Job,
    check_embedded_family,
    default_cache_dir,
    ensure_tiny_model,
    eos_ids,
    generate_sample,
    load_tokenizer,
    make_jobs,
    model_vocab,
    read_model_config,
    render_prompts,
    sample_seed,
)
from areal_cli.eval.grading import (
    DEFAULT_GRADER_TIMEOUT_S,
    DEFAULT_GRADER_WORKERS,
    EQUIVALENT_FN,
    GRADE_FN,
    GRADER_DESCRIPTION,
    Graders,
    grade_completions,
    graders_kinds,
    open_graders,
    prompt_kind,
)
from areal_cli.eval.custom_task import task_samples
from areal_cli.eval.preflight import check_out_dir, load_selected, sandbox_in_force, selected_specs
from areal_cli.eval.progress import Progress
from areal_cli.eval.protocols import Protocol, check_tokenizer, prompt_token_ids, render_prompt
from areal_cli.eval.report import METRIC_UNITS, json_safe, render_table, write_outputs
from areal_cli.eval.resume import PartialRun, canonical_json, config_hash, sample_key
from areal_cli.eval.settings import (
    check_protocol_fits,
    choose_protocol,
    protocol_record,
    resolve_protocol,
    validate_run_options,
)
from areal_cli.eval.summary import CODEFORCES_BENCHMARK, check_cf_data, summarize

__all__ = [
    "DEFAULT_GRADER_TIMEOUT_S", "DEFAULT_GRADER_WORKERS", "EQUIVALENT_FN", "GRADE_FN", "TINY_MODEL_SEED",
    "default_cache_dir", "ensure_tiny_model", "grade_completions", "render_table", "run_eval",
    "sample_seed", "summarize", "write_results",
]

#: Kept for callers of the earlier API: results.json + report.md + samples.jsonl, atomically.
write_results = write_outputs


def data_identity(reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The part of the loader reports that identifies the data, not where it lies (for the config hash):
    revision, date window and file sizes / sha256 per benchmark."""
    return {name: {"revision": r.get("revision"), "date_window": r.get("date_window"),
                   "files": [{k: f.get(k) for k in ("bytes", "sha256")} for f in r.get("files", [])]}
            for name, r in reports.items()}


# ---------------------------------------------------------------------------------------------- generate
def _sampling_params(protocol: Protocol, stop_token_ids: list[int]) -> dict[str, Any]:
    """SamplingParams per pass: the protocol's sampling; greedy = temperature 0, top_p 1, top_k off."""
    from areal_cli.rollout.protocol import SamplingParams

    common = dict(max_new_tokens=protocol.max_new_tokens, stop_token_ids=stop_token_ids or None)
    return {
        "sample": SamplingParams(temperature=float(protocol.temperature), top_p=float(protocol.top_p),
                                 top_k=protocol.top_k, **common),
        "greedy": SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, **common),
    }


async def _generate_and_grade(todo: list[Job], generator: Generator | None, server_url: str | None,
                              vocab_size: int, params: dict[str, Any], protocol: Protocol, seed: int,
                              tokenizer: Any, graders: Graders, partial: PartialRun, progress: Progress,
                              max_concurrency: int) -> list[dict[str, Any]]:
    own = generator is None
    if own:
        from areal_cli.rollout.client import RolloutClient

        generator = RolloutClient([server_url], vocab_size=vocab_size)
    sem = asyncio.Semaphore(max_concurrency)

    async def one(job: Job) -> dict[str, Any]:
        async with sem:
            record = await generate_sample(generator, job, params[job.pass_name], seed, tokenizer, protocol.stop)
        record["think_open"] = job.prompt.think_open
        record.update(await graders.grade(job.prompt.problem, record["text"], job.prompt.think_open,
                                          prompt=job.prompt.text, prompt_ids=job.prompt.ids,
                                          completion_ids=record["output_ids"]))
        partial.append(record)
        progress.advance(job.prompt.problem.dataset, job.pass_name)
        return record

    try:
        tasks = [asyncio.ensure_future(one(j)) for j in todo]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
    finally:
        if own:
            await generator.aclose()


def _hashed_config(protocol: Protocol, jobs: list[Job], model_label: str, seed: int,
                   stop_token_ids: list[int], reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What decides the samples of a run (the resume key): per dataset a fingerprint of every prompt's
    token ids and gold answer plus the data's identity (revision, window, file hashes), the effective
    protocol settings, the model, the seed, the stop ids."""
    fingerprints: dict[str, Any] = {}
    for ds in dict.fromkeys(j.prompt.problem.dataset for j in jobs):
        h = hashlib.sha256()
        prompts = {j.prompt.problem.id: j.prompt for j in jobs if j.prompt.problem.dataset == ds}
        for pid, prompt in prompts.items():
            h.update(canonical_json([pid, prompt.ids, prompt.problem.answer]).encode())
        fingerprints[ds] = {"n_problems": len(prompts), "prompts_sha256": h.hexdigest(),
                            "data": data_identity({ds: reports.get(ds, {})})[ds]}
    settings = protocol.to_dict()
    for k in ("overrides", "source"):
        settings.pop(k)
    return {"datasets": fingerprints, "protocol": settings,
            "model": model_label, "seed": seed, "stop_token_ids": stop_token_ids}


def run_eval(
    datasets: Sequence[str] | str,
    data_dir: str | Path | None,
    model_dir: str | Path | None = None,
    n: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    max_new_tokens: int | None = None,
    out_dir: str | Path | None = None,
    seed: int = 0,
    server_url: str | None = None,
    *,
    protocol: str | None = None,
    top_k: int | None = None,
    greedy_pass: bool | None = None,
    grader_timeout_s: float = DEFAULT_GRADER_TIMEOUT_S,
    grader_workers: int = DEFAULT_GRADER_WORKERS,
    max_concurrency: int = 64,
    cache_dir: str | Path | None = None,
    cf_data: str | Path | None = None,
    revision: str | None = None,
    date_from: Any = None,
    date_to: Any = None,
    console: Any = None,
    show_progress: bool = True,
    generator: Generator | None = None,
    graders: Graders | None = None,
    limit: int | None = None,
    isolation: str | None = None,
) -> dict[str, Any]:
    """Evaluate a model on benchmarks; write ``results.json``, ``report.md`` and ``samples.jsonl``.

    Args:
        datasets: names (``["aime24", "aime25"]`` or ``"aime24,aime25"``) from evaluation/benchmarks.json, or
            custom tasks (:mod:`areal_cli.eval.custom_task`): a task YAML or records file by path, or ``NAME`` with
            ``data_dir/NAME.yaml``. A task's ``samples:`` is the n when ``n`` is None.
        data_dir: directory holding the benchmark files.
        model_dir: Hugging Face model directory or a ``.gguf`` file (dequantised once into a cache,
            :mod:`areal_cli.models.gguf`; its sha256 goes into results.json); None -> the tiny default model,
            built once into ``cache_dir`` (default ``$AREAL_CACHE_DIR`` or ``~/.cache/areal``).
        limit: evaluate the first ``limit`` problems of each benchmark (lm-evaluation-harness's ``--limit``).
        n, temperature, top_p, top_k, max_new_tokens, greedy_pass: explicit values override the protocol's
            preset (None = the preset's). n = samples per problem; temperature 0 = greedy; top_k -1 = off;
            greedy_pass = also one greedy completion per problem (AReaL ``greedy_acc``).
        out_dir: output directory (created; required). An interrupted run in it is resumed (same
            configuration).
        seed: sampling seed: request i of problem p gets ``sample_seed(seed, dataset, p, i)`` (SGLang's
            ``sampling_seed``); also the embedded server's engine seed.
        server_url: use an already running SGLang-protocol server instead of launching the embedded one;
            ``model_dir`` must then be the served model's directory (tokenizer, vocabulary).
        protocol: protocol name (:mod:`areal_cli.eval.protocols`); None -> see
            :func:`areal_cli.eval.settings.choose_protocol`.
        grader_timeout_s: hard timeout per graded math answer (s). grader_workers: processes per grader pool.
        max_concurrency: generation requests in flight at once.
        cf_data: Codeforces data directory (rating of the ``codeforces`` benchmark).
        revision, date_from, date_to: data selection of hub-sourced / dated benchmarks
            (:func:`areal_cli.eval.datasets.load_benchmark_with_report`).
        console: a ``rich.console.Console`` for the table and progress (default: a new one).
        show_progress: show rich progress bars.
        generator: a generation backend to use instead of a server (``async generate(prompt_ids, params,
            rid)`` returning an object with ``output_ids`` and ``finish_reason``; not closed here).
        graders: open grader pools to use (e.g. across several evaluations; not closed here); None ->
            pools with ``grader_timeout_s`` / ``grader_workers`` for this run.
        isolation: the code sandbox's isolation, ``"auto"`` or ``"strict"`` (refuse to grade without every
            layer); None -> ``AREAL_SANDBOX_ISOLATION`` or auto. Recorded in results.json (``config.sandbox``).

    Returns:
        the results dict also written to ``out_dir/results.json`` (see module docstring).

    Raises:
        UserError: any bad input, checked BEFORE any generation starts; nothing is written then. Also a
            resume file of a different configuration in ``out_dir``.
    """
    t_start = time.monotonic()
    validate_run_options(seed, grader_timeout_s, grader_workers, max_concurrency)
    if out_dir is None:
        raise UserError("option 'out' is required (the output directory)")
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    if server_url is not None and not str(server_url).startswith(("http://", "https://")):
        raise UserError(f"option 'server_url': must start with http:// or https://, got {server_url!r}")
    if server_url is not None and model_dir is None:
        raise UserError("option 'server_url' needs option 'model' (the directory of the served model, for its "
                        "tokenizer and vocabulary)")
    if server_url is not None and generator is None:
        _check_reachable(server_url)
    problems_by_ds, reports = load_selected(datasets, data_dir, revision=revision, date_from=date_from,
                                            date_to=date_to)
    if limit is not None:
        if limit < 1:
            raise UserError(f"option 'limit': must be >= 1, got {limit}")
        problems_by_ds = {k: v[:limit] for k, v in problems_by_ds.items()}
        for k in reports:
            reports[k] = {**reports[k], "limit": limit}
    specs = selected_specs(reports)  # the declared benchmarks and the selected custom tasks
    if n is None:
        n = task_samples(reports)  # a task's own `samples:` when -n is not given
    notes: list[str] = []
    # the model's tokens before any conversion or generation: a protocol it cannot read is refused (or, as a
    # default, replaced by its own chat template) first
    vocab = model_vocab(model_dir) if model_dir is not None else None
    name = choose_protocol(protocol, specs, list(problems_by_ds), model_dir is None, vocab=vocab,
                           model=str(model_dir), notes=notes)
    for note in notes:
        print(note, flush=True)
    preset, proto = resolve_protocol(name, n_samples=n, temperature=temperature, top_p=top_p, top_k=top_k,
                                     max_new_tokens=max_new_tokens, greedy_pass=greedy_pass)
    check_protocol_fits(proto, problems_by_ds, specs)
    if CODEFORCES_BENCHMARK in problems_by_ds:
        check_cf_data(cf_data)

    if model_dir is None:
        model_path = ensure_tiny_model(Path(cache_dir) if cache_dir is not None else None)
        model_label = f"tiny-default (areal_cli.models.tiny, seed {TINY_MODEL_SEED})"
    else:
        from areal_cli.models.gguf import provenance_of, resolve_model

        model_path = resolve_model(model_dir, log=lambda m: print(m, flush=True))  # a .gguf: dequantised once
        model_label = str(model_dir)
        gguf = provenance_of(model_path)
        if gguf is not None:
            model_label += f" (GGUF sha256 {gguf['sha256']}, dequantised to {model_path})"
    cfg = read_model_config(model_path)
    if server_url is None and generator is None:
        check_embedded_family(model_path, cfg)
    tokenizer = load_tokenizer(model_path)
    vocab_size = int(cfg["vocab_size"])
    check_tokenizer(proto, tokenizer)
    prompts = render_prompts(problems_by_ds, lambda p: render_prompt(proto, p.problem, tokenizer, prompt_kind(p)),
                             lambda text: prompt_token_ids(proto, tokenizer, text),
                             max_new_tokens=proto.max_new_tokens,
                             max_positions=cfg.get("max_position_embeddings"), vocab_size=vocab_size,
                             model_path=model_path)
    jobs = make_jobs(prompts, proto.n_samples, proto.greedy_pass)
    stop_ids = eos_ids(model_path, cfg, tokenizer)
    model_identity = model_label if model_dir is None else str(model_path.resolve())
    hashed = _hashed_config(proto, jobs, model_identity, seed, stop_ids, reports)
    digest = config_hash(hashed)
    params = _sampling_params(proto, stop_ids)

    from rich.console import Console

    console = console or Console()
    sandbox = sandbox_in_force(problems_by_ds, isolation)
    created_out = not out_dir.exists()
    partial = PartialRun.open(out_dir, hashed, {j.key for j in jobs})
    done = {sample_key(r): r for r in partial.records}
    todo = [j for j in jobs if j.key not in done]
    server = None
    server_seeds: bool | None = None if server_url is not None else True  # the embedded server honours them
    try:
        with open_graders(graders, grader_timeout_s, grader_workers) as graders:
            graders.start(graders_kinds(problems_by_ds))
            new: list[dict[str, Any]] = []
            if todo:
                url = server_url
                if url is not None:
                    server_seeds = server_honours_seeds(url)
                    if server_seeds is False and (proto.temperature > 0 and proto.n_samples > 0):
                        console.print(f"note: {url} ignores each request's sampling_seed (started without "
                                      f"--enable-deterministic-inference; SGLang on CPU cannot enable it): samples "
                                      f"at temperature {proto.temperature} are not reproducible by --seed")
                if url is None and generator is None:
                    from areal_cli.rollout.server import EmbeddedServer

                    server = EmbeddedServer.launch(model_path, seed=seed, log_path=out_dir / "eval_server.log")
                    url = server.url
                progress = Progress(console, show_progress)
                for ds in problems_by_ds:
                    for pass_name in ("greedy", "sample"):
                        total = sum(1 for j in jobs if j.key[:2] == (pass_name, ds))
                        progress.add(ds, pass_name, total, total - sum(1 for j in todo if j.key[:2] == (pass_name, ds)),
                                     "generate+grade")
                with progress:
                    new = asyncio.run(_generate_and_grade(todo, generator, url, vocab_size, params, proto, seed,
                                                          tokenizer, graders, partial, progress, max_concurrency))
                if server is not None:
                    server.stop()
                    server = None
            by_key = {**done, **{sample_key(r): r for r in new}}
            samples = [by_key[j.key] for j in jobs]
            metrics = summarize(samples, pool=graders.math_pool, problems=problems_by_ds, cf_data=cf_data)
            counters = graders.counters()
    except BaseException:
        partial.close()
        if not partial.records and not _has_samples(partial.path):
            partial.remove()  # nothing finished: leave no trace of this attempt
            if created_out:
                _remove_if_empty(out_dir)
        raise
    finally:
        if server is not None:
            server.stop()

    results: dict[str, Any] = {
        "config": {
            "units": METRIC_UNITS,
            "mode": "generate",
            "datasets": list(problems_by_ds),
            "data_dir": None if data_dir is None else str(data_dir),
            "data": reports,
            "model": model_label,
            "model_dir": str(model_path),
            "server_url": server_url,
            "server_honours_seeds": server_seeds,
            "protocol": protocol_record(preset, proto),
            "n": proto.n_samples,
            "temperature": float(proto.temperature),
            "top_p": float(proto.top_p),
            "top_k": proto.top_k,
            "max_new_tokens": proto.max_new_tokens,
            "stop": list(proto.stop),
            "greedy_pass": proto.greedy_pass,
            "seed": seed,
            "stop_token_ids": stop_ids or None,
            "grader": {k: GRADER_DESCRIPTION[k] for k in graders_kinds(problems_by_ds)},
            "sandbox": sandbox,
            "grader_timeout_s": graders.math_timeout_s,
            "grader_calls": counters,
            "config_hash": digest,
            "resumed_samples": len(done),
            "cf_data": None if cf_data is None else str(cf_data),
            "elapsed_s": round(time.monotonic() - t_start, 3),
            "protocol_notes": notes,
            # the kit that extracted and graded the answers: a change of its rules shows here
            "kit": {"version": __version__, **git_info()},
        }
    }
    results.update(metrics)
    results = json_safe(results)
    write_outputs(out_dir, results, samples)
    partial.remove()
    render_table(results, console, out_dir=out_dir)
    return results


def _check_reachable(url: str, timeout_s: float = 30.0) -> None:
    """Refuse a server that does not answer ``GET /model_info`` (one line), before anything is generated.

    Raises:
        UserError: no connection, or no answer within ``timeout_s``.
    """
    import httpx

    try:
        httpx.get(url.rstrip("/") + "/model_info", timeout=timeout_s)
    except httpx.HTTPError as e:
        raise UserError(f"option 'server_url': {url} does not answer GET /model_info ({type(e).__name__}: "
                        f"{e or 'no answer'}); is the server running?") from None


def server_honours_seeds(url: str) -> bool | None:
    """Whether the server at ``url`` samples each request with its ``sampling_seed``: its ``/server_info``
    ``enable_deterministic_inference`` (SGLang's flag; without it SGLang accepts the seed and ignores it). None: the
    server does not say."""
    import httpx

    try:
        info = httpx.get(url.rstrip("/") + "/server_info", timeout=30).json()
    except (httpx.HTTPError, ValueError):
        return None
    v = info.get("enable_deterministic_inference") if isinstance(info, dict) else None
    return v if isinstance(v, bool) else None


def _has_samples(path: Path) -> bool:
    """True if the partial file holds more than its header line."""
    try:
        return path.read_text(encoding="utf-8").count("\n") > 1
    except OSError:
        return False


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass

"""``areal eval --regrade GENERATIONS.jsonl``: read saved completions to grade them again, no generation.

Record format (JSON Lines, one completion a line; blank lines skipped; a ``samples.jsonl`` written by
``areal eval`` qualifies as is):

- ``dataset`` (str): benchmark name; may be left out when ``--data NAME`` names one benchmark (it is then
  that one); a record naming another benchmark than ``--data`` is an error (``file:line``);
- ``problem_id`` (str or int, required): the problem's id in that benchmark;
- ``text`` (str, required) or ``completion`` (its alias, as people write it): the completion; both may be
  given only if they are the same string;
- ``sample_index`` (int >= 0, optional): on every record of a problem (and pass) or on none; without it a
  problem's records are its samples 0..n-1 in file order (n samples per problem saved by another tool, in any
  interleaving of problems, qualify as is);
- ``pass`` (optional): ``"sample"`` (default) or ``"greedy"``;
- ``output_ids`` (list of ints), ``finish_reason`` (str): optional, kept for the length metrics (and the
  truncated counts of each pass);
- ``prompt`` (str, optional): the prompt the completion continues (``samples.jsonl`` records it), kept as is;
- ``think_open`` (bool, optional): the prompt ended inside ``<think>`` (as ``samples.jsonl`` records it), so
  a completion without ``</think>`` has no final answer; when absent it follows ``--protocol`` (true for
  templates ending in ``<think>``), else false.

Grading fields of the input (``extracted``, ``correct``, ...) are ignored: everything is graded again.
:func:`run_regrade` is the workflow: read, match, grade, write the same outputs as ``areal eval``.

Every problem of every benchmark named in the file must have completions, the same number n of them, with
indices 0..n-1 (pass@k and maj@n are defined over the whole benchmark). A run with ``--limit N`` covers the first N
problems of each benchmark: the limit is read from the run's ``results.json`` beside the file
(``config.data.<benchmark>.limit``, :func:`~areal_cli.eval.regrade_limits.recorded_limits`) or given with ``--limit``; a completion of a problem
beyond the limit is an error, never dropped. All violations are
:class:`UserError` with ``file:line`` (or the problem id): unknown benchmark, unknown problem id,
malformed JSON, a missing or mistyped field, a duplicate (problem, sample index), a problem whose records mix
records with and without ``sample_index``, a problem with more (or fewer) completions than most (at the line of
its first extra record, or of its last one), a record without ``dataset`` when ``--data`` does not name exactly
one benchmark, ``text`` and ``completion`` that differ.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from areal_cli import __version__
from areal_cli.foundations.errors import UserError, where
from areal_cli.foundations.manifest import git_info
from areal_cli.eval.benchmarks import Problem
from areal_cli.eval.generate import PASSES
from areal_cli.eval.grading import (
    DEFAULT_GRADER_TIMEOUT_S,
    DEFAULT_GRADER_WORKERS,
    GRADER_DESCRIPTION,
    Graders,
    graders_kinds,
    open_graders,
    problem_kind,
    problem_text,
)
from areal_cli.eval.preflight import check_out_dir, load_selected, sandbox_in_force, selected_names
from areal_cli.eval.progress import Progress
from areal_cli.eval.regrade_limits import apply_limits, recorded_limits, recorded_task_file
from areal_cli.eval.protocols import get_protocol
from areal_cli.eval.report import METRIC_UNITS, json_safe, render_table, write_outputs
from areal_cli.eval.settings import validate_run_options
from areal_cli.eval.summary import CODEFORCES_BENCHMARK, check_cf_data, summarize

KEPT_FIELDS = ("prompt", "output_ids", "finish_reason", "think_open")


@dataclass(frozen=True)
class SavedCompletion:
    """One parsed line of a generations file (``line`` is 1-based, for messages)."""

    line: int
    dataset: str
    problem_id: str
    text: str
    pass_name: str
    sample_index: int | None
    extra: dict[str, Any]


def read_generations(path: str | Path, datasets: Sequence[str] | str | None = None) -> list[SavedCompletion]:
    """Parse a generations file (field checks only; problems are matched by :func:`match_problems`).

    Args:
        path: the JSON Lines file (format in the module docstring).
        datasets: the benchmarks selected with ``--data`` (a list, or the comma-separated option text), or
            None. When it names exactly one benchmark, records without ``dataset`` get that one.
    Returns:
        the records in file order.
    Raises:
        UserError: missing file, not UTF-8, malformed JSON, missing/mistyped field (``file:line: field 'x'
            ...``; a missing ``dataset`` says to pass ``--data NAME``), a ``dataset`` other than the
            selected ones, ``text`` and ``completion`` that differ, no records.
    """
    path = Path(path)
    selected = _selected(datasets)
    if not path.is_file():
        raise UserError(f"{path}: generations file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text: {exc}") from None
    out: list[SavedCompletion] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where(path, lineno)}: malformed JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(rec, dict):
            raise UserError(f"{where(path, lineno)}: expected a JSON object, got {type(rec).__name__}")
        out.append(_parse_record(rec, path, lineno, selected))
    if not out:
        raise UserError(f"{path}: no records")
    return out


def _selected(datasets: Sequence[str] | str | None) -> list[str]:
    """The ``--data`` benchmark names (``"a,b"`` or a list), blanks dropped."""
    if datasets is None:
        return []
    names = datasets.split(",") if isinstance(datasets, str) else list(datasets)
    return [n.strip() for n in names if isinstance(n, str) and n.strip()]


def _encodable(value) -> bool:
    """True when every string in ``value`` (nested lists and dicts included) can be written as UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_encodable(k) and _encodable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_encodable(v) for v in value)
    return True


def _parse_record(rec: dict[str, Any], path: Path, lineno: int, selected: list[str] | None = None) -> SavedCompletion:
    def field_error(field: str, what: str) -> UserError:
        return UserError(f"{where(path, lineno, field)} {what}")

    selected = selected or []
    ds = rec.get("dataset")
    if ds is None and len(selected) == 1:
        ds = selected[0]  # --data NAME supplies the benchmark of records that do not name one
    elif ds is None:
        raise field_error("dataset", "missing (pass --data NAME to name the benchmark of records without one)"
                          if not selected else
                          f"missing, and --data names {len(selected)} benchmarks ({', '.join(selected)}): "
                          f"say which one")
    if not isinstance(ds, str) or not ds.strip():
        raise field_error("dataset", "must be a non-empty string")
    if selected and ds.strip() not in selected:  # checked here too: before any benchmark is loaded
        raise UserError(f"{where(path, lineno, 'dataset')}: benchmark '{ds.strip()}' is not among the selected "
                        f"benchmarks ({', '.join(selected)})")
    pid = rec.get("problem_id")
    if isinstance(pid, bool) or not isinstance(pid, (str, int)) or not str(pid).strip():
        raise field_error("problem_id", "missing" if pid is None else "must be a string or integer")
    given = [name for name in ("text", "completion") if rec.get(name) is not None]
    if not given:
        raise field_error("text", "missing (give the completion as 'text' or 'completion')")
    for name in given:
        if not isinstance(rec[name], str):
            raise field_error(name, f"must be a string, got {type(rec[name]).__name__}")
    if len(given) == 2 and rec["text"] != rec["completion"]:
        raise UserError(f"{where(path, lineno)}: fields 'text' and 'completion' differ (they are aliases: give one)")
    text = rec[given[0]]
    for key, value in rec.items():  # results are written as UTF-8: a lone surrogate (JSON "\ud800") cannot be
        if not _encodable(value):
            raise field_error(key, "holds a lone surrogate such as \\ud800: not valid Unicode text")
    idx = rec.get("sample_index")
    if idx is not None and (isinstance(idx, bool) or not isinstance(idx, int) or idx < 0):
        raise field_error("sample_index", f"must be an integer >= 0, got {idx!r}")
    pass_name = rec.get("pass", "sample")
    if pass_name not in PASSES:
        raise field_error("pass", f"must be one of {', '.join(PASSES)}, got {pass_name!r}")
    ids = rec.get("output_ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                                  for t in ids)):
        raise field_error("output_ids", "must be a list of integers")
    if rec.get("think_open") is not None and not isinstance(rec["think_open"], bool):
        raise field_error("think_open", "must be true or false")
    if rec.get("prompt") is not None and not isinstance(rec["prompt"], str):
        raise field_error("prompt", f"must be a string, got {type(rec['prompt']).__name__}")
    extra = {k: rec[k] for k in KEPT_FIELDS if rec.get(k) is not None}
    return SavedCompletion(lineno, ds.strip(), str(pid).strip(), text, pass_name, idx, extra)


def datasets_in(saved: list[SavedCompletion]) -> list[str]:
    """Benchmark names in order of first appearance."""
    return list(dict.fromkeys(s.dataset for s in saved))


def match_problems(path: str | Path, saved: list[SavedCompletion],
                   problems_by_ds: dict[str, list[Problem]]) -> list[dict[str, Any]]:
    """Attach each completion to its problem and check that every benchmark is covered evenly.

    A record without ``sample_index`` is the next sample of its problem (and pass) in file order, so n records
    of a problem without one are its samples 0..n-1; the records of one problem give ``sample_index`` on all of
    them or on none (a mix has no one reading).

    Returns:
        sample records (pass, dataset, problem_id, sample_index, text, gold, + kept fields), in file order.

    Raises:
        UserError: ``file:line: problem_id 'x' not in benchmark 'aime24'``; a completion for a benchmark
            not selected; duplicate (pass, problem, sample index); a problem whose records mix records with and
            without ``sample_index``; problems without completions; a problem with more or fewer completions
            than the others (at the line of its first extra record, or of its last one); indices that are not
            0..n-1 (names the problem and its first line).
    """
    path = Path(path)
    by_id = {ds: {p.id: p for p in ps} for ds, ps in problems_by_ds.items()}
    next_index: dict[tuple[str, str, str], int] = {}
    first_of: dict[tuple[str, str, str], SavedCompletion] = {}
    seen: dict[tuple[str, str, str, int], int] = {}
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    for s in saved:
        if s.dataset not in by_id:
            raise UserError(f"{where(path, s.line, 'dataset')}: benchmark '{s.dataset}' is not among the "
                            f"selected benchmarks ({', '.join(by_id)})")
        problem = by_id[s.dataset].get(s.problem_id)
        if problem is None:
            raise UserError(f"{where(path, s.line)}: problem_id '{s.problem_id}' not in benchmark '{s.dataset}'")
        group = (s.pass_name, s.dataset, s.problem_id)
        first = first_of.setdefault(group, s)
        if (first.sample_index is None) != (s.sample_index is None):
            here, there = ("given", "missing") if s.sample_index is not None else ("missing", "given")
            raise UserError(f"{where(path, s.line, 'sample_index')} {here} here but {there} on line {first.line}, "
                            f"another record of "
                            f"problem_id '{s.problem_id}' ({s.dataset}, {s.pass_name} pass): give it on every "
                            f"record of a problem or on none (without it, a problem's records are its samples "
                            f"0..n-1 in file order)")
        idx = s.sample_index if s.sample_index is not None else next_index.get(group, 0)
        next_index[group] = max(next_index.get(group, 0), idx + 1)
        key = (*group, idx)
        if key in seen:
            raise UserError(f"{where(path, s.line)}: problem '{s.problem_id}' ({s.dataset}, {s.pass_name} pass) "
                            f"has sample_index {idx} twice (first on line {seen[key]})")
        seen[key] = s.line
        records.append({"pass": s.pass_name, "dataset": s.dataset, "problem_id": s.problem_id,
                        "sample_index": idx, "text": s.text, "gold": problem.answer, **s.extra})
        lines.append(s.line)
    implicit = {g for g, first in first_of.items() if first.sample_index is None}
    _check_coverage(path, records, lines, problems_by_ds, implicit)
    return records


def _check_coverage(path: Path, records: list[dict[str, Any]], lines: list[int],
                    problems_by_ds: dict[str, list[Problem]], implicit: set[tuple[str, str, str]]) -> None:
    """Every problem of every benchmark has completions (per pass that has any), the same number n of them
    (n: the number most problems have), with indices 0..n-1.

    Args:
        lines: the file line of each record of ``records``.
        implicit: the (pass, dataset, problem_id) groups whose records gave no ``sample_index``.
    Raises:
        UserError: the first violation, at the line where it shows (``FILE:LINE: benchmark 'b' problem_id 'p'
            (sample pass): ...``), with what to change.
    """
    for ds, problems in problems_by_ds.items():
        for pass_name in PASSES:
            found: dict[str, list[tuple[int, int]]] = {}  # problem_id -> (sample_index, line), in file order
            for r, line in zip(records, lines):
                if r["dataset"] == ds and r["pass"] == pass_name:
                    found.setdefault(r["problem_id"], []).append((r["sample_index"], line))
            if not found and (pass_name == "greedy" or not problems):
                continue
            what = "greedy completions" if pass_name == "greedy" else "completions"
            missing = [p.id for p in problems if p.id not in found]
            if missing:
                covered = len(problems) - len(missing)
                hint = (f"; the file covers the first {covered} problems only: a run with --limit {covered}? "
                        f"regrade it with --limit {covered}, or beside its results.json"
                        if all(p.id in found for p in problems[:covered]) else "")
                raise UserError(f"{path}: benchmark '{ds}': {len(missing)} of {len(problems)} problems have no "
                                f"{what} (first: problem_id '{missing[0]}'){hint}")
            counts = Counter(len(v) for v in found.values())
            n, with_n = max(counts.items(), key=lambda kv: (kv[1], kv[0]))  # what most problems have
            odd = [p.id for p in problems if len(found[p.id]) != n]
            if odd:
                def shows_at(pid: str) -> int:  # the first record beyond n, or the last one of too few
                    recs = found[pid]
                    return recs[n][1] if len(recs) > n else recs[-1][1]

                pid = min(odd, key=shows_at)
                c = len(found[pid])
                head = (f"{where(path, shows_at(pid))}: benchmark '{ds}' problem_id '{pid}' ({pass_name} pass) has "
                        f"{c} {what} but {with_n} of {len(problems)} problems have {n}: every problem needs the "
                        f"same number")
                if c < n:
                    raise UserError(f"{head} (this line is its last; add the missing ones or drop the extra "
                                    f"ones of the others)")
                if (pass_name, ds, pid) in implicit:
                    raise UserError(f"{head} (without sample_index a problem's records are its samples 0..n-1 "
                                    f"in file order, so this line is its sample {n}, its sample 0 is on line "
                                    f"{found[pid][0][1]}: remove it if it is a duplicate)")
                raise UserError(f"{head} (this line is its record number {n + 1}: remove it if it is a duplicate)")
            for p in problems:
                got = sorted(i for i, _ in found[p.id])
                if got != list(range(n)):
                    raise UserError(f"{where(path, found[p.id][0][1])}: benchmark '{ds}' problem_id '{p.id}' "
                                    f"({pass_name} pass): sample indices {got} are not 0..{n - 1} (every "
                                    f"problem needs the same n)")


def run_regrade(
    generations: str | Path,
    out_dir: str | Path,
    *,
    datasets: Sequence[str] | str | None = None,
    data_dir: str | Path | None = None,
    protocol: str | None = None,
    grader_timeout_s: float = DEFAULT_GRADER_TIMEOUT_S,
    grader_workers: int = DEFAULT_GRADER_WORKERS,
    cf_data: str | Path | None = None,
    revision: str | None = None,
    date_from: Any = None,
    date_to: Any = None,
    console: Any = None,
    show_progress: bool = True,
    graders: Graders | None = None,
    isolation: str | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """Grade saved completions again (no model, no generation) and write the same outputs as
    :func:`areal_cli.eval.runner.run_eval`.

    Args:
        generations: JSON Lines of completions (format in :mod:`areal_cli.eval.regrade`).
        out_dir: output directory for results.json, report.md, samples.jsonl.
        datasets: restrict to these benchmarks (a record of another one is an error); None = the
            benchmarks named in the file. Custom tasks (:mod:`areal_cli.eval.custom_task`) by their task file or
            records file, or by name with ``data_dir/<name>.yaml``; a reward grader gets each record's saved
            ``prompt`` and ``output_ids`` (``prompt_ids``: ``[]``).
        data_dir: directory holding the benchmark files.
        protocol: the protocol the completions were generated with (recorded only), if known.
        grader_timeout_s, grader_workers, cf_data, revision, date_from, date_to, console, show_progress,
            graders, isolation: as :func:`areal_cli.eval.runner.run_eval`.
        limit: the first ``limit`` problems of each benchmark (the ``--limit`` of the run that wrote the file);
            None -> the limits its ``results.json`` records (:func:`recorded_limits`), else every problem.

    Raises:
        UserError: ``FILE:LINE`` of a malformed record, an unknown benchmark or problem id; a benchmark
            whose problems are not all covered evenly; bad options. Nothing is written then.
    """
    t_start = time.monotonic()
    validate_run_options(0, grader_timeout_s, grader_workers, 1)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UserError(f"option 'limit': must be >= 1, got {limit}")
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    path = Path(generations)
    selected = selected_names(datasets, data_dir) if datasets is not None else None  # task files -> task names
    saved = read_generations(path, datasets=selected)
    check_benchmark_names(path, saved, data_dir=data_dir, selected=selected or ())
    names = datasets if datasets is not None else datasets_in(saved)
    problems_by_ds, reports = load_selected(names, data_dir, revision=revision, date_from=date_from, date_to=date_to)
    if limit is not None:
        apply_limits(path, saved, problems_by_ds, reports, dict.fromkeys(problems_by_ds, limit),
                     dict.fromkeys(problems_by_ds, "--limit"))
    else:
        recorded = recorded_limits(path)
        apply_limits(path, saved, problems_by_ds, reports, recorded,
                     dict.fromkeys(recorded, f"recorded in {path.parent / 'results.json'}; --limit N overrides it"))
    proto_record = get_protocol(protocol).to_dict() if protocol else None
    records = match_problems(path, saved, problems_by_ds)
    if protocol:
        template = get_protocol(protocol).template
        opens = template is not None and template.rstrip().endswith("<think>")
        for r in records:
            r.setdefault("think_open", opens)
    if CODEFORCES_BENCHMARK in problems_by_ds:
        check_cf_data(cf_data)
    problem_of = {(ds, p.id): p for ds, ps in problems_by_ds.items() for p in ps}

    from rich.console import Console

    console = console or Console()
    sandbox = sandbox_in_force(problems_by_ds, isolation)
    with open_graders(graders, grader_timeout_s, grader_workers) as graders:
        graders.start(graders_kinds(problems_by_ds))
        progress = Progress(console, show_progress)
        for ds in problems_by_ds:
            for pass_name in ("greedy", "sample"):
                progress.add(ds, pass_name, sum(r["dataset"] == ds and r["pass"] == pass_name for r in records), 0,
                             "grade")

        def is_math(r: dict[str, Any]) -> bool:
            return problem_kind(problem_of[(r["dataset"], r["problem_id"])]) == "math"

        async def grade_all() -> list[dict[str, Any]]:
            async def one(r: dict[str, Any]) -> dict[str, Any]:
                verdict = await graders.grade(problem_of[(r["dataset"], r["problem_id"])], r["text"],
                                              bool(r.get("think_open")), prompt=r.get("prompt"),
                                              completion_ids=r.get("output_ids"))
                progress.advance(r["dataset"], r["pass"])
                return {**r, **verdict}

            async def math_chunk(chunk: list[dict[str, Any]]) -> list[dict[str, Any]]:
                # Math is graded in batches (much faster than one pool call per answer).
                problems = [problem_of[(r["dataset"], r["problem_id"])] for r in chunk]
                items = [(r["text"], p.answer, bool(r.get("think_open")), problem_text(p))  # the problem: unit,
                         for r, p in zip(chunk, problems)]  # multiple-choice and restatement rules
                verdicts = await asyncio.to_thread(graders.grade_math_batch, items)
                for r in chunk:
                    progress.advance(r["dataset"], r["pass"])
                return [{**r, **v} for r, v in zip(chunk, verdicts)]

            math_idx = [i for i, r in enumerate(records) if is_math(r)]
            other_idx = [i for i, r in enumerate(records) if not is_math(r)]
            chunks = [math_idx[i : i + 256] for i in range(0, len(math_idx), 256)]
            out: list[dict[str, Any] | None] = [None] * len(records)
            done_math = await asyncio.gather(*(math_chunk([records[i] for i in c]) for c in chunks))
            for c, graded_chunk in zip(chunks, done_math):
                for i, g in zip(c, graded_chunk):
                    out[i] = g
            done_other = await asyncio.gather(*(one(records[i]) for i in other_idx))
            for i, g in zip(other_idx, done_other):
                out[i] = g
            return [g for g in out if g is not None]

        with progress:
            graded = asyncio.run(grade_all())
        metrics = summarize(graded, pool=graders.math_pool, problems=problems_by_ds, cf_data=cf_data)
        counters = graders.counters()

    results: dict[str, Any] = {
        "config": {
            "units": METRIC_UNITS,
            "mode": "regrade",
            "generations": str(path),
            "generations_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "datasets": list(problems_by_ds),
            "data_dir": None if data_dir is None else str(data_dir),
            "data": reports,
            "protocol": proto_record,
            "grader": {k: GRADER_DESCRIPTION[k] for k in graders_kinds(problems_by_ds)},
            "sandbox": sandbox,
            "grader_timeout_s": graders.math_timeout_s,
            "grader_calls": counters,
            "cf_data": None if cf_data is None else str(cf_data),
            "elapsed_s": round(time.monotonic() - t_start, 3),
            # the kit that extracted and graded the answers again: a change of its rules shows here
            "kit": {"version": __version__, **git_info()},
        }
    }
    results.update(metrics)
    results = json_safe(results)
    write_outputs(out_dir, results, graded)
    render_table(results, console)
    return results


def check_benchmark_names(path: Path, saved: list[Any], *, data_dir: str | Path | None = None,
                          selected: Sequence[str] = ()) -> None:
    """Unknown benchmark names in a generations file, reported with the first line that uses them.

    Args:
        data_dir: a name with ``data_dir/<name>.yaml`` is a custom task (:mod:`areal_cli.eval.custom_task`).
        selected: the result names of the ``--data`` selection (custom tasks' names among them).
    Raises:
        UserError: ``FILE:LINE: field 'dataset': unknown benchmark 'x'; known benchmarks: ...``.
    """
    from areal_cli.eval.benchmarks import load_benchmark_specs
    from areal_cli.eval.custom_task import TASK_SUFFIXES

    known = load_benchmark_specs()

    def is_task(name: str) -> bool:
        return name in selected or (data_dir is not None and any(
            (Path(data_dir) / f"{name}{suffix}").is_file() for suffix in TASK_SUFFIXES))

    for s in saved:
        if s.dataset not in known and not is_task(s.dataset):
            task_file = recorded_task_file(path, s.dataset)
            hint = (f"; it is the task {task_file} (results.json beside the file): pass --data {task_file}"
                    if task_file else f"; known benchmarks: {', '.join(sorted(known))} (a task of your own: pass "
                                      f"--data path/to/task.yaml)")
            raise UserError(f"{where(path, s.line, 'dataset')}: unknown benchmark '{s.dataset}'{hint}")


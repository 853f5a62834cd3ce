"""Evaluation benchmarks: declared once in ``evaluation/benchmarks.json`` (:mod:`areal_cli.eval.benchmarks`),
loaded and normalised here.

Every record becomes a :class:`Problem` (string id, problem text, gold answer for math, test suite for code,
metadata for breakdowns). Two kinds of benchmark:

- **math** (``loader: math_jsonl``): the AReaL evaluation files, read from ``--data-dir/<file>``. The
  published files differ in field names and answer types on purpose (see data_cards/math-eval.md): aime24
  has ``id`` int + ``answer`` str ("025"), aime25 ``id`` str + ``answer`` int, amc23 ``answer`` float (27.0),
  math_500 ``unique_id`` + LaTeX ``answer``. Problem text from ``problem``, falling back to ``question``;
  answer and id as strings.
- **code** (``loader: lcb | codecontests | codeforces``): rows in their upstream schema
  (:mod:`areal_cli.eval.code_datasets`), from a Hugging Face dataset repository at the declared pinned
  revision (``huggingface_hub.snapshot_download``; the HF cache, so ``HF_HUB_OFFLINE=1`` works once cached)
  or, with ``--data-dir``, from ``DIR/<file>`` (JSON lines in the upstream schema) or ``DIR/<name>/`` (a
  local copy of the repository's files at that revision). Layout: evaluation/README.md.

Bad input raises :class:`areal_cli.foundations.errors.UserError` with one line:
- unknown benchmark name (lists the known ones),
- missing data directory or file (path), a hub source that cannot be fetched (repo@revision),
- malformed JSON line / parquet row (``file:line: malformed JSON: ...``),
- a record without problem / answer / id, or with a field of the wrong type
  (``file:line: field 'answer' missing``),
- undecodable tests (``file:line: problem 'abc301_a': undecodable tests: ...``),
- duplicate ids, empty file, a date window that keeps no problem, a malformed window option.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
from pathlib import Path
from typing import Any, Iterable

from areal_cli.foundations.errors import UserError, where
from areal_cli.eval.benchmarks import (
    BenchmarkSpec,
    Problem,
    id_to_str,
    load_benchmark_specs,
    parse_dataset_names,
    resolve_window,
)
from areal_cli.foundations.jsonl import iter_json_lines

#: Local files up to this size get a sha256 in the load report (bigger ones: size only; hub files are
#: pinned by the revision).
HASH_MAX_BYTES = 64 * 1024 * 1024


# ------------------------------------------------------------------------------------ math records
def _answer_to_str(value: Any, loc: str) -> str:
    if isinstance(value, bool) or value is None or not isinstance(value, (str, int, float)):
        raise UserError(f"{loc}: field 'answer' must be a string or number, got {type(value).__name__}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"{loc}: field 'answer' is not a finite number: {value!r}")
        return str(int(value)) if value.is_integer() else repr(value)
    text = value.strip()
    if not text:
        raise UserError(f"{loc}: field 'answer' is empty")
    return text


def read_problems(path: str | Path, spec: BenchmarkSpec) -> list[Problem]:
    """Read and normalise one math JSONL benchmark file (blank lines are skipped).

    Raises:
        UserError: missing file, malformed line, missing/invalid field, duplicate id, no records.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found (dataset '{spec.name}')")
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for lineno, record in iter_json_lines(path):
        loc = where(path, lineno)
        problem_text = None
        for fld in spec.problem_fields:
            if fld in record and record[fld] is not None:
                value = record[fld]
                if not isinstance(value, str) or not value.strip():
                    raise UserError(f"{where(path, lineno, fld)} must be a non-empty string")
                problem_text = value
                break
        if problem_text is None:
            first, rest = spec.problem_fields[0], spec.problem_fields[1:]
            extra = f" (nor {', '.join(repr(f) for f in rest)})" if rest else ""
            raise UserError(f"{where(path, lineno, first)} missing{extra}")
        if spec.answer_field not in record:
            raise UserError(f"{where(path, lineno, spec.answer_field)} missing")
        answer = _answer_to_str(record[spec.answer_field], loc)
        if spec.id_field not in record:
            raise UserError(f"{where(path, lineno, spec.id_field)} missing")
        pid = id_to_str(record[spec.id_field], loc, spec.id_field)
        if pid in seen:
            raise UserError(f"{loc}: field '{spec.id_field}': duplicate id {pid!r} (first on line {seen[pid]})")
        seen[pid] = lineno
        problems.append(
            Problem(dataset=spec.name, id=pid, problem=problem_text, answer=answer, path=str(path), line=lineno)
        )
    if not problems:
        raise UserError(f"{path}: no records (dataset '{spec.name}')")
    return problems


# ------------------------------------------------------------------------------------ sources
def file_record(path: Path) -> dict[str, Any]:
    """``{"path", "bytes", "sha256"}`` of a data file (sha256 only up to :data:`HASH_MAX_BYTES`)."""
    size = path.stat().st_size
    rec: dict[str, Any] = {"path": str(path), "bytes": size}
    if size <= HASH_MAX_BYTES:
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        rec["sha256"] = digest.hexdigest()
    return rec


def match_repo_files(root: Path, patterns: tuple[str, ...]) -> list[Path]:
    """Files under ``root`` matching each pattern (repository-relative, ``fnmatch`` globs), pattern order
    kept, names sorted within a pattern, each file once."""
    rel = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    out: list[Path] = []
    for pattern in patterns:
        for name in rel:
            if fnmatch.fnmatchcase(name, pattern) and root / name not in out:
                out.append(root / name)
    return out


def needs_data_dir(spec: BenchmarkSpec) -> str:
    """The message for a benchmark with no hub source loaded without ``--data-dir``."""
    public = f" (public source: {spec.url})" if spec.url else ""
    return f"benchmark '{spec.name}' is read from a local file: pass --data-dir holding {spec.file}{public}"


def fetch_hub_files(spec: BenchmarkSpec, revision: str | None = None) -> tuple[list[Path], dict[str, Any]]:
    """Download (or find in the HF cache) the files of ``spec.hub`` at ``revision`` (default: the pinned
    one) with ``huggingface_hub.snapshot_download(repo_type="dataset", allow_patterns=files)``.

    Returns:
        (local paths in declaration order, provenance dict: source/repo_id/revision/snapshot dir).

    Raises:
        UserError: no hub source, the repository/revision cannot be fetched (offline and not cached,
            unknown revision, network error), or no file matches the declared names.
    """
    if spec.hub is None:
        raise UserError(needs_data_dir(spec))
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import EntryNotFoundError

    from areal_cli.foundations.hub import hub_local_only

    rev = revision or spec.hub.revision
    try:
        # Without a reachable hub, read the local cache only (fails at once instead of after retries).
        root = Path(snapshot_download(repo_id=spec.hub.repo_id, repo_type="dataset", revision=rev,
                                      allow_patterns=list(spec.hub.files), local_files_only=hub_local_only()))
    except (OSError, EntryNotFoundError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:300]
        raise UserError(f"benchmark '{spec.name}': cannot fetch {spec.hub.repo_id}@{rev}: {type(exc).__name__}: "
                        f"{reason}; offline? pass --data-dir (layout: evaluation/README.md)") from None
    files = match_repo_files(root, spec.hub.files)
    if not files:
        raise UserError(f"benchmark '{spec.name}': {spec.hub.repo_id}@{rev} has no file matching "
                        f"{', '.join(spec.hub.files)}")
    return files, {"source": "hub", "repo_id": spec.hub.repo_id, "revision": rev, "snapshot": str(root)}


def locate_local_files(spec: BenchmarkSpec, data_dir: Path) -> tuple[list[Path], dict[str, Any]]:
    """The local files of a code benchmark: ``data_dir/<file>`` (JSON lines, upstream schema) if present,
    else the declared repository files under ``data_dir/<name>/`` (a copy of the repository at the
    pinned revision, e.g. ``huggingface-cli download ... --local-dir data_dir/<name>``).

    Raises:
        UserError: neither is there.
    """
    single = data_dir / spec.file
    if single.is_file():
        return [single], {"source": "local", "layout": "jsonl"}
    folder = data_dir / spec.name
    patterns = spec.hub.files if spec.hub is not None else ()
    if folder.is_dir() and patterns:
        files = match_repo_files(folder, patterns)
        if files:
            return files, {"source": "local", "layout": "snapshot",
                           "revision_expected": spec.hub.revision if spec.hub else None}
        raise UserError(f"{folder}: no file matching {', '.join(patterns)} (benchmark '{spec.name}')")
    expect = f"{single.name}" + (f" or {spec.name}/{{{', '.join(patterns)}}}" if patterns else "")
    raise UserError(f"{data_dir}: {expect} not found (dataset '{spec.name}'; layout: evaluation/README.md)")


# ------------------------------------------------------------------------------------ loading
def load_benchmark_with_report(
    name: str,
    *,
    data_dir: str | Path | None = None,
    revision: str | None = None,
    date_from: Any = None,
    date_to: Any = None,
    specs: dict[str, BenchmarkSpec] | None = None,
) -> tuple[list[Problem], dict[str, Any]]:
    """Load benchmark ``name`` and say exactly what was read.

    Args:
        data_dir: local data directory (math: ``DIR/<file>``; code: ``DIR/<file>`` or ``DIR/<name>/``);
            None: code benchmarks are fetched from their hub source (math needs a directory).
        revision: hub revision instead of the pinned one (hub sources only).
        date_from / date_to: ``YYYY-MM-DD`` bounds replacing the declared window (``"none"``: unbounded);
            ignored by benchmarks without dates.

    Returns:
        ``(problems, report)``; report: benchmark, kind, loader, source (local|hub), repo_id, revision,
        files (path, bytes, sha256 when <= 64 MiB), date_window, n_records, n_problems, excluded
        counts by reason, question_format, default_protocol, grader.

    Raises:
        UserError: see the module docstring.
    """
    specs = specs if specs is not None else load_benchmark_specs()
    if name not in specs:
        raise UserError(f"unknown dataset '{name}'; known datasets: {', '.join(sorted(specs))}")
    spec = specs[name]
    window = resolve_window(spec, date_from, date_to)
    if data_dir is not None:
        data_dir = Path(data_dir)
        if not data_dir.is_dir():
            raise UserError(f"{data_dir}: data directory not found")
        if revision is not None and spec.hub is not None:
            raise UserError(f"option 'revision' selects a Hugging Face revision; benchmark '{name}' is read "
                            f"from --data-dir {data_dir} instead (drop one of the two)")
    if spec.loader == "math_jsonl":
        if data_dir is None:
            raise UserError(needs_data_dir(spec))
        path = data_dir / spec.file
        problems = read_problems(path, spec)
        files, provenance, stats = [path], {"source": "local", "layout": "jsonl"}, {"n_records": len(problems)}
    else:
        from areal_cli.eval import code_datasets

        if data_dir is None:
            files, provenance = fetch_hub_files(spec, revision)
        else:
            files, provenance = locate_local_files(spec, data_dir)
        problems, stats = code_datasets.load_code_problems(spec, files, window)
    report = {
        "benchmark": name,
        "kind": spec.kind,
        "loader": spec.loader,
        **provenance,
        "repo_id": provenance.get("repo_id", spec.hub.repo_id if spec.hub else None),
        "files": [file_record(p) for p in files],
        "date_window": None if window is None else {
            "field": spec.date_field,
            "from": window[0].date().isoformat() if window[0] else None,
            "to": window[1].date().isoformat() if window[1] else None,
            "inclusive": True,
        },
        "n_problems": len(problems),
        **stats,
        "question_format": spec.question_format if spec.kind == "code" else None,
        "default_protocol": spec.default_protocol,
        "grader": spec.grader,
    }
    return problems, report


def load_benchmark(
    name: str,
    *,
    data_dir: str | Path | None = None,
    revision: str | None = None,
    date_from: Any = None,
    date_to: Any = None,
    specs: dict[str, BenchmarkSpec] | None = None,
) -> list[Problem]:
    """Load benchmark ``name`` (see :func:`load_benchmark_with_report`; this returns the problems only)."""
    return load_benchmark_with_report(name, data_dir=data_dir, revision=revision, date_from=date_from,
                                      date_to=date_to, specs=specs)[0]


def load_dataset(name: str, data_dir: str | Path, specs: dict[str, BenchmarkSpec] | None = None) -> list[Problem]:
    """Load benchmark ``name`` from ``data_dir`` (e.g. ``DIR/aime24.jsonl``); kept for existing callers.

    Raises:
        UserError: unknown name, missing directory/file, or a bad record (see module docstring).
    """
    return load_benchmark(name, data_dir=data_dir, specs=specs)


def load_datasets(
    names: str | Iterable[str],
    data_dir: str | Path | None = None,
    specs: dict[str, BenchmarkSpec] | None = None,
    *,
    revision: str | None = None,
    date_from: Any = None,
    date_to: Any = None,
) -> dict[str, list[Problem]]:
    """Load several benchmarks (``"aime24,lcb_v5"`` or a list), all validated before returning.

    ``revision`` applies to hub-sourced benchmarks, the date window to dated ones (LiveCodeBench,
    Codeforces); the others ignore them.

    Returns:
        ``{name: [Problem, ...]}`` in the order given.

    Raises:
        UserError: as :func:`parse_dataset_names` and :func:`load_benchmark`.
    """
    specs = specs if specs is not None else load_benchmark_specs()
    return {
        name: load_benchmark(name, data_dir=data_dir, specs=specs, date_from=date_from, date_to=date_to,
                             revision=revision if specs[name].hub is not None else None)
        for name in parse_dataset_names(names, specs)
    }

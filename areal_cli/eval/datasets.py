"""Evaluation datasets: declared once in ``evaluation/benchmarks.json``, loaded and normalised here.

The published files differ in field names and answer types on purpose (see the data README):
aime24 has ``id`` int + ``answer`` str ("025"), aime25 ``id`` str + ``answer`` int, amc23 ``answer``
float (27.0), math_500 ``unique_id`` + LaTeX ``answer``. Every record becomes a :class:`Problem` with
string id, problem text (from ``problem``, falling back to ``question``) and answer as a string.

Bad input raises :class:`areal_cli.errors.UserError` with one line:
- unknown dataset name (lists the known ones),
- missing data directory or file (path),
- malformed JSON line (``file:line: malformed JSON: ...``),
- a record without problem / answer / id, or with a field of the wrong type
  (``file:line: field 'answer' missing``),
- duplicate ids, empty file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from areal_cli.errors import UserError, where

#: ``evaluation/benchmarks.json`` at the top level of the repository.
BENCHMARKS_JSON = Path(__file__).resolve().parents[2] / "evaluation" / "benchmarks.json"


@dataclass(frozen=True)
class BenchmarkSpec:
    """How to read one benchmark file.

    Attributes:
        name: dataset name used on the command line (``aime24``).
        file: file name inside the data directory (``aime24.jsonl``).
        id_field: field holding the problem id.
        problem_fields: fields holding the problem text, in order of preference.
        answer_field: field holding the gold answer.
        source: where the file comes from (documentation).
    """

    name: str
    file: str
    id_field: str
    problem_fields: tuple[str, ...]
    answer_field: str
    source: str = ""


@dataclass(frozen=True)
class Problem:
    """One evaluation problem after normalisation.

    Attributes:
        dataset: benchmark name.
        id: problem id as a string (unique within the dataset).
        problem: problem text.
        answer: gold answer as a string (ints as digits, 27.0 -> "27", strings stripped).
        path: the source file.
        line: 1-based line number in the source file (for messages).
    """

    dataset: str
    id: str
    problem: str
    answer: str
    path: str
    line: int


def load_benchmark_specs(path: str | Path | None = None) -> dict[str, BenchmarkSpec]:
    """Read the benchmark declarations (default: :data:`BENCHMARKS_JSON`).

    Raises:
        UserError: the file is missing or malformed (one line, with the path).
    """
    path = Path(path) if path is not None else BENCHMARKS_JSON
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: benchmark declarations not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: malformed JSON: {exc}") from None
    table = raw.get("benchmarks") if isinstance(raw, dict) else None
    if not isinstance(table, dict) or not table:
        raise UserError(f"{path}: field 'benchmarks' must be a non-empty object")
    specs: dict[str, BenchmarkSpec] = {}
    for name, entry in table.items():
        loc = f"{path}: benchmarks.{name}"
        if not isinstance(entry, dict):
            raise UserError(f"{loc}: must be an object")
        for key in ("file", "id_field", "answer_field"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise UserError(f"{loc}: field '{key}' must be a non-empty string")
        fields = entry.get("problem_fields")
        if not isinstance(fields, list) or not fields or not all(isinstance(f, str) and f for f in fields):
            raise UserError(f"{loc}: field 'problem_fields' must be a non-empty list of strings")
        specs[name] = BenchmarkSpec(
            name=name,
            file=entry["file"],
            id_field=entry["id_field"],
            problem_fields=tuple(fields),
            answer_field=entry["answer_field"],
            source=str(entry.get("source", "")),
        )
    return specs


def parse_dataset_names(text: str | Iterable[str], specs: dict[str, BenchmarkSpec] | None = None) -> list[str]:
    """Split ``"aime24,aime25"`` (or a list) into known dataset names, order kept, duplicates dropped.

    Raises:
        UserError: empty selection or an unknown name (the message lists the known ones).
    """
    specs = specs if specs is not None else load_benchmark_specs()
    parts = text.split(",") if isinstance(text, str) else list(text)
    names: list[str] = []
    for part in parts:
        name = str(part).strip()
        if not name:
            continue
        if name not in specs:
            raise UserError(f"unknown dataset '{name}'; known datasets: {', '.join(sorted(specs))}")
        if name not in names:
            names.append(name)
    if not names:
        raise UserError(f"no dataset given; known datasets: {', '.join(sorted(specs))}")
    return names


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


def _id_to_str(value: Any, loc: str, field: str) -> str:
    if isinstance(value, bool) or value is None or not isinstance(value, (str, int)):
        raise UserError(f"{loc}: field '{field}' must be a string or integer, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise UserError(f"{loc}: field '{field}' is empty")
    return text


def read_problems(path: str | Path, spec: BenchmarkSpec) -> list[Problem]:
    """Read and normalise one JSONL benchmark file (blank lines are skipped).

    Raises:
        UserError: missing file, malformed line, missing/invalid field, duplicate id, no records.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found (dataset '{spec.name}')")
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text: {exc}") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        loc = where(path, lineno)
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{loc}: malformed JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(record, dict):
            raise UserError(f"{loc}: expected a JSON object, got {type(record).__name__}")
        problem_text = None
        for field in spec.problem_fields:
            if field in record and record[field] is not None:
                value = record[field]
                if not isinstance(value, str) or not value.strip():
                    raise UserError(f"{where(path, lineno, field)} must be a non-empty string")
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
        pid = _id_to_str(record[spec.id_field], loc, spec.id_field)
        if pid in seen:
            raise UserError(f"{loc}: field '{spec.id_field}': duplicate id {pid!r} (first on line {seen[pid]})")
        seen[pid] = lineno
        problems.append(
            Problem(dataset=spec.name, id=pid, problem=problem_text, answer=answer, path=str(path), line=lineno)
        )
    if not problems:
        raise UserError(f"{path}: no records (dataset '{spec.name}')")
    return problems


def load_dataset(name: str, data_dir: str | Path, specs: dict[str, BenchmarkSpec] | None = None) -> list[Problem]:
    """Load benchmark ``name`` from ``data_dir/<file>`` (e.g. ``DIR/aime24.jsonl``).

    Raises:
        UserError: unknown name, missing directory/file, or a bad record (see module docstring).
    """
    specs = specs if specs is not None else load_benchmark_specs()
    if name not in specs:
        raise UserError(f"unknown dataset '{name}'; known datasets: {', '.join(sorted(specs))}")
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise UserError(f"{data_dir}: data directory not found")
    return read_problems(data_dir / specs[name].file, specs[name])


def load_datasets(
    names: str | Iterable[str], data_dir: str | Path, specs: dict[str, BenchmarkSpec] | None = None
) -> dict[str, list[Problem]]:
    """Load several benchmarks (``"aime24,aime25"`` or a list), all validated before returning.

    Returns:
        ``{name: [Problem, ...]}`` in the order given.

    Raises:
        UserError: as :func:`parse_dataset_names` and :func:`load_dataset`.
    """
    specs = specs if specs is not None else load_benchmark_specs()
    return {name: load_dataset(name, data_dir, specs) for name in parse_dataset_names(names, specs)}

"""Evaluation benchmark declarations: ``evaluation/benchmarks.json`` parsed into :class:`BenchmarkSpec`, the
normalised :class:`Problem` every loader produces, and the date windows of dated benchmarks.

The one place that says what a benchmark is; the readers of records (:mod:`areal_cli.eval.datasets` for math
files and the load entry points, :mod:`areal_cli.eval.code_datasets` for code rows) build on it. Malformed
declarations, unknown names and malformed window options raise a one-line
:class:`~areal_cli.foundations.errors.UserError`.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from areal_cli.foundations.errors import UserError
from areal_cli.foundations.resources import shipped_dir

#: ``evaluation/benchmarks.json`` at the top level of the repository.
BENCHMARKS_JSON = shipped_dir("evaluation") / "benchmarks.json"

KINDS = ("math", "code")
LOADERS = {"math_jsonl": "math", "lcb": "code", "codecontests": "code", "codeforces": "code"}
#: Value of a date option that removes that bound of the declared window.
NO_BOUND = "none"


@dataclass(frozen=True)
class HubSource:
    """A Hugging Face dataset repository at a pinned revision.

    Attributes:
        repo_id: ``owner/name`` (``livecodebench/code_generation_lite``).
        revision: the commit sha the numbers were computed at (a branch or tag also works, unpinned).
        files: file names or glob patterns inside the repository (``data/test-*.parquet``), read in order.
    """

    repo_id: str
    revision: str
    files: tuple[str, ...]


@dataclass(frozen=True)
class BenchmarkSpec:
    """One benchmark's declaration (an entry of ``evaluation/benchmarks.json``).

    Attributes:
        name: benchmark name used on the command line (``aime24``, ``lcb_v5``).
        file: file name inside the data directory (``aime24.jsonl``, ``lcb_v5.jsonl``).
        id_field: field holding the problem id.
        problem_fields: fields holding the problem text, in order of preference.
        answer_field: field holding the gold answer (math; "" for code).
        source: where the records come from (documentation).
        kind: ``"math"`` or ``"code"``.
        loader: record schema: ``math_jsonl``, ``lcb``, ``codecontests``, ``codeforces``.
        hub: the Hugging Face source (code benchmarks), else None.
        date_field: field holding the problem's date (LCB ``contest_date``, Codeforces ``contest_start``).
        date_from / date_to: default date window, ``YYYY-MM-DD``, both ends inclusive (None: unbounded).
        question_format: how a code statement becomes the problem text (``lcb_generic``; ``raw``).
        test_sets: CodeContests test lists that make up the suite.
        exclude: Codeforces problem classes left out (``interactive``, ``file_io``, ``no_tests``).
        default_protocol / grader / card / url / sha256: documentation and defaults for the runner.
    """

    name: str
    file: str
    id_field: str
    problem_fields: tuple[str, ...]
    answer_field: str = ""
    source: str = ""
    kind: str = "math"
    loader: str = "math_jsonl"
    hub: HubSource | None = None
    date_field: str | None = None
    date_from: str | None = None
    date_to: str | None = None
    question_format: str = "raw"
    test_sets: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    default_protocol: str = ""
    grader: str = ""
    card: str = ""
    url: str = ""
    sha256: str = ""


@dataclass(frozen=True)
class RewardGrader:
    """A custom task's reward grader (:mod:`areal_cli.eval.custom_task`): the reward contract of
    :mod:`areal_cli.api.reward`, run in the grader's worker pool.

    Attributes:
        spec: ``module:function`` or an absolute ``file.py:function``.
        code_dir: put first on ``sys.path`` in the worker (``module:function`` beside the task file).
        threshold: a sample is correct when its reward >= this.
    """

    spec: str
    code_dir: str = ""
    threshold: float = 1.0


@dataclass(frozen=True)
class Problem:
    """One evaluation problem after normalisation.

    Attributes:
        dataset: benchmark name.
        id: problem id as a string (unique within the benchmark).
        problem: problem text: the statement for math; for code the statement in the declared
            ``question_format`` (e.g. LiveCodeBench's own question/format/answer layout).
        answer: gold answer as a string for math (ints as digits, 27.0 -> "27"); "" for code.
        path: the source file.
        line: 1-based line (JSON lines) or row (parquet) number in the source file (for messages).
        kind: ``"math"``, ``"code"`` or ``"reward"`` (a custom task graded by its reward function).
        tests: code: ``areal_cli.reward.code_grader.TestSuite.to_dict()`` (inputs, outputs, fn_name,
            time_limit_s, memory_bytes); None for math.
        meta: breakdown keys (difficulty, platform, contest_id, contest_date, index, rating, ...).
        fields: a custom task's record as read (a reward grader gets them as keywords); None for benchmarks.
        reward: a custom task's reward grader (kind ``"reward"``), else None.
        user_message: the problem text is the whole user message (a custom task's ``prompt_template`` wrote it):
            no instruction is added around it.
    """

    dataset: str
    id: str
    problem: str
    answer: str
    path: str
    line: int
    kind: str = "math"
    tests: dict | None = field(default=None, hash=False, compare=True)
    meta: dict = field(default_factory=dict, hash=False, compare=True)
    fields: dict | None = field(default=None, hash=False, compare=False, repr=False)
    reward: RewardGrader | None = field(default=None, hash=False, compare=False)
    user_message: bool = False


# ------------------------------------------------------------------------------------ declarations
def _str_list(entry: dict, key: str, loc: str, *, required: bool) -> tuple[str, ...]:
    value = entry.get(key)
    if value is None and not required:
        return ()
    if not isinstance(value, list) or (required and not value) or not all(isinstance(v, str) and v for v in value):
        raise UserError(f"{loc}: field '{key}' must be a non-empty list of strings")
    return tuple(value)


def _opt_str(entry: dict, key: str, loc: str) -> str | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise UserError(f"{loc}: field '{key}' must be a non-empty string")
    return value


def _parse_spec(name: str, entry: Any, loc: str) -> BenchmarkSpec:
    if not isinstance(entry, dict):
        raise UserError(f"{loc}: must be an object")
    loader = entry.get("loader", "math_jsonl")
    if loader not in LOADERS:
        raise UserError(f"{loc}: field 'loader' must be one of {', '.join(LOADERS)}, got {loader!r}")
    kind = entry.get("kind", LOADERS[loader])
    if kind != LOADERS[loader]:
        raise UserError(f"{loc}: field 'kind' must be {LOADERS[loader]!r} for loader {loader!r}, got {kind!r}")
    required = ("file", "id_field", "answer_field") if kind == "math" else ("file", "id_field")
    for key in required:
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise UserError(f"{loc}: field '{key}' must be a non-empty string")
    hub = None
    if entry.get("hub") is not None:
        h = entry["hub"]
        hloc = f"{loc}.hub"
        if not isinstance(h, dict):
            raise UserError(f"{hloc}: must be an object")
        for key in ("repo_id", "revision"):
            if not isinstance(h.get(key), str) or not h[key]:
                raise UserError(f"{hloc}: field '{key}' must be a non-empty string")
        hub = HubSource(repo_id=h["repo_id"], revision=h["revision"], files=_str_list(h, "files", hloc, required=True))
    for key in ("date_from", "date_to"):
        if entry.get(key) is not None:
            parse_day(entry[key], f"{loc}: field '{key}'")
    return BenchmarkSpec(
        name=name,
        file=entry["file"],
        id_field=entry["id_field"],
        problem_fields=_str_list(entry, "problem_fields", loc, required=True),
        answer_field=str(entry.get("answer_field", "")),
        source=str(entry.get("source", "")),
        kind=kind,
        loader=loader,
        hub=hub,
        date_field=_opt_str(entry, "date_field", loc),
        date_from=_opt_str(entry, "date_from", loc),
        date_to=_opt_str(entry, "date_to", loc),
        question_format=str(entry.get("question_format", "raw")),
        test_sets=_str_list(entry, "test_sets", loc, required=False),
        exclude=_str_list(entry, "exclude", loc, required=False),
        default_protocol=str(entry.get("default_protocol", "")),
        grader=str(entry.get("grader", "")),
        card=str(entry.get("card", "")),
        url=str(entry.get("url", "")),
        sha256=str(entry.get("sha256", "")),
    )


def load_benchmark_specs(path: str | Path | None = None) -> dict[str, BenchmarkSpec]:
    """Read the benchmark declarations (default: :data:`BENCHMARKS_JSON`).

    Raises:
        UserError: the file is missing or malformed (one line, with the path and the entry).
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
    return {name: _parse_spec(name, entry, f"{path}: benchmarks.{name}") for name, entry in table.items()}


def parse_dataset_names(text: str | Iterable[str], specs: dict[str, BenchmarkSpec] | None = None) -> list[str]:
    """Split ``"aime24,lcb_v5"`` (or a list) into known benchmark names, order kept, duplicates dropped.

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


# ------------------------------------------------------------------------------------ date windows
def parse_day(value: Any, loc: str) -> _dt.datetime:
    """``"2024-10-01"`` (or a ``date``) -> naive midnight datetime, as lcb_runner's
    ``datetime.strptime(s, "%Y-%m-%d")``.

    Raises:
        UserError: not a ``YYYY-MM-DD`` date.
    """
    if isinstance(value, _dt.datetime):
        return value.replace(tzinfo=None)
    if isinstance(value, _dt.date):
        return _dt.datetime(value.year, value.month, value.day)
    try:
        return _dt.datetime.strptime(str(value), "%Y-%m-%d")
    except ValueError:
        raise UserError(f"{loc}: must be a date YYYY-MM-DD (or '{NO_BOUND}'), got {value!r}") from None


def resolve_window(
    spec: BenchmarkSpec, date_from: Any = None, date_to: Any = None
) -> tuple[_dt.datetime | None, _dt.datetime | None] | None:
    """The date window in force for ``spec``: the declared one, with each bound replaced by the option
    when given (``"none"`` removes that bound). Both ends inclusive, compared as datetimes at midnight
    (lcb_runner ``compute_scores``: ``start_date <= contest_date <= end_date``).

    Returns:
        ``(from, to)`` (either may be None) for a benchmark with a ``date_field``; None for one without
        (math, CodeContests), where the options do not apply.

    Raises:
        UserError: a malformed option, or ``from`` after ``to``.
    """
    if spec.date_field is None:
        return None
    bounds = []
    for opt, declared, label in ((date_from, spec.date_from, "date_from"), (date_to, spec.date_to, "date_to")):
        value = declared if opt is None else opt
        if value is None or (isinstance(value, str) and value.strip().lower() == NO_BOUND):
            bounds.append(None)
        else:
            bounds.append(parse_day(value, f"option '{label}'"))
    lo, hi = bounds
    if lo is not None and hi is not None and lo > hi:
        raise UserError(f"option 'date_from' ({lo.date()}) is after option 'date_to' ({hi.date()})")
    return lo, hi


def in_window(when: _dt.datetime, window: tuple[_dt.datetime | None, _dt.datetime | None] | None) -> bool:
    """``from <= when <= to`` (a missing bound or window admits everything)."""
    if window is None:
        return True
    lo, hi = window
    return (lo is None or lo <= when) and (hi is None or when <= hi)


def window_label(window: tuple[_dt.datetime | None, _dt.datetime | None] | None) -> str:
    """``"dated 2024-10-01..2025-02-01"``, ``"dated from 2024-10-01"``, ``"dated until ..."``, ``""``."""
    lo, hi = (None, None) if window is None else (w.date().isoformat() if w is not None else None for w in window)
    if lo and hi:
        return f"dated {lo}..{hi}"
    if lo or hi:
        return f"dated from {lo}" if lo else f"dated until {hi}"
    return ""



# ------------------------------------------------------------------------------------ record ids
def id_to_str(value: Any, loc: str, field: str) -> str:
    """A record id (str or int) as a non-empty string.

    Raises:
        UserError: ``loc: field 'x' must be a string or integer`` / ``is empty``.
    """
    if isinstance(value, bool) or value is None or not isinstance(value, (str, int)):
        raise UserError(f"{loc}: field '{field}' must be a string or integer, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise UserError(f"{loc}: field '{field}' is empty")
    return text

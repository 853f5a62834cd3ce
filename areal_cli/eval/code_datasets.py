"""Code benchmark records in their upstream schemas -> :class:`areal_cli.eval.benchmarks.Problem`.

Three schemas (declared per benchmark in ``evaluation/benchmarks.json`` as ``loader``):

- ``lcb`` — LiveCodeBench ``livecodebench/code_generation_lite`` rows (``test.jsonl`` .. ``test6.jsonl``):
  ``question_title, question_content, platform, question_id, contest_id, contest_date (ISO), starter_code,
  difficulty, public_test_cases (JSON string), private_test_cases (base64(zlib(pickle(JSON string))), or
  plain JSON in early rows), metadata (JSON string; ``func_name`` for call-based LeetCode problems)``.
  Tests: :func:`areal_cli.reward.code_grader.decode_lcb_tests` (public + private, in that order, as
  lcb_runner's ``get_evaluation_sample``).
- ``codecontests`` — DeepMind ``deepmind/code_contests`` rows: ``name, description, public_tests /
  private_tests / generated_tests {input: [str], output: [str]}, source (enum int), difficulty (enum int),
  cf_contest_id, cf_index, cf_rating, time_limit {seconds, nanos}, memory_limit_bytes, ...``. Tests: the
  declared ``test_sets`` concatenated (default public + private + generated).
- ``codeforces`` — ``open-r1/codeforces`` rows: ``id ("2000A"), contest_id, contest_name, contest_start
  (unix s), index, time_limit (s), memory_limit (MB), title, description, input_format, output_format,
  interaction_format, note, examples [{input, output}], rating, tags, official_tests [{input, output}],
  official_tests_complete, input_mode, generated_checker, executable``. Tests: ``official_tests``.

Rows come from JSON-lines files (``file:line`` in messages) or parquet files (``file: row N``; read with
pyarrow, the format of the Hugging Face ``data/*.parquet`` shards). Problem text is the statement in the
declared ``question_format``: ``lcb_generic`` is LiveCodeBench's own user prompt
(``lcb_runner/prompts/code_generation.py`` ``get_generic_question_template_answer``); ``raw`` is the
statement alone.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any, Iterator

from areal_cli.foundations.errors import UserError, where
from areal_cli.eval.benchmarks import BenchmarkSpec, Problem, id_to_str, in_window, window_label
from areal_cli.foundations.jsonl import iter_json_lines

# LiveCodeBench PromptConstants (lcb_runner/prompts/code_generation.py), verbatim.
LCB_FORMAT_WITH_STARTER_CODE = (
    "You will use the following starter code to write the solution to the problem and enclose your code "
    "within delimiters."
)
LCB_FORMAT_WITHOUT_STARTER_CODE = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test on "
    "the sample inputs). Enclose your code within delimiters as follows."
)
QUESTION_FORMATS = ("lcb_generic", "raw")

# deepmind/code_contests class labels (contest_problem.proto), index = stored int.
CODECONTESTS_SOURCES = ("UNKNOWN_SOURCE", "CODECHEF", "CODEFORCES", "HACKEREARTH", "CODEJAM", "ATCODER", "AIZU")
CODECONTESTS_DIFFICULTIES = (
    ("UNKNOWN_DIFFICULTY", "EASY", "MEDIUM", "HARD", "HARDER", "HARDEST", "EXTERNAL")
    + tuple(chr(c) for c in range(ord("A"), ord("V") + 1))
)
#: Parquet columns never read, per loader (human solutions: most of CodeContests' bytes).
UNUSED_COLUMNS = {"codecontests": ("solutions", "incorrect_solutions"), "codeforces": ("editorial",)}
#: Codeforces problem classes a declaration may exclude, with the test that picks them.
CODEFORCES_EXCLUSIONS = ("interactive", "file_io", "no_tests")


def lcb_generic_question(content: str, starter_code: str = "") -> str:
    """LiveCodeBench's generic user prompt for one problem (``get_generic_question_template_answer``)::

        ### Question:\\n{content}\\n\\n### Format: {instruction}\\n```python\\n{starter or # YOUR CODE HERE}\\n```\\n\\n
        ### Answer: (use the provided format with backticks)\\n\\n
    """
    prompt = f"### Question:\n{content}\n\n"
    if starter_code:
        prompt += f"### Format: {LCB_FORMAT_WITH_STARTER_CODE}\n"
        prompt += f"```python\n{starter_code}\n```\n\n"
    else:
        prompt += f"### Format: {LCB_FORMAT_WITHOUT_STARTER_CODE}\n"
        prompt += "```python\n# YOUR CODE HERE\n```\n\n"
    prompt += "### Answer: (use the provided format with backticks)\n\n"
    return prompt


def format_question(spec: BenchmarkSpec, statement: str, starter_code: str = "") -> str:
    """The problem text of a code benchmark in its declared ``question_format``."""
    if spec.question_format == "lcb_generic":
        return lcb_generic_question(statement, starter_code)
    if spec.question_format == "raw":
        return statement if not starter_code else f"{statement}\n\n```python\n{starter_code}\n```"
    raise UserError(f"benchmark '{spec.name}': unknown question_format {spec.question_format!r} "
                    f"(known: {', '.join(QUESTION_FORMATS)})")


# ------------------------------------------------------------------------------------ rows
def iter_rows(path: Path, skip_columns: tuple[str, ...] = ()) -> Iterator[tuple[int, str, dict]]:
    """``(line/row number, location prefix, record)`` of a ``.jsonl`` or ``.parquet`` file, streamed.

    Args:
        skip_columns: parquet columns not read (CodeContests' large ``solutions`` lists).

    Raises:
        UserError: unreadable file, malformed line, not an object.
    """
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        row = 0
        try:
            pfile = pq.ParquetFile(path)
            columns = [n for n in pfile.schema_arrow.names if n not in skip_columns]
            for batch in pfile.iter_batches(batch_size=16, columns=columns):
                for record in batch.to_pylist():
                    row += 1
                    yield row, f"{path}: row {row}", record
        except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid subclasses ValueError
            reason = " ".join(str(exc).split())[:200]
            raise UserError(f"{path}: not a readable parquet file (after row {row}): {reason}") from None
        return
    for lineno, record in iter_json_lines(path):
        yield lineno, where(path, lineno), record


def _field(record: dict, name: str, loc: str, kinds: type | tuple[type, ...], *, nullable: bool = False) -> Any:
    """``record[name]`` checked against ``kinds`` (a bool is never an int here).

    Raises:
        UserError: ``loc: field 'x' missing`` / ``must be str, got list``.
    """
    if name not in record:
        raise UserError(f"{loc}: field '{name}' missing")
    value = record[name]
    if value is None and nullable:
        return None
    allowed = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        names = "/".join(k.__name__ for k in allowed)
        raise UserError(f"{loc}: field '{name}' must be {names}, got {type(value).__name__}")
    return value


def _text(record: dict, name: str, loc: str, *, required: bool = True) -> str:
    """A string field: required -> present and non-blank; optional -> missing/None read as ""."""
    if not required:
        if name not in record:
            return ""
        return _field(record, name, loc, str, nullable=True) or ""
    value = _field(record, name, loc, str)
    if not value.strip():
        raise UserError(f"{loc}: field '{name}' is empty")
    return value


def _test_suite(loc: str, pid: str, inputs: list[str], outputs: list[str], *, time_limit_s: float | None = None,
                memory_bytes: int | None = None, statement: str | None = None) -> dict:
    """``TestSuite(...).to_dict()`` of a stdin/stdout problem; the tolerance the ``statement`` declares, if
    any, goes with the tests (:func:`areal_cli.reward.code_grader.parse_tolerance`).

    Raises:
        UserError: the suite is invalid (naming the problem).
    """
    from areal_cli.reward.code_grader import TestSuite, parse_tolerance

    try:
        suite = TestSuite(inputs=inputs, outputs=outputs, time_limit_s=time_limit_s, memory_bytes=memory_bytes,
                          tolerance=parse_tolerance(statement))
    except ValueError as exc:
        raise UserError(f"{loc}: problem '{pid}': undecodable tests: {exc}") from None
    return suite.to_dict()


def _io_lists(value: Any, loc: str, name: str, pid: str) -> tuple[list[str], list[str]]:
    """``{input: [...], output: [...]}`` (CodeContests) or ``[{input, output}, ...]`` (Codeforces) ->
    two equal-length lists of strings."""
    if value is None:
        return [], []
    if isinstance(value, dict):
        ins, outs = value.get("input"), value.get("output")
    elif isinstance(value, list):
        if not all(isinstance(t, dict) for t in value):
            raise UserError(f"{loc}: problem '{pid}': undecodable tests: field '{name}' must hold "
                            f"{{input, output}} objects")
        ins, outs = [t.get("input") for t in value], [t.get("output") for t in value]
    else:
        raise UserError(f"{loc}: problem '{pid}': undecodable tests: field '{name}' must be an object or "
                        f"a list, got {type(value).__name__}")
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
        raise UserError(f"{loc}: problem '{pid}': undecodable tests: field '{name}' needs equal-length "
                        f"input and output lists")
    if not all(isinstance(x, str) for x in ins + outs):
        raise UserError(f"{loc}: problem '{pid}': undecodable tests: field '{name}' has a non-string "
                        f"input or output")
    return list(ins), list(outs)


# ------------------------------------------------------------------------------------ LiveCodeBench
def parse_lcb_date(value: Any, loc: str) -> _dt.datetime:
    """LCB ``contest_date`` (``"2024-10-05T00:00:00"``) -> naive datetime (``datetime.fromisoformat``,
    as lcb_runner).

    Raises:
        UserError: not a string / not ISO 8601.
    """
    if not isinstance(value, str):
        raise UserError(f"{loc}: field 'contest_date' must be str, got {type(value).__name__}")
    try:
        when = _dt.datetime.fromisoformat(value)
    except ValueError:
        raise UserError(f"{loc}: field 'contest_date' is not an ISO date: {value!r}") from None
    return when.replace(tzinfo=None)


def lcb_problem(spec: BenchmarkSpec, record: dict, path: Path, line: int, loc: str, pid: str,
                when: _dt.datetime) -> Problem:
    """One LiveCodeBench row -> Problem (tests decoded by the code grader's ``decode_lcb_tests``, with the
    tolerance ``question_content`` declares, if any).

    Raises:
        UserError: a missing/mistyped field; undecodable or empty tests (naming the problem id).
    """
    from areal_cli.reward.code_grader import decode_lcb_tests

    content = _text(record, spec.problem_fields[0], loc)
    starter = _text(record, "starter_code", loc, required=False)
    for name in ("question_title", "platform", "contest_id", "difficulty"):
        _field(record, name, loc, str)
    public = _field(record, "public_test_cases", loc, str)
    private = _field(record, "private_test_cases", loc, str)
    metadata = _field(record, "metadata", loc, str)
    try:
        suite = decode_lcb_tests(public, private, metadata, statement=content)
    except ValueError as exc:
        raise UserError(f"{loc}: problem '{pid}': undecodable tests: {' '.join(str(exc).split())[:300]}") from None
    tests = suite.to_dict()
    meta = {
        "platform": record["platform"],
        "difficulty": record["difficulty"],
        "contest_id": record["contest_id"],
        "contest_date": when.isoformat(),
        "title": record["question_title"],
        "fn_name": tests.get("fn_name"),
        "n_tests": len(tests["inputs"]),
    }
    return Problem(dataset=spec.name, id=pid, problem=format_question(spec, content, starter), answer="",
                   path=str(path), line=line, kind="code", tests=tests, meta=meta)


# ------------------------------------------------------------------------------------ CodeContests
def _enum_name(value: Any, names: tuple[str, ...], loc: str, field: str) -> str:
    if isinstance(value, str) and value in names:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    raise UserError(f"{loc}: field '{field}' must be one of 0..{len(names) - 1} or its name, got {value!r}")


def codecontests_problem(spec: BenchmarkSpec, record: dict, path: Path, line: int, loc: str, pid: str) -> Problem:
    """One CodeContests row -> Problem: tests = the declared ``test_sets`` concatenated; time limit
    ``seconds + nanos / 1e9``; memory limit in bytes (0 -> None).

    Raises:
        UserError: a missing/mistyped field; malformed or empty tests (naming the problem).
    """
    statement = _text(record, spec.problem_fields[0], loc)
    inputs: list[str] = []
    outputs: list[str] = []
    for name in spec.test_sets or ("public_tests", "private_tests", "generated_tests"):
        if name not in record:
            raise UserError(f"{loc}: field '{name}' missing")
        ins, outs = _io_lists(record[name], loc, name, pid)
        inputs += ins
        outputs += outs
    if not inputs:
        raise UserError(f"{loc}: problem '{pid}': no tests in {', '.join(spec.test_sets)}")
    tl = record.get("time_limit")
    time_limit_s = None
    if isinstance(tl, dict) and (tl.get("seconds") or tl.get("nanos")):
        time_limit_s = float(tl.get("seconds") or 0) + float(tl.get("nanos") or 0) / 1e9
    mem = record.get("memory_limit_bytes")
    memory_bytes = int(mem) if isinstance(mem, int) and not isinstance(mem, bool) and mem > 0 else None
    meta = {
        "platform": _enum_name(_field(record, "source", loc, (int, str)), CODECONTESTS_SOURCES, loc, "source"),
        "difficulty": _enum_name(_field(record, "difficulty", loc, (int, str)), CODECONTESTS_DIFFICULTIES, loc,
                                 "difficulty"),
        "contest_id": str(record["cf_contest_id"]) if record.get("cf_contest_id") else None,
        "index": record.get("cf_index") or None,
        "rating": record.get("cf_rating") or None,
        "time_limit_s": time_limit_s,
        "memory_bytes": memory_bytes,
        "file_io": bool(record.get("input_file") or record.get("output_file")),
        "n_tests": len(inputs),
    }
    tests = _test_suite(loc, pid, inputs, outputs, time_limit_s=time_limit_s, memory_bytes=memory_bytes,
                        statement=statement)
    return Problem(dataset=spec.name, id=pid, problem=format_question(spec, statement), answer="",
                   path=str(path), line=line, kind="code", tests=tests, meta=meta)


# ------------------------------------------------------------------------------------ Codeforces
def codeforces_statement(record: dict, loc: str) -> str:
    """The statement of an open-r1/codeforces row, laid out as CodeContests' Codeforces descriptions:
    description, then ``Input``, ``Output``, ``Examples`` (``Input``/``Output`` pairs) and ``Note``
    sections, each present only when the row has it."""
    parts = [_text(record, "description", loc)]
    for title, name in (("Input", "input_format"), ("Output", "output_format")):
        body = record.get(name)
        if isinstance(body, str) and body.strip():
            parts += [title, body.strip()]
    examples = record.get("examples") or []
    if isinstance(examples, list) and examples:
        parts.append("Examples")
        for ex in examples:
            if isinstance(ex, dict):
                parts += ["Input", str(ex.get("input", "")).rstrip("\n"), "Output", str(ex.get("output", "")).rstrip("\n")]
    note = record.get("note")
    if isinstance(note, str) and note.strip():
        parts += ["Note", note.strip()]
    return "\n\n".join(parts)


def codeforces_exclusion(record: dict) -> str | None:
    """Why a Codeforces row cannot be graded by stdin/stdout tests, or None:
    ``interactive`` (non-empty ``interaction_format``), ``file_io`` (``input_mode`` other than ``stdio``),
    ``no_tests`` (empty ``official_tests``)."""
    if isinstance(record.get("interaction_format"), str) and record["interaction_format"].strip():
        return "interactive"
    if record.get("input_mode") not in (None, "", "stdio"):
        return "file_io"
    if not record.get("official_tests"):
        return "no_tests"
    return None


def codeforces_problem(spec: BenchmarkSpec, record: dict, path: Path, line: int, loc: str, pid: str) -> Problem:
    """One open-r1/codeforces row -> Problem: tests = ``official_tests``; time limit in s, memory MB -> bytes.

    Raises:
        UserError: a missing/mistyped field; malformed or empty tests (naming the problem).
    """
    statement = codeforces_statement(record, loc)
    inputs, outputs = _io_lists(_field(record, "official_tests", loc, list), loc, "official_tests", pid)
    if not inputs:
        raise UserError(f"{loc}: problem '{pid}': no tests in official_tests")
    tl = record.get("time_limit")
    ml = record.get("memory_limit")
    time_limit_s = float(tl) if isinstance(tl, (int, float)) and not isinstance(tl, bool) and tl > 0 else None
    memory_bytes = int(ml * 1024 * 1024) if isinstance(ml, (int, float)) and not isinstance(ml, bool) and ml > 0 else None
    start = record.get("contest_start")
    meta = {
        "platform": "codeforces",
        "contest_id": str(_field(record, "contest_id", loc, (str, int))),
        "index": _field(record, "index", loc, str),
        "rating": record.get("rating"),
        "difficulty": record.get("rating"),
        "contest_name": record.get("contest_name"),
        "contest_start": start,
        "contest_date": (_dt.datetime.fromtimestamp(start, _dt.timezone.utc).replace(tzinfo=None).isoformat()
                         if isinstance(start, int) else None),
        "tags": list(record.get("tags") or []),
        "official_tests_complete": record.get("official_tests_complete"),
        "has_checker": bool(record.get("generated_checker")),
        "time_limit_s": time_limit_s,
        "memory_bytes": memory_bytes,
        "n_tests": len(inputs),
    }
    tests = _test_suite(loc, pid, inputs, outputs, time_limit_s=time_limit_s, memory_bytes=memory_bytes,
                        statement=statement)
    return Problem(dataset=spec.name, id=pid, problem=format_question(spec, statement), answer="",
                   path=str(path), line=line, kind="code", tests=tests, meta=meta)


def _codeforces_date(record: dict, loc: str, field: str) -> _dt.datetime:
    value = _field(record, field, loc, int)
    return _dt.datetime.fromtimestamp(value, _dt.timezone.utc).replace(tzinfo=None)


# ------------------------------------------------------------------------------------ dispatch
def load_code_problems(
    spec: BenchmarkSpec, files: list[Path], window: tuple[_dt.datetime | None, _dt.datetime | None] | None
) -> tuple[list[Problem], dict[str, Any]]:
    """Read ``files`` (in order) with ``spec.loader``'s schema, keep the rows inside ``window`` (and not
    excluded), decode their tests.

    Returns:
        ``(problems, stats)``; stats: ``n_records`` (rows read), ``excluded`` ({reason: count};
        ``out_of_window`` for the window).

    Raises:
        UserError: a bad row (``file:line`` + field or problem id), a duplicate id, no problem left.
    """
    if spec.loader not in ("lcb", "codecontests", "codeforces"):
        raise UserError(f"benchmark '{spec.name}': loader {spec.loader!r} is not a code loader")
    unknown = [e for e in spec.exclude if e not in CODEFORCES_EXCLUSIONS]
    if unknown:
        raise UserError(f"benchmark '{spec.name}': unknown exclusion {unknown[0]!r} "
                        f"(known: {', '.join(CODEFORCES_EXCLUSIONS)})")
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    excluded: dict[str, int] = {}
    n_records = 0
    for path in files:
        for line, loc, record in iter_rows(path, skip_columns=UNUSED_COLUMNS.get(spec.loader, ())):
            n_records += 1
            if spec.id_field not in record:
                raise UserError(f"{loc}: field '{spec.id_field}' missing")
            pid = id_to_str(record[spec.id_field], loc, spec.id_field)
            when = None
            bounded = window is not None and any(b is not None for b in window)
            if spec.date_field is not None and (bounded or spec.loader == "lcb"):
                when = (parse_lcb_date(_field(record, spec.date_field, loc, str), loc) if spec.loader == "lcb"
                        else _codeforces_date(record, loc, spec.date_field))
                if not in_window(when, window):
                    excluded["out_of_window"] = excluded.get("out_of_window", 0) + 1
                    continue
            if spec.loader == "codeforces":
                reason = codeforces_exclusion(record)
                if reason is not None and reason in spec.exclude:
                    excluded[reason] = excluded.get(reason, 0) + 1
                    continue
            if pid in seen:
                raise UserError(f"{loc}: field '{spec.id_field}': duplicate id {pid!r} (first at {seen[pid]})")
            seen[pid] = loc
            if spec.loader == "lcb":
                problems.append(lcb_problem(spec, record, path, line, loc, pid, when))
            elif spec.loader == "codecontests":
                problems.append(codecontests_problem(spec, record, path, line, loc, pid))
            else:
                problems.append(codeforces_problem(spec, record, path, line, loc, pid))
    if not problems:
        names = ", ".join(str(p) for p in files)
        label = window_label(window)
        raise UserError(f"{names}: no problems {label + ' ' if label else ''}left of {n_records} records "
                        f"(dataset '{spec.name}')")
    return problems, {"n_records": n_records, "excluded": excluded}

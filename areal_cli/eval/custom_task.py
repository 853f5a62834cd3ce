"""Your own evaluation tasks for ``areal eval`` and ``loop.eval_benchmarks``: a records file, or a small task YAML.

Besides the benchmarks declared in ``evaluation/benchmarks.json``, ``--data`` takes:

- ``path/to/records.jsonl`` (``.json`` lines, ``.parquet``): the file is the task. The id is the record's ``id``
  (else its 1-based line / row number), the problem text the first of ``problem``, ``question``, ``prompt`` the
  record has, the gold answer ``answer``; graded by the math grader (math-verify, as the math benchmarks).
- ``path/to/my-task.yaml``, or ``my-task`` with ``--data-dir DIR`` holding ``DIR/my-task.yaml``: a declared task,
  written like an lm-evaluation-harness task::

      records: data/test.jsonl          # JSONL or Parquet, relative to this file
      id_field: id                      # optional; "" or absent: "id", else the line number
      prompt_field: question            # the problem text (or several: [question, problem])
      prompt_template: "{question}\\nPut the final answer in \\\\boxed{{}}."   # optional, str.format over the record
      answer_field: answer              # the gold answer (math; optional for a reward grader)
      grader: math                      # math | code | module:function | file.py:function
      tests_field: tests                # code: the record field holding the TestSuite dict
      pass_threshold: 1.0               # module:function: correct when reward >= this
      default_protocol: chat-template   # optional; the protocol when --protocol is not given
      samples: 4                        # optional; samples per problem when -n is not given
      name: my-task                     # optional; default: the file's stem
      code_dir: .                       # optional; first on sys.path for module:function (default: this folder)

The records are read with the training side's readers (:mod:`areal_cli.api.records`), ``module:function`` graders
are named and loaded as training rewards are (:mod:`areal_cli.api.loading`, paths relative to the YAML's folder)
and run with the reward contract (:mod:`areal_cli.api.reward`) in the grader's worker pool.

Every problem is checked before any model conversion or generation; bad input is one
:class:`~areal_cli.foundations.errors.UserError` line naming the file, the line and the field, e.g.
``test.jsonl:3: field 'answer' missing (task my-task.yaml: answer_field)``.
"""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from areal_cli.eval.benchmarks import BenchmarkSpec, Problem, RewardGrader
from areal_cli.foundations.errors import UserError

#: File suffixes that make a ``--data`` entry a task file rather than a benchmark name.
TASK_SUFFIXES = (".yaml", ".yml")
RECORD_SUFFIXES = (".jsonl", ".json", ".parquet")
#: The problem-text fields of a records file evaluated directly, in order of preference.
DEFAULT_PROMPT_FIELDS = ("problem", "question", "prompt")
BUILTIN_GRADERS = ("math", "code")
#: The keys of a task YAML.
TASK_KEYS = ("name", "records", "id_field", "prompt_field", "prompt_template", "answer_field", "grader",
             "tests_field", "pass_threshold", "default_protocol", "samples", "code_dir", "description")
#: The default protocol of a task that names none: the model's own chat template.
DEFAULT_TASK_PROTOCOL = "chat-template"


@dataclass(frozen=True)
class TaskSpec:
    """One custom evaluation task.

    Attributes:
        name: the task's name in results (``results.json`` key, ``samples.jsonl`` ``dataset``).
        records: the records file (absolute).
        task_file: the task YAML (absolute), or None for a records file evaluated directly.
        id_field: the id field; "" = ``id`` when present, else the 1-based line (row) number.
        prompt_fields: fields holding the problem text, the first present wins.
        prompt_template: ``str.format`` template over the record's fields (None: the problem text as is).
        answer_field: the gold-answer field ("" only for reward graders).
        grader: ``math``, ``code`` or a ``module:function`` / absolute ``file.py:function`` reward.
        tests_field: code grader: the field holding the TestSuite dict.
        pass_threshold: reward grader: a sample is correct when its reward >= this.
        default_protocol: the protocol when ``--protocol`` is not given ("" = chat-template).
        samples: samples per problem when ``-n`` is not given (None: the protocol's).
        code_dir: first on ``sys.path`` for a ``module:function`` grader.
    """

    name: str
    records: Path
    task_file: Path | None = None
    id_field: str = ""
    prompt_fields: tuple[str, ...] = DEFAULT_PROMPT_FIELDS
    prompt_template: str | None = None
    answer_field: str = "answer"
    grader: str = "math"
    tests_field: str = "tests"
    pass_threshold: float = 1.0
    default_protocol: str = ""
    samples: int | None = None
    code_dir: str = ""

    @property
    def kind(self) -> str:
        """``"math"``, ``"code"`` or ``"reward"`` (a ``module:function`` grader)."""
        return self.grader if self.grader in BUILTIN_GRADERS else "reward"

    @property
    def label(self) -> str:
        """How messages name the task: ``task my-task.yaml`` or ``records file test.jsonl``."""
        return f"task {self.task_file.name}" if self.task_file is not None else f"records file {self.records.name}"

    def benchmark_spec(self) -> BenchmarkSpec:
        """The task as a :class:`BenchmarkSpec` (protocol choice and checks treat it like a declared benchmark)."""
        return BenchmarkSpec(name=self.name, file=str(self.records), id_field=self.id_field or "id",
                             problem_fields=self.prompt_fields, answer_field=self.answer_field,
                             source=str(self.task_file or self.records), kind=self.kind, loader="task",
                             default_protocol=self.default_protocol or DEFAULT_TASK_PROTOCOL, grader=self.grader)


# ------------------------------------------------------------------------------------ which --data entries
def is_task_path(name: str) -> bool:
    """Whether a ``--data`` entry names a file (a task YAML or a records file) by its suffix.

    Args:
        name: one ``--data`` entry.
    Returns:
        True for ``.yaml``/``.yml``/``.jsonl``/``.json``/``.parquet`` names.
    """
    return str(name).lower().endswith(TASK_SUFFIXES + RECORD_SUFFIXES)


def find_task_file(name: str, data_dir: str | Path | None, builtin: Sequence[str]) -> Path | None:
    """The task file a ``--data`` entry means, or None for a built-in benchmark name.

    A name with a task or records suffix is a path (relative to the current directory, else to ``data_dir``); a
    built-in name is the benchmark; any other name is ``DATA_DIR/<name>.yaml`` (or ``.yml``) when that exists.

    Raises:
        UserError: a task path that does not exist; a name that is neither built in nor a task in ``data_dir``
            (the message lists the known benchmarks).
    """
    name = str(name).strip()
    if is_task_path(name):
        p = Path(name).expanduser()
        if p.is_file():
            return p
        if data_dir is not None and not p.is_absolute() and (Path(data_dir) / p).is_file():
            return Path(data_dir) / p
        what = "a task file" if p.suffix.lower() in TASK_SUFFIXES else "a records file"
        raise UserError(f"{p}: file not found (option '--data': {what}"
                        f"{'' if data_dir is None else f', also looked for in {data_dir}'})")
    if name in builtin:
        return None
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UserError(f"{data_dir}: data directory not found (option '--data-dir', looked for {name}.yaml in it)")
    if data_dir is not None:
        for suffix in TASK_SUFFIXES:
            p = Path(data_dir) / f"{name}{suffix}"
            if p.is_file():
                return p
    where = f"{data_dir}/{name}.yaml" if data_dir is not None else f"--data-dir DIR holding {name}.yaml"
    raise UserError(f"unknown dataset '{name}'; known datasets: {', '.join(sorted(builtin))} (or a task: "
                    f"path/to/task.yaml, path/to/records.jsonl|.parquet, or {where})")


def load_task(path: str | Path) -> TaskSpec:
    """The task a file declares: a task YAML (:func:`read_task_yaml`) or a records file evaluated directly.

    Raises:
        UserError: as :func:`read_task_yaml`; a records file that does not exist.
    """
    path = Path(path)
    if path.suffix.lower() in TASK_SUFFIXES:
        return read_task_yaml(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found (option '--data')")
    return TaskSpec(name=path.stem, records=path.resolve())


def _str_key(data: Any, key: str, path: Path, *, default: str = "") -> str:
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise UserError(f"{path}:{data.at(key)}: field '{key}': expected a string, got {type(value).__name__} "
                        f"{value!r:.40}")
    return value.strip() if key != "prompt_template" else value


def template_fields(template: str, where: str) -> list[str]:
    """The record fields a ``str.format`` template names (``{question}``, ``{meta[level]}`` -> ``meta``).

    Raises:
        UserError: a malformed template, or a positional ``{}`` / ``{0}`` (a record has names only).
    """
    names: list[str] = []
    try:
        for _, field_name, _, _ in string.Formatter().parse(template):
            if field_name is None:
                continue
            base = re.split(r"[.\[]", field_name, maxsplit=1)[0]
            if not base or base.isdigit():
                raise UserError(f"{where}: positional field {{{field_name}}} in the template: name a record field "
                                f"({{question}}); write a literal brace as {{{{ or }}}}")
            names.append(base)
    except ValueError as e:
        raise UserError(f"{where}: malformed template: {e} (a literal brace is written {{{{ or }}}})") from None
    return list(dict.fromkeys(names))


def read_task_yaml(path: str | Path) -> TaskSpec:
    """Read and check a task YAML (format in the module docstring); the grader is imported now.

    Raises:
        UserError: ``file:line: field 'k': ...`` for an unknown key (with the close one), a wrong type, a missing
            ``records`` file, an unknown grader, a ``module:function`` grader that does not import or cannot take
            ``(prompt, completion, prompt_ids, completion_ids, **fields)``, a math task without ``answer_field``,
            an unknown default protocol, a malformed template, ``samples`` < 1.
    """
    from areal_cli.api.loading import absolute_spec, add_code_dir, check_spec
    from areal_cli.foundations.typed_yaml import LineDict, read_yaml, unknown_key

    path = Path(path)
    data = read_yaml(path, "task file")
    if not isinstance(data, LineDict):
        raise UserError(f"{path}:1: a task file must be a mapping (records: ..., grader: ...)")
    for key in data:
        if key not in TASK_KEYS:
            raise unknown_key(f"{path}:{data.at(key)}", key, TASK_KEYS)
    base = path.resolve().parent
    records = _str_key(data, "records", path)
    if not records:
        raise UserError(f"{path}:{data.line}: field 'records' missing (the records file: JSONL or Parquet, relative "
                        f"to this file)")
    rec_path = Path(records).expanduser()
    rec_path = rec_path if rec_path.is_absolute() else base / rec_path
    if not rec_path.is_file():
        raise UserError(f"{path}:{data.at('records')}: field 'records': {rec_path} not found")
    if rec_path.suffix.lower() not in RECORD_SUFFIXES:
        raise UserError(f"{path}:{data.at('records')}: field 'records': {rec_path}: expected a "
                        f"{'/'.join(RECORD_SUFFIXES)} file")
    prompt = data.get("prompt_field")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) and p.strip() for p in prompt):
        prompt_fields = tuple(p.strip() for p in prompt)
    elif prompt is None:
        prompt_fields = DEFAULT_PROMPT_FIELDS
    elif isinstance(prompt, str) and prompt.strip():
        prompt_fields = (prompt.strip(),)
    else:
        raise UserError(f"{path}:{data.at('prompt_field')}: field 'prompt_field': expected a field name (or a list "
                        f"of them), got {prompt!r:.40}")
    template = _str_key(data, "prompt_template", path) or None
    if template is not None:
        template_fields(template, f"{path}:{data.at('prompt_template')}: field 'prompt_template'")
    grader = _str_key(data, "grader", path, default="math") or "math"
    code_dir = _str_key(data, "code_dir", path)
    code_dir = str((base / code_dir).resolve()) if code_dir else str(base)
    if grader not in BUILTIN_GRADERS:
        where_grader = f"{path}:{data.at('grader')}: field 'grader'"
        if ":" not in grader:
            import difflib

            close = difflib.get_close_matches(grader, BUILTIN_GRADERS, n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise UserError(f"{where_grader}: unknown grader {grader!r} ({hint}math, code, or a reward function "
                            f"module:function / file.py:function)")
        check_spec(grader, where_grader)
        grader = absolute_spec(grader, base)
        from areal_cli.api.reward import resolve_reward

        add_code_dir(code_dir)
        resolve_reward(grader, where_grader)
    answer_field = _str_key(data, "answer_field", path, default="answer" if grader == "math" else "")
    if grader == "math" and not answer_field:
        raise UserError(f"{path}:{data.at('answer_field')}: field 'answer_field': the math grader needs the gold "
                        f"answer's field")
    threshold = data.get("pass_threshold", 1.0)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise UserError(f"{path}:{data.at('pass_threshold')}: field 'pass_threshold': expected a number, got "
                        f"{threshold!r}")
    protocol = _str_key(data, "default_protocol", path)
    if protocol:
        from areal_cli.eval.protocols import PROTOCOLS

        if protocol not in PROTOCOLS:
            raise UserError(f"{path}:{data.at('default_protocol')}: field 'default_protocol': unknown protocol "
                            f"{protocol!r}; known protocols: {', '.join(PROTOCOLS)}")
        kind = grader if grader in BUILTIN_GRADERS else None  # a reward grader takes any protocol
        if kind is not None and PROTOCOLS[protocol].kind not in ("any", kind):
            fitting = ", ".join(n for n, p in PROTOCOLS.items() if p.kind in ("any", kind))
            raise UserError(f"{path}:{data.at('default_protocol')}: field 'default_protocol': protocol {protocol!r} "
                            f"is for {PROTOCOLS[protocol].kind} tasks; this task's grader is {kind} ({fitting})")
    samples = data.get("samples")
    if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int) or samples < 1):
        raise UserError(f"{path}:{data.at('samples')}: field 'samples': expected an integer >= 1, got {samples!r}")
    name = _str_key(data, "name", path) or path.stem
    return TaskSpec(name=name, records=rec_path.resolve(), task_file=path.resolve(),
                    id_field=_str_key(data, "id_field", path), prompt_fields=prompt_fields, prompt_template=template,
                    answer_field=answer_field, grader=grader,
                    tests_field=_str_key(data, "tests_field", path, default="tests") or "tests",
                    pass_threshold=float(threshold), default_protocol=protocol, samples=samples, code_dir=code_dir)


# ------------------------------------------------------------------------------------ records -> problems
def _line_of(loc: str) -> int:
    """The line (row) number at the end of a record location (``file:12`` / ``file: row 12``)."""
    m = re.search(r"(\d+)$", loc)
    return int(m.group(1)) if m else 0


def _answer_text(value: Any, loc: str, field: str, task: TaskSpec) -> str:
    """A gold answer as a string (ints as digits, 27.0 -> "27"), as the math benchmarks read theirs."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UserError(f"{loc}: field '{field}' must be a string or number, got {type(value).__name__} "
                        f"({task.label}: answer_field)")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"{loc}: field '{field}' is not a finite number: {value!r} ({task.label}: answer_field)")
        return str(int(value)) if value.is_integer() else repr(value)
    if not value.strip():
        raise UserError(f"{loc}: field '{field}' is empty ({task.label}: answer_field)")
    return value.strip()


def task_problems(task: TaskSpec) -> list[Problem]:
    """Read ``task.records`` and turn every record into a :class:`Problem` (all checked, in file order).

    Returns:
        the problems; ``Problem.kind`` is the task's (math | code | reward), ``fields`` the record (reward
        graders get them as keywords), ``user_message`` set when a template wrote the whole user message.

    Raises:
        UserError: unreadable records (``file:line: malformed JSON``), a record missing the prompt, answer, id or
            tests field or a field the template names (``file:line: field 'answer' missing (task my-task.yaml:
            answer_field)``), undecodable tests, an empty problem text, duplicate ids, no record at all.
    """
    from areal_cli.api.records import iter_records, parse_source

    src = parse_source(str(task.records), what=f"{task.label}: records")
    reward = RewardGrader(task.grader, task.code_dir, task.pass_threshold) if task.kind == "reward" else None
    tmpl_fields = template_fields(task.prompt_template, task.label) if task.prompt_template else []
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    checked: set[frozenset] = set()
    for rec in iter_records(src, what=f"{task.label}: records"):
        fields, loc, line = rec.fields, rec.where, _line_of(rec.where)
        if task.prompt_template is not None:
            for f in tmpl_fields:
                if f not in fields:
                    raise UserError(f"{loc}: field '{f}' missing ({task.label}: prompt_template)")
            try:
                text = task.prompt_template.format(**fields)
            except (KeyError, IndexError, AttributeError, TypeError, ValueError) as e:
                raise UserError(f"{loc}: {task.label}: prompt_template cannot be filled from this record: "
                                f"{type(e).__name__}: {e}") from None
        else:
            present = [f for f in task.prompt_fields if fields.get(f) is not None]
            if not present:
                extra = (f" (nor {', '.join(repr(f) for f in task.prompt_fields[1:])})"
                         if len(task.prompt_fields) > 1 else "")
                raise UserError(f"{loc}: field '{task.prompt_fields[0]}' missing{extra} ({task.label}: prompt_field)")
            text = fields[present[0]]
            if not isinstance(text, str):
                raise UserError(f"{loc}: field '{present[0]}' must be a string, got {type(text).__name__} "
                                f"({task.label}: prompt_field)")
        if not text.strip():
            raise UserError(f"{loc}: the problem text is empty ({task.label}: "
                            f"{'prompt_template' if task.prompt_template else 'prompt_field'})")
        answer = ""
        if task.answer_field:
            if fields.get(task.answer_field) is None:
                raise UserError(f"{loc}: field '{task.answer_field}' missing ({task.label}: answer_field)")
            value = fields[task.answer_field]
            answer = _answer_text(value, loc, task.answer_field, task) if task.kind == "math" else (
                value if isinstance(value, str) else str(value))
        if task.id_field:
            if fields.get(task.id_field) is None:
                raise UserError(f"{loc}: field '{task.id_field}' missing ({task.label}: id_field)")
            raw_id, id_name = fields[task.id_field], task.id_field
        elif fields.get("id") is not None:
            raw_id, id_name = fields["id"], "id"
        else:
            raw_id, id_name = line, None
        if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or not str(raw_id).strip():
            raise UserError(f"{loc}: field '{id_name}' must be a non-empty string or integer, got {raw_id!r:.40} "
                            f"({task.label}: id_field)")
        pid = str(raw_id).strip()
        if pid in seen:
            raise UserError(f"{loc}: field '{id_name or 'id'}': duplicate id {pid!r} (first on line {seen[pid]}; "
                            f"{task.label})")
        seen[pid] = line
        if reward is not None and frozenset(fields) not in checked:  # the grader takes this record's fields
            from areal_cli.api.reward import check_fields

            check_fields(task.grader, fields, loc, what=f"{task.label}: grader")
            checked.add(frozenset(fields))
        tests = None
        if task.kind == "code":
            tests = _tests_of(fields, loc, task)
        problems.append(Problem(dataset=task.name, id=pid, problem=text, answer=answer, path=str(task.records),
                                line=line, kind=task.kind, tests=tests, fields=dict(fields), reward=reward,
                                user_message=task.prompt_template is not None))
    if not problems:
        raise UserError(f"{task.records}: no records ({task.label})")
    return problems


def _tests_of(fields: dict, loc: str, task: TaskSpec) -> dict:
    """A code record's tests as ``TestSuite.to_dict()``; a JSON string is read too."""
    import json

    from areal_cli.reward.code_grader import TestSuite

    value = fields.get(task.tests_field)
    if value is None:
        raise UserError(f"{loc}: field '{task.tests_field}' missing ({task.label}: tests_field)")
    try:
        if isinstance(value, str):
            value = json.loads(value)
        suite = TestSuite.from_dict(value)
    except ValueError as e:
        raise UserError(f"{loc}: field '{task.tests_field}': undecodable tests: {e} ({task.label}: tests_field)"
                        ) from None
    if not suite.inputs:
        raise UserError(f"{loc}: field '{task.tests_field}': no test ({task.label}: tests_field)")
    return suite.to_dict()


def load_task_with_report(path: str | Path) -> tuple[TaskSpec, list[Problem], dict[str, Any]]:
    """Load a task file and say what was read, as :func:`areal_cli.eval.datasets.load_benchmark_with_report` does.

    Returns:
        ``(task, problems, report)``; the report (``results.json`` ``config.data[name]``): benchmark, kind,
        loader ``task``, source ``local``, task_file, files (the task YAML and the records, each with bytes and
        sha256), n_records, n_problems, grader, default_protocol, prompt_template, pass_threshold.

    Raises:
        UserError: as :func:`load_task` and :func:`task_problems`.
    """
    from areal_cli.eval.datasets import file_record

    task = load_task(path)
    problems = task_problems(task)
    files = ([task.task_file] if task.task_file is not None else []) + [task.records]
    report = {
        "benchmark": task.name, "kind": task.kind, "loader": "task", "source": "local",
        "task_file": None if task.task_file is None else str(task.task_file),
        "repo_id": None, "files": [file_record(p) for p in files], "date_window": None,
        "n_problems": len(problems), "n_records": len(problems), "question_format": None,
        "default_protocol": task.default_protocol or DEFAULT_TASK_PROTOCOL, "grader": task.grader,
        "id_field": task.id_field or None, "prompt_fields": list(task.prompt_fields),
        "prompt_template": task.prompt_template, "answer_field": task.answer_field or None,
        "pass_threshold": task.pass_threshold if task.kind == "reward" else None,
        "samples": task.samples,
    }
    return task, problems, report


def spec_from_report(report: dict[str, Any]) -> BenchmarkSpec:
    """A task's :class:`BenchmarkSpec` rebuilt from its load report (for protocol choice and checks).

    Args:
        report: the report of :func:`load_task_with_report`.
    Returns:
        the spec (``loader`` ``task``, the task's kind, default protocol and grader).
    """
    return BenchmarkSpec(name=report["benchmark"], file=report["files"][-1]["path"], id_field=report["id_field"] or "id",
                         problem_fields=tuple(report["prompt_fields"]), answer_field=report["answer_field"] or "",
                         source=report["task_file"] or report["files"][-1]["path"], kind=report["kind"],
                         loader="task", default_protocol=report["default_protocol"], grader=report["grader"])


def task_samples(reports: dict[str, dict[str, Any]]) -> int | None:
    """The samples per problem the selected tasks ask for (``samples:``), None when none does.

    Raises:
        UserError: two tasks that ask for different numbers, or a task that asks for some beside a benchmark or
            task that does not (one ``n`` holds for the whole run: pass ``-n``).
    """
    asked = {name: r["samples"] for name, r in reports.items() if r.get("loader") == "task" and r.get("samples")}
    if len(set(asked.values())) > 1:
        listing = ", ".join(f"{k} ({v})" for k, v in asked.items())
        raise UserError(f"the tasks ask for different samples per problem: {listing}; choose one with -n")
    others = [name for name in reports if name not in asked]
    if asked and others:
        (task, k), = list(asked.items())[:1]
        raise UserError(f"task {task} asks for {k} samples per problem (samples:), {', '.join(others)} for its "
                        f"protocol's; one number holds for the whole run: choose it with -n")
    return next(iter(asked.values()), None)

"""Checks of an ``areal eval`` run before anything is generated or written: the output directory, the
selected benchmarks with their code tests, and the code sandbox's isolation. Each failure is one
:class:`UserError` line."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from areal_cli.foundations.errors import UserError, where
from areal_cli.eval.benchmarks import BenchmarkSpec, Problem, load_benchmark_specs, parse_dataset_names
from areal_cli.eval.datasets import load_benchmark_with_report
from areal_cli.eval.grading import graders_kinds, problem_kind, problem_tests


def check_out_dir(out_dir: Path) -> None:
    """Refuse an output path that is a file or holds a finished run (``results.json``).

    Raises:
        UserError: one line with the path.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir}: output path exists and is not a directory")
    if (out_dir / "results.json").exists():
        raise UserError(f"{out_dir}: already holds results.json; choose another --out")
    if not out_dir.exists():
        # The nearest existing ancestor must be a directory we can create folders in (tested by creating
        # and removing one), so a bad --out fails now, in one line, not after generation.
        anc = out_dir.absolute().parent
        while not anc.exists() and anc != anc.parent:
            anc = anc.parent
        if not anc.is_dir():
            raise UserError(f"{out_dir}: cannot create the output directory ({anc} is not a directory)")
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".areal-probe-", dir=anc))
        except OSError as e:
            raise UserError(f"{out_dir}: cannot create the output directory in {anc} ({e.strerror})") from None
    elif not os.access(out_dir, os.W_OK):
        raise UserError(f"{out_dir}: output directory is not writable")


def check_code_tests(problems_by_ds: dict[str, list[Problem]]) -> None:
    """Every code problem needs decodable tests (graded without them it would be a silent fail).

    Raises:
        UserError: ``file:line: problem 'id' (benchmark): no decodable tests``.
    """
    for ds, problems in problems_by_ds.items():
        for p in problems:
            if problem_kind(p) != "code":
                continue
            tests = problem_tests(p)
            if not isinstance(tests, dict) or not tests.get("inputs"):
                raise UserError(f"{where(p.path, p.line)}: problem '{p.id}' ({ds}): no decodable tests")


def _split_names(names: Sequence[str] | str) -> list[str]:
    """``"aime24,my-task.yaml"`` (or a list) -> the entries, blanks and repeats dropped, order kept.

    Raises:
        UserError: no entry at all.
    """
    parts = names.split(",") if isinstance(names, str) else list(names)
    out = list(dict.fromkeys(str(p).strip() for p in parts if str(p).strip()))
    if not out:
        parse_dataset_names(out)  # the message listing the known datasets
    return out


def selected_names(names: Sequence[str] | str, data_dir: str | Path | None) -> list[str]:
    """The result names of a ``--data`` selection: a benchmark's own name, a task's name (its YAML's ``name`` or
    the file's stem), without loading any record.

    Raises:
        UserError: an unknown name, a task file that is missing or malformed.
    """
    from areal_cli.eval.custom_task import find_task_file, load_task

    specs = load_benchmark_specs()
    out = []
    for entry in _split_names(names):
        path = find_task_file(entry, data_dir, list(specs))
        out.append(entry if path is None else load_task(path).name)
    return out


def load_selected(names: Sequence[str] | str, data_dir: str | Path | None, *, revision: str | None = None,
                  date_from: Any = None, date_to: Any = None
                  ) -> tuple[dict[str, list[Problem]], dict[str, dict[str, Any]]]:
    """The selected benchmarks' problems, all validated (records, code tests), and per benchmark the
    loader's report of what was read (source, revision, files with sha256, date window, counts).

    An entry may also be a custom task (:mod:`areal_cli.eval.custom_task`): a task YAML or a records file by path,
    or a name with ``data_dir/<name>.yaml``; its problems and report are keyed by the task's name.

    Raises:
        UserError: as :func:`areal_cli.eval.datasets.load_benchmark_with_report`,
            :func:`areal_cli.eval.custom_task.load_task_with_report` and :func:`check_code_tests`; two entries
            with the same result name; a task named like a built-in benchmark.
    """
    from areal_cli.eval.custom_task import find_task_file, load_task_with_report

    specs = load_benchmark_specs()
    problems_by_ds: dict[str, list[Problem]] = {}
    reports: dict[str, dict[str, Any]] = {}
    entries = {entry: find_task_file(entry, data_dir, list(specs)) for entry in _split_names(names)}
    for entry, path in entries.items():  # every name known before anything is read
        if path is None:
            problems_by_ds[entry], reports[entry] = load_benchmark_with_report(
                entry, data_dir=data_dir, revision=revision if specs[entry].hub is not None else None,
                date_from=date_from, date_to=date_to, specs=specs)
            continue
        task, problems, report = load_task_with_report(path)
        if task.name in specs:
            raise UserError(f"{path}: task name '{task.name}' is a built-in benchmark's; rename the file or set "
                            f"'name:' in a task YAML")
        if task.name in problems_by_ds:
            raise UserError(f"{path}: task name '{task.name}' is given twice in the selection; set 'name:' in a "
                            f"task YAML to tell them apart")
        problems_by_ds[task.name], reports[task.name] = problems, report
    check_code_tests(problems_by_ds)
    return problems_by_ds, reports


def selected_specs(reports: dict[str, dict[str, Any]]) -> dict[str, BenchmarkSpec]:
    """The declared benchmarks plus the selected custom tasks (from their load reports), for protocol choice and
    the protocol-fits check."""
    from areal_cli.eval.custom_task import spec_from_report

    specs = load_benchmark_specs()
    for name, report in reports.items():
        if report.get("loader") == "task":
            specs[name] = spec_from_report(report)
    return specs


def sandbox_in_force(problems_by_ds: dict[str, list[Problem]], isolation: str | None) -> dict | None:
    """For a run with code problems: apply ``isolation`` (``auto``/``strict``; None = the environment's
    ``AREAL_SANDBOX_ISOLATION``), probe the sandbox once, and print one warning line on stderr when its
    level is below full. Returns the state recorded in results.json (``config.sandbox``), None without code.

    Raises:
        UserError: the sandbox refuses (``strict`` without every layer; root without a reachable interpreter;
            a malformed ``AREAL_SANDBOX_*`` variable), one line, before anything is written.
    """
    if "code" not in graders_kinds(problems_by_ds):
        return None
    from areal_cli.sandbox import SandboxError
    from areal_cli.sandbox.status import isolation_in_force, reduced_warning

    try:
        state = isolation_in_force(isolation)
    except (SandboxError, ValueError) as exc:
        raise UserError(f"code sandbox: {exc}") from None
    warning = reduced_warning(state)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return state

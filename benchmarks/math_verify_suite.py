"""Our math grader on Math-Verify's own test suite, next to raw math-verify.

Math-Verify (huggingface/Math-Verify, Apache-2.0) tests its ``parse`` + ``verify`` with (gold, prediction,
expected) cases written as pytest parametrizations that call a helper (``compare_strings`` in
``tests/test_all.py``: ``parse`` both strings with ``LatexExtractionConfig(boxed_match_priority=0)`` and/or
``ExprExtractionConfig()``, then ``verify(gold, pred, float_rounding=precision, strict=strict,
allow_set_relation_comp=...)``) or ``verify(parse(gold), parse(pred))`` directly. This script reads those
cases from a local copy of that repository's ``tests/`` folder (kept outside this repository; nothing of it is
copied here) with :mod:`ast` -- no pytest, no import of the test files -- and grades every case three ways:

- ``math-verify``: raw math-verify (the installed version) exactly as the case's test does it, with the
  case's own configuration (match types, precision, strict, allow_set_relation_comp);
- ``grade``: our :func:`areal_cli.reward.math_grader.grade` with the prediction as the completion and, as the
  gold answer, the gold text's final answer as our extractor reads it (:func:`extract_answer`; the gold
  text itself when it has none). One fixed configuration for every case: ours has no per-case settings;
- ``is_equivalent``: our :func:`is_equivalent` on both sides' final answers, each side as the gold above
  (the text itself when our extractor finds no answer): the comparison alone, extraction aside.

A case "agrees" when the verdict equals the test's expected value. Cases whose expected value depends on
a non-default setting of the test (precision other than 6, ``strict=False``, ``allow_set_relation_comp``
with a relation on the gold side, expression-only extraction) are listed as ``config`` cases in the JSON.

Prints a table (rich) and writes ``benchmarks/results/math_verify_suite.json`` (figures in total and per
test file, plus every case where a grader disagrees with the expected value, named by file, test and index
only: the suite's texts stay out of this repository; ``--show`` prints them).

Get the suite (outside this repository)::

    git clone https://github.com/huggingface/Math-Verify /tmp/Math-Verify   # or any copy of its tests/
    .venv/bin/python benchmarks/math_verify_suite.py --tests-dir /tmp/Math-Verify/tests

Exit status 2 with one line on stderr when the folder has no test cases.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import math
import platform
import signal
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from areal_cli.foundations.atomic import write_json_atomic
from areal_cli.reward.math_grader import extract_answer, grade, is_equivalent

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "math_verify_suite.json"
CASE_TIMEOUT_S = 10.0


@dataclass
class Case:
    """One (gold, prediction, expected) case of the suite and the way its test compares them."""

    file: str
    test: str
    index: int
    gold: str
    pred: str
    expected: bool
    mode: str  # "compare_strings" | "verify_parse"
    match_types: list[str] = field(default_factory=lambda: ["latex", "expr"])
    precision: int = 6
    strict: bool = True
    allow_set_relation_comp: bool = False

    @property
    def config_dependent(self) -> bool:
        """The expected value depends on a non-default setting of the test (see module docstring)."""
        return (self.precision != 6 or not self.strict or self.match_types == ["expr"]
                or (self.allow_set_relation_comp or (self.test == "test_set_rel_assymetry" and not self.expected)))


# ---------------------------------------------------------------------------------- reading the suite
def _value(node: ast.AST) -> Any:
    """A literal of a test file: ``ast.literal_eval``; an f-string such as ``f"{math.sqrt(17):.15f}"`` is
    evaluated with only :mod:`math` in scope (no builtins)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        code = compile(ast.Expression(node), "<case>", "eval")
        return eval(code, {"__builtins__": {}, "math": math})  # a literal of a local test file


def _helper_calls(fn: ast.FunctionDef) -> list[ast.Call]:
    """Calls of ``compare_strings(...)`` / ``verify(...)`` in a test function's body."""
    calls = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("compare_strings", "verify"):
            calls.append(node)
    return calls


def _settings(call: ast.Call, params: dict[str, Any]) -> dict[str, Any]:
    """The helper call's keyword settings for one case: constants, or the case's own parameter values."""
    out: dict[str, Any] = {}
    for kw in call.keywords:
        if kw.arg is None:
            continue
        if isinstance(kw.value, ast.Name) and kw.value.id in params:
            out[kw.arg] = params[kw.value.id]
        else:
            out[kw.arg] = _value(kw.value)
    return out


def _case(file: str, test: str, index: int, call: ast.Call, params: dict[str, Any], expected: Any) -> Case:
    if call.func.id == "compare_strings":  # type: ignore[attr-defined]
        s = _settings(call, params)
        return Case(file, test, index, str(params["gold"]), str(params["pred"]), bool(int(expected)),
                    "compare_strings", list(s.get("match_types", ["latex", "expr"])), int(s.get("precision", 6)),
                    bool(s.get("strict", True)), bool(s.get("allow_set_relation_comp", False)))
    return Case(file, test, index, str(params["gold"]), str(params["pred"]), bool(int(expected)), "verify_parse")


def read_cases(tests_dir: Path) -> list[Case]:
    """Every (gold, prediction, expected) case of the suite's ``test_*.py`` files, in file order.

    Two shapes are read: ``@pytest.mark.parametrize("gold,pred,expected[,...]", [...])`` on a test
    function that calls ``compare_strings`` or ``verify(parse(gold), parse(pred))``; and
    ``assert compare_strings("gold", "pred", ...) == 1`` written inline. Parametrizations without both
    ``gold`` and ``pred`` (extraction-only tests) are not comparison cases and are skipped.
    """
    cases: list[Case] = []
    for path in sorted(tests_dir.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for fn in tree.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            calls = _helper_calls(fn)
            parametrized = False
            for dec in fn.decorator_list:
                if not (isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize"):
                    continue
                names = [s.strip() for s in _value(dec.args[0]).split(",")]
                if "gold" not in names or "pred" not in names or not calls:
                    continue
                parametrized = True
                exp_name = "expected" if "expected" in names else "result"
                for i, row in enumerate(dec.args[1].elts):  # type: ignore[attr-defined]
                    params = dict(zip(names, (_value(e) for e in row.elts)))
                    cases.append(_case(path.name, fn.name, i, calls[0], params, params[exp_name]))
            if parametrized:
                continue
            i = 0
            for node in ast.walk(fn):  # inline: compare_strings("g", "p", ...) == N
                if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Call)
                        and isinstance(node.left.func, ast.Name) and node.left.func.id == "compare_strings"
                        and len(node.left.args) >= 2 and isinstance(node.comparators[0], ast.Constant)):
                    params = {"gold": _value(node.left.args[0]), "pred": _value(node.left.args[1])}
                    cases.append(_case(path.name, fn.name, i, node.left, params, node.comparators[0].value))
                    i += 1
    return cases


# ---------------------------------------------------------------------------------- graders
class _Timeout(BaseException):
    pass


def _limited(fn: Any, *args: Any, **kwargs: Any) -> bool | None:
    """``bool(fn(...))`` under a SIGALRM limit of CASE_TIMEOUT_S; None on a timeout."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT_S)
    try:
        return bool(fn(*args, **kwargs))
    except _Timeout:
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def raw_math_verify(case: Case) -> bool:
    """The case's own comparison with raw math-verify (as its test does it)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    if case.mode == "verify_parse":
        return bool(verify(parse(case.gold), parse(case.pred)))
    targets = []
    for t in case.match_types:
        if t == "latex":
            targets.append(LatexExtractionConfig(boxed_match_priority=0))
        elif t == "expr":
            targets.append(ExprExtractionConfig())
    return bool(verify(parse(case.gold, targets), parse(case.pred, targets), float_rounding=case.precision,
                       strict=case.strict, allow_set_relation_comp=case.allow_set_relation_comp))


def answer_of(text: str) -> str:
    """A side's final answer as our extractor reads it; the text itself when it finds none."""
    extracted = extract_answer(text)
    return extracted if extracted is not None else text


def ours_grade(case: Case) -> bool:
    """Our ``grade(prediction, gold's final answer)``."""
    return bool(grade(case.pred, answer_of(case.gold))[1])


def ours_is_equivalent(case: Case) -> bool:
    """Our ``is_equivalent(gold's final answer, prediction's final answer)``, each side's text itself when
    our extractor finds no answer in it: the comparison alone, extraction aside."""
    return bool(is_equivalent(answer_of(case.gold), answer_of(case.pred)))


GRADERS = {"math-verify": raw_math_verify, "grade": ours_grade, "is_equivalent": ours_is_equivalent}


def _safe(fn: Any, case: Case) -> tuple[bool | None, str]:
    try:
        return _limited(fn, case), ""
    except Exception as e:  # a grader error is a disagreement, reported
        return None, f"{type(e).__name__}: {e}"[:200]


# ---------------------------------------------------------------------------------- report
def run(cases: list[Case]) -> dict[str, Any]:
    """Grade every case with every grader; figures in total and per file."""
    rows = []
    seconds = {g: 0.0 for g in GRADERS}
    for c in cases:
        row: dict[str, Any] = {"case": c}
        for name, fn in GRADERS.items():
            t0 = time.perf_counter()
            verdict, error = _safe(fn, c)
            seconds[name] += time.perf_counter() - t0
            row[name] = verdict
            if error:
                row[f"{name}_error"] = error
        rows.append(row)

    def figures(sel: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"cases": len(sel)}
        for name in GRADERS:
            agree = sum(r[name] is r["case"].expected for r in sel)
            out[name] = {"agree": agree, "rate": round(agree / len(sel), 4) if sel else None}
        return out

    files = sorted({c.file for c in cases})
    disagreements = []
    for r in rows:
        c = r["case"]
        wrong = [n for n in GRADERS if r[n] is not c.expected]
        if wrong:
            disagreements.append({
                "file": c.file, "test": c.test, "index": c.index, "config_dependent": c.config_dependent,
                "expected": c.expected, **{n: r[n] for n in GRADERS},
                **{k: v for k, v in r.items() if k.endswith("_error")},
            })
    both_wrong = sum(1 for r in rows if r["math-verify"] is not r["case"].expected and r["grade"] is not r["case"].expected)
    return {
        "total": figures(rows),
        "per_file": {f: figures([r for r in rows if r["case"].file == f]) for f in files},
        "config_dependent_cases": sum(c.config_dependent for c in cases),
        "total_without_config_dependent": figures([r for r in rows if not r["case"].config_dependent]),
        "grade_wrong_where_math_verify_right": sum(
            1 for r in rows if r["math-verify"] is r["case"].expected and r["grade"] is not r["case"].expected),
        "grade_right_where_math_verify_wrong": sum(
            1 for r in rows if r["math-verify"] is not r["case"].expected and r["grade"] is r["case"].expected),
        "both_wrong": both_wrong,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "disagreements": disagreements,
    }


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Agreement with Math-Verify's own expected verdicts")
    table.add_column("test file")
    table.add_column("cases", justify="right")
    for name in GRADERS:
        table.add_column(name, justify="right")

    def add(label: str, f: dict[str, Any]) -> None:
        table.add_row(label, str(f["cases"]),
                      *(f"{f[n]['agree']} ({f[n]['rate']:.3f})" if f["cases"] else "-" for n in GRADERS))

    for name, f in result["per_file"].items():
        add(name, f)
    add("total", result["total"])
    add(f"total without {result['config_dependent_cases']} config cases", result["total_without_config_dependent"])
    console = Console()
    console.print(table)
    console.print(f"grade wrong where math-verify right: {result['grade_wrong_where_math_verify_right']}; "
                  f"grade right where math-verify wrong: {result['grade_right_where_math_verify_wrong']}; "
                  f"seconds: {result['seconds']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests-dir", type=Path, required=True, help="a copy of Math-Verify's tests/ folder")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON result file (default {DEFAULT_OUT})")
    ap.add_argument("--show", action="store_true", help="print the gold and prediction of every disagreement")
    args = ap.parse_args(argv)
    if not args.tests_dir.is_dir():
        print(f"error: --tests-dir {args.tests_dir}: not a folder", file=sys.stderr)
        return 2
    try:
        cases = read_cases(args.tests_dir)
    except (SyntaxError, ValueError, KeyError, AttributeError, UnicodeDecodeError) as e:
        print(f"error: --tests-dir {args.tests_dir}: cannot read the test cases: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if not cases:
        print(f"error: --tests-dir {args.tests_dir}: no (gold, pred, expected) cases in test_*.py", file=sys.stderr)
        return 2
    result = run(cases)
    print_table(result)
    if args.show:
        by_key = {(c.file, c.test, c.index): c for c in cases}
        for d in result["disagreements"]:
            c = by_key[(d["file"], d["test"], d["index"])]
            print(f"{c.file}::{c.test}[{c.index}] expected {int(c.expected)} "
                  f"{ {n: d[n] for n in GRADERS} }\n  gold: {c.gold[:200]!r}\n  pred: {c.pred[-200:]!r}")
    payload = {
        "benchmark": "math_verify_suite",
        "tests_dir": str(args.tests_dir),
        # which copy of the suite was measured (its files' sha256, first 16 hex digits)
        "suite_files": {c.file: hashlib.sha256((args.tests_dir / c.file).read_bytes()).hexdigest()[:16]
                        for c in cases},
        "math_verify": version("math-verify"),
        "python": platform.python_version(),
        **result,
    }
    write_json_atomic(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

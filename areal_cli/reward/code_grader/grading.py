"""Grading one completion of a code problem: extract its program, run it on the tests in the sandbox, and
judge each run by the exit policy and the comparison (package docstring, "Exit policy")."""

from __future__ import annotations

import re
from typing import Any

from areal_cli.reward.code_grader.compare import compare_return, compare_stdout, truncate
from areal_cli.reward.code_grader.suite import TestSuite
from areal_cli.reward.code_grader.tolerance import Tolerance
from areal_cli.sandbox import Limits, RunResult, run_tests
from areal_cli.sandbox.limits import GiB

CODE_BLOCK_RE = re.compile(r"(?i)```(?:python|py|cpp|CPP)?\s*\n?(.*?)\n?```", re.DOTALL)
MIN_CODE_CHARS = 20

Status = str  # "passed" | "wrong_answer" | "runtime_error" | "timeout" | "compile_error" | "output_limit"
#               | "no_code" | "no_tests"


def extract_code(completion: str) -> str | None:
    """The last fenced code block of ``completion`` with >= 20 characters (AReaL ``extract_python_code``).

    Only the text after the last ``</think>`` is searched when the completion has one.

    Returns:
        the block's text, stripped; None when there is none.
    """
    if not isinstance(completion, str):
        return None
    text = completion.rsplit("</think>", 1)[-1]
    blocks = [b.strip() for b in CODE_BLOCK_RE.findall(text)]
    blocks = [b for b in blocks if len(b) >= MIN_CODE_CHARS]
    return blocks[-1] if blocks else None


def program_exit_status(result: RunResult) -> int | None:
    """The status the program itself ended with, as ``python main.py`` would exit: the ``SystemExit``
    status when the sandbox reports it (``RunResult.exit_code``; a message counts as 1, as in CPython),
    else the process's exit status (None when a signal ended it)."""
    return result.exit_code if result.exit_code is not None else result.returncode


def judge_run(result: RunResult, expected: str, *, call_based: bool, float_tol: float | None = None,
              tolerance: Tolerance | None = None) -> tuple[Status, str]:
    """Verdict of one test run: ("passed", "") or (failure status, one-line reason).

    Exit policy (one rule for both modes; package docstring): the run passes only if the program ended
    normally -- stdin mode: ran to its end, or ``SystemExit`` with status 0, or exit status 0 without a
    report (``os._exit(0)``); call-based: the function returned and the process ended with status 0 --
    and its output is right. A right output followed by a non-zero exit is a ``runtime_error`` (LiveCodeBench
    grades such a stdin program on its output; we follow real judges, which report a runtime error).

    Args:
        result: the sandbox's record of the run.
        expected: the expected stdout, or (call-based) the JSON of the expected return value.
        call_based: LeetCode-style test (compare the returned value).
        float_tol: legacy opt-in stdin tolerance (:func:`compare_stdout`).
        tolerance: the statement's declared tolerance, or None (exact, as LiveCodeBench).
    Returns:
        ("passed", "") or (``"wrong_answer"`` | ``"runtime_error"`` | ``"timeout"`` | ``"output_limit"``, reason).
    """
    if result.timed_out:
        return "timeout", f"exceeded the time limit ({result.wall_s:.2f} s wall, {result.cpu_s:.2f} s CPU)"
    if call_based:
        if result.outcome == "returned" and result.value_json is not None:
            if result.killed_by or result.returncode != 0:
                how = f"was killed by {result.killed_by}" if result.killed_by else f"exited with status {result.returncode}"
                return "runtime_error", f"returned a value, then the process {how}"
            ok, reason = compare_return(result.value_json, expected, tolerance=tolerance)
            return ("passed", "") if ok else ("wrong_answer", reason)
        reasons = {
            "exit_before_call": "the program exited before the function was called",
            "exit_during_call": "the program exited during the call instead of returning",
            "missing_function": f"function not found: {result.error}",
            "unserializable": f"returned value is not JSON-serialisable: {result.error}",
            "raised": f"raised {result.error}",
        }
        if result.outcome in reasons:
            return "runtime_error", reasons[result.outcome]
        return "runtime_error", _ended_without_report(result)
    if result.stdout_truncated:
        return "output_limit", "output exceeded the file-size limit"
    if result.outcome == "raised":
        return "runtime_error", f"raised {result.error}" if result.error else "raised"
    if result.killed_by or result.returncode != 0:
        return "runtime_error", _ended_without_report(result)
    status = program_exit_status(result)
    if result.outcome == "system_exit" and status != 0:
        return "runtime_error", f"exited with status {status} (sys.exit); only status 0 is a normal end"
    ok, reason = compare_stdout(result.stdout, expected, float_tol=float_tol, tolerance=tolerance)
    return ("passed", "") if ok else ("wrong_answer", reason)


def _ended_without_report(result: RunResult) -> str:
    if result.killed_by:
        return f"killed by {result.killed_by}"
    if result.outcome is not None:
        return f"ended with exit status {result.returncode}"
    return f"ended with exit status {result.returncode} before reporting a result"


def grade_code(
    completion: str,
    tests: dict,
    *,
    per_test_timeout_s: float = 6.0,
    total_timeout_s: float = 60.0,
    memory_bytes: int = 2 * GiB,
    float_tol: float | None = None,
    use_problem_limits: bool = False,
    isolation: str = "auto",
) -> tuple[str | None, bool, dict]:
    """Grade one completion of a code problem (a RewardPool function: plain arguments, picklable result).

    Args:
        completion: the model's text.
        tests: ``TestSuite.to_dict()``; its ``tolerance`` (declared by the statement, :func:`parse_tolerance`)
            widens the comparison in both modes (package docstring); absent/None: exact, as LiveCodeBench.
        per_test_timeout_s: wall-clock limit per test (AReaL/LCB: 6 s).
        total_timeout_s: cap on all tests of this sample together.
        memory_bytes: address-space limit of the program.
        float_tol: optional tolerance for non-integer numbers in stdin mode (None: LCB's exact Decimal);
            not LCB and not a judge's rule: prefer a declared ``tests["tolerance"]``, which is applied as well.
        use_problem_limits: use ``tests["time_limit_s"]``/``["memory_bytes"]`` when given.
        isolation: sandbox isolation (``"auto"``, ``"strict"``, ``"none"``; see areal_cli.sandbox).
    Returns:
        (extracted code or None, passed, detail). ``detail``: ``status`` ("passed", "wrong_answer",
        "runtime_error", "timeout", "compile_error", "output_limit", "no_code", "no_tests"), ``n_tests``,
        ``n_passed`` (tests passed before grading stopped), ``first_failure`` (``{"test", "status",
        "reason", "stderr"}`` or None), ``mode`` ("stdin" | "call"), ``wall_s``, ``cpu_s``, ``isolation``
        (short summary), ``tolerance`` (the declared tolerance applied, ``Tolerance.to_dict()``, or None).
        ``"no_tests"`` (and ``error``) when the tests cannot be decoded or are empty: never a pass.
    Raises:
        areal_cli.sandbox.SandboxError: the sandbox could not run at all (not a verdict on the program).
    """
    detail: dict[str, Any] = {"status": "no_tests", "n_tests": 0, "n_passed": 0, "first_failure": None}
    try:
        suite = TestSuite.from_dict(tests)
        args = suite.call_arguments() if suite.fn_name is not None else None
    except ValueError as exc:
        return extract_code(completion), False, {**detail, "error": str(exc)}
    n = len(suite.inputs)
    detail.update(n_tests=n, mode="stdin" if suite.fn_name is None else "call",
                  tolerance=None if suite.tolerance is None else suite.tolerance.to_dict())
    if n == 0:
        return extract_code(completion), False, {**detail, "error": "the problem has no tests"}
    code = extract_code(completion)
    if code is None:
        return None, False, {**detail, "status": "no_code"}
    wall = per_test_timeout_s
    memory = memory_bytes
    if use_problem_limits:
        wall = suite.time_limit_s or wall
        memory = suite.memory_bytes or memory
    limits = Limits(wall_s=float(wall), memory_bytes=int(memory))
    verdicts: list[tuple[Status, str]] = []

    def on_result(i: int, result: RunResult) -> bool:
        verdict = judge_run(result, suite.outputs[i], call_based=args is not None, float_tol=float_tol,
                            tolerance=suite.tolerance)
        verdicts.append(verdict)
        if verdict[0] != "passed":
            detail["first_failure"] = {
                "test": i,
                "status": verdict[0],
                "reason": verdict[1],
                "stderr": truncate(result.stderr.strip(), 600),
            }
            return False
        return True

    run = run_tests(
        code,
        args if args is not None else suite.inputs,
        fn_name=suite.fn_name,
        limits=limits,
        total_timeout_s=total_timeout_s,
        isolation=isolation,  # type: ignore[arg-type]
        on_result=on_result,
    )
    n_passed = sum(1 for v in verdicts if v[0] == "passed")
    iso = run.isolation
    detail.update(
        n_passed=n_passed,
        wall_s=round(run.wall_s, 4),
        cpu_s=round(sum(r.cpu_s for r in run.results), 4),
        isolation=iso.get("level", "reduced"),
    )
    if run.compile_error is not None:
        detail["status"] = "compile_error"
        detail["first_failure"] = {"test": 0, "status": "compile_error", "reason": truncate(run.compile_error), "stderr": ""}
        return code, False, detail
    if detail["first_failure"] is not None:
        detail["status"] = detail["first_failure"]["status"]
        return code, False, detail
    if n_passed == n:
        detail["status"] = "passed"
        return code, True, detail
    # Not every test reported: the total cap ran out, or the harness was killed.
    status, reason = (
        ("timeout", f"total time limit of {total_timeout_s} s reached")
        if run.total_timed_out
        else ("runtime_error", "the sandbox ended before running every test")
    )
    detail["status"] = status
    detail["first_failure"] = {"test": len(verdicts), "status": status, "reason": reason, "stderr": ""}
    return code, False, detail

"""Code grader: extract the program from a completion, run it against a problem's tests in the sandbox.

Protocol (AReaL ``evaluation/code_eval.py`` + ``code_verifier/testing_util.py``, which are LiveCodeBench's
``lcb_runner/evaluation/testing_util.py``):

- extraction: the LAST fenced block matching AReaL's pattern ``(?i)```(?:python|py|cpp|CPP)?\\s*\\n?(.*?)\\n?```
  `` whose stripped text has at least 20 characters (:func:`extract_code`); only the text after the last
  ``</think>`` is searched when there is one (code inside the reasoning is not the answer).
- tests: stdin/stdout mode when ``fn_name`` is None, else call-based (LeetCode style: the method of
  ``Solution()`` when the source says ``class Solution``, else the module-level function); each call-based
  input is one JSON value per line (the positional arguments), each output one JSON value.
- each test is run with a per-test wall-clock timeout (6 s, ``SINGLE_CASE_EXEC_TIMEOUT``), a memory cap
  (2 GiB address space) and a total cap per sample (60 s); tests run in order and grading stops at the
  first failure; a sample passes only if every test ran and passed.
- comparison as LiveCodeBench: stdin mode compares the outputs line by line after ``strip()`` (same
  number of lines), each line equal as text or, failing that, as a list of ``Decimal`` numbers (numeric
  equality: ``1.0`` == ``1`` == ``1.00``; LCB uses ``Decimal`` rather than ``np.isclose`` so that
  ``50000000000000000`` != ``50000000000000001``). ``float_tol`` adds a judge-style tolerance
  (|a - b| <= tol * max(1, |b|) for tokens where either side is not an integer); off by default, for parity.
  Call-based mode compares the returned value, JSON-encoded in the sandbox and decoded here (tuples become
  lists, as LCB converts), with the JSON-decoded expected output by ``==``. The value crosses the sandbox
  boundary as JSON text, so an object with a rigged ``__eq__`` cannot fake a pass.

Where this differs from LiveCodeBench, and why:

- each test is a fresh process running the program as ``__main__`` with the test input on fd 0 (LCB wraps
  the program in a function and patches ``sys.stdin`` in one process): the program sees a real stdin
  (``sys.stdin.buffer``, ``open(0)``, ``os.read(0, ...)`` all work) and no state leaks between tests.
  As in LCB, ``SystemExit`` (any code) ends the program normally and its output is compared; an uncaught
  exception is a runtime error. A process that exits 0 without the harness's report (``os._exit(0)``)
  in stdin mode is judged on its output, as a real judge would.
- in call-based mode, ``sys.exit``/``os._exit`` at import or during the call is a failure (LCB's process
  would die and lose the results): the harness must report the returned value for the test to count.
- dict keys: the JSON round trip turns int keys into strings (LCB would compare the int-keyed dict to the
  string-keyed expected value and fail); nested tuples become lists (LCB converts only the top level).
- the problem's own time and memory limits (``TestSuite.time_limit_s``/``memory_bytes``) are recorded but
  used only with ``use_problem_limits=True``: AReaL's evaluation applies 6 s per test to every problem.

Private tests of LiveCodeBench releases after v1 are ``base64(zlib(pickle(json_string)))``
(``lcb_runner/benchmarks/code_generation.py``); :func:`decode_lcb_tests` decodes them with an unpickler
that refuses every class, so a crafted blob cannot run code in the grader.
"""

from __future__ import annotations

import base64
import io
import json
import math
import pickle
import re
import zlib

from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from areal_cli.sandbox import Limits, RunResult, run_tests
from areal_cli.sandbox.limits import GiB

#: Largest decompressed LCB private-test payload accepted (the biggest real ones are tens of MiB).
MAX_PRIVATE_TESTS_BYTES = 512 << 20

CODE_BLOCK_RE = re.compile(r"(?i)```(?:python|py|cpp|CPP)?\s*\n?(.*?)\n?```", re.DOTALL)
MIN_CODE_CHARS = 20
_TRUNC = 300

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


@dataclass(frozen=True)
class TestSuite:
    """A problem's tests, as LiveCodeBench's ``input_output`` (JSON-able, picklable via :meth:`to_dict`).

    Attributes:
        inputs: stdin text per test (stdin mode) or, call-based, one JSON value per line (the arguments).
        outputs: expected stdout per test, or (call-based) the JSON of the expected return value.
        fn_name: None for stdin/stdout programs; else the function/method name (LCB ``metadata.func_name``).
        time_limit_s: the problem's own time limit per test, if the data set gives one.
        memory_bytes: the problem's own memory limit, if the data set gives one.
    """

    __test__ = False  # not a pytest test class

    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    fn_name: str | None = None
    time_limit_s: float | None = None
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.inputs, list) or not isinstance(self.outputs, list):
            raise ValueError("tests: 'inputs' and 'outputs' must be lists")
        if len(self.inputs) != len(self.outputs):
            raise ValueError(f"tests: {len(self.inputs)} inputs but {len(self.outputs)} outputs")
        if not all(isinstance(x, str) for x in self.inputs + self.outputs):
            raise ValueError("tests: every input and output must be a string")
        if self.fn_name is not None and (not isinstance(self.fn_name, str) or not self.fn_name.isidentifier()):
            raise ValueError(f"tests: fn_name must be a Python identifier or None, got {self.fn_name!r}")
        if self.time_limit_s is not None and not (
            isinstance(self.time_limit_s, (int, float)) and self.time_limit_s > 0 and math.isfinite(self.time_limit_s)
        ):
            raise ValueError(f"tests: time_limit_s must be a positive number, got {self.time_limit_s!r}")
        if self.memory_bytes is not None and not (isinstance(self.memory_bytes, int) and self.memory_bytes > 0):
            raise ValueError(f"tests: memory_bytes must be a positive int, got {self.memory_bytes!r}")

    def to_dict(self) -> dict:
        """JSON-able form (what :func:`grade_code` takes and ``Problem.tests`` holds)."""
        return {
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "fn_name": self.fn_name,
            "time_limit_s": self.time_limit_s,
            "memory_bytes": self.memory_bytes,
        }

    @classmethod
    def from_dict(cls, d: Any) -> "TestSuite":
        """Inverse of :meth:`to_dict`; ``fn_name`` "" is read as None (AReaL's convention).

        Raises:
            ValueError: not a dict, unknown keys, or invalid fields.
        """
        if not isinstance(d, dict):
            raise ValueError(f"tests must be a dict, got {type(d).__name__}")
        unknown = set(d) - {"inputs", "outputs", "fn_name", "time_limit_s", "memory_bytes"}
        if unknown:
            raise ValueError(f"tests: unknown keys {sorted(unknown)}")
        return cls(
            inputs=d.get("inputs", []),
            outputs=d.get("outputs", []),
            fn_name=d.get("fn_name") or None,
            time_limit_s=d.get("time_limit_s"),
            memory_bytes=d.get("memory_bytes"),
        )

    def call_arguments(self) -> list[list]:
        """Call-based inputs decoded as LCB does: ``[json.loads(line) for line in input.split("\\n")]``.

        Raises:
            ValueError: an input line or an expected output is not JSON (names the test).
        """
        args = []
        for i, text in enumerate(self.inputs):
            try:
                args.append([json.loads(line) for line in text.split("\n")])
            except ValueError as exc:
                raise ValueError(f"tests: call-based input {i} is not one JSON value per line: {exc}") from None
        for i, text in enumerate(self.outputs):
            try:
                json.loads(text)
            except ValueError as exc:
                raise ValueError(f"tests: call-based output {i} is not JSON: {exc}") from None
        return args


class _NoClassUnpickler(pickle.Unpickler):
    """Unpickler for data-only pickles: refuses every global (so no code can run while loading)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from test data")


def _decode_private(blob: str) -> list:
    """LCB private tests: plain JSON (early releases) or base64(zlib(pickle(json string)))."""
    if not blob or not blob.strip():
        return []
    try:
        value = json.loads(blob)
        if isinstance(value, list):
            return value
    except ValueError:
        pass
    try:
        d = zlib.decompressobj()
        raw = d.decompress(base64.b64decode(blob.encode("ascii"), validate=False), MAX_PRIVATE_TESTS_BYTES + 1)
        if len(raw) > MAX_PRIVATE_TESTS_BYTES or d.unconsumed_tail:
            raise ValueError(f"decompressed size exceeds {MAX_PRIVATE_TESTS_BYTES >> 20} MiB (zlib bomb?)")
        inner = _NoClassUnpickler(io.BytesIO(raw)).load()
    except (ValueError, zlib.error, pickle.UnpicklingError, EOFError, UnicodeEncodeError, TypeError) as exc:
        raise ValueError(f"private tests: not JSON and not base64/zlib/pickle ({type(exc).__name__}: {exc})") from None
    if isinstance(inner, bytes):
        inner = inner.decode("utf-8")
    try:
        value = json.loads(inner) if isinstance(inner, str) else inner
    except ValueError as exc:
        raise ValueError(f"private tests: decoded blob is not JSON ({exc})") from None
    if not isinstance(value, list):
        raise ValueError(f"private tests: expected a list of tests, got {type(value).__name__}")
    return value


def decode_lcb_tests(public_json: str, private_blob: str, metadata_json: str) -> TestSuite:
    """LiveCodeBench's ``public_test_cases`` + ``private_test_cases`` + ``metadata`` -> :class:`TestSuite`.

    Public tests first, then private (as ``CodeGenerationProblem.get_evaluation_sample``); each test is
    ``{"input", "output", "testtype": "stdin"|"functional"}``; ``metadata.func_name`` names the function.

    Raises:
        ValueError: undecodable JSON/blob, malformed tests, mixed test types, a functional test without
            ``func_name``, call-based inputs that are not JSON, or no tests at all (the reason is in the message).
    """
    try:
        public = json.loads(public_json) if public_json and public_json.strip() else []
    except ValueError as exc:
        raise ValueError(f"public tests: not JSON ({exc})") from None
    if not isinstance(public, list):
        raise ValueError(f"public tests: expected a list, got {type(public).__name__}")
    private = _decode_private(private_blob)
    try:
        metadata = json.loads(metadata_json) if metadata_json and metadata_json.strip() else {}
    except ValueError as exc:
        raise ValueError(f"metadata: not JSON ({exc})") from None
    if not isinstance(metadata, dict):
        raise ValueError(f"metadata: expected an object, got {type(metadata).__name__}")
    inputs, outputs, types_seen = [], [], set()
    for where, tests in (("public", public), ("private", private)):
        for i, t in enumerate(tests):
            if not isinstance(t, dict) or not isinstance(t.get("input"), str) or not isinstance(t.get("output"), str):
                raise ValueError(f"{where} test {i}: expected {{input: str, output: str, testtype}}")
            types_seen.add(t.get("testtype", "stdin"))
            inputs.append(t["input"])
            outputs.append(t["output"])
    if not inputs:
        raise ValueError("no tests: public and private test cases are empty")
    if not types_seen <= {"stdin", "functional"} or len(types_seen) > 1:
        raise ValueError(f"tests: expected one testtype (stdin or functional), got {sorted(map(str, types_seen))}")
    fn_name = metadata.get("func_name") or None
    if types_seen == {"functional"} and not fn_name:
        raise ValueError("functional tests need metadata.func_name")
    suite = TestSuite(inputs=inputs, outputs=outputs, fn_name=fn_name if types_seen == {"functional"} else None)
    if suite.fn_name is not None:
        suite.call_arguments()  # validate now: a bad problem is an error at load time, not a failed sample
    return suite


# ------------------------------------------------------------------------------------------ compare
def _stripped_lines(text: str) -> list[str]:
    """LCB ``get_stripped_lines``: strip the whole text, split on newlines, strip each line."""
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(tok) for tok in line.split()]
    except (InvalidOperation, ValueError):
        return None


def _is_integer_token(tok: str) -> bool:
    return re.fullmatch(r"[+-]?\d+", tok) is not None


def _close(got: list[Decimal], want: list[Decimal], got_line: str, want_line: str, tol: float) -> bool:
    toks_got, toks_want = got_line.split(), want_line.split()
    for a, b, ta, tb in zip(got, want, toks_got, toks_want):
        if a == b:
            continue
        if _is_integer_token(ta) and _is_integer_token(tb):
            return False
        if not (a.is_finite() and b.is_finite()):
            return False
        if abs(float(a) - float(b)) > tol * max(1.0, abs(float(b))):
            return False
    return True


def compare_stdout(got: str, expected: str, *, float_tol: float | None = None) -> tuple[bool, str]:
    """LiveCodeBench's stdin-mode comparison (``grade_stdio``), optionally with a float tolerance.

    Returns:
        (equal, reason): reason is "" when equal, else e.g. ``"line 2: '3' != '4'"`` or
        ``"3 lines, expected 2"``.
    """
    got_lines, want_lines = _stripped_lines(got), _stripped_lines(expected)
    if len(got_lines) != len(want_lines):
        return False, f"{len(got_lines)} lines, expected {len(want_lines)}"
    for idx, (g, w) in enumerate(zip(got_lines, want_lines)):
        if g == w:
            continue
        dg, dw = _decimals(g), _decimals(w)
        if dg is not None and dw is not None and len(dg) == len(dw):
            if dg == dw:
                continue
            if float_tol is not None and _close(dg, dw, g, w, float_tol):
                continue
        return False, f"line {idx + 1}: {_trunc(g)!r} != {_trunc(w)!r}"
    return True, ""


def compare_return(value_json: str, expected_json: str) -> tuple[bool, str]:
    """LiveCodeBench's call-based comparison: decoded return value == decoded expected output.

    Returns:
        (equal, reason).
    """
    try:
        value = json.loads(value_json)
    except ValueError:
        return False, "returned value is not JSON"
    expected = json.loads(expected_json)
    if value == expected:
        return True, ""
    return False, f"returned {_trunc(value_json)} != expected {_trunc(expected_json)}"


def _trunc(s: Any, n: int = _TRUNC) -> str:
    s = s if isinstance(s, str) else str(s)
    return s if len(s) <= n else s[: n // 2] + "...(truncated)..." + s[-n // 2 :]


# -------------------------------------------------------------------------------------------- grade
def judge_run(result: RunResult, expected: str, *, call_based: bool, float_tol: float | None = None) -> tuple[Status, str]:
    """Verdict of one test run: ("passed", "") or (failure status, one-line reason)."""
    if result.timed_out:
        return "timeout", f"exceeded the time limit ({result.wall_s:.2f} s wall, {result.cpu_s:.2f} s CPU)"
    if call_based:
        if result.outcome == "returned" and result.value_json is not None:
            ok, reason = compare_return(result.value_json, expected)
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
    if result.outcome not in ("completed", "system_exit") and result.returncode != 0:
        return "runtime_error", _ended_without_report(result)
    ok, reason = compare_stdout(result.stdout, expected, float_tol=float_tol)
    return ("passed", "") if ok else ("wrong_answer", reason)


def _ended_without_report(result: RunResult) -> str:
    if result.killed_by:
        return f"killed by {result.killed_by}"
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
        tests: ``TestSuite.to_dict()``.
        per_test_timeout_s: wall-clock limit per test (AReaL/LCB: 6 s).
        total_timeout_s: cap on all tests of this sample together.
        memory_bytes: address-space limit of the program.
        float_tol: optional tolerance for non-integer numbers in stdin mode (None: LCB's exact Decimal).
        use_problem_limits: use ``tests["time_limit_s"]``/``["memory_bytes"]`` when given.
        isolation: sandbox isolation (``"auto"``, ``"namespaces"``, ``"none"``; see areal_cli.sandbox).
    Returns:
        (extracted code or None, passed, detail). ``detail``: ``status`` ("passed", "wrong_answer",
        "runtime_error", "timeout", "compile_error", "output_limit", "no_code", "no_tests"), ``n_tests``,
        ``n_passed`` (tests passed before grading stopped), ``first_failure`` (``{"test", "status",
        "reason", "stderr"}`` or None), ``mode`` ("stdin" | "call"), ``wall_s``, ``cpu_s``, ``isolation``
        (short summary). ``"no_tests"`` (and ``error``) when the tests cannot be decoded or are empty:
        never a pass.
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
    detail.update(n_tests=n, mode="stdin" if suite.fn_name is None else "call")
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
        verdict = judge_run(result, suite.outputs[i], call_based=args is not None, float_tol=float_tol)
        verdicts.append(verdict)
        if verdict[0] != "passed":
            detail["first_failure"] = {
                "test": i,
                "status": verdict[0],
                "reason": verdict[1],
                "stderr": _trunc(result.stderr.strip(), 600),
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
        isolation=",".join(k for k in ("pid_ns", "net_ns", "fs_root") if iso.get(k)) + f";user={iso.get('user', '?')}",
    )
    if run.compile_error is not None:
        detail["status"] = "compile_error"
        detail["first_failure"] = {"test": 0, "status": "compile_error", "reason": _trunc(run.compile_error), "stderr": ""}
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

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
- comparison without a declared tolerance: exactly LiveCodeBench (``lcb_runner/evaluation/testing_util.py``,
  ``grade_stdio`` and ``grade_call_based``). Stdin mode compares the outputs line by line after ``strip()``
  (same number of lines), each line equal as text or, failing that, as a list of ``Decimal`` numbers (numeric
  equality: ``1.0`` == ``1`` == ``1.00``; LCB uses ``Decimal`` rather than ``np.isclose`` so that
  ``50000000000000000`` != ``50000000000000001``). ``float_tol`` adds a judge-style tolerance
  (|a - b| <= tol * max(1, |b|) for tokens where either side is not an integer); off by default, for parity.
  Call-based mode compares the returned value, JSON-encoded in the sandbox and decoded here (tuples become
  lists, as LCB converts), with the JSON-decoded expected output by ``==``. The value crosses the sandbox
  boundary as JSON text, so an object with a rigged ``__eq__`` cannot fake a pass.
- comparison with a tolerance declared in the statement ("absolute or relative error does not exceed
  10^{-6}", :func:`parse_tolerance`; carried in the tests as ``TestSuite.tolerance``): what LCB accepts is
  still accepted; beyond that, numbers are compared as testlib's checkers do (:func:`numbers_close`:
  ``doubleCompare`` of ``testlib.h`` for "absolute or relative", ``acmp.cpp`` for "absolute"). Stdin mode:
  whitespace-separated tokens of the whole output (as testlib reads them; line breaks do not matter), the
  same number of them, numeric tokens (integers included, as testlib reads every number as a double) within
  the tolerance, other tokens equal as text. Call-based mode: the returned value element by element through
  lists and dicts, numbers within the tolerance, ``bool`` never a number (``True`` is not ``1.0000001``).
  LiveCodeBench itself ignores declared tolerances (exact ``Decimal`` equality, ``==``), so on problems
  that declare one our verdicts can only be more lenient than LCB's, never stricter.

Exit policy (one rule for both modes): a run passes only if the program ended normally and its output is
right. Stdin mode: the program ran to its end, or raised ``SystemExit`` with status 0 (``sys.exit()``,
``sys.exit(0)``, ``exit()``), or ended with exit status 0 without the harness's report (``os._exit(0)``: judged on
its output, as a real judge would); ``sys.exit(1)`` (any non-zero status, or a message) after a right
output is a ``runtime_error``, as on Codeforces/AtCoder. This differs from LiveCodeBench, whose stdin
runner (``call_method``) swallows ``SystemExit`` of any status and grades the output. Call-based mode: the
program's output is its return value, so the function must return (and the process end with status 0);
``sys.exit``/``os._exit`` of any status at import or during the call is a ``runtime_error``. Here LCB
agrees: its call-based runner catches only ``Exception``, so ``SystemExit`` ends the worker process and
``check_correctness`` counts every test as failed.

Where this differs from LiveCodeBench otherwise, and why:

- each test is a fresh process running the program as ``__main__`` with the test input on fd 0 (LCB wraps
  the program in a function and patches ``sys.stdin`` in one process): the program sees a real stdin
  (``sys.stdin.buffer``, ``open(0)``, ``os.read(0, ...)`` all work) and no state leaks between tests.
  An uncaught exception is a runtime error.
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


# ---------------------------------------------------------------------------------------- tolerance
#: testlib adds 1e-15 to every tolerance (``doubleCompare``; ``acmp.cpp``: ``fabs(ja - pa) > EPS + 1E-15``).
TESTLIB_SLACK = 1e-15
TOLERANCE_KINDS = ("abs", "rel", "abs_or_rel")


@dataclass(frozen=True)
class Tolerance:
    """A numeric tolerance declared by a problem statement (see :func:`parse_tolerance`).

    Attributes:
        kind: ``"abs"`` (|a - b| <= abs_tol), ``"rel"`` (|a - b| <= rel_tol * |b|) or ``"abs_or_rel"``
            (either holds: testlib's ``doubleCompare``), where b is the expected (jury's) value.
        abs_tol: the absolute tolerance (kinds ``abs`` and ``abs_or_rel``), else None.
        rel_tol: the relative tolerance (kinds ``rel`` and ``abs_or_rel``), else None.
    """

    kind: str
    abs_tol: float | None = None
    rel_tol: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in TOLERANCE_KINDS:
            raise ValueError(f"tolerance: kind must be one of {', '.join(TOLERANCE_KINDS)}, got {self.kind!r}")
        for name, needed in (("abs_tol", self.kind in ("abs", "abs_or_rel")),
                             ("rel_tol", self.kind in ("rel", "abs_or_rel"))):
            value = getattr(self, name)
            if not needed:
                if value is not None:
                    raise ValueError(f"tolerance: {name} must be null for kind {self.kind!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < 1):
                raise ValueError(f"tolerance: {name} must be a number in (0, 1) for kind {self.kind!r}, got {value!r}")

    def to_dict(self) -> dict:
        """JSON-able form (``{"kind", "abs_tol", "rel_tol"}``), as ``TestSuite.to_dict()["tolerance"]``."""
        return {"kind": self.kind, "abs_tol": self.abs_tol, "rel_tol": self.rel_tol}

    @classmethod
    def from_dict(cls, d: Any) -> "Tolerance":
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: not a dict, unknown keys, or invalid fields.
        """
        if not isinstance(d, dict):
            raise ValueError(f"tolerance must be a dict, got {type(d).__name__}")
        unknown = set(d) - {"kind", "abs_tol", "rel_tol"}
        if unknown:
            raise ValueError(f"tolerance: unknown keys {sorted(unknown)}")
        return cls(kind=d.get("kind"), abs_tol=d.get("abs_tol"), rel_tol=d.get("rel_tol"))  # type: ignore[arg-type]

    def describe(self) -> str:
        """E.g. ``"absolute or relative error 1e-06"`` (for failure reasons)."""
        words = {"abs": "absolute", "rel": "relative", "abs_or_rel": "absolute or relative"}[self.kind]
        return f"{words} error {self.abs_tol if self.abs_tol is not None else self.rel_tol:g}"


_MINUS_SIGNS = dict.fromkeys(map(ord, "\u2212\u2010\u2011\u2012\u2013\u2014\ufe63\uff0d"), "-")
# A tolerance value: [m *] 10^{-k} (braces, parentheses or none), m e-k, or a decimal 0.000...
_TOL_NUMBER = (r"(?<![\d.])(?:(?:(?P<mant>\d+(?:\.\d+)?)\s*\*\s*)?10\s*\^\s*[{(]?\s*(?P<exp>-\s*\d+)\s*[})]?"
               r"|(?P<sci>\d+(?:\.\d+)?\s*[eE]\s*-\s*\d+)"
               r"|(?P<dec>0\.\d+))")
_TOL_NUMBER_RE = re.compile(_TOL_NUMBER)
# "absolute or relative error", "relative or absolute error", "absolute error or relative error", "absolute
# error", "relative error" (also "precision", plural). Not "absolute difference": statements ask for those.
_TOL_KIND_RE = re.compile(
    r"\b(?:(?P<both>absolute\s+(?:error\s+)?or\s+(?:the\s+)?relative|relative\s+(?:error\s+)?or\s+(?:the\s+)?absolute)"
    r"|(?P<abs>absolute)|(?P<rel>relative))\s+(?:errors?|precision)\b",
    re.IGNORECASE,
)
# LeetCode: "Answers within 10^-5 of the actual answer will be accepted." (also "10-5", a lost superscript)
_TOL_WITHIN_RE = re.compile(
    r"\bwithin\s+(?:(?P<num>" + _TOL_NUMBER.replace("?P<", "?P<w") + r")|10\s*-\s*(?P<lost>\d+))\s+of\s+the\s+"
    r"(?:actual|correct|true|exact|expected|right|real|judge'?s?)\s+(?:answer|value|result|output)",
    re.IGNORECASE,
)
#: How far after "absolute or relative error" the tolerance value may be (characters, same sentence).
_TOL_WINDOW = 160


def _normalize_statement(text: str) -> str:
    """Statement text with TeX/HTML number markup flattened: ``$10^{-6}$``, ``\\(10^{-6}\\)``, ``$$$10^{-6}$$$``,
    ``10^{−6}`` (unicode minus), ``2 \\cdot 10^{-6}``, ``10<sup>-6</sup>``, ``\\le`` -> plain text."""
    t = text.translate(_MINUS_SIGNS)
    t = re.sub(r"<\s*sup\s*>(.*?)<\s*/\s*sup\s*>", r"^{\1}", t, flags=re.IGNORECASE)
    t = re.sub(r"\\[()\[\]]", " ", t)
    t = re.sub(r"\\(?:cdot|times)\b|[·×]", "*", t)
    t = re.sub(r"\\(?:leqslant|leq|le)\b|≤", " <= ", t)
    t = re.sub(r"\\(?:mathrm|text|textrm|rm)\s*\{([^{}]*)\}", r"\1", t)
    t = t.replace("$", " ").replace("`", " ")
    return re.sub(r"[ \t\r\f\v]+", " ", t)


def _tol_value(m: re.Match, prefix: str = "") -> float | None:
    """The value of a :data:`_TOL_NUMBER` match (group names may carry ``prefix``)."""
    g = {k[len(prefix):]: v for k, v in m.groupdict().items() if k.startswith(prefix) and v is not None}
    try:
        if "exp" in g:
            value = float(g.get("mant", "1")) * 10.0 ** int(g["exp"].replace(" ", ""))
        elif "sci" in g:
            value = float(g["sci"].replace(" ", ""))
        elif "dec" in g:
            value = float(g["dec"])
        else:
            return None
    except (ValueError, OverflowError):
        return None
    return value if 0 < value < 1 else None


def parse_tolerance(statement: str | None) -> Tolerance | None:
    """The numeric tolerance a problem statement declares, or None (then grading is exact, as LiveCodeBench).

    Recognised (case-insensitive; the value within the same sentence, after the phrase):

    - Codeforces/AtCoder: "absolute or relative error does not exceed 10^{-6}" / "is at most 10^{-9}" / "of at
      most 1e-6" / "doesn't exceed $$$10^{-6}$$$" -> ``abs_or_rel`` (also "relative or absolute",
      "absolute error or relative error");
    - "absolute error at most 1e-4" -> ``abs``; "relative error ... 10^{-6}" -> ``rel``;
    - LeetCode: "Answers within 10^-5 of the actual answer will be accepted" -> ``abs`` (LeetCode's judge
      compares |a - b| to the bound); "10-5", a superscript lost in scraping, is read as 10^-5 there only.

    Values: ``10^{-6}``, ``10^-6``, ``10^(-6)``, ``10^{−6}`` (unicode minus), ``2 \\cdot 10^{-6}``, ``1e-6``,
    ``1E-06``, ``0.000001``, inside ``$...$``, ``$$$...$$$``, ``\\(...\\)`` or ``<sup>``; a value must lie in
    (0, 1). The first declaration in the text wins.

    Args:
        statement: the problem statement (any text; None or "" -> None).
    Returns:
        a :class:`Tolerance`, or None when the statement declares none.
    """
    if not statement or not isinstance(statement, str):
        return None
    text = _normalize_statement(statement)
    found: list[tuple[int, Tolerance]] = []
    for m in _TOL_KIND_RE.finditer(text):
        window = text[m.end(): m.end() + _TOL_WINDOW]
        window = re.split(r"\n\s*\n|\.\s+(?=[A-Z])", window, maxsplit=1)[0]  # this sentence only
        for n in _TOL_NUMBER_RE.finditer(window):
            value = _tol_value(n)
            if value is None:
                continue
            kind = "abs_or_rel" if m.group("both") else ("abs" if m.group("abs") else "rel")
            found.append((m.start(), Tolerance(kind=kind, abs_tol=value if kind != "rel" else None,
                                               rel_tol=value if kind != "abs" else None)))
            break
        if found:
            break
    for m in _TOL_WITHIN_RE.finditer(text):
        value = 10.0 ** -int(m.group("lost")) if m.group("lost") else _tol_value(m, prefix="w")
        if value is not None and 0 < value < 1:
            found.append((m.start(), Tolerance(kind="abs", abs_tol=value)))
            break
    return min(found, key=lambda f: f[0])[1] if found else None


def _testlib_infinite(x: float) -> bool:
    """testlib's ``__testlib_isInfinite``: beyond +-1e300."""
    return x > 1e300 or x < -1e300


def numbers_close(got: float, expected: float, tol: Tolerance) -> bool:
    """Whether ``got`` is within ``tol`` of ``expected``, as testlib's checkers decide.

    ``abs_or_rel`` is testlib's ``doubleCompare(expected, result, eps)`` (``testlib.h``, MikeMirzayanov/testlib
    0.9.45, used by ``checkers/rcmp6.cpp``/``rcmp9.cpp``/``dcmp.cpp``): NaN only equals NaN, +-infinity (beyond
    1e300) only the same infinity, else accept when |result - expected| <= eps + 1e-15, or result lies
    between expected * (1 - eps') and expected * (1 + eps') with eps' = eps + 1e-15 -- that is
    |a - b| <= eps * max(1, |b|) up to the 1e-15 slack, relative to the expected value b. ``abs`` is
    ``checkers/acmp.cpp`` (|a - b| <= eps + 1e-15); ``rel`` is the relative half of ``doubleCompare`` alone.

    Args:
        got: the program's number.
        expected: the expected (jury's) number.
        tol: the tolerance.
    Returns:
        True when accepted.
    """
    if math.isnan(expected):
        return math.isnan(got)
    if _testlib_infinite(expected):
        return _testlib_infinite(got) and (got > 0) == (expected > 0)
    if math.isnan(got) or _testlib_infinite(got):
        return False
    if tol.abs_tol is not None and abs(got - expected) <= tol.abs_tol + TESTLIB_SLACK:
        return True
    if tol.rel_tol is not None:
        eps = tol.rel_tol + TESTLIB_SLACK
        lo, hi = sorted((expected * (1.0 - eps), expected * (1.0 + eps)))
        return lo <= got <= hi
    return False


_REAL_TOKEN_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _real(token: str) -> float | None:
    """A whitespace-free token read as a real number (decimal or scientific notation), else None."""
    if not _REAL_TOKEN_RE.fullmatch(token):
        return None
    return float(token)  # overflow gives +-inf, as a C strtod would


def values_close(got: Any, expected: Any, tol: Tolerance) -> bool:
    """Call-based comparison under a declared tolerance: JSON-decoded values, recursively.

    Numbers (``int``/``float``, never ``bool``) by :func:`numbers_close`; lists element by element (same
    length); dicts key by key (same keys); everything else (strings, None, bools) by ``==``, as
    LiveCodeBench's ``prediction == gt_out``.

    Args:
        got: the decoded returned value.
        expected: the decoded expected output.
        tol: the tolerance.
    Returns:
        True when accepted.
    """
    if isinstance(got, bool) or isinstance(expected, bool):
        return got == expected
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        if got == expected:
            return True
        try:
            return numbers_close(float(got), float(expected), tol)
        except OverflowError:  # an int beyond float range: exact equality only
            return False
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(values_close(a, b, tol) for a, b in zip(got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_close(got[k], expected[k], tol) for k in got)
    return got == expected


@dataclass(frozen=True)
class TestSuite:
    """A problem's tests, as LiveCodeBench's ``input_output`` (JSON-able, picklable via :meth:`to_dict`).

    Attributes:
        inputs: stdin text per test (stdin mode) or, call-based, one JSON value per line (the arguments).
        outputs: expected stdout per test, or (call-based) the JSON of the expected return value.
        fn_name: None for stdin/stdout programs; else the function/method name (LCB ``metadata.func_name``).
        time_limit_s: the problem's own time limit per test, if the data set gives one.
        memory_bytes: the problem's own memory limit, if the data set gives one.
        tolerance: the numeric tolerance the statement declares (:func:`parse_tolerance`), or None (exact, as
            LiveCodeBench). Carried with the tests, as a judge's checker is part of a problem's test data: the
            loader that has the statement fills it (``areal_cli.eval.code_datasets``), and every caller of
            :func:`grade_code` (eval, regrade, the reward pool) applies it without needing the statement.
    """

    __test__ = False  # not a pytest test class

    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    fn_name: str | None = None
    time_limit_s: float | None = None
    memory_bytes: int | None = None
    tolerance: Tolerance | None = None

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
        if self.tolerance is not None and not isinstance(self.tolerance, Tolerance):
            raise ValueError(f"tests: tolerance must be a Tolerance or None, got {type(self.tolerance).__name__}")

    def to_dict(self) -> dict:
        """JSON-able form (what :func:`grade_code` takes and ``Problem.tests`` holds)."""
        return {
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "fn_name": self.fn_name,
            "time_limit_s": self.time_limit_s,
            "memory_bytes": self.memory_bytes,
            "tolerance": None if self.tolerance is None else self.tolerance.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Any) -> "TestSuite":
        """Inverse of :meth:`to_dict`; ``fn_name`` "" is read as None (AReaL's convention); ``tolerance``
        may be absent (None).

        Raises:
            ValueError: not a dict, unknown keys, or invalid fields.
        """
        if not isinstance(d, dict):
            raise ValueError(f"tests must be a dict, got {type(d).__name__}")
        unknown = set(d) - {"inputs", "outputs", "fn_name", "time_limit_s", "memory_bytes", "tolerance"}
        if unknown:
            raise ValueError(f"tests: unknown keys {sorted(unknown)}")
        tol = d.get("tolerance")
        return cls(
            inputs=d.get("inputs", []),
            outputs=d.get("outputs", []),
            fn_name=d.get("fn_name") or None,
            time_limit_s=d.get("time_limit_s"),
            memory_bytes=d.get("memory_bytes"),
            tolerance=None if tol is None else Tolerance.from_dict(tol),
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


def decode_lcb_tests(public_json: str, private_blob: str, metadata_json: str, *,
                     statement: str | None = None) -> TestSuite:
    """LiveCodeBench's ``public_test_cases`` + ``private_test_cases`` + ``metadata`` -> :class:`TestSuite`.

    Public tests first, then private (as ``CodeGenerationProblem.get_evaluation_sample``); each test is
    ``{"input", "output", "testtype": "stdin"|"functional"}``; ``metadata.func_name`` names the function.
    ``statement`` (``question_content``), when given, is searched for a declared tolerance
    (:func:`parse_tolerance`, kept in ``TestSuite.tolerance``).

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
    suite = TestSuite(inputs=inputs, outputs=outputs, fn_name=fn_name if types_seen == {"functional"} else None,
                      tolerance=parse_tolerance(statement))
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


def compare_stdout(got: str, expected: str, *, float_tol: float | None = None,
                   tolerance: Tolerance | None = None) -> tuple[bool, str]:
    """Stdin-mode comparison: LiveCodeBench's (``grade_stdio``), widened by a declared tolerance.

    Without ``tolerance``: exactly LCB (``lcb_runner/evaluation/testing_util.py``): lines after ``strip()``,
    each equal as text or as a list of ``Decimal``; ``float_tol`` (opt-in, not LCB) also accepts non-integer
    tokens with |a - b| <= float_tol * max(1, |b|). With ``tolerance`` (declared by the statement): what the
    above accepts, else the whitespace-separated tokens of the whole outputs, as testlib's checkers read
    them: the same number of tokens, numbers within the tolerance (:func:`numbers_close`, integers
    included), other tokens equal as text.

    Args:
        got: the program's stdout.
        expected: the expected output.
        float_tol: optional legacy tolerance for non-integer tokens (None: LCB's exact ``Decimal``).
        tolerance: the statement's tolerance (:func:`parse_tolerance`), or None.
    Returns:
        (equal, reason): reason is "" when equal, else e.g. ``"line 2: '3' != '4'"``, ``"3 lines, expected
        2"``, or with a tolerance ``"token 2: '0.3' differs from '0.3333' by more than absolute or relative
        error 1e-06"``.
    """
    ok, reason = _compare_lines(got, expected, float_tol)
    if ok or tolerance is None:
        return ok, reason
    return _compare_tokens(got, expected, tolerance)


def _compare_tokens(got: str, expected: str, tol: Tolerance) -> tuple[bool, str]:
    got_toks, want_toks = got.split(), expected.split()
    if len(got_toks) != len(want_toks):
        return False, f"{len(got_toks)} tokens, expected {len(want_toks)}"
    for idx, (g, w) in enumerate(zip(got_toks, want_toks)):
        if g == w:
            continue
        a, b = _real(g), _real(w)
        if a is None or b is None:
            return False, f"token {idx + 1}: {_trunc(g)!r} != {_trunc(w)!r}"
        if not numbers_close(a, b, tol):
            return False, f"token {idx + 1}: {_trunc(g)!r} differs from {_trunc(w)!r} by more than {tol.describe()}"
    return True, ""


def _compare_lines(got: str, expected: str, float_tol: float | None) -> tuple[bool, str]:
    """LCB ``grade_stdio``'s comparison (plus the opt-in ``float_tol``)."""
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


def compare_return(value_json: str, expected_json: str, *, tolerance: Tolerance | None = None) -> tuple[bool, str]:
    """Call-based comparison: LiveCodeBench's ``prediction == gt_out`` (``grade_call_based``) on the decoded
    values, widened by a declared tolerance.

    Args:
        value_json: the returned value as JSON (encoded in the sandbox).
        expected_json: the expected output (JSON).
        tolerance: the statement's tolerance, or None (then ``==`` only, as LCB). With one, a value that is
            not ``==`` is accepted when :func:`values_close` (numbers within the tolerance element by element,
            bools never numbers).
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
    if tolerance is not None:
        if values_close(value, expected, tolerance):
            return True, ""
        return False, (f"returned {_trunc(value_json)} != expected {_trunc(expected_json)} "
                       f"(beyond {tolerance.describe()})")
    return False, f"returned {_trunc(value_json)} != expected {_trunc(expected_json)}"


def _trunc(s: Any, n: int = _TRUNC) -> str:
    s = s if isinstance(s, str) else str(s)
    return s if len(s) <= n else s[: n // 2] + "...(truncated)..." + s[-n // 2 :]


# -------------------------------------------------------------------------------------------- grade
def program_exit_status(result: RunResult) -> int | None:
    """The status the program itself ended with, as ``python main.py`` would exit: the ``SystemExit``
    status when the sandbox reports it (``RunResult.exit_code``; a message counts as 1, as in CPython),
    else the process's exit status (None when a signal ended it)."""
    return result.exit_code if result.exit_code is not None else result.returncode


def judge_run(result: RunResult, expected: str, *, call_based: bool, float_tol: float | None = None,
              tolerance: Tolerance | None = None) -> tuple[Status, str]:
    """Verdict of one test run: ("passed", "") or (failure status, one-line reason).

    Exit policy (one rule for both modes; module docstring): the run passes only if the program ended
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
            widens the comparison in both modes (module docstring); absent/None: exact, as LiveCodeBench.
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
        isolation=iso.get("level", "reduced"),
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

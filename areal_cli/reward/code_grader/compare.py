"""Comparing a program's output with the expected one: LiveCodeBench's stdin and call-based comparisons,
widened by a declared tolerance as testlib's checkers read tokens (package docstring)."""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from areal_cli.reward.code_grader.tolerance import Tolerance, numbers_close, values_close

_TRUNC = 300

_REAL_TOKEN_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _real(token: str) -> float | None:
    """A whitespace-free token read as a real number (decimal or scientific notation), else None."""
    if not _REAL_TOKEN_RE.fullmatch(token):
        return None
    return float(token)  # overflow gives +-inf, as a C strtod would


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
            return False, f"token {idx + 1}: {truncate(g)!r} != {truncate(w)!r}"
        if not numbers_close(a, b, tol):
            return False, f"token {idx + 1}: {truncate(g)!r} differs from {truncate(w)!r} by more than {tol.describe()}"
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
        return False, f"line {idx + 1}: {truncate(g)!r} != {truncate(w)!r}"
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
        return False, (f"returned {truncate(value_json)} != expected {truncate(expected_json)} "
                       f"(beyond {tolerance.describe()})")
    return False, f"returned {truncate(value_json)} != expected {truncate(expected_json)}"


def truncate(s: Any, n: int = _TRUNC) -> str:
    s = s if isinstance(s, str) else str(s)
    return s if len(s) <= n else s[: n // 2] + "...(truncated)..." + s[-n // 2 :]

"""math-verify behind our rules: its parse memoised per process, its "equal" checked with exact rational
arithmetic (it rounds numbers to 6 places), and interval / inequality notation compared as sets
(package docstring, "Equivalence" 4). Its own signal timeouts are disabled (package docstring, "Timeouts")."""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any

import math_verify.grader as _mv_grader
import math_verify.parser as _mv_parser
import sympy
from math_verify import parse as _mv_parse
from math_verify import verify as _mv_verify

# We disable math-verify's own timeouts on purpose (see package docstring); silence the one-time
# warning it logs about that in every worker process.
_mv_parser.TIMEOUT_WARNING_SHOWN = True
_mv_grader.TIMEOUT_WARNING_SHOWN = True


@functools.lru_cache(maxsize=8192)
def _parsed(answer: str) -> tuple:
    """math-verify's parse of one bare answer (memoised per process; sympy objects are immutable)."""
    return tuple(_mv_parse("\\boxed{" + answer + "}", parsing_timeout=None))


class _NotExact(Exception):
    pass


_EXACT_MAX_BITS = 400_000  # about 120,000 digits: 2006! has 5,700
_EXACT_MAX_FACTORIAL = 20_000


def _exact(expr: Any) -> Fraction:
    if isinstance(expr, sympy.Integer):
        return Fraction(int(expr))
    if isinstance(expr, sympy.Rational):
        return Fraction(int(expr.p), int(expr.q))
    if isinstance(expr, sympy.Add):
        out = sum((_exact(a) for a in expr.args), Fraction(0))
    elif isinstance(expr, sympy.Mul):
        out = Fraction(1)
        for a in expr.args:
            out *= _exact(a)
    elif isinstance(expr, sympy.Pow):
        base, exp = _exact(expr.base), _exact(expr.exp)
        if exp.denominator != 1 or (base == 0 and exp < 0):
            raise _NotExact
        bits = max(base.numerator.bit_length(), base.denominator.bit_length())
        if bits * abs(exp.numerator) > _EXACT_MAX_BITS:
            raise _NotExact
        out = base ** exp.numerator
    elif isinstance(expr, sympy.factorial):
        n = _exact(expr.args[0])
        if n.denominator != 1 or not 0 <= n <= _EXACT_MAX_FACTORIAL:
            raise _NotExact
        out = Fraction(math.factorial(int(n)))
    elif isinstance(expr, sympy.binomial):
        n, k = (_exact(a) for a in expr.args)
        if n.denominator != 1 or k.denominator != 1 or not 0 <= n <= _EXACT_MAX_FACTORIAL:
            raise _NotExact
        out = Fraction(math.comb(int(n), int(k)) if k >= 0 else 0)
    else:
        raise _NotExact
    if max(out.numerator.bit_length(), out.denominator.bit_length()) > _EXACT_MAX_BITS:
        raise _NotExact
    return out


def exact_value(expr: Any) -> Fraction | None:
    """The exact rational value of a parsed answer built from integers, fractions, sums, products,
    integer powers, factorials and binomials (sizes bounded), else None (floats, roots, symbols, sets).

    Why: math-verify compares numbers by floating point rounded to 6 places, so 1/2004! equalled 1/2006!
    (math-verify issue #14; also the commented-out cases of its ``test_yujianll.py``) and 1/2^99 equalled
    1/2^98. When both sides have an exact value, :func:`grade` compares those instead."""
    try:
        return _exact(expr)
    except (_NotExact, OverflowError, ValueError, ZeroDivisionError, TypeError):
        return None


def relation_as_set(expr: Any) -> Any:
    """The set of real numbers an answer describes, when it is an interval, a union, ``x \\in S``, or an
    inequality in one variable (``3 < x \\le 4`` -> ``(3, 4]``; "x < 2 or x > 5", which math-verify parses
    as a set of two relations, -> the union); else None. Used to compare inequality and interval notation
    in either direction (math-verify compares them one way only unless told to)."""
    try:
        if isinstance(expr, (sympy.Interval, sympy.Union)):
            return expr
        if isinstance(expr, sympy.Eq) and isinstance(expr.rhs, sympy.Set) and isinstance(expr.lhs, sympy.Symbol):
            return expr.rhs
        if isinstance(expr, (sympy.core.relational.Relational, sympy.And, sympy.Or)):
            if len(expr.free_symbols) == 1 and not isinstance(expr, (sympy.Eq, sympy.Ne)):
                return expr.as_set()
            return None
        if isinstance(expr, sympy.FiniteSet) and expr.args and all(
            isinstance(a, (sympy.core.relational.Relational, sympy.And)) and not isinstance(a, (sympy.Eq, sympy.Ne))
            for a in expr.args
        ):
            symbols = set().union(*(a.free_symbols for a in expr.args))
            if len(symbols) == 1:
                return sympy.Union(*(a.as_set() for a in expr.args))
    except (NotImplementedError, TypeError, ValueError, AttributeError, RecursionError):
        return None  # sympy cannot solve it: not comparable as a set
    return None


def _set_relation_equal(gold: Any, candidate: Any) -> bool:
    """Interval/union on one side, inequality on the other: equal when they describe the same set."""
    if not (isinstance(gold, sympy.Basic) and isinstance(candidate, sympy.Basic)):
        return False
    sets = (sympy.Interval, sympy.Union)
    if isinstance(gold, sets) == isinstance(candidate, sets):
        return False
    a, b = relation_as_set(gold), relation_as_set(candidate)
    return a is not None and b is not None and bool(a == b)


def math_verify_equal(gold: str, candidate: str, *, gold_must_parse: bool) -> bool:
    """math-verify's verdict on two bare, cleaned answers (set/relation comparison allowed); an "equal" between
    two exact rational values is checked exactly (:func:`exact_value`), and an interval against an inequality
    is compared as sets (:func:`relation_as_set`).

    Raises:
        ValueError: math-verify cannot parse ``gold`` and ``gold_must_parse`` is set.
    """
    gold_parsed = _parsed(gold)
    if not gold_parsed:
        if gold_must_parse:
            raise ValueError(f"gold answer {gold!r} could not be parsed by math-verify")
        return False
    cand_parsed = _parsed(candidate)
    if not cand_parsed:
        return False
    if _mv_verify(list(gold_parsed), list(cand_parsed), timeout_seconds=None, allow_set_relation_comp=True):
        g, c = exact_value(gold_parsed[0]), exact_value(cand_parsed[0])
        return g == c if g is not None and c is not None else True
    return _set_relation_equal(gold_parsed[0], cand_parsed[0])

"""False accepts refused: an answer that restates an expression of the problem (unfactored, unevaluated,
copied from the problem text) instead of answering it (package docstring, "Equivalence" 5)."""

from __future__ import annotations

import functools
import re

from areal_cli.reward.math_grader.normalize import normalize_answer_string
from areal_cli.reward.math_grader.spans import MASK, mask_spans, math_spans

_RELATION_SPLIT_RE = re.compile(r"=|<|>|\\(?:le|ge|leq|geq|neq|ne|approx|equiv|to|in)\b|,|;|:")
_PLAIN_SPLIT_RE = re.compile(r"\b[A-Za-z]{2,}\b|[,;:?!]|\.(?=\s|$)")
_OPERATOR_RE = re.compile(r"[+\-*/^!]|\\(?:frac|sqrt|binom|cdot|times|div|sum|prod|int|log|ln|sin|cos|tan|overline)|\)\(|\d\(")


_SIMPLE_SLASH_RE = re.compile(r"(?<![\w})])(\d+)/(\d+)(?![\w({])")


def _canon(expr: str) -> str:
    """A spelling-insensitive form of an expression for :func:`restates_problem`: the
    :func:`normalize_answer_string` form with ``x^{2}`` -> ``x^2``, ``a/b`` -> ``\\frac{a}{b}`` (as AReaL's
    ``_fix_a_slash_b``), ``\\cdot``/``\\times`` -> ``*``, ``\\dbinom`` -> ``\\binom``."""
    s = normalize_answer_string(expr).rstrip(".,;")
    s = re.sub(r"([\^_])\{(\w)\}", r"\1\2", s)
    s = _SIMPLE_SLASH_RE.sub(r"\\frac{\1}{\2}", s)
    return s.replace("\\cdot", "*").replace("\\times", "*").replace("\\dbinom", "\\binom").replace("\\tbinom", "\\binom")


@functools.lru_cache(maxsize=1024)
def _problem_expressions(problem: str) -> frozenset[str]:
    """The expressions written in a problem (:func:`_canon` forms, with an operator): each math span,
    its sides around relation signs and commas, and the runs of plain text between English words."""
    units: set[str] = set()
    spans = math_spans(problem)
    for s in spans:
        units.add(s.content)
        units.update(_RELATION_SPLIT_RE.split(s.content))
    plain = mask_spans(problem, spans).replace(MASK, " ")
    units.update(_PLAIN_SPLIT_RE.split(plain))
    out = set()
    for u in units:
        c = _canon(u) if u and u.strip() else ""
        if c and _OPERATOR_RE.search(c.lstrip("+-")):
            out.add(c)
    return frozenset(out)


def restates_problem(candidate: str, gold: str, problem: str | None) -> bool:
    """Whether ``candidate`` restates an expression of the problem instead of answering it: written (up to
    spacing and LaTeX spelling, :func:`_canon`) as an expression of the problem text that has an operator,
    and not as the gold answer is written. Examples: "Factor $x^2-5x+6$." answered ``x^2 - 5x + 6``;
    "Compute $\\frac{3}{4}+\\frac{5}{6}$." answered ``\\frac{3}{4}+\\frac{5}{6}``; "Simplify $\\sqrt{8}$."
    answered ``\\sqrt{8}``. Plain numbers are never restatements (no operator). Such answers have the
    gold's value, so math-verify accepts them; a careful grader does not."""
    if not problem:
        return False
    c = _canon(candidate)
    if not c or c == _canon(gold) or not _OPERATOR_RE.search(c.lstrip("+-")):
        return False
    return c in _problem_expressions(problem)

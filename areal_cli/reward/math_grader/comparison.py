"""Comparing two bare answers: the fast paths (equal canonical strings, exact arithmetic on plain numbers),
the decimal comma, the percent policy with the unit a problem asks for, then math-verify (package
docstring, "Normalisation" and "Equivalence" 2-4)."""

from __future__ import annotations

import functools
import re

from areal_cli.reward.math_grader.normalize import (
    clean_answer,
    decimal_comma_value,
    normalize_answer_string,
    plain_number,
    split_percent,
)
from areal_cli.reward.math_grader.verify import math_verify_equal


def _decimal_comma_equal(gold: str, candidate: str) -> bool | None:
    """True/False when one answer has a decimal comma and the other is a decimal number (with a point);
    None when the rule does not apply (a bare ``1,22`` against a list stays a list)."""
    for comma, other in ((gold, candidate), (candidate, gold)):
        value = decimal_comma_value(comma)
        if value is None:
            continue
        num = plain_number(other)
        if num is not None and not num[1]:
            return value == num[0]
    return None


def _equal_no_percent(gold: str, candidate: str, string_match: bool, gold_must_parse: bool) -> bool:
    if string_match and normalize_answer_string(gold) == normalize_answer_string(candidate):
        return True
    g, c = clean_answer(gold), clean_answer(candidate)
    comma = _decimal_comma_equal(g, c)
    if comma is not None:
        return comma
    if string_match:
        gn, cn = plain_number(g), plain_number(c)
        if gn is not None and cn is not None:
            if gn[0] == cn[0]:
                return True
            if gn[1] and cn[1]:
                return False
    return math_verify_equal(g, c, gold_must_parse=gold_must_parse)


# What the problem asks for, when it fixes the unit of the answer (percent policy).
_ASKS_PERCENT_RE = re.compile(
    r"(?i)\b(?:what|which|how\s+many)\s+percent(?:age)?\b|\b(?:as|in)\s+(?:a\s+)?percent(?:age)?s?\b"
    r"|\bnearest\s+(?:whole\s+|tenth\s+of\s+a\s+|hundredth\s+of\s+a\s+)?percent\b|\bby\s+what\s+percent"
)
_ASKS_FRACTION_RE = re.compile(
    r"(?i)\b(?:as|in)\s+(?:a\s+)?(?:common\s+|simplified\s+|reduced\s+|proper\s+|improper\s+)?"
    r"(?:fraction|decimal)s?\b|\bin\s+decimal\s+form\b|\bas\s+a\s+mixed\s+number\b"
)


@functools.lru_cache(maxsize=1024)
def unit_asked(problem: str | None) -> str | None:
    """``"percent"`` when the problem asks for a percent ("what percent", "as a percent", "to the nearest
    percent"), ``"fraction"`` when it asks for a decimal or a fraction ("as a common fraction", "as a
    decimal"), else None. A problem that fixes the unit makes the other reading of a percent wrong: 0.2
    for "what percent ..." (gold 20%) is refused, and so is 20% for "... as a decimal" (gold 0.2)."""
    if not problem:
        return None
    if _ASKS_PERCENT_RE.search(problem):
        return "percent"
    if _ASKS_FRACTION_RE.search(problem):
        return "fraction"
    return None


def equal_with_percent(gold: str, candidate: str, string_match: bool, gold_must_parse: bool,
                   problem: str | None) -> bool:
    """``candidate`` is the same answer as ``gold`` (both bare strings), with the percent policy."""
    gp, cp = split_percent(gold), split_percent(candidate)
    if gp is None and cp is None:
        return _equal_no_percent(gold, candidate, string_match, gold_must_parse)
    if gp is not None and cp is not None:
        return _equal_no_percent(gp, cp, string_match, gold_must_parse)
    asked = unit_asked(problem)
    # exactly one side has a percent sign: "p%" equals p and p/100, unless the problem fixes the unit
    if gp is not None:
        readings, other, other_is_gold = (gp, f"\\frac{{{gp}}}{{100}}"), candidate, False
        if asked == "percent":
            readings = readings[:1]
        elif asked == "fraction":
            readings = readings[1:]
    else:
        if asked == "fraction":
            return False
        readings, other, other_is_gold = (cp, f"\\frac{{{cp}}}{{100}}"), gold, True
        if asked == "percent":
            readings = readings[:1]
    for reading in readings:
        if other_is_gold:
            if _equal_no_percent(other, reading, string_match, gold_must_parse):
                return True
        elif _equal_no_percent(reading, other, string_match, gold_must_parse):
            return True
    return False

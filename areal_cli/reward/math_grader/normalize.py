"""Normalisation of gold and extracted answers: canonical strings, the forms math-verify 0.9.0 misreads
(degrees, units, currency, thousands separators), plain numbers, percent signs and decimal commas
(package docstring, "Normalisation")."""

from __future__ import annotations

import math
import re
from fractions import Fraction


def normalize_gold(gold: str | int | float) -> str:
    """Gold answer as a string: ints as digits, integral floats without ``.0`` (27.0 -> "27"),
    strings stripped of whitespace and surrounding ``$``. Zero padding is kept ("025"): it is
    compared numerically.

    Raises:
        TypeError: bool, None or other types.
        ValueError: empty string, NaN or infinite number.
    """
    if isinstance(gold, bool) or gold is None:
        raise TypeError(f"gold answer must be a string or number, got {type(gold).__name__}")
    if isinstance(gold, int):
        return str(gold)
    if isinstance(gold, float):
        if not math.isfinite(gold):
            raise ValueError(f"gold answer is not finite: {gold!r}")
        return str(int(gold)) if gold.is_integer() else repr(gold)
    if isinstance(gold, str):
        text = gold.strip()
        if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
            text = text.strip("$").strip()
        if not text:
            raise ValueError("gold answer is empty")
        return text
    raise TypeError(f"gold answer must be a string or number, got {type(gold).__name__}")


_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox|mathbf)\{([^{}]*)\}")
_SPACING_RE = re.compile(r"\\[,;:! ]|\\left|\\right|\s+")
_INT_RE = re.compile(r"[+-]?\d+")
_DEC_RE = re.compile(r"[+-]?\d+\.\d*")

_WS_RE = re.compile(r"\s+")
_DEGREE_RE = re.compile(r"\s*(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\degree|°|\\textdegree)")
_MONEY_WORD_RE = re.compile(r"(?<=[\d}])\s*(?:dollars?|cents?|USD)\.?$")
# a whole answer that is a number with thousands groups separated by , {,} ,\! \, \  ~ or a space
_THOUSANDS_RE = re.compile(
    r"(?P<sign>[+-]?)(?P<cur>\\\$\s*)?(?P<head>[1-9]\d{0,2})"
    r"(?P<groups>(?:(?:(?:,\\!|\{,\s*\}|\\,|\\ |~|\\;|\s)\s*|,)\d{3})+)(?P<tail>\.\d+)?"
)
_PERCENT_TAIL_RE = re.compile(
    r"(?:\\%|%|\\text\{\s*\\?%\s*\}|\\text\{\s*(?:percent(?:age)?|pct)\s*\}|\bpercent(?:age)?|\bpct)$"
)
# currency signs (Math-Verify's test_number_extraction: "1,000.99€"); "$" and "\$" are handled apart
_CURRENCY_RE = re.compile(r"^(?:[€£¥₹]|\\euro\b|\\pounds\b|\\yen\b)\s*|\s*(?:[€£¥₹]|\\euro|\\pounds|\\yen)$")
# a bare unit after a whole-answer number: "1,000.99m²", "15 cm", "15 m^2" (single letters need a space
# or an exponent, so that "5x" and "2i" stay products)
_LATEX_SPACE_RE = re.compile(r"\\[ ,;:!]")
_BARE_UNIT_RE = re.compile(
    r"(?P<num>[+-]?(?:\d[\d,.]*|\.\d+))\s*(?:"
    r"(?:cm|mm|km|kg|mg|ml|mL|ft|yd|mi|hrs?|min|sec|mph|kmh|sq|units?|meters?|metres?|centimeters?|"
    r"millimeters?|kilometers?|inch(?:es)?|feet|foot|miles?|yards?|grams?|kilograms?|seconds?|minutes?|"
    r"hours?|days?|weeks?|months?|years?|liters?|litres?)(?:\s*(?:[²³]|\^\{?[23]\}?))?"
    r"|[mgsLh](?:\s*(?:[²³]|\^\{?[23]\}?))"
    r"|(?<=\s)[mgsLh])"
)


def normalize_answer_string(answer: str) -> str:
    """A canonical string for an answer, used for majority-vote grouping and as a fast exact match.

    Steps: strip ``$``; ``\\text{x}``/``\\mathrm{x}``/... -> ``x``; drop ``\\left``/``\\right``, LaTeX
    spacing and all whitespace; ``\\dfrac``/``\\tfrac`` -> ``\\frac``; drop a trailing ``.``; integers lose
    leading zeros ("025" -> "25") and integral decimals their zeros ("27.0" -> "27").
    """
    s = answer.strip().strip("$")
    for _ in range(3):  # nested \text{\textbf{x}}
        s = _TEXT_CMD_RE.sub(r"\1", s)
    s = _SPACING_RE.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.rstrip(".")
    if _INT_RE.fullmatch(s):  # no int(): it refuses more than 4300 digits
        sign, digits = ("-" if s[0] == "-" else ""), s.lstrip("+-").lstrip("0")
        return sign + digits if digits else "0"
    if _DEC_RE.fullmatch(s):
        value = float(s)
        if value.is_integer():
            return str(int(value))
        return s.rstrip("0")
    return s


def clean_answer(answer: str) -> str:
    """Rewrite the forms math-verify 0.9.0 misreads (package docstring, "Normalisation"); idempotent.

    ``°``/``\\degree`` -> dropped (as math-verify drops ``^\\circ``); trailing bare "dollars"/"cents",
    currency signs (``€``) and a bare unit after a number (``m²``, ``cm``) dropped; a number with
    space-like thousands separators (``10\\,000``, ``10 000``, ``14{, }916``) -> ``10000`` (not a comma
    followed by a space: ``32, 349`` is a list); ``\\displaystyle``, surrounding ``$`` dropped; ``−`` -> ``-``.
    """
    s = _WS_RE.sub(" ", answer).strip().strip("$").strip().replace("\\displaystyle", "").replace("\u2212", "-")
    s = _DEGREE_RE.sub("", s).strip()
    s = _MONEY_WORD_RE.sub("", s).strip()
    s = _CURRENCY_RE.sub("", s).strip()
    unit = _BARE_UNIT_RE.fullmatch(_LATEX_SPACE_RE.sub(" ", s))
    if unit is not None:
        s = unit.group("num")
    m = _THOUSANDS_RE.fullmatch(s)
    if m is not None:
        digits = re.sub(r"\D", "", m.group("groups"))
        s = f"{m.group('sign')}{m.group('head')}{digits}{m.group('tail') or ''}"
    return s


_UNIT_TAIL_RE = re.compile(r"\s*\\(?:text|mbox|mathrm)\{\s*[A-Za-z][A-Za-z ]*\}(?:\^\{?[23]\}?)?$")
_FRAC_RE = re.compile(
    r"(?P<sign>[+-]?)\s*\\[dt]?frac\s*(?:\{\s*(?P<a>\d+)\s*\}|(?P<a1>\d))\s*(?:\{\s*(?P<b>\d+)\s*\}|(?P<b1>\d))"
)
_SLASH_RE = re.compile(r"(?P<sign>[+-]?)(?P<a>\d+)\s*/\s*(?P<b>\d+)")
_NUM_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")


def plain_number(answer: str) -> tuple[Fraction, bool] | None:
    """``(value, exact)`` if the cleaned answer is a plain number, else None.

    Plain numbers: integers (zero padding and thousands separators allowed), decimals, ``a/b``,
    ``\\frac{a}{b}`` (also ``\\dfrac``, ``\\frac ab``), optionally with ``\\$``, degrees or a ``\\text{unit}``
    tail. ``exact`` is False for decimals (math-verify rounds those; see :func:`grade`). Percent
    answers are not plain numbers (they have two readings).
    """
    s = clean_answer(answer)
    if len(s) > 64 or "%" in s or "percent" in s:
        return None
    s = _UNIT_TAIL_RE.sub("", s)
    s = s.replace("\\$", "").replace("\\!", "").replace("{,}", ",").strip()
    m = _THOUSANDS_RE.fullmatch(s)
    if m is not None and "," in m.group("groups"):
        s = f"{m.group('sign')}{m.group('head')}{re.sub(r'[^0-9]', '', m.group('groups'))}{m.group('tail') or ''}"
    if _NUM_RE.fullmatch(s):
        return Fraction(s), "." not in s
    for rx in (_FRAC_RE, _SLASH_RE):
        f = rx.fullmatch(s)
        if f is not None:
            a = int(f.group("a") or f.group("a1"))
            b = int(f.group("b") or f.group("b1"))
            if b == 0:
                return None
            value = Fraction(a, b)
            return (-value if f.group("sign") == "-" else value), True
    return None


def split_percent(answer: str) -> str | None:
    """The number in front of a trailing percent sign (``"50\\%"`` -> ``"50"``), else None."""
    s = answer.strip().strip("$").strip()
    tail = s[-24:]  # the sign is at the end: searching only the tail keeps this linear
    m = _PERCENT_TAIL_RE.search(tail)
    if m is None:
        return None
    body = s[: len(s) - len(tail) + m.start()].strip()
    return body or None


_DECIMAL_COMMA_RE = re.compile(r"(?P<head>[+-]?\d+),(?P<frac>\d+)")


def decimal_comma_value(answer: str) -> Fraction | None:
    """The value of ``answer`` read with a decimal comma (``1000,99`` -> 1000.99, ``0,111`` -> 0.111), or
    None when it is not such a number. A comma followed by exactly three digits after a non-zero integer
    part (``1,234``) is a thousands separator, never a decimal comma. Source: Math-Verify's
    ``test_number_extraction`` ("1000,99" == 1000.99, "1,22" == 1.22, "0,111" == 0.111)."""
    m = _DECIMAL_COMMA_RE.fullmatch(clean_answer(answer))
    if m is None:
        return None
    head, frac = m.group("head"), m.group("frac")
    if len(frac) == 3 and head.lstrip("+-").lstrip("0"):
        return None
    return Fraction(f"{head}.{frac}")

"""Declared tolerances: the numeric tolerance a problem statement declares ("absolute or relative error
does not exceed 10^{-6}") and how testlib's checkers compare numbers under it (package docstring)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

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

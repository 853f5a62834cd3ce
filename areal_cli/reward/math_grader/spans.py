"""Math spans of a text (``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``) as math-verify's parser finds
them, and the text with its math masked out, so that word searches skip the math."""

from __future__ import annotations

import re
from typing import NamedTuple

from areal_cli.reward.math_grader.boxes import MAX_JOINED_BOXES, joined_by_connectors

# Math spans as math-verify's parser finds them (math_verify.parser.make_latex_env_pattern): $$..$$ and
# \[..\] may span lines, $..$ and \(..\) may not; a $ right after a digit is a currency sign. A span never
# contains the opening delimiter of another one, which keeps the scan linear on degenerate text.
_SPAN_RE = re.compile(
    r"(?<!\\)\$\$(?P<dd>(?:[^$]|\\\$)+?)(?<!\\)\$\$"
    r"|(?<!\\)\\\[(?P<db>(?:[^\\]|\\(?![\[\]]))+?)\\\]"
    r"|(?<![\\$\d])\$(?P<di>(?:\\\$|[^\n$])+?)(?<!\\)\$"
    r"|(?<!\\)\\\((?P<pi>(?:[^\n\\]|\\(?![()]))+?)\\\)"
)
_SPAN_PERCENT_RE = re.compile(r"[ \t]*(?:\\?%|percent(?:age)?\b|pct\b)")
MASK = "\x00"  # what stands for each character of math in the masked text


class Span(NamedTuple):
    """A math span: ``text[start:end]`` with its delimiters; ``content`` is what they enclose, stripped."""

    start: int
    end: int
    content: str


_PROSE_RE = re.compile(r"[A-Za-z]{2,}\s+[A-Za-z]{2,}\s+[A-Za-z]{2,}")


def math_spans(text: str) -> list[Span]:
    """The math spans of ``text`` (``_SPAN_RE``), but not prose between two currency signs ("costs $5 in
    total, so the answer is $5": three plain words in a row, no ``\\text``, inside ``$...$``)."""
    out = []
    for m in _SPAN_RE.finditer(text):
        content = next(g for g in m.groups() if g is not None).strip()
        if not content:
            continue
        if m.group("di") is not None and "\\" not in content and _PROSE_RE.search(content):
            continue
        out.append(Span(m.start(), m.end(), content))
    return out


def mask_spans(text: str, spans: list[Span]) -> str:
    """``text`` with every math span replaced by as many NUL characters (word searches skip the math)."""
    parts, pos = [], 0
    for s in spans:
        parts.append(text[pos : s.start])
        parts.append(MASK * (s.end - s.start))
        pos = s.end
    parts.append(text[pos:])
    return "".join(parts)


def _span_value(text: str, span: Span) -> str:
    """A span's content, with a percent sign written right after the span kept (``$28$ %`` -> ``28\\%``)."""
    if _SPAN_PERCENT_RE.match(text, span.end):
        return span.content + "\\%"
    return span.content


def span_group(text: str, spans: list[Span], last: int) -> tuple[int, str]:
    """The span ``spans[last]`` joined with the spans before it that only connectors separate from it
    (the rule for boxes, applied to ``$1$ and $-2$``); returns (index of the first span, joined text)."""
    first = last
    while first > 0 and last - first < MAX_JOINED_BOXES - 1:
        gap = text[spans[first - 1].end : spans[first].start]
        if not joined_by_connectors(gap):
            break
        first -= 1
    return first, ", ".join(_span_value(text, s) for s in spans[first : last + 1])

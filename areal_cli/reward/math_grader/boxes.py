"""Boxed answers: every complete ``\\boxed{...}`` / ``\\fbox{...}`` of a text, and which neighbouring
boxes belong to one final answer (package docstring, "Several boxes")."""

from __future__ import annotations

import re
from typing import NamedTuple

# A box command, \\boxed or \\fbox (also one left unclosed: a value that holds one is no value).
BOX_RE = re.compile(r"\\(?:boxed|fbox)")
# Text allowed between two boxes that belong to one final answer (see package docstring).
_CONNECTOR_RE = re.compile(
    r"(?:\s|\$|,|;|\\quad|\\qquad|\\\\|\\[,;: ]|\band\b|\bor\b|\\text\{\s*(?:and|or|,)?\s*\})*"
    r"(?:[A-Za-z](?:_\{?\w+\}?)?\s*=\s*)?"
)
_MAX_CONNECTOR_CHARS = 40
MAX_JOINED_BOXES = 10  # a degenerate run of thousands of boxes is not an answer list


class Box(NamedTuple):
    """One boxed answer: ``text[start:end]`` is the whole ``\\boxed{...}``; ``content`` is stripped."""

    start: int
    end: int
    content: str


def joined_by_connectors(gap: str) -> bool:
    """Whether ``gap``, the text between two boxes (or two math spans), is connectors only: at most 40
    characters of ``,`` ``;`` and/or ``\\quad`` ``$`` whitespace, optionally ending in an ``x =`` label."""
    return len(gap) <= _MAX_CONNECTOR_CHARS and _CONNECTOR_RE.fullmatch(gap) is not None


_BRACE_TOKEN_RE = re.compile(r"\\.|[{}]", re.DOTALL)


def _closing_braces(text: str, start: int = 0) -> dict[int, int]:
    """``{open index: close index}`` for every matched ``{...}`` pair in ``text[start:]``, in one pass
    (linear time, so a degenerate output with thousands of unclosed boxes costs no more than its
    length). ``\\{``, ``\\}`` and ``\\\\`` are escaped characters, never grouping braces; a stray ``}``
    is ignored."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_TOKEN_RE.finditer(text, start):
        ch = m.group()
        if ch == "{":
            stack.append(m.start())
        elif ch == "}" and stack:
            pairs[stack.pop()] = m.start()
    return pairs


_BARE_TOKEN_RE = re.compile(r"[^\s$]+")


def find_boxes(text: str) -> list[Box]:
    """All complete, non-empty ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed 5`` in ``text``, in order.

    Unclosed boxes (truncated output), empty boxes and commands that merely start with ``boxed``
    (``\\boxedfoo``) are left out. A box nested in another box is not listed separately.
    """
    boxes: list[Box] = []
    first = BOX_RE.search(text)
    if first is None:
        return boxes
    closing = _closing_braces(text, first.start())
    pos = first.start()
    while True:
        m = BOX_RE.search(text, pos)
        if m is None:
            return boxes
        j = m.end()
        pos = j
        if j < len(text) and text[j].isalpha():
            continue  # e.g. \boxedfoo: a different command
        k = j
        while k < len(text) and text[k] in " \t":
            k += 1
        if k < len(text) and text[k] == "{":
            close = closing.get(k)
            if close is None:
                continue
            content, end = text[k + 1 : close].strip(), close + 1
        elif k > j:  # "\boxed 5"
            tok = _BARE_TOKEN_RE.match(text, k)
            if tok is None:
                continue
            content, end = tok.group(0).rstrip(".,;"), tok.end()
        else:
            continue
        if content:
            boxes.append(Box(m.start(), end, content))
            pos = end


def extract_boxed(text: str) -> str | None:
    """Content of the last complete, non-empty box in ``text`` (see :func:`find_boxes`), else None."""
    boxes = find_boxes(text)
    return boxes[-1].content if boxes else None


# Between two boxes that belong together (the worded form; see boxes_belong_together).
_GAP_TEXT_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{([^{}]*)\}")
_GAP_MATH_RE = re.compile(r"\\[()\[\]]|\$|\\q?quad\b|\\[,;:! ]")
_GAP_LABEL_RE = re.compile(r"[A-Za-z](?:_\{?\w+\}?)?\s*=$")
_GAP_SENTENCE_END_RE = re.compile(r"(?<!\\)[.!?](?:\s|$)|\n\s*\n")
_CONJUNCTION_RE = re.compile(r"(?i)\b(?:and|or)\b")
_REVISION_RE = re.compile(
    r"(?i)\b(?:wait|actually|instead|re-?check\w*|reconsider\w*|mistakes?|wrong|correct\w*|sorry|oops|hmm+"
    r"|but|however|no|not|rather|again|reflection|revis\w*|earlier|previous\w*)\b"
)
_MAX_WORDED_GAP_CHARS = 60
_MAX_GAP_WORDS = 5


def boxes_belong_together(gap: str) -> bool:
    """Whether the text between two boxes joins them into one answer (package docstring, "Several boxes").

    Connectors only (``,`` ``;`` and/or ``\\quad`` ``$``, an ``x =`` label), or -- with math delimiters,
    ``\\text{}`` wrappers and spacing commands removed -- at most 5 words that contain "and"/"or", no
    sentence end and no revision word ("wait", "actually", "but", "no", ...). Why: Math-Verify's suite
    joins ``\\boxed{1} papers and \\boxed{2} bins`` and ``\\(\\boxed{1}\\) and \\(\\boxed{-2}\\)``
    (its ``extract_boxed_content``), and a revision must stay a revision.
    """
    if joined_by_connectors(gap):
        return True
    if len(gap) > _MAX_WORDED_GAP_CHARS:
        return False
    text = _GAP_MATH_RE.sub(" ", _GAP_TEXT_RE.sub(r" \1 ", gap)).strip()
    text = _GAP_LABEL_RE.sub("", text).strip()
    if _GAP_SENTENCE_END_RE.search(text) or _REVISION_RE.search(text):
        return False
    return 0 < len(text.split()) <= _MAX_GAP_WORDS and bool(_CONJUNCTION_RE.search(text))

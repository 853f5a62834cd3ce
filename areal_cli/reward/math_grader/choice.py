"""Multiple choice: an answer written as an option letter (``C``, ``(C)``, ``(C) 5``), the options of a
problem, and whether an answer picks the gold option (package docstring, "Equivalence" 1)."""

from __future__ import annotations

import functools
import re

from areal_cli.reward.math_grader.comparison import equal_with_percent

_CHOICE_RE = re.compile(r"\(?\s*(?P<letter>[A-E])\s*\)?(?:(?<=\))\s*|[.:]\s*|\s+(?=\S)|$)(?P<text>.*)", re.DOTALL)
_CHOICE_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_OPTION_RE = re.compile(
    r"(?:\\(?:textbf|text|textrm|mathrm|mathbf)\s*\{\s*)?\(\s*(?P<a>[A-E])\s*\)\s*\}?"
    r"|(?m:^[ \t]*(?P<b>[A-E])[.)][ \t])"
)
_OPTION_JUNK_RE = re.compile(r"\\q?quad\b|\\\\|\$|\\textbf\s*\{\s*\}|\\[,;:! ]|~")


def parse_choice(answer: str) -> tuple[str, str] | None:
    """``(letter, option text)`` of an answer written as a choice: ``C``, ``(C)``, ``\\text{(C)}``,
    ``C.``, ``(C) 5``, ``\\textbf{(C) } 5``; None otherwise (``C = 5``, ``C(5,2)``, ``c``)."""
    s = answer.strip().strip("$").strip()
    for _ in range(2):
        s = _CHOICE_TEXT_CMD_RE.sub(r"\1", s).strip()
    m = _CHOICE_RE.fullmatch(s)
    if m is None:
        return None
    letter, text = m.group("letter"), m.group("text").strip().strip("$").strip()
    bare_letter = not s.startswith("(") and s[1:2] not in (".", ":", ")", "")
    if text and (bare_letter or text[0] in "=<>+-*/^_!'" or _OPTION_RE.search(text)):
        return None  # "C 5", "D = 5": not a choice; "(A) or (C)": not one choice
    return letter, text


@functools.lru_cache(maxsize=1024)
def _options(problem: str) -> dict[str, str]:
    """The answer options of a multiple-choice problem, ``{"A": "3", ...}``: AMC's ``\\textbf{(A) }3
    \\qquad ...``, ``(A) 3 (B) 4``, or lines ``A. 3`` / ``A) 3``; {} unless the letters run A, B, ..."""
    marks = list(_OPTION_RE.finditer(problem))
    run: list[re.Match] = []
    for m in marks:
        letter = m.group("a") or m.group("b")
        if letter == "A":
            run = [m]
        elif run and ord(letter) == ord(run[-1].group("a") or run[-1].group("b")) + 1:
            run.append(m)
    if len(run) < 2:
        return {}
    out = {}
    for i, m in enumerate(run):
        end = run[i + 1].start() if i + 1 < len(run) else len(problem)
        text = problem[m.end() : end]
        if i + 1 == len(run):
            text = text.split("\n", 1)[0]
        text = _OPTION_JUNK_RE.sub(" ", text).strip().strip(",;").strip()
        if text:
            out[m.group("a") or m.group("b")] = text
    return out


def choice_verdict(gold: str, candidate: str, problem: str | None = None) -> bool | None:
    """Multiple choice: whether ``candidate`` picks the gold option, or None when this is no choice
    comparison (then the other rules decide).

    A letter equals the same letter (``C`` == ``(C)`` == ``\\text{(C)}``, as AReaL's ``math_equal``); a
    letter given with its option text must agree with the problem's option (``(C) 5`` for option C = 5);
    given the problem's options, a letter equals its option text and the text equals the letter (gold
    ``C`` with option C = 5 accepts ``5``; gold ``5`` accepts ``C``). Without the problem, a letter with a
    text (``(C) 5``) is compared by its text against a gold that is no letter."""
    gc = parse_choice(gold)
    cc = parse_choice(candidate)
    if gc is None and cc is None:
        return None
    options = _options(problem) if problem else {}
    if gc is not None and cc is not None:
        if gc[0] != cc[0]:
            return False
        for text in (gc[1], cc[1]):
            if text and gc[0] in options and not equal_with_percent(options[gc[0]], text, True, False, None):
                return False
        return True
    if gc is not None:  # gold is a letter, the candidate no letter: its option text
        text = gc[1] or options.get(gc[0])
        return equal_with_percent(text, candidate, True, False, problem) if text else None
    letter, text = cc  # type: ignore[misc]
    if letter in options:
        ok = equal_with_percent(gold, options[letter], True, False, problem)
        return ok and (not text or equal_with_percent(gold, text, True, False, problem))
    return equal_with_percent(gold, text, True, False, problem) if text else None

"""Math answer extraction and grading: our own extraction and normalisation in front of math-verify.

Extraction (:func:`extract_answer`) follows the AReaL / Qwen2.5-Math evaluation parser
(``realhf/impl/dataset/math_parser.py::extract_answer`` in AReaL, ``evaluation/parser.py`` in Qwen2.5-Math):
the final answer is the content of the LAST ``\\boxed{...}`` or ``\\fbox{...}``, nested braces matched
(``\\{``/``\\}`` are literal), brace-less ``\\boxed 5`` too; without a box, a clearly stated final answer.

- Reasoning block (policy): only the text after the last ``</think>`` counts. A completion that opened
  ``<think>`` and never closed it (cut off while thinking) has no answer, even if it boxed one inside; and
  an answer boxed (or stated) only inside the think block, with nothing after ``</think>``, is no answer
  either: the reasoning is a draft, the final answer is what the model says after it (as the
  ``box_in_think_only`` / ``think_only`` cases of the tables). AReaL's parser reads the whole text and
  would take such a box; we do not.
- End of turn: text after an end-of-turn token (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``,
  ``<|eot_id|>``, ``</s>``, DeepSeek's end of sentence) is a hallucinated next turn and is ignored.
- A box that is never closed (truncated output) or is empty is skipped in favour of an earlier one.
- Minerva's "The final answer is $X$. I hope it is correct." written after the last box is the final
  answer (AReaL's parser reads that statement before any box; math-verify gives it the boxes' priority).
- Several boxes (policy): the answer is the last box together with the boxes directly before it that belong
  to it, joined with ``", "`` (math-verify reads the join as a set): boxes separated only by connectors
  (``,`` ``;`` "and" "or" ``\\quad`` ``$`` whitespace, an ``x =`` label), or by a few words that contain
  "and"/"or" and no sign of a revision ("papers and", ``\\text{ for part (a) and }``), with math
  delimiters ``\\(``...``\\)`` / ``$`` around the boxes ignored. This is math-verify's own rule for boxes
  (``latex2sympy2_extended.extract_boxed_content``: joined when close together or separated by and/or/,/;)
  made stricter: a model that lists several solutions boxes each one and a careful grader reads them
  together; a model that hedges (``\\boxed{3} or \\boxed{5}`` for gold 5) gives a two-element set, which
  does not equal 5, so hedging is wrong. Boxes separated by other words ("first \\boxed{3}, on reflection
  \\boxed{5}", "no no no \\boxed{2}") are revisions: only the last one counts. At most the last 10 boxes.
- No box (:func:`stated_answer`; AReaL's parser falls back to "the answer is" / "final answer is"
  statements): a clearly stated final answer is graded --

  1. an answer statement: "final answer is X" (also Minerva's "Final Answer: The final answer is $X$. I
     hope it is correct."), "Final Answer: X", "**Final Answer**" then X, "the answer is X", "Answer: X",
     a line that starts with "Answer"; the last such statement that states a value. The value is the math
     right after the anchor (a formula without delimiters is read whole: for "Answer: x = 3 + 4 = 7"
     math-verify compares the last side, 7), or the value after the statement's last "is" / "=" in prose
     ("Final Answer: The volume is 120." -> 120), or its only number or math. In a completion that is cut
     off, only statements that declare the answer final ("final answer", "Answer:") count;
  2. only in a finished completion (not cut off: no unclosed box or math delimiter, ends with ``.`` ``!``
     ``?``, closing math or bold): a bold value at the very end (``**42**``), or a concluding last
     sentence ("Therefore/Thus/So/Hence/Finally ... is X.", also right after a formula without a full
     stop) with a value as above that has a digit or math;
  3. a short completion -- one line, one sentence, 200 characters at most -- is its own statement
     ("$x = 5$", "The sum is $12$.", "28 percent"); when it does not end like a sentence, only a value
     that is all that follows its last "is"/"=" ("... which is 1,000.99€"), or a completion of at most
     three words, counts.

  The last number of a completion is never an answer by itself (AReaL's last resort; not used): a
  truncated or unfinished completion without a box or an answer statement has no answer.

Normalisation (:func:`clean_answer`, applied to gold and extracted answers before math-verify) fixes
forms math-verify 0.9.0 misreads; what it already reads correctly is left to it:

- zero-padded integers: ``025`` == 25 (math-verify; AIME golds are written this way);
- thousands separators: ``1,000`` ``10{,}080`` ``10,\\!080`` ``\\$32,348`` (math-verify), and
  ``10\\,000`` / ``10 000`` / ``10\\ 000`` / ``14{, }916`` (here, only when the whole answer is such a
  number). Groups must have 3 digits: ``1,2`` stays the list {1, 2}; a comma followed by a space is a list
  separator, not a thousands separator: ``32, 349`` != 32349 (a Math-Verify test case);
- decimal comma (:func:`decimal_comma_value`): ``1000,99`` == 1000.99 and ``0,111`` == 0.111 when the other
  answer is a decimal number (Math-Verify's ``test_number_extraction``); ``1,234`` stays a thousands form;
- percent (policy): a ``%`` sign (``\\%``, ``%``, "percent", "pct") means "hundredths". An answer with a
  percent sign equals both the number in front of it and that number / 100, in either direction:
  ``50\\%`` == 50 == 0.5 (math-verify's rule, made symmetric and exact here), unless the problem fixes the
  unit (:func:`unit_asked`): when it asks for a percent, 0.2 is not 20% ; when it asks for a decimal or
  a fraction, 20% is not 0.2. Two bare numbers are compared as they are: 50 != 0.5. AReaL's
  ``math_equal`` also accepts x/100 and 100x between bare numbers; we do not, because then 0.5 would grade
  correct for a count of 50;
- degrees: ``^\\circ``, ``^{\\circ}``, ``\\degree``, ``°`` and "degrees" are dropped (90° == 90); radians
  are not converted (``\\frac{\\pi}{2}`` != 90°);
- units: ``\\text{cm}``, ``\\mbox{ inches}^2``, ``\\mathrm{m}`` after a number are dropped (math-verify),
  and so are a leading ``\\$``, trailing bare "dollars"/"cents", currency signs (``1,000.99€``) and a
  bare unit after a number (``1,000.99m²``, ``15 cm``; Math-Verify's ``test_number_extraction``);
- ``\\dfrac``/``\\tfrac`` == ``\\frac``; ``\\left``/``\\right`` ignored;
- intervals and sets (math-verify): sets compare order-insensitively (``\\{2,1\\}`` == ``\\{1,2\\}``,
  and a bare list ``1, -2`` is a set); open and closed ends differ (``(1,2]`` != ``[1,2]``); tuples
  are ordered (``(3, \\pi/2)`` != ``(\\pi/2, 3)``); unions compare by their parts. An inequality equals
  the interval it describes, in either direction (``3 < x \\le 4`` == ``(3, 4]``, ``x < 2 \\text{ or }
  x > 5`` == ``(-\\infty, 2) \\cup (5, \\infty)``; :func:`relation_as_set`).

Equivalence (:func:`grade`, :func:`is_equivalent`):

1. multiple choice (:func:`choice_verdict`): a letter (``C``, ``(C)``, ``\\text{(C)}``) given alone, with
   its option text (``(C) 5``) or as its option text (``5``) equals the gold letter or text; the options
   are read from the problem (AReaL's ``math_equal`` compares letters; here also their texts);
2. equal :func:`normalize_answer_string` forms;
3. exact arithmetic when both answers are plain numbers (integers, decimals, ``a/b``, ``\\frac{a}{b}``):
   equal values are equal; two unequal integers/fractions are unequal; a decimal that differs is left to
   math-verify (which rounds to 6 places: ``0.3333333`` == 1/3);
4. math-verify 0.9.0 ``parse`` + ``verify`` (Hugging Face, Apache-2.0), with set/relation comparison
   allowed; then, when math-verify says equal and both sides are exact rational numbers (integers,
   fractions, powers, factorials), they are compared exactly (:func:`exact_value`): math-verify compares
   numbers by floating point rounded to 6 places, so 1/2004! equalled 1/2006! (math-verify issue #14) and
   1/2^99 equalled 1/2^98;
5. false accepts refused when the problem is given (:func:`restates_problem`): an answer that restates an
   expression of the problem (unfactored when the problem asks to factor, unevaluated, copied from the
   problem text) is wrong although it has the gold's value.

Parsed answers are memoised per process (``lru_cache``): the gold of a problem is graded against every one
of its samples.

Timeouts. math-verify's own signal timeouts are disabled (they are whole seconds and it turns a timeout
into a silent "wrong"). Instead:

- :func:`grade` (one answer per pool call) has no time limit of its own: run it in
  :class:`areal_cli.reward.pool.RewardPool`, whose hard timeout kills the worker (status "timeout").
- :func:`grade_many` (a batch per pool call) gives each answer a soft timeout with ``SIGALRM``
  (``setitimer``; the pool worker runs functions on its main thread). An answer over its limit gets
  status ``"timeout"`` (graded wrong, counted), and the batch goes on. Towers such as
  ``10^{10^{10^{10}}}`` and ``(10^{10})!`` end this way: sympy works on them in Python code, where the
  signal gets through. A computation stuck inside one C call cannot be interrupted: then the pool's hard
  timeout kills the worker and the whole batch comes back as one pool "timeout".
- :func:`grade_in_pool` is the batch driver for callers: it sends batches to the pool
  (:func:`grade_batch`) and re-grades the items of any batch that the pool killed or that ran out of its
  budget one at a time with :func:`grade` (one hard timeout each), so a hang costs one answer, never a
  batch, and never a crash.

Pool entry points: ``grade`` (``(extracted, correct)``), ``equivalent`` (bool) and ``grade_batch``
(``(list of (extracted, correct, status), fraction correct)``). :func:`grade_many` itself returns a
list of tuples, which :func:`areal_cli.reward.pool.to_reward` does not accept as a score; ``grade_batch``
wraps it with the batch's fraction correct as the last element, the pool's "details, then score"
convention. Every entry point takes the problem text as an optional last argument.
"""

from __future__ import annotations

import functools
import math
import re
import signal
import time
from fractions import Fraction
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

import math_verify.grader as _mv_grader
import math_verify.parser as _mv_parser
import sympy
from math_verify import parse as _mv_parse
from math_verify import verify as _mv_verify

if TYPE_CHECKING:  # pragma: no cover
    from areal_cli.reward.pool import RewardPool

# We disable math-verify's own timeouts on purpose (see module docstring); silence the one-time
# warning it logs about that in every worker process.
_mv_parser.TIMEOUT_WARNING_SHOWN = True
_mv_grader.TIMEOUT_WARNING_SHOWN = True

GRADE_FN = "areal_cli.reward.math_grader:grade"
GRADE_BATCH_FN = "areal_cli.reward.math_grader:grade_batch"

_BOX_RE = re.compile(r"\\(?:boxed|fbox)")
# Text allowed between two boxes that belong to one final answer (see module docstring).
_CONNECTOR_RE = re.compile(
    r"(?:\s|\$|,|;|\\quad|\\qquad|\\\\|\\[,;: ]|\band\b|\bor\b|\\text\{\s*(?:and|or|,)?\s*\})*"
    r"(?:[A-Za-z](?:_\{?\w+\}?)?\s*=\s*)?"
)
_MAX_CONNECTOR_CHARS = 40
_MAX_JOINED_BOXES = 10  # a degenerate run of thousands of boxes is not an answer list


class Box(NamedTuple):
    """One boxed answer: ``text[start:end]`` is the whole ``\\boxed{...}``; ``content`` is stripped."""

    start: int
    end: int
    content: str


_TURN_END_RE = re.compile(r"<\|im_start\|>|<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>|<｜end▁of▁sentence｜>|</s>")


def strip_turn_end(text: str) -> str:
    """``text`` up to the first end-of-turn token after its first character (``<|im_start|>``,
    ``<|im_end|>``, ``<|endoftext|>``, ``<|eot_id|>``, ``</s>``, DeepSeek's end of sentence): what follows
    is a hallucinated next turn (Math-Verify's suite has such completions: "... is 2/3. <|im_start|>user"),
    not part of the answer."""
    lead = len(text) - len(text.lstrip())
    m = _TURN_END_RE.search(text, lead + 1)
    return text[: m.start()] if m else text


def final_answer_region(completion: str) -> str | None:
    """The part of a completion that may hold the final answer.

    Returns the text after the last ``</think>`` if there is one; ``None`` if ``<think>`` was opened but
    never closed (the model was cut off while thinking); otherwise the whole completion. Either way cut at
    an end-of-turn token (:func:`strip_turn_end`). An empty string (nothing after ``</think>``) means no
    answer: an answer given only inside the think block does not count (module docstring).
    """
    end = completion.rfind("</think>")
    if end >= 0:
        return strip_turn_end(completion[end + len("</think>") :])
    if "<think>" in completion:
        return None
    return strip_turn_end(completion)


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
    first = _BOX_RE.search(text)
    if first is None:
        return boxes
    closing = _closing_braces(text, first.start())
    pos = first.start()
    while True:
        m = _BOX_RE.search(text, pos)
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


# Between two boxes that belong together (the worded form; see _boxes_belong_together).
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


def _boxes_belong_together(gap: str) -> bool:
    """Whether the text between two boxes joins them into one answer (module docstring, "Several boxes").

    Connectors only (``,`` ``;`` and/or ``\\quad`` ``$``, an ``x =`` label), or -- with math delimiters,
    ``\\text{}`` wrappers and spacing commands removed -- at most 5 words that contain "and"/"or", no
    sentence end and no revision word ("wait", "actually", "but", "no", ...). Why: Math-Verify's suite
    joins ``\\boxed{1} papers and \\boxed{2} bins`` and ``\\(\\boxed{1}\\) and \\(\\boxed{-2}\\)``
    (its ``extract_boxed_content``), and a revision must stay a revision.
    """
    if len(gap) <= _MAX_CONNECTOR_CHARS and _CONNECTOR_RE.fullmatch(gap):
        return True
    if len(gap) > _MAX_WORDED_GAP_CHARS:
        return False
    text = _GAP_MATH_RE.sub(" ", _GAP_TEXT_RE.sub(r" \1 ", gap)).strip()
    text = _GAP_LABEL_RE.sub("", text).strip()
    if _GAP_SENTENCE_END_RE.search(text) or _REVISION_RE.search(text):
        return False
    return 0 < len(text.split()) <= _MAX_GAP_WORDS and bool(_CONJUNCTION_RE.search(text))


def extract_answer(completion: str) -> str | None:
    """The final answer of a completion (module docstring, "Extraction").

    After the last ``</think>`` (cut at an end-of-turn token): the last box joined with the boxes directly
    before it that belong to it (:func:`_boxes_belong_together`), joined with ``", "``; without a complete
    box, the clearly stated final answer (:func:`stated_answer`), else None.

    Raises:
        TypeError: ``completion`` is not a string.
    """
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a string, got {type(completion).__name__}")
    region = final_answer_region(completion)
    if region is None:
        return None
    boxes = find_boxes(region)
    if not boxes:
        return stated_answer(region)
    minerva = _minerva_answer(region, boxes[-1].end)
    if minerva is not None:
        return minerva
    group = [boxes[-1]]
    for prev in reversed(boxes[-_MAX_JOINED_BOXES:-1]):
        if not _boxes_belong_together(region[prev.end : group[0].start]):
            break
        group.insert(0, prev)
    return ", ".join(b.content for b in group)


# ---------------------------------------------------------------------------------- stated answers
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
_MASK = "\x00"


class _Span(NamedTuple):
    start: int
    end: int
    content: str


_PROSE_RE = re.compile(r"[A-Za-z]{2,}\s+[A-Za-z]{2,}\s+[A-Za-z]{2,}")


def _math_spans(text: str) -> list[_Span]:
    """The math spans of ``text`` (``_SPAN_RE``), but not prose between two currency signs ("costs $5 in
    total, so the answer is $5": three plain words in a row, no ``\\text``, inside ``$...$``)."""
    out = []
    for m in _SPAN_RE.finditer(text):
        content = next(g for g in m.groups() if g is not None).strip()
        if not content:
            continue
        if m.group("di") is not None and "\\" not in content and _PROSE_RE.search(content):
            continue
        out.append(_Span(m.start(), m.end(), content))
    return out


def _masked(text: str, spans: list[_Span]) -> str:
    """``text`` with every math span replaced by as many NUL characters (word searches skip the math)."""
    parts, pos = [], 0
    for s in spans:
        parts.append(text[pos : s.start])
        parts.append(_MASK * (s.end - s.start))
        pos = s.end
    parts.append(text[pos:])
    return "".join(parts)


def _span_value(text: str, span: _Span) -> str:
    """A span's content, with a percent sign written right after the span kept (``$28$ %`` -> ``28\\%``)."""
    if _SPAN_PERCENT_RE.match(text, span.end):
        return span.content + "\\%"
    return span.content


def _span_group(text: str, spans: list[_Span], last: int) -> tuple[int, str]:
    """The span ``spans[last]`` joined with the spans before it that only connectors separate from it
    (the rule for boxes, applied to ``$1$ and $-2$``); returns (index of the first span, joined text)."""
    first = last
    while first > 0 and last - first < _MAX_JOINED_BOXES - 1:
        gap = text[spans[first - 1].end : spans[first].start]
        if len(gap) > _MAX_CONNECTOR_CHARS or not _CONNECTOR_RE.fullmatch(gap):
            break
        first -= 1
    return first, ", ".join(_span_value(text, s) for s in spans[first : last + 1])


# A number as written in prose: sign, currency, thousands groups (",", or a space as in "1 000"), decimal
# point or comma, "a/b", and a percent sign, currency or unit-with-exponent stuck to it ("1,000.99m²").
_NUMBER_RE = re.compile(
    r"(?<![\w.\\^_])(?:[-−+]\s?)?(?:[$€£¥₹]\s?)?"
    r"(?:\d{1,3}(?:[ ,]\d{3})+(?![\d,])(?:\.\d+)?|\d+(?:[.,]\d+)*|\.\d+)(?:\s?/\s?\d+(?:[.,]\d+)*)?"
    r"(?:[ \t]?(?:\\?%|percent(?:age)?\b|pct\b)|[$€£¥₹]|[a-zA-Z]{0,3}[²³])?"
)
_COPULA_RE = re.compile(r"(?i)\b(?:is|are|was|were|equals|be|it's)\b|(?<![<>!\\])=(?!=)")
_LEADING_FILLER_RE = re.compile(
    r"(?i)^(?:\s+|:|\*\*|equal\s+to\b|approximately\b|about\b|exactly\b|simply\b|just\b|then\b|"
    r"therefore\b|thus\b|given\s+by\b)+"
)
_NOT_A_VALUE_RE = re.compile(
    r"(?i)^(?:the|a|an|our|my|your|this|that|these|those|its|their|his|her|correct|right|wrong|incorrect|"
    r"not|as|in|at|of|to|for|on|by|with|from|because|since|when|if|also|still|now|clearly|indeed|shown|"
    r"given|found|following|below|above|what|which|how|why|there|here|it|we|you|they|i)\b(?!\W*$)"
)  # a determiner followed by more words ("the solution"); a lone "A" is a letter
_HAS_ALNUM_RE = re.compile(r"[^\W_]")
_ANSWER_WORD_RE = re.compile(r"(?i)\b(?:answer|solution)\b")
_MAX_VALUE_WORDS = 6

_LATEX_GROUP_RE = re.compile(r"\\(?:begin|end|text|textbf|textrm|mathrm|mbox|operatorname)\s*\{[^{}]*\}|\\[A-Za-z]+")
_ENGLISH_WORD_RE = re.compile(r"[A-Za-z]{3,}")
_MATH_CHAR_RE = re.compile(r"[\d\\^_=+\-*/()\[\]{}<>]")


def _is_bare_math(text: str) -> bool:
    """Whether ``text`` is a formula written without math delimiters ("x^5 - x + 1", "(3,4]",
    "n = 6 * 9 = 54", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"): no math spans, no English word of three
    letters or more outside LaTeX commands, and some digit or math sign. It is then read whole (math-verify
    takes the last side of an "=" chain itself)."""
    if "$" in text or "\\(" in text or "\\[" in text:
        return False
    bare = _LATEX_GROUP_RE.sub(" ", text)
    return not _ENGLISH_WORD_RE.search(bare) and bool(_MATH_CHAR_RE.search(text))


def _value_text(tail: str, words_ok: bool = True) -> str | None:
    """The value a statement gives after its anchor or its last "is"/"=": leading math (spans joined by
    connectors), else a choice (``(C) 29``), else a lone number, else (``words_ok``) a short word answer
    ("Evelyn"); None for what is not a value ("the solution", "our answer", a long clause)."""
    t = _LEADING_FILLER_RE.sub("", tail).strip().rstrip(".,;:!").strip().strip("*").strip()
    if not t or _NOT_A_VALUE_RE.match(t) or not _HAS_ALNUM_RE.search(t):
        return None
    if _choice(t) is not None or _is_bare_math(t):
        return t
    spans = _math_spans(t)
    if spans:
        if spans[0].start != 0:
            return None
        last = 0
        while last + 1 < len(spans) and _span_group(t, spans, last + 1)[0] == 0:
            last += 1
        return _span_group(t, spans, last)[1]
    words = t.split()
    if len(words) > _MAX_VALUE_WORDS:
        return None
    numbers = _NUMBER_RE.findall(t)
    if len(numbers) == 1 and len(words) > 1:  # "3 hours ago" -> 3
        return numbers[0].strip()
    if numbers or (words_ok and len(words) <= 3 and not _ANSWER_WORD_RE.search(t)):
        return t
    return None


def _statement_value(statement: str, words_ok: bool = True) -> str | None:
    """The value one statement gives (module docstring, "No box"): what follows its last "is"/"=" outside
    math, else its last group of math spans, else its only number, else a short word answer. A value with
    a box command in it (an unclosed or empty box: complete boxes were read before) is none.
    ``words_ok=False`` (a concluding sentence, where "is X" may describe rather than answer: "So, 5 is too
    small."): a value needs a digit or math."""
    value = _statement_value_text(statement, words_ok)
    return None if value is None or _BOX_RE.search(value) else value


def _statement_value_text(statement: str, words_ok: bool) -> str | None:
    s = statement.strip()
    if not s:
        return None
    if _is_bare_math(s):
        value = s.rstrip(".,;:!").strip().strip("*").strip()
        return value if _HAS_ALNUM_RE.search(value) else None
    spans = _math_spans(s)
    masked = _masked(s, spans)
    copula = word_copula = None
    for copula in _COPULA_RE.finditer(masked):
        if copula.group() != "=":
            word_copula = copula
    if word_copula is not None and word_copula is not copula:  # "The plane is 2x - y = 0": the formula
        tail = s[word_copula.end() :].strip().rstrip(".,;:!").strip()
        if _is_bare_math(tail):
            return tail
    if copula is not None:
        value = _value_text(s[copula.end() :], words_ok)
        if value is not None:
            return value
    if spans:
        return _span_group(s, spans, len(spans) - 1)[1]
    if _choice(s) is not None:
        return s.rstrip(".!;,").strip()
    numbers = _NUMBER_RE.findall(masked)
    if len(numbers) == 1:
        return numbers[0].strip()
    words = s.rstrip(".!;,").split()
    if words_ok and copula is None and (len(words) == 1 or (not numbers and len(words) <= 3)):
        value = " ".join(words).strip("*")
        if _HAS_ALNUM_RE.search(value) and not _NOT_A_VALUE_RE.match(value) and not _ANSWER_WORD_RE.search(value):
            return value
    return None


# Answer statements (AReaL's parser: "final answer is", "he answer is"; Minerva's "Final Answer: The final
# answer is $X$. I hope it is correct."; math-verify's "answer:" patterns). Searched outside math.
_ANCHOR_RE = re.compile(
    r"(?i:\bfinal\s+answer\b)(?:\s*\*\*)?(?:\s*(?:is|was|would\s+be|should\s+be|will\s+be)\b|\s*[:：]|(?=[ \t]*\n))"
    r"|(?P<plain>(?i:\bthe\s+(?:correct\s+|right\s+|only\s+)?answer\s+(?:is|was|would\s+be|should\s+be|must\s+be|will\s+be)\b))"
    r"|(?i:\banswer\b)(?:\s*\*\*)?\s*[:：]"
    r"|(?m:^[ \t]*(?:\*\*)?Answer\b)"
    r"|答案(?:是|为)?\s*[:：]?"
)
_STATEMENT_END_RE = re.compile(r"(?<!\\)[.!?](?=\s|$)|\n")
_MAX_ANCHORS = 20


def _anchored_answer(text: str, masked: str, declared_only: bool = False) -> str | None:
    """The value of the last answer statement that states one (module docstring, "No box" 1).

    ``declared_only`` (a cut-off completion): only statements that declare the answer final ("final
    answer", "Answer:") count; "the answer is X" in a completion that stops mid-way is reasoning that was
    still going on, not its final answer."""
    anchors = list(_ANCHOR_RE.finditer(masked))[-_MAX_ANCHORS:]
    for a in reversed(anchors):
        if declared_only and a.group("plain"):
            continue
        start = a.end()
        while start < len(masked) and (masked[start].isspace() or masked[start] in "*:："):
            start += 1
        end_m = _STATEMENT_END_RE.search(masked, start)
        end = end_m.start() if end_m else len(masked)
        if end_m is not None and end_m.group() == "?":
            continue  # "is the answer 5?" is a question, not a statement
        value = _statement_value(text[start:end])
        if value is not None:
            return value
    return None


_BOILERPLATE_RE = re.compile(
    r"(?i)(?:I\s+hope\s+(?:it|this|that)(?:\s+answer)?\s+(?:is|was)\s+(?:correct|right|helpful)"
    r"|I\s+hope\s+this\s+helps|Hope\s+(?:this|it)\s+helps|Let\s+me\s+know\s+if[^.!?\n]{0,200}|Thank\s+you"
    r"|Thanks|Good\s+luck)[.!]*$"
)
_MAX_BOILERPLATE = 20


def _strip_boilerplate(text: str, masked: str) -> tuple[str, str]:
    """``text`` (and its masked form) without closing pleasantries ("I hope it is correct.", "Hope this
    helps!", repeated), which come after the final answer in Minerva-style outputs."""
    for _ in range(_MAX_BOILERPLATE):
        t = masked.rstrip()
        m = _BOILERPLATE_RE.search(t, max(0, len(t) - 260))
        if m is None:
            break
        text, masked = text[: m.start()], masked[: m.start()]
    return text, masked


_SENTENCE_END_RE = re.compile(r"(?<!\\)[.!?](?=\s)|\n\s*\n")
_CONCLUSION_RE = re.compile(
    r"(?i)^[\s*]*(?:therefore|thus|hence|so|finally|in\s+conclusion|in\s+summary|in\s+total|altogether|"
    r"consequently|as\s+a\s+result|overall)\b"
)
_CONCLUSION_AFTER_MATH_RE = re.compile(
    r"(?:\x00|\n)[ \t*]*((?:Therefore|Thus|Hence|So|Finally|In\s+conclusion|In\s+summary|Consequently)\b)"
)
_BOLD_END_RE = re.compile(r"\*\*([^*\n]{1,80})\*\*[\s.!]*$")
_STRAY_DOLLAR_RE = re.compile(r"(?<![\\\d])(?<!\d )\$(?!\s?\d)")  # a $ next to a number is a currency sign
_MAX_SHORT_CHARS = 200
_STATED_TAIL_CHARS = 8000  # a stated answer is looked for in the last 8000 characters


_MINERVA_RE = re.compile(r"(?i)final\s+answer\s+is\s*(?P<value>[^\n]{1,300}?)\.?\s*I\s+hope\s+it\s+is\s+correct")


def _minerva_answer(region: str, after: int) -> str | None:
    """The value of Minerva's "Final Answer: The final answer is $X$. I hope it is correct." written after
    position ``after`` (the last box): it then is the final answer. AReaL's parser reads this statement
    before any box, and math-verify gives it the boxes' priority (the rightmost wins)."""
    tail = region[max(after, len(region) - _STATED_TAIL_CHARS) :]
    if "hope" not in tail:
        return None
    found = None
    for found in _MINERVA_RE.finditer(tail):
        pass
    return _statement_value(found.group("value")) if found is not None else None


def _is_cut_off(text: str, masked: str) -> bool:
    """Whether a completion stops mid-way (module docstring, "No box" 2): an unclosed box or math
    delimiter, or a last character that ends no sentence, math or bold."""
    t = masked.rstrip()
    if not t or _BOX_RE.search(text) or _STRAY_DOLLAR_RE.search(t) or "\\(" in t or "\\[" in t:
        return True
    if t.endswith("**") and t.count("**") % 2 == 0:  # closes a bold value
        return False
    return t[-1] not in (".", "!", "?", ")", "]", "}", _MASK)


def _concluding_answer(text: str, masked: str) -> str | None:
    """The value of a concluding last sentence ("Therefore ... is X."), or of a bold value ending the
    text (module docstring, "No box" 2)."""
    bold = _BOLD_END_RE.search(masked)
    if bold is not None:
        value = _statement_value(text[bold.start(1) : bold.end(1)], words_ok=False)
        if value is not None:
            return value
    body = masked.rstrip()
    cut = 0
    for m in _SENTENCE_END_RE.finditer(body, 0, max(len(body) - 1, 0)):
        cut = m.end()
    last = text[cut : len(body)]
    last_masked = masked[cut : len(body)]
    if not re.search(r"[A-Za-z]", last_masked) and cut > 0:  # a display formula on its own after "...is:"
        prev = 0
        for m in _SENTENCE_END_RE.finditer(body, 0, max(cut - 1, 0)):
            prev = m.end()
        if re.search(r"(?:[:=]|\b(?:is|are|be))\s*$", masked[prev:cut].rstrip(" \n.")):
            last, last_masked = text[prev : len(body)], masked[prev : len(body)]
    if not _CONCLUSION_RE.match(last_masked):
        # a conclusion that starts right after a formula, with no full stop in between ("... $y = 6$ So,
        # the pair is $(7, 6)$."): the last capitalised conclusion word after a formula or a line break
        start = None
        for start in _CONCLUSION_AFTER_MATH_RE.finditer(last_masked):
            pass
        if start is None:
            return None
        last = last[start.start(1) :]
    return _statement_value(last, words_ok=False)


def _is_short_statement(masked: str) -> bool:
    """One line of at most 200 characters holding one sentence: the completion is a statement of its
    answer (module docstring, "No box" 3)."""
    if len(masked) > _MAX_SHORT_CHARS or "\n" in masked:
        return False
    return _SENTENCE_END_RE.search(masked.rstrip(), 0, max(len(masked.rstrip()) - 1, 0)) is None


def _copula_value(statement: str) -> str | None:
    """The value after the last "is"/"=" of a statement when that value is all that follows it
    ("... which is 1,000.99€"), else None ("... are eaten, leaving 15")."""
    s = statement.strip()
    masked = _masked(s, _math_spans(s))
    copula = None
    for copula in _COPULA_RE.finditer(masked):
        pass
    if copula is None:
        return None
    tail = s[copula.end() :].strip().rstrip(".,;:!").strip()
    value = _value_text(tail)
    return value if value is not None and value.split() == tail.split() else None


def _tail_from_a_line_start(text: str) -> str:
    """The last ``_STATED_TAIL_CHARS`` characters, starting at a line start so that the cut never lands inside
    a ``$...$`` span (a stray ``$`` would make the completion look cut off): the partial first line is dropped."""
    if len(text) <= _STATED_TAIL_CHARS:
        return text
    tail = text[-_STATED_TAIL_CHARS:]
    newline = tail.find("\n")
    return tail[newline + 1 :] if newline >= 0 else tail


def stated_answer(text: str) -> str | None:
    """The clearly stated final answer of a completion without a box (module docstring, "No box"): the last
    answer statement; else, in a finished completion, a bold value at the end or a concluding last
    sentence; else the whole of a short one-line completion. None when there is none: the last number of
    a completion is not an answer by itself.

    Args:
        text: the final-answer region (:func:`final_answer_region`), with no complete box in it.
    """
    text = _tail_from_a_line_start(text)
    spans = _math_spans(text)
    masked = _masked(text, spans)
    text, masked = _strip_boilerplate(text, masked)
    stripped = masked.strip()
    if not stripped:
        return None
    cut_off = _is_cut_off(text, masked)
    value = _anchored_answer(text, masked, declared_only=cut_off and not _is_short_statement(stripped))
    if value is not None:
        return value
    if _is_short_statement(stripped) and not _BOX_RE.search(text):
        if not cut_off or len(stripped.split()) <= 3:
            return _statement_value(text)
        return _copula_value(text)  # "... which is 1,000.99€" states its value even without a full stop
    if cut_off:
        return None
    return _concluding_answer(text, masked)

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


# ---------------------------------------------------------------------------------- normalisation
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
    """Rewrite the forms math-verify 0.9.0 misreads (module docstring, "Normalisation"); idempotent.

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


def _split_percent(answer: str) -> str | None:
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


# ---------------------------------------------------------------------------------- equivalence
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


def _mv_equal(gold: str, candidate: str, *, gold_must_parse: bool) -> bool:
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
    return _mv_equal(g, c, gold_must_parse=gold_must_parse)


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


def _equal_percent(gold: str, candidate: str, string_match: bool, gold_must_parse: bool,
                   problem: str | None) -> bool:
    """``candidate`` is the same answer as ``gold`` (both bare strings), with the percent policy."""
    gp, cp = _split_percent(gold), _split_percent(candidate)
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


# ---------------------------------------------------------------------------------- multiple choice
_CHOICE_RE = re.compile(r"\(?\s*(?P<letter>[A-E])\s*\)?(?:(?<=\))\s*|[.:]\s*|\s+(?=\S)|$)(?P<text>.*)", re.DOTALL)
_CHOICE_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_OPTION_RE = re.compile(
    r"(?:\\(?:textbf|text|textrm|mathrm|mathbf)\s*\{\s*)?\(\s*(?P<a>[A-E])\s*\)\s*\}?"
    r"|(?m:^[ \t]*(?P<b>[A-E])[.)][ \t])"
)
_OPTION_JUNK_RE = re.compile(r"\\q?quad\b|\\\\|\$|\\textbf\s*\{\s*\}|\\[,;:! ]|~")


def _choice(answer: str) -> tuple[str, str] | None:
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
    gc = _choice(gold)
    cc = _choice(candidate)
    if gc is None and cc is None:
        return None
    options = _options(problem) if problem else {}
    if gc is not None and cc is not None:
        if gc[0] != cc[0]:
            return False
        for text in (gc[1], cc[1]):
            if text and gc[0] in options and not _equal_percent(options[gc[0]], text, True, False, None):
                return False
        return True
    if gc is not None:  # gold is a letter, the candidate no letter: its option text
        text = gc[1] or options.get(gc[0])
        return _equal_percent(text, candidate, True, False, problem) if text else None
    letter, text = cc  # type: ignore[misc]
    if letter in options:
        ok = _equal_percent(gold, options[letter], True, False, problem)
        return ok and (not text or _equal_percent(gold, text, True, False, problem))
    return _equal_percent(gold, text, True, False, problem) if text else None


# ---------------------------------------------------------------------------------- restating the problem
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
    spans = _math_spans(problem)
    for s in spans:
        units.add(s.content)
        units.update(_RELATION_SPLIT_RE.split(s.content))
    plain = _masked(problem, spans).replace(_MASK, " ")
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


def _equal(gold: str, candidate: str, string_match: bool = True, gold_must_parse: bool = True,
           problem: str | None = None) -> bool:
    """``candidate`` is the same answer as ``gold`` (both bare strings): multiple choice, then the percent
    policy and the comparison rules, then the restatement check (module docstring, "Equivalence")."""
    choice = choice_verdict(gold, candidate, problem)
    if choice is not None:
        return choice
    if not _equal_percent(gold, candidate, string_match, gold_must_parse, problem):
        return False
    return not restates_problem(candidate, gold, problem)


def _check_problem(problem: Any) -> str | None:
    if problem is not None and not isinstance(problem, str):
        raise TypeError(f"problem must be a string or None, got {type(problem).__name__}")
    return problem or None


def is_equivalent(reference: str, candidate: str, problem: str | None = None) -> bool:
    """Whether ``candidate`` is mathematically the same answer as ``reference`` (both bare answer
    strings, no ``\\boxed``): same rules as :func:`grade`; an unparseable reference is "not
    equivalent". ``problem`` (optional): the problem text, for the rules that need it (multiple-choice
    options, a unit the problem fixes, restating the problem). May not return on adversarial input: run
    it in a RewardPool.

    Raises:
        TypeError: ``problem`` is neither a string nor None.
    """
    return _equal(reference, candidate, True, gold_must_parse=False, problem=_check_problem(problem))


def grade(completion: str, gold: str | int | float, string_match: bool = True,
          problem: str | None = None) -> tuple[str | None, bool]:
    """Grade a completion against a gold answer.

    Args:
        completion: model output text (may contain a ``<think>`` block).
        gold: the dataset's answer (str/int/float, normalised by :func:`normalize_gold`).
        string_match: use the fast paths (equal :func:`normalize_answer_string` forms; exact arithmetic
            on plain numbers) before math-verify (default). False = math-verify decides every pair
            (after :func:`clean_answer` and the percent policy); used to test that the fast paths agree.
        problem: the problem text, or None. Given, it enables the rules that need it: multiple-choice
            options, a unit the problem fixes (percent), and refusing an answer that restates the
            problem's own expression (:func:`restates_problem`). Callers that have it should pass it.

    Returns:
        ``(extracted, correct)``: the extracted final answer (``None`` if there is none -- no box and no
        clearly stated answer, :func:`extract_answer` -- then ``correct`` is False) and whether it matches
        the gold answer.

    Raises:
        TypeError / ValueError: bad gold answer (the pool reports these as status "error"), including a
            gold answer that math-verify cannot parse (when no fast path matched); ``string_match`` not a
            bool or ``problem`` not a string (a problem passed in ``string_match``'s place is refused).

    No time limit of its own (see module docstring): run it in a RewardPool, or use :func:`grade_many`.
    """
    if not isinstance(string_match, bool):
        raise TypeError(f"string_match must be a bool, got {type(string_match).__name__} (pass the problem as problem=)")
    problem = _check_problem(problem)
    gold_text = normalize_gold(gold)
    extracted = extract_answer(completion)
    if extracted is None:
        return None, False
    return extracted, _equal(gold_text, extracted, string_match, problem=problem)


def equivalent(reference: str, candidate: str, problem: str | None = None) -> bool:
    """Pool entry point ``"areal_cli.reward.math_grader:equivalent"`` (same as :func:`is_equivalent`)."""
    return is_equivalent(reference, candidate, problem)

# ---------------------------------------------------------------------------------- batches
class _ItemTimeout(BaseException):
    """Raised by SIGALRM inside a graded item. A BaseException so that the ``except Exception`` blocks
    in math-verify / latex2sympy (which turn errors into "unparseable") cannot swallow it."""


class _Alarm:
    armed = False


def _on_alarm(signum: int, frame: Any) -> None:
    if _Alarm.armed:
        raise _ItemTimeout()


def _run_limited(fn: Any, limit_s: float | None, *args: Any) -> Any:
    """``fn(*args)``, interrupted by :class:`_ItemTimeout` after ``limit_s`` seconds (None: no limit).
    The alarm repeats every 50 ms until disarmed, in case a library catches one of them."""
    if limit_s is None:
        return fn(*args)
    _Alarm.armed = True
    signal.setitimer(signal.ITIMER_REAL, max(limit_s, 1e-3), 0.05)
    try:
        return fn(*args)
    finally:
        _Alarm.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def _unpack(item: Sequence[Any]) -> tuple[Any, Any, Any]:
    """``(completion, gold, problem)`` of a batch item ``(completion, gold)`` or ``(completion, gold,
    problem)``."""
    if len(item) == 2:
        return item[0], item[1], None
    if len(item) == 3:
        return item[0], item[1], item[2]
    raise ValueError(f"a batch item is (completion, gold) or (completion, gold, problem), got {len(item)} values")


def grade_many(
    items: Sequence[tuple[str, str | int | float] | tuple[str, str | int | float, str | None]],
    item_timeout_s: float = 5.0,
    budget_s: float | None = None,
) -> list[tuple[str | None, bool, str]]:
    """Grade a batch of ``(completion, gold)`` pairs in this process, each under a soft timeout.

    Args:
        items: ``(completion, gold)`` pairs or ``(completion, gold, problem)`` triples, as for :func:`grade`.
        item_timeout_s: seconds one answer may take (> 0). Enforced with ``SIGALRM``, so only when
            called on the main thread (as in a RewardPool worker); elsewhere there is no soft limit.
        budget_s: seconds the whole batch may take (None: no limit). Items that the budget cuts short
            or never reaches get status ``"skipped"`` (not graded: the caller grades them again).
            :func:`grade_in_pool` sets it below the pool's hard timeout so the pool never kills a
            batch that is only slow.

    Returns:
        One ``(extracted, correct, status)`` per item, in order. ``status``: ``"ok"``; ``"timeout"``
        (over ``item_timeout_s``: counted ungraded, ``correct`` False); ``"error"`` (bad gold answer:
        :func:`grade` raised; re-grade alone for the message); ``"skipped"`` (see ``budget_s``).
        ``extracted`` is filled in for every status but ``"error"`` with a bad completion.

    Raises:
        ValueError: ``item_timeout_s`` or ``budget_s`` not a positive number; an item of another length.
    """
    items = [_unpack(item) for item in items]
    for name, val in (("item_timeout_s", item_timeout_s), ("budget_s", budget_s)):
        if val is not None and not (isinstance(val, (int, float)) and val > 0 and math.isfinite(val)):
            raise ValueError(f"{name} must be a positive number of seconds, got {val!r}")
    try:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        can_alarm = True
    except ValueError:  # not the main thread: signals cannot be used here
        previous, can_alarm = None, False
    start = time.monotonic()
    # an alarm someone else set (e.g. pytest-timeout) shares this timer: it is restored afterwards
    outer_timer = signal.getitimer(signal.ITIMER_REAL) if can_alarm else (0.0, 0.0)
    deadline = None if budget_s is None else start + budget_s
    out: list[tuple[str | None, bool, str]] = []
    try:
        for completion, gold, problem in items:
            try:
                extracted = extract_answer(completion)
            except Exception:
                out.append((None, False, "error"))
                continue
            limit: float | None = float(item_timeout_s) if can_alarm else None
            by_budget = False
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    out.append((extracted, False, "skipped"))
                    continue
                if can_alarm and left < item_timeout_s:
                    limit, by_budget = left, True
            try:
                _, correct = _run_limited(grade, limit, completion, gold, True, problem)
                out.append((extracted, bool(correct), "ok"))
            except _ItemTimeout:
                out.append((extracted, False, "skipped" if by_budget else "timeout"))
            except Exception:
                out.append((extracted, False, "error"))
    finally:
        if can_alarm:
            _Alarm.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if outer_timer[0] > 0:
                left = outer_timer[0] - (time.monotonic() - start)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), outer_timer[1])
    return out


def grade_batch(
    items: Sequence[tuple[str, str | int | float] | tuple[str, str | int | float, str | None]],
    item_timeout_s: float = 5.0,
    budget_s: float | None = None,
) -> tuple[list[tuple[str | None, bool, str]], float]:
    """Pool entry point ``"areal_cli.reward.math_grader:grade_batch"``: :func:`grade_many` plus the
    fraction of items graded correct as the last element, which the pool takes as the call's reward
    (:func:`areal_cli.reward.pool.to_reward`); the per-item results are ``RewardResult.value[0]``."""
    results = grade_many(items, item_timeout_s, budget_s)
    return results, (sum(r[1] for r in results) / len(results) if results else 0.0)


class GradedAnswer(NamedTuple):
    """Outcome of one answer graded by :func:`grade_in_pool`."""

    extracted: str | None
    correct: bool
    status: str  # "ok" | "timeout" | "error"
    message: str = ""


def grade_in_pool(
    pool: "RewardPool",
    items: Sequence[tuple[str, str | int | float] | tuple[str, str | int | float, str | None]],
    *,
    batch_size: int = 32,
    item_timeout_s: float | None = None,
    batch_fn: str = GRADE_BATCH_FN,
) -> list[GradedAnswer]:
    """Grade many ``(completion, gold)`` pairs (or ``(completion, gold, problem)`` triples) through ``pool``
    in batches, robust to hangs.

    Each batch is one pool call of :func:`grade_batch` with a soft per-answer timeout
    (``item_timeout_s``, default half the pool's ``timeout_s``) and a batch budget of 80 % of the pool's
    hard timeout. The items of a batch the pool could not finish (hard timeout: worker killed; worker
    died) and the items the budget skipped are graded again one per pool call with :func:`grade`, each
    under the pool's hard timeout; items with status "error" too (to get the message). So a hang costs
    one answer (status "timeout"), never the batch.

    Args:
        pool: an open RewardPool (any function; this calls ``grade_batch`` and ``grade`` by name).
        items: ``(completion, gold)`` pairs or ``(completion, gold, problem)`` triples (see :func:`grade`).
        batch_size: answers per pool call (>= 1).
        item_timeout_s: soft limit per answer inside a batch (> 0), default ``pool.timeout_s / 2``.
        batch_fn: the pool function for a batch, with :func:`grade_batch`'s arguments and return value.

    Returns:
        One :class:`GradedAnswer` per item, in order. Status "timeout" and "error" are graded wrong.

    Raises:
        ValueError: ``batch_size`` < 1, a bad ``item_timeout_s``, or an item of another length.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    soft = pool.timeout_s / 2 if item_timeout_s is None else item_timeout_s
    if not (isinstance(soft, (int, float)) and soft > 0 and math.isfinite(soft)):
        raise ValueError(f"item_timeout_s must be a positive number of seconds, got {item_timeout_s!r}")
    items = list(items)
    for item in items:
        _unpack(item)
    budget = 0.8 * pool.timeout_s
    batches = [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
    results = pool.score_many([(b, soft, budget) for b in batches], fn=batch_fn)
    out: list[GradedAnswer | None] = []
    redo: list[int] = []
    for batch, res in zip(batches, results):
        if res.status != "ok":
            redo.extend(range(len(out), len(out) + len(batch)))
            out.extend([None] * len(batch))
            continue
        for extracted, correct, status in res.value[0]:
            if status in ("skipped", "error"):
                redo.append(len(out))
                out.append(None)
            else:
                msg = f"no result within the soft limit of {soft:g} s" if status == "timeout" else ""
                out.append(GradedAnswer(extracted, bool(correct), status, msg))
    if redo:
        # one answer per call: grade(completion, gold[, string_match, problem])
        singles = pool.score_many([_single_args(items[i]) for i in redo], fn=GRADE_FN)
        for i, res in zip(redo, singles):
            if res.status == "ok":
                extracted, correct = res.value
                out[i] = GradedAnswer(extracted, bool(correct), "ok")
            else:
                out[i] = GradedAnswer(_safe_extract(items[i][0]), False, res.status, res.message)
    return [g for g in out if g is not None]


def _single_args(item: Sequence[Any]) -> tuple[Any, ...]:
    completion, gold, problem = _unpack(item)
    return (completion, gold) if problem is None else (completion, gold, True, problem)


def _safe_extract(completion: Any) -> str | None:
    try:
        return extract_answer(completion)
    except Exception:
        return None

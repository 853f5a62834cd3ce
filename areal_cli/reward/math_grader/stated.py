"""Stated answers: the clearly stated final answer of a completion without a box -- an answer
statement, a concluding sentence or bold value, or a short one-line completion (package docstring,
"No box"). The last number of a completion is never an answer by itself."""

from __future__ import annotations

import re

from areal_cli.reward.math_grader.boxes import BOX_RE
from areal_cli.reward.math_grader.choice import parse_choice
from areal_cli.reward.math_grader.spans import MASK, mask_spans, math_spans, span_group

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
    if parse_choice(t) is not None or _is_bare_math(t):
        return t
    spans = math_spans(t)
    if spans:
        if spans[0].start != 0:
            return None
        last = 0
        while last + 1 < len(spans) and span_group(t, spans, last + 1)[0] == 0:
            last += 1
        return span_group(t, spans, last)[1]
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
    """The value one statement gives (package docstring, "No box"): what follows its last "is"/"=" outside
    math, else its last group of math spans, else its only number, else a short word answer. A value with
    a box command in it (an unclosed or empty box: complete boxes were read before) is none.
    ``words_ok=False`` (a concluding sentence, where "is X" may describe rather than answer: "So, 5 is too
    small."): a value needs a digit or math."""
    value = _statement_value_text(statement, words_ok)
    return None if value is None or BOX_RE.search(value) else value


def _statement_value_text(statement: str, words_ok: bool) -> str | None:
    s = statement.strip()
    if not s:
        return None
    if _is_bare_math(s):
        value = s.rstrip(".,;:!").strip().strip("*").strip()
        return value if _HAS_ALNUM_RE.search(value) else None
    spans = math_spans(s)
    masked = mask_spans(s, spans)
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
        return span_group(s, spans, len(spans) - 1)[1]
    if parse_choice(s) is not None:
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
    """The value of the last answer statement that states one (package docstring, "No box" 1).

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


def minerva_answer(region: str, after: int) -> str | None:
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
    """Whether a completion stops mid-way (package docstring, "No box" 2): an unclosed box or math
    delimiter, or a last character that ends no sentence, math or bold."""
    t = masked.rstrip()
    if not t or BOX_RE.search(text) or _STRAY_DOLLAR_RE.search(t) or "\\(" in t or "\\[" in t:
        return True
    if t.endswith("**") and t.count("**") % 2 == 0:  # closes a bold value
        return False
    return t[-1] not in (".", "!", "?", ")", "]", "}", MASK)


def _concluding_answer(text: str, masked: str) -> str | None:
    """The value of a concluding last sentence ("Therefore ... is X."), or of a bold value ending the
    text (package docstring, "No box" 2)."""
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
    answer (package docstring, "No box" 3)."""
    if len(masked) > _MAX_SHORT_CHARS or "\n" in masked:
        return False
    return _SENTENCE_END_RE.search(masked.rstrip(), 0, max(len(masked.rstrip()) - 1, 0)) is None


def _copula_value(statement: str) -> str | None:
    """The value after the last "is"/"=" of a statement when that value is all that follows it
    ("... which is 1,000.99€"), else None ("... are eaten, leaving 15")."""
    s = statement.strip()
    masked = mask_spans(s, math_spans(s))
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
    """The clearly stated final answer of a completion without a box (package docstring, "No box"): the last
    answer statement; else, in a finished completion, a bold value at the end or a concluding last
    sentence; else the whole of a short one-line completion. None when there is none: the last number of
    a completion is not an answer by itself.

    Args:
        text: the final-answer region (:func:`final_answer_region`), with no complete box in it.
    """
    text = _tail_from_a_line_start(text)
    spans = math_spans(text)
    masked = mask_spans(text, spans)
    text, masked = _strip_boilerplate(text, masked)
    stripped = masked.strip()
    if not stripped:
        return None
    cut_off = _is_cut_off(text, masked)
    value = _anchored_answer(text, masked, declared_only=cut_off and not _is_short_statement(stripped))
    if value is not None:
        return value
    if _is_short_statement(stripped) and not BOX_RE.search(text):
        if not cut_off or len(stripped.split()) <= 3:
            return _statement_value(text)
        return _copula_value(text)  # "... which is 1,000.99€" states its value even without a full stop
    if cut_off:
        return None
    return _concluding_answer(text, masked)

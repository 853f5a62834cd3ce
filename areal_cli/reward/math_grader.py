"""Math answer extraction and grading: our own extraction and normalisation in front of math-verify.

Extraction (:func:`extract_answer`) follows the AReaL / Qwen2.5-Math evaluation parser
(``evaluation/parser.py::extract_answer``): the final answer is the content of the LAST ``\\boxed{...}``
or ``\\fbox{...}``, nested braces matched (``\\{``/``\\}`` are literal), brace-less ``\\boxed 5`` too.

- Reasoning block: only the text after the last ``</think>`` counts; a completion that opened
  ``<think>`` and never closed it (cut off while thinking) has no answer, even if it boxed one inside.
- No box -> no answer -> wrong. AReaL's fallbacks ("the answer is", last number) are deliberately not
  used: every protocol's prompt asks for ``\\boxed{}``.
- A box that is never closed (truncated output) or is empty is skipped in favour of an earlier one.
- Several boxes (policy): the answer is the last box together with the boxes directly before it that are
  separated from it only by connectors (``,`` ``;`` "and" "or" ``\\quad`` ``$`` whitespace, and an
  ``x =`` label), joined with ``", "``: ``$\\boxed{1}$ and $\\boxed{-2}$`` -> ``"1, -2"``, which
  math-verify reads as the set {1, -2}. This is math-verify's own rule for adjacent boxes (its
  ``\\boxed{..}(,|and|or)\\boxed{..}`` pattern) restricted to the final answer. Why: a model that lists
  several solutions boxes each one, and a careful grader reads them together; a model that hedges
  (``\\boxed{3} or \\boxed{5}`` for gold 5) gives a two-element set, which does not equal 5, so
  hedging is wrong. Boxes separated by other words ("first \\boxed{3}, on reflection \\boxed{5}") are
  revisions: only the last one counts. At most the last 10 adjacent boxes are joined.

Normalisation (:func:`clean_answer`, applied to gold and extracted answers before math-verify) fixes
forms math-verify 0.9.0 misreads; what it already reads correctly is left to it:

- zero-padded integers: ``025`` == 25 (math-verify; AIME golds are written this way);
- thousands separators: ``1,000`` ``10{,}080`` ``10,\\!080`` ``\\$32,348`` (math-verify), and
  ``10\\,000`` / ``10 000`` / ``10\\ 000`` (here, only when the whole answer is such a number). Groups
  must have 3 digits: ``1,2`` stays the list {1, 2};
- percent (policy): a ``%`` sign (``\\%``, ``%``, "percent") means "hundredths". An answer with a
  percent sign equals both the number in front of it and that number / 100, in either direction:
  ``50\\%`` == 50 == 0.5 (math-verify's rule, made symmetric and exact here). Two bare numbers are
  compared as they are: 50 != 0.5. AReaL's ``math_equal`` also accepts x/100 and 100x between bare
  numbers; we do not, because then 0.5 would grade correct for a count of 50;
- degrees: ``^\\circ``, ``^{\\circ}``, ``\\degree``, ``°`` and "degrees" are dropped (90° == 90); radians
  are not converted (``\\frac{\\pi}{2}`` != 90°);
- units: ``\\text{cm}``, ``\\mbox{ inches}^2``, ``\\mathrm{m}`` after a number are dropped (math-verify),
  and so are a leading ``\\$`` and trailing bare "dollars"/"cents" (here);
- ``\\dfrac``/``\\tfrac`` == ``\\frac``; ``\\left``/``\\right`` ignored;
- intervals and sets (math-verify): sets compare order-insensitively (``\\{2,1\\}`` == ``\\{1,2\\}``,
  and a bare list ``1, -2`` is a set); open and closed ends differ (``(1,2]`` != ``[1,2]``); tuples
  are ordered (``(3, \\pi/2)`` != ``(\\pi/2, 3)``); unions compare by their parts.

Equivalence (:func:`grade`, :func:`is_equivalent`): (1) equal :func:`normalize_answer_string` forms;
(2) exact arithmetic when both answers are plain numbers (integers, decimals, ``a/b``, ``\\frac{a}{b}``):
equal values are equal; two unequal integers/fractions are unequal; a decimal that differs is left to
math-verify (which rounds to 6 places: ``0.3333333`` == 1/3); (3) math-verify 0.9.0 ``parse`` +
``verify`` (Hugging Face, Apache-2.0). Parsed answers are memoised per process (``lru_cache``): the
gold of a problem is graded against every one of its samples.

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
convention.
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


def final_answer_region(completion: str) -> str | None:
    """The part of a completion that may hold the final answer.

    Returns the text after the last ``</think>`` if there is one; ``None`` if ``<think>`` was opened but
    never closed (the model was cut off while thinking); otherwise the whole completion.
    """
    end = completion.rfind("</think>")
    if end >= 0:
        return completion[end + len("</think>") :]
    if "<think>" in completion:
        return None
    return completion


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


def extract_answer(completion: str) -> str | None:
    """The final answer of a completion: after the last ``</think>``, the last box joined with the
    boxes directly before it that only connectors separate from it (policy in the module docstring).

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
        return None
    group = [boxes[-1]]
    for prev in reversed(boxes[-_MAX_JOINED_BOXES:-1]):
        gap = region[prev.end : group[0].start]
        if len(gap) > _MAX_CONNECTOR_CHARS or not _CONNECTOR_RE.fullmatch(gap):
            break
        group.insert(0, prev)
    return ", ".join(b.content for b in group)


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
    r"(?P<groups>(?:(?:,\\!|\{,\}|,|\\,|\\ |~|\\;|\s)\s*\d{3})+)(?P<tail>\.\d+)?"
)
_PERCENT_TAIL_RE = re.compile(r"(?:\\%|%|\\text\{\s*\\?%\s*\}|\\text\{\s*percent\s*\}|\bpercent)$")


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

    ``°``/``\\degree`` -> dropped (as math-verify drops ``^\\circ``); trailing bare "dollars"/"cents"
    dropped; a number with space-like thousands separators (``10\\,000``, ``10 000``) -> ``10000``;
    ``\\displaystyle`` and surrounding ``$`` dropped.
    """
    s = _WS_RE.sub(" ", answer).strip().strip("$").strip().replace("\\displaystyle", "")
    s = _DEGREE_RE.sub("", s).strip()
    s = _MONEY_WORD_RE.sub("", s).strip()
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


# ---------------------------------------------------------------------------------- equivalence
@functools.lru_cache(maxsize=8192)
def _parsed(answer: str) -> tuple:
    """math-verify's parse of one bare answer (memoised per process; sympy objects are immutable)."""
    return tuple(_mv_parse("\\boxed{" + answer + "}", parsing_timeout=None))


def _mv_equal(gold: str, candidate: str, *, gold_must_parse: bool) -> bool:
    gold_parsed = _parsed(gold)
    if not gold_parsed:
        if gold_must_parse:
            raise ValueError(f"gold answer {gold!r} could not be parsed by math-verify")
        return False
    cand_parsed = _parsed(candidate)
    if not cand_parsed:
        return False
    return bool(_mv_verify(list(gold_parsed), list(cand_parsed), timeout_seconds=None))


def _equal_no_percent(gold: str, candidate: str, string_match: bool, gold_must_parse: bool) -> bool:
    if string_match and normalize_answer_string(gold) == normalize_answer_string(candidate):
        return True
    g, c = clean_answer(gold), clean_answer(candidate)
    if string_match:
        gn, cn = plain_number(g), plain_number(c)
        if gn is not None and cn is not None:
            if gn[0] == cn[0]:
                return True
            if gn[1] and cn[1]:
                return False
    return _mv_equal(g, c, gold_must_parse=gold_must_parse)


def _equal(gold: str, candidate: str, string_match: bool = True, gold_must_parse: bool = True) -> bool:
    """``candidate`` is the same answer as ``gold`` (both bare strings), with the percent policy."""
    gp, cp = _split_percent(gold), _split_percent(candidate)
    if gp is None and cp is None:
        return _equal_no_percent(gold, candidate, string_match, gold_must_parse)
    if gp is not None and cp is not None:
        return _equal_no_percent(gp, cp, string_match, gold_must_parse)
    # exactly one side has a percent sign: "p%" equals p and p/100
    if gp is not None:
        readings, other, other_is_gold = (gp, f"\\frac{{{gp}}}{{100}}"), candidate, False
    else:
        readings, other, other_is_gold = (cp, f"\\frac{{{cp}}}{{100}}"), gold, True
    for reading in readings:
        if other_is_gold:
            if _equal_no_percent(other, reading, string_match, gold_must_parse):
                return True
        elif _equal_no_percent(reading, other, string_match, gold_must_parse):
            return True
    return False


def is_equivalent(reference: str, candidate: str) -> bool:
    """Whether ``candidate`` is mathematically the same answer as ``reference`` (both bare answer
    strings, no ``\\boxed``): same rules as :func:`grade`; an unparseable reference is "not
    equivalent". May not return on adversarial input: run it in a RewardPool."""
    return _equal(reference, candidate, True, gold_must_parse=False)


def grade(completion: str, gold: str | int | float, string_match: bool = True) -> tuple[str | None, bool]:
    """Grade a completion against a gold answer.

    Args:
        completion: model output text (may contain a ``<think>`` block).
        gold: the dataset's answer (str/int/float, normalised by :func:`normalize_gold`).
        string_match: use the fast paths (equal :func:`normalize_answer_string` forms; exact arithmetic
            on plain numbers) before math-verify (default). False = math-verify decides every pair
            (after :func:`clean_answer` and the percent policy); used to test that the fast paths agree.

    Returns:
        ``(extracted, correct)``: the extracted final answer (``None`` if there is no boxed answer,
        then ``correct`` is False) and whether it matches the gold answer.

    Raises:
        TypeError / ValueError: bad gold answer (the pool reports these as status "error"), including a
            gold answer that math-verify cannot parse (when no fast path matched).

    No time limit of its own (see module docstring): run it in a RewardPool, or use :func:`grade_many`.
    """
    gold_text = normalize_gold(gold)
    extracted = extract_answer(completion)
    if extracted is None:
        return None, False
    return extracted, _equal(gold_text, extracted, string_match)


def equivalent(reference: str, candidate: str) -> bool:
    """Pool entry point ``"areal_cli.reward.math_grader:equivalent"`` (same as :func:`is_equivalent`)."""
    return is_equivalent(reference, candidate)


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


def grade_many(
    items: Sequence[tuple[str, str | int | float]],
    item_timeout_s: float = 5.0,
    budget_s: float | None = None,
) -> list[tuple[str | None, bool, str]]:
    """Grade a batch of ``(completion, gold)`` pairs in this process, each under a soft timeout.

    Args:
        items: ``(completion, gold)`` pairs, as for :func:`grade`.
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
        ValueError: ``item_timeout_s`` or ``budget_s`` not a positive number.
    """
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
        for completion, gold in items:
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
                _, correct = _run_limited(grade, limit, completion, gold)
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
    items: Sequence[tuple[str, str | int | float]],
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
    items: Sequence[tuple[str, str | int | float]],
    *,
    batch_size: int = 32,
    item_timeout_s: float | None = None,
    batch_fn: str = GRADE_BATCH_FN,
) -> list[GradedAnswer]:
    """Grade many ``(completion, gold)`` pairs through ``pool`` in batches, robust to hangs.

    Each batch is one pool call of :func:`grade_batch` with a soft per-answer timeout
    (``item_timeout_s``, default half the pool's ``timeout_s``) and a batch budget of 80 % of the pool's
    hard timeout. The items of a batch the pool could not finish (hard timeout: worker killed; worker
    died) and the items the budget skipped are graded again one per pool call with :func:`grade`, each
    under the pool's hard timeout; items with status "error" too (to get the message). So a hang costs
    one answer (status "timeout"), never the batch.

    Args:
        pool: an open RewardPool (any function; this calls ``grade_batch`` and ``grade`` by name).
        items: ``(completion, gold)`` pairs.
        batch_size: answers per pool call (>= 1).
        item_timeout_s: soft limit per answer inside a batch (> 0), default ``pool.timeout_s / 2``.
        batch_fn: the pool function for a batch, with :func:`grade_batch`'s arguments and return value.

    Returns:
        One :class:`GradedAnswer` per item, in order. Status "timeout" and "error" are graded wrong.

    Raises:
        ValueError: ``batch_size`` < 1 or a bad ``item_timeout_s``.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    soft = pool.timeout_s / 2 if item_timeout_s is None else item_timeout_s
    if not (isinstance(soft, (int, float)) and soft > 0 and math.isfinite(soft)):
        raise ValueError(f"item_timeout_s must be a positive number of seconds, got {item_timeout_s!r}")
    items = list(items)
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
        singles = pool.score_many([items[i] for i in redo], fn=GRADE_FN)
        for i, res in zip(redo, singles):
            if res.status == "ok":
                extracted, correct = res.value
                out[i] = GradedAnswer(extracted, bool(correct), "ok")
            else:
                out[i] = GradedAnswer(_safe_extract(items[i][0]), False, res.status, res.message)
    return [g for g in out if g is not None]


def _safe_extract(completion: Any) -> str | None:
    try:
        return extract_answer(completion)
    except Exception:
        return None

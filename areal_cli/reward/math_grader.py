"""Math answer extraction and grading with math-verify.

Extraction follows the convention of the AReaL / Qwen2.5-Math evaluation parser
(``evaluation/parser.py::extract_answer``): the final answer is the content of the LAST ``\\boxed{...}``
(or ``\\fbox{...}``), with nested braces matched. Reasoning models write their chain of thought in a
``<think>...</think>`` block; only the text after the last ``</think>`` counts, and a completion that
opened ``<think>`` but never closed it (truncated while thinking) has no answer. A completion without a
boxed answer is graded wrong (AReaL's fallbacks "the answer is", last number are deliberately not used:
the prompt asks for ``\\boxed{}``).

Equivalence is decided by math-verify 0.9.0 (``parse`` + ``verify``; Hugging Face, Apache-2.0), with its
internal signal-based timeouts disabled (``parsing_timeout=None, timeout_seconds=None``): they only
work on the main thread, and some inputs (towers of exponents) never return, so callers must run
:func:`grade` in :class:`areal_cli.reward.pool.RewardPool`, which enforces a hard timeout by killing
the worker process. As a safety net a normalised-string match also counts as correct.

Everything here is pure and picklable, so ``"areal_cli.reward.math_grader:grade"`` can be the pool's
function; its return value ``(extracted, correct)`` becomes reward 1.0 / 0.0.
"""

from __future__ import annotations

import math
import re

import math_verify.grader as _mv_grader
import math_verify.parser as _mv_parser
from math_verify import parse as _mv_parse
from math_verify import verify as _mv_verify

# We disable math-verify's own timeouts on purpose (see module docstring); silence the one-time
# warning it logs about that in every worker process.
_mv_parser.TIMEOUT_WARNING_SHOWN = True
_mv_grader.TIMEOUT_WARNING_SHOWN = True

_BOX_RE = re.compile(r"\\(?:boxed|fbox)")


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


def _match_braces(text: str, open_idx: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_idx``; ``\\{``/``\\}`` are literal. None if unbalanced."""
    depth = 0
    i = open_idx
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2  # escaped character (\{, \}, \\): never a grouping brace
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last well-formed ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (stripped).

    Nested braces are matched (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``). The brace-less form
    ``\\boxed 5`` yields the token up to the next whitespace or ``$``. A box that is not closed
    (truncated output) is skipped in favour of an earlier complete one. Empty boxes give ``None``.
    """
    for m in reversed(list(_BOX_RE.finditer(text))):
        j = m.end()
        if j < len(text) and text[j].isalpha():
            continue  # e.g. \boxedfoo: a different command
        k = j
        while k < len(text) and text[k] in " \t":
            k += 1
        if k < len(text) and text[k] == "{":
            close = _match_braces(text, k)
            if close is None:
                continue
            content = text[k + 1 : close].strip()
        elif k > j:  # "\boxed 5"
            tok = re.match(r"[^\s$]+", text[k:])
            content = tok.group(0).rstrip(".,;") if tok else ""
        else:
            continue
        if content:
            return content
    return None


def extract_answer(completion: str) -> str | None:
    """The final answer of a completion: last boxed content after any ``</think>`` (see module doc)."""
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a string, got {type(completion).__name__}")
    region = final_answer_region(completion)
    if region is None:
        return None
    return extract_boxed(region)


def normalize_gold(gold: str | int | float) -> str:
    """Gold answer as a string: ints as digits, integral floats without ``.0`` (27.0 -> "27"),
    strings stripped of whitespace and surrounding ``$``. Zero padding is kept ("025"): math-verify
    compares it numerically.

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


def normalize_answer_string(answer: str) -> str:
    """A canonical string for an answer, used for majority-vote grouping and as a fallback match.

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
    if _INT_RE.fullmatch(s):
        return str(int(s))
    if _DEC_RE.fullmatch(s):
        value = float(s)
        if value.is_integer():
            return str(int(value))
        return s.rstrip("0")
    return s


def _parse_boxed(answer: str) -> list:
    return _mv_parse("\\boxed{" + answer + "}", parsing_timeout=None)


def is_equivalent(reference: str, candidate: str) -> bool:
    """Whether ``candidate`` is mathematically the same answer as ``reference`` (both bare answer
    strings, no ``\\boxed``): math-verify ``verify(parse(reference), parse(candidate))`` or equal
    normalised strings. May not return on adversarial input: run it in a RewardPool."""
    if normalize_answer_string(reference) == normalize_answer_string(candidate):
        return True
    ref = _parse_boxed(reference)
    cand = _parse_boxed(candidate)
    if not ref or not cand:
        return False
    return bool(_mv_verify(ref, cand, timeout_seconds=None))


def grade(completion: str, gold: str | int | float, string_match: bool = True) -> tuple[str | None, bool]:
    """Grade a completion against a gold answer.

    Args:
        completion: model output text (may contain a ``<think>`` block).
        gold: the dataset's answer (str/int/float, normalised by :func:`normalize_gold`).
        string_match: accept equal :func:`normalize_answer_string` forms without calling math-verify
            (default; fast path). False = the verdict is math-verify's alone (used to test it).

    Returns:
        ``(extracted, correct)``: the extracted final answer (``None`` if there is no boxed answer,
        then ``correct`` is False) and whether it matches the gold answer.

    Raises:
        TypeError / ValueError: bad gold answer (the pool reports these as status "error"), including a
            gold answer that math-verify cannot parse (when there is no string match).

    May not return on adversarial input (math-verify timeouts are disabled): run it in a RewardPool.
    """
    gold_text = normalize_gold(gold)
    extracted = extract_answer(completion)
    if extracted is None:
        return None, False
    if string_match and normalize_answer_string(extracted) == normalize_answer_string(gold_text):
        return extracted, True
    gold_parsed = _parse_boxed(gold_text)
    if not gold_parsed:
        raise ValueError(f"gold answer {gold_text!r} could not be parsed by math-verify")
    pred_parsed = _parse_boxed(extracted)
    if not pred_parsed:
        return extracted, False
    return extracted, bool(_mv_verify(gold_parsed, pred_parsed, timeout_seconds=None))


def equivalent(reference: str, candidate: str) -> bool:
    """Pool entry point ``"areal_cli.reward.math_grader:equivalent"`` (same as :func:`is_equivalent`)."""
    return is_equivalent(reference, candidate)

"""Grading one answer: extract the final answer of a completion and compare it with the gold answer --
multiple choice, the comparison rules, the restatement check (package docstring, "Equivalence"). No time
limit of its own: run it in a RewardPool, or use :mod:`areal_cli.reward.math_grader.batch`."""

from __future__ import annotations

from typing import Any

from areal_cli.reward.math_grader.choice import choice_verdict
from areal_cli.reward.math_grader.comparison import equal_with_percent
from areal_cli.reward.math_grader.extraction import extract_answer
from areal_cli.reward.math_grader.normalize import normalize_gold
from areal_cli.reward.math_grader.restatement import restates_problem


def _equal(gold: str, candidate: str, string_match: bool = True, gold_must_parse: bool = True,
           problem: str | None = None) -> bool:
    """``candidate`` is the same answer as ``gold`` (both bare strings): multiple choice, then the percent
    policy and the comparison rules, then the restatement check (package docstring, "Equivalence")."""
    choice = choice_verdict(gold, candidate, problem)
    if choice is not None:
        return choice
    if not equal_with_percent(gold, candidate, string_match, gold_must_parse, problem):
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

    No time limit of its own (see package docstring): run it in a RewardPool, or use :func:`grade_many`.
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

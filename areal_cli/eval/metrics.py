"""Evaluation metrics: mean pass@1, unbiased pass@k, majority vote (maj@n).

All values are fractions in [0, 1] (AReaL prints them x100).

Sources:
- pass@k: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (HumanEval), eq. 1:
  pass@k = E_problems[1 - C(n-c, k) / C(n, k)], n samples per problem of which c are correct. It is the
  probability that at least one of k samples drawn without replacement from the n is correct; unbiased
  for the pass@k of the sampling policy. AReaL's ``evaluation/eval_and_aggregate.py`` uses the same
  estimator in product form ``1 - prod_{i=n-c+1..n} (1 - k/i)``. pass@1 reduces to c/n, so mean pass@1
  is the mean correctness of all samples ("average of 32 sampled responses" in the AReaL blog).
- maj@n (self-consistency, Wang et al. 2022, "Self-Consistency Improves Chain of Thought Reasoning"):
  the most frequent final answer among the n samples is the prediction; AReaL ``rm_maj_eval.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import comb
from typing import Callable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021, eq. 1).

    Computed exactly with integers/fractions (no overflow or cancellation), then converted to float.

    Args:
        n: samples drawn for the problem (>= 1).
        c: how many of them are correct (0 <= c <= n).
        k: budget (1 <= k <= n).

    Returns:
        probability in [0, 1]; 1.0 when ``n - c < k`` (every k-subset holds a correct sample).

    Raises:
        ValueError: arguments out of range.

    Example: n=4, c=2: pass@1 = 0.5, pass@2 = 1 - C(2,2)/C(4,2) = 1 - 1/6 = 5/6.
    """
    return float(_pass_at_k_exact(n, c, k))


def _pass_at_k_exact(n: int, c: int, k: int) -> Fraction:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n, c, k)):
        raise ValueError(f"pass_at_k needs integers, got n={n!r} c={c!r} k={k!r}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n, 1 <= k <= n; got n={n} c={c} k={k}")
    if n - c < k:
        return Fraction(1)
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def pass_k_values(n: int) -> list[int]:
    """The k reported for n samples: powers of two up to n (n=6 -> [1, 2, 4]; n=32 -> [1, ..., 32])."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks


def mean_pass_at_k(correct_counts: Sequence[int], n: int, k: int) -> float:
    """Mean of :func:`pass_at_k` over problems, each with ``n`` samples and ``correct_counts[i]`` correct.

    Raises:
        ValueError: no problems, or a count out of range.
    """
    if not correct_counts:
        raise ValueError("mean_pass_at_k needs at least one problem")
    return float(sum(_pass_at_k_exact(n, c, k) for c in correct_counts) / len(correct_counts))


@dataclass(frozen=True)
class MajorityVote:
    """Result of a majority vote over one problem's samples.

    Attributes:
        winner: sample index of the winning class's representative (its first member), or None when
            no sample has an extracted answer.
        answer: the representative's answer (None when no winner).
        correct: the representative's verdict (False when no winner).
        votes: size of the winning class.
        classes: ``[[sample indices], ...]`` in order of first appearance.
    """

    winner: int | None
    answer: str | None
    correct: bool
    votes: int
    classes: list[list[int]]


def majority_vote(
    answers: Sequence[str | None],
    verdicts: Sequence[bool],
    *,
    normalize: Callable[[str], str],
    equivalent: Callable[[str, str], bool] | None = None,
) -> MajorityVote:
    """Majority vote over one problem's extracted answers (maj@n).

    Grouping, sample by sample in index order (samples without an answer never vote):
    1. same ``normalize(answer)`` as a class member -> that class;
    2. graded correct, and some class's representative is graded correct -> that class (both match
       the gold answer, so they are the same answer);
    3. ``equivalent(representative, answer)`` (math-verify) true for a class, tried in order of class
       creation -> the first such class;
    4. otherwise a new class whose representative is this sample.

    The winner is the largest class. Ties are broken deterministically by the earliest first
    appearance: the class whose representative has the smallest sample index wins. The vote is
    correct iff the winner's representative was graded correct.

    Args:
        answers: extracted final answer per sample (None = no answer), length n.
        verdicts: correctness per sample, length n.
        normalize: answer -> canonical string (e.g. ``math_grader.normalize_answer_string``).
        equivalent: optional ``(representative, candidate) -> bool``; may be slow (pool call).

    Raises:
        ValueError: lengths differ.
    """
    if len(answers) != len(verdicts):
        raise ValueError(f"answers ({len(answers)}) and verdicts ({len(verdicts)}) differ in length")
    classes: list[list[int]] = []
    keys: list[set[str]] = []
    for i, ans in enumerate(answers):
        if ans is None:
            continue
        key = normalize(ans)
        target = next((ci for ci, ks in enumerate(keys) if key in ks), None)
        if target is None and verdicts[i]:
            target = next((ci for ci, members in enumerate(classes) if verdicts[members[0]]), None)
        if target is None and equivalent is not None:
            for ci, members in enumerate(classes):
                rep = answers[members[0]]
                assert rep is not None
                if equivalent(rep, ans):
                    target = ci
                    break
        if target is None:
            classes.append([i])
            keys.append({key})
        else:
            classes[target].append(i)
            keys[target].add(key)
    if not classes:
        return MajorityVote(winner=None, answer=None, correct=False, votes=0, classes=[])
    # max() returns the first maximal element: the earliest-created class wins ties.
    best = max(range(len(classes)), key=lambda ci: len(classes[ci]))
    rep = classes[best][0]
    return MajorityVote(
        winner=rep, answer=answers[rep], correct=bool(verdicts[rep]), votes=len(classes[best]), classes=classes
    )

"""Evaluation metrics: mean pass@1 with its standard error, unbiased pass@k, majority vote (maj@k),
and per-group breakdowns (LiveCodeBench by difficulty / platform).

All values are fractions in [0, 1] (AReaL prints them x100). Greedy accuracy needs no helper of its
own: it is ``mean_pass_at_k(counts, 1, 1)`` over a one-sample temperature-0 run (AReaL
``eval_and_aggregate.py`` computes ``greedy_acc`` as pass@1 of the seed-0 greedy file).

Sources:
- pass@k: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (HumanEval), eq. 1:
  pass@k = E_problems[1 - C(n-c, k) / C(n, k)], n samples per problem of which c are correct. It is the
  probability that at least one of k samples drawn without replacement from the n is correct; unbiased
  for the pass@k of the sampling policy. AReaL's ``evaluation/eval_and_aggregate.py`` uses the same
  estimator in product form ``1 - prod_{i=n-c+1..n} (1 - k/i)``. pass@1 reduces to c/n, so mean pass@1
  is the mean correctness of all samples ("average of 32 sampled responses" in the AReaL blog).
- maj@n (self-consistency, Wang et al. 2022, "Self-Consistency Improves Chain of Thought Reasoning"):
  the most frequent final answer among the n samples is the prediction; AReaL ``rm_maj_eval.py``.
  maj@k for k < n votes over the FIRST k samples (AReaL ``eval_maj_k_metrics``: ``sample["pred"][:k]``).
- standard error of mean pass@1: over problems, as recommended by Miller 2024, "Adding Error Bars to
  Evals: A Statistical Approach to Language Model Evaluations" (arXiv:2411.00640): with several samples
  per question, average them per question, then take the CLT standard error over questions.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import comb, nan, sqrt
from typing import Any, Callable, Literal, Mapping, Sequence


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


def maj_at_k(
    answers: Sequence[str | None],
    verdicts: Sequence[bool],
    k: int,
    *,
    normalize: Callable[[str], str],
    equivalent: Callable[[str, str], bool] | None = None,
) -> MajorityVote:
    """maj@k for one problem: :func:`majority_vote` over the first ``k`` samples (indices 0..k-1).

    This is AReaL's definition (``eval_and_aggregate.eval_maj_k_metrics`` votes over
    ``sample["pred"][:k]``); AReaL reports only maj@32 with 32 samples, i.e. over all samples, where
    the choice does not matter. For k < n it is one draw of k samples, not an average over all
    k-subsets (no closed form exists for majority voting; C(32, 8) ~ 1e7 subsets is too many to
    enumerate), so it has more variance than :func:`pass_at_k`. Samples are i.i.d., so the first k
    are an unbiased draw as long as sample indices are not chosen after seeing the outputs.

    Raises:
        ValueError: ``k`` not in ``1..len(answers)``, or lengths differ.
    """
    if len(answers) != len(verdicts):
        raise ValueError(f"answers ({len(answers)}) and verdicts ({len(verdicts)}) differ in length")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(answers):
        raise ValueError(f"maj_at_k needs 1 <= k <= n = {len(answers)}, got k={k!r}")
    return majority_vote(answers[:k], verdicts[:k], normalize=normalize, equivalent=equivalent)


def _check_correct(correct: Sequence[Sequence[bool]]) -> None:
    if len(correct) == 0:
        raise ValueError("need at least one problem")
    for i, row in enumerate(correct):
        if len(row) == 0:
            raise ValueError(f"problem {i}: no samples")


def _mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, nan
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, sqrt(var / len(values))


def pass1_mean_and_stderr(
    correct: Sequence[Sequence[bool]], *, over: Literal["problems", "samples"] = "problems"
) -> tuple[float, float]:
    """Mean pass@1 and its standard error.

    ``correct[i][j]`` is the verdict of sample j of problem i. The mean is the mean over problems of
    each problem's fraction correct c_i/n_i (AReaL's ``sample_pass@1``: mean of 32 samples; equal to
    the mean of all verdicts when every n_i is equal).

    Standard error (``over``):
      - ``"problems"`` (default): ``s / sqrt(P)`` with s the sample standard deviation (ddof 1) of the
        P per-problem means p_i = c_i/n_i. It is the error of the score as an estimate of the policy's
        accuracy on the population the benchmark's problems were drawn from, and includes the
        sampling noise left after averaging n samples per problem (the per-question-mean estimator of
        Miller 2024, "Adding Error Bars to Evals", arXiv:2411.00640). This is the error bar to
        compare two models or checkpoints on the same benchmark with. Problems may have different n_i.
      - ``"samples"``: ``s / sqrt(n)`` with s the standard deviation (ddof 1) of the n per-run accuracies
        a_j = mean_i correct[i][j] (run j = the j-th sample of every problem, e.g. one vLLM seed). It
        measures seed-to-seed noise only, the problem set held fixed; it is smaller, and the right
        one to ask "would rerunning with other seeds change the number?". Needs equal n_i.

    Returns:
        ``(mean, stderr)``, fractions; stderr is NaN when there are fewer than 2 problems (or runs).

    Raises:
        ValueError: no problems, a problem without samples, unknown ``over``, or (``"samples"``)
            unequal sample counts.

    Example: ``[[1,1,0,0],[1,1,1,1],[0,0,0,0]]`` -> p = (0.5, 1, 0), mean 0.5, stderr over problems
    0.5/sqrt(3) = 0.2887; runs a = (2/3, 2/3, 1/3, 1/3), stderr over samples sqrt(1/27)/2 = 0.0962.
    """
    _check_correct(correct)
    if over == "problems":
        return _mean_and_stderr([sum(map(bool, row)) / len(row) for row in correct])
    if over == "samples":
        sizes = {len(row) for row in correct}
        if len(sizes) != 1:
            raise ValueError(f"stderr over samples needs the same number of samples per problem, got {sorted(sizes)}")
        (n,) = sizes
        runs = [sum(bool(row[j]) for row in correct) / len(correct) for j in range(n)]
        return _mean_and_stderr(runs)
    raise ValueError(f"over must be 'problems' or 'samples', got {over!r}")


MISSING_GROUP = "unknown"


def breakdown(
    records: Sequence[Mapping[str, Any]], keys: Sequence[str] = ("difficulty", "platform")
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per-group metrics, e.g. LiveCodeBench by difficulty and by platform.

    Args:
        records: one per problem: ``{"correct": [bool, ...] (verdict per sample, >= 1),
            "meta": {key: value, ...}}`` (other fields ignored). A record whose ``meta`` lacks a key,
            or has it as None, is counted under the group ``"unknown"``; values are grouped by ``str``.
        keys: meta fields to group by, each independently (not their cross product).

    Returns:
        ``{key: {value: {"n_problems", "n_samples", "pass@1", "stderr", "pass@2", ..., "pass@K"}}}``:
        values sorted by name; ``n_samples`` is the smallest per-problem sample count n_min in the
        group; pass@1 and stderr are :func:`pass1_mean_and_stderr` (stderr over problems; None for a
        one-problem group, so the dict stays valid JSON); pass@k for k in :func:`pass_k_values` (n_min)
        is the mean over the group's problems of :func:`pass_at_k` with each problem's own n.

    Raises:
        ValueError: a record without a ``correct`` list of at least one verdict, or ``meta`` not a mapping.
    """
    groups: dict[str, dict[str, list[list[bool]]]] = {k: {} for k in keys}
    for i, rec in enumerate(records):
        verdicts = rec.get("correct")
        if not isinstance(verdicts, (list, tuple)) or len(verdicts) == 0:
            raise ValueError(f"record {i}: 'correct' must be a non-empty list of verdicts")
        meta = rec.get("meta") or {}
        if not isinstance(meta, Mapping):
            raise ValueError(f"record {i}: 'meta' must be a mapping, got {type(meta).__name__}")
        for key in keys:
            value = meta.get(key)
            name = MISSING_GROUP if value is None else str(value)
            groups[key].setdefault(name, []).append([bool(v) for v in verdicts])
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key, by_value in groups.items():
        out[key] = {}
        for name in sorted(by_value):
            rows = by_value[name]
            n_min = min(len(r) for r in rows)
            mean, stderr = pass1_mean_and_stderr(rows)
            entry: dict[str, Any] = {
                "n_problems": len(rows),
                "n_samples": n_min,
                "pass@1": mean,
                "stderr": stderr if len(rows) > 1 else None,
            }
            for k in pass_k_values(n_min)[1:]:
                entry[f"pass@{k}"] = float(sum(_pass_at_k_exact(len(r), sum(r), k) for r in rows) / len(rows))
            out[key][name] = entry
    return out

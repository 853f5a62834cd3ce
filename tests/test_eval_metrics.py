"""Claims: pass@k is the unbiased estimator 1 - C(n-c,k)/C(n,k) (Chen et al. 2021) and matches
hand-computed values; maj@n takes the largest answer class, with ties broken by earliest appearance, and
maj@k votes over the first k samples (AReaL); the standard error of mean pass@1 is over problems (or over
runs) as hand-computed; breakdown groups problems by meta fields with per-group pass@1/stderr/pass@k."""

from __future__ import annotations

import math
from math import comb

import pytest

from areal_cli.eval.metrics import (
    breakdown,
    maj_at_k,
    majority_vote,
    mean_pass_at_k,
    pass1_mean_and_stderr,
    pass_at_k,
    pass_k_values,
)
from areal_cli.reward.math_grader import normalize_answer_string


def test_pass_at_k_matches_hand_computed_values():
    assert pass_at_k(4, 2, 1) == 0.5
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6, abs=1e-15)  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert pass_at_k(4, 2, 4) == 1.0  # n - c < k
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(8, 1, 4) == pytest.approx(0.5)  # 1 - C(7,4)/C(8,4) = 1 - 35/70
    assert pass_at_k(32, 3, 8) == pytest.approx(1 - comb(29, 8) / comb(32, 8))


def test_pass_at_k_equals_areal_product_form():
    # AReaL eval_and_aggregate.py: 1 - prod_{i=n-c+1..n} (1 - k/i)
    for n in (1, 4, 16, 32):
        for c in range(n + 1):
            for k in pass_k_values(n):
                prod = 1.0
                for i in range(n - c + 1, n + 1):
                    prod *= 1 - k / i
                assert pass_at_k(n, c, k) == pytest.approx(1 - prod, abs=1e-12)


def test_pass_at_1_is_mean_correctness_and_mean_over_problems():
    assert mean_pass_at_k([2, 4, 0], 4, 1) == pytest.approx(0.5)
    assert mean_pass_at_k([2, 4], 4, 2) == pytest.approx((5 / 6 + 1) / 2)


def test_pass_k_values_are_powers_of_two_up_to_n():
    assert pass_k_values(1) == [1]
    assert pass_k_values(6) == [1, 2, 4]
    assert pass_k_values(32) == [1, 2, 4, 8, 16, 32]


@pytest.mark.parametrize("args", [(0, 0, 1), (4, 5, 1), (4, 2, 0), (4, 2, 5), (4, -1, 1)])
def test_pass_at_k_rejects_out_of_range(args):
    with pytest.raises(ValueError):
        pass_at_k(*args)


def vote(answers, verdicts, equivalent=None):
    return majority_vote(answers, verdicts, normalize=normalize_answer_string, equivalent=equivalent)


def test_majority_vote_picks_largest_class():
    v = vote(["5", "3", "3", None, "3"], [True, False, False, False, False])
    assert (v.winner, v.answer, v.correct, v.votes) == (1, "3", False, 3)
    assert v.classes == [[0], [1, 2, 4]]


def test_majority_vote_tie_goes_to_earliest_first_appearance():
    v = vote(["3", "5", "5", "3"], [False, True, True, False])
    assert (v.answer, v.correct, v.votes) == ("3", False, 2)
    v = vote(["5", "3", "3", "5"], [True, False, False, True])
    assert (v.answer, v.correct, v.votes) == ("5", True, 2)


def test_majority_vote_groups_normalised_strings_and_correct_answers():
    # "025" and "25" normalise alike; "\\frac{1}{2}" and "0.5" both graded correct -> one class
    v = vote(["025", "25", "\\frac{1}{2}", "0.5", "0.50"], [False, False, True, True, True])
    assert v.classes == [[0, 1], [2, 3, 4]] and v.correct


def test_majority_vote_uses_equivalence_for_wrong_answers():
    eq = lambda a, b: {a, b} == {"\\frac{1}{2}", "0.5"}  # noqa: E731
    answers, verdicts = ["7", "7", "\\frac{1}{2}", "0.5", "4"], [True, True, False, False, False]
    assert vote(answers, verdicts).correct  # without equivalence: "7" (2) beats each singleton
    v = vote(answers + ["0.5"], verdicts + [False], equivalent=eq)
    assert (v.answer, v.votes, v.correct) == ("\\frac{1}{2}", 3, False)


def test_majority_vote_without_any_answer_is_wrong():
    v = vote([None, None], [False, False])
    assert (v.winner, v.correct, v.votes) == (None, False, 0)
    with pytest.raises(ValueError):
        vote(["1"], [True, False])


def test_maj_at_k_votes_over_the_first_k_samples():
    answers = ["1", "1", "2", "2", "2"]
    verdicts = [True, True, False, False, False]
    assert maj_at_k(answers, verdicts, 2, normalize=normalize_answer_string).correct
    assert maj_at_k(answers, verdicts, 4, normalize=normalize_answer_string).correct  # 2-2 tie: earliest wins
    v = maj_at_k(answers, verdicts, 5, normalize=normalize_answer_string)
    assert (v.answer, v.votes, v.correct) == ("2", 3, False)
    assert v == vote(answers, verdicts)  # maj@n is maj_at_k with k = n
    for k in (0, 6):
        with pytest.raises(ValueError):
            maj_at_k(answers, verdicts, k, normalize=normalize_answer_string)


HAND = [[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]


def test_pass1_stderr_over_problems_matches_hand_computation():
    # per-problem p = (0.5, 1, 0): mean 0.5, sample sd (ddof 1) = sqrt((0 + 0.25 + 0.25) / 2) = 0.5
    mean, se = pass1_mean_and_stderr(HAND)
    assert mean == 0.5
    assert se == pytest.approx(0.5 / math.sqrt(3), abs=1e-15)


def test_pass1_stderr_over_samples_matches_hand_computation():
    # per-run accuracy a = (2/3, 2/3, 1/3, 1/3): mean 0.5, sd = sqrt(4 * (1/6)^2 / 3) = sqrt(1/27), se = sd / 2
    mean, se = pass1_mean_and_stderr(HAND, over="samples")
    assert mean == pytest.approx(0.5)
    assert se == pytest.approx(math.sqrt(1 / 27) / 2, abs=1e-15)


def test_pass1_mean_weights_problems_equally_with_unequal_sample_counts():
    mean, se = pass1_mean_and_stderr([[True], [True, False, False, False]])
    assert mean == pytest.approx((1 + 0.25) / 2)
    assert se == pytest.approx(abs(1 - 0.25) / 2, abs=1e-15)  # two values: sd = |a - b| / sqrt(2)
    with pytest.raises(ValueError):
        pass1_mean_and_stderr([[True], [True, False]], over="samples")


def test_pass1_stderr_undefined_for_one_problem_and_errors_on_bad_input():
    mean, se = pass1_mean_and_stderr([[True, False]])
    assert mean == 0.5 and math.isnan(se)
    for bad in ([], [[True], []]):
        with pytest.raises(ValueError):
            pass1_mean_and_stderr(bad)
    with pytest.raises(ValueError):
        pass1_mean_and_stderr(HAND, over="runs")


def test_breakdown_groups_by_each_meta_key():
    records = [
        {"correct": [True, True, False, False], "meta": {"difficulty": "easy", "platform": "atcoder"}},
        {"correct": [True, True, True, True], "meta": {"difficulty": "easy", "platform": "leetcode"}},
        {"correct": [False, False, False, True], "meta": {"difficulty": "hard", "platform": "atcoder"}},
        {"correct": [False, False, False, False], "meta": {"platform": "codeforces"}},
    ]
    out = breakdown(records)
    assert list(out) == ["difficulty", "platform"]
    assert list(out["difficulty"]) == ["easy", "hard", "unknown"]
    easy = out["difficulty"]["easy"]
    assert (easy["n_problems"], easy["n_samples"], easy["pass@1"]) == (2, 4, 0.75)
    assert easy["stderr"] == pytest.approx(0.5 / math.sqrt(2) / math.sqrt(2))  # p = (0.5, 1): sd 0.5/sqrt(2)
    assert easy["pass@2"] == pytest.approx((5 / 6 + 1) / 2)  # 1 - C(2,2)/C(4,2) = 5/6
    assert easy["pass@4"] == 1.0
    hard = out["difficulty"]["hard"]
    assert hard["pass@1"] == 0.25 and hard["pass@2"] == pytest.approx(0.5) and hard["stderr"] is None
    atcoder = out["platform"]["atcoder"]
    assert (atcoder["n_problems"], atcoder["pass@1"]) == (2, pytest.approx(0.375))
    assert out["platform"]["codeforces"]["pass@4"] == 0.0


def test_breakdown_pass_at_k_uses_smallest_sample_count_in_group():
    records = [{"correct": [True, False], "meta": {"d": 1}}, {"correct": [False] * 4, "meta": {"d": 1}}]
    out = breakdown(records, keys=("d",))
    g = out["d"]["1"]
    assert g["n_samples"] == 2 and "pass@4" not in g
    assert g["pass@2"] == pytest.approx((1 + 0) / 2)


def test_breakdown_rejects_records_without_verdicts():
    with pytest.raises(ValueError, match="record 1"):
        breakdown([{"correct": [True], "meta": {}}, {"correct": [], "meta": {}}])
    with pytest.raises(ValueError, match="record 0"):
        breakdown([{"correct": [True], "meta": ["easy"]}])

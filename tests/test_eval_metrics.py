"""Claims: pass@k is the unbiased estimator 1 - C(n-c,k)/C(n,k) (Chen et al. 2021) and matches
hand-computed values; maj@n takes the largest answer class, with ties broken by earliest appearance."""

from __future__ import annotations

from math import comb

import pytest

from areal_cli.eval.metrics import majority_vote, mean_pass_at_k, pass_at_k, pass_k_values
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

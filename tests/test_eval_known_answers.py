"""Claim (known-answer proof): completions that state each dataset's own gold answer in \\boxed{} grade
as correct on every real evaluation file (aime24, aime25, amc23, math_500: pass@1 = maj@n = 1.0), and
completions without a boxed answer grade as wrong; grading runs through the process pool with the hard
per-answer timeout, as `areal eval` does."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from areal_cli.eval.datasets import load_datasets
from areal_cli.eval.runner import GRADE_FN, grade_completions, summarize
from areal_cli.reward.pool import RewardPool

pytestmark = pytest.mark.multiproc  # every test here starts processes

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DATA = SHARED / "data" / "math"
NAMES = ["aime24", "aime25", "amc23", "math_500"]


@pytest.fixture(scope="module")
def problems():
    return load_datasets(NAMES, DATA)


@pytest.fixture(scope="module")
def pool():
    with RewardPool(GRADE_FN, n_workers=2, timeout_s=10.0) as p:
        yield p


def records(problems, make_text, n=1):
    return [
        {"dataset": ds, "problem_id": p.id, "sample_index": i, "text": make_text(p), "gold": p.answer}
        for ds, ps in problems.items()
        for p in ps
        for i in range(n)
    ]


def test_own_answers_score_pass_at_1_of_one_on_all_four_real_files(problems, pool):
    recs = records(problems, lambda p: f"The answer is \\boxed{{{p.answer}}}")
    assert len(recs) == 600
    t0 = time.monotonic()
    graded = grade_completions(recs, pool=pool)
    elapsed = time.monotonic() - t0
    wrong = [(g["dataset"], g["problem_id"], g["gold"], g["grader_status"]) for g in graded if not g["correct"]]
    assert wrong == []
    results = summarize(graded, pool=pool)
    for ds in NAMES:
        assert results[ds]["pass@1"] == 1.0
        assert results[ds]["maj@1"] == 1.0
        assert results[ds]["n_grader_timeouts"] == 0 and results[ds]["n_grader_errors"] == 0
    assert {ds: results[ds]["n_problems"] for ds in NAMES} == {"aime24": 30, "aime25": 30, "amc23": 40, "math_500": 500}
    print(f"graded 600 known answers in {elapsed:.2f} s ({600 / elapsed:.0f} answers/s)")


@pytest.mark.slow
def test_math_verify_alone_parses_and_accepts_every_gold_answer(problems, pool):
    # same proof with the normalised-string fast path off: every gold answer of the four files goes
    # through math-verify parse + verify (also measures the grader's throughput on real answers).
    args = [(f"The answer is \\boxed{{{p.answer}}}", p.answer, False) for ps in problems.values() for p in ps]
    t0 = time.monotonic()
    results = pool.score_many(args)
    elapsed = time.monotonic() - t0
    bad = [(a[1], r.status, r.message) for a, r in zip(args, results) if r.reward != 1.0]
    assert bad == []
    print(f"math-verify graded 600 answers in {elapsed:.2f} s ({600 / elapsed:.0f} answers/s, 2 workers)")


def test_original_published_answer_values_also_grade_correct(problems, pool):
    # amc23 publishes 27.0 and aime25 int 70: a model writing "27.0" or the bare int is right too;
    # a completion inside a think block plus final answer is graded on the final answer.
    recs = records({k: problems[k] for k in ("aime24", "aime25", "amc23")},
                   lambda p: f"<think>guess \\boxed{{-1}}</think>So the answer is $\\boxed{{{p.answer}.0}}$.")
    graded = grade_completions(recs, pool=pool)
    assert all(g["correct"] for g in graded), [g["gold"] for g in graded if not g["correct"]][:5]


def test_completions_without_a_final_answer_score_zero(problems, pool):
    """An unfinished completion has no answer, even when the gold value appears in it (the last number of a
    truncated completion is not an answer)."""
    recs = records({"aime24": problems["aime24"]}, lambda p: f"Let me work towards {p.answer} step by step and then", n=2)
    graded = grade_completions(recs, pool=pool)
    res = summarize(graded)["aime24"]
    assert (res["pass@1"], res["pass@2"], res["maj@2"]) == (0.0, 0.0, 0.0)
    assert res["n_no_answer"] == 60 and res["n_samples"] == 2


def test_mixed_samples_give_hand_computed_pass_at_k_and_maj(pool):
    # one problem, n = 4, c = 2: pass@1 = 0.5, pass@2 = 5/6, pass@4 = 1; the wrong answers "1/2" and
    # "0.5" are the same number, so by math-verify equivalence they outvote... nothing: 2 vs 2, tie ->
    # earliest class wins, which is the correct "7" at index 0.
    texts = ["\\boxed{7}", "\\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "\\boxed{7.0}"]
    recs = [{"dataset": "d", "problem_id": "p", "sample_index": i, "text": t, "gold": "7"} for i, t in enumerate(texts)]
    graded = grade_completions(recs, pool=pool)
    assert [g["correct"] for g in graded] == [True, False, False, True]
    res = summarize(graded, pool=pool)["d"]
    assert res["pass@1"] == 0.5 and res["pass@2"] == pytest.approx(5 / 6) and res["pass@4"] == 1.0
    assert res["maj@4"] == 1.0
    # now the wrong number appears first: it wins the 2-2 tie through math-verify equivalence
    recs2 = [dict(r, sample_index=(i - 1) % 4) for i, r in enumerate(recs)]
    res2 = summarize(grade_completions(recs2, pool=pool), pool=pool)["d"]
    assert res2["maj@4"] == 0.0 and res2["pass@1"] == 0.5

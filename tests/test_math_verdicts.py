"""Claims: the math grader's verdicts for each class of "Grading beyond every anchor" agree with a careful
grader on a table of cases written for this repository (tests/data/math_verdict_cases.jsonl, each class with
right and wrong answers): a clearly stated final answer without a box is graded and the last number of an
unfinished completion is not; inequality and interval notation, a multiple-choice letter and its option text
are the same answer; an answer that restates the problem, a unit the problem fixes, numbers beyond float
precision are refused; an answer given only inside the think block is no answer; ", " is no thousands
separator; a decimal comma, boxes joined by words or by \\(..\\), currency and bare units are read. The
problem reaches the grader through every entry point; the Math-Verify suite benchmark reads a tests folder
with ast and keeps the bad-input contract."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest
import sympy

from areal_cli.reward.math_grader import (
    GRADE_FN,
    choice_verdict,
    decimal_comma_value,
    exact_value,
    extract_answer,
    grade,
    grade_in_pool,
    grade_many,
    is_equivalent,
    relation_as_set,
    restates_problem,
    stated_answer,
    unit_asked,
)

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests" / "data" / "math_verdict_cases.jsonl"
ROWS = [json.loads(line) for line in TABLE.read_text(encoding="utf-8").splitlines() if line.strip()]
CLASSES = {
    "no_box", "interval_inequality", "multiple_choice", "restates_problem", "fixed_unit", "exact_values",
    "think_only", "comma_space", "decimal_comma", "joined_boxes", "currency_units",
}


def test_table_has_every_class_with_right_and_wrong_answers():
    counts = Counter(r["class"] for r in ROWS)
    assert set(counts) == CLASSES, set(counts) ^ CLASSES
    assert all(n >= 6 for n in counts.values()), counts
    for cls in CLASSES:
        assert {r["verdict"] for r in ROWS if r["class"] == cls} == {True, False}, cls
    assert all(set(r) == {"class", "completion", "gold", "problem", "verdict", "why"} for r in ROWS)
    assert len({(r["completion"], r["gold"], r["problem"]) for r in ROWS}) == len(ROWS)  # no duplicates


@pytest.mark.parametrize("row", ROWS, ids=[f"{i:03d}-{r['class']}" for i, r in enumerate(ROWS)])
def test_verdict_agrees_with_the_careful_verdict(row):
    _, correct = grade(row["completion"], row["gold"], problem=row["problem"])
    assert correct is row["verdict"], row["why"]
    # the fast paths change no verdict
    assert grade(row["completion"], row["gold"], False, row["problem"])[1] is row["verdict"], row["why"]


# ------------------------------------------------------------------ the rules, one by one
@pytest.mark.parametrize("completion,expected", [
    ("Final answer: 12", "12"),
    ("The final answer is $\\frac{3}{4}$.", "\\frac{3}{4}"),
    ("Answer: t = 2 + 3 = 5", "t = 2 + 3 = 5"),  # read whole: math-verify compares the last side
    ("So the answer is 8 apples.", "8"),
    ("**Final Answer**\n\n\\[ 2\\sqrt{3} \\]", "2\\sqrt{3}"),
    ("We check every case above and none fails, so the count stands.\n\n**31**", "31"),
    ("The side is 5 and so the area is 25. Therefore, the perimeter of the square is 20.", "20"),
    ("$y = 3$ So, the pair that works is $(2, 3)$.", "(2, 3)"),
    ("The roots are $1$ and $-4$.", "1, -4"),
    ("$28$ %", "28\\%"),
    ("the value is not 7, it is 9", "9"),
    ("Evelyn", "Evelyn"),
    ("Final Answer: The final answer is $9$. I hope it is correct.", "9"),
    ("Thus the total is 42. <|im_start|>user\nWhat is 2+2?", "42"),
    ("Final answer: 4. Let me verify the case n = 0, which needs", "4"),
])
def test_stated_answers_without_a_box(completion, expected):
    assert extract_answer(completion) == expected


@pytest.mark.parametrize("completion", [
    "We have 4 + 5 = 9 and then 9 * 2 = 18, so next we",  # truncated: not the last number
    "We have 4 + 5 = 9 and then 9 * 2 = 18. The rest of the argument is similar.",  # no statement
    "I am not sure.",
    "Is the answer 6? Let me verify that carefully by substituting it back into both equations.",
    "The answer is",
    "The answer is the number of ways to choose them.",
    "<think>Final answer: 5</think>",
    "<think>so \\boxed{5}",
    "So the answer is $\\boxed{",
    "So the answer is 4. Wait, the case n = 0 also needs",  # cut off while revising
])
def test_no_stated_answer(completion):
    assert extract_answer(completion) is None


def test_a_minerva_statement_after_the_last_box_is_the_final_answer():
    text = "First \\boxed{7} for the half year. Then in total 12. Final Answer: The final answer is $12$. I hope it is correct."
    assert extract_answer(text) == "12"
    assert extract_answer("The final answer is $12$. I hope it is correct. Check: \\boxed{7}") == "7"


def test_stated_answer_is_linear_on_degenerate_text():
    for text in [" " * 100_000, "\n" * 100_000, "$" * 100_000, "\\[" * 30_000, "The answer is " * 10_000,
                 "I hope it is correct. " * 5_000, "final answer is " * 10_000 + "I hope it is correct",
                 "1,000 " * 20_000 + ".", "**" * 50_000, "\\boxed{5} " + "final answer is x" * 20_000 + " I hope it is correct"]:
        t0 = time.perf_counter()
        extract_answer(text)
        assert time.perf_counter() - t0 < 1.0, text[:40]
    assert stated_answer("Thus the answer is 3.") == "3"


def test_the_last_side_of_an_answer_chain_is_compared():
    assert grade("Answer: t = 2 + 3 = 5", "5")[1] and not grade("Answer: t = 2 + 3 = 6", "5")[1]
    assert grade("So the sum of the terms = 3 + 4 = 7.", "7")[1]
    assert grade("The plane is 2x - y + 3z - 1 = 0.", "2x - y + 3z - 1 = 0")[1]


def test_decimal_comma_and_thousands():
    assert decimal_comma_value("12,5") == Fraction(25, 2)
    assert decimal_comma_value("0,125") == Fraction(1, 8)
    assert decimal_comma_value("1,234") is None and decimal_comma_value("1, 5") is None
    assert is_equivalent("7.25", "7,25") and not is_equivalent("7.25", "7,26")
    assert not is_equivalent("12345", "12, 345") and is_equivalent("12345", "12{, }345")


def test_exact_values():
    fact = sympy.factorial(30)
    assert exact_value(1 / fact) == Fraction(1, int(fact))
    assert exact_value(sympy.Integer(2) ** -70) == Fraction(1, 2**70)
    assert exact_value(sympy.sqrt(2)) is None and exact_value(sympy.Float(0.5)) is None
    assert exact_value(sympy.Symbol("x") + 1) is None
    assert exact_value(sympy.Pow(10, 10**9, evaluate=False)) is None  # too large: left to math-verify
    assert not is_equivalent("\\frac{1}{2004!}", "\\frac{1}{2006!}")
    assert is_equivalent("\\frac{1}{3}", "0.3333333")  # a decimal is still compared by rounding


def test_relation_as_set():
    x = sympy.Symbol("x", real=True)
    assert relation_as_set(sympy.And(x > 3, x <= 4)) == sympy.Interval.Lopen(3, 4)
    assert relation_as_set(sympy.FiniteSet(x < 1, x > 6)) == sympy.Union(sympy.Interval.open(-sympy.oo, 1),
                                                                          sympy.Interval.open(6, sympy.oo))
    assert relation_as_set(sympy.Eq(x, 5)) is None and relation_as_set(sympy.Integer(3)) is None
    assert is_equivalent("(-\\infty, 0]", "x \\le 0") and is_equivalent("x \\le 0", "(-\\infty, 0]")
    assert not is_equivalent("(-\\infty, 0)", "x \\le 0")


def test_unit_asked_and_the_percent_readings():
    assert unit_asked("What percent of the students passed?") == "percent"
    assert unit_asked("Give your answer to the nearest whole percent.") == "percent"
    assert unit_asked("Express your answer as a common fraction.") == "fraction"
    assert unit_asked("What is 20 percent of 50?") is None and unit_asked(None) is None
    assert is_equivalent("35\\%", "0.35") and not is_equivalent("35\\%", "0.35", "What percent is left?")
    assert is_equivalent("35\\%", "35", "What percent is left?")
    assert not is_equivalent("0.35", "35\\%", "Write the share as a decimal.")


def test_choice_verdict():
    problem = "Pick one. (A) $4$ (B) $\\frac{1}{2}$ (C) $7$ (D) $9$ (E) none"
    assert choice_verdict("B", "\\frac{1}{2}", problem) is True
    assert choice_verdict("B", "0.5", problem) is True
    assert choice_verdict("\\frac12", "(B)", problem) is True
    assert choice_verdict("B", "(B) 7", problem) is False
    assert choice_verdict("B", "C", problem) is False
    assert choice_verdict("B", "(B)", None) is True
    assert choice_verdict("7", "(C) 7", None) is True  # letter with text, no options: the text decides
    assert choice_verdict("5", "12", problem) is None  # not a choice comparison
    assert choice_verdict("5", "C = 5", problem) is None  # an equation, not a letter
    assert choice_verdict("A", "(A) or (C)", None) is None  # two letters: not one choice


def test_restates_problem():
    problem = "Expand $(a+1)(a-1)$ and simplify $\\frac{6}{8}$."
    assert restates_problem("(a+1)(a-1)", "a^2-1", problem)
    assert restates_problem("\\dfrac{6}{8}", "\\frac{3}{4}", problem)
    assert not restates_problem("a^2-1", "a^2-1", problem)
    assert not restates_problem("-1+a^2", "a^2-1", problem)
    assert not restates_problem("(a+1)(a-1)", "a^2-1", None)
    assert not restates_problem("6", "6", "There are 6 cats; and $6+0$ too.")


# ------------------------------------------------------------------ the problem through every entry point
def test_the_problem_reaches_the_grader_everywhere():
    problem, completion, gold = "Factor $y^2+5y+6$.", "\\boxed{y^2+5y+6}", "(y+2)(y+3)"
    assert grade(completion, gold) == ("y^2+5y+6", True)
    assert grade(completion, gold, problem=problem) == ("y^2+5y+6", False)
    assert grade_many([(completion, gold), (completion, gold, problem)]) == [
        ("y^2+5y+6", True, "ok"), ("y^2+5y+6", False, "ok")]
    assert not is_equivalent(gold, "y^2+5y+6", problem)
    with pytest.raises(TypeError):
        grade(completion, gold, problem)  # the problem in string_match's place is refused
    with pytest.raises(TypeError):
        grade(completion, gold, problem=["not", "text"])
    with pytest.raises(ValueError):
        grade_many([(completion,)])


@pytest.mark.multiproc
@pytest.mark.slow
def test_the_problem_reaches_pool_workers_and_regrades():
    from areal_cli.reward.pool import RewardPool

    problem, completion, gold = "Factor $y^2+5y+6$.", "\\boxed{y^2+5y+6}", "(y+2)(y+3)"
    with RewardPool(GRADE_FN, n_workers=1, timeout_s=20.0) as pool:
        out = grade_in_pool(pool, [(completion, gold, problem), (completion, gold), ("\\boxed{7}", None, problem)])
        assert [(g.correct, g.status) for g in out] == [(False, "ok"), (True, "ok"), (False, "error")]
        (res,) = pool.score_many([(completion, gold, True, problem)])
        assert res.value == ("y^2+5y+6", False)


@pytest.mark.multiproc
@pytest.mark.slow
def test_eval_grading_passes_the_problem():
    from types import SimpleNamespace

    from areal_cli.eval.grading import Graders, grade_completions, problem_text

    problem, completion, gold = "Factor $y^2+5y+6$.", "\\boxed{y^2+5y+6}", "(y+2)(y+3)"
    assert problem_text(SimpleNamespace(problem=problem)) == problem and problem_text(SimpleNamespace()) is None
    with Graders(math_timeout_s=20.0, n_workers=1) as graders:
        batch = graders.grade_math_batch([(completion, gold, False), (completion, gold, False, problem)])
        assert [v["correct"] for v in batch] == [True, False]
        recs = grade_completions([{"text": completion, "gold": gold}, {"text": completion, "gold": gold, "problem": problem},
                                  {"text": completion, "gold": gold, "problem": {"not": "text"}}],
                                 pool=graders.pool("math"))
        assert [r["correct"] for r in recs] == [True, False, True]


# ------------------------------------------------------------------ the Math-Verify suite benchmark
FAKE_SUITE = '''
import pytest
from math_verify import parse, verify

def compare_strings(gold, pred, match_types=["latex", "expr"], precision=6, strict=True, allow_set_relation_comp=False):
    raise AssertionError("never imported")

@pytest.mark.parametrize("gold,pred,expected", [
    ("$7$", "The total is $\\\\boxed{7}$.", 1),
    ("$7$", "so \\\\boxed{8}", 0),
    ("$\\\\frac{1}{4}$", "Final answer: $0.25$", 1),
])
def test_small(gold, pred, expected):
    assert compare_strings(gold, pred, match_types=["latex"]) == expected

@pytest.mark.parametrize("gold, pred, expected, precision", [("$\\\\frac{2}{3}$", "$0.67$", 1, 2)])
def test_prec(gold, pred, expected, precision):
    assert compare_strings(gold, pred, precision=precision) == expected

def test_inline():
    assert compare_strings("$3$", "$3.0$", match_types=["latex", "expr"]) == 1

@pytest.mark.parametrize("gold, pred, result", [("$x=2$", "$2$", 1)])
def test_direct(gold, pred, result):
    assert int(verify(parse(gold), parse(pred))) == result

@pytest.mark.parametrize("pred,expected", [("A", ["a"])])
def test_not_a_comparison(pred, expected):
    pass
'''


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "math_verify_suite.py"), *args],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.multiproc
@pytest.mark.slow
def test_math_verify_suite_benchmark_reads_cases_with_ast(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import math_verify_suite as bench
    finally:
        sys.path.pop(0)
    tests_dir = tmp_path / "tests"
    tests_dir.mkdir()
    (tests_dir / "test_fake.py").write_text(FAKE_SUITE)
    cases = bench.read_cases(tests_dir)
    assert [(c.test, c.expected, c.match_types, c.precision) for c in cases] == [
        ("test_small", True, ["latex"], 6), ("test_small", False, ["latex"], 6), ("test_small", True, ["latex"], 6),
        ("test_prec", True, ["latex", "expr"], 2), ("test_inline", True, ["latex", "expr"], 6),
        ("test_direct", True, ["latex", "expr"], 6)]
    assert cases[-1].mode == "verify_parse" and cases[3].config_dependent
    out = tmp_path / "r.json"
    proc = _bench("--tests-dir", str(tests_dir), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["total"]["cases"] == 6 and result["per_file"]["test_fake.py"]["cases"] == 6
    assert result["total"]["math-verify"]["agree"] == 6
    assert result["total"]["grade"]["agree"] >= 5  # the precision-2 case is a config case


@pytest.mark.multiproc
def test_math_verify_suite_benchmark_bad_input(tmp_path):
    out = tmp_path / "r.json"
    for args in (["--tests-dir", str(tmp_path / "missing")], ["--tests-dir", str(tmp_path)]):
        proc = _bench(*args, "--out", str(out))
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
        assert not out.exists()


def test_a_long_completion_keeps_its_stated_answer_wherever_the_text_window_starts():
    """The stated answer is looked for in the completion's tail; a window cut inside ``$...$`` once left a stray
    ``$`` that made the completion look unfinished, and the verdict flipped with one character of padding."""
    from areal_cli.reward.math_grader import grade

    body = "We compute $x$.\n" * 1000
    verdicts = {k: grade(body + "Now" + "w" * k + ".\nTherefore the answer is $12$.", "12")[1] for k in range(17)}
    assert all(verdicts.values()), verdicts

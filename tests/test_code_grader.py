"""The code grader extracts code as AReaL does, decodes LiveCodeBench tests, and judges as LCB does; a tolerance
declared in the statement is honoured as testlib's checkers do, in both modes; a run passes only if the program
ended normally (one exit policy for both modes)."""

from __future__ import annotations

import base64
import json
import os
import pickle
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from areal_cli.reward.code_grader import (
    TestSuite,
    Tolerance,
    compare_return,
    compare_stdout,
    decode_lcb_tests,
    extract_code,
    grade_code,
    judge_run,
    numbers_close,
    parse_tolerance,
    values_close,
)
from areal_cli.sandbox import RunResult

CASES_FILE = Path(__file__).resolve().parent / "data" / "code_grader_cases.jsonl"
CASES = [json.loads(line) for line in CASES_FILE.read_text().splitlines() if line.strip()]


def _lcb_blob(tests: list[dict]) -> str:
    """Encode private tests the way LiveCodeBench ships them: base64(zlib(pickle(json string)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


# ------------------------------------------------------------------------------------------ extract
def test_extract_takes_the_last_block_of_at_least_20_characters():
    text = "```python\nprint('first block is long')\n```\nthen\n```py\nprint('second block, the answer')\n```\n```\nx=1\n```"
    assert extract_code(text) == "print('second block, the answer')"


def test_extract_accepts_aReaL_language_tags_case_insensitively():
    assert extract_code("```Python\nimport sys; print(sys.argv)\n```") == "import sys; print(sys.argv)"
    assert extract_code("```\nimport sys; print(sys.argv)\n```") == "import sys; print(sys.argv)"


def test_extract_ignores_code_inside_the_reasoning():
    block = "```python\nprint(sum(map(int, input().split())))\n```"
    assert extract_code(f"<think>{block}</think>no code here") is None
    assert extract_code(f"<think>```python\nprint('draft draft draft')\n```</think>{block}") == (
        "print(sum(map(int, input().split())))"
    )
    assert extract_code("no fences at all") is None
    assert extract_code("```python\nprint(1)\n```") is None  # under 20 characters


# ------------------------------------------------------------------------------------------ compare
def test_stdout_comparison_follows_livecodebench():
    assert compare_stdout("3\n\n\n", "3") == (True, "")
    assert compare_stdout("  1 2  \n3", "1 2\n3\n")[0]
    assert compare_stdout("YES  \n  NO", "YES\nNO\n") == (True, "")  # each line stripped, text too (LCB)
    assert compare_stdout("3.00", "3")[0]  # Decimal equality
    assert compare_stdout("1e2", "100")[0]
    assert not compare_stdout("50000000000000001", "50000000000000000")[0]  # no float rounding of integers
    assert compare_stdout("3\n4", "3") == (False, "2 lines, expected 1")
    assert compare_stdout("YES", "yes") == (False, "line 1: 'YES' != 'yes'")
    assert not compare_stdout("1 2", "1 2 3")[0]


def test_float_tolerance_is_opt_in_and_never_applies_to_integers():
    assert not compare_stdout("0.333333", "0.3333333333")[0]
    assert compare_stdout("0.333333", "0.3333333333", float_tol=1e-6)[0]
    assert not compare_stdout("0.3333", "0.3333333333", float_tol=1e-6)[0]
    assert not compare_stdout("1000001", "1000000", float_tol=1e-3)[0]
    assert compare_stdout("2.5 7", "2.5000001 7", float_tol=1e-6)[0]


def test_call_based_comparison_decodes_both_sides():
    assert compare_return("[0, 1]", "[0, 1]")[0]
    assert compare_return("2.0", "2")[0]
    assert not compare_return("[1, 0]", "[0, 1]")[0]
    assert compare_return("not json", "1") == (False, "returned value is not JSON")


# ----------------------------------------------------------------------------------------- TestSuite
def test_suite_round_trips_and_validates():
    suite = TestSuite(inputs=["1"], outputs=["2"], fn_name="f", time_limit_s=2.0, memory_bytes=1 << 28)
    assert TestSuite.from_dict(json.loads(json.dumps(suite.to_dict()))) == suite
    assert TestSuite.from_dict({"inputs": ["1"], "outputs": ["1"], "fn_name": ""}).fn_name is None
    with pytest.raises(ValueError, match="2 inputs but 1 outputs"):
        TestSuite(inputs=["a", "b"], outputs=["a"])
    with pytest.raises(ValueError, match="fn_name"):
        TestSuite(inputs=[], outputs=[], fn_name="not an identifier")
    with pytest.raises(ValueError, match="unknown keys"):
        TestSuite.from_dict({"inputs": [], "outputs": [], "extra": 1})


# -------------------------------------------------------------------------------------- LCB decoding
def test_decodes_a_real_livecodebench_row_with_compressed_private_tests():
    case = next(c for c in CASES if c["id"] == "stdin_lcb_compressed_private_correct")
    lcb = case["lcb"]  # problem 1873_A of livecodebench/code_generation_lite, as published
    suite = decode_lcb_tests(lcb["public_test_cases"], lcb["private_test_cases"], lcb["metadata"])
    assert suite.fn_name is None and len(suite.inputs) == 5  # 1 public + 4 private, public first
    assert suite.inputs[1] == "1\nabc\n" and suite.outputs[3] == "NO\nYES\nYES\nYES\nNO\n"


def test_decodes_functional_tests_with_func_name_from_metadata():
    tests = [{"input": "[1,2]\n3", "output": "[0, 1]", "testtype": "functional"}]
    suite = decode_lcb_tests(json.dumps(tests[:1]), _lcb_blob(tests), json.dumps({"func_name": "twoSum"}))
    assert suite.fn_name == "twoSum" and suite.call_arguments() == [[[1, 2], 3], [[1, 2], 3]]
    plain = decode_lcb_tests(json.dumps(tests), json.dumps(tests), '{"func_name": "twoSum"}')  # early releases
    assert len(plain.inputs) == 2


def test_undecodable_tests_are_errors_with_a_reason():
    with pytest.raises(ValueError, match="not JSON and not base64/zlib/pickle"):
        decode_lcb_tests("[]", "%%% not a blob %%%", "{}")
    with pytest.raises(ValueError, match="no tests"):
        decode_lcb_tests("[]", "", "{}")
    with pytest.raises(ValueError, match="func_name"):
        decode_lcb_tests(json.dumps([{"input": "1", "output": "1", "testtype": "functional"}]), "", "{}")
    with pytest.raises(ValueError, match="not one JSON value per line"):
        decode_lcb_tests(json.dumps([{"input": "[1,", "output": "1", "testtype": "functional"}]), "", '{"func_name": "f"}')
    with pytest.raises(ValueError, match="one testtype"):
        decode_lcb_tests(json.dumps([{"input": "1", "output": "1", "testtype": "stdin"},
                                     {"input": "1", "output": "1", "testtype": "functional"}]), "", '{"func_name": "f"}')


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch /tmp/areal_pickle_exploit_ran",))


def test_a_malicious_pickle_in_the_test_data_cannot_run_code():
    blob = base64.b64encode(zlib.compress(pickle.dumps(_Exploit()))).decode()
    with pytest.raises(ValueError, match="refusing to load"):
        decode_lcb_tests("[]", blob, "{}")
    assert not os.path.exists("/tmp/areal_pickle_exploit_ran")


# ----------------------------------------------------------------------------------- graded cases
def _grade_case(case: dict) -> tuple[dict, bool, dict]:
    if "lcb" in case:
        lcb = case["lcb"]
        tests = decode_lcb_tests(lcb["public_test_cases"], lcb["private_test_cases"], lcb["metadata"]).to_dict()
    else:
        tests = case["tests"]
    _, passed, detail = grade_code(case["completion"], tests, per_test_timeout_s=1.0, total_timeout_s=30.0)
    return case, passed, detail


def test_cases_file_covers_both_modes():
    modes = [c["mode"] for c in CASES]
    assert len(CASES) >= 20 and modes.count("stdin") >= 8 and modes.count("call") >= 8
    assert len({c["id"] for c in CASES}) == len(CASES)


@pytest.mark.multiproc
def test_every_case_gets_its_expected_verdict():
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(_grade_case, CASES))
    wrong = {
        case["id"]: {"expected": case["expected_status"], "got": detail["status"], "failure": detail.get("first_failure"),
                     "why": case["why"]}
        for case, passed, detail in outcomes
        if detail["status"] != case["expected_status"] or passed != (case["expected_status"] == "passed")
    }
    assert not wrong, json.dumps(wrong, indent=1)
    by_id = {case["id"]: detail for case, _, detail in outcomes}
    # grading stops at the first failing test and says which one it was
    assert by_id["stdin_wrong_on_second_test"]["n_passed"] == 1
    assert by_id["stdin_wrong_on_second_test"]["first_failure"]["test"] == 1
    assert by_id["call_exit_at_import"]["n_passed"] == 0
    assert by_id["stdin_lcb_compressed_private_correct"]["n_tests"] == 5


@pytest.mark.multiproc
def test_detail_is_json_and_picklable_for_the_reward_pool():
    case = next(c for c in CASES if c["id"] == "stdin_sum_correct")
    result = grade_code(case["completion"], case["tests"], per_test_timeout_s=2.0)
    assert pickle.loads(pickle.dumps(result)) == result
    code, passed, detail = json.loads(json.dumps(result))
    assert passed is True and detail["status"] == "passed" and detail["n_tests"] == detail["n_passed"] == 3
    assert code.startswith("a, b = map(int")


def test_malformed_tests_are_no_tests_not_a_pass():
    completion = "```python\nprint(sum(map(int, input().split())))\n```"
    for tests in ({"inputs": ["1"], "outputs": []}, {"inputs": ["[1,"], "outputs": ["1"], "fn_name": "f"}, "nope"):
        _, passed, detail = grade_code(completion, tests)  # type: ignore[arg-type]
        assert not passed and detail["status"] == "no_tests" and detail["error"]


@pytest.mark.multiproc
def test_problem_limits_apply_only_when_asked():
    completion = "```python\nimport time\ntime.sleep(1.5)\nprint(sum(map(int, input().split())))\n```"
    tests = TestSuite(inputs=["1 2"], outputs=["3"], time_limit_s=0.5).to_dict()
    assert grade_code(completion, tests, per_test_timeout_s=5.0)[1] is True
    assert grade_code(completion, tests, per_test_timeout_s=5.0, use_problem_limits=True)[2]["status"] == "timeout"


def test_a_zlib_bomb_in_private_tests_is_refused_without_exhausting_memory(monkeypatch):
    import base64
    import zlib

    from areal_cli.reward.code_grader import suite as cg

    monkeypatch.setattr(cg, "MAX_PRIVATE_TESTS_BYTES", 1 << 20)
    bomb = base64.b64encode(zlib.compress(b"\0" * (8 << 20), 9)).decode()
    with pytest.raises(ValueError, match="decompressed size exceeds"):
        cg.decode_lcb_tests("[]", bomb, "{}")


# ------------------------------------------------------------------------------ declared tolerances
ABS_OR_REL = ("abs_or_rel", 1e-6, 1e-6)


@pytest.mark.parametrize("statement,expected", [
    # Codeforces
    ("Your answer is considered correct if its absolute or relative error does not exceed $10^{-9}$.",
     ("abs_or_rel", 1e-9, 1e-9)),
    ("Your answer will be considered correct if its absolute or relative error does not exceed $$$10^{-6}$$$. "
     "Formally, let your answer be $$$a$$$, and the jury's answer be $$$b$$$. Your answer is accepted if and only "
     "if $$$\\frac{|a - b|}{\\max{(1, |b|)}} \\le 10^{-6}$$$.", ABS_OR_REL),
    ("absolute or relative error does not exceed 10^{-6}", ABS_OR_REL),
    ("The answer is accepted if the absolute or relative error doesn't exceed 10^-6.", ABS_OR_REL),
    ("Print the answer with an absolute or relative error not exceeding \\(10^{-6}\\).", ABS_OR_REL),
    ("relative or absolute error at most 10^{\u22126}", ABS_OR_REL),  # unicode minus
    ("its absolute error or relative error is at most 2 \\cdot 10^{-6}", ("abs_or_rel", 2e-6, 2e-6)),
    # AtCoder
    ("Your output will be considered correct if the absolute or relative error from the true answer is at most "
     "10^{-6}.", ABS_OR_REL),
    ("Your output is considered correct if and only if the absolute or relative error between the true value and "
     "your output is at most 10^{-9}.", ("abs_or_rel", 1e-9, 1e-9)),
    ("Output a real number, within an absolute or relative error of at most 10^{-6}.", ABS_OR_REL),
    # absolute / relative only
    ("Your answer is accepted if the absolute error is at most 1e-4.", ("abs", 1e-4, None)),
    ("absolute error at most 1e-4", ("abs", 1e-4, None)),
    ("An absolute error of up to 0.001 is allowed.", ("abs", 1e-3, None)),
    ("The relative error of your answer must not exceed 1E-06.", ("rel", None, 1e-6)),
    ("relative error less than 10<sup>-5</sup>", ("rel", None, 1e-5)),
    # LeetCode
    ("Answers within 10^-5 of the actual answer will be accepted.", ("abs", 1e-5, None)),
    ("Answers within 10-5 of the actual answer will be accepted.", ("abs", 1e-5, None)),  # lost superscript
    ("Answers within 10^{-6} of the actual value will be accepted as correct.", ("abs", 1e-6, None)),
])
def test_tolerance_phrasings_of_codeforces_atcoder_and_leetcode_are_parsed(statement, expected):
    tol = parse_tolerance(statement)
    assert tol is not None, statement
    kind, abs_tol, rel_tol = expected
    assert tol.kind == kind
    assert (tol.abs_tol is None) == (abs_tol is None) and (tol.rel_tol is None) == (rel_tol is None)
    assert (tol.abs_tol or 0) == pytest.approx(abs_tol or 0) and (tol.rel_tol or 0) == pytest.approx(rel_tol or 0)


@pytest.mark.parametrize("statement", [
    "",
    None,
    "Print the answer modulo 998244353.",
    "1 \\le N \\le 10^5, and the absolute value of each A_i is at most 10^9.",
    "Compute the mean absolute error of the predictions. Print 0.5 if there are none.",  # no bound declared
    "Print the relative order of the elements. It is guaranteed that 10^{-6} < x.",  # not in the same sentence
    "Answers within 10^-5 will be accepted.",  # no "of the actual answer"
    "Print the minimum absolute difference of two elements; every element is at least 0.5.",
    "absolute or relative error does not exceed 10^{6}",  # not a tolerance (> 1)
])
def test_statements_without_a_tolerance_parse_to_none(statement):
    assert parse_tolerance(statement) is None


def test_the_first_declaration_wins_and_is_a_small_dataclass():
    tol = parse_tolerance("Answers within 10^-5 of the actual answer will be accepted. Also absolute error 1e-3.")
    assert tol == Tolerance(kind="abs", abs_tol=1e-5)
    assert Tolerance.from_dict(json.loads(json.dumps(tol.to_dict()))) == tol
    with pytest.raises(ValueError, match="kind"):
        Tolerance(kind="close")
    with pytest.raises(ValueError, match="rel_tol must be a number"):
        Tolerance(kind="abs_or_rel", abs_tol=1e-6)
    with pytest.raises(ValueError, match="abs_tol must be null"):
        Tolerance(kind="rel", abs_tol=1e-6, rel_tol=1e-6)


def test_numbers_close_follows_testlib_double_compare_at_the_boundary():
    both, absolute, relative = Tolerance("abs_or_rel", 1e-6, 1e-6), Tolerance("abs", 1e-6), Tolerance("rel", rel_tol=1e-6)
    # |a - b| <= eps (+1e-15) is enough for abs and abs_or_rel
    assert numbers_close(0.500001, 0.5, both) and numbers_close(0.500001, 0.5, absolute)
    assert not numbers_close(0.5000011, 0.5, both) and not numbers_close(0.5000011, 0.5, absolute)
    # relative to the expected value b: |a - b| <= eps * |b|
    assert numbers_close(1000001.0, 1e6, both) and numbers_close(1000001.0, 1e6, relative)
    assert not numbers_close(1000001.5, 1e6, both) and not numbers_close(1000001.0, 1e6, absolute)
    assert numbers_close(999999.0, 1e6, both) and not numbers_close(999998.9, 1e6, both)
    # small values: relative alone is strict, abs_or_rel accepts by the absolute half
    assert numbers_close(0.0010000009, 0.001, relative) and not numbers_close(0.0010001, 0.001, relative)
    assert numbers_close(0.0010001, 0.001, both)
    assert not numbers_close(1e-9, 0.0, relative) and numbers_close(1e-9, 0.0, both)
    # NaN / infinity as testlib: only the same
    nan, inf = float("nan"), float("inf")
    assert numbers_close(nan, nan, both) and not numbers_close(0.0, nan, both) and not numbers_close(nan, 0.0, both)
    assert numbers_close(inf, inf, both) and not numbers_close(-inf, inf, both) and not numbers_close(inf, 1.0, both)


def test_declared_tolerance_in_stdin_mode_is_token_by_token_and_only_widens_lcb():
    tol = Tolerance("abs_or_rel", 1e-6, 1e-6)
    assert compare_stdout("0.3333333", "0.333333333333", tolerance=tol) == (True, "")
    assert compare_stdout("0.333332", "0.333333333333", tolerance=tol)[0] is False
    assert compare_stdout("2 0.5000009\nYES", "2 0.5\nYES", tolerance=tol)[0]
    assert compare_stdout("2\n0.5000009 YES", "2 0.5 YES", tolerance=tol)[0]  # line breaks do not matter (testlib)
    assert compare_stdout("1000001", "1000000", tolerance=tol)[0]  # integers too, as testlib reads doubles
    assert compare_stdout("yes 0.5", "YES 0.5", tolerance=tol) == (False, "token 1: 'yes' != 'YES'")
    assert compare_stdout("0.5 0.5", "0.5", tolerance=tol) == (False, "2 tokens, expected 1")
    assert compare_stdout("0.3", "0.5", tolerance=tol) == (
        False, "token 1: '0.3' differs from '0.5' by more than absolute or relative error 1e-06")
    assert compare_stdout("3.00\n\n", "3", tolerance=tol)[0]  # what LCB accepts stays accepted
    assert compare_stdout("Infinity", "inf", tolerance=tol)[0]  # (Decimal equality, before the token rule)


def test_without_a_declared_tolerance_comparison_is_exactly_livecodebench():
    # lcb_runner/evaluation/testing_util.py: grade_stdio (lines, Decimal) and grade_call_based (==)
    assert not compare_stdout("0.3333333", "0.333333333333")[0]
    assert not compare_stdout("1 2", "1\n2")[0]  # LCB compares line by line
    assert compare_stdout("1.50", "1.5")[0]
    assert not compare_return("0.3333333", "0.333333333333")[0]
    assert compare_return("[1, 2.0]", "[1.0, 2]")[0] and compare_return("true", "1")[0]  # Python ==, as LCB


def test_declared_tolerance_in_call_mode_is_element_wise_and_recursive():
    tol = Tolerance("abs", 1e-5)
    assert compare_return("[0.333333, [1.000001, 2]]", "[0.3333333333, [1, 2]]", tolerance=tol) == (True, "")
    assert not compare_return("[0.3333, [1, 2]]", "[0.3333333333, [1, 2]]", tolerance=tol)[0]
    assert not compare_return("[0.333333]", "[0.3333333333, 1]", tolerance=tol)[0]  # lengths differ
    assert compare_return('{"a": 0.500001}', '{"a": 0.5}', tolerance=tol)[0]
    assert not compare_return('{"b": 0.5}', '{"a": 0.5}', tolerance=tol)[0]
    assert not compare_return('"0.500001"', '"0.5"', tolerance=tol)[0]  # strings exactly
    # bools are not numbers: no tolerance between True and 1.000001, or False and 0.000001
    assert not values_close(True, 1.000001, tol) and not values_close(0.000001, False, tol)
    assert values_close([True, 0.500001], [True, 0.5], tol) and values_close(True, 1, tol)  # == as LCB
    assert compare_return(str(10**400), str(10**400), tolerance=tol)[0]
    assert not compare_return(str(10**400 + 1), str(10**400), tolerance=tol)[0]


def test_suite_carries_the_tolerance_and_lcb_decoding_reads_it_from_the_statement():
    tol = Tolerance("abs_or_rel", 1e-6, 1e-6)
    suite = TestSuite(inputs=["1"], outputs=["0.5"], tolerance=tol)
    assert suite.to_dict()["tolerance"] == {"kind": "abs_or_rel", "abs_tol": 1e-6, "rel_tol": 1e-6}
    assert TestSuite.from_dict(json.loads(json.dumps(suite.to_dict()))) == suite
    assert TestSuite.from_dict({"inputs": [], "outputs": []}).tolerance is None  # older dicts: no key
    with pytest.raises(ValueError, match="tolerance: unknown keys"):
        TestSuite.from_dict({"inputs": [], "outputs": [], "tolerance": {"kind": "abs", "abs_tol": 1e-6, "x": 1}})
    public = json.dumps([{"input": "1\n", "output": "0.5\n", "testtype": "stdin"}])
    stated = decode_lcb_tests(public, "", "{}", statement="... absolute or relative error is at most 10^{-6}.")
    assert stated.tolerance == tol and decode_lcb_tests(public, "", "{}").tolerance is None


@pytest.mark.multiproc
def test_grading_honours_the_declared_tolerance_only_when_declared():
    completion = "```python\nn = int(input())\nprint(f'{n / 3:.7f}')\n```"
    exact = TestSuite(inputs=["1\n"], outputs=["0.333333333333\n"])
    _, passed, detail = grade_code(completion, exact.to_dict(), per_test_timeout_s=2.0)
    assert not passed and detail["status"] == "wrong_answer" and detail["tolerance"] is None
    declared = TestSuite(inputs=["1\n"], outputs=["0.333333333333\n"], tolerance=Tolerance("abs_or_rel", 1e-6, 1e-6))
    _, passed, detail = grade_code(completion, declared.to_dict(), per_test_timeout_s=2.0)
    assert passed and detail["tolerance"]["kind"] == "abs_or_rel"


# ------------------------------------------------------------------------------------ exit policy
def _run(outcome, returncode=0, *, exit_code=None, stdout="3\n", value_json=None, killed_by=None):
    r = RunResult(returncode=returncode, stdout=stdout, stderr="", timed_out=False, killed_by=killed_by, wall_s=0.01,
                  cpu_s=0.01, max_rss_bytes=0, outcome=outcome, value_json=value_json)
    if exit_code is not None:
        object.__setattr__(r, "exit_code", exit_code)  # the program's SystemExit status, when the sandbox reports it
    return r


def test_exit_policy_a_run_passes_only_if_the_program_ended_normally_in_both_modes():
    # stdin mode
    assert judge_run(_run("completed"), "3", call_based=False) == ("passed", "")
    assert judge_run(_run("system_exit", exit_code=0), "3", call_based=False) == ("passed", "")
    assert judge_run(_run(None, 0), "3", call_based=False) == ("passed", "")  # os._exit(0): judged on its output
    status, reason = judge_run(_run("system_exit", exit_code=1), "3", call_based=False)
    assert status == "runtime_error" and "status 1" in reason
    assert judge_run(_run("system_exit", exit_code=2, stdout="4\n"), "3", call_based=False)[0] == "runtime_error"
    assert judge_run(_run("completed", 1), "3", call_based=False)[0] == "runtime_error"  # exit status 1 after the report
    assert judge_run(_run(None, 3), "3", call_based=False)[0] == "runtime_error"
    assert judge_run(_run("completed", None, killed_by="SIGKILL"), "3", call_based=False)[0] == "runtime_error"
    # call-based mode: the function must return, and the process end with status 0
    assert judge_run(_run("returned", value_json="3"), "3", call_based=True) == ("passed", "")
    status, reason = judge_run(_run("returned", 1, value_json="3"), "3", call_based=True)
    assert status == "runtime_error" and reason == "returned a value, then the process exited with status 1"
    assert judge_run(_run("returned", None, value_json="3", killed_by="SIGSEGV"), "3", call_based=True)[0] == "runtime_error"
    assert judge_run(_run("exit_during_call"), "3", call_based=True)[0] == "runtime_error"
    assert judge_run(_run("exit_before_call"), "3", call_based=True)[0] == "runtime_error"


SUM = TestSuite(inputs=["1 2\n", "10 20\n"], outputs=["3\n", "30\n"]).to_dict()


@pytest.mark.multiproc
def test_stdin_program_that_prints_the_right_output_then_exits_non_zero_fails():
    completion = "```python\nimport sys\nprint(sum(map(int, input().split())))\nsys.exit(1)\n```"
    _, passed, detail = grade_code(completion, SUM, per_test_timeout_s=2.0)
    assert not passed and detail["status"] == "runtime_error"
    assert "status 1" in detail["first_failure"]["reason"]
    completion = "```python\nprint(sum(map(int, input().split())))\nraise SystemExit('bye')\n```"
    assert grade_code(completion, SUM, per_test_timeout_s=2.0)[2]["status"] == "runtime_error"  # a message is status 1


@pytest.mark.multiproc
def test_os_exit_zero_after_the_output_is_a_normal_end_and_non_zero_is_not():
    ok = "```python\nimport os, sys\nprint(sum(map(int, input().split())))\nsys.stdout.flush()\nos._exit(0)\n```"
    assert grade_code(ok, SUM, per_test_timeout_s=2.0)[1] is True
    bad = "```python\nimport os, sys\nprint(sum(map(int, input().split())))\nsys.stdout.flush()\nos._exit(3)\n```"
    _, passed, detail = grade_code(bad, SUM, per_test_timeout_s=2.0)
    assert not passed and detail["status"] == "runtime_error"


BENCH = Path(__file__).resolve().parent / "data" / "benchmarks"


def test_code_loaders_carry_the_tolerance_their_statements_declare(tmp_path):
    from areal_cli.eval.code_datasets import load_code_problems
    from areal_cli.eval.benchmarks import load_benchmark_specs

    specs = load_benchmark_specs()
    cf = json.loads((BENCH / "codeforces.jsonl").read_text().splitlines()[0])
    cf_tol = {**cf, "id": "2057Z", "output_format": "Print the area. Your answer is considered correct if its absolute "
                                                    "or relative error does not exceed $$$10^{-6}$$$."}
    (tmp_path / "cf.jsonl").write_text(json.dumps(cf) + "\n" + json.dumps(cf_tol) + "\n")
    problems, _ = load_code_problems(specs["codeforces"], [tmp_path / "cf.jsonl"], None)
    assert [p.tests["tolerance"] for p in problems] == [None, {"kind": "abs_or_rel", "abs_tol": 1e-6, "rel_tol": 1e-6}]
    cc = json.loads((BENCH / "codecontests.jsonl").read_text().splitlines()[0])
    cc["description"] += "\n\nThe answer is accepted if its absolute error is at most 1e-4."
    (tmp_path / "cc.jsonl").write_text(json.dumps(cc) + "\n")
    problems, _ = load_code_problems(specs["codecontests"], [tmp_path / "cc.jsonl"], None)
    assert problems[0].tests["tolerance"] == {"kind": "abs", "abs_tol": 1e-4, "rel_tol": None}
    lcb = json.loads((BENCH / "lcb_v5.jsonl").read_text().splitlines()[1])  # a LeetCode (call-based) row
    lcb["question_content"] += " Answers within 10^-5 of the actual answer will be accepted."
    (tmp_path / "lcb.jsonl").write_text(json.dumps(lcb) + "\n")
    problems, _ = load_code_problems(specs["lcb_v5"], [tmp_path / "lcb.jsonl"], None)
    assert problems[0].tests["fn_name"] == "sumArray"
    assert problems[0].tests["tolerance"] == {"kind": "abs", "abs_tol": 1e-5, "rel_tol": None}

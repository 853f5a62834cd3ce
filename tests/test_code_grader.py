"""The code grader extracts code as AReaL does, decodes LiveCodeBench tests, and judges as LCB does."""

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
    compare_return,
    compare_stdout,
    decode_lcb_tests,
    extract_code,
    grade_code,
)

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


def test_problem_limits_apply_only_when_asked():
    completion = "```python\nimport time\ntime.sleep(1.5)\nprint(sum(map(int, input().split())))\n```"
    tests = TestSuite(inputs=["1 2"], outputs=["3"], time_limit_s=0.5).to_dict()
    assert grade_code(completion, tests, per_test_timeout_s=5.0)[1] is True
    assert grade_code(completion, tests, per_test_timeout_s=5.0, use_problem_limits=True)[2]["status"] == "timeout"


def test_a_zlib_bomb_in_private_tests_is_refused_without_exhausting_memory(monkeypatch):
    import base64
    import zlib

    import areal_cli.reward.code_grader as cg

    monkeypatch.setattr(cg, "MAX_PRIVATE_TESTS_BYTES", 1 << 20)
    bomb = base64.b64encode(zlib.compress(b"\0" * (8 << 20), 9)).decode()
    with pytest.raises(ValueError, match="decompressed size exceeds"):
        cg.decode_lcb_tests("[]", bomb, "{}")

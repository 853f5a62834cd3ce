"""Claims: every benchmark is declared once in evaluation/benchmarks.json (math files; LiveCodeBench,
CodeContests and Codeforces at pinned Hugging Face revisions); the four real math files load with
normalised string ids/answers; code benchmarks load from records in their exact upstream schemas (JSON
lines, parquet, a local repository copy, or the hub through huggingface_hub at the pinned revision) with
decoded test suites, LiveCodeBench's inclusive date window (configurable) and metadata for breakdowns;
every kind of bad input is a UserError with one line saying where and what."""

from __future__ import annotations

import base64
import json
import pickle
import re
import zlib
from pathlib import Path

import pytest

from areal_cli.foundations.errors import UserError
from areal_cli.eval.benchmarks import BENCHMARKS_JSON, load_benchmark_specs
from areal_cli.eval.datasets import (
    load_benchmark,
    load_benchmark_with_report,
    load_dataset,
    load_datasets,
)
from helpers.one_line import assert_one_line

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DATA = SHARED / "data" / "math"
FIXTURES = Path(__file__).resolve().parent / "data" / "benchmarks"
ALL = ["aime24", "aime25", "amc23", "codecontests", "codeforces", "lcb_v5", "math_500"]
LCB_FILES = ["test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl"]


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines()]


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_rows(path: Path, records: list[dict]) -> Path:
    return write(path, [json.dumps(r) for r in records])


def one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(UserError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert_one_line(msg)
    return msg


# ------------------------------------------------------------------------------ declarations
def test_benchmarks_are_declared_once_as_data():
    specs = load_benchmark_specs()
    assert BENCHMARKS_JSON.name == "benchmarks.json" and BENCHMARKS_JSON.parent.name == "evaluation"
    assert sorted(specs) == ALL
    assert specs["math_500"].id_field == "unique_id" and specs["math_500"].kind == "math"
    assert specs["aime24"].problem_fields == ("problem", "question")
    assert {n: s.kind for n, s in specs.items() if s.kind == "code"} == {
        "lcb_v5": "code", "codecontests": "code", "codeforces": "code"}
    for name in ("lcb_v5", "codecontests", "codeforces"):  # pinned to a commit, not a branch
        assert re.fullmatch(r"[0-9a-f]{40}", specs[name].hub.revision), name
        assert specs[name].default_protocol == "qwen3-think-pure"
        assert specs[name].grader == "areal_cli.reward.code_grader:grade_code"
    lcb = specs["lcb_v5"]
    assert lcb.hub.repo_id == "livecodebench/code_generation_lite" and list(lcb.hub.files) == LCB_FILES
    assert (lcb.date_field, lcb.date_from, lcb.date_to) == ("contest_date", "2024-10-01", "2025-02-01")
    assert specs["codecontests"].hub.repo_id == "deepmind/code_contests"
    assert specs["codeforces"].hub.repo_id == "open-r1/codeforces"
    assert {specs[n].default_protocol for n in ("aime24", "aime25", "amc23", "math_500")} == {"qwen3-think"}


def test_malformed_declarations_file_is_a_user_error(tmp_path):
    bad = write(tmp_path / "benchmarks.json", ['{"benchmarks": {"x": {"file": "x.jsonl", "id_field": "id"}}}'])
    assert one_line_error(load_benchmark_specs, bad) == f"{bad}: benchmarks.x: field 'answer_field' must be a non-empty string"
    write(bad, ['{"benchmarks": {"x": {"loader": "lcb", "file": "x.jsonl", "id_field": "id", '
                '"problem_fields": ["q"], "hub": {"repo_id": "a/b", "files": ["t.jsonl"]}}}}'])
    assert one_line_error(load_benchmark_specs, bad) == f"{bad}: benchmarks.x.hub: field 'revision' must be a non-empty string"
    write(bad, ['{"benchmarks": {"x": {"loader": "lcb", "file": "x.jsonl", "id_field": "id", '
                '"problem_fields": ["q"], "date_from": "2024-13-01"}}}'])
    assert "field 'date_from': must be a date YYYY-MM-DD" in one_line_error(load_benchmark_specs, bad)
    write(bad, ['{"benchmarks": {"x": {"loader": "sql", "file": "x", "id_field": "id", "problem_fields": ["q"]}}}'])
    assert "field 'loader' must be one of math_jsonl, lcb, codecontests, codeforces" in one_line_error(load_benchmark_specs, bad)


# ------------------------------------------------------------------------------ math (real files)
def test_real_files_load_and_normalise():
    data = load_datasets("aime24,aime25,amc23,math_500", DATA)
    assert {k: len(v) for k, v in data.items()} == {"aime24": 30, "aime25": 30, "amc23": 40, "math_500": 500}
    for problems in data.values():
        for p in problems:
            assert isinstance(p.id, str) and isinstance(p.answer, str) and p.answer
            assert isinstance(p.problem, str) and p.problem
            assert p.kind == "math" and p.tests is None and p.meta == {}
    aime24 = {p.id: p for p in data["aime24"]}
    assert aime24["60"].answer == "204" and any(p.answer == "025" for p in data["aime24"])  # padding kept
    assert data["aime25"][0].answer == "70" and data["aime25"][0].id == "0"  # int answer, str id
    assert data["amc23"][0].answer == "27"  # 27.0
    m = {p.id: p.answer for p in data["math_500"]}
    assert m["test/precalculus/807.json"] == "\\left( 3, \\frac{\\pi}{2} \\right)"


def test_report_names_the_file_and_its_checksum_as_the_data_card_does():
    specs = load_benchmark_specs()
    for name in ("aime24", "aime25", "amc23", "math_500"):
        problems, report = load_benchmark_with_report(name, data_dir=DATA)
        assert report["source"] == "local" and report["n_problems"] == len(problems)
        assert report["files"][0]["sha256"] == specs[name].sha256, name


def test_unknown_dataset_lists_known_ones(tmp_path):
    msg = one_line_error(load_datasets, "aime24,gsm8k", tmp_path)
    assert msg == f"unknown dataset 'gsm8k'; known datasets: {', '.join(ALL)}"
    assert one_line_error(load_datasets, " , ", tmp_path).startswith("no dataset given")


def test_missing_directory_and_file_name_the_path(tmp_path):
    assert one_line_error(load_dataset, "aime24", tmp_path / "nope") == f"{tmp_path / 'nope'}: data directory not found"
    assert one_line_error(load_dataset, "aime24", tmp_path) == f"{tmp_path / 'aime24.jsonl'}: file not found (dataset 'aime24')"
    msg = one_line_error(load_benchmark, "aime24")
    assert msg.startswith("benchmark 'aime24' is read from a local file: pass --data-dir holding aime24.jsonl")


def test_malformed_json_line_names_file_and_line(tmp_path):
    f = write(tmp_path / "aime24.jsonl", ['{"id": 1, "problem": "p", "answer": "1"}', "", '{"id": 2, "problem": "p",'])
    assert one_line_error(load_dataset, "aime24", tmp_path).startswith(f"{f}:3: malformed JSON: ")
    write(f, ["[1, 2]"])
    assert one_line_error(load_dataset, "aime24", tmp_path) == f"{f}:1: expected a JSON object, got list (JSON Lines: one object per line)"


def test_record_without_answer_or_problem_names_the_field(tmp_path):
    f = tmp_path / "amc23.jsonl"
    write(f, ['{"id": 1, "problem": "p", "answer": 2.0}', '{"id": 2, "problem": "p"}'])
    assert one_line_error(load_dataset, "amc23", tmp_path) == f"{f}:2: field 'answer' missing"
    write(f, ['{"id": 1, "answer": 2.0}'])
    assert one_line_error(load_dataset, "amc23", tmp_path) == f"{f}:1: field 'problem' missing (nor 'question')"
    write(f, ['{"problem": "p", "answer": 2.0}'])
    assert one_line_error(load_dataset, "amc23", tmp_path) == f"{f}:1: field 'id' missing"


def test_bad_field_types_duplicates_and_empty_files(tmp_path):
    f = tmp_path / "aime25.jsonl"
    write(f, ['{"id": "0", "problem": "p", "answer": [1]}'])
    assert one_line_error(load_dataset, "aime25", tmp_path) == f"{f}:1: field 'answer' must be a string or number, got list"
    write(f, ['{"id": "0", "problem": "p", "answer": true}'])
    assert one_line_error(load_dataset, "aime25", tmp_path) == f"{f}:1: field 'answer' must be a string or number, got bool"
    write(f, ['{"id": "0", "problem": 5, "answer": 1}'])
    assert one_line_error(load_dataset, "aime25", tmp_path) == f"{f}:1: field 'problem' must be a non-empty string"
    write(f, ['{"id": "0", "problem": "p", "answer": 1}', '{"id": "0", "problem": "q", "answer": 2}'])
    assert one_line_error(load_dataset, "aime25", tmp_path) == f"{f}:2: field 'id': duplicate id '0' (first on line 1)"
    write(f, ["", "  "])
    assert one_line_error(load_dataset, "aime25", tmp_path) == f"{f}: no records (dataset 'aime25')"


def test_problem_falls_back_to_question_and_values_become_strings(tmp_path):
    write(tmp_path / "amc23.jsonl", [json.dumps({"id": 7, "question": "What is 1+1?", "answer": 2.0}),
                                     json.dumps({"id": 8, "problem": "Half?", "answer": 0.5})])
    a, b = load_dataset("amc23", tmp_path)
    assert (a.id, a.problem, a.answer, a.line) == ("7", "What is 1+1?", "2", 1)
    assert (b.id, b.answer) == ("8", "0.5")


# ------------------------------------------------------------------------------ LiveCodeBench
LCB_STDIN_TEXT = (
    "### Question:\nYou are given N and a string S of length N. Print the number of i with S[i..i+2] = '#.#'.\n\n"
    "### Format: Read the inputs from stdin solve the problem and write the answer to stdout (do not directly "
    "test on the sample inputs). Enclose your code within delimiters as follows.\n"
    "```python\n# YOUR CODE HERE\n```\n\n"
    "### Answer: (use the provided format with backticks)\n\n"
)
LCB_STARTER_TEXT = (
    "### Question:\nGiven an integer array nums, return the sum of nums.\n\n"
    "### Format: You will use the following starter code to write the solution to the problem and enclose "
    "your code within delimiters.\n"
    "```python\nclass Solution:\n    def sumArray(self, nums: List[int]) -> int:\n        \n```\n\n"
    "### Answer: (use the provided format with backticks)\n\n"
)


def test_lcb_rows_in_the_default_window_load_with_decoded_tests_and_lcb_prompts():
    problems, report = load_benchmark_with_report("lcb_v5", data_dir=FIXTURES)
    by_id = {p.id: p for p in problems}
    # 2024-10-01 <= contest_date <= 2025-02-01, both ends inclusive (abc391_b is dated 2025-02-01T00:00:00)
    assert list(by_id) == ["abc375_a", "3496", "2053_B", "abc391_b"]
    assert report["excluded"] == {"out_of_window": 2} and report["n_records"] == 6
    assert report["date_window"] == {"field": "contest_date", "from": "2024-10-01", "to": "2025-02-01", "inclusive": True}
    assert report["source"] == "local" and report["layout"] == "jsonl" and report["default_protocol"] == "qwen3-think-pure"
    stdin, fn = by_id["abc375_a"], by_id["3496"]
    assert stdin.kind == "code" and stdin.answer == "" and (stdin.path, stdin.line) == (str(FIXTURES / "lcb_v5.jsonl"), 1)
    assert stdin.problem == LCB_STDIN_TEXT and fn.problem == LCB_STARTER_TEXT
    # public tests first, then the base64/zlib/pickle private ones (lcb_runner get_evaluation_sample order)
    assert stdin.tests["inputs"] == ["6\n#.##.#\n", "1\n#\n", "9\n##.#.#.##\n"]
    assert stdin.tests["outputs"] == ["2\n", "0\n", "3\n"] and stdin.tests["fn_name"] is None
    assert fn.tests["fn_name"] == "sumArray" and fn.tests["inputs"] == ["[1, 2, 3]", "[5]", "[-1, 1]"]
    assert by_id["abc391_b"].tests["inputs"] == ["1 2\n", "5 5\n"]  # early-style plain-JSON private tests
    assert stdin.meta == {"platform": "atcoder", "difficulty": "easy", "contest_id": "abc375",
                          "contest_date": "2024-10-12T00:00:00", "title": "Seats", "fn_name": None, "n_tests": 3}
    assert by_id["2053_B"].meta["difficulty"] == "hard" and by_id["2053_B"].meta["platform"] == "codeforces"


def test_lcb_window_is_configurable_and_checked():
    ids = [p.id for p in load_benchmark("lcb_v5", data_dir=FIXTURES, date_from="2024-10-13", date_to="none")]
    assert ids == ["3496", "2053_B", "abc391_b", "abc392_a"]
    ids = [p.id for p in load_benchmark("lcb_v5", data_dir=FIXTURES, date_from="none", date_to="2024-10-12")]
    assert ids == ["abc375_a", "abc372_c"]
    assert one_line_error(load_benchmark, "lcb_v5", data_dir=FIXTURES, date_from="10/01/2024") == (
        "option 'date_from': must be a date YYYY-MM-DD (or 'none'), got '10/01/2024'")
    assert one_line_error(load_benchmark, "lcb_v5", data_dir=FIXTURES, date_from="2025-03-01") == (
        "option 'date_from' (2025-03-01) is after option 'date_to' (2025-02-01)")
    msg = one_line_error(load_benchmark, "lcb_v5", data_dir=FIXTURES, date_from="2030-01-01", date_to="none")
    assert msg == f"{FIXTURES / 'lcb_v5.jsonl'}: no problems dated from 2030-01-01 left of 6 records (dataset 'lcb_v5')"


def test_lcb_bad_records_name_file_line_and_problem(tmp_path):
    good = rows("lcb_v5.jsonl")
    f = tmp_path / "lcb_v5.jsonl"

    def error_for(record: dict, line: int = 2) -> str:
        write_rows(f, [good[0], record] if line == 2 else [record])
        return one_line_error(load_benchmark, "lcb_v5", data_dir=tmp_path)

    corrupt = dict(good[1], private_test_cases=base64.b64encode(b"not zlib").decode())
    assert error_for(corrupt).startswith(f"{f}:2: problem '3496': undecodable tests: ")
    truncated = dict(good[1], private_test_cases=good[1]["private_test_cases"][:40])
    assert error_for(truncated).startswith(f"{f}:2: problem '3496': undecodable tests: ")
    empty = dict(good[1], public_test_cases="[]", private_test_cases=base64.b64encode(
        zlib.compress(pickle.dumps("[]"))).decode())
    assert error_for(empty).startswith(f"{f}:2: problem '3496': undecodable tests: no tests")
    not_json_args = dict(good[1], public_test_cases=json.dumps([{"input": "[1, 2", "output": "3",
                                                                  "testtype": "functional"}]))
    assert error_for(not_json_args).startswith(f"{f}:2: problem '3496': undecodable tests: ")
    assert error_for({k: v for k, v in good[1].items() if k != "question_content"}) == f"{f}:2: field 'question_content' missing"
    assert error_for(dict(good[1], metadata={"func_name": "x"})) == f"{f}:2: field 'metadata' must be str, got dict"
    assert error_for(dict(good[1], contest_date="yesterday")) == f"{f}:2: field 'contest_date' is not an ISO date: 'yesterday'"
    assert error_for({k: v for k, v in good[1].items() if k != "question_id"}) == f"{f}:2: field 'question_id' missing"
    assert error_for(dict(good[1], question_id="abc375_a")) == (
        f"{f}:2: field 'question_id': duplicate id 'abc375_a' (first at {f}:1)")
    write(f, [json.dumps(good[0]), '{"question_id": "x",'])
    assert one_line_error(load_benchmark, "lcb_v5", data_dir=tmp_path).startswith(f"{f}:2: malformed JSON: ")


def test_lcb_repository_copy_reads_the_release_files_in_order(tmp_path):
    good = rows("lcb_v5.jsonl")
    root = tmp_path / "lcb_v5"  # huggingface-cli download ... --local-dir DIR/lcb_v5
    write_rows(root / "test4.jsonl", [good[4]])  # 2024-09 (outside the window)
    write_rows(root / "test5.jsonl", good[:4] + [good[5]])
    write_rows(root / "test6.jsonl", [dict(good[0], question_id="abc400_a")])  # not part of release_v5
    problems, report = load_benchmark_with_report("lcb_v5", data_dir=tmp_path)
    assert [p.id for p in problems] == ["abc375_a", "3496", "2053_B", "abc391_b"]
    assert report["layout"] == "snapshot" and [Path(f["path"]).name for f in report["files"]] == ["test4.jsonl", "test5.jsonl"]
    assert report["n_records"] == 6 and report["excluded"] == {"out_of_window": 2}
    assert problems[0].path == str(root / "test5.jsonl") and problems[0].line == 1


def test_lcb_from_the_hub_downloads_the_pinned_release_files(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []
    snapshot = tmp_path / "snapshot"
    write_rows(snapshot / "test.jsonl", rows("lcb_v5.jsonl")[4:5])
    write_rows(snapshot / "test5.jsonl", rows("lcb_v5.jsonl")[:4])

    def fake_snapshot_download(**kwargs):
        calls.append(kwargs)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    problems, report = load_benchmark_with_report("lcb_v5")
    assert calls == [{"repo_id": "livecodebench/code_generation_lite", "repo_type": "dataset",
                      "revision": "0fe84c3912ea0c4d4a78037083943e8f0c4dd505", "allow_patterns": LCB_FILES, "local_files_only": False}]
    assert len(problems) == 4 and report["source"] == "hub" and report["revision"] == calls[0]["revision"]
    load_benchmark("lcb_v5", revision="main")
    assert calls[-1]["revision"] == "main"
    assert one_line_error(load_benchmark, "lcb_v5", data_dir=FIXTURES, revision="main").startswith(
        "option 'revision' selects a Hugging Face revision; benchmark 'lcb_v5' is read from --data-dir")


def test_hub_that_cannot_be_reached_is_a_user_error_pointing_at_data_dir(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(**kwargs):
        raise LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder for the specified revision")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    msg = one_line_error(load_benchmark, "codecontests")
    assert msg.startswith("benchmark 'codecontests': cannot fetch "
                          "deepmind/code_contests@802411c3010cb00d1b05bad57ca77365a3c699d6: LocalEntryNotFoundError: ")
    assert msg.endswith("offline? pass --data-dir (layout: evaluation/README.md)")


# ------------------------------------------------------------------------------ CodeContests
def test_codecontests_rows_load_with_all_test_sets_and_limits():
    problems, report = load_benchmark_with_report("codecontests", data_dir=FIXTURES)
    assert [p.id for p in problems] == ["1548_E. Gregor and the Two Painters", "1549_A. Gregor and Cryptography",
                                        "p00001 Sum"]
    a, b, c = problems
    assert a.tests["inputs"] == ["1 2\n", "10 20\n", "0 0\n", "-1 1\n"]  # public + private + generated
    assert a.tests["outputs"] == ["3\n", "30\n", "0\n", "0\n"] and a.tests["fn_name"] is None
    assert (a.tests["time_limit_s"], a.tests["memory_bytes"]) == (2.0, 256000000)
    assert (b.tests["time_limit_s"], b.tests["memory_bytes"]) == (1.5, None)  # 1 s + 5e8 ns; 0 bytes = unknown
    assert a.meta["platform"] == "CODEFORCES" and a.meta["difficulty"] == "B" and a.meta["rating"] == 3000
    assert (a.meta["contest_id"], a.meta["index"]) == ("1548", "E")
    assert (c.meta["platform"], c.meta["difficulty"], c.meta["contest_id"]) == ("AIZU", "UNKNOWN_DIFFICULTY", None)
    assert a.problem.startswith("### Question:\nTwo painters add numbers.\n\nInput\n\n")
    assert report["excluded"] == {} and report["n_records"] == 3 and report["date_window"] is None


def test_codecontests_parquet_copy_of_the_repository_loads_the_same_problems(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    shard = tmp_path / "codecontests" / "data" / "test-00000-of-00001-9c49eeff30aacaa8.parquet"
    shard.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows("codecontests.jsonl")), shard)
    from_parquet = load_benchmark("codecontests", data_dir=tmp_path)
    from_jsonl = load_benchmark("codecontests", data_dir=FIXTURES)
    assert [(p.id, p.problem, p.tests, p.meta) for p in from_parquet] == [
        (p.id, p.problem, p.tests, p.meta) for p in from_jsonl]
    assert [(p.path, p.line) for p in from_parquet] == [(str(shard), i) for i in (1, 2, 3)]
    bad = rows("codecontests.jsonl")
    bad[1]["private_tests"] = {"input": ["1\n"], "output": []}
    pq.write_table(pa.Table.from_pylist(bad), shard)
    assert one_line_error(load_benchmark, "codecontests", data_dir=tmp_path) == (
        f"{shard}: row 2: problem '1549_A. Gregor and Cryptography': undecodable tests: field 'private_tests' "
        "needs equal-length input and output lists")
    shard.write_bytes(b"PAR1 not really parquet")
    assert one_line_error(load_benchmark, "codecontests", data_dir=tmp_path).startswith(
        f"{shard}: not a readable parquet file (after row 0): ")


def test_codecontests_problem_without_any_test_is_an_error(tmp_path):
    record = dict(rows("codecontests.jsonl")[2], public_tests={"input": [], "output": []})
    f = write_rows(tmp_path / "codecontests.jsonl", [record])
    assert one_line_error(load_benchmark, "codecontests", data_dir=tmp_path) == (
        f"{f}:1: problem 'p00001 Sum': no tests in public_tests, private_tests, generated_tests")


# ------------------------------------------------------------------------------ Codeforces
def test_codeforces_rows_load_official_tests_and_leave_out_ungradable_problems():
    problems, report = load_benchmark_with_report("codeforces", data_dir=FIXTURES)
    assert [p.id for p in problems] == ["2057A", "2057B"]
    assert report["excluded"] == {"interactive": 1, "file_io": 1} and report["n_records"] == 4
    a, b = problems
    assert a.tests["inputs"] == ["3\n", "10\n"] and a.tests["outputs"] == ["9\n", "100\n"]
    assert (a.tests["time_limit_s"], a.tests["memory_bytes"]) == (2.0, 256 * 1024 * 1024)
    assert (a.meta["contest_id"], a.meta["index"], a.meta["rating"]) == ("2057", "A", 800)
    assert a.meta["contest_date"] == "2025-01-02T14:35:00" and a.meta["platform"] == "codeforces"
    assert (a.meta["has_checker"], b.meta["has_checker"]) == (False, True)
    assert a.problem == (
        "### Question:\nSquare: given an integer n, print n squared.\n\nInput\n\n"
        "The only line contains an integer n (1 <= n <= 100).\n\nOutput\n\nPrint n*n.\n\nExamples\n\n"
        "Input\n\n3\n\nOutput\n\n9\n\nNote\n\nIn the first example 3*3 = 9.\n\n"
        "### Format: Read the inputs from stdin solve the problem and write the answer to stdout (do not directly "
        "test on the sample inputs). Enclose your code within delimiters as follows.\n"
        "```python\n# YOUR CODE HERE\n```\n\n### Answer: (use the provided format with backticks)\n\n")


def test_codeforces_window_uses_contest_start_compared_at_midnight():
    # contests 2057 start 2025-01-02T14:35 UTC: inside "..2025-01-03", outside "..2025-01-02" (= midnight)
    assert [p.id for p in load_benchmark("codeforces", data_dir=FIXTURES, date_to="2025-01-03")] == ["2057A", "2057B"]
    msg = one_line_error(load_benchmark, "codeforces", data_dir=FIXTURES, date_to="2025-01-02")
    assert msg == f"{FIXTURES / 'codeforces.jsonl'}: no problems dated until 2025-01-02 left of 4 records (dataset 'codeforces')"


@pytest.fixture(autouse=True)
def _hub_reachable(monkeypatch, request):
    """These tests stand in for the hub with a fake snapshot_download; the machine itself has no network,
    so the reachability probe is told the hub is up (offline behaviour is tested with HF_HUB_OFFLINE and in
    test_an_unreachable_hub_reads_the_cache_only)."""
    if "unreachable" not in request.node.name:
        monkeypatch.setattr("areal_cli.foundations.hub.hub_reachable", lambda *a, **k: True)

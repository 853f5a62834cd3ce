"""Claims: `areal eval --regrade FILE` grades saved completions without a model: each real math file's own
gold answers, boxed, score pass@1 = maj@1 = 1.0 on all four benchmarks through the command line, with
results.json, report.md and samples.jsonl written; metrics over several samples per problem follow the
published definitions; bad records give one line with FILE:LINE (or the problem id), exit code 2, and
leave nothing behind; input as people write it: `--data NAME` supplies the benchmark of records without one and
`completion` is read as `text`; a tolerance declared in a code statement is honoured through regrade."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from areal_cli.commands.main import main
from areal_cli.eval.datasets import load_datasets

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DATA = SHARED / "data" / "math"
NAMES = ["aime24", "aime25", "amc23", "math_500"]


@pytest.fixture(scope="module")
def problems():
    return load_datasets(NAMES, DATA)


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def regrade(gens: Path, out: Path, *extra: str):
    res = CliRunner().invoke(main, ["eval", "--regrade", str(gens), "--data-dir", str(DATA), "--out", str(out),
                                    *extra])
    return res.exit_code, res.output


def own_answers(problems, names):
    return [{"dataset": ds, "problem_id": p.id, "text": f"The answer is \\boxed{{{p.answer}}}"}
            for ds in names for p in problems[ds]]


@pytest.mark.multiproc
def test_regrade_of_each_problems_own_answer_scores_one_on_all_four_real_math_files(tmp_path, problems):
    gens = write_jsonl(tmp_path / "gens.jsonl", own_answers(problems, NAMES))
    out = tmp_path / "out"
    code, text = regrade(gens, out)
    assert code == 0, text
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["mode"] == "regrade" and results["config"]["datasets"] == NAMES
    for ds, n_problems in zip(NAMES, (30, 30, 40, 500)):
        m = results[ds]
        assert (m["pass@1"], m["maj@1"], m["n_problems"], m["n_samples"]) == (1.0, 1.0, n_problems, 1)
        assert m["n_grader_errors"] == m["n_grader_timeouts"] == m["n_no_answer"] == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 600 and all(s["correct"] and s["grader_status"] == "ok" for s in samples)
    report = (out / "report.md").read_text()
    assert "| aime24 | 30 | 1 |" in report and "100.0" in report and "mode: regrade" in report


@pytest.mark.multiproc
def test_regrade_metrics_over_several_samples_follow_the_definitions(tmp_path, problems):
    # aime24 only; sample 0 right, sample 1 wrong; sample_index omitted (= order within the problem).
    recs = []
    for p in problems["aime24"]:
        recs.append({"dataset": "aime24", "problem_id": p.id, "text": f"\\boxed{{{p.answer}}}"})
        recs.append({"dataset": "aime24", "problem_id": int(p.id), "completion": "\\boxed{-1}"})
    gens = write_jsonl(tmp_path / "gens.jsonl", recs)
    out = tmp_path / "out"
    code, text = regrade(gens, out, "--data", "aime24")
    assert code == 0, text
    m = json.loads((out / "results.json").read_text())["aime24"]
    # pass@1 = mean correctness; pass@2 = 1 - C(1,2)/C(2,2) = 1; maj@2: a 1-1 tie goes to the earlier sample.
    assert (m["pass@1"], m["pass@2"], m["maj@2"], m["n_samples"]) == (0.5, 1.0, 1.0, 2)
    assert m["pass@1_stderr"] == 0.0  # every problem has the same per-problem mean 0.5


def base_records(problems):
    return own_answers(problems, ["aime24"])


def test_n_samples_per_problem_without_sample_index_are_samples_0_to_n_minus_1_in_file_order(tmp_path, problems):
    """Another tool's file: 3 samples per problem, written round by round (problems interleaved), no index."""
    from areal_cli.eval.regrade import match_problems, read_generations

    aime = problems["aime24"]
    recs = [{"dataset": "aime24", "problem_id": p.id, "text": f"round {k}"} for k in range(3) for p in aime]
    gens = write_jsonl(tmp_path / "gens.jsonl", recs)
    matched = match_problems(gens, read_generations(gens), {"aime24": aime})
    assert [(r["problem_id"], r["sample_index"], r["text"]) for r in matched] == [
        (p.id, k, f"round {k}") for k in range(3) for p in aime]


@pytest.mark.parametrize(
    "recs_of,needle",
    [
        (lambda aime: [{"problem_id": p.id, "text": "a"} for p in aime for _ in range(4 if p is not aime[5] else 3)],
         "gens.jsonl:23: benchmark 'aime24' problem_id '65' (sample pass) has 3 completions but 29 of 30 problems "
         "have 4: every problem needs the same number (this line is its last"),
        (lambda aime: [{"problem_id": p.id, "text": "a", "sample_index": k} for p in aime
                       for k in range(2 if p is not aime[7] else 3)],
         "gens.jsonl:17: benchmark 'aime24' problem_id '67' (sample pass) has 3 completions but 29 of 30 problems "
         "have 2: every problem needs the same number (this line is its record number 3"),
        (lambda aime: [{"problem_id": p.id, "text": "a"} for p in aime] + [{"problem_id": aime[0].id, "text": "b",
                                                                           "sample_index": 0}],
         "gens.jsonl:31: field 'sample_index' given here but missing on line 1"),
    ],
)
def test_unequal_or_mixed_samples_name_the_problem_and_the_line(tmp_path, problems, recs_of, needle):
    from areal_cli.foundations.errors import UserError
    from areal_cli.eval.regrade import match_problems, read_generations

    gens = write_jsonl(tmp_path / "gens.jsonl", recs_of(problems["aime24"]))
    with pytest.raises(UserError) as e:
        match_problems(gens, read_generations(gens, "aime24"), {"aime24": problems["aime24"]})
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "mutate,needles",
    [
        (lambda recs: recs.__setitem__(1, {**recs[1], "problem_id": "999"}),
         ["gens.jsonl:2: problem_id '999' not in benchmark 'aime24'"]),
        (lambda recs: recs.__setitem__(1, '{"dataset": "aime24", '), ["gens.jsonl:2: malformed JSON"]),
        (lambda recs: recs.__setitem__(2, {**recs[2], "dataset": "gsm9k"}),
         ["gens.jsonl:3: field 'dataset': unknown benchmark 'gsm9k'", "aime24"]),
        (lambda recs: recs[3].pop("text"), ["gens.jsonl:4: field 'text' missing"]),
        (lambda recs: recs.__setitem__(4, {**recs[4], "sample_index": -1}),
         ["gens.jsonl:5: field 'sample_index' must be an integer >= 0"]),
        (lambda recs: (recs.__setitem__(0, {**recs[0], "sample_index": 0}), recs.append(dict(recs[0]))),
         ["gens.jsonl:31: problem '60' (aime24, sample pass) has sample_index 0 twice (first on line 1)"]),
        (lambda recs: recs.append(dict(recs[0])),  # no index: it becomes sample 1, the others have one sample
         ["gens.jsonl:31: benchmark 'aime24' problem_id '60' (sample pass) has 2 completions but 29 of 30 problems "
          "have 1", "so this line is its sample 1, its sample 0 is on line 1: remove it if it is a duplicate"]),
        (lambda recs: recs.insert(10, dict(recs[3])),  # a duplicate in the middle: named at its own line
         ["gens.jsonl:11: benchmark 'aime24' problem_id '63' (sample pass) has 2 completions", "on line 4"]),
        (lambda recs: recs.append({**recs[2], "sample_index": 1}),  # an index on one record of a problem only
         ["gens.jsonl:31: field 'sample_index' given here but missing on line 3, another record of problem_id "
          "'62' (aime24, sample pass): give it on every record of a problem or on none"]),
        (lambda recs: recs.pop(5), ["benchmark 'aime24': 1 of 30 problems have no completions (first: problem_id '65')"]),
        (lambda recs: recs.__setitem__(0, {**recs[0], "sample_index": 1}),
         ["gens.jsonl:1: benchmark 'aime24' problem_id '60' (sample pass): sample indices [1] are not 0..0"]),
        (lambda recs: recs.__setitem__(6, {**recs[6], "pass": "best"}), ["gens.jsonl:7: field 'pass' must be one of"]),
    ],
)
def test_bad_generations_give_one_line_exit_2_and_no_output(tmp_path, problems, mutate, needles):
    recs = base_records(problems)
    mutate(recs)
    gens = write_jsonl(tmp_path / "gens.jsonl", recs)
    out = tmp_path / "out"
    code, text = regrade(gens, out)
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), text
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert not out.exists()


def test_regrade_refuses_generation_options_and_records_outside_the_selection(tmp_path, problems):
    gens = write_jsonl(tmp_path / "gens.jsonl", base_records(problems))
    code, text = regrade(gens, tmp_path / "out", "-n", "4", "--temperature", "1.0")
    assert code == 2 and "does not take -n, --temperature" in text
    code, text = regrade(gens, tmp_path / "out", "--data", "amc23")
    assert code == 2 and "gens.jsonl:1: field 'dataset': benchmark 'aime24' is not among the selected" in text
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ code benchmarks (sandboxed grading)
BENCH = Path(__file__).resolve().parent / "data" / "benchmarks"  # small fixtures in the upstream schemas


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


LCB_COMPLETIONS = {  # lcb_v5 problems inside the declared 2024-10-01..2025-02-01 window
    "abc375_a": fenced("n = int(input())\ns = input()\nprint(sum(s[i:i+3] == '#.#' for i in range(n)))"),
    "3496": fenced("class Solution:\n    def sumArray(self, nums):\n        return sum(nums)"),
    "2053_B": fenced("t = int(input())\nfor _ in range(t):\n    print(int(input()))"),  # wrong: not doubled
    "abc391_b": fenced("a, b = map(int, input().split())\nprint(a + b)"),
}


@pytest.mark.multiproc
def test_code_regrade_runs_the_tests_and_breaks_down_by_difficulty_and_platform(tmp_path):
    gens = write_jsonl(tmp_path / "gens.jsonl", [{"dataset": "lcb_v5", "problem_id": pid, "text": text}
                                                  for pid, text in LCB_COMPLETIONS.items()])
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["eval", "--regrade", str(gens), "--data-dir", str(BENCH), "--out", str(out)])
    assert res.exit_code == 0, res.output
    m = json.loads((out / "results.json").read_text())["lcb_v5"]
    assert (m["pass@1"], m["n_problems"], m["n_grader_errors"]) == (0.75, 4, 0)
    assert m["code_status_counts"] == {"passed": 3, "wrong_answer": 1}
    assert "maj@1" not in m  # no answers to vote on in code
    by = m["breakdown"]
    assert {k: (v["n_problems"], v["pass@1"]) for k, v in by["difficulty"].items()} == {
        "easy": (1, 1.0), "hard": (1, 0.0), "medium": (2, 1.0)}
    assert {k: (v["n_problems"], v["pass@1"]) for k, v in by["platform"].items()} == {
        "atcoder": (2, 1.0), "codeforces": (1, 0.0), "leetcode": (1, 1.0)}
    samples = {s["problem_id"]: s for s in map(json.loads, (out / "samples.jsonl").read_text().splitlines())}
    assert samples["2053_B"]["first_failure"]["status"] == "wrong_answer" and samples["3496"]["n_passed"] == 3
    report = (out / "report.md").read_text()
    assert "## lcb_v5: by difficulty" in report and "| hard | 1 | 0.0 |" in report


def synthetic_contest(contest_id: int, n_rows: int = 250) -> dict:
    """Codeforces API responses for one Codeforces-rules contest: problems A (500) and B (1000); row i
    scored 1500 - 6 i points; everyone rated 1500 before."""
    rows = [{"party": {"members": [{"handle": f"u{i}"}]}, "points": float(1500 - 6 * i), "penalty": 0}
            for i in range(n_rows)]
    return {
        "standings": {"status": "OK", "result": {
            "contest": {"id": contest_id, "name": "synthetic"},
            "problems": [{"contestId": contest_id, "index": "A", "points": 500.0},
                         {"contestId": contest_id, "index": "B", "points": 1000.0}],
            "rows": rows}},
        "rating_changes": {"status": "OK", "result": [{"handle": f"u{i}", "oldRating": 1500} for i in range(n_rows)]},
    }


@pytest.mark.multiproc
def test_codeforces_rating_needs_cf_data_and_is_computed_with_it(tmp_path):
    square = fenced("n = int(input())\nprint(n * n)")
    gens = write_jsonl(tmp_path / "gens.jsonl", [{"dataset": "codeforces", "problem_id": "2057A", "text": square},
                                                  {"dataset": "codeforces", "problem_id": "2057B", "text": "no code"}])
    base = ["eval", "--regrade", str(gens), "--data-dir", str(BENCH)]
    res = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "codeforces: rating: needs --cf-data DIR" in res.output
    m = json.loads((tmp_path / "a" / "results.json").read_text())["codeforces"]
    assert m["codeforces"] == {"rating": "needs --cf-data DIR"} and m["pass@1"] == 0.5

    cf = tmp_path / "cf"
    cf.mkdir()
    (cf / "sorted_rating.json").write_text(json.dumps({"1000": 10, "1500": 10, "2000": 10}))
    res = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "b"), "--cf-data", str(cf)])
    assert res.exit_code == 2 and "--cf-data needs all_contest_data.json" in res.output  # checked up front
    assert not (tmp_path / "b").exists()
    (cf / "all_contest_data.json").write_text(json.dumps({"2057": synthetic_contest(2057)}))
    res = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "b"), "--cf-data", str(cf)])
    assert res.exit_code == 0, res.output
    rating = json.loads((tmp_path / "b" / "results.json").read_text())["codeforces"]["codeforces"]
    # solved A at the first attempt: 500 points, ranked behind the 167 rows with more than 500 points
    assert rating["n_contests"] == 1 and rating["contests"][0]["rank"] == 167
    assert 0 < rating["rating"] < 1500 and f"rating: {rating['summary']} (rating / percentile" in res.output


@pytest.mark.multiproc
def test_completions_with_unicode_line_separators_regrade_with_exact_line_numbers(tmp_path, problems):
    # json.dumps(ensure_ascii=False), as samples.jsonl is written, leaves U+2028, \x85 and \x1d raw inside
    # strings; only "\n" separates JSON Lines records.
    recs = own_answers(problems, ["aime24"])
    recs[0] = {**recs[0], "text": "weird\u2028sep\x85and\x1dgroup " + recs[0]["text"]}
    gens = tmp_path / "gens.jsonl"
    gens.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    code, text = regrade(gens, tmp_path / "out", "--data", "aime24")
    assert code == 0, text
    assert json.loads((tmp_path / "out" / "results.json").read_text())["aime24"]["pass@1"] == 1.0
    gens.write_text(gens.read_text(encoding="utf-8") + "{not json\n", encoding="utf-8")
    code, text = regrade(gens, tmp_path / "out2", "--data", "aime24")
    assert code == 2 and f"gens.jsonl:{len(recs) + 1}:" in text


def test_an_output_path_that_cannot_be_created_is_one_line_before_any_work(tmp_path, problems):
    gens = write_jsonl(tmp_path / "gens.jsonl", own_answers(problems, ["aime24"]))
    (tmp_path / "afile").write_text("x")
    code, text = regrade(gens, tmp_path / "afile" / "sub", "--data", "aime24")
    assert code == 2 and text.strip().splitlines() == [
        f"error: {tmp_path / 'afile' / 'sub'}: cannot create the output directory ({tmp_path / 'afile'} is not a directory)"]


def test_infinite_temperature_is_refused_in_one_line(tmp_path):
    res = CliRunner().invoke(main, ["eval", "--data", "aime24", "--data-dir", str(DATA), "--temperature", "inf",
                                    "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "option 'temperature': must be >= 0 and finite" in res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.multiproc
def test_a_completion_cut_off_while_thinking_has_no_answer_in_regrade_as_in_generation(tmp_path, problems):
    recs = own_answers(problems, ["aime24"])
    cut = [{**r, "text": "let me think... " + r["text"]} for r in recs]  # no </think>
    code, text = regrade(write_jsonl(tmp_path / "a.jsonl", [{**r, "think_open": True} for r in cut]),
                         tmp_path / "a", "--data", "aime24")
    assert code == 0, text
    assert json.loads((tmp_path / "a" / "results.json").read_text())["aime24"]["pass@1"] == 0.0
    code, text = regrade(write_jsonl(tmp_path / "b.jsonl", cut), tmp_path / "b", "--data", "aime24",
                         "--protocol", "qwen3-think")
    assert code == 0, text
    assert json.loads((tmp_path / "b" / "results.json").read_text())["aime24"]["pass@1"] == 0.0


@pytest.mark.multiproc
def test_report_names_the_data_the_generations_file_and_results_state_units(tmp_path, problems):
    import hashlib

    gens = write_jsonl(tmp_path / "gens.jsonl", own_answers(problems, ["aime24"]))
    code, text = regrade(gens, tmp_path / "out", "--data", "aime24")
    assert code == 0, text
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Data" in report and "aime24.jsonl (sha256 " in report
    assert f"Generations file sha256: {hashlib.sha256(gens.read_bytes()).hexdigest()}" in report
    units = json.loads((tmp_path / "out" / "results.json").read_text())["config"]["units"]
    assert units["codeforces.percentile"].startswith("percent") and "fraction" in units["pass@k, maj@k, greedy_acc, *_stderr"]


# ------------------------------------------------------------- input as people write it: --data, completion
@pytest.mark.multiproc
def test_data_names_the_benchmark_of_records_without_one_and_completion_is_text(tmp_path, problems):
    recs = [{"problem_id": p.id, ("completion" if i % 2 else "text"): f"\\boxed{{{p.answer}}}"}
            for i, p in enumerate(problems["aime24"])]
    recs[0] = {**recs[0], "completion": recs[0]["text"]}  # both, the same string: fine
    recs[1] = {**recs[1], "dataset": "aime24"}  # naming the --data benchmark: fine
    code, text = regrade(write_jsonl(tmp_path / "gens.jsonl", recs), tmp_path / "out", "--data", "aime24")
    assert code == 0, text
    m = json.loads((tmp_path / "out" / "results.json").read_text())["aime24"]
    assert (m["pass@1"], m["n_problems"], m["n_samples"]) == (1.0, 30, 1)
    samples = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert {s["dataset"] for s in samples} == {"aime24"} and all(s["correct"] for s in samples)


@pytest.mark.parametrize(
    "mutate,extra,needle",
    [
        (lambda recs: recs[2].pop("dataset"), [],
         "gens.jsonl:3: field 'dataset' missing (pass --data NAME to name the benchmark of records without one)"),
        (lambda recs: recs[2].pop("dataset"), ["--data", "aime24,amc23"],
         "gens.jsonl:3: field 'dataset' missing, and --data names 2 benchmarks (aime24, amc23): say which one"),
        (lambda recs: recs.__setitem__(4, {**recs[4], "dataset": "amc23"}), ["--data", "aime24"],
         "gens.jsonl:5: field 'dataset': benchmark 'amc23' is not among the selected benchmarks (aime24)"),
        (lambda recs: recs.__setitem__(1, {**recs[1], "completion": "\\boxed{1}"}), [],
         "gens.jsonl:2: fields 'text' and 'completion' differ (they are aliases: give one)"),
        (lambda recs: recs.__setitem__(3, {"dataset": "aime24", "problem_id": recs[3]["problem_id"], "completion": 7}), [],
         "gens.jsonl:4: field 'completion' must be a string, got int"),
        (lambda recs: recs.__setitem__(3, {"dataset": "aime24", "problem_id": recs[3]["problem_id"]}), [],
         "gens.jsonl:4: field 'text' missing (give the completion as 'text' or 'completion')"),
    ],
)
def test_bad_data_and_completion_input_is_one_line_exit_2_and_no_output(tmp_path, problems, mutate, extra, needle):
    recs = base_records(problems)
    mutate(recs)
    out = tmp_path / "out"
    code, text = regrade(write_jsonl(tmp_path / "gens.jsonl", recs), out, *extra)
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), text
    assert needle in lines[0], (needle, lines[0])
    assert not out.exists()


def _lcb_row(qid: str, content: str, tests: list[dict], func_name: str | None = None) -> dict:
    return {"question_title": qid, "question_content": content, "platform": "atcoder" if not func_name else "leetcode",
            "question_id": qid, "contest_id": "c1", "contest_date": "2024-11-02T00:00:00", "starter_code": "",
            "difficulty": "easy", "public_test_cases": json.dumps(tests), "private_test_cases": "",
            "metadata": json.dumps({"func_name": func_name} if func_name else {})}


@pytest.mark.multiproc
def test_code_regrade_honours_a_tolerance_declared_in_the_statement(tmp_path):
    stdin_tests = [{"input": "1\n", "output": "0.333333333333\n", "testtype": "stdin"}]
    rows = [
        _lcb_row("tol_stdin", "Print N/3. Your output is considered correct if the absolute or relative error from "
                              "the true value is at most 10^{-6}.", stdin_tests),
        _lcb_row("tol_call", "Return x/3. Answers within 10^-5 of the actual answer will be accepted.",
                 [{"input": "1", "output": "0.3333333333", "testtype": "functional"}], func_name="third"),
        _lcb_row("exact", "Print N/3 exactly as the judge does.", stdin_tests),  # no tolerance: exact, as LCB
    ]
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "lcb_v5.jsonl", rows)
    stdin_code = fenced("n = int(input())\nprint(f'{n / 3:.7f}')")
    gens = write_jsonl(tmp_path / "gens.jsonl", [
        {"dataset": "lcb_v5", "problem_id": "tol_stdin", "completion": stdin_code},
        {"dataset": "lcb_v5", "problem_id": "tol_call",
         "text": fenced("class Solution:\n    def third(self, x):\n        return round(x / 3, 6)")},
        {"dataset": "lcb_v5", "problem_id": "exact", "completion": stdin_code},
    ])
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["eval", "--regrade", str(gens), "--data", "lcb_v5", "--data-dir", str(data),
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    samples = {s["problem_id"]: s for s in map(json.loads, (out / "samples.jsonl").read_text().splitlines())}
    assert {pid: s["code_status"] for pid, s in samples.items()} == {
        "tol_stdin": "passed", "tol_call": "passed", "exact": "wrong_answer"}


def test_read_generations_supplies_the_data_benchmark_and_reads_completion(tmp_path):
    from areal_cli.foundations.errors import UserError
    from areal_cli.eval.regrade import read_generations

    gens = write_jsonl(tmp_path / "gens.jsonl", [{"problem_id": 60, "completion": "a"},
                                                 {"dataset": "aime24", "problem_id": "61", "text": "b", "completion": "b"}])
    saved = read_generations(gens, datasets=["aime24"])
    assert [(s.dataset, s.problem_id, s.text) for s in saved] == [("aime24", "60", "a"), ("aime24", "61", "b")]
    assert [s.dataset for s in read_generations(gens, datasets=" aime24 ")] == ["aime24", "aime24"]  # option text
    with pytest.raises(UserError, match=r"gens.jsonl:1: field 'dataset' missing \(pass --data NAME"):
        read_generations(gens)
    with pytest.raises(UserError, match="g2.jsonl:2: field 'dataset': benchmark 'aime24' is not among the selected "
                                        r"benchmarks \(amc23\)"):
        read_generations(write_jsonl(tmp_path / "g2.jsonl", [{"problem_id": 1, "text": "a"},
                                                             {"dataset": "aime24", "problem_id": 2, "text": "b"}]),
                         datasets="amc23")


def test_a_lone_surrogate_in_a_record_is_one_line_with_its_place_and_nothing_is_written(tmp_path, problems):
    recs = own_answers(problems, ["aime24"])
    lines = [json.dumps(r) for r in recs]
    lines[3] = lines[3][:-1] + ', "note": "x\\ud800"}'  # JSON's escape of a lone surrogate
    lines[4] = lines[4].replace('"text": "', '"text": "\\ud800')
    gens = write_jsonl(tmp_path / "gens.jsonl", lines)
    out = tmp_path / "out"
    code, text = regrade(gens, out)
    assert code == 2 and text.count("\n") == 1 and "gens.jsonl:4: field 'note'" in text and "surrogate" in text, text
    assert not out.exists()


# ------------------------------------------------------------------ a run of `areal eval --limit N`
def limited_run(tmp_path: Path, problems, limit: int, *, with_results: bool = True) -> Path:
    """The samples.jsonl (2 samples, a greedy completion, prompts) and results.json of an `areal eval --limit` run."""
    run = tmp_path / "run"
    run.mkdir()
    recs = []
    for p in problems["aime24"][:limit]:
        recs.append({"pass": "greedy", "dataset": "aime24", "problem_id": p.id, "sample_index": 0,
                     "prompt": f"Q{p.id}", "text": "I think", "finish_reason": "length"})
        recs += [{"dataset": "aime24", "problem_id": p.id, "sample_index": i, "prompt": f"Q{p.id}",
                  "text": f"\\boxed{{{p.answer}}}", "finish_reason": "stop"} for i in range(2)]
    write_jsonl(run / "samples.jsonl", recs)
    if with_results:
        (run / "results.json").write_text(json.dumps({"config": {"data": {"aime24": {"n_problems": 30, "limit": limit}}}}))
    return run / "samples.jsonl"


@pytest.mark.multiproc
def test_regrade_of_a_limit_run_uses_its_recorded_limit_keeps_prompts_and_records_the_kit(tmp_path, problems):
    gens = limited_run(tmp_path, problems, 3)
    out = tmp_path / "out"
    code, text = regrade(gens, out)
    assert code == 0, text
    results = json.loads((out / "results.json").read_text())
    m = results["aime24"]
    assert (m["n_problems"], m["pass@1"], m["greedy_acc"]) == (3, 1.0, 0.0)
    assert (m["greedy_n_truncated"], m["greedy_n_no_answer"], m["n_truncated"]) == (3, 3, 0)
    assert results["config"]["data"]["aime24"]["limit"] == 3
    assert "(evaluated: the first 3, --limit 3)" in (out / "report.md").read_text()
    assert set(results["config"]["kit"]) >= {"version", "commit", "dirty"}
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["prompt"] for s in samples[:3]] == [f"Q{problems['aime24'][0].id}"] * 3
    # the regrade's own results.json records the limit: its samples.jsonl regrades again; an explicit --limit too
    code, text = regrade(out / "samples.jsonl", tmp_path / "again")
    assert code == 0 and json.loads((tmp_path / "again" / "results.json").read_text())["aime24"]["n_problems"] == 3
    (gens.parent / "results.json").unlink()
    code, text = regrade(gens, tmp_path / "explicit", "--limit", "3")
    assert code == 0, text


def test_regrade_of_a_limit_run_never_drops_problems(tmp_path, problems):
    gens = limited_run(tmp_path, problems, 3, with_results=False)
    code, text = regrade(gens, tmp_path / "o")  # no results.json, no --limit: says which limit fits
    assert code == 2 and "27 of 30 problems have no completions" in text and "--limit 3" in text, text
    code, text = regrade(gens, tmp_path / "o", "--limit", "2")  # a completion beyond the limit is an error
    third = problems["aime24"][2].id
    assert code == 2 and f"problem_id '{third}' is problem 3 of benchmark 'aime24', beyond its limit 2" in text, text
    code, text = regrade(gens, tmp_path / "o", "--limit", "0")
    assert code == 2 and "option 'limit': must be >= 1" in text
    assert not (tmp_path / "o").exists()

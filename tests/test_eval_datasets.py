"""Claims: the four benchmarks declared in evaluation/benchmarks.json load from the real files with
normalised string ids/answers and problem text (falling back to 'question'); every kind of bad input
is a UserError with one line saying where and what."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_cli.errors import UserError
from areal_cli.eval.datasets import BENCHMARKS_JSON, load_benchmark_specs, load_dataset, load_datasets

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DATA = SHARED / "data" / "math"


def test_benchmarks_are_declared_once_as_data():
    specs = load_benchmark_specs()
    assert BENCHMARKS_JSON.name == "benchmarks.json" and BENCHMARKS_JSON.parent.name == "evaluation"
    assert sorted(specs) == ["aime24", "aime25", "amc23", "math_500"]
    assert specs["math_500"].id_field == "unique_id"
    assert specs["aime24"].problem_fields == ("problem", "question")


def test_real_files_load_and_normalise():
    data = load_datasets("aime24,aime25,amc23,math_500", DATA)
    assert {k: len(v) for k, v in data.items()} == {"aime24": 30, "aime25": 30, "amc23": 40, "math_500": 500}
    for problems in data.values():
        for p in problems:
            assert isinstance(p.id, str) and isinstance(p.answer, str) and p.answer
            assert isinstance(p.problem, str) and p.problem
    aime24 = {p.id: p for p in data["aime24"]}
    assert aime24["60"].answer == "204" and any(p.answer == "025" for p in data["aime24"])  # padding kept
    assert data["aime25"][0].answer == "70" and data["aime25"][0].id == "0"  # int answer, str id
    assert data["amc23"][0].answer == "27"  # 27.0
    m = {p.id: p.answer for p in data["math_500"]}
    assert m["test/precalculus/807.json"] == "\\left( 3, \\frac{\\pi}{2} \\right)"


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def one_line_error(fn, *args) -> str:
    with pytest.raises(UserError) as info:
        fn(*args)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_unknown_dataset_lists_known_ones(tmp_path):
    msg = one_line_error(load_datasets, "aime24,gsm8k", tmp_path)
    assert msg == "unknown dataset 'gsm8k'; known datasets: aime24, aime25, amc23, math_500"
    assert one_line_error(load_datasets, " , ", tmp_path).startswith("no dataset given")


def test_missing_directory_and_file_name_the_path(tmp_path):
    assert one_line_error(load_dataset, "aime24", tmp_path / "nope") == f"{tmp_path / 'nope'}: data directory not found"
    assert one_line_error(load_dataset, "aime24", tmp_path) == f"{tmp_path / 'aime24.jsonl'}: file not found (dataset 'aime24')"


def test_malformed_json_line_names_file_and_line(tmp_path):
    f = write(tmp_path / "aime24.jsonl", ['{"id": 1, "problem": "p", "answer": "1"}', "", '{"id": 2, "problem": "p",'])
    assert one_line_error(load_dataset, "aime24", tmp_path).startswith(f"{f}:3: malformed JSON: ")
    write(f, ["[1, 2]"])
    assert one_line_error(load_dataset, "aime24", tmp_path) == f"{f}:1: expected a JSON object, got list"


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


def test_malformed_declarations_file_is_a_user_error(tmp_path):
    bad = write(tmp_path / "benchmarks.json", ['{"benchmarks": {"x": {"file": "x.jsonl", "id_field": "id"}}}'])
    assert one_line_error(load_benchmark_specs, bad) == f"{bad}: benchmarks.x: field 'answer_field' must be a non-empty string"

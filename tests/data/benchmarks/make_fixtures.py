"""Writes the small benchmark fixtures of this folder, in exactly the upstream record schemas.

Run from the repository root: ``.venv/bin/python tests/data/benchmarks/make_fixtures.py``. The files are
committed; this script documents how they were built (deterministic: same bytes every run).

- ``lcb_v5.jsonl``: rows of ``livecodebench/code_generation_lite`` ``test*.jsonl`` (string-typed
  ``public_test_cases`` / ``metadata`` JSON; ``private_test_cases`` = base64(zlib(pickle(JSON string))),
  one early-style row with plain-JSON private tests). Dates straddle the default 2024-10-01..2025-02-01
  window, including a row exactly on the inclusive end bound.
- ``codecontests.jsonl``: rows of ``deepmind/code_contests`` (split test) as ``datasets``' JSON export
  writes them (test lists as ``{input: [...], output: [...]}``, class labels as ints).
- ``codeforces.jsonl``: rows of ``open-r1/codeforces`` (default config, split test), including one
  interactive and one file-I/O problem (excluded by the declaration).
"""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent


def lcb_private(cases: list[dict]) -> str:
    """LiveCodeBench's encoding of private test cases: base64(zlib(pickle(json string)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases), protocol=4))).decode("ascii")


def stdin_case(i: str, o: str) -> dict:
    return {"input": i, "output": o, "testtype": "stdin"}


def fn_case(i: str, o: str) -> dict:
    return {"input": i, "output": o, "testtype": "functional"}


def lcb_row(qid, title, platform, contest_id, date, difficulty, content, public, private, *, starter="",
            func_name=None, plain_private=False):
    return {
        "question_title": title,
        "question_content": content,
        "platform": platform,
        "question_id": qid,
        "contest_id": contest_id,
        "contest_date": date,
        "starter_code": starter,
        "difficulty": difficulty,
        "public_test_cases": json.dumps(public),
        "private_test_cases": json.dumps(private) if plain_private else lcb_private(private),
        "metadata": json.dumps({"func_name": func_name} if func_name else {}),
    }


LCB = [
    lcb_row("abc375_a", "Seats", "atcoder", "abc375", "2024-10-12T00:00:00", "easy",
            "You are given N and a string S of length N. Print the number of i with S[i..i+2] = '#.#'.",
            [stdin_case("6\n#.##.#\n", "2\n")],
            [stdin_case("1\n#\n", "0\n"), stdin_case("9\n##.#.#.##\n", "3\n")]),
    lcb_row("3496", "Minimum Number of Seconds", "leetcode", "weekly-contest-421", "2024-10-27T00:00:00",
            "medium", "Given an integer array nums, return the sum of nums.",
            [fn_case("[1, 2, 3]", "6")], [fn_case("[5]", "5"), fn_case("[-1, 1]", "0")],
            starter="class Solution:\n    def sumArray(self, nums: List[int]) -> int:\n        ",
            func_name="sumArray"),
    lcb_row("2053_B", "Outstanding Impressionist", "codeforces", "2053", "2025-01-14T00:00:00", "hard",
            "Read t integers and print each doubled.",
            [stdin_case("2\n1\n2\n", "2\n4\n")], [stdin_case("1\n7\n", "14\n")]),
    lcb_row("abc391_b", "Seek Grid", "atcoder", "abc391", "2025-02-01T00:00:00", "medium",
            "Print the sum of two integers A and B.",
            [stdin_case("1 2\n", "3\n")], [stdin_case("5 5\n", "10\n")], plain_private=True),
    lcb_row("abc372_c", "Count ABC Again", "atcoder", "abc372", "2024-09-21T00:00:00", "medium",
            "Count occurrences of ABC.", [stdin_case("ABCABC\n", "2\n")], [stdin_case("AB\n", "0\n")]),
    lcb_row("abc392_a", "Shuffled Equation", "atcoder", "abc392", "2025-02-08T00:00:00", "easy",
            "Print Yes if some product equals the third.", [stdin_case("3 15 5\n", "Yes\n")],
            [stdin_case("5 3 2\n", "No\n")]),
]


def cc_tests(pairs):
    return {"input": [i for i, _ in pairs], "output": [o for _, o in pairs]}


def cc_row(name, description, public, private, generated, *, source=2, difficulty=8, cf=(1548, "E", 3000),
           time_limit=(2, 0), memory=256000000):
    contest, index, rating = cf
    return {
        "name": name,
        "description": description,
        "public_tests": cc_tests(public),
        "private_tests": cc_tests(private),
        "generated_tests": cc_tests(generated),
        "source": source,
        "difficulty": difficulty,
        "solutions": {"language": [3], "solution": ["print(sum(map(int, input().split())))\n"]},
        "incorrect_solutions": {"language": [], "solution": []},
        "cf_contest_id": contest,
        "cf_index": index,
        "cf_points": 0.0,
        "cf_rating": rating,
        "cf_tags": ["math"],
        "is_description_translated": False,
        "untranslated_description": "",
        "time_limit": {"seconds": time_limit[0], "nanos": time_limit[1]} if time_limit else None,
        "memory_limit_bytes": memory,
        "input_file": "",
        "output_file": "",
    }


CODECONTESTS = [
    cc_row("1548_E. Gregor and the Two Painters",
           "Two painters add numbers.\n\nInput\n\nTwo integers a and b.\n\nOutput\n\nPrint a+b.\n\n"
           "Examples\n\nInput\n\n1 2\n\nOutput\n\n3",
           [("1 2\n", "3\n")], [("10 20\n", "30\n")], [("0 0\n", "0\n"), ("-1 1\n", "0\n")]),
    cc_row("1549_A. Gregor and Cryptography", "Print P-1 and 2 for a prime P.\n\nInput\n\nA prime P.",
           [("5\n", "2 4\n")], [], [("7\n", "2 6\n")], difficulty=7, cf=(1549, "A", 800),
           time_limit=(1, 500000000), memory=0),
    cc_row("p00001 Sum", "Print the sum of the integers on one line.", [("1 2 3\n", "6\n")], [], [],
           source=6, difficulty=0, cf=(0, "", 0), time_limit=None),
]


def cf_row(pid, contest_id, index, title, tests, *, rating=800, interaction=None, input_mode="stdio",
           checker=None, start=1735828500):
    return {
        "id": pid,
        "aliases": None,
        "contest_id": contest_id,
        "contest_name": f"Codeforces Round (Div. 2) {contest_id}",
        "contest_type": "CF",
        "contest_start": start,
        "contest_start_year": 2025,
        "index": index,
        "time_limit": 2.0,
        "memory_limit": 256.0,
        "title": title,
        "description": f"{title}: given an integer n, print n squared.",
        "input_format": "The only line contains an integer n (1 <= n <= 100).",
        "output_format": "Print n*n.",
        "interaction_format": interaction,
        "note": "In the first example 3*3 = 9.",
        "examples": [{"input": "3\n", "output": "9\n"}],
        "editorial": None,
        "rating": rating,
        "tags": ["math", "implementation"],
        "testset_size": len(tests),
        "official_tests": [{"input": i, "output": o} for i, o in tests],
        "official_tests_complete": True,
        "input_mode": input_mode,
        "generated_checker": checker,
        "executable": True,
    }


CODEFORCES = [
    cf_row("2057A", "2057", "A", "Square", [("3\n", "9\n"), ("10\n", "100\n")]),
    cf_row("2057B", "2057", "B", "Square Again", [("2\n", "4\n")], rating=1200,
           checker="def check(input, output, answer):\n    return output.split() == answer.split()\n"),
    cf_row("2057E", "2057", "E", "Guess the Square", [("1\n", "1\n")], rating=2000,
           interaction="Interact with the jury: print queries '? x', read answers."),
    cf_row("2058C", "2058", "C", "Square File", [("4\n", "16\n")], input_mode="file", start=1736000000),
]


def write(name: str, rows: list[dict]) -> None:
    (HERE / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


if __name__ == "__main__":
    write("lcb_v5.jsonl", LCB)
    write("codecontests.jsonl", CODECONTESTS)
    write("codeforces.jsonl", CODEFORCES)

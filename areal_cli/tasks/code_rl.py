"""``code-rl``: code RL on AReaL-boba-2-RL-Code records, rewarded by the sandboxed code grader of ``areal eval``.

Record format (``deepcoder_0415_v3_verify_new_correct_dedup_lcb.jsonl``; AReaL v0.3
``check_code_metadata_entries``)::

    {"task": "code", "query_id": "17", "prompt": "...statement...", "solutions": ["..."],
     "input_output": "{\\"inputs\\": [\\"3\\\\n1 2 3\\\\n\\"], \\"outputs\\": [\\"6\\\\n\\"], \\"fn_name\\": \\"\\", \\"remote\\": false}",
     "language": "PYTHON"}

``input_output`` is a JSON-encoded string of ``{inputs: [str], outputs: [str], fn_name?, remote?}`` with equal
list lengths. An empty ``fn_name`` means stdin/stdout tests; a set one means call-based tests (each input
holds the arguments, one JSON value per line; each output is the JSON of the return value; a ``class
Solution`` is instantiated when the code defines one). ``remote: true`` (test files on AReaL's object store)
cannot be graded here and is refused at load time. Optional fields (``language``, ``timeout``, ``memory``,
``solutions``) pass through.

Reward (:func:`reward`): 1.0 iff the last fenced code block of the completion (after ``</think>``) passes
every test in :mod:`areal_cli.sandbox` -- :func:`areal_cli.eval.grading.grade_code_sample`, the grader of
``areal eval``, with its budgets (6 s per test, 60 s per completion) -- else 0.0 (AReaL: reward 1 only if
every case passes).
"""

from __future__ import annotations

import json
from typing import Any

from areal_cli.tasks.prompts import opens_think


def parse_input_output(value: Any) -> dict:
    """The tests of a record as :meth:`areal_cli.reward.code_grader.TestSuite.to_dict` (``fn_name`` "" -> None).

    Raises:
        ValueError: ``field 'input_output': why`` (not a JSON string of that shape, remote tests, unequal
            lengths, non-string items, call-based inputs that are not JSON lines).
    """
    from areal_cli.reward.code_grader import TestSuite

    if not isinstance(value, str):
        raise ValueError(f"field 'input_output': expected a JSON-encoded string, got {type(value).__name__}")
    try:
        d = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"field 'input_output': not JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(d, dict):
        raise ValueError(f"field 'input_output': expected a JSON object, got {type(d).__name__}")
    if d.get("remote"):
        raise ValueError("field 'input_output': remote test files (remote: true) are not available here")
    unknown = set(d) - {"inputs", "outputs", "fn_name", "remote"}
    if unknown:
        raise ValueError(f"field 'input_output': unknown keys {sorted(unknown)}")
    try:
        suite = TestSuite(inputs=d.get("inputs"), outputs=d.get("outputs"), fn_name=d.get("fn_name") or None)
        if not suite.inputs:
            raise ValueError("tests: no test cases")
        if suite.fn_name is not None:
            suite.call_arguments()
    except ValueError as e:
        raise ValueError(f"field 'input_output': {e}") from None
    return suite.to_dict()


def check_record(record: dict) -> None:
    """Check one record of the code RL format (module docstring).

    Raises:
        ValueError: ``field 'x': why``.
    """
    if record.get("task", "code") != "code":
        raise ValueError(f"field 'task': expected 'code' for the code-rl task, got {record.get('task')!r}")
    if not isinstance(record.get("prompt"), str):
        raise ValueError(f"field 'prompt': expected a string, got {type(record.get('prompt')).__name__}")
    lang = record.get("language", "PYTHON")
    if not isinstance(lang, str) or lang.upper() not in ("PYTHON", "PYTHON3"):
        raise ValueError(f"field 'language': only PYTHON is graded here, got {lang!r}")
    parse_input_output(record.get("input_output"))


def reward(prompt: str, completion: str, prompt_ids: list[int], completion_ids: list[int], *,
           input_output: str, **fields: Any) -> float:
    """1.0 iff the completion's code passes every test of ``input_output`` in the sandbox, else 0.0.

    A numeric tolerance the prompt declares ("absolute or relative error does not exceed 10^{-6}",
    :func:`areal_cli.reward.code_grader.parse_tolerance`) is applied, as ``areal eval`` does.

    Raises:
        ValueError: undecodable tests (the pool reports status ``"error"``, never a silent 0).
        areal_cli.sandbox.SandboxError: the sandbox could not run at all.
    """
    from areal_cli.eval.grading import grade_code_sample

    from dataclasses import replace

    from areal_cli.reward.code_grader import TestSuite, parse_tolerance

    tests = parse_input_output(input_output)
    tolerance = parse_tolerance(prompt)  # a tolerance the statement declares, as areal eval's loaders read it
    if tolerance is not None:
        tests = replace(TestSuite.from_dict(tests), tolerance=tolerance).to_dict()
    shown = ("<think>" + completion) if opens_think(prompt) else completion
    _, detail, passed = grade_code_sample(shown, tests)
    if detail.get("status") == "no_tests":
        raise ValueError(f"the tests could not be graded: {detail.get('error', 'no tests')}")
    return 1.0 if passed else 0.0


def sft_target(prompt: str, fields: dict) -> str:
    """Warm-start target for CPU miniatures: close the open thinking of ``prompt``, then the record's first
    reference solution in a python block.

    Raises:
        KeyError / IndexError: the record has no ``solutions`` (needed for a warm start).
    """
    code = fields["solutions"][0].strip()
    block = f"```python\n{code}\n```"
    return ("</think>\n" + block) if opens_think(prompt) else block

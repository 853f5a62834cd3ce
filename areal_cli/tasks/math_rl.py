"""``math-rl``: math RL on AReaL-boba-106k records, rewarded by the math grader of ``areal eval``.

Record format (``boba_106k_0319.jsonl``; AReaL v0.3 ``check_math_metadata_entries``)::

    {"prompt": "<｜User｜>...\\nPlease reason step by step, and put your final answer within \\\\boxed{}.<｜Assistant｜><think>\\n",
     "task": "math", "query_id": "0a1b...", "solutions": ["\\\\boxed{-\\\\frac{2}{3}}"]}

``task`` is ``"math"`` (or ``"stem"``, graded the same way; a missing one means math), ``query_id`` any scalar
(the id), ``prompt`` a string (the DeepSeek-R1 chat template is usually baked in: it is detected and used as
is, :mod:`areal_cli.tasks.prompts`), ``solutions`` a non-empty list of strings, each a boxed answer or a
bare one. Extra fields pass through to the reward.

Reward (:func:`reward`): 1.0 iff the completion's final answer equals ANY solution (AReaL's OR over
``solutions``) under :func:`areal_cli.reward.math_grader.grade` -- the grader of ``areal eval`` -- else 0.0.
As in ``areal eval``, when the prompt ends inside an open ``<think>`` the grader reads ``"<think>" +
completion``, so an answer boxed only inside the unfinished thinking is not the final answer. Shaping to
AReaL's +-5 is the trainer's (``ppo.reward_bias`` / ``ppo.reward_scaling``).
"""

from __future__ import annotations

from typing import Any

from areal_cli.tasks.prompts import opens_think

TASKS = ("math", "stem")


def gold_answers(solutions: list[str]) -> list[str]:
    """The gold answers of a record: the boxed content of each solution (``\\boxed{4}`` -> ``4``), or the
    solution itself when it has no box."""
    from areal_cli.reward.math_grader import extract_boxed

    out = []
    for s in solutions:
        boxed = extract_boxed(s) if "\\boxed" in s or "\\fbox" in s else None
        out.append(boxed if boxed else s.strip())
    return out


def check_record(record: dict) -> None:
    """Check one record of the math RL format (module docstring).

    Raises:
        ValueError: ``field 'x': why``.
    """
    task = record.get("task", "math")
    if task not in TASKS:
        raise ValueError(f"field 'task': expected one of {list(TASKS)} for the math-rl task, got {task!r}")
    if not isinstance(record.get("prompt"), str):
        raise ValueError(f"field 'prompt': expected a string, got {type(record.get('prompt')).__name__}")
    sols = record.get("solutions")
    if not isinstance(sols, list) or not sols or not all(isinstance(s, str) and s.strip() for s in sols):
        raise ValueError(f"field 'solutions': expected a non-empty list of non-empty strings, got {sols!r:.80}")
    if isinstance(record.get("query_id"), (dict, list)):
        raise ValueError("field 'query_id': expected a string or number")


def reward(prompt: str, completion: str, prompt_ids: list[int], completion_ids: list[int], *,
           solutions: list[str], **fields: Any) -> float:
    """1.0 iff the final answer of ``completion`` matches any of ``solutions`` (module docstring), else 0.0.

    Raises:
        TypeError / ValueError: a solution the grader cannot read (the pool reports status ``"error"``).
    """
    from areal_cli.reward.math_grader import grade

    shown = ("<think>" + completion) if opens_think(prompt) else completion
    # the rendered prompt holds the problem: the grader refuses an answer that restates it, or changes a unit it fixes
    return 1.0 if any(grade(shown, gold, problem=prompt)[1] for gold in gold_answers(solutions)) else 0.0


def sft_target(prompt: str, fields: dict) -> str:
    """Warm-start target for CPU miniatures (a real run starts from a reasoning model): close the open
    thinking of the rendered ``prompt``, then the first solution, boxed (``"</think>\n\\boxed{4}"``)."""
    first = fields["solutions"][0].strip()
    answer = first if "\\boxed" in first else f"\\boxed{{{first}}}"
    return ("</think>\n" + answer) if opens_think(prompt) else answer

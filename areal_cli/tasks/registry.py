"""Built-in verifiable tasks, by name.

A task gives the training loop everything it needs, without torch:

* ``tokenizer_corpus() -> list[str]``: texts the embedded tokenizer is trained on;
* ``heldout(n) -> list[Problem]``: held-out problems (never in the training stream);
* ``train_stream() -> Iterator[Problem]``: an endless, seeded stream of training problems;
* ``sft_examples(n) -> list[tuple[Problem, str]]``: distinct training problems with target completions;
* ``reward_fn``: ``"module:function"`` of a pure ``reward(completion_text, answer) -> float`` run in the
  reward worker pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_cli.errors import UserError


@dataclass(frozen=True)
class Problem:
    """One task instance: a stable id, the user prompt text and the reference answer."""

    id: str
    prompt: str
    answer: str


def known_tasks() -> list[str]:
    return ["tiny-arith"]


def get_task(name: str, *, seed: int):
    """Return the task object for ``name``.

    Raises:
        UserError: unknown task name (lists the known ones).
    """
    if name == "tiny-arith":
        from areal_cli.tasks.tiny_arith import TinyArithTask

        return TinyArithTask(seed=seed)
    raise UserError(f"unknown task '{name}' (known: {', '.join(known_tasks())})")

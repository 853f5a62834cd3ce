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
        return TinyArithTask(seed=seed)
    raise UserError(f"unknown task '{name}' (known: {', '.join(known_tasks())})")


class TinyArithTask:
    """``tiny-arith`` (sort the digits of a 3-6 digit string), see :mod:`areal_cli.tasks.tiny_arith`.

    The held-out set does not depend on ``seed`` (runs with different seeds are scored on the same
    problems); training problems and the warm-start set do.
    """

    name = "tiny-arith"
    reward_fn = "areal_cli.tasks.tiny_arith:reward"
    HELDOUT_SEED = 0

    def __init__(self, seed: int) -> None:
        self.seed = seed

    @staticmethod
    def _problem(p) -> Problem:
        return Problem(id=p.prompt, prompt=p.prompt, answer=p.answer)

    def tokenizer_corpus(self) -> list[str]:
        from areal_cli.tasks import tiny_arith

        return tiny_arith.tokenizer_corpus()

    def heldout(self, n: int) -> list[Problem]:
        from areal_cli.tasks import tiny_arith

        return [self._problem(p) for p in tiny_arith.sample_problems("heldout", n, seed=self.HELDOUT_SEED)]

    def sft_examples(self, n: int) -> list[tuple[Problem, str]]:
        """``n`` distinct training problems with their target completion (the answer; the loop adds eos)."""
        from areal_cli.tasks import tiny_arith

        return [(self._problem(p), p.answer) for p in tiny_arith.sample_problems("train", n, seed=self.seed)]

    def train_stream(self):
        from areal_cli.tasks import tiny_arith

        return (self._problem(p) for p in tiny_arith.iter_problems("train", seed=self.seed + 1))

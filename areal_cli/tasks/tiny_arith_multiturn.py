"""``tiny-arith-multiturn``: the ``tiny-arith`` task (reverse a 3-4 digit string) as a multi-turn conversation:
the model answers, a wrong answer gets the feedback turn "Wrong. Try again." and the model answers again, up
to ``max_turns`` (:class:`areal_cli.workflows.multi_turn.MultiTurnWorkflow`).

Same problems, splits and reward as :mod:`areal_cli.tasks.tiny_arith` (exact match of the reversed digits);
what differs is the warm start. A tiny model that never saw a feedback turn treats it as noise, so the
``"sft"`` split mixes :data:`MULTI_TURN_FRACTION` of conversations that already hold 1..:data:`MAX_WRONG_TURNS`
wrong answers, each followed by the feedback, as a ``messages`` prompt whose target is the right answer
(the wrong answers are prompt tokens: never trained on). Wrong answers look like the model's own mistakes
(:func:`wrong_answer`): one digit changed, two neighbouring digits swapped, or the input echoed. Rendered by
the chat template, such a prompt is token for token what the workflow builds from the model's ids (ChatML is
prefix-stable and digits are single tokens; ``tests/test_multi_turn.py`` checks it), so the warm start sees the
exact contexts RL will.

The feedback of the warm start is :data:`~areal_cli.workflows.multi_turn.FEEDBACK`; a recipe that changes
``workflow_args.feedback`` trains on feedback the warm start never showed.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

from areal_cli.tasks import tiny_arith
from areal_cli.workflows.multi_turn import FEEDBACK

TASK_NAME = "tiny-arith-multiturn"
#: Fraction of warm-start examples that are multi-turn conversations.
MULTI_TURN_FRACTION = 0.5
#: Wrong answers (each followed by the feedback) in a multi-turn warm-start example: 1..this.
MAX_WRONG_TURNS = 2
SPLITS = ("train", "heldout", "sft")


def wrong_answer(digits: str, avoid: set[str], rng: random.Random) -> str:
    """A plausible wrong answer to ``reverse digits``: the right one with one digit changed, two neighbouring
    digits swapped, or the input echoed -- never the right answer nor one in ``avoid``.

    Raises:
        ValueError: ``digits`` is not a valid tiny-arith digit string.
    """
    right = tiny_arith.make_problem(digits).answer
    while True:
        kind = rng.choice(("digit", "digit", "swap", "echo"))
        if kind == "echo":
            cand = digits
        elif kind == "swap":
            i = rng.randrange(len(right) - 1)
            cand = right[:i] + right[i + 1] + right[i] + right[i + 2:]
        else:
            i = rng.randrange(len(right))
            cand = right[:i] + rng.choice([d for d in "0123456789" if d != right[i]]) + right[i + 1:]
        if cand != right and cand not in avoid:
            return cand


def conversation(digits: str, wrongs: list[str], feedback: str = FEEDBACK) -> list[dict]:
    """The ``messages`` prompt of a warm-start conversation: the question, then per wrong answer an assistant
    turn and the feedback turn."""
    msgs = [{"role": "user", "content": tiny_arith.PROMPT_PREFIX + digits}]
    for w in wrongs:
        msgs += [{"role": "assistant", "content": w}, {"role": "user", "content": feedback}]
    return msgs


def _multi_turn_record(rec: dict, seed: int) -> dict:
    """``rec`` (a tiny-arith record) as a multi-turn warm-start record, or unchanged (deterministic by a hash
    of the seed and the record id)."""
    h = hashlib.sha256(f"tiny-arith-multiturn/{seed}/{rec['id']}".encode()).digest()
    if int.from_bytes(h[:8], "big") / 2**64 >= MULTI_TURN_FRACTION:
        return rec
    rng = random.Random(h)
    digits = rec["prompt"][len(tiny_arith.PROMPT_PREFIX):]
    wrongs: list[str] = []
    for _ in range(rng.randint(1, MAX_WRONG_TURNS)):
        wrongs.append(wrong_answer(digits, set(wrongs), rng))
    return {"id": rec["id"] + "|" + ",".join(wrongs), "prompt": conversation(digits, wrongs),
            "answer": rec["answer"]}


def records(split: str, seed: int) -> Iterator[dict]:
    """The task as a dataset function (:mod:`areal_cli.api.records`): ``"train"`` and ``"heldout"`` are
    tiny-arith's (records ``{id, prompt, answer}``; a held-out conversation starts from the plain question);
    ``"sft"`` is tiny-arith's warm-start split with :data:`MULTI_TURN_FRACTION` of its records turned into
    multi-turn conversations (``prompt`` a ``messages`` list, ``answer`` the right answer, ``id`` the question
    and the wrong answers).

    Raises:
        ValueError: unknown split.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split != "sft":
        return tiny_arith.records(split, seed)
    return (_multi_turn_record(r, seed) for r in tiny_arith.records("sft", seed))


def tokenizer_corpus(n: int = 2000) -> list[str]:
    """tiny-arith's tokenizer corpus plus the feedback turn (``"user\\n" + FEEDBACK``, and the feedback's
    sentences alone, so that its words merge into a few tokens: a BPE merge needs a pair seen twice)."""
    return tiny_arith.tokenizer_corpus(n) + ["user\n" + FEEDBACK, FEEDBACK, *FEEDBACK.split(". ")]

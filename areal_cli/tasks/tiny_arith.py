"""``tiny-arith``: the built-in verifiable task that a tiny model learns on 2 CPU cores in minutes.

Task: reverse a digit string. The user prompt is ``"reverse {digits}"``, e.g. ``"reverse 5303"``; the
answer is the same digits in reverse order, leading zeros kept, e.g. ``"3035"``. The string length is drawn
uniformly from ``MIN_DIGITS..MAX_DIGITS`` (3..4) and each digit uniformly from 0-9, so answers have VARYING
length (3 or 4 tokens with the tiny model's one-token-per-digit tokenizer, plus the eos token).

Why this task (measured with a plain-PyTorch prototype, one thread per process, default tiny Qwen3 of
:mod:`areal_cli.models.tiny`, 0.48 M parameters): a supervised warm start on distinct prompts (batch 64,
AdamW lr 3e-3) reaches 0.3-0.4 held-out greedy accuracy after 43-55 steps, and GRPO (64 prompts x 4
samples, lr 3e-4) then reaches >= 0.9 after 25-50 steps on 4 of 4 seeds. Alternatives measured and
rejected: two-digit addition ``a+b`` needed 500-800 supervised steps before held-out accuracy left ~0.05;
sorting the digits plateaued under RL at 0.7-0.83 after 300-400 steps; reversing strings of length 3..5 or
3..6 reached 0.9 only after 75-370 RL steps, and one seed of 3..5 never did in 300 (the longest length is
learned last, by a rare success). Lengths start at 3 so that the trivial "echo the input" policy scores only
5.5 % (palindromes, :func:`echo_accuracy`).

Answer format (what :func:`reward` checks): the assistant completion is exactly the reversed digits
followed by ``<|im_end|>``, e.g. ``"3035<|im_end|>"``. :func:`extract_answer` takes the text before the first
``<|im_end|>`` or ``<|endoftext|>`` (the whole text when neither occurs; servers usually strip the stop
token from ``text``) and strips surrounding whitespace. Reward 1.0 iff it equals the answer, else 0.0.
Generation needs ``max_new_tokens >= MIN_MAX_NEW_TOKENS`` (= 5) for the eos to fit.

Splits: a prompt is held out iff ``sha256("tiny-arith:" + digits)`` mod 100 < ``HELDOUT_PERCENT`` (10),
independent of any seed, so no held-out prompt can ever be drawn for training, whatever the seeds
(1091 held-out and 9909 train strings).

Chance level (:func:`chance_accuracy`): a policy that knows the format and the length but guesses digits
uniformly scores ``mean_L 10^-L`` = 5.5e-4. An untrained model does not even know the format: its greedy
accuracy is 0 (tested). The strongest trivial policy, echoing the input, scores :func:`echo_accuracy` =
0.055.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

TASK_NAME = "tiny-arith"
MIN_DIGITS = 3
MAX_DIGITS = 4
HELDOUT_PERCENT = 10
PROMPT_PREFIX = "reverse "
MIN_MAX_NEW_TOKENS = MAX_DIGITS + 1
STOP_STRINGS = ("<|im_end|>", "<|endoftext|>")
SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class ArithProblem:
    """One task instance: ``prompt`` is the user message text, ``answer`` the exact expected answer."""

    prompt: str
    answer: str


def solve(digits: str) -> str:
    """The answer for a digit string: its digits reversed (``"5303"`` -> ``"3035"``)."""
    return digits[::-1]


def make_problem(digits: str) -> ArithProblem:
    """Build the :class:`ArithProblem` for ``digits``.

    Raises:
        ValueError: ``digits`` is not a string of ``MIN_DIGITS..MAX_DIGITS`` ASCII digits.
    """
    if not (MIN_DIGITS <= len(digits) <= MAX_DIGITS) or not all(c in "0123456789" for c in digits):
        raise ValueError(f"expected {MIN_DIGITS}-{MAX_DIGITS} digits, got {digits!r}")
    return ArithProblem(prompt=PROMPT_PREFIX + digits, answer=solve(digits))


def user_prompt(problem: ArithProblem) -> str:
    """The user message text for ``problem`` (to be wrapped by the chat template)."""
    return problem.prompt


def is_heldout(digits: str) -> bool:
    """True iff the digit string belongs to the held-out split (hash rule in the module docstring)."""
    h = int.from_bytes(hashlib.sha256(("tiny-arith:" + digits).encode()).digest()[:8], "big")
    return h % 100 < HELDOUT_PERCENT


def _split_of(digits: str) -> str:
    return "heldout" if is_heldout(digits) else "train"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def _draw_digits(rng: random.Random) -> str:
    n = rng.randint(MIN_DIGITS, MAX_DIGITS)
    return "".join(rng.choice("0123456789") for _ in range(n))


def iter_problems(split: str, seed: int) -> Iterator[ArithProblem]:
    """Endless i.i.d. stream of problems of one split (repeats possible), deterministic by ``seed``.

    Distribution: length uniform in ``MIN_DIGITS..MAX_DIGITS``, digits uniform, conditioned on the split.
    Raises:
        ValueError: unknown ``split``.
    """
    _check_split(split)
    rng = random.Random(f"tiny-arith/{split}/{seed}")
    while True:
        d = _draw_digits(rng)
        if _split_of(d) == split:
            yield make_problem(d)


def all_problems(split: str) -> list[ArithProblem]:
    """Every problem of one split (the task space is finite: 10^3 + 10^4 digit strings), in digit-string
    order. ``len(all_problems("heldout"))`` is ~10 % of 11 000.

    Raises:
        ValueError: unknown ``split``.
    """
    _check_split(split)
    out = []
    for length in range(MIN_DIGITS, MAX_DIGITS + 1):
        for i in range(10**length):
            d = str(i).zfill(length)
            if _split_of(d) == split:
                out.append(make_problem(d))
    return out


def sample_problems(split: str, n: int, seed: int) -> list[ArithProblem]:
    """``n`` DISTINCT problems of one split, deterministic by ``seed``: the :func:`iter_problems` stream
    with repeats removed, in draw order.

    Because the split has only ~900 (train) / ~100 (held-out) strings of length 3, distinct draws run out
    of short strings: 4000 distinct train prompts hold ~22 % length 3 (not 50 %), 128 distinct held-out
    prompts ~34 %. Use :func:`iter_problems` when the exact task distribution matters.
    Raises:
        ValueError: unknown ``split``, ``n`` < 0, or ``n`` more than the split holds
            (``len(all_problems(split))``).
    """
    _check_split(split)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    size = len(all_problems(split))  # 11 000 hashes, ~0.07 s
    if n > size:
        raise ValueError(f"split {split!r} holds {size} distinct problems, asked for {n}")
    seen: set[str] = set()
    out: list[ArithProblem] = []
    for p in iter_problems(split, seed):
        if len(out) >= n:
            break
        if p.prompt not in seen:
            seen.add(p.prompt)
            out.append(p)
    return out


def extract_answer(completion_text: str) -> str:
    """The final answer in a completion: text before the first stop string, whitespace-stripped."""
    text = completion_text
    for stop in STOP_STRINGS:
        text = text.split(stop, 1)[0]
    return text.strip()


def is_correct(completion_text: str, answer: str) -> bool:
    """True iff :func:`extract_answer` of ``completion_text`` equals ``answer`` exactly. Pure."""
    return extract_answer(completion_text) == answer


def reward(prompt: str, completion: str, prompt_ids: list[int], completion_ids: list[int], *, answer: str,
           **fields: object) -> float:
    """The task's reward (the contract of :mod:`areal_cli.api.reward`): 1.0 iff :func:`extract_answer` of
    ``completion`` equals the record's ``answer`` exactly, else 0.0. Pure."""
    return 1.0 if is_correct(completion, answer) else 0.0


def _record(p: ArithProblem) -> dict:
    return {"id": p.prompt, "prompt": p.prompt, "answer": p.answer}


def records(split: str, seed: int) -> Iterator[dict]:
    """The task as a dataset function (:mod:`areal_cli.api.records`), records ``{id, prompt, answer}``:

    - ``"train"``: the endless i.i.d. training stream (:func:`iter_problems` with seed ``seed + 1``);
    - ``"sft"``: distinct training problems for the warm start (:func:`sample_problems` order, seed ``seed``);
    - ``"heldout"``: distinct held-out problems, independent of ``seed`` (seed 0), so runs with different
      seeds are scored on the same problems.

    Raises:
        ValueError: unknown split.
    """
    if split == "train":
        return (_record(p) for p in iter_problems("train", seed=seed + 1))
    if split in ("sft", "heldout"):
        name, s = ("train", seed) if split == "sft" else ("heldout", 0)
        size = len(all_problems(name))

        def distinct() -> Iterator[dict]:
            seen: set[str] = set()
            for p in iter_problems(name, s):
                if p.prompt not in seen:
                    seen.add(p.prompt)
                    yield _record(p)
                    if len(seen) == size:
                        return
        return distinct()
    raise ValueError(f"split must be 'train', 'sft' or 'heldout', got {split!r}")


def sft_example(problem: ArithProblem) -> tuple[str, str]:
    """Supervised pair ``(user prompt text, target completion text)``; the target is ``answer + "<|im_end|>"``.

    The target's tokens (answer digits + the ``<|im_end|>`` eos token) are what a warm start trains on.
    """
    return problem.prompt, problem.answer + "<|im_end|>"


def chance_accuracy() -> float:
    """Accuracy of guessing uniformly random digits of the right length: ``mean_{L} 10^-L`` (5.5e-4).

    An untrained model scores 0 (it does not know the format); this is the level a model that learned only
    the format would score.
    """
    lengths = range(MIN_DIGITS, MAX_DIGITS + 1)
    return float(sum(Fraction(1, 10**L) for L in lengths) / len(lengths))


def echo_accuracy() -> float:
    """Exact accuracy of echoing the input digits: P(a uniform digit string is a palindrome), averaged over
    lengths: ``mean_L 10^ceil(L/2) / 10^L`` = 0.055 for L in 3..4."""
    lengths = range(MIN_DIGITS, MAX_DIGITS + 1)
    return float(sum(Fraction(10 ** ((L + 1) // 2), 10**L) for L in lengths) / len(lengths))


def tokenizer_corpus(n: int = 2000) -> list[str]:
    """Texts for training the tiny tokenizer: ``n`` rendered turns ``"user\\n" + prompt`` and
    ``"assistant\\n" + answer`` (so ``user``, ``assistant``, ``reverse`` become single tokens). Deterministic."""
    out: list[str] = []
    for p in sample_problems("train", n, seed=0):
        out.append("user\n" + p.prompt)
        out.append("assistant\n" + p.answer)
    return out

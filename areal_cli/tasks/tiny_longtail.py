"""``tiny-longtail``: a built-in task whose answer LENGTHS are heavy-tailed like a reasoning model's.

Why: AReaL boba²'s 2.77x async/sync speed-up comes from generation lengths with a long tail: a synchronous
batch waits for its longest samples while the servers idle. ``tiny-arith``'s answers are 3-4 digits, so there
asynchrony can only overlap generation with training. This task keeps the tiny model and the 2-core machine but
makes the length of each answer a deterministic function of the problem, drawn from a truncated lognormal.

Task: count down to the previous hundred. The user prompt is ``"countdown {s}"`` with ``s`` a 5-digit number;
the answer is every number from ``s`` down to ``s - s mod 100``, separated by single spaces, e.g.
``"countdown 48302"`` -> ``"48302 48301 48300"``. ``s = 100 * prefix + (m - 1)`` with ``prefix`` in
``PREFIX_MIN..PREFIX_MAX`` (100..999) and ``m`` = the number of numbers in the answer, ``1..M_MAX`` (64).
With the tiny model's one-token-per-digit tokenizer an answer is ``6 m - 1`` tokens, plus the eos token:
``answer_tokens(m) = 6 m`` (6 .. 384). The model must learn from the problem when to stop (after the number
ending in ``00``), and every number is computed from the one before it (copy the prefix, decrement the last two
digits with a borrow): a chain of small steps whose length the problem fixes, like a reasoning trace.

Length distribution: ``m = round(X)`` with ``X`` lognormal, median ``M_MEDIAN`` (3) and log-sd ``M_SIGMA`` (1.5),
conditioned on ``m`` in ``1..M_MAX``: median answer 24 tokens, mean 45, 90th percentile 114, 99th 306, max 384,
max/median 16 (:func:`length_stats`); 24 % of the problems have a one-number answer. Training prompts come in
blocks of ``STRATA`` (16) consecutive problems that take one ``m`` from each 1/16 quantile of that distribution, in
a shuffled order (stratified sampling: the marginal distribution is exactly the truncated lognormal, and every
block has the tail that a large batch has: max/median of the answer lengths >= 8 in 89 % of blocks, median ratio
10, :func:`block_length_ratio`; with i.i.d. draws 54 % of blocks, and sync/async comparisons would measure the
luck of the draw). The recipe's batch is one block (16 prompts x 4 samples).

Learnability (measured): a plain-PyTorch warm start (default tiny Qwen3, batch 64, AdamW lr 3e-3) of a 4-digit
variant of the same rule reached held-out greedy accuracy 0.05 after 50 steps, 0.44 after 75, 0.91 after 100 (long
answers are learned last); on this task, 80 steps on answers of <= 12 numbers give 30/32 exact short held-out
answers (``tests/test_longtail.py``). The recipe's warm start stops at ``sft.stop_accuracy`` (0.4: 120-145 steps
with its evaluation every 4 steps) and asynchronous PPO raises the accuracy from there
(``recipes/tiny-longtail.yaml``; with lr 3e-4 and a warm start at 0.32 both modes collapsed onto one-number
answers, hence lr 1e-4 and the later stop).

Answer format (what :func:`reward` checks): the text before the first ``<|im_end|>`` / ``<|endoftext|>``,
whitespace-stripped, equals the answer exactly. Reward 1.0 or 0.0.

Splits: a problem is held out iff ``sha256("tiny-longtail:" + str(s)) mod 100 < HELDOUT_PERCENT`` (10),
independent of any seed (5 698 held-out and 51 902 training problems of 57 600). The held-out evaluation set is
the first ``n`` distinct held-out problems of the seed-0 stream (stratified too, so it has the task's length
distribution).

Chance level: 0 for an untrained model (it does not know the format). The trivial policy "echo the number"
(``m = 1`` answers only) scores ``P(m = 1)`` ~ 0.14 (:func:`echo_accuracy`).
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from collections.abc import Iterator
from dataclasses import dataclass

from areal_cli.tasks.tiny_arith import STOP_STRINGS, extract_answer, is_correct, reward  # noqa: F401 (task API)

TASK_NAME = "tiny-longtail"
PROMPT_PREFIX = "countdown "
PREFIX_MIN, PREFIX_MAX = 100, 999  # s = 100 * prefix + (m - 1): 5-digit numbers
DIGITS = 5
M_MAX = 64  # numbers in the longest answer
M_MEDIAN = 3.0
M_SIGMA = 1.5
STRATA = 16  # training prompts per stratified block
HELDOUT_PERCENT = 10
SPLITS = ("train", "heldout")
#: Tokens of the longest answer including the eos token: what ``rollout.max_new_tokens`` must allow.
MAX_ANSWER_TOKENS = (DIGITS + 1) * M_MAX


@dataclass(frozen=True)
class LongtailProblem:
    """One task instance: ``prompt`` is the user message text, ``answer`` the exact expected answer."""

    prompt: str
    answer: str
    start: int

    @property
    def m(self) -> int:
        """Numbers in the answer (1..M_MAX)."""
        return self.start % 100 + 1

    @property
    def answer_tokens(self) -> int:
        """Tokens of the answer with the tiny tokenizer, eos included (:func:`answer_tokens`)."""
        return answer_tokens(self.m)


def answer_tokens(m: int) -> int:
    """Tokens of an answer of ``m`` numbers, eos included: ``m`` numbers of ``DIGITS`` digits, ``m - 1`` spaces and
    the eos token = ``(DIGITS + 1) * m``."""
    return (DIGITS + 1) * m


def solve(start: int) -> str:
    """The answer for ``start``: the numbers ``start, start - 1, ..., start - start % 100``, space-separated."""
    return " ".join(str(x) for x in range(start, start - start % 100 - 1, -1))


def make_problem(start: int) -> LongtailProblem:
    """The :class:`LongtailProblem` for the 5-digit number ``start``.

    Raises:
        ValueError: ``start`` is not an int in ``PREFIX_MIN*100 .. PREFIX_MAX*100+99`` with ``start % 100 < M_MAX``.
    """
    if isinstance(start, bool) or not isinstance(start, int) or not (
            PREFIX_MIN * 100 <= start <= PREFIX_MAX * 100 + 99) or start % 100 >= M_MAX:
        raise ValueError(f"expected a {DIGITS}-digit number whose last two digits are < {M_MAX}, got {start!r}")
    return LongtailProblem(prompt=PROMPT_PREFIX + str(start), answer=solve(start), start=start)


def is_heldout(start: int) -> bool:
    """True iff ``start`` belongs to the held-out split (hash rule in the module docstring)."""
    h = int.from_bytes(hashlib.sha256(f"tiny-longtail:{start}".encode()).digest()[:8], "big")
    return h % 100 < HELDOUT_PERCENT


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


# ----------------------------------------------------------------------------------------------------------
# The length distribution
# ----------------------------------------------------------------------------------------------------------

_N = statistics.NormalDist()
_LO = _N.cdf((math.log(0.5) - math.log(M_MEDIAN)) / M_SIGMA)  # X < 0.5 would round to 0: excluded
_HI = _N.cdf((math.log(M_MAX + 0.5) - math.log(M_MEDIAN)) / M_SIGMA)  # X >= M_MAX + 0.5: excluded


def m_quantile(u: float) -> int:
    """``m`` at quantile ``u`` in [0, 1) of the truncated lognormal: ``round(X)`` with ``X`` lognormal(median
    ``M_MEDIAN``, log-sd ``M_SIGMA``) conditioned on ``0.5 <= X < M_MAX + 0.5``, so ``m`` is in ``1..M_MAX``."""
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must be in [0, 1), got {u}")
    p = _LO + u * (_HI - _LO)
    x = math.exp(math.log(M_MEDIAN) + M_SIGMA * _N.inv_cdf(min(max(p, 1e-12), 1 - 1e-12)))
    return min(max(int(math.floor(x + 0.5)), 1), M_MAX)


def m_probabilities() -> dict[int, float]:
    """``P(m)`` for ``m`` in ``1..M_MAX`` (the exact distribution :func:`m_quantile` draws from)."""
    out = {}
    for m in range(1, M_MAX + 1):
        a = _N.cdf((math.log(m - 0.5) - math.log(M_MEDIAN)) / M_SIGMA) if m > 1 else _LO
        b = _N.cdf((math.log(m + 0.5) - math.log(M_MEDIAN)) / M_SIGMA)
        out[m] = (min(b, _HI) - max(a, _LO)) / (_HI - _LO)
    return out


def length_stats() -> dict[str, float]:
    """Answer lengths in tokens (eos included) of the task distribution: median, mean, p90, p99, max and
    max/median (exact, from :func:`m_probabilities`)."""
    probs = m_probabilities()

    def quantile(q: float) -> int:
        acc = 0.0
        for m, p in probs.items():
            acc += p
            if acc >= q - 1e-12:
                return answer_tokens(m)
        return answer_tokens(M_MAX)

    med = quantile(0.5)
    return {"median": med, "mean": sum(answer_tokens(m) * p for m, p in probs.items()), "p90": quantile(0.9),
            "p99": quantile(0.99), "max": answer_tokens(M_MAX), "max_over_median": answer_tokens(M_MAX) / med,
            "p_m1": probs[1]}


def _block_ms(rng: random.Random) -> list[int]:
    """One stratified block: one ``m`` from each of the ``STRATA`` equal-probability strata, shuffled."""
    ms = [m_quantile((j + rng.random()) / STRATA) for j in range(STRATA)]
    rng.shuffle(ms)
    return ms


def _problem_with_m(m: int, split: str, rng: random.Random) -> LongtailProblem:
    while True:
        start = 100 * rng.randint(PREFIX_MIN, PREFIX_MAX) + m - 1
        if is_heldout(start) == (split == "heldout"):
            return make_problem(start)


def iter_problems(split: str, seed: int) -> Iterator[LongtailProblem]:
    """Endless stream of problems of one split (repeats possible), deterministic by ``seed``: blocks of
    ``STRATA`` problems, one ``m`` per stratum of the length distribution (shuffled), the prefix uniform among
    those whose number is in the split.

    Raises:
        ValueError: unknown ``split``.
    """
    _check_split(split)
    rng = random.Random(f"tiny-longtail/{split}/{seed}")
    while True:
        for m in _block_ms(rng):
            yield _problem_with_m(m, split, rng)


def iid_problems(split: str, seed: int) -> Iterator[LongtailProblem]:
    """The same distribution drawn i.i.d. (no strata): for comparisons with :func:`iter_problems`."""
    _check_split(split)
    rng = random.Random(f"tiny-longtail/iid/{split}/{seed}")
    while True:
        yield _problem_with_m(m_quantile(rng.random()), split, rng)


def all_problems(split: str) -> list[LongtailProblem]:
    """Every problem of one split (43 200 numbers in all), ascending.

    Raises:
        ValueError: unknown ``split``.
    """
    _check_split(split)
    return [make_problem(100 * p + m - 1) for p in range(PREFIX_MIN, PREFIX_MAX + 1) for m in range(1, M_MAX + 1)
            if is_heldout(100 * p + m - 1) == (split == "heldout")]


def distinct_problems(split: str, n: int, seed: int) -> list[LongtailProblem]:
    """The first ``n`` DISTINCT problems of the :func:`iter_problems` stream, in draw order.

    Raises:
        ValueError: unknown ``split`` or ``n`` < 0 or more than 2 000 000 draws without ``n`` distinct ones.
    """
    _check_split(split)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    seen: set[int] = set()
    out: list[LongtailProblem] = []
    for i, p in enumerate(iter_problems(split, seed)):
        if len(out) >= n:
            break
        if i > 2_000_000:
            raise ValueError(f"split {split!r}: fewer than {n} distinct problems in 2 000 000 draws")
        if p.start not in seen:
            seen.add(p.start)
            out.append(p)
    return out


def block_length_ratio(problems: list[LongtailProblem]) -> float:
    """max / median of the answer lengths (tokens) of ``problems`` (e.g. one batch)."""
    lengths = [p.answer_tokens for p in problems]
    return max(lengths) / statistics.median(lengths)


# ----------------------------------------------------------------------------------------------------------
# Reward and records (the task API)
# ----------------------------------------------------------------------------------------------------------


# The answer format and reward are tiny-arith's (the text before the first stop string, stripped, equals the
# answer exactly): one implementation, imported at the top as this task's ``extract_answer``, ``is_correct``
# and ``task.reward`` (the preset names ``areal_cli.tasks.tiny_longtail:reward``).


def _record(p: LongtailProblem) -> dict:
    return {"id": p.prompt, "prompt": p.prompt, "answer": p.answer, "m": p.m}


def records(split: str, seed: int) -> Iterator[dict]:
    """The task as a dataset function (:mod:`areal_cli.api.records`), records ``{id, prompt, answer, m}``:

    - ``"train"``: the endless stratified training stream (:func:`iter_problems`, seed ``seed + 1``);
    - ``"sft"``: distinct training problems for the warm start (seed ``seed``);
    - ``"heldout"``: distinct held-out problems of the seed-0 stream, the same for every run.

    Raises:
        ValueError: unknown split.
    """
    if split == "train":
        return (_record(p) for p in iter_problems("train", seed=seed + 1))
    if split in ("sft", "heldout"):
        name, s = ("train", seed) if split == "sft" else ("heldout", 0)

        def distinct() -> Iterator[dict]:
            seen: set[int] = set()
            for p in iter_problems(name, s):
                if p.start not in seen:
                    seen.add(p.start)
                    yield _record(p)
        return distinct()
    raise ValueError(f"split must be 'train', 'sft' or 'heldout', got {split!r}")


def sft_example(problem: LongtailProblem) -> tuple[str, str]:
    """Supervised pair ``(user prompt text, target completion text)``: the target is ``answer + "<|im_end|>"``."""
    return problem.prompt, problem.answer + "<|im_end|>"


def echo_accuracy() -> float:
    """Accuracy of answering with the number itself (right exactly when ``m = 1``): ``P(m = 1)``."""
    return m_probabilities()[1]


def tokenizer_corpus(n: int = 1000) -> list[str]:
    """Texts for the tiny tokenizer: ``n`` rendered turns ``"user\\n" + prompt`` and ``"assistant\\n" + answer``
    (``countdown``, ``user`` and ``assistant`` become single tokens; digits are single tokens anyway)."""
    out: list[str] = []
    for p in distinct_problems("train", n, seed=0):
        out.append("user\n" + p.prompt)
        out.append("assistant\n" + p.answer)
    return out

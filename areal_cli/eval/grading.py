"""Grading for ``areal eval``: math answers with math-verify, code with the sandboxed test runner.

Both graders run in :class:`areal_cli.reward.pool.RewardPool` worker processes with a hard timeout per
call (a worker that overruns is killed and replaced), one pool per kind because their budgets differ:

- math: ``areal_cli.reward.math_grader:grade(completion, gold, True, problem) -> (extracted, correct)`` (the
  problem text enables the grader's problem-aware rules: multiple-choice options, a unit the problem fixes,
  restating the problem), hard timeout
  ``grader_timeout_s`` (default 10 s; AReaL uses 3 s in a Pebble pool).
- code: ``areal_cli.reward.code_grader:grade_code(completion, tests) -> (code, passed, detail)`` through
  :func:`grade_code_sample`, which reorders it to ``(code, detail, passed)`` so the pool's score is the
  verdict. The code grader has its own per-test (6 s, as AReaL's ``SINGLE_CASE_EXEC_TIMEOUT``) and total
  budgets; the pool's hard timeout is the total budget plus a margin, as a backstop.

A grader timeout or error counts as wrong AND is counted (``grader_status``); never a silent zero.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

from areal_cli.eval.benchmarks import Problem
from areal_cli.reward.pool import RewardPool, RewardResult

GRADE_FN = "areal_cli.reward.math_grader:grade"
EQUIVALENT_FN = "areal_cli.reward.math_grader:equivalent"
CODE_GRADE_FN = "areal_cli.eval.grading:grade_code_sample"
#: What each grader is, as results.json records it (``config.grader``).
GRADER_DESCRIPTION = {
    "math": "areal_cli.reward.math_grader:grade (last \\boxed{} after </think>; math-verify 0.9.0)",
    "code": "areal_cli.reward.code_grader:grade_code (last fenced block after </think>; sandboxed tests)",
    "reward": "the task's reward function through areal_cli.api.reward:call_reward (reward(prompt, completion, "
              "prompt_ids, completion_ids, **fields); correct when reward >= the task's pass_threshold)",
}
#: The pool function of custom tasks' reward graders (:mod:`areal_cli.api.reward`).
REWARD_FN = "areal_cli.api.reward:call_reward"
DEFAULT_GRADER_TIMEOUT_S = 10.0
DEFAULT_GRADER_WORKERS = 2
#: Code grader budgets (seconds): per test case (AReaL ``SINGLE_CASE_EXEC_TIMEOUT``) and per completion.
CODE_PER_TEST_TIMEOUT_S = 6.0
CODE_TOTAL_TIMEOUT_S = 60.0
#: Extra seconds the pool waits beyond the code grader's own total budget before killing the worker.
CODE_POOL_MARGIN_S = 30.0


def problem_kind(problem: Problem) -> str:
    """``"math"``, ``"code"`` or ``"reward"`` (``Problem.kind``; problems of loaders without it are math)."""
    return str(getattr(problem, "kind", "math") or "math")


def prompt_kind(problem: Problem) -> str:
    """How the problem text becomes the user message (:func:`areal_cli.eval.prompts.user_message`): ``"math"``
    (with the boxed-answer instruction), ``"code"``, or ``"raw"`` for a custom task whose template wrote the whole
    message or that its own reward grades."""
    if getattr(problem, "user_message", False) or problem_kind(problem) == "reward":
        return "raw"
    return problem_kind(problem)


def problem_tests(problem: Problem) -> dict | None:
    """A code problem's test suite (``TestSuite.to_dict()``), or None."""
    return getattr(problem, "tests", None)


def problem_meta(problem: Problem) -> dict[str, Any]:
    """A problem's metadata (difficulty, platform, contest id, ...); ``{}`` when the loader has none."""
    return dict(getattr(problem, "meta", None) or {})


def grade_code_sample(completion: str, tests: dict) -> tuple[str | None, dict, bool]:
    """Pool function for code: :func:`areal_cli.reward.code_grader.grade_code` with its result reordered
    to ``(extracted code, detail dict, passed)`` (the pool scores the LAST element)."""
    from areal_cli.reward.code_grader import grade_code

    code, passed, detail = grade_code(completion, tests, per_test_timeout_s=CODE_PER_TEST_TIMEOUT_S,
                                      total_timeout_s=CODE_TOTAL_TIMEOUT_S)
    return code, dict(detail), bool(passed)


def problem_text(problem: Problem) -> str | None:
    """A math problem's statement for the grader (``Problem.problem``), or None when there is none."""
    text = getattr(problem, "problem", None)
    return text if isinstance(text, str) and text else None


def verdict_fields(result: RewardResult, kind: str = "math") -> dict[str, Any]:
    """Per-sample grading fields from a pool result.

    Returns:
        ``extracted`` (answer or code, None if none), ``correct`` (bool), ``grader_status`` ("ok" |
        "error" | "timeout"), ``grader_message``; for code also ``code_status`` (the grader's verdict:
        "passed", "wrong_answer", "timeout", "no_code", ...), ``n_tests``, ``n_passed``, ``first_failure``.
        A code problem without tests ("no_tests") is a grader error, never a pass.
    """
    if result.status != "ok":
        out: dict[str, Any] = {"extracted": None, "correct": False, "grader_status": result.status,
                               "grader_message": result.message}
        if kind == "reward":
            out["reward"] = None
        if kind == "code":
            out.update({"code_status": None, "n_tests": None, "n_passed": None, "first_failure": None})
        return out
    if kind == "code":
        code, detail, passed = result.value
        status = detail.get("status")
        out = {"extracted": code, "correct": bool(passed), "grader_status": "ok", "grader_message": "",
               "code_status": status, "n_tests": detail.get("n_tests"), "n_passed": detail.get("n_passed"),
               "first_failure": detail.get("first_failure")}
        if status == "no_tests":
            out.update(correct=False, grader_status="error", grader_message="problem has no decodable tests")
        return out
    extracted, correct = result.value
    return {"extracted": extracted, "correct": bool(correct), "grader_status": "ok", "grader_message": ""}


def reward_verdict(result: RewardResult, threshold: float) -> dict[str, Any]:
    """Per-sample grading fields of a reward grader: ``reward`` (the score, None on failure), ``correct`` (reward
    >= ``threshold``), ``extracted`` (None: a reward has no answer to vote on), ``grader_status``,
    ``grader_message``."""
    if result.status != "ok" or result.reward is None:
        return verdict_fields(result, "reward")
    return {"extracted": None, "correct": result.reward >= threshold, "grader_status": "ok", "grader_message": "",
            "reward": result.reward}


class Graders:
    """The grader pools of one run, started on first use per kind; use as a context manager.

    Args:
        math_timeout_s: hard timeout per math answer (seconds).
        n_workers: processes per pool.
        pools: already open pools by kind (tests; not closed here).
    """

    def __init__(self, math_timeout_s: float = DEFAULT_GRADER_TIMEOUT_S, n_workers: int = DEFAULT_GRADER_WORKERS,
                 pools: dict[str, RewardPool] | None = None) -> None:
        self.math_timeout_s = float(math_timeout_s)
        self.n_workers = int(n_workers)
        self._pools: dict[str, RewardPool] = dict(pools or {})
        self._own: list[RewardPool] = []

    def pool(self, kind: str) -> RewardPool:
        """The pool for ``kind`` ("math" | "code"), started now if needed."""
        if kind not in self._pools:
            if kind == "code":
                p = RewardPool(CODE_GRADE_FN, n_workers=self.n_workers,
                               timeout_s=CODE_TOTAL_TIMEOUT_S + CODE_POOL_MARGIN_S)
            elif kind == "math":
                p = RewardPool(GRADE_FN, n_workers=self.n_workers, timeout_s=self.math_timeout_s)
            elif kind == "reward":  # custom tasks' reward functions; the spec travels with each call
                p = RewardPool(REWARD_FN, n_workers=self.n_workers, timeout_s=self.math_timeout_s)
            else:
                raise ValueError(f"no grader for problem kind {kind!r}")
            self._pools[kind] = p
            self._own.append(p)
        return self._pools[kind]

    @property
    def math_pool(self) -> RewardPool | None:
        """The math pool if one was started (maj@n uses it for answer equivalence)."""
        return self._pools.get("math")

    def start(self, kinds: Iterable[str]) -> None:
        """Start the pools of these kinds now (so a failing start happens before any generation)."""
        for k in kinds:
            self.pool(k)

    async def grade(self, problem: Problem, text: str, think_open: bool = False, *, prompt: str | None = None,
                    prompt_ids: list[int] | None = None, completion_ids: list[int] | None = None) -> dict[str, Any]:
        """Grade one completion of ``problem``.

        Args:
            think_open: the prompt ended inside ``<think>``, so the math and code graders see ``"<think>" + text``
                (boxes or code blocks before ``</think>`` are not the final answer).
            prompt, prompt_ids, completion_ids: the rendered prompt and the token ids, for a reward grader
                (``reward(prompt, completion, prompt_ids, completion_ids, **fields)``); defaults: the problem
                text and empty lists.
        Returns:
            :func:`verdict_fields` (math, code) or :func:`reward_verdict` (reward).
        """
        kind = problem_kind(problem)
        shown = ("<think>" + text) if think_open else text
        if kind == "reward":
            grader = problem.reward
            fields = {k: v for k, v in (problem.fields or {}).items()}
            res = await self.pool("reward").call(REWARD_FN, grader.spec, grader.code_dir,
                                                 prompt if prompt is not None else problem.problem, text,
                                                 list(prompt_ids or []), list(completion_ids or []), fields)
            return reward_verdict(res, grader.threshold)
        if kind == "code":
            res = await self.pool("code").call(CODE_GRADE_FN, shown, problem_tests(problem))
        else:
            res = await self.pool("math").call(GRADE_FN, shown, problem.answer, True, problem_text(problem))
        return verdict_fields(res, kind)

    def grade_math_batch(self, items: list[tuple[str, str, bool]] | list[tuple[str, str, bool, str | None]]
                         ) -> list[dict[str, Any]]:
        """Grade many math completions at once (``(text, gold, think_open)`` or ``(text, gold, think_open,
        problem text)`` each), batched through the pool
        with :func:`areal_cli.reward.math_grader.grade_in_pool` (32 answers per call, soft limit per
        answer, hangs re-graded one by one under the hard timeout). Blocking; returns
        :func:`verdict_fields`-shaped dicts in order. Used by ``--regrade``, where all completions are
        known up front; generation grades each sample as it finishes with :meth:`grade`.
        """
        from areal_cli.reward.math_grader import grade_in_pool

        shown = [(("<think>" + it[0]) if it[2] else it[0], it[1], it[3] if len(it) > 3 else None) for it in items]
        out = []
        for g in grade_in_pool(self.pool("math"), shown):
            out.append({"extracted": g.extracted, "correct": bool(g.correct) and g.status == "ok",
                        "grader_status": g.status, "grader_message": g.message})
        return out

    def counters(self) -> dict[str, dict[str, int]]:
        """Outcome counters (ok / error / timeout) of each pool that was used."""
        return {k: p.counters for k, p in self._pools.items()}

    def close(self) -> None:
        for p in self._own:
            p.close()
        self._own.clear()

    def __enter__(self) -> "Graders":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def grade_completions(
    records: Iterable[dict[str, Any]],
    *,
    pool: RewardPool | None = None,
    timeout_s: float = DEFAULT_GRADER_TIMEOUT_S,
    n_workers: int = DEFAULT_GRADER_WORKERS,
) -> list[dict[str, Any]]:
    """Grade math completions with the math grader in a process pool (hard timeout per answer).

    Args:
        records: dicts with at least ``text`` (the completion) and ``gold`` (the gold answer), optionally
            ``problem`` (the problem text, a string, for the grader's problem-aware rules); other keys (dataset,
            problem_id, sample_index, output_ids, ...) are passed through.
        pool: an open pool running ``areal_cli.reward.math_grader:grade``; if None, one is created with
            ``n_workers`` workers and ``timeout_s`` and closed afterwards.

    Returns:
        copies of the records, in order, with ``extracted`` (str | None), ``correct`` (bool),
        ``grader_status`` ("ok" | "error" | "timeout") and ``grader_message`` added.

    Raises:
        ValueError: a record without ``text`` or ``gold``.
    """
    items = [dict(r) for r in records]
    for i, r in enumerate(items):
        if "text" not in r or "gold" not in r:
            raise ValueError(f"record {i} needs 'text' and 'gold' keys, has {sorted(r)}")
    own = pool is None
    if own:
        pool = RewardPool(GRADE_FN, n_workers=n_workers, timeout_s=timeout_s)
    try:
        results = pool.score_many([(r["text"], r["gold"], True, r["problem"]) if isinstance(r.get("problem"), str)
                                   else (r["text"], r["gold"]) for r in items], fn=GRADE_FN)
    finally:
        if own:
            pool.close()
    for r, res in zip(items, results):
        r.update(verdict_fields(res))
    return items


def graders_kinds(problems_by_ds: dict[str, list[Problem]]) -> list[str]:
    """Problem kinds present, sorted ("code", "math")."""
    return sorted({problem_kind(p) for ps in problems_by_ds.values() for p in ps})


@contextlib.contextmanager
def open_graders(given: Graders | None, timeout_s: float, n_workers: int) -> Iterator[Graders]:
    """``given`` (left open) or fresh pools for this run (closed at the end)."""
    if given is not None:
        yield given
        return
    with Graders(timeout_s, n_workers) as own:
        yield own

"""Grading many answers robust to hangs: a batch in one process with a soft ``SIGALRM`` timeout per answer
(:func:`grade_many`), its pool entry point (:func:`grade_batch`), and the driver that sends batches to a
RewardPool and re-grades what a batch could not finish one answer at a time (:func:`grade_in_pool`)
(package docstring, "Timeouts")."""

from __future__ import annotations

import math
import signal
import time
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from areal_cli.reward.math_grader.extraction import extract_answer
from areal_cli.reward.math_grader.grading import grade

if TYPE_CHECKING:  # pragma: no cover
    from areal_cli.reward.pool import RewardPool

GRADE_FN = "areal_cli.reward.math_grader:grade"
GRADE_BATCH_FN = "areal_cli.reward.math_grader:grade_batch"


class _ItemTimeout(BaseException):
    """Raised by SIGALRM inside a graded item. A BaseException so that the ``except Exception`` blocks
    in math-verify / latex2sympy (which turn errors into "unparseable") cannot swallow it."""


class _Alarm:
    armed = False


def _on_alarm(signum: int, frame: Any) -> None:
    if _Alarm.armed:
        raise _ItemTimeout()


def _run_limited(fn: Any, limit_s: float | None, *args: Any) -> Any:
    """``fn(*args)``, interrupted by :class:`_ItemTimeout` after ``limit_s`` seconds (None: no limit).
    The alarm repeats every 50 ms until disarmed, in case a library catches one of them."""
    if limit_s is None:
        return fn(*args)
    _Alarm.armed = True
    signal.setitimer(signal.ITIMER_REAL, max(limit_s, 1e-3), 0.05)
    try:
        return fn(*args)
    finally:
        _Alarm.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def _unpack(item: Sequence[Any]) -> tuple[Any, Any, Any]:
    """``(completion, gold, problem)`` of a batch item ``(completion, gold)`` or ``(completion, gold,
    problem)``."""
    if len(item) == 2:
        return item[0], item[1], None
    if len(item) == 3:
        return item[0], item[1], item[2]
    raise ValueError(f"a batch item is (completion, gold) or (completion, gold, problem), got {len(item)} values")


def grade_many(
    items: Sequence[tuple[str, str | int | float] | tuple[str, str | int | float, str | None]],
    item_timeout_s: float = 5.0,
    budget_s: float | None = None,
) -> list[tuple[str | None, bool, str]]:
    """Grade a batch of ``(completion, gold)`` pairs in this process, each under a soft timeout.

    Args:
        items: ``(completion, gold)`` pairs or ``(completion, gold, problem)`` triples, as for :func:`grade`.
        item_timeout_s: seconds one answer may take (> 0). Enforced with ``SIGALRM``, so only when
            called on the main thread (as in a RewardPool worker); elsewhere there is no soft limit.
        budget_s: seconds the whole batch may take (None: no limit). Items that the budget cuts short
            or never reaches get status ``"skipped"`` (not graded: the caller grades them again).
            :func:`grade_in_pool` sets it below the pool's hard timeout so the pool never kills a
            batch that is only slow.

    Returns:
        One ``(extracted, correct, status)`` per item, in order. ``status``: ``"ok"``; ``"timeout"``
        (over ``item_timeout_s``: counted ungraded, ``correct`` False); ``"error"`` (bad gold answer:
        :func:`grade` raised; re-grade alone for the message); ``"skipped"`` (see ``budget_s``).
        ``extracted`` is filled in for every status but ``"error"`` with a bad completion.

    Raises:
        ValueError: ``item_timeout_s`` or ``budget_s`` not a positive number; an item of another length.
    """
    items = [_unpack(item) for item in items]
    for name, val in (("item_timeout_s", item_timeout_s), ("budget_s", budget_s)):
        if val is not None and not (isinstance(val, (int, float)) and val > 0 and math.isfinite(val)):
            raise ValueError(f"{name} must be a positive number of seconds, got {val!r}")
    try:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        can_alarm = True
    except ValueError:  # not the main thread: signals cannot be used here
        previous, can_alarm = None, False
    start = time.monotonic()
    # an alarm someone else set (e.g. pytest-timeout) shares this timer: it is restored afterwards
    outer_timer = signal.getitimer(signal.ITIMER_REAL) if can_alarm else (0.0, 0.0)
    deadline = None if budget_s is None else start + budget_s
    out: list[tuple[str | None, bool, str]] = []
    try:
        for completion, gold, problem in items:
            try:
                extracted = extract_answer(completion)
            except Exception:
                out.append((None, False, "error"))
                continue
            limit: float | None = float(item_timeout_s) if can_alarm else None
            by_budget = False
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    out.append((extracted, False, "skipped"))
                    continue
                if can_alarm and left < item_timeout_s:
                    limit, by_budget = left, True
            try:
                _, correct = _run_limited(grade, limit, completion, gold, True, problem)
                out.append((extracted, bool(correct), "ok"))
            except _ItemTimeout:
                out.append((extracted, False, "skipped" if by_budget else "timeout"))
            except Exception:
                out.append((extracted, False, "error"))
    finally:
        if can_alarm:
            _Alarm.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if outer_timer[0] > 0:
                left = outer_timer[0] - (time.monotonic() - start)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), outer_timer[1])
    return out


def grade_batch(
    items: Sequence[tuple[str, str | int | float] | tuple[str, str | int | float, str | None]],
    item_timeout_s: float = 5.0,
    budget_s: float | None = None,
) -> tuple[list[tuple[str | None, bool, str]], float]:
    """Pool entry point ``"areal_cli.reward.math_grader:grade_batch"``: :func:`grade_many` plus the
    fraction of items graded correct as the last element, which the pool takes as the call's reward
    (:func:`areal_cli.reward.pool.to_reward`); the per-item results are ``RewardResult.value[0]``."""
    results = grade_many(items, item_timeout_s, budget_s)
    return results, (sum(r[1] for r in results) / len(results) if results else 0.0)


class GradedAnswer(NamedTuple):
    """Outcome of one answer graded by :func:`grade_in_pool`."""

    extracted: str | None
    correct: bool
    status: str  # "ok" | "timeout" | "error"
    message: str = ""


def grade_in_pool(
    pool: "RewardPool",
    items: Sequence[tuple[str, str | int | float] | tuple[str, str | int | float, str | None]],
    *,
    batch_size: int = 32,
    item_timeout_s: float | None = None,
    batch_fn: str = GRADE_BATCH_FN,
) -> list[GradedAnswer]:
    """Grade many ``(completion, gold)`` pairs (or ``(completion, gold, problem)`` triples) through ``pool``
    in batches, robust to hangs.

    Each batch is one pool call of :func:`grade_batch` with a soft per-answer timeout
    (``item_timeout_s``, default half the pool's ``timeout_s``) and a batch budget of 80 % of the pool's
    hard timeout. The items of a batch the pool could not finish (hard timeout: worker killed; worker
    died) and the items the budget skipped are graded again one per pool call with :func:`grade`, each
    under the pool's hard timeout; items with status "error" too (to get the message). So a hang costs
    one answer (status "timeout"), never the batch.

    Args:
        pool: an open RewardPool (any function; this calls ``grade_batch`` and ``grade`` by name).
        items: ``(completion, gold)`` pairs or ``(completion, gold, problem)`` triples (see :func:`grade`).
        batch_size: answers per pool call (>= 1).
        item_timeout_s: soft limit per answer inside a batch (> 0), default ``pool.timeout_s / 2``.
        batch_fn: the pool function for a batch, with :func:`grade_batch`'s arguments and return value.

    Returns:
        One :class:`GradedAnswer` per item, in order. Status "timeout" and "error" are graded wrong.

    Raises:
        ValueError: ``batch_size`` < 1, a bad ``item_timeout_s``, or an item of another length.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    soft = pool.timeout_s / 2 if item_timeout_s is None else item_timeout_s
    if not (isinstance(soft, (int, float)) and soft > 0 and math.isfinite(soft)):
        raise ValueError(f"item_timeout_s must be a positive number of seconds, got {item_timeout_s!r}")
    items = list(items)
    for item in items:
        _unpack(item)
    budget = 0.8 * pool.timeout_s
    batches = [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
    results = pool.score_many([(b, soft, budget) for b in batches], fn=batch_fn)
    out: list[GradedAnswer | None] = []
    redo: list[int] = []
    for batch, res in zip(batches, results):
        if res.status != "ok":
            redo.extend(range(len(out), len(out) + len(batch)))
            out.extend([None] * len(batch))
            continue
        for extracted, correct, status in res.value[0]:
            if status in ("skipped", "error"):
                redo.append(len(out))
                out.append(None)
            else:
                msg = f"no result within the soft limit of {soft:g} s" if status == "timeout" else ""
                out.append(GradedAnswer(extracted, bool(correct), status, msg))
    if redo:
        # one answer per call: grade(completion, gold[, string_match, problem])
        singles = pool.score_many([_single_args(items[i]) for i in redo], fn=GRADE_FN)
        for i, res in zip(redo, singles):
            if res.status == "ok":
                extracted, correct = res.value
                out[i] = GradedAnswer(extracted, bool(correct), "ok")
            else:
                out[i] = GradedAnswer(_safe_extract(items[i][0]), False, res.status, res.message)
    return [g for g in out if g is not None]


def _single_args(item: Sequence[Any]) -> tuple[Any, ...]:
    completion, gold, problem = _unpack(item)
    return (completion, gold) if problem is None else (completion, gold, True, problem)


def _safe_extract(completion: Any) -> str | None:
    try:
        return extract_answer(completion)
    except Exception:
        return None

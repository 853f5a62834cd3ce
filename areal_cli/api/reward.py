"""The reward-function contract and its entry point in the reward worker pool.

Contract (AReaL ``areal/api/reward_api.py``)::

    def reward(prompt: str, completion: str, prompt_ids: list[int], completion_ids: list[int],
               **fields) -> float

``prompt`` is the rendered prompt text, ``completion`` the decoded output (special tokens skipped, as
``tokenizer.decode(..., skip_special_tokens=True)``; tokens like ``<think>`` that are not special stay), the
ids are the exact token ids, and ``fields`` are the dataset record's fields. Fields named like one of the
four positional parameters are not passed again (the positional value wins: a record's ``prompt`` field
arrives as the rendered ``prompt``); AReaL names its first parameter ``prompts`` to dodge the same clash.
The function returns a number or a bool (or a tuple whose last element is one, as the built-in graders do);
it must be importable by name (``module:attr`` / ``file.py:attr``) in a fresh process.

It runs in :class:`areal_cli.reward.pool.RewardPool` workers through :func:`call_reward` with a hard
timeout; every call ends ``ok``, ``error`` (raised, returned a non-number, worker died) or ``timeout`` and
is counted -- a failure is never a silent 0 (the episode is dropped and counted).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from areal_cli.api.loading import add_code_dir, load_object
from areal_cli.foundations.errors import UserError

#: The pool function that calls a user reward (``RewardPool(CALL_REWARD, ...)``).
CALL_REWARD = "areal_cli.api.reward:call_reward"
POSITIONAL = ("prompt", "completion", "prompt_ids", "completion_ids")

_CACHE: dict[str, Callable[..., Any]] = {}


def reward_kwargs(fields: dict) -> dict:
    """The record fields passed as keyword arguments (those named like a positional parameter dropped)."""
    return {k: v for k, v in fields.items() if k not in POSITIONAL}


def resolve_reward(spec: str, what: str = "field 'task.reward'") -> Callable[..., Any]:
    """Import the reward function named by ``spec`` and check it can take the four positional arguments.

    Raises:
        UserError: not importable, not callable, an ``async def``, or a signature that cannot take
            ``(prompt, completion, prompt_ids, completion_ids)``.
    """
    fn = load_object(spec, what)
    if not callable(fn):
        raise UserError(f"{what}: {spec} is not callable")
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        raise UserError(f"{what}: {spec} is an async function; a reward is called synchronously in worker "
                        f"processes: make it a plain def")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return fn
    try:
        sig.bind_partial("p", "c", [0], [0])
    except TypeError as e:
        raise UserError(f"{what}: {spec}{sig} cannot take (prompt, completion, prompt_ids, completion_ids): {e}"
                        ) from None
    return fn


def check_fields(spec: str, fields: dict, where: str, what: str = "field 'task.reward'") -> None:
    """Check that the reward function named by ``spec`` accepts a record's fields as keywords.

    Raises:
        UserError: ``<where>: <what>: spec(...) cannot take the record's fields [...]: why``.
    """
    fn = resolve_reward(spec, what)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind("p", "c", [0], [0], **reward_kwargs(fields))
    except TypeError as e:
        raise UserError(f"{where}: {what}: {spec}{sig} cannot take the record's fields "
                        f"{sorted(reward_kwargs(fields))}: {e} (add **kwargs)") from None


def call_reward(spec: str, code_dir: str, prompt: str, completion: str, prompt_ids: list[int],
                completion_ids: list[int], fields: dict) -> Any:
    """Pool entry point: call the user reward ``spec`` (imported once per worker process).

    Raises:
        Exception: whatever the reward raises (the pool turns it into status ``"error"``).
    """
    fn = _CACHE.get(spec)
    if fn is None:
        add_code_dir(code_dir)
        fn = _CACHE[spec] = resolve_reward(spec)
    return fn(prompt, completion, prompt_ids, completion_ids, **reward_kwargs(fields))


def check_loads(spec: str, code_dir: str) -> bool:
    """Pool entry point: import the reward in a worker (a run checks this before it starts)."""
    add_code_dir(code_dir)
    _CACHE[spec] = resolve_reward(spec)
    return True

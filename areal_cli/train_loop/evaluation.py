"""Held-out accuracy during a run: the task's workflow on the fixed held-out items, one policy version.
"""

from __future__ import annotations

import asyncio


from areal_cli.api.types import Group, Item, RewardFailed, WorkflowError
from areal_cli.foundations.errors import UserError, raised_at
from areal_cli.rollout.protocol import ServerError
from areal_cli.train_loop.context import RunContext


async def evaluate(ctx: RunContext) -> float | None:
    """Held-out accuracy in [0, 1]: the task's workflow on the fixed held-out items with the evaluation's
    sampling (``loop.eval_temperature``, default greedy; ``loop.eval_n_samples`` per prompt), the fraction of samples
    whose reward is > 0. An episode the workflow rejects, or whose reward failed (error / timeout), counts as
    wrong and is counted (``ctx.eval_failures``), as ``areal eval`` counts grader failures. Every token must come
    from one policy version (the servers' current one): nothing may update the weights during an evaluation.

    A multi-turn workflow (one that reports :attr:`~areal_cli.api.types.Group.conversations`) also leaves its
    first-try accuracy, accuracy within ``max_turns`` and mean turns in ``ctx.eval_turns``
    (:func:`~areal_cli.workflows.multi_turn.conversation_metrics`; an episode whose reward failed counts as
    ``loop.eval_n_samples`` wrong conversations); None otherwise.

    Returns None when the run has no held-out items (``loop.eval_n_prompts: 0``).
    Raises:
        WorkflowError: the workflow raised or returned something that is not a Group (one line).
        RuntimeError: the samples mix policy versions.
    """
    from areal_cli.rollout.controller import check_group, check_reward_health

    ctx.eval_turns = None
    if not ctx.eval_items:
        return None
    spec = ctx.task.workflow_spec

    async def one(i: int, item: Item) -> Group | None:
        try:
            group = await ctx.task.workflow.arun_episode(ctx.eval_episodes.for_episode(i, item), item)
        except RewardFailed:
            return None
        except (asyncio.CancelledError, UserError, ServerError):
            raise
        except Exception as e:  # noqa: BLE001 - a bug in the workflow: one line naming it
            raise WorkflowError(f"workflow {spec}: arun_episode raised {type(e).__name__}: {e}{raised_at(e)} "
                                f"(held-out item {item.where or item.id})") from e
        if group is not None:
            check_group(group, spec, item)
        return group

    failed_before = ctx.eval_episodes.stats.reward_status["error"] + ctx.eval_episodes.stats.reward_status["timeout"]
    groups = await asyncio.gather(*(one(i, it) for i, it in enumerate(ctx.eval_items)))
    stats = ctx.eval_episodes.stats
    ctx.eval_failures = stats.reward_status["error"] + stats.reward_status["timeout"] - failed_before
    check_reward_health(stats, ctx.task.reward_spec)
    n = ctx.cfg.loop.eval_n_samples
    correct = sum(sum(s.reward > 0 for s in g.samples) for g in groups if g is not None)
    total = sum(max(len(g.samples), n) if g is not None else n for g in groups)
    versions = {v for g in groups if g is not None for s in g.samples for v in s.versions if v >= 0}
    if versions - {ctx.version}:
        raise RuntimeError(f"held-out evaluation mixed policy versions {sorted(versions)} (expected {ctx.version})")
    if any(g is not None and g.conversations for g in groups):
        from areal_cli.workflows.multi_turn import conversation_metrics

        outcomes = [o for g in groups for o in (g.conversations or [] if g is not None else [None] * n)]
        ctx.eval_turns = conversation_metrics(outcomes)
    return correct / max(total, 1)

"""Rollout controller: keeps the rollout servers busy with episodes, within the staleness bound.

The controller only admits, schedules and collects: one asyncio task admits an episode while
:class:`~areal_cli.rollout.staleness.StalenessManager` gives capacity; each episode runs the task's rollout
workflow (``await workflow.arun_episode(client, item)``, :mod:`areal_cli.api.workflow`; the built-in
single-turn one, :class:`~areal_cli.workflows.rlvr.RLVRWorkflow`, samples ``rollout.group_size`` answers in one
batched ``/generate`` and scores each as it finishes, in a worker pool with a timeout). An episode that
returns ``None`` is rejected (``groups_rejected``); one whose reward failed (crash or timeout: counted and
reported, never turned into a silent 0) is dropped (``groups_dropped_reward_failure``); a finished group
is dropped (and counted) if its success rate is outside ``[success_rate_lb, success_rate_ub]``; otherwise it
is queued for the trainer, which takes ``rollout.batch_size`` groups per step with :meth:`get_batch`. A workflow that
raises anything else, or returns something that is not a well-formed :class:`~areal_cli.api.types.Group`,
ends the run (:class:`~areal_cli.api.types.WorkflowError`, one line naming the workflow).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any, Iterator

from areal_cli.api.types import Group, Item, RewardFailed, Trajectory, WorkflowError  # noqa: F401 (re-exported)
from areal_cli.foundations.errors import UserError, raised_at
from areal_cli.rollout.episode import EpisodeClient, EpisodeStats
from areal_cli.rollout.protocol import ProtocolError, ServerError
from areal_cli.rollout.staleness import StalenessManager

#: The controller's former name for :class:`~areal_cli.api.types.Item`.
PromptItem = Item


@dataclass
class ControllerStats(EpisodeStats):
    """Counters reported in metrics and on the live status (the episode counters plus the groups')."""

    groups_submitted: int = 0
    groups_accepted: int = 0
    groups_rejected: int = 0
    groups_dropped_filter: int = 0
    groups_dropped_reward_failure: int = 0
    groups_dropped_stale: int = 0  # accepted, then too old for the consumer (get_batch consumer_version)
    prompts_dropped_too_long: int = 0
    # every scored group, before the success-rate filter: the reward the policy actually gets
    samples_scored: int = 0
    reward_sum_scored: float = 0.0

    def as_dict(self) -> dict:
        return {
            "samples_scored": self.samples_scored,
            "reward_sum_scored": round(self.reward_sum_scored, 6),
            "groups_submitted": self.groups_submitted,
            "groups_accepted": self.groups_accepted,
            "groups_rejected": self.groups_rejected,
            "groups_dropped_filter": self.groups_dropped_filter,
            "groups_dropped_reward_failure": self.groups_dropped_reward_failure,
            "groups_dropped_stale": self.groups_dropped_stale,
            "reward_ok": self.reward_status["ok"],
            "reward_error": self.reward_status["error"],
            "reward_timeout": self.reward_status["timeout"],
            "samples_generated": self.samples_generated,
            "tokens_generated": self.tokens_generated,
            "interruptions": self.interruptions,
            "prompts_dropped_too_long": self.prompts_dropped_too_long,
        }


def _head_version(group: Group) -> int:
    """The oldest policy version that generated a token of ``group`` (a large number when none was generated).
    Version -1 marks tokens that were not generated (environment / template tokens of the concatenated layout,
    :attr:`Trajectory.loss_mask`): they are skipped."""
    return min((v for s in group.samples for v in s.versions if v >= 0), default=1 << 62)


def too_stale(group: Group, consumer_version: int, eta: int) -> bool:
    """Whether ``group``'s head is more than ``eta`` versions older than ``consumer_version`` (the trainer's
    version when it takes the group): the staleness bound of AReaL's Section 5.1 (max_head_offpolicyness)."""
    return _head_version(group) < consumer_version - eta


class RolloutController:
    """Admits episodes under the staleness rule, runs the workflow, collects scored, filtered groups.

    Args:
        client: the :class:`~areal_cli.rollout.episode.EpisodeClient` template (rollout client, reward
            pool and function, tokenizer, sampling, group size); each episode gets ``client.for_episode(id, item)``,
            sharing :attr:`stats`.
        staleness: admission control; the controller calls on_submit/on_accept/on_reject.
        items: an endless iterator of :class:`~areal_cli.api.types.Item` (the data position is its consumption).
        workflow: the rollout workflow (``async arun_episode(client, item) -> Group | None``).
        workflow_name: how errors name it (its ``module:attr``).
        success_rate_lb, success_rate_ub: keep a group iff lb <= success rate <= ub.
    """

    def __init__(self, client: EpisodeClient, staleness: StalenessManager, items: Iterator[Item], workflow: Any,
                 *, workflow_name: str = "workflow", success_rate_lb: float = 0.0,
                 success_rate_ub: float = 1.0) -> None:
        self.stats = ControllerStats()
        self.client = client.for_episode(0)
        self.client.stats = self.stats
        self.staleness = staleness
        self.prompts = items
        self.workflow = workflow
        self.workflow_name = workflow_name
        self.lb, self.ub = success_rate_lb, success_rate_ub
        self._ready: asyncio.Queue[Group] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._group_ids = itertools.count()
        self._pending: set[int] = set()  # admitted, not yet dropped or handed to the trainer
        self._loop_task: asyncio.Task | None = None
        self._error: BaseException | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start admitting episodes (call from inside the running event loop)."""
        self._loop_task = asyncio.create_task(self._admission_loop(), name="rollout-admission")
        self._loop_task.add_done_callback(self._on_admission_done)

    def _on_admission_done(self, task: asyncio.Task) -> None:
        """The admission loop only ends by cancellation; anything else (bad data met mid-run: a record whose
        prompt cannot be rendered, every prompt too long) is the run's error, raised by :meth:`get_batch`."""
        if not task.cancelled() and task.exception() is not None and self._error is None:
            self._error = task.exception()

    async def stop(self) -> None:
        """Cancel admission and every in-flight episode."""
        tasks = [t for t in [self._loop_task, *self._tasks] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def notify_version(self, version: int) -> None:
        """The trainer published ``version``: update the staleness counter and re-check capacity."""
        self.staleness.set_version(version)
        self._wake.set()

    # --- trainer side ----------------------------------------------------------------------
    async def get_batch(self, n_groups: int, consumer_version: int | None = None) -> list[Group]:
        """Wait for and return ``n_groups`` accepted groups, oldest first.

        With ``consumer_version`` (the policy version the trainer will update from; config ``stale_groups:
        drop``), a group whose head (its oldest generated token) is more than ``rollout.max_head_offpolicyness`` versions
        older is dropped instead (:meth:`release_stale`): admission control bounds staleness for groups that
        finish in order, this keeps the bound for stragglers too (long answers, samples re-issued after their
        server died). Without it (``rollout.stale_groups: train``) staleness is bounded at admission only, as in AReaL.

        Raises:
            UserError (WorkflowError, RewardBroken, bad data met mid-run) / ServerError: as raised.
            RuntimeError: any other failure of an episode task; the cause is chained.
        """
        out: list[Group] = []
        while len(out) < n_groups:
            if self._error is not None:
                if isinstance(self._error, (UserError, ServerError)):
                    raise self._error
                raise RuntimeError(f"rollout failed: {self._error}") from self._error
            try:
                group = await asyncio.wait_for(self._ready.get(), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            self._pending.discard(group.group_id)
            if consumer_version is not None and too_stale(group, consumer_version,
                                                          self.staleness.max_head_offpolicyness):
                self.release_stale()
                continue
            out.append(group)
        return out

    def release_stale(self) -> None:
        """An accepted group was dropped at consumption as too stale: count it (``groups_dropped_stale``) and
        give its slot back to admission."""
        self.stats.groups_dropped_stale += 1
        self.staleness.on_stale()
        self._wake.set()

    def pending_group_ids(self) -> list[int]:
        """Ids of the episodes admitted but neither dropped nor handed to the trainer yet (generating, being
        scored, or accepted and queued), ascending. A checkpoint re-issues their prompts after a resume."""
        return sorted(self._pending)

    @property
    def n_ready(self) -> int:
        return self._ready.qsize()

    # --- internals -------------------------------------------------------------------------
    async def _admission_loop(self) -> None:
        while True:
            while self.staleness.capacity() > 0:
                self.staleness.on_submit()
                item = next(self.prompts)
                gid = next(self._group_ids)
                self._pending.add(gid)
                self.stats.groups_submitted += 1
                task = asyncio.create_task(self._run_group(gid, item), name=f"group-{gid}")
                self._tasks.add(task)
                task.add_done_callback(self._on_group_done)
            self._wake.clear()
            await self._wake.wait()

    def _on_group_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._error is None:
            self._error = task.exception()
        self._wake.set()

    def _drop(self, gid: int, counter: str) -> None:
        setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        self._pending.discard(gid)
        self.staleness.on_reject()

    async def _run_group(self, gid: int, item: Item) -> None:
        try:
            group = await self.workflow.arun_episode(self.client.for_episode(gid, item), item)
        except RewardFailed:
            self._drop(gid, "groups_dropped_reward_failure")
            check_reward_health(self.stats, self.client.reward_spec)
            return
        except (asyncio.CancelledError, ServerError, ProtocolError, WorkflowError):
            raise
        except Exception as e:  # noqa: BLE001 - a bug in the workflow: one line naming it
            raise WorkflowError(f"workflow {self.workflow_name}: arun_episode raised {type(e).__name__}: {e}"
                                f"{raised_at(e)} (item {item.where or item.id})") from e
        if group is None:
            self._drop(gid, "groups_rejected")
            return
        check_group(group, self.workflow_name, item)
        group.group_id = gid
        for s in group.samples:
            s.group_id = gid
        self.stats.samples_scored += len(group.samples)
        self.stats.reward_sum_scored += sum(float(s.reward) for s in group.samples)
        if not (self.lb <= group.success_rate <= self.ub):
            self._drop(gid, "groups_dropped_filter")
            return
        self.stats.groups_accepted += 1
        self.staleness.on_accept()
        self._ready.put_nowait(group)


#: Reward calls seen before the failure fraction is judged, and the fraction that means a broken reward.
REWARD_HEALTH_MIN_CALLS = 32
REWARD_HEALTH_MAX_FAILED = 0.5


class RewardBroken(UserError):
    """Most reward calls fail: the reward function (or its data) is broken; the run stops (one line)."""


def check_reward_health(stats: Any, reward_spec: str) -> None:
    """Stop the run when at least :data:`REWARD_HEALTH_MIN_CALLS` reward calls were made and more than
    :data:`REWARD_HEALTH_MAX_FAILED` of them ended in error or timeout: dropping every group would otherwise
    starve the trainer forever (each failure stays counted; a few failures only drop their groups).

    Raises:
        RewardBroken: ``reward <spec>: N of M calls failed, e.g. ...``.
    """
    failed = stats.reward_status["error"] + stats.reward_status["timeout"]
    total = failed + stats.reward_status["ok"]
    if total >= REWARD_HEALTH_MIN_CALLS and failed > REWARD_HEALTH_MAX_FAILED * total:
        example = stats.reward_failure_examples[0] if stats.reward_failure_examples else "?"
        raise RewardBroken(f"reward {reward_spec}: {failed} of {total} calls failed (e.g. {example}); the reward "
                           f"function or the fields it reads are broken")


def check_group(group: Any, workflow_name: str, item: Item) -> None:
    """A workflow's result must be a :class:`Group` of well-formed trajectories.

    Raises:
        WorkflowError: one line naming the workflow and what is wrong.
    """
    bad = None
    if not isinstance(group, Group):
        bad = f"returned {type(group).__name__}, expected a Group or None"
    elif not group.samples:
        bad = "returned a Group without samples"
    else:
        for i, s in enumerate(group.samples):
            why = s.check() if isinstance(s, Trajectory) else f"is a {type(s).__name__}, not a Trajectory"
            if why:
                bad = f"returned a Group whose sample {i} {why if why.startswith('is ') else 'has ' + why}"
                break
    if bad:
        raise WorkflowError(f"workflow {workflow_name}: arun_episode {bad} (item {item.where or item.id})")

"""Rollout controller: keeps the rollout servers busy with prompt groups, within the staleness bound.

One asyncio task admits groups while :class:`~areal_cli.rollout.staleness.StalenessManager` gives
capacity; each group is ``group_size`` independent interruptible samples of one prompt, sent as one batched
``/generate`` (aborted samples are resumed one by one). Every sample is
scored as soon as it finishes (streaming reward, in a worker pool with a timeout). A finished group is
dropped (and counted) if its success rate is outside ``[success_rate_lb, success_rate_ub]`` or if any of
its rewards failed (crash or timeout: counted and reported, never turned into a silent 0); otherwise it
is queued for the trainer, which takes ``batch_size`` groups per step with :meth:`get_batch`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

from areal_cli.rollout.client import Completion, RolloutClient
from areal_cli.rollout.protocol import SamplingParams
from areal_cli.rollout.staleness import StalenessManager


@dataclass(frozen=True)
class PromptItem:
    """One prompt of the training set: token ids (chat template applied) and its reference answer."""

    prompt_id: str
    prompt_ids: list[int]
    answer: str


@dataclass
class Trajectory:
    """One sample: the trainer's data contract (DESIGN §3).

    ``versions[i]`` is the policy version that produced ``output_ids[i]``; behaviour logprobs are the
    server's, verbatim.
    """

    prompt_ids: list[int]
    output_ids: list[int]
    behaviour_logprobs: list[float]
    versions: list[int]
    reward: float
    group_id: int
    finish_reason: str
    n_interruptions: int

    @property
    def head_version(self) -> int:
        """Version of the first generated token (-1 when nothing was generated)."""
        return min(self.versions) if self.versions else -1


@dataclass
class Group:
    """``group_size`` samples of one prompt."""

    group_id: int
    prompt: PromptItem
    samples: list[Trajectory]

    @property
    def success_rate(self) -> float:
        return sum(s.reward > 0 for s in self.samples) / len(self.samples)


@dataclass
class ControllerStats:
    """Counters reported in metrics and on the live status."""

    groups_submitted: int = 0
    groups_accepted: int = 0
    groups_dropped_filter: int = 0
    groups_dropped_reward_failure: int = 0
    reward_status: Counter = field(default_factory=Counter)  # ok / error / timeout
    reward_failure_examples: list[str] = field(default_factory=list)
    samples_generated: int = 0
    tokens_generated: int = 0
    interruptions: int = 0

    def as_dict(self) -> dict:
        return {
            "groups_submitted": self.groups_submitted,
            "groups_accepted": self.groups_accepted,
            "groups_dropped_filter": self.groups_dropped_filter,
            "groups_dropped_reward_failure": self.groups_dropped_reward_failure,
            "reward_ok": self.reward_status["ok"],
            "reward_error": self.reward_status["error"],
            "reward_timeout": self.reward_status["timeout"],
            "samples_generated": self.samples_generated,
            "tokens_generated": self.tokens_generated,
            "interruptions": self.interruptions,
        }


class RolloutController:
    """Admits prompt groups under the staleness rule and collects scored, filtered groups.

    Args:
        client: the rollout client (embedded servers or SGLang).
        staleness: admission control; the controller calls on_submit/on_accept/on_reject.
        prompts: an endless iterator of :class:`PromptItem` (the data position is its consumption).
        reward_pool: object with ``async score(completion_text, answer) -> RewardResult``.
        decode: token ids -> text, for the reward function.
        group_size: samples per prompt (n).
        sampling: sampling parameters of every request.
        success_rate_lb, success_rate_ub: keep a group iff lb <= success rate <= ub.
    """

    def __init__(
        self,
        client: RolloutClient,
        staleness: StalenessManager,
        prompts: Iterator[PromptItem],
        reward_pool,
        decode: Callable[[list[int]], str],
        *,
        group_size: int,
        sampling: SamplingParams,
        success_rate_lb: float = 0.0,
        success_rate_ub: float = 1.0,
    ) -> None:
        self.client = client
        self.staleness = staleness
        self.prompts = prompts
        self.reward_pool = reward_pool
        self.decode = decode
        self.group_size = group_size
        self.sampling = sampling
        self.lb, self.ub = success_rate_lb, success_rate_ub
        self.stats = ControllerStats()
        self._ready: asyncio.Queue[Group] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._group_ids = itertools.count()
        self._pending: set[int] = set()  # admitted, not yet dropped or handed to the trainer
        self._loop_task: asyncio.Task | None = None
        self._error: BaseException | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start admitting groups (call from inside the running event loop)."""
        self._loop_task = asyncio.create_task(self._admission_loop(), name="rollout-admission")

    async def stop(self) -> None:
        """Cancel admission and every in-flight group."""
        tasks = [t for t in [self._loop_task, *self._tasks] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def notify_version(self, version: int) -> None:
        """The trainer published ``version``: update the staleness counter and re-check capacity."""
        self.staleness.set_version(version)
        self._wake.set()

    # --- trainer side ----------------------------------------------------------------------
    async def get_batch(self, n_groups: int) -> list[Group]:
        """Wait for and return ``n_groups`` accepted groups, oldest first.

        Raises:
            RuntimeError: if a group task failed (e.g. a server died); the cause is chained.
        """
        out: list[Group] = []
        while len(out) < n_groups:
            if self._error is not None:
                raise RuntimeError(f"rollout failed: {self._error}") from self._error
            try:
                group = await asyncio.wait_for(self._ready.get(), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            self._pending.discard(group.group_id)
            out.append(group)
        return out

    def pending_group_ids(self) -> list[int]:
        """Ids of the groups admitted but neither dropped nor handed to the trainer yet (generating, being
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
                prompt = next(self.prompts)
                gid = next(self._group_ids)
                self._pending.add(gid)
                self.stats.groups_submitted += 1
                task = asyncio.create_task(self._run_group(gid, prompt), name=f"group-{gid}")
                self._tasks.add(task)
                task.add_done_callback(self._on_group_done)
            self._wake.clear()
            await self._wake.wait()

    def _on_group_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._error is None:
            self._error = task.exception()
        self._wake.set()

    async def _score(self, comp: Completion, prompt: PromptItem):
        self.stats.samples_generated += 1
        self.stats.tokens_generated += len(comp.output_ids)
        self.stats.interruptions += comp.n_interruptions
        result = await self.reward_pool.score(self.decode(comp.output_ids), prompt.answer)
        self.stats.reward_status[result.status] += 1
        if result.status != "ok" and len(self.stats.reward_failure_examples) < 5:
            self.stats.reward_failure_examples.append(f"{result.status}: {result.message}")
        return comp, result

    async def _run_group(self, gid: int, prompt: PromptItem) -> None:
        comps = await self.client.generate_group(prompt.prompt_ids, self.group_size, self.sampling, rid=f"g{gid}")
        results = await asyncio.gather(*(self._score(c, prompt) for c in comps))
        if any(r.status != "ok" for _, r in results):
            self.stats.groups_dropped_reward_failure += 1
            self._pending.discard(gid)
            self.staleness.on_reject()
            return
        group = Group(
            gid,
            prompt,
            [
                Trajectory(
                    prompt_ids=list(prompt.prompt_ids),
                    output_ids=c.output_ids,
                    behaviour_logprobs=c.output_logprobs,
                    versions=c.output_versions,
                    reward=float(r.reward),
                    group_id=gid,
                    finish_reason=c.finish_reason,
                    n_interruptions=c.n_interruptions,
                )
                for c, r in results
            ],
        )
        if not (self.lb <= group.success_rate <= self.ub):
            self.stats.groups_dropped_filter += 1
            self._pending.discard(gid)
            self.staleness.on_reject()
            return
        self.stats.groups_accepted += 1
        self.staleness.on_accept()
        self._ready.put_nowait(group)

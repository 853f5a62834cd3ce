"""What a running job holds (:class:`RunContext`): config, output folder, task, tokenizer, trainer group, rollout
client, servers, reward pool, episode clients, status; passed to every phase of the run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from areal_cli.api.types import Item
from areal_cli.config import TrainConfig
from areal_cli.reward.pool import RewardPool
from areal_cli.rollout.client import RolloutClient
from areal_cli.rollout.episode import EpisodeClient
from areal_cli.rollout.fleet import Fleet
from areal_cli.rollout.remote_controller import RolloutProcess
from areal_cli.train_loop.run_status import RunStatus
from areal_cli.tasks.task import Task
from areal_cli.foundations.timeline import Timeline
from areal_cli.trainer.group import TrainerGroup


STEPS = "areal_cli.trainer.steps"  # the trainer-side functions, called by name through the trainer group


@dataclass
class RunContext:
    """Everything a running job holds: config, output dir, task, tokenizer, trainer group, client, servers."""

    cfg: TrainConfig
    out: Path
    task: Task
    tokenizer: Any
    trainer: TrainerGroup
    client: RolloutClient
    fleet: Fleet
    reward_pool: RewardPool
    episodes: EpisodeClient  # the training episode client template
    eval_episodes: EpisodeClient  # the same with the held-out evaluation's sampling
    eval_items: list[Item]
    status: RunStatus
    t0: float
    timeline: Timeline | None = None
    rollout_process: RolloutProcess | None = None  # the controller in its own process (rollout_process: true)
    version: int = 0  # the policy version the servers hold
    bench: Any = None  # in-loop benchmark evaluation (areal_cli.eval.in_loop.BenchmarkEval) or None
    eval_failures: int = 0  # reward failures of the latest held-out evaluation (counted as wrong)
    eval_turns: dict | None = None  # multi-turn workflows: conversation_metrics of the latest held-out evaluation
    reward_failure_shown: bool = False  # the run's first reward failure was shown in the live status
    tracker: Any = None  # experiment tracking (areal_cli.train_loop.tracking.Tracker) or None
    served: tuple[Path, int] | None = None  # (weights dir, policy version) the servers hold
    fleet_lock: asyncio.Lock | None = None  # held by weight updates and by server restarts
    supervisor: Any = None  # areal_cli.rollout.supervisor.FleetSupervisor (controller in this process)
    supervisor_task: asyncio.Task | None = None
    sandbox: dict | None = None  # code tasks: the sandbox isolation in force (areal_cli.sandbox.status)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    async def train(self, name: str, *args, **kwargs):
        """``await self.trainer.call(name, ...)``: engine work, in order (see :mod:`areal_cli.trainer.group`)."""
        return await self.trainer.call(name, *args, **kwargs)

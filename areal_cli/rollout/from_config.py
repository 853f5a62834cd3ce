"""The rollout side of a run, built from its config and task: the reward pool, the sampling parameters,
the episode client template and the rollout controller (used by :mod:`areal_cli.train_loop` and by the
rollout process, :mod:`areal_cli.rollout.remote_controller`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from areal_cli.api.reward import CALL_REWARD
from areal_cli.api.types import Item
from areal_cli.config import TrainConfig
from areal_cli.foundations.errors import UserError
from areal_cli.reward.pool import RewardPool
from areal_cli.rollout.controller import RolloutController
from areal_cli.rollout.episode import EpisodeClient
from areal_cli.rollout.protocol import SamplingParams
from areal_cli.rollout.staleness import StalenessManager


def stop_token_ids(model_dir: Path, tokenizer: Any) -> list[int]:
    """End-of-sequence ids of the model: ``config.json`` and ``generation_config.json`` ``eos_token_id`` and
    the tokenizer's eos (deduplicated, in that order). Generation stops at any of them."""
    ids: list[int] = []

    def add(v: Any) -> None:
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, int) and not isinstance(x, bool) and x not in ids:
                ids.append(x)

    for name in ("config.json", "generation_config.json"):
        p = Path(model_dir) / name
        if p.is_file():
            try:
                add(json.loads(p.read_text(encoding="utf-8")).get("eos_token_id"))
            except (json.JSONDecodeError, AttributeError, OSError):
                pass
    add(getattr(tokenizer, "eos_token_id", None))
    return ids


def sampling_params(cfg: TrainConfig, stop_ids: list[int]) -> SamplingParams:
    """The rollout sampling parameters of ``cfg`` (``rollout.max_new_tokens``, ``rollout.temperature``, ``rollout.top_p``, ``rollout.top_k``,
    ``rollout.min_new_tokens``) with the model's stop ids."""
    return SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                          top_k=cfg.rollout.top_k, min_new_tokens=cfg.rollout.min_new_tokens, stop_token_ids=stop_ids or None)


def open_reward_pool(cfg: TrainConfig, task: Any) -> RewardPool:
    """A reward pool for ``task``'s reward function, checked to load in a worker process.

    Raises:
        UserError: the reward function cannot be imported in a fresh process (one line, the worker's reason).
    """
    pool = RewardPool(CALL_REWARD, n_workers=cfg.task.reward_workers, timeout_s=cfg.task.reward_timeout_s)
    try:
        res = pool.score_many([(task.reward_spec, task.code_dir)], fn="areal_cli.api.reward:check_loads")[0]
    except BaseException:
        pool.close()
        raise
    if res.status != "ok":
        pool.close()
        raise UserError(f"field 'task.reward': {task.reward_spec} does not load in a reward worker: {res.message}")
    return pool


def episode_client(cfg: TrainConfig, client: Any, pool: Any, tokenizer: Any, task: Any, stop_ids: list[int],
                   *, sampling: SamplingParams | None = None, group_size: int | None = None,
                   rid_prefix: str = "g") -> EpisodeClient:
    """The episode client template of a run (``sampling`` / ``rollout.group_size`` default to the training ones)."""
    return EpisodeClient(client, pool, task.reward_spec, tokenizer, sampling or sampling_params(cfg, stop_ids),
                         group_size or cfg.rollout.group_size, code_dir=task.code_dir, rid_prefix=rid_prefix)


def make_controller(cfg: TrainConfig, template: EpisodeClient, task: Any, items: Iterator[Item]) -> RolloutController:
    """The rollout controller of a run: ``items`` (e.g. a :class:`~areal_cli.train_loop.checkpoint.PromptStream` over the
    task's training stream), the task's workflow, the staleness rule of ``cfg``."""
    staleness = StalenessManager(cfg.rollout.batch_size, cfg.rollout.max_head_offpolicyness, cfg.rollout.effective_max_concurrent)
    controller = RolloutController(template, staleness, items, task.workflow, workflow_name=task.workflow_spec,
                                   success_rate_lb=cfg.rollout.success_rate_lb, success_rate_ub=cfg.rollout.success_rate_ub)
    controller.prompts = _counting(items, task, controller.stats)
    return controller


def _counting(items: Iterator[Item], task: Any, stats: Any) -> Iterator[Item]:
    """``items``, keeping ``stats.prompts_dropped_too_long`` equal to the task's count of dropped prompts."""
    for item in items:
        stats.prompts_dropped_too_long = task.dropped_too_long
        yield item

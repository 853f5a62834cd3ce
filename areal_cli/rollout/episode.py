"""EpisodeClient: what a rollout workflow gets to run one episode (AReaL's ``engine`` argument of
``arun_episode``): generation through the rollout servers, scoring through the reward pool, the tokenizer,
the run's sampling defaults, and counters.

One EpisodeClient is made per episode by the controller (:meth:`EpisodeClient.for_episode`); every request
it sends carries the episode's id (``g<episode>...``), so resubmissions after a weight update stick to one
server. Generation is interruptible and resumed by :class:`~areal_cli.rollout.client.RolloutClient`: each
output token keeps the policy version that produced it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from areal_cli.api.reward import CALL_REWARD
from areal_cli.api.types import Group, Item, RewardFailed, Trajectory
from areal_cli.rollout.completion import Completion
from areal_cli.rollout.protocol import SamplingParams


#: Request-id prefix of the held-out evaluation's episode clients (``areal train``; :attr:`EpisodeClient.evaluating`).
EVAL_RID_PREFIX = "eval-"


@dataclass
class EpisodeStats:
    """Counters shared by the EpisodeClients of one controller (reported in metrics)."""

    samples_generated: int = 0
    tokens_generated: int = 0
    interruptions: int = 0
    reward_status: Counter = field(default_factory=Counter)  # ok / error / timeout
    reward_failure_examples: list[str] = field(default_factory=list)


class EpisodeClient:
    """Generation and reward for one episode.

    Args:
        client: the rollout client (``generate`` / ``generate_group``).
        reward_pool: a :class:`~areal_cli.reward.pool.RewardPool` (any function; :data:`CALL_REWARD` is called).
        reward_spec: the task's reward function (``module:attr`` / ``file.py:attr``).
        tokenizer: the model's tokenizer.
        sampling: the run's sampling parameters (max_new_tokens, temperature, top_p, top_k, stop ids).
        group_size: samples per prompt the run asks for (``n``).
        code_dir: added to ``sys.path`` in the reward workers (user modules next to the recipe).
        stats: shared counters.
        episode_id: this episode's id (the group id of what it returns).
        item: the record this episode works on, named in reward failures (id and ``file:line``); None: unnamed.
    """

    def __init__(self, client: Any, reward_pool: Any, reward_spec: str, tokenizer: Any, sampling: SamplingParams,
                 group_size: int, *, code_dir: str = "", stats: EpisodeStats | None = None, episode_id: int = 0,
                 rid_prefix: str = "g", item: Item | None = None) -> None:
        self.client = client
        self.reward_pool = reward_pool
        self.reward_spec = reward_spec
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.group_size = group_size
        self.code_dir = code_dir
        self.stats = stats if stats is not None else EpisodeStats()
        self.episode_id = episode_id
        self.rid_prefix = rid_prefix
        self.item = item
        self._calls = itertools.count()

    @property
    def evaluating(self) -> bool:
        """True for the clients of a held-out evaluation (request ids prefixed :data:`EVAL_RID_PREFIX`, as
        ``areal train`` makes them): a workflow may then shape its Group for scoring rather than training
        (e.g. one sample per multi-turn conversation, :mod:`areal_cli.workflows.multi_turn`)."""
        return self.rid_prefix.startswith(EVAL_RID_PREFIX)

    def for_episode(self, episode_id: int, item: Item | None = None) -> "EpisodeClient":
        """A client for another episode (on record ``item``, named in its reward failures), sharing everything
        but the id."""
        return EpisodeClient(self.client, self.reward_pool, self.reward_spec, self.tokenizer, self.sampling,
                             self.group_size, code_dir=self.code_dir, stats=self.stats, episode_id=episode_id,
                             rid_prefix=self.rid_prefix, item=item)

    # ------------------------------------------------------------------------------------ generation
    async def generate(self, prompt_ids: Sequence[int], *, n: int = 1, sampling: SamplingParams | None = None,
                       **overrides: Any) -> list[Completion]:
        """``n`` samples of ``prompt_ids`` (one batched request; interrupted samples resume with their prefix).

        Args:
            sampling: parameters (default: the run's); ``overrides`` replace single fields of them, e.g.
                ``max_new_tokens=64``.
        Returns:
            ``n`` :class:`~areal_cli.rollout.client.Completion`: output ids, behaviour logprobs, per-token
            versions, finish reason.
        Raises:
            ValueError / ServerError / ProtocolError: from the rollout client.
        """
        params = dataclasses.replace(sampling or self.sampling, **overrides) if overrides else (sampling or self.sampling)
        rid = f"{self.rid_prefix}{self.episode_id}.c{next(self._calls)}"
        if n == 1:
            comps = [await self.client.generate(list(prompt_ids), params, rid=rid)]
        else:
            comps = await self.client.generate_group(list(prompt_ids), n, params, rid=rid)
        for c in comps:
            self.stats.samples_generated += 1
            self.stats.tokens_generated += len(c.output_ids)
            self.stats.interruptions += c.n_interruptions
        return comps

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Token ids -> text (special tokens skipped by default, as the reward function sees completions)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ---------------------------------------------------------------------------------------- reward
    async def reward(self, prompt: str, completion: str, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                     /, **fields: Any) -> float:
        """Score one completion with the task's reward function in the reward pool (hard timeout).

        ``fields`` are the record's fields (a field named like a positional argument is not passed on:
        :func:`areal_cli.api.reward.reward_kwargs`).

        Returns:
            the reward as a float.
        Raises:
            RewardFailed: the call ended in ``error`` or ``timeout`` (counted; the episode is then dropped).
        """
        res = await self.reward_pool.call(CALL_REWARD, self.reward_spec, self.code_dir, prompt, completion,
                                          list(prompt_ids), list(completion_ids), fields)
        self.stats.reward_status[res.status] += 1
        if res.status != "ok":
            record = "" if self.item is None else f" on record {self.item.id}" + (
                f" ({self.item.where})" if self.item.where and self.item.where != self.item.id else "")
            example = f"{res.status}{record}: {res.message}"
            if len(self.stats.reward_failure_examples) < 5 and example not in self.stats.reward_failure_examples:
                self.stats.reward_failure_examples.append(example)  # the first five distinct failures
            raise RewardFailed(res.status, f"{res.message}{record}")
        return float(res.reward)

    async def score(self, item: Item, completions: Sequence[Completion]) -> list[float]:
        """Rewards of ``completions`` of ``item`` (decoded text, the record's fields), all scored at once.

        Raises:
            RewardFailed: any of them failed (after all calls finished, so every outcome is counted).
        """
        results = await asyncio.gather(
            *(self.reward(item.prompt, self.decode(c.output_ids), item.prompt_ids, c.output_ids, **item.fields)
              for c in completions), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return list(results)

    # -------------------------------------------------------------------------------------- building
    def trajectory(self, item: Item, completion: Completion, reward: float) -> Trajectory:
        """A :class:`Trajectory` of ``completion`` (prompt = ``item.prompt_ids``) with ``reward``."""
        return Trajectory(prompt_ids=list(item.prompt_ids), output_ids=list(completion.output_ids),
                          behaviour_logprobs=list(completion.output_logprobs),
                          versions=list(completion.output_versions), reward=float(reward),
                          group_id=self.episode_id, finish_reason=completion.finish_reason,
                          n_interruptions=completion.n_interruptions)

    def group(self, item: Item, completions: Sequence[Completion], rewards: Sequence[float]) -> Group:
        """The episode's :class:`Group`: one trajectory per completion."""
        return Group(self.episode_id, item, [self.trajectory(item, c, r) for c, r in zip(completions, rewards)])

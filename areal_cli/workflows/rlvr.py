"""RLVR: the single-turn workflow of every built-in RL task (AReaL ``areal/workflow/rlvr.py`` with
``GroupedRolloutWorkflow``).

One episode = one prompt: ``rollout.group_size`` samples in one batched request (interrupted samples resume with
their prefix after a weight update), each scored by the task's reward function on its decoded text and the
record's fields. A reward that fails (error or timeout) raises :class:`~areal_cli.api.types.RewardFailed`
out of the episode, which the controller counts as a dropped group.
"""

from __future__ import annotations

from areal_cli.api.types import Group, Item


class RLVRWorkflow:
    """``async arun_episode(client, item) -> Group``: ``client.group_size`` samples of ``item``, rewarded.

    Args:
        n_samples: samples per prompt (default: the run's ``rollout.group_size``).
        max_new_tokens: generation budget (default: the run's ``rollout.max_new_tokens``).
    """

    def __init__(self, n_samples: int | None = None, max_new_tokens: int | None = None) -> None:
        self.n_samples = n_samples
        self.max_new_tokens = max_new_tokens

    async def arun_episode(self, client, item: Item) -> Group:
        overrides = {} if self.max_new_tokens is None else {"max_new_tokens": self.max_new_tokens}
        comps = await client.generate(item.prompt_ids, n=self.n_samples or client.group_size, **overrides)
        rewards = await client.score(item, comps)
        return client.group(item, comps, rewards)

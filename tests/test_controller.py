"""Rollout controller: staleness-bounded admission, streaming reward failures, group filtering."""

import asyncio

import pytest

from areal_cli.reward.pool import RewardPool, RewardResult
from areal_cli.rollout.client import Completion
from areal_cli.rollout.controller import PromptItem, RolloutController
from areal_cli.rollout.protocol import SamplingParams
from areal_cli.rollout.staleness import StalenessManager


class FakeClient:
    """Answers each request with the prompt's last token, tagged with the current version."""

    def __init__(self):
        self.version = 0
        self.calls = 0

    async def generate(self, prompt_ids, params, rid=None):
        self.calls += 1
        await asyncio.sleep(0.001)
        out = [prompt_ids[-1], 2]
        return Completion(list(prompt_ids), out, [-0.5, -0.1], [self.version] * 2, "stop", 0, "fake")

    async def generate_group(self, prompt_ids, n, params, rid=None):
        return [await self.generate(prompt_ids, params, f"{rid}.{i}") for i in range(n)]


class FakePool:
    def __init__(self, verdicts):
        self.verdicts = verdicts  # text -> RewardResult

    async def score(self, text, answer):
        return self.verdicts(text, answer)


def prompts(rewarding=lambda i: True):
    i = 0
    while True:
        yield PromptItem(str(i), [10, 11, 100 + i], "ok" if rewarding(i) else "no")
        i += 1


def make(eta, batch, group=4, verdict=None, lb=0.0, ub=1.0):
    client = FakeClient()
    verdict = verdict or (lambda text, ans: RewardResult(1.0 if ans == "ok" else 0.0, "ok"))
    ctl = RolloutController(client, StalenessManager(batch, eta, 1000), prompts(), FakePool(verdict),
                            decode=lambda ids: " ".join(map(str, ids)), group_size=group,
                            sampling=SamplingParams(max_new_tokens=4), success_rate_lb=lb, success_rate_ub=ub)
    return client, ctl


async def settle():
    for _ in range(50):
        await asyncio.sleep(0.005)


def test_eta0_generates_exactly_one_batch_per_version():
    async def go():
        client, ctl = make(eta=0, batch=3)
        ctl.start()
        await settle()
        assert ctl.stats.groups_submitted == 3 and ctl.n_ready == 3
        batch = await ctl.get_batch(3)
        await settle()
        assert ctl.stats.groups_submitted == 3  # nothing more until the trainer publishes a version
        client.version = 1
        ctl.notify_version(1)
        await settle()
        assert ctl.stats.groups_submitted == 6
        nxt = await ctl.get_batch(3)
        assert {s.head_version for g in batch for s in g.samples} == {0}
        assert {s.head_version for g in nxt for s in g.samples} == {1}
        await ctl.stop()

    asyncio.run(go())


def test_eta2_runs_two_batches_ahead_and_respects_the_bound():
    async def go():
        client, ctl = make(eta=2, batch=2)
        ctl.start()
        await settle()
        assert ctl.stats.groups_submitted == 6
        await ctl.get_batch(2)
        ctl.notify_version(1)
        await settle()
        assert ctl.stats.groups_submitted == 8
        await ctl.stop()

    asyncio.run(go())


def test_filtered_groups_are_counted_and_replaced():
    async def go():
        client, ctl = make(eta=0, batch=2, lb=0.01, ub=0.99)  # all-correct groups are dropped
        ctl.prompts = prompts(lambda i: i % 2 == 0)  # every group is all-0 or all-1
        ctl.start()
        await settle()
        assert ctl.stats.groups_dropped_filter >= 2
        assert ctl.n_ready == 0  # all groups dropped
        assert ctl.staleness.accepted == 0 and ctl.staleness.running <= 2  # dropped slots are refilled
        assert ctl.stats.groups_submitted >= ctl.stats.groups_dropped_filter + 1
        await ctl.stop()

    asyncio.run(go())


def test_reward_failures_drop_the_group_and_are_counted_never_zero():
    def verdict(text, ans):
        return RewardResult(None, "timeout", "reward call exceeded 5s") if ans == "no" else RewardResult(1.0, "ok")

    async def go():
        client, ctl = make(eta=0, batch=2, verdict=verdict)
        ctl.prompts = prompts(lambda i: i >= 1)  # the first group's rewards time out
        ctl.start()
        groups = await ctl.get_batch(2)
        assert ctl.stats.groups_dropped_reward_failure == 1
        assert ctl.stats.reward_status["timeout"] == 4
        assert ctl.stats.reward_failure_examples[0].startswith("timeout")
        assert all(s.reward == 1.0 for g in groups for s in g.samples)
        await ctl.stop()

    asyncio.run(go())


def crashing_reward(text, answer):
    if answer == "crash":
        raise ZeroDivisionError("boom")
    return 1.0


def test_crashing_reward_in_a_real_pool_is_reported():
    async def go():
        with RewardPool("tests.test_controller:crashing_reward", timeout_s=5) as pool:
            ok = await pool.score("x", "fine")
            bad = await pool.score("x", "crash")
        assert ok.status == "ok" and ok.reward == 1.0
        assert bad.status == "error" and bad.reward is None and "ZeroDivisionError" in bad.message

    asyncio.run(go())


def test_a_failed_group_task_surfaces_in_get_batch():
    class Broken(FakeClient):
        async def generate_group(self, *a, **k):
            raise RuntimeError("server died")

    async def go():
        _, ctl = make(eta=0, batch=1)
        ctl.client = Broken()
        ctl.start()
        with pytest.raises(RuntimeError, match="server died"):
            await asyncio.wait_for(ctl.get_batch(1), 5)
        await ctl.stop()

    asyncio.run(go())

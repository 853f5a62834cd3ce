"""Rollout controller: staleness-bounded admission, streaming reward failures, group filtering, and the
workflow contract (None = rejected and counted; a broken result ends the run in one line)."""

import asyncio

import pytest

from areal_cli.api.types import Item, WorkflowError
from areal_cli.config import TrainConfig
from areal_cli.reward.pool import RewardPool, RewardResult
from areal_cli.rollout.client import Completion
from areal_cli.rollout.controller import RolloutController
from areal_cli.rollout.episode import EpisodeClient
from areal_cli.rollout.protocol import SamplingParams, ServerError
from areal_cli.rollout.staleness import StalenessManager
from areal_cli.workflows.rlvr import RLVRWorkflow
from helpers.one_line import assert_one_line


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
    """The reward pool's ``call`` interface; ``verdicts(completion, fields)`` gives the RewardResult."""

    def __init__(self, verdicts):
        self.verdicts = verdicts

    async def call(self, fn, spec, code_dir, prompt, completion, prompt_ids, completion_ids, fields):
        return self.verdicts(completion, fields)


class FakeTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def prompts(rewarding=lambda i: True):
    i = 0
    while True:
        yield Item(str(i), [10, 11, 100 + i], f"prompt {i}", {"answer": "ok" if rewarding(i) else "no"})
        i += 1


def make(eta, batch, group=4, verdict=None, lb=0.0, ub=1.0, workflow=None):
    client = FakeClient()
    verdict = verdict or (lambda text, f: RewardResult(1.0 if f["answer"] == "ok" else 0.0, "ok"))
    template = EpisodeClient(client, FakePool(verdict), "tests.fake:reward", FakeTokenizer(),
                             SamplingParams(max_new_tokens=4), group)
    ctl = RolloutController(template, StalenessManager(batch, eta, 1000), prompts(), workflow or RLVRWorkflow(),
                            workflow_name="tests:wf", success_rate_lb=lb, success_rate_ub=ub)
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
        # dropped slots are refilled: far more groups went out than the capacity of 2 (a refill may still be
        # on its way to submission at this instant, so not '>= dropped + 1')
        assert ctl.stats.groups_submitted >= ctl.stats.groups_dropped_filter and ctl.stats.groups_submitted > 2
        # the reward before the filter counts the dropped groups (all-0 and all-1 alike)
        dropped = ctl.stats.groups_dropped_filter
        assert ctl.stats.samples_scored >= dropped * 2 and ctl.stats.samples_scored % 2 == 0
        assert 0 < ctl.stats.reward_sum_scored < ctl.stats.samples_scored
        assert ctl.stats.as_dict()["samples_scored"] == ctl.stats.samples_scored
        await ctl.stop()

    asyncio.run(go())


def test_reward_failures_drop_the_group_and_are_counted_never_zero():
    def verdict(text, f):
        return RewardResult(None, "timeout", "reward call exceeded 5s") if f["answer"] == "no" else RewardResult(1.0, "ok")

    async def go():
        client, ctl = make(eta=0, batch=2, verdict=verdict)
        ctl.prompts = prompts(lambda i: i >= 1)  # the first group's rewards time out
        ctl.start()
        groups = await ctl.get_batch(2)
        assert ctl.stats.groups_dropped_reward_failure == 1
        assert ctl.stats.reward_status["timeout"] == 4
        # the failure names its record, once however many samples of the group failed alike
        assert ctl.stats.reward_failure_examples == ["timeout on record 0: reward call exceeded 5s"]
        assert all(s.reward == 1.0 for g in groups for s in g.samples)
        await ctl.stop()

    asyncio.run(go())


def crashing_reward(text, answer):
    if answer == "crash":
        raise ZeroDivisionError("boom")
    return 1.0


@pytest.mark.multiproc
def test_crashing_reward_in_a_real_pool_is_reported():
    async def go():
        with RewardPool("tests.test_controller:crashing_reward", timeout_s=5) as pool:
            ok = await pool.score("x", "fine")
            bad = await pool.score("x", "crash")
        assert ok.status == "ok" and ok.reward == 1.0
        assert bad.status == "error" and bad.reward is None and "ZeroDivisionError" in bad.message

    asyncio.run(go())


def test_a_dead_server_surfaces_in_get_batch_as_itself():
    class Broken(FakeClient):
        async def generate_group(self, *a, **k):
            raise ServerError(None, "server died", "http://x")

    async def go():
        _, ctl = make(eta=0, batch=1)
        ctl.client.client = Broken()
        ctl.start()
        with pytest.raises(ServerError, match="server died"):
            await asyncio.wait_for(ctl.get_batch(1), 5)
        await ctl.stop()

    asyncio.run(go())


class Picky:
    """Rejects odd items, returns groups of a size that depends on the item (a workflow decides)."""

    async def arun_episode(self, client, item):
        i = int(item.id)
        if i % 2:
            return None
        comps = await client.generate(item.prompt_ids, n=1 + i % 4)
        return client.group(item, comps, await client.score(item, comps))


def test_rejected_episodes_are_counted_and_groups_may_differ_in_size():
    async def go():
        _, ctl = make(eta=0, batch=3, workflow=Picky())
        ctl.start()
        groups = await asyncio.wait_for(ctl.get_batch(3), 5)
        assert ctl.stats.groups_rejected >= 2 and ctl.stats.groups_accepted == 3
        assert sorted(len(g.samples) for g in groups) == [1, 1, 3]  # items 0, 2, 4 -> 1, 3, 1 samples
        assert all(s.group_id == g.group_id for g in groups for s in g.samples)
        await ctl.stop()

    asyncio.run(go())


@pytest.mark.parametrize("result, message", [
    ("a string", "returned str, expected a Group or None"),
    ("empty", "returned a Group without samples"),
    ("short logprobs", "sample 0 has 2 output_ids but 1 behaviour_logprobs"),
    ("raise", "arun_episode raised KeyError: 'solutions'"),
])
def test_a_workflow_that_breaks_the_contract_ends_the_run_in_one_line(result, message):
    class Broken:
        async def arun_episode(self, client, item):
            if result == "raise":
                return {}["solutions"]
            if result == "a string":
                return "oops"
            comps = await client.generate(item.prompt_ids)
            group = client.group(item, comps, [1.0])
            if result == "empty":
                group.samples = []
            else:
                group.samples[0].behaviour_logprobs = [0.0]
            return group

    async def go():
        _, ctl = make(eta=0, batch=1, workflow=Broken())
        ctl.start()
        with pytest.raises(WorkflowError) as e:
            await asyncio.wait_for(ctl.get_batch(1), 5)
        await ctl.stop()
        return str(e.value)

    text = asyncio.run(go())
    assert text.startswith("workflow tests:wf: ")
    assert_one_line(text, message)
    if result == "raise":  # where the user's code raised, not only what
        assert f"(raised at {__file__}:" in text and "in arun_episode)" in text


def test_a_starving_trainer_is_told_why_and_what_to_change():
    """The success-rate filter drops (almost) every group of a model that always or never succeeds: the minute-by-
    minute waiting line says so and names the settings that give the trainer batches."""
    from types import SimpleNamespace

    from areal_cli.train_loop.loop import get_batch_watched

    logged = []
    counters = {"groups_accepted": 0, "groups_dropped_filter": 0, "groups_rejected": 0,
                "groups_dropped_reward_failure": 0}

    class Starving:
        stats = SimpleNamespace(as_dict=lambda: dict(counters))

        async def get_batch(self, n, consumer_version=None):
            while True:
                counters["groups_dropped_filter"] += 50
                counters["groups_accepted"] += 1
                await asyncio.sleep(0.01)

    cfg = TrainConfig().with_values({"rollout.batch_size": 8, "rollout.success_rate_lb": 0.01,
                                     "rollout.success_rate_ub": 0.99})
    ctx = SimpleNamespace(cfg=cfg,
                          status=SimpleNamespace(log=logged.append))

    async def go():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(get_batch_watched(ctx, Starving(), 3, every_s=0.1), timeout=0.35)

    asyncio.run(go())
    assert logged and "step 3: waiting" in logged[0] and "dropped by the success-rate filter [0.01, 0.99]" in logged[0]
    assert "a longer warm start (sft.max_steps), a wider rollout.success_rate_lb..success_rate_ub range" in logged[0]


def test_stale_groups_drop_or_train_at_consumption():
    """``rollout.stale_groups: drop`` (consumer_version given) drops groups whose head is more than eta versions older
    than the trainer, counts them and gives their slots back; ``train`` (no consumer_version) returns them."""
    async def go(drop):
        client, ctl = make(eta=1, batch=2)
        ctl.start()
        await settle()
        assert ctl.stats.groups_submitted == 4  # (eta + 1) * batch at version 0
        client.version = 3
        ctl.notify_version(3)
        await settle()
        batch = await ctl.get_batch(2, consumer_version=3 if drop else None)
        heads = sorted(min(s.versions) for g in batch for s in g.samples)
        if drop:
            assert ctl.stats.groups_dropped_stale == 4 and set(heads) == {3}  # head 0 < 3 - 1: dropped
        else:
            assert ctl.stats.groups_dropped_stale == 0 and set(heads) == {0}
        await ctl.stop()

    asyncio.run(go(True))
    asyncio.run(go(False))


def test_the_rollout_process_drops_at_consumption_like_the_in_process_controller():
    """The parent side of ``parallel.rollout_process: true`` applies the same rule and tells the child to free the slot."""
    from areal_cli.api.types import Group, Trajectory
    from areal_cli.rollout.remote_controller import RolloutProcess

    def group(gid, head):
        t = Trajectory(prompt_ids=[1], output_ids=[2, 3], behaviour_logprobs=[-0.1, -0.2],
                       versions=[head, head + 1], reward=1.0, group_id=gid, finish_reason="stop")
        return Group(gid, Item(str(gid), [1], "p", {}), [t])

    async def go():
        rc = RolloutProcess.__new__(RolloutProcess)  # the parent side only: no child process
        sent = []
        rc._send, rc._error, rc._eta, rc._groups = sent.append, None, 2, asyncio.Queue()
        for gid, head in enumerate([0, 3, 1, 4]):
            rc._groups.put_nowait(group(gid, head))
        out = await rc.get_batch(2, consumer_version=4)
        assert [g.group_id for g in out] == [1, 3] and sent == [("stale",), ("stale",)]

    asyncio.run(go())


def test_a_reward_failure_names_the_record_and_its_file_line():
    from areal_cli.api.types import RewardFailed

    def verdict(text, f):
        return RewardResult(None, "error", "KeyError: 'x' (raised at r.py:3 in reward)")

    client = EpisodeClient(FakeClient(), FakePool(verdict), "tests.fake:reward", FakeTokenizer(),
                           SamplingParams(max_new_tokens=4), 2)
    item = Item("q7", [1, 2], "p", {"answer": "ok"}, where="data.jsonl:8")
    with pytest.raises(RewardFailed) as e:
        asyncio.run(client.for_episode(3, item).reward("p", "c", [1, 2], [3], answer="ok"))
    assert e.value.message == "KeyError: 'x' (raised at r.py:3 in reward) on record q7 (data.jsonl:8)"
    assert client.stats.reward_failure_examples == [
        "error on record q7 (data.jsonl:8): KeyError: 'x' (raised at r.py:3 in reward)"]


def test_the_first_reward_failure_is_shown_live_once():
    from types import SimpleNamespace

    from areal_cli.train_loop.loop import show_first_reward_failure

    lines = []
    ctx = SimpleNamespace(reward_failure_shown=False, status=SimpleNamespace(log=lines.append))
    controller = SimpleNamespace(stats=SimpleNamespace(reward_failure_examples=[]))
    show_first_reward_failure(ctx, controller)
    controller.stats.reward_failure_examples += ["error on record q3 (d.jsonl:4): KeyError: 'x'", "error on q5"]
    show_first_reward_failure(ctx, controller)
    show_first_reward_failure(ctx, controller)
    assert lines == ["first reward failure (its group is dropped and counted; the run goes on): error on record q3 "
                     "(d.jsonl:4): KeyError: 'x'"]

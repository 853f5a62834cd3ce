"""Claims: RewardPool runs an importable reward function in worker processes; a call that raises is an
"error" with a one-line message, a call that hangs is killed at the hard timeout and is a "timeout", a
worker that dies is an "error"; every outcome is counted, none is a silent 0, and the pool keeps
serving afterwards, also under concurrent asyncio calls."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from areal_cli.reward.pool import RewardPool, RewardResult, to_reward

HERE = __name__  # workers import this module by name ("test_reward_pool:add")


# ---- reward functions the workers import ------------------------------------------------------
def add(a, b):
    return a + b


def crash(msg):
    raise RuntimeError(msg)


def hang(seconds):
    time.sleep(seconds)
    return 1.0


def die(code):
    os._exit(code)


def slow_one(seconds):
    time.sleep(seconds)
    return 1.0


def pid():
    return (os.getpid(), 1.0)


def torch_threads():
    import torch

    return (torch.get_num_threads(), 1.0)


def returns_text():
    return "not a score"


# ---- tests --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool():
    with RewardPool(f"{HERE}:add", n_workers=2, timeout_s=1.0) as p:
        yield p


def _delta(pool, before):
    after = pool.counters
    return {k: after[k] - before[k] for k in after}


@pytest.mark.multiproc
def test_ok_call_returns_float_reward_and_raw_value(pool):
    before = pool.counters
    res = asyncio.run(pool.score(2, 3))
    assert res == RewardResult(reward=5.0, status="ok", message="", value=5)
    assert _delta(pool, before) == {"ok": 1, "error": 0, "timeout": 0}


@pytest.mark.multiproc
def test_crashing_fn_is_an_error_with_one_line_message(pool):
    before = pool.counters
    res = asyncio.run(pool.call(f"{HERE}:crash", "bad input\nsecond line"))
    assert res.status == "error" and res.reward is None
    assert res.message == (f"RuntimeError: bad input second line (raised at {__file__}:{crash.__code__.co_firstlineno + 1} "
                           f"in crash)")
    assert _delta(pool, before) == {"ok": 0, "error": 1, "timeout": 0}
    assert asyncio.run(pool.score(1, 1)).reward == 2.0


@pytest.mark.multiproc
def test_hanging_fn_is_killed_at_timeout_replaced_and_counted(pool):
    before = pool.counters
    pids_before = {pool.score_many([()], fn=f"{HERE}:pid")[0].value[0] for _ in range(4)}
    t0 = time.monotonic()
    res = asyncio.run(pool.call(f"{HERE}:hang", 60))
    elapsed = time.monotonic() - t0
    assert res.status == "timeout" and res.reward is None
    assert "no result within 1 s" in res.message and "worker killed and replaced" in res.message
    assert 0.9 < elapsed < 10
    # still serving, with a fresh process in place of the killed one
    assert asyncio.run(pool.score(20, 22)).reward == 42.0
    assert _delta(pool, before)["timeout"] == 1
    pids_after = {pool.score_many([()], fn=f"{HERE}:pid")[0].value[0] for _ in range(4)}
    assert pids_after - pids_before, "a killed worker must be replaced by a new process"


@pytest.mark.multiproc
def test_fn_calling_os_exit_is_an_error_and_pool_keeps_serving(pool):
    before = pool.counters
    res = pool.score_many([(7,)], fn=f"{HERE}:die")[0]
    assert res.status == "error" and res.reward is None
    assert res.message == "reward worker process died (exit code 7)"
    assert [r.reward for r in pool.score_many([(1, 2), (3, 4)])] == [3.0, 7.0]
    assert _delta(pool, before) == {"ok": 2, "error": 1, "timeout": 0}


@pytest.mark.multiproc
def test_concurrent_asyncio_calls_run_in_parallel_on_the_workers(pool):
    async def main():
        t0 = time.monotonic()
        results = await asyncio.gather(*[pool.call(f"{HERE}:slow_one", 0.5) for _ in range(4)])
        return results, time.monotonic() - t0

    results, elapsed = asyncio.run(main())
    assert [r.reward for r in results] == [1.0] * 4
    assert elapsed < 1.8, f"4 x 0.5 s on 2 workers took {elapsed:.2f} s (serial would be 2.0 s)"


@pytest.mark.multiproc
def test_concurrent_mix_of_ok_crash_hang_and_death_each_reported(pool):
    before = pool.counters

    async def main():
        return await asyncio.gather(
            pool.score(1, 2),
            pool.call(f"{HERE}:crash", "boom"),
            pool.call(f"{HERE}:hang", 60),
            pool.call(f"{HERE}:die", 3),
            pool.score(5, 5),
            pool.call(f"{HERE}:returns_text"),
        )

    ok1, err, tout, dead, ok2, bad_type = asyncio.run(main())
    assert (ok1.status, ok1.reward) == ("ok", 3.0)
    # the message names where the user's code raised (this file, the line of crash's raise)
    line = crash.__code__.co_firstlineno + 1
    assert (err.status, err.message) == ("error", f"RuntimeError: boom (raised at {__file__}:{line} in crash)")
    assert tout.status == "timeout"
    assert (dead.status, dead.message) == ("error", "reward worker process died (exit code 3)")
    assert (ok2.status, ok2.reward) == ("ok", 10.0)
    assert bad_type.status == "error" and "returned str" in bad_type.message
    assert _delta(pool, before) == {"ok": 2, "error": 3, "timeout": 1}


@pytest.mark.multiproc
def test_unimportable_fn_fails_at_construction_with_one_line():
    with pytest.raises(ValueError, match=r"cannot load reward function 'no_such_module_xyz:f': ModuleNotFoundError"):
        RewardPool("no_such_module_xyz:f")
    with pytest.raises(ValueError, match="module:function"):
        RewardPool("not a path")
    with pytest.raises(ValueError, match="timeout_s"):
        RewardPool(f"{HERE}:add", timeout_s=0)


@pytest.mark.multiproc
def test_worker_sets_torch_to_one_thread():
    with RewardPool(f"{HERE}:torch_threads", n_workers=1, timeout_s=60.0) as p:
        res = p.score_many([()])[0]
    assert res.status == "ok", res.message
    assert res.value[0] == 1


@pytest.mark.multiproc
def test_closed_pool_refuses_calls_and_close_is_idempotent():
    p = RewardPool(f"{HERE}:add", n_workers=1, timeout_s=1.0)
    procs = [w.proc for w in p._workers]
    p.close()
    p.close()
    assert all(not proc.is_alive() for proc in procs)
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(p.score(1, 2))


def test_to_reward_conventions():
    assert to_reward(True) == 1.0 and to_reward(False) == 0.0
    assert to_reward(("42", True)) == 1.0 and to_reward([None, 0.25]) == 0.25
    for bad in [None, "x", (), float("nan")]:
        with pytest.raises((TypeError, ValueError)):
            to_reward(bad)

"""The trainer group: call names, errors naming the rank, a dead rank's log tail, no process left behind, a
torchrun world-2 group answering like the in-process trainer, and `areal train` with data parallel 2."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_cli.foundations.errors import UserError
from areal_cli.foundations.ports import free_port as find_free_port
from areal_cli.trainer.calls import check_name, resolve, run_call
from areal_cli.trainer.group import (
    ENV_ADDR,
    ENV_AUTHKEY_FILE,
    ENV_LOG_DIR,
    LocalTrainer,
    TorchrunTrainer,
    TrainerError,
)
from helpers.warm_model import SYNC

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FAKE = "test_trainer_group:FakeEngine"  # importable by the ranks: tests/ is put on their PYTHONPATH
RANK_ENV = {"PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)])}


class FakeEngine:
    """A stand-in engine without torch work: the protocol tests do not need a model."""

    def __init__(self, scale: float = 1.0, **kw):
        self.scale, self.vocab_size, self.kw, self.calls = scale, 7, kw, []

    def double(self, x):
        self.calls.append(x)
        return 2 * x * self.scale


def my_rank(engine, plus=0):
    import torch.distributed as dist

    return (dist.get_rank() if dist.is_initialized() else 0) + plus


def fail_on(engine, rank, message, kind="value"):
    if my_rank(engine) == rank:
        raise UserError(message) if kind == "user" else ValueError(message)
    return "fine"


def die_on(engine, rank):
    import time

    if my_rank(engine) == rank:
        print(f"rank {rank} exits on purpose", flush=True)
        os._exit(3)
    time.sleep(60)  # the other ranks are stopped by torchrun


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------------------------------ names


def test_call_names_are_engine_attributes_or_module_functions():
    eng = FakeEngine(scale=3.0)
    for good in ("engine.double", "engine.kw.get", "areal_cli.trainer.steps:ppo_update", "os.path:join"):
        check_name(good)
    for bad in ("double", "engine.", "engine", "os.path.join", "a:b:c", "engine.x y", 3):
        with pytest.raises(ValueError, match="trainer call name"):
            check_name(bad)
    assert resolve("engine.kw.get", eng)[1] is False and resolve("test_trainer_group:my_rank", eng) == (my_rank, True)
    assert run_call(eng, "engine.double", (2,), {}) == 12.0  # a method, called
    assert run_call(eng, "engine.scale", (), {}) == 3.0  # an attribute, returned
    assert run_call(eng, "test_trainer_group:my_rank", (), {"plus": 5}) == 5  # function(engine, ...)
    with pytest.raises(TypeError, match="takes no arguments"):
        run_call(eng, "engine.scale", (1,), {})
    with pytest.raises(AttributeError):
        run_call(eng, "engine.nothing", (), {})
    with pytest.raises(ModuleNotFoundError):
        run_call(eng, "no_such_module_xyz:f", (), {})


def test_local_trainer_runs_every_call_in_order_on_one_thread_and_raises_unchanged():
    async def go():
        g = await LocalTrainer.launch({"scale": 2.0}, factory=FAKE)
        try:
            assert g.info == {"vocab_size": 7, "world_size": g.info["world_size"]}
            results = await asyncio.gather(*(g.call("engine.double", i) for i in range(5)))
            assert results == [4.0 * i for i in range(5)] and g.engine.calls == list(range(5))
            with pytest.raises(ValueError, match="boom"):
                await g.call("test_trainer_group:fail_on", 0, "boom")
            with pytest.raises(ValueError, match="trainer call name"):
                await g.call("double", 1)
        finally:
            g.close()

    asyncio.run(go())


# ------------------------------------------------------------------------------------------ torchrun groups


@pytest.mark.multiproc
@pytest.mark.slow
def test_attach_mode_takes_ranks_launched_elsewhere_and_close_stops_them(tmp_path):
    key = tmp_path / "key"
    key.write_text(os.urandom(32).hex())
    key.chmod(0o600)
    port, master_port = find_free_port(), find_free_port()
    env = {**os.environ, **RANK_ENV, ENV_ADDR: f"127.0.0.1:{port}", ENV_AUTHKEY_FILE: str(key),
           ENV_LOG_DIR: str(tmp_path / "logs")}
    # what the multi-node launcher runs on each node (here one node of one rank)
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                             "--master-port", str(master_port),
                             "-m", "areal_cli.trainer.worker"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async def go():
            g = await TorchrunTrainer.attach(f"127.0.0.1:{port}", {"scale": 0.5}, authkey_file=key, factory=FAKE,
                                             log_dir=tmp_path / "logs", timeout_s=120)
            try:
                assert await g.call("engine.double", 3) == 3.0 and g.info["world_size"] == 1
            finally:
                g.close()

        asyncio.run(go())
        assert proc.wait(timeout=30) == 0  # the ranks ended on "stop"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    with pytest.raises(UserError, match="expected host:port"):
        asyncio.run(TorchrunTrainer.attach("nowhere", {}, authkey_file=key))


def _batch(tok_ids: list[list[int]]):
    from areal_cli.trainer.batch import build_train_batch

    return build_train_batch([(ids[:3], ids[3:], [-1.0] * len(ids[3:]), [0] * len(ids[3:])) for ids in tok_ids],
                             pad_id=0)


def masked_nll(n_valid: int, lp, mb):
    """A loss for train_step (picklable with functools.partial): summed -lp over response tokens / n_valid."""
    return -(lp * mb.loss_mask).sum() / n_valid


@pytest.mark.multiproc
@pytest.mark.slow
def test_torchrun_world2_group_matches_the_in_process_trainer_names_failing_ranks_and_leaves_nothing(tmp_path):
    """One world-2 group (data parallel 2) on a tiny model: the same answers as the in-process trainer;
    errors name their rank; a dead rank ends the group with its log tail; close leaves no process."""
    import functools

    from safetensors.torch import load_file

    from areal_cli.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "m", seed=3, corpus=["12+34=46", "7*8=56"] * 4, vocab_size=300,
                             hidden_size=32, num_layers=2, intermediate_size=64)
    kw = {"hf_model_dir": model, "lr": 1e-3, "seed": 3}
    batch = _batch([[5, 9, 11, 12, 30, 31, 8], [7, 7, 7, 40, 41], [3, 4, 5, 6, 7, 8, 9, 10, 11]])
    loss_fn = functools.partial(masked_nll, batch.n_loss_tokens)

    async def go():
        local = await LocalTrainer.launch(kw)
        g = await TorchrunTrainer.launch(kw, world=2, run_dir=tmp_path / "g", env=RANK_ENV)
        try:
            assert g.info["vocab_size"] == local.info["vocab_size"] and g.info["world_size"] == 2
            assert len(g.pids) == 2 and await g.call("test_trainer_group:my_rank", plus=10) == 10  # rank 0's
            assert await g.call("engine.num_parameters") == await local.call("engine.num_parameters")
            lp_g = await g.call("engine.logprobs", batch, temperature=0.7)
            lp_l = await local.call("engine.logprobs", batch, temperature=0.7)
            assert lp_g.shape == (3, 8) and float((lp_g - lp_l).abs().max()) < 1e-6
            # SPMD train step: both ranks get the whole batch, the engine splits its rows over the 2 ranks
            st_g = await g.call("engine.train_step", [batch], loss_fn)
            st_l = await local.call("engine.train_step", [batch], loss_fn)
            assert st_g["loss"] == pytest.approx(st_l["loss"], rel=1e-6)
            assert st_g["grad_norm"] == pytest.approx(st_l["grad_norm"], rel=1e-5)
            await g.call("engine.save_hf", tmp_path / "g" / "w")
            await local.call("engine.save_hf", tmp_path / "l" / "w")
            # errors: the rank and its message; a UserError stays a one-line UserError; the group stays usable
            with pytest.raises(TrainerError, match=r"^trainer rank 1: ValueError: bad batch on 1") as e:
                await g.call("test_trainer_group:fail_on", 1, "bad batch on 1")
            assert e.value.ranks == (1,)
            with pytest.raises(UserError, match="^config is wrong$"):
                await g.call("test_trainer_group:fail_on", 0, "config is wrong", kind="user")
            with pytest.raises(TrainerError, match="AttributeError"):
                await g.call("engine.nothing")
            assert await g.call("test_trainer_group:fail_on", 5, "nobody") == "fine"
            # a rank that dies: the group ends, the error shows that rank's log
            with pytest.raises(TrainerError) as e:
                await g.call("test_trainer_group:die_on", 1)
            msg = str(e.value)
            assert msg.startswith("trainer group died during 'test_trainer_group:die_on'")
            assert "trainer-rank1.log" in msg and "rank 1 exits on purpose" in msg
            with pytest.raises(TrainerError, match="died"):  # later calls fail at once
                await g.call("engine.vocab_size")
        finally:
            g.close()
            local.close()
        assert g.proc.poll() is not None and not any(_alive(p) for p in g.pids)

    asyncio.run(go())
    wg, wl = (load_file(str(tmp_path / d / "w" / "model.safetensors")) for d in ("g", "l"))
    assert wg.keys() == wl.keys()
    assert max(float((wg[k] - wl[k]).abs().max()) for k in wg) < 1e-6  # the same update on 2 ranks as on 1


# ------------------------------------------------------------------------------------------ areal train, DP 2
# Needs the SPMD engine (every rank gets the full batch, the engine splits it over data-parallel ranks and sums
# the gradients): with an engine that trains every rank on the whole batch, gradients come out doubled.

@pytest.mark.multiproc
@pytest.mark.slow
def test_areal_train_with_data_or_tensor_parallel_2_matches_the_single_process_run_step_by_step(warm_model, tmp_path):
    from areal_cli.config import apply_overrides
    from areal_cli.recipes import load_train_config
    from areal_cli.train_loop import run_training

    cfg, _ = load_train_config("tiny-arith")
    rows = {}
    for layout in ("single", "parallel.data=2", "parallel.tensor=2"):
        # 2 SFT steps first (the warm start's micro-batches dealt over the ranks), then 3 RL steps
        c = apply_overrides(cfg, [*SYNC, f"model.path={warm_model}", "sft.max_steps=2", "sft.eval_every=2",
                                  "sft.stop_accuracy=0.5", "sft.lr=3e-4", *([layout] if "=" in layout else [])])
        out = tmp_path / layout.replace("=", "")
        run_training(c, out, live=False)
        rows[layout] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        if layout != "single":
            assert (out / "logs" / "trainer-rank1.log").exists()  # it really ran two ranks
    one = rows.pop("single")
    assert [r["step"] for r in one] == [0, 1, 2, 3] and one[0]["warm_start_steps"] == 2
    assert len({r["reward_mean"] for r in one[1:]}) > 1 or 0 < one[1]["reward_mean"] < 1  # a learning signal
    for layout, two in rows.items():
        print(f"\n{layout}: grad norms (1 process, 2 ranks):", [(a["grad_norm"], b["grad_norm"]) for a, b in zip(one[1:], two[1:])])
        assert [r["step"] for r in two] == [0, 1, 2, 3]
        assert (two[0]["warm_start_steps"], two[0]["accuracy"]) == (one[0]["warm_start_steps"], one[0]["accuracy"])
        for a, b in zip(one[1:], two[1:]):
            assert (a["reward_mean"], a["accuracy"]) == (b["reward_mean"], b["accuracy"]), (layout, a["step"])
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5), (layout, a["step"])
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7), (layout, a["step"])
            assert b["clip_frac"] == pytest.approx(a["clip_frac"], abs=1e-9), (layout, a["step"])

def test_trainer_parallel_keys_are_checked_with_file_and_line(tmp_path):
    from areal_cli.config import TrainConfig, apply_overrides
    from areal_cli.recipes import load_train_config

    assert TrainConfig().parallel.world_size == 1  # the default: the in-process trainer
    assert apply_overrides(TrainConfig(), ["parallel.data=2", "parallel.tensor=2"]).parallel.world_size == 4
    recipe = tmp_path / "r.yaml"
    recipe.write_text("task: tiny-arith\nmax_steps: 3\ntrainer_data_parallel: 0\n")
    with pytest.raises(UserError, match=r"r.yaml:3: field 'parallel.data': must be > 0 \(got 0\)"):
        load_train_config(str(recipe))
    with pytest.raises(UserError, match="field 'parallel.pipeline': expected int"):
        apply_overrides(TrainConfig(), ["parallel.pipeline=two"])
    with pytest.raises(UserError, match="field 'loop.checkpoint_every': checkpoints need parallel.tensor"):
        apply_overrides(TrainConfig(), ["loop.checkpoint_every=2", "parallel.tensor=2"])

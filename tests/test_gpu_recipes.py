"""The published recipes as programs: each GPU recipe maps onto an `areal train` run (SGLang servers and trainer
degrees of its allocation, its task, reward and workflow), runs 2 steps of its own task with a tiny model through
the SGLang launch path (tests/fake_sglang), its SFT recipe runs through the SFT job, `areal reproduce` trains it
when the machine has its GPUs, and `areal launch slurm` writes its multi-node job."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_cli.foundations.errors import UserError
from areal_cli.recipes import gpu_train_config
from areal_cli.recipes import load_recipe, train_config_from_recipe

REPO = Path(__file__).resolve().parents[1]
FAKE_SGLANG = str(REPO / "tests" / "fake_sglang")
RL_GPU = ["boba-rl-7b-math", "async-1.5b-math", "async-7b-math", "boba2-8b-code", "boba2-8b-code-open",
          "boba2-14b-code", "boba2-14b-code-open"]
DATA = {"math-rl": REPO / "recipes" / "data" / "boba-106k-mini.jsonl",
        "code-rl": REPO / "recipes" / "data" / "boba2-rl-code-mini.jsonl"}


def test_boba2_14b_code_maps_onto_its_allocation_and_aReaLs_settings():
    cfg, notes = gpu_train_config(load_recipe("boba2-14b-code"))
    assert (cfg.task.preset, cfg.task.prompt_template, cfg.rollout.engine) == ("code-rl", "qwen3-think-pure", "sglang")
    # sglang.d80m4p1+d4p8m2: 80 servers of 4 GPUs, trainer dp 4 x pp 8 x tp 2
    assert (cfg.rollout.n_servers, cfg.rollout.sglang_tp_size) == (80, 4)
    assert (cfg.parallel.data, cfg.parallel.tensor, cfg.parallel.pipeline) == (4, 2, 8)
    assert (cfg.rollout.batch_size, cfg.rollout.group_size, cfg.rollout.max_head_offpolicyness, cfg.rollout.max_new_tokens) == (128, 16, 16, 27648)
    assert cfg.ppo.recompute_proximal and cfg.ppo.behav_imp_weight_cap == 5.0 and cfg.ppo.adv_norm == "global"
    # realhf's ((s - 0.5) * 2) * 5: success 1 -> +5, failure -> -5
    assert ((1 + cfg.ppo.reward_bias) * cfg.ppo.reward_scaling, (0 + cfg.ppo.reward_bias) * cfg.ppo.reward_scaling) == (5.0, -5.0)
    assert (cfg.rollout.success_rate_lb, cfg.rollout.success_rate_ub, cfg.ppo.max_tokens_per_mb, cfg.task.max_prompt_len) == (0.05, 0.95, 30720, 2048)
    assert (cfg.loop.epochs, cfg.loop.max_steps, cfg.rollout.top_k, cfg.rollout.max_concurrent_rollouts) == (10, 0, -1, 128)
    assert (cfg.ppo.lr, cfg.ppo.weight_decay, cfg.ppo.adam_beta2, cfg.ppo.adam_eps) == (2e-5, 0.05, 0.95, 1e-5)
    assert cfg.rollout.sglang_context_length == 30720 and "--schedule-policy lpm" in cfg.rollout.sglang_extra_args
    assert cfg.sft.max_steps == 0 and cfg.model.path is None and cfg.task.dataset == ""
    assert any("fp16" in n for n in notes) and any("gradient_checkpointing" in n for n in notes)


def test_boba_rl_7b_math_is_standard_ppo_and_async_recipes_decoupled():
    sync, _ = gpu_train_config(load_recipe("boba-rl-7b-math"))
    assert (sync.task.preset, sync.rollout.max_head_offpolicyness, sync.ppo.recompute_proximal, sync.loop.max_steps) == ("math-rl", 0, False, 400)
    assert (sync.rollout.n_servers, sync.parallel.data, sync.parallel.pipeline) == (64, 32, 2)
    async_, _ = gpu_train_config(load_recipe("async-1.5b-math"))
    assert async_.rollout.max_head_offpolicyness > 0 and async_.ppo.recompute_proximal
    twin, _ = gpu_train_config(load_recipe("async-1.5b-math"), "sync")
    assert twin.rollout.max_head_offpolicyness == 0 and not twin.ppo.recompute_proximal


def test_settings_areal_cannot_run_are_refused_in_one_line(tmp_path):
    import re
    import shutil

    text = (REPO / "recipes" / "boba2-14b-code.yaml").read_text()
    shutil.copy(REPO / "recipes" / "boba2-14b-code.expected.yaml", tmp_path)
    for key, value in (("actor_sample_reuse", "2"), ("mask_too_long", "true")):
        path = tmp_path / "boba2-14b-code.yaml"
        path.write_text(re.sub(rf"(?m)^  {key}: \S+", f"  {key}: {value}", text))
        line = next(i for i, x in enumerate(path.read_text().splitlines(), 1) if x.startswith(f"  {key}:"))
        with pytest.raises(UserError, match=f"boba2-14b-code.yaml:{line}: field 'train.{key}': "):
            gpu_train_config(load_recipe(path))
    with pytest.raises(UserError, match="supervised fine-tuning"):
        train_config_from_recipe("boba-sft-32b")


def test_kl_gae_and_dual_clip_of_a_recipe_map_onto_the_trainer(tmp_path):
    """AReaL (realhf) keys the kit now runs: kl_ctl (k1 in the reward, as realhf), discount / gae_lambda (GAE with
    values 0), c_clip; the config they give passes validation."""
    import re
    import shutil

    text = (REPO / "recipes" / "boba2-14b-code.yaml").read_text()
    shutil.copy(REPO / "recipes" / "boba2-14b-code.expected.yaml", tmp_path)
    for key, value in (("kl_ctl", "0.1"), ("c_clip", "3.0"), ("gae_lambda", "0.95"), ("discount", "0.99")):
        text = re.sub(rf"(?m)^  {key}: \S+", f"  {key}: {value}", text)
    path = tmp_path / "boba2-14b-code.yaml"
    path.write_text(text)
    cfg, _ = gpu_train_config(load_recipe(path))
    p = cfg.ppo
    assert (p.kl_ctl, p.kl_estimator, p.kl_in, p.c_clip, p.gae_lambda, p.discount) == (0.1, "k1", "reward", 3.0,
                                                                                      0.95, 0.99)
    cfg.model.path, cfg.task.dataset = str(tmp_path), str(tmp_path / "d.jsonl")
    cfg.validate()


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """A tiny model per task, with the chat template of the published base model's family."""
    from areal_cli.config import TrainConfig
    from areal_cli.models.tiny import build_tiny_model
    from areal_cli.tasks.task import Task

    d = tmp_path_factory.mktemp("gpu_tiny")
    out = {}
    for task, template in (("math-rl", "r1"), ("code-rl", "qwen3")):
        corpus = Task(TrainConfig().with_values({"task.preset": task, "task.dataset": str(DATA[task])})).tokenizer_corpus()
        out[task] = build_tiny_model(d / task, seed=0, corpus=corpus, vocab_size=768, chat_template=template)
    return out


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.parametrize("name", RL_GPU)
def test_each_gpu_recipe_runs_two_steps_of_its_own_task_through_the_sglang_path(name, tiny_models, tmp_path,
                                                                              monkeypatch):
    """The recipe's mapped config, shrunk to one fake SGLang server, one trainer rank and a tiny model; its task,
    prompt template, reward and workflow, shaping and decoupled/standard loss are the published ones."""
    from areal_cli.config import apply_overrides
    from areal_cli.train_loop import run_training

    monkeypatch.setenv("PYTHONPATH", FAKE_SGLANG + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.syspath_prepend(FAKE_SGLANG)
    cfg = train_config_from_recipe(name)
    small = [f"model.path={tiny_models[cfg.task.preset]}", f"task.dataset={DATA[cfg.task.preset]}", "rollout.n_servers=1", "rollout.sglang_tp_size=1",
             "parallel.data=1", "parallel.tensor=1", "parallel.pipeline=1", "rollout.batch_size=4",
             "rollout.group_size=2", "rollout.max_new_tokens=24", "loop.max_steps=2", "loop.epochs=0", "rollout.sglang_context_length=0",
             "ppo.max_tokens_per_mb=512", "task.reward_workers=1", "rollout.max_concurrent_rollouts=0", "task.max_prompt_len=512",
             "rollout.success_rate_lb=0", "rollout.success_rate_ub=1"]  # an untrained tiny model scores 0: keep its groups
    run_cfg = apply_overrides(cfg, small)
    summary = run_training(run_cfg, tmp_path / "run", live=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["final_version"] == 2 and [x["step"] for x in lines] == [0, 1, 2]
    assert lines[-1]["reward_ok"] >= 8 and lines[-1]["reward_error"] == lines[-1]["reward_timeout"] == 0
    assert lines[0]["accuracy"] is None  # published runs have no held-out split of their data
    log = (tmp_path / "run" / "logs" / "server0.log").read_text()
    assert "fake sglang" in log and f"dtype={cfg.rollout.sglang_dtype}" in log and "schedule_policy=lpm" in log


@pytest.mark.multiproc
@pytest.mark.slow
def test_the_sft_recipe_runs_two_steps_of_its_sft_job(tiny_models, tmp_path):
    from areal_cli.sft.job import run_sft_job

    data = tmp_path / "boba-sft.jsonl"
    with data.open("w") as f:
        for i in range(8):
            f.write(json.dumps({"prompt": f"<｜User｜>What is {i}+1?<｜Assistant｜><think>\n",
                                "answer": f"easy</think>\n\\boxed{{{i + 1}}}"}) + "\n")
    spec = dataclasses.replace(load_recipe("boba-sft-32b").file.sft, batch_size=4, max_tokens_per_mb=512)
    summary = run_sft_job(spec, tiny_models["math-rl"], data, tmp_path / "out", max_steps=2, log=lambda m: None)
    lines = [json.loads(x) for x in (tmp_path / "out" / "sft_metrics.jsonl").read_text().splitlines()]
    assert summary["steps"] == 2 and [x["step"] for x in lines] == [1, 2] and lines[1]["loss"] < lines[0]["loss"] * 1.5
    assert (Path(summary["weights"]) / "config.json").is_file()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:1: field 'answer'"):
        run_sft_job(spec, tiny_models["math-rl"], bad, tmp_path / "out2", max_steps=2)


# ---------------------------------------------------------------------------------------------- reproduce
def test_reproduce_trains_a_gpu_recipe_only_where_its_gpus_are():
    from areal_cli.reproduce import make_plan

    r = load_recipe("boba2-14b-code")
    assert make_plan(r, gpus_here=384).blocker is None
    blocked = make_plan(r, gpus_here=8).blocker
    assert "needs 384 GPUs" in blocked and "this machine has 8" in blocked and "areal launch slurm" in blocked
    assert "allocation is not published" in make_plan(load_recipe("async-7b-math"), gpus_here=192).blocker
    assert make_plan(r, gpus_here=384, overrides=["loop.max_steps=10"]).blocker is None  # -o validates as a TrainConfig
    with pytest.raises(UserError, match="field 'nope'"):
        make_plan(r, gpus_here=384, overrides=["nope=1"])


@pytest.mark.multiproc
def test_reproduce_without_the_gpus_is_one_line_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "areal_cli.commands.main", "reproduce", "boba2-14b-code", "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and "needs 384 GPUs" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.multiproc
@pytest.mark.slow
def test_reproduce_retrain_of_a_gpu_recipe_downloads_trains_evaluates_and_compares(tiny_models, tmp_path,
                                                                                   monkeypatch):
    """The orchestration of `areal reproduce boba2-8b-code` on a machine with its 192 GPUs, shrunk by -o to one
    fake SGLang server and a tiny model (downloads and the final evaluation's generation are stand-ins)."""
    import areal_cli.reproduce.run as rp
    from areal_cli.eval import runner
    from helpers.consoles import quiet_console

    monkeypatch.setenv("PYTHONPATH", FAKE_SGLANG + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.syspath_prepend(FAKE_SGLANG)
    monkeypatch.setattr(rp, "_download_inputs", lambda ctx, allow: (tiny_models["code-rl"], DATA["code-rl"]))
    monkeypatch.setattr(rp, "_check_eval_data", lambda p, d: None)
    evaluated = []

    def fake_eval(names, data_dir, *, model_dir, out_dir, **kw):
        evaluated.append((names[0], Path(model_dir), kw["protocol"], kw["n"]))
        Path(out_dir).mkdir(parents=True)
        return {names[0]: {}}

    monkeypatch.setattr(runner, "run_eval", fake_eval)
    shrink = ["rollout.n_servers=1", "rollout.sglang_tp_size=1", "parallel.data=1", "parallel.tensor=1",
              "parallel.pipeline=1", "rollout.batch_size=4", "rollout.group_size=2", "rollout.max_new_tokens=16", "loop.max_steps=2",
              "loop.epochs=0", "rollout.sglang_context_length=0", "ppo.max_tokens_per_mb=512", "task.reward_workers=1", "task.max_prompt_len=512",
              "rollout.success_rate_lb=0", "rollout.success_rate_ub=1"]
    out = rp.reproduce("boba2-8b-code", out_dir=tmp_path / "o", overrides=shrink, gpus_here=192,
                       console=quiet_console())
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    summary = json.loads((tmp_path / "o" / "train" / "summary.json").read_text())
    assert summary["final_version"] == 2 and manifest["runs"]["train"] == "train"
    assert any("fp16" in n for n in manifest["runs"]["deviations"])
    assert {e[0] for e in evaluated} == {"lcb_v5", "codeforces", "codecontests"}
    assert all(e[1] == Path(summary["final_weights"]) and e[2] == "qwen3-think-pure" for e in evaluated)
    assert out.exit_code in (0, 1)  # no numbers measured by the stand-in evaluation: nothing passes or fails
    assert json.loads((tmp_path / "o" / "reproduce.json").read_text())["mode"] == "retrain"


# ------------------------------------------------------------------------------------------------ launch
@pytest.mark.multiproc
def test_launch_slurm_writes_the_multi_node_job_of_a_gpu_recipe(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3"}')
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(DATA["code-rl"].read_text())

    def launch(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "areal_cli.commands.main", "launch", "slurm", "boba2-14b-code", "--nodes",
                               "48", "--gpus-per-node", "8", "--out", str(tmp_path / "job"), *extra],
                              capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})

    r = launch()
    assert r.returncode == 2 and "--model is required" in r.stderr and not (tmp_path / "job").exists()
    r = launch("--model", str(model))
    assert r.returncode == 2 and "-o task.dataset=... is required" in r.stderr
    r = launch("--model", str(model), "-o", "task.dataset=/shared/boba2/data/train/train.jsonl")
    assert r.returncode == 2 and "train.jsonl not found" in r.stderr and not (tmp_path / "job").exists()
    r = launch("--model", str(model), "-o", "task.dataset=data/train.jsonl")  # 20 records: not one batch of 128
    assert r.returncode == 2 and "do not fill one batch of 128" in r.stderr
    (tmp_path / "not_a_model").mkdir()
    (tmp_path / "not_a_model" / "config.json").write_text("{}")
    r = launch("--model", str(tmp_path / "not_a_model"), "-o", "task.dataset=data/train.jsonl")
    assert r.returncode == 2 and "not a Hugging Face model directory" in r.stderr
    r = launch("--model", str(model), "-o", "task.dataset=data/train.jsonl", "-o", "rollout.batch_size=4")
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "job" / "launch" / "plan.json").read_text())
    assert plan["placement"]["nodes"] == 48 and plan["server"]["engine"] == "sglang"
    assert plan["server"]["sglang"]["tp_size"] == 4 and plan["server"]["sglang"]["context_length"] == 30720
    cmd = " ".join(plan["controller"]["command"])
    assert "train boba2-14b-code" in cmd and f"model.path={model.resolve()}" in cmd
    assert f"task.dataset={(tmp_path / 'data' / 'train.jsonl').resolve()}" in cmd  # absolute: node 0 runs elsewhere
    assert "parallel.pipeline=8" in cmd and "rollout.engine=external" in cmd
    assert (tmp_path / "job" / "launch" / "job.sbatch").read_text().count("#SBATCH --nodes=48") == 1

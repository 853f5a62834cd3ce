"""Checkpoints and `areal train --resume` (areal_cli.train_loop.checkpoint): atomic, checksummed checkpoints; a corrupted
one is named in one line and nothing is written; a run killed with SIGKILL and resumed has every step once and,
when synchronous and greedy, the same losses, rewards and final weights as an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from areal_cli.train_loop.checkpoint import (
    PromptStream,
    capture_rng,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
    staleness_capacity,
    truncate_metrics,
)
from areal_cli.commands.main import main
from areal_cli.foundations.errors import UserError
from helpers.one_line import assert_one_line

REPO = Path(__file__).resolve().parents[1]


def _fake_hf(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"model_type": "qwen3"}\n')
    (d / "model.safetensors").write_bytes(os.urandom(4096))
    return d


def _save(run: Path, step: int, keep: int = 2) -> Path:
    w = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(w.parameters(), lr=0.1)
    w(torch.ones(1, 3)).sum().backward()
    opt.step()
    hf = run / "weights" / f"v{step}"
    if not hf.exists():
        _fake_hf(hf)
    return save_checkpoint(run, step, hf_dir=hf, optimizer_state=opt.state_dict(), rng=capture_rng(),
                           state={"step": step, "version": step}, keep=keep)


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- files


def test_checkpoints_are_complete_directories_with_a_manifest_and_only_the_newest_are_kept(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    stale = run / "checkpoints" / ".step-000001.tmp-deadbeef"  # a save killed half-way
    stale.mkdir()
    for step in (2, 4, 6):
        _save(run, step, keep=2)
    assert [p.name for p in list_checkpoints(run)] == ["step-000004", "step-000006"]
    assert not stale.exists()
    ck = load_checkpoint(run)  # the newest, verified
    assert ck.step == 6 and ck.path.name == "step-000006"
    files = ck.manifest["files"]
    assert set(files) == {"hf/config.json", "hf/model.safetensors", "optimizer.pt", "rng.pt", "state.json"}
    assert files["optimizer.pt"]["bytes"] == (ck.path / "optimizer.pt").stat().st_size
    assert set(ck.load_optimizer_state()) == {"state", "param_groups"}
    assert latest_checkpoint(ck.path) == ck.path  # a checkpoint directory can be named directly


@pytest.mark.parametrize("damage, message", [
    ("flip", "optimizer.pt: checksum mismatch"),
    ("truncate", "optimizer.pt: size"),
    ("delete", "optimizer.pt: missing"),
    ("manifest", "manifest.json: missing"),
])
def test_a_corrupted_checkpoint_is_named_in_one_line(tmp_path, damage, message):
    ck = _save(tmp_path / "run", 4)
    f = ck / "optimizer.pt"
    data = bytearray(f.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        f.write_bytes(bytes(data))
    elif damage == "truncate":
        f.write_bytes(bytes(data[:-10]))
    elif damage == "delete":
        f.unlink()
    else:
        (ck / "manifest.json").unlink()
    with pytest.raises(UserError) as e:
        load_checkpoint(tmp_path / "run")
    assert str(e.value).startswith(str(ck))
    assert_one_line(str(e.value), message)


def _fake_run_with_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    run = tmp_path / "run"
    ck = _save(run, 4)
    (run / "config.json").write_text("{}\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(7)))
    return run, ck


def test_resume_from_a_bit_flipped_checkpoint_exits_2_and_writes_nothing(tmp_path):
    run, ck = _fake_run_with_checkpoint(tmp_path)
    (ck / "hf" / "model.safetensors").write_bytes(b"\x00" + (ck / "hf" / "model.safetensors").read_bytes()[1:])
    before = _snapshot(run)
    res = CliRunner().invoke(main, ["train", "--resume", str(run), "--no-live"])
    assert res.exit_code == 2
    assert res.output.strip() == f"error: {ck / 'hf' / 'model.safetensors'}: checksum mismatch"
    assert _snapshot(run) == before


def test_resume_without_checkpoints_or_with_other_options_is_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    res = CliRunner().invoke(main, ["train", "--resume", str(tmp_path / "run")])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "no checkpoint to resume from" in res.output
    res = CliRunner().invoke(main, ["train", "--resume", str(tmp_path / "nowhere")])
    assert res.exit_code == 2 and "not found" in res.output
    res = CliRunner().invoke(main, ["train", "tiny-arith", "--resume", str(tmp_path / "run"), "-o", "seed=2"])
    assert res.exit_code == 2 and "does not take RECIPE, -o" in res.output


def test_resuming_a_finished_run_is_refused(tmp_path):
    run, _ = _fake_run_with_checkpoint(tmp_path)
    (run / "summary.json").write_text("{}\n")
    res = CliRunner().invoke(main, ["train", "--resume", str(run)])
    assert res.exit_code == 2 and "already finished" in res.output


# ----------------------------------------------------------------------------- state pieces


def test_metrics_are_cut_back_to_the_checkpointed_step(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in range(7)) + '{"step": 7, "x')
    assert truncate_metrics(m, 4) == 3  # steps 5, 6 and the torn line of step 7
    assert [json.loads(line)["step"] for line in m.read_text().splitlines()] == [0, 1, 2, 3, 4]
    with pytest.raises(UserError, match="no line for step 9"):
        truncate_metrics(m, 9)


def test_prompt_stream_reissues_pending_prompts_then_continues_where_it_stopped():
    drawn = []

    def problems():
        i = 0
        while True:
            drawn.append(i)
            yield f"p{i}"
            i += 1

    s = PromptStream(problems(), str.upper, next_index=5, pending=[1, 3])
    assert [next(s) for _ in range(4)] == ["P1", "P3", "P5", "P6"]
    assert s.issued == [1, 3, 5, 6] and s.next_index == 7
    # the controller's group ids number the items in the same order: groups 1 and 3 still pending
    assert s.position([1, 3]) == {"next_index": 7, "pending": [3, 6]}
    s2 = PromptStream(problems(), str.upper, next_index=7, pending=[3, 6])
    assert [next(s2) for _ in range(3)] == ["P3", "P6", "P7"]


def test_rng_states_round_trip():
    import numpy as np

    st = capture_rng()
    a = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    restore_rng(st)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == a


# ----------------------------------------------------------------------------- kill -9 and resume (real runs)

COMMON = ["--max-steps", "8", "-o", "sft.max_steps=0", "-o", "rollout.batch_size=8", "-o", "loop.eval_n_prompts=16",
          "-o", "loop.target_accuracy=0", "-o", "loop.checkpoint_every=2", "-o", "parallel.torch_threads=1"]
# eta 0 + greedy: every step trains on exactly the next 8 prompts, generated deterministically (global
# advantage normalisation: a greedy group has identical samples, group normalisation would zero them)
SYNC = ["-o", "rollout.max_head_offpolicyness=0", "-o", "rollout.temperature=0", "-o", "ppo.adv_norm=global",
        "-o", "rollout.success_rate_lb=0", "-o", "rollout.success_rate_ub=1", "-o", "rollout.group_size=1"]
ASYNC = ["-o", "rollout.max_head_offpolicyness=2", "-o", "rollout.group_size=2"]


def _start(out: Path, model: Path, extra: list[str], resume: bool = False) -> subprocess.Popen:
    args = ["train", "--resume", str(out)] if resume else ["train", "--out", str(out), *COMMON,
                                                         "-o", f"model.path={model}", *extra]
    log = open(f"{out}.{'resume' if resume else 'run'}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "areal_cli.commands.main", *args, "--no-live"], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _steps(out: Path) -> list[dict]:
    p = out / "metrics.jsonl"
    rows = []
    for line in p.read_text().splitlines() if p.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


def _kill_after(proc: subprocess.Popen, out: Path, step: int, timeout: float = 150.0) -> None:
    """SIGKILL the run (its whole process group: trainer, servers, reward workers) as soon as the metrics line
    of ``step`` exists, i.e. after the checkpoint of step ``step - 1`` and mid-way through the next steps."""
    t0 = time.monotonic()
    while not any(r.get("step") == step for r in _steps(out)):
        assert proc.poll() is None, f"the run ended before step {step}: see {out}.run.log"
        assert time.monotonic() - t0 < timeout, f"no step {step} after {timeout} s"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _wait(proc: subprocess.Popen, log: str, timeout: float = 150.0) -> None:
    assert proc.wait(timeout=timeout) == 0, Path(log).read_text()[-3000:]


@pytest.fixture(scope="module")
def runs(warm_model, tmp_path_factory) -> dict[str, Path]:
    """Three runs side by side: synchronous uninterrupted, synchronous killed at step 5, asynchronous (eta 2)
    killed at step 5; then both killed runs resumed (in parallel: the machine has 2 cores)."""
    d = tmp_path_factory.mktemp("resume")
    out = {"sync_full": d / "sync_full", "sync_killed": d / "sync_killed", "async_killed": d / "async_killed"}
    # the async run's workflow is the built-in one behind an observer that logs every episode it starts
    (d / "observer.py").write_text(OBSERVER.replace("{LOG}", str(d / "episodes.jsonl")))
    observed = ["-o", f"task.workflow={d / 'observer.py'}:Observed"]
    procs = {"sync_full": _start(out["sync_full"], warm_model, SYNC),
             "sync_killed": _start(out["sync_killed"], warm_model, SYNC),
             "async_killed": _start(out["async_killed"], warm_model, ASYNC + observed)}
    try:
        for name in ("sync_killed", "async_killed"):
            _kill_after(procs[name], out[name], 5)
            # what the resume will start from, kept before the resumed run rotates its checkpoints
            newest = sorted((out[name] / "checkpoints").glob("step-*"))[-1]
            shutil.copy(newest / "state.json", d / f"{name}.resumed_from.json")
        resumed = {name: _start(out[name], warm_model, [], resume=True) for name in ("sync_killed", "async_killed")}
        for name, p in resumed.items():
            _wait(p, f"{out[name]}.resume.log")
        _wait(procs["sync_full"], f"{out['sync_full']}.run.log")
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    return {**out, "episodes_log": d / "episodes.jsonl", "async_resumed_from": d / "async_killed.resumed_from.json"}


OBSERVER = """import json, os
from areal_cli.workflows.rlvr import RLVRWorkflow


class Observed(RLVRWorkflow):
    async def arun_episode(self, client, item):
        with open("{LOG}", "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "id": item.id, "eval": client.rid_prefix == "eval-"}) + "\\n")
        return await super().arun_episode(client, item)
"""


@pytest.mark.multiproc
@pytest.mark.slow
def test_the_resumed_async_run_first_issues_the_checkpoints_pending_prompts(runs):
    """Observed on the workflow side, not computed from the same state: the first training episodes the resumed
    process starts are the prompts the checkpoint held as pending (generating or queued), in stream order."""
    from areal_cli.config import TrainConfig
    from areal_cli.tasks.task import Task

    state = json.loads(runs["async_resumed_from"].read_text())
    pending, next_index = state["data"]["pending"], state["data"]["next_index"]
    assert pending and all(i < next_index for i in pending)
    cfg = TrainConfig.from_dict(json.loads((runs["async_killed"] / "config.json").read_text()))
    from areal_cli.models.tiny import load_tokenizer

    task = Task(cfg)
    task.bind(load_tokenizer(cfg.model.path))
    stream = task.train_stream()
    ids = [next(stream).id for _ in range(next_index)]
    log = [json.loads(x) for x in runs["episodes_log"].read_text().splitlines()]
    pids = list(dict.fromkeys(e["pid"] for e in log))
    assert len(pids) == 2  # the killed process and the resumed one
    resumed = [e["id"] for e in log if e["pid"] == pids[1] and not e["eval"]]
    assert resumed[:len(pending)] == [ids[i] for i in pending]
    before = [e["id"] for e in log if e["pid"] == pids[0] and not e["eval"]]
    assert before[:next_index] == ids[:len(before[:next_index])]  # the first process drew the stream in order


@pytest.mark.multiproc
@pytest.mark.slow
def test_kill9_then_resume_trains_every_step_once_with_the_uninterrupted_runs_numbers(runs, warm_model):
    full, resumed = _steps(runs["sync_full"]), _steps(runs["sync_killed"])
    summary = json.loads((runs["sync_killed"] / "summary.json").read_text())
    (resume,) = summary["resumes"]
    k = resume["step"]
    assert k in (4, 6) and resume["checkpoint"] == f"checkpoints/step-{k:06d}"
    # no gap, no duplicate; the first line after the checkpoint says where it resumed from
    assert [r["step"] for r in resumed] == list(range(9)) == [r["step"] for r in full]
    assert [r.get("resumed_from") for r in resumed] == [None] * (k + 1) + [resume["checkpoint"]] + [None] * (7 - k)
    # synchronous and greedy: the same prompts, samples, rewards and updates, up to float rounding
    for a, b in zip(full[1:], resumed[1:]):
        assert (a["reward_mean"], a["accuracy"]) == (b["reward_mean"], b["accuracy"]), a["step"]
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
    from safetensors.torch import load_file

    wa = load_file(str(runs["sync_full"] / "weights" / "v8" / "model.safetensors"))
    wb = load_file(str(runs["sync_killed"] / "weights" / "v8" / "model.safetensors"))
    max_diff = max(float((wa[n] - wb[n]).abs().max()) for n in wa)
    w0 = load_file(str(warm_model / "model.safetensors"))
    moved = max(float((wa[n] - w0[n]).abs().max()) for n in wa)
    print(f"\nkill -9 at step 5, resumed from step {k}: max |w_resumed - w_uninterrupted| = {max_diff:.3g} "
          f"(RL moved weights by up to {moved:.3g}); "
          f"grad norms {[round(r['grad_norm'], 4) for r in resumed[1:]]} (resumed) vs "
          f"{[round(r['grad_norm'], 4) for r in full[1:]]}")
    assert max_diff < 1e-4 and moved > 100 * max_diff  # RL really changed the weights, identically


@pytest.mark.multiproc
@pytest.mark.slow
def test_kill9_then_resume_of_an_async_run_restores_the_staleness_capacity(runs):
    rows = _steps(runs["async_killed"])
    summary = json.loads((runs["async_killed"] / "summary.json").read_text())
    (resume,) = summary["resumes"]
    k = resume["step"]
    assert [r["step"] for r in rows] == list(range(9)) and rows[k + 1]["resumed_from"] == resume["checkpoint"]
    ck = resume["staleness_checkpoint"]
    restored = resume["staleness_restored"]
    # the resumed manager: same version, the groups trained so far accepted, nothing running; the groups that
    # were generating or queued at the checkpoint are re-issued first, which gives back its exact capacity
    assert restored["version"] == ck["version"] == k and restored["running"] == 0
    assert restored["accepted"] == k * 8 and restored["rejected"] == ck["rejected"]
    assert resume["pending_reissued"] == ck["accepted"] - k * 8 + ck["running"]
    assert resume["capacity_checkpoint"] == staleness_capacity(2, 8, ck)
    assert resume["capacity_after_readmission"] == resume["capacity_checkpoint"]
    assert resume["capacity_restored"] == resume["capacity_checkpoint"] + resume["pending_reissued"]
    print(f"\nasync (eta 2) resumed from step {k}: checkpoint counters {ck}, restored {restored}, "
          f"{resume['pending_reissued']} prompts re-issued, capacity {resume['capacity_checkpoint']} -> "
          f"{resume['capacity_restored']} -> {resume['capacity_after_readmission']} after re-admission")

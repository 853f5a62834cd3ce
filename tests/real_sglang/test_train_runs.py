"""`areal train` with ``rollout.engine=sglang`` starting real SGLang servers (CPU mode) from the environment of
``--real-sglang``: weights from disk with in-place updates, a server killed with SIGKILL mid-run and healed, the
trainer killed with SIGKILL and the run resumed; weights over a gloo group (xccl) with aborting updates; and
`areal eval --server-url` against a real server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiproc, pytest.mark.slow, pytest.mark.real_sglang]

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
FAST = ["--no-live", "-o", "sft.max_steps=0", "-o", "rollout.success_rate_lb=0", "-o", "rollout.success_rate_ub=1",
        "-o", "loop.eval_every=0", "-o", "loop.target_accuracy=0", "-o", "rollout.max_head_offpolicyness=2",
        "-o", "rollout.batch_size=16"]


@pytest.fixture(scope="module")
def arith_model(tmp_path_factory) -> Path:
    """The tiny-arith recipe's model, built the way `areal train` builds it (SGLang serves a model directory)."""
    from areal_cli.models.tiny import build_tiny_model
    from areal_cli.recipes import load_train_config
    from areal_cli.tasks.task import Task

    cfg, _ = load_train_config("tiny-arith")
    return build_tiny_model(tmp_path_factory.mktemp("arith") / "model", seed=cfg.seed,
                            corpus=Task(cfg).tokenizer_corpus(), vocab_size=cfg.model.vocab_size,
                            hidden_size=cfg.model.hidden_size, num_layers=cfg.model.num_layers,
                            chat_template=cfg.model.chat_template)


def _train(out: Path, *args: str) -> subprocess.Popen:
    log = open(f"{out}.{'resume' if '--resume' in args else 'run'}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "areal_cli.commands.main", "train", *args], cwd=out.parent, stdout=log,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def _log(out: Path, resume: bool = False) -> str:
    return Path(f"{out}.{'resume' if resume else 'run'}.log").read_text(errors="replace")


def _rows(out: Path) -> list[dict]:
    p = out / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def _wait_for_step(run: subprocess.Popen, out: Path, step: int, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in _rows(out)):
            return
        assert run.poll() is None, _log(out)[-4000:]
        time.sleep(0.2)
    raise AssertionError(f"step {step} not reached in {timeout} s: {_log(out)[-3000:]}")


def _finish(run: subprocess.Popen, out: Path, resume: bool = False, timeout: float = 600.0) -> int:
    try:
        return run.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        raise AssertionError(f"the run did not finish: {_log(out, resume)[-4000:]}") from None


def _sglang_servers(run: subprocess.Popen) -> list[int]:
    """PIDs of the run's SGLang server processes (children of `areal train` running sglang.launch_server)."""
    pids = []
    for p in Path("/proc").iterdir():
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) if p.name.isdigit() else -1
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode() if ppid == run.pid else ""
        except (OSError, IndexError, ValueError):
            continue
        if "sglang.launch_server" in cmd:
            pids.append(int(p.name))
    return sorted(pids)


def _launches(out: Path) -> list[str]:
    return [x for x in (out / "logs" / "server0.log").read_text(errors="replace").splitlines()
            if x.startswith("# areal fleet:")]


def test_in_place_disk_updates_heal_a_killed_server_and_resume_after_a_killed_trainer(sglang_python, arith_model,
                                                                                       tmp_path):
    out = tmp_path / "run"
    run = _train(out, "tiny-arith", "--out", str(out), *FAST, "-o", "rollout.engine=sglang",
                 "-o", f"rollout.sglang_python={sglang_python}", "-o", f"model.path={arith_model}",
                 "-o", "rollout.pause_mode=in_place", "-o", "rollout.min_new_tokens=1",
                 "-o", "loop.checkpoint_every=1", "-o", "loop.max_steps=6")
    _wait_for_step(run, out, 1)
    (server,) = _sglang_servers(run)
    os.kill(server, signal.SIGKILL)  # a real SGLang server dies mid-run
    _wait_for_step(run, out, 4)
    os.killpg(run.pid, signal.SIGKILL)  # the trainer dies too (its watchdog stops the servers)
    run.wait()
    killed_at = _rows(out)[-1]["step"]
    assert killed_at < 6
    resumed = _train(out, "--resume", str(out), "--no-live")
    assert _finish(resumed, out, resume=True) == 0, _log(out, True)[-4000:]
    rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(7))  # every step once, across the heal and the resume
    assert all(r["staleness_max"] <= 2 for r in rows)
    first = _log(out)
    assert "is serving again" in first  # the supervisor's line after the restart
    launches = _launches(out)  # start, restart after the kill, start of the resumed run
    assert len(launches) == 3 and all("sglang.launch_server" in x and "--device cpu" in x for x in launches)
    assert all("--disable-overlap-schedule" in x and "--skip-tokenizer-init" not in x for x in launches)
    assert "--weight-version 0 " not in launches[1]  # restarted on the version the fleet served
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_version"] == 6


def test_collective_weight_sync_with_aborting_updates(sglang_python, tmp_path):
    """As docs/guides/real-sglang.md shows it: no model.path, the real server serves the tiny model the run builds."""
    out = tmp_path / "run"
    run = _train(out, "tiny-arith", "--out", str(out), *FAST, "-o", "rollout.engine=sglang",
                 "-o", f"rollout.sglang_python={sglang_python}",
                 "-o", "rollout.weight_update_mode=xccl", "-o", "rollout.weight_update_chunk_mb=0.5",
                 "-o", "loop.max_steps=3")
    assert _finish(run, out) == 0, _log(out)[-4000:]
    rows = _rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_version"] == 3
    log = (out / "logs" / "server0.log").read_text(errors="replace")
    # every update went over the group inside a session, in several buckets
    assert log.count("POST /begin_weight_update HTTP/1.1\" 200") >= 3
    assert log.count("POST /end_weight_update HTTP/1.1\" 200") >= 3
    assert log.count("POST /update_weights_from_distributed HTTP/1.1\" 200") >= 6
    assert "POST /update_weights_from_disk" not in log
    assert "--disable-overlap-schedule" not in _launches(out)[0]  # aborting updates keep SGLang's overlap


def test_areal_eval_against_a_real_server(real_server, models, tmp_path):
    from areal_cli.commands.main import main
    from click.testing import CliRunner

    from helpers.real_sglang import reset

    reset(real_server, models[0])
    res = CliRunner().invoke(main, ["eval", "--server-url", real_server, "--model", str(models[0]),
                                    "--data", "aime24", "--data-dir", str(SHARED / "data" / "math"), "--limit", "3",
                                    "-n", "2", "--temperature", "1.0", "--max-new-tokens", "12", "--protocol",
                                    "greedy", "--out", str(tmp_path / "eval")])
    assert res.exit_code == 0, res.output
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["config"]["server_url"] == real_server and results["config"]["server_honours_seeds"] is False
    assert "ignores each request's sampling_seed" in res.output
    samples = [json.loads(x) for x in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) >= 6 and all(1 <= len(s["output_ids"]) <= 12 for s in samples)

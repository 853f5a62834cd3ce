"""Rollout servers that die or stop answering mid-run are healed (areal_cli.rollout.supervisor): real `areal
train` runs whose servers are killed with SIGKILL or frozen with SIGSTOP finish every step once, with the
staleness bound kept and the restarts and re-issued samples counted; a server that keeps dying ends the run
with one line."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--no-live", "-o", "sft.max_steps=0", "-o", "rollout.success_rate_lb=0", "-o", "rollout.success_rate_ub=1",
        "-o", "loop.eval_every=0", "-o", "loop.target_accuracy=0", "-o", "rollout.max_head_offpolicyness=2"]


def _start(out: Path, *overrides: str, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "areal_cli.commands.main", "train", "tiny-arith", "--out", str(out), *FAST,
                             *overrides], cwd=out.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def _servers(run: subprocess.Popen) -> list[int]:
    """PIDs of the run's rollout server processes (its children running the server or the SGLang stand-in)."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == run.pid and ("areal_cli.rollout.server" in cmd or "sglang.launch_server" in cmd):
            pids.append(int(p.name))
    return sorted(pids)


def _wait_until_busy(pid: int, timeout: float = 60.0) -> None:
    """Wait until server ``pid`` (its ``--port`` read from its command line) has a request running
    (``/server_info`` ``internal_states[0].num_running_reqs``), so that killing it leaves requests in flight."""
    import urllib.request

    args = (Path("/proc") / str(pid) / "cmdline").read_bytes().decode().split("\0")
    port = int(args[args.index("--port") + 1])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as r:
                if json.loads(r.read())["internal_states"][0]["num_running_reqs"] > 0:
                    return
        except OSError:
            pass
        time.sleep(0.01)
    raise AssertionError(f"server {pid} never had a request running in {timeout} s")


def _wait_for_step(run: subprocess.Popen, out: Path, step: int, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []
        if any(json.loads(x)["step"] >= step for x in lines if x.strip()):
            return
        assert run.poll() is None, run.communicate()[1][-3000:]
        time.sleep(0.2)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def _finish(run: subprocess.Popen, timeout: float = 300.0) -> tuple[int, str, str]:
    try:
        stdout, stderr = run.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(run.pid, signal.SIGUSR1)  # areal prints every thread's stack (faulthandler)
        time.sleep(2)
        os.killpg(run.pid, signal.SIGKILL)
        stdout, stderr = run.communicate()
        raise AssertionError(f"the run did not finish: {stdout[-2000:]}{stderr[-6000:]}")
    return run.returncode, stdout, stderr


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_killed_and_a_frozen_embedded_server_are_restarted_and_every_step_runs_once(tmp_path):
    out = tmp_path / "run"
    run = _start(out, "-o", "rollout.n_servers=2", "-o", "loop.max_steps=14", "-o", "rollout.server_stall_timeout_s=2")
    _wait_for_step(run, out, 2)
    first, second = _servers(run)
    # A tiny-arith request runs for a few ms: one seen running can finish before the SIGKILL lands (the test
    # process descheduled on a loaded machine), leaving nothing to re-issue. Kill again until a kill caught
    # samples in flight (the metrics' running count of re-issued samples moves), at most 3 times.
    kills = 0
    while True:
        _wait_until_busy(first)
        os.kill(first, signal.SIGKILL)  # dies with requests in flight
        kills += 1
        _wait_for_step(run, out, _rows(out)[-1]["step"] + 2)
        if _rows(out)[-1]["reissued_samples"] >= 1 or kills == 3:
            break
        first = _restarted(run, second)
    assert _rows(out)[-1]["reissued_samples"] >= 1, f"none of {kills} kills caught a sample in flight"
    _restarted(run, second)
    os.kill(second, signal.SIGSTOP)  # alive but answers nothing
    rc, stdout, stderr = _finish(run)
    assert rc == 0, stderr[-3000:]
    rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(15))  # no step lost or repeated
    assert all(r["staleness_max"] <= 2 for r in rows)  # the bound held through every outage
    fleet = json.loads((out / "summary.json").read_text())["fleet"]
    assert fleet["server_outages"] == kills + 1 and fleet["server_restarts"] == kills + 1
    assert fleet["reissued_samples"] >= 1 and rows[-1]["reissued_samples"] == fleet["reissued_samples"]
    reasons = [e["reason"] for e in fleet["events"] if e["event"] == "down"]
    assert "stopped answering" in reasons[-1], reasons
    assert [e["event"] for e in fleet["events"]] == ["down", "up"] * (kills + 1)
    assert stdout.count("is serving again") == kills + 1


def _restarted(run: subprocess.Popen, other: int, timeout: float = 60.0) -> int:
    """PID of the run's server other than ``other`` once the supervisor has restarted it (two servers again)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = _servers(run)
        if len(pids) == 2 and other in pids:
            return next(p for p in pids if p != other)
        time.sleep(0.1)
    raise AssertionError(f"the killed server was not restarted in {timeout} s: servers {_servers(run)}")


@pytest.mark.multiproc
@pytest.mark.slow
def test_the_only_sglang_stand_in_server_killed_mid_run_comes_back_and_the_run_finishes(tmp_path):
    out = tmp_path / "run"
    run = _start(out, "-o", "rollout.engine=sglang", "-o", "model.path=" + str(_tiny_model(tmp_path)),
                 "-o", "loop.max_steps=6", PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'fake_sglang'}")
    _wait_for_step(run, out, 2)
    (server,) = _servers(run)
    os.kill(server, signal.SIGKILL)  # no server left: generation waits for the restart
    rc, stdout, stderr = _finish(run)
    assert rc == 0, stderr[-3000:]
    rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(7)) and all(r["staleness_max"] <= 2 for r in rows)
    fleet = json.loads((out / "summary.json").read_text())["fleet"]
    assert fleet["server_outages"] == 1 and fleet["server_restarts"] == 1
    assert [e["event"] for e in fleet["events"]] == ["down", "up"]
    launches = [x for x in (out / "logs" / "server0.log").read_text().splitlines() if x.startswith("# areal fleet:")]
    assert len(launches) == 2 and all("sglang.launch_server" in x for x in launches)
    assert "--weight-version 0" not in launches[1]  # restarted with the policy version the fleet served


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_server_that_keeps_dying_ends_the_run_with_one_line(tmp_path):
    out = tmp_path / "run"
    run = _start(out, "-o", "loop.max_steps=50", "-o", "rollout.server_max_restarts=0")
    _wait_for_step(run, out, 1)
    (server,) = _servers(run)
    os.kill(server, signal.SIGKILL)
    rc, _, stderr = _finish(run, timeout=120)
    assert rc == 1 and "Traceback" not in stderr, stderr[-3000:]
    (line,) = stderr.strip().splitlines()
    assert line.startswith("error: rollout server 0 (embedded") and "server_max_restarts is 0" in line
    assert "server0.log" in line
    assert len(_rows(out)) >= 2  # the steps done are kept


def _tiny_model(tmp_path: Path) -> Path:
    """The tiny recipe's model, built the way `areal train` builds it (the stand-in serves a model directory)."""
    from areal_cli.recipes import load_train_config
    from areal_cli.models.tiny import build_tiny_model
    from areal_cli.tasks.task import Task

    cfg, _ = load_train_config("tiny-arith")
    return build_tiny_model(tmp_path / "model", seed=cfg.seed, corpus=Task(cfg).tokenizer_corpus(),
                            vocab_size=cfg.model.vocab_size, hidden_size=cfg.model.hidden_size,
                            num_layers=cfg.model.num_layers, chat_template=cfg.model.chat_template)


def _rank_pid(rank: int) -> int | None:
    """PID of the trainer worker process with RANK=rank (torchrun sets it in the worker's environment)."""
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and b"areal_cli.trainer.worker" in (p / "cmdline").read_bytes() and \
                    f"RANK={rank}".encode() in (p / "environ").read_bytes().split(b"\0"):
                return int(p.name)
        except OSError:
            continue
    return None


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_dying_trainer_rank_ends_the_run_with_one_line_naming_it_and_resume_continues(tmp_path):
    out = tmp_path / "run"
    run = _start(out, "-o", "parallel.data=2", "-o", "loop.checkpoint_every=2", "-o", "loop.max_steps=6")
    _wait_for_step(run, out, 3)
    os.kill(_rank_pid(1), signal.SIGKILL)
    rc, _, stderr = _finish(run, timeout=120)
    assert rc == 1 and "Traceback" not in stderr, stderr[-3000:]
    (line,) = [x for x in stderr.strip().splitlines() if not x.startswith(("/", "  warnings.warn"))]
    assert line.startswith("error: trainer rank 1 died (exit code -9, SIGKILL) during ")
    assert f"log {out / 'logs' / 'trainer-rank1.log'}" in line and line.endswith(f"areal train --resume {out}")
    r = subprocess.run([sys.executable, "-m", "areal_cli.commands.main", "train", "--resume", str(out), "--no-live"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert [x["step"] for x in _rows(out)] == list(range(7))  # no step lost or repeated


def test_a_frozen_server_that_holds_a_pause_is_found_with_no_generation_in_flight():
    """A server frozen while nothing is generating (SIGSTOP between requests) accepts connections and never answers:
    the pause of a weight update would wait on it forever. The supervisor sees the debt (a control call waiting
    longer than stall_s), probes /model_info, marks it down, and the pause goes on without it."""
    import asyncio
    from types import SimpleNamespace

    from areal_cli.rollout.client import RolloutClient
    from areal_cli.rollout.supervisor import FleetSupervisor

    async def go():
        async def frozen(reader, writer):  # reads the request, never answers
            await asyncio.sleep(3600)

        server = await asyncio.start_server(frozen, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        client = RolloutClient([url], vocab_size=10)
        fleet = SimpleNamespace(index_of=lambda u: None, describe=lambda i: "", can_restart=lambda i: False)
        logs = []
        sup = FleetSupervisor(fleet, client, weights_of=lambda: ("m", 0), lock=asyncio.Lock(), stall_s=0.5,
                              log=logs.append, poll_s=0.1, external_grace_s=60)
        watching = asyncio.create_task(sup.run())
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(client.pause(), timeout=30)  # returns once the frozen server is marked down
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await client.aclose()
            server.close()
        return time.monotonic() - t0, client.down, logs

    took, down, logs = asyncio.run(go())
    (reason,) = down.values()
    assert reason.startswith("stopped answering") and took < 15
    assert any("is down (stopped answering" in m for m in logs)

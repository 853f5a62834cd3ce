"""Claims about areal_cli.rollout.fleet: SGLang servers launched through the real command line
(``python -m sglang.launch_server``, here the CPU stand-in of tests/fake_sglang) serve the same client as
embedded servers; readiness never touches /health; bad input fails before anything starts; a failing server
shows its log tail; and no child process outlives the fleet, whether it is stopped, the parent gets Ctrl-C,
or the parent is killed outright."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from areal_cli.foundations.errors import UserError
from areal_cli.foundations.ports import free_port
from areal_cli.rollout.client import RolloutClient
from areal_cli.rollout.fleet import (
    ENV_ADDRS, FleetSpec, ServerDiedError, launch_fleet, parse_server_addrs,
)
from areal_cli.rollout.protocol import SamplingParams
from areal_cli.rollout.sglang_launcher import SGLangServerArgs
from areal_cli.rollout.watchdog import group_pids
from helpers.one_line import assert_one_line

REPO = Path(__file__).resolve().parents[1]
FAKE_SGLANG = str(Path(__file__).resolve().parent / "fake_sglang")


def sglang_spec(model: Path, run_dir: Path, **kw) -> FleetSpec:
    """Two 'SGLang' servers launched with SGLang's command line; the stand-in package is on PYTHONPATH."""
    sg = kw.pop("sglang", SGLangServerArgs(str(model), dtype="float32", max_total_tokens=8192, random_seed=5))
    return FleetSpec(engine="sglang", n_servers=kw.pop("n_servers", 2), model_path=model, run_dir=run_dir,
                     sglang=sg, env={"PYTHONPATH": FAKE_SGLANG}, startup_timeout_s=kw.pop("startup_timeout_s", 120),
                     **kw)


def group_alive(pgid: int) -> bool:
    """True while a live (not zombie) process is in group ``pgid`` (from /proc)."""
    return bool(group_pids(pgid))


def wait_groups_gone(pgids: list[int], timeout_s: float = 15) -> list[int]:
    """The groups still alive after waiting up to ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and any(group_alive(g) for g in pgids):
        time.sleep(0.1)
    return [g for g in pgids if group_alive(g)]


def child_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x)


@pytest.mark.multiproc
@pytest.mark.slow
def test_two_sglang_servers_generate_pause_update_and_stop_end_to_end(dirs, tmp_path, monkeypatch):
    model, perturbed = dirs
    fleet = launch_fleet(sglang_spec(model, tmp_path, gpu_ids=[[2], [3]]))
    pgids = [p.pid for p in fleet.procs]
    try:
        # launched through SGLang's own entry point, logs in run_dir/logs, one GPU list per server
        for i, (log, p) in enumerate(zip(fleet.log_paths, fleet.procs)):
            assert log == tmp_path / "logs" / f"server{i}.log"
            head = log.read_text()
            assert "-m sglang.launch_server --model-path" in head and "--skip-tokenizer-init" in head
            assert f"--random-seed {5 + i}" in head and "fake sglang:" in head
            assert child_env(p.pid)["CUDA_VISIBLE_DEVICES"] == str(2 + i)
        assert [m["weight_version"] for m in fleet.model_infos] == ["default", "default"]
        vocab = fleet.model_infos[0]["vocab_size"]

        async def scenario():
            c = RolloutClient(fleet.urls, vocab_size=vocab)
            other = RolloutClient(fleet.urls, vocab_size=vocab)  # a client that does not know about the pause
            try:
                first = await asyncio.gather(*(c.generate([5, 6, 7], SamplingParams(6)) for _ in range(2)))
                await c.pause()
                held = asyncio.create_task(other.generate([5, 6, 7], SamplingParams(4)))
                async with httpx.AsyncClient() as h:
                    deadline = time.monotonic() + 30  # the server itself holds the request (not a slow client)
                    async def held_on_servers() -> int:
                        return sum([(await h.get(u + "/server_info", timeout=5)).json()["internal_states"][0]
                                    ["num_held_reqs"] for u in fleet.urls])

                    while await held_on_servers() != 1:
                        assert time.monotonic() < deadline, "the paused server never received the request"
                        await asyncio.sleep(0.05)
                    held_during_pause = (held.done(), c.paused)
                    info = (await h.get(fleet.urls[0] + "/model_info", timeout=5)).json()  # answers while paused
                await c.resume()
                after_pause = await asyncio.wait_for(held, 60)
                await c.update_weights_from_disk(str(perturbed), 1)
                updated = await c.generate([5, 6, 7], SamplingParams(5))
                infos = [await c.model_info(u) for u in fleet.urls]
                async with httpx.AsyncClient() as h:
                    states = [(await h.get(u + "/server_info", timeout=5)).json()["internal_states"][0]
                              for u in fleet.urls]
                # launch, readiness, generation, pause, update: nothing called /health (on SGLang 0.5.23 it runs a
                # generation, blocks while paused and then marks the server unhealthy)
                assert [st["health_requests"] for st in states] == [0, 0]
                assert [st["num_held_reqs"] for st in states] == [0, 0]
                return first, held_during_pause, info, after_pause, updated, infos
            finally:
                await c.aclose()
                await other.aclose()

        first, held_during_pause, info, after_pause, updated, infos = asyncio.run(scenario())
        assert {r.server_url for r in first} == set(fleet.urls)  # round robin over both servers
        assert all(len(r.output_ids) == 6 and r.output_versions == [0] * 6 for r in first)
        assert held_during_pause == (False, True) and info["model_path"] == str(model)
        assert (after_pause.finish_reason, len(after_pause.output_ids)) == ("length", 4)  # no error
        assert updated.output_versions == [1] * 5
        assert [(i["weight_version"], i["model_path"]) for i in infos] == [("1", str(perturbed))] * 2
        fleet.check_alive()
        monkeypatch.setenv(ENV_ADDRS, ",".join(u.removeprefix("http://") for u in fleet.urls))
        ext = launch_fleet(FleetSpec(engine="external", n_servers=0))  # nothing launched, checked via /model_info
        assert ext.urls == fleet.urls and ext.procs == [] and ext.model_infos[1]["weight_version"] == "1"
        ext.stop()
        fleet.check_alive()  # stopping an external fleet leaves the servers alone
    finally:
        fleet.stop()
    assert all(p.returncode is not None for p in fleet.procs)
    assert wait_groups_gone(pgids, timeout_s=0) == []
    assert fleet._watchdog.proc.returncode == 0
    fleet.stop()  # idempotent


@pytest.mark.multiproc
@pytest.mark.slow
def test_embedded_server_that_loses_its_picked_port_is_restarted_on_another(dirs, tmp_path):
    fleet = launch_fleet(FleetSpec(engine="embedded", n_servers=1, model_path=dirs[0], run_dir=tmp_path,
                                   max_total_tokens=4096, weight_version="3"), wait=False)
    taken_port = int(fleet.urls[0].rsplit(":", 1)[1])
    with fleet, socket.socket() as thief:  # another process binds the port while the server imports torch
        thief.bind(("127.0.0.1", taken_port))
        thief.listen()
        fleet.wait_ready()
        assert fleet.urls[0] != f"http://127.0.0.1:{taken_port}" and fleet.model_infos[0]["weight_version"] == "3"
        log = fleet.log_paths[0].read_text()
        assert "address already in use" in log and log.count("# areal fleet: ") == 2
        assert "--parent-pid" in log and "-m areal_cli.rollout.server" in log


def test_port_in_use_fails_with_one_line_before_anything_starts(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        with pytest.raises(UserError) as ei:
            launch_fleet(FleetSpec(engine="sglang", n_servers=2, model_path=model, ports=[free, port],
                                   run_dir=tmp_path))
    assert str(ei.value) == f"127.0.0.1:{port}: port already in use (server 1)"
    assert not (tmp_path / "logs").exists()  # nothing was launched


@pytest.mark.parametrize("kw,msg", [
    (dict(engine="vllm"), "fleet.engine: must be one of embedded, sglang, external, got 'vllm'"),
    (dict(n_servers=0), "fleet.n_servers: must be an integer >= 1, got 0"),
    (dict(ports=[30000]), "fleet.ports: 1 ports for 2 servers"),
    (dict(ports=[30000, 30000]), "fleet.ports: ports repeat"),
    (dict(engine="sglang", gpu_ids=[[0], [1]], sglang=SGLangServerArgs("x", tp_size=2)),
     "fleet.gpu_ids[0]: 1 GPUs for a server of tp*dp*pp = 2"),
    (dict(gpu_ids=[[0], []]), "fleet.gpu_ids[1]: must be a non-empty list"),
    (dict(model_path="/nonexistent/model"), "/nonexistent/model: not a model directory (no config.json)"),
    (dict(engine="sglang", sglang=SGLangServerArgs("x", dtype="fp8")), "sglang.dtype: must be one of"),
])
def test_bad_specs_raise_one_line_naming_the_field(tmp_path, kw, msg):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    spec = FleetSpec(**{"n_servers": 2, "model_path": model, "run_dir": tmp_path, **kw})
    with pytest.raises(UserError) as ei:
        launch_fleet(spec)
    assert_one_line(str(ei.value), msg)
    assert not (tmp_path / "logs").exists()


def test_external_addresses_are_parsed_and_checked(monkeypatch):
    assert parse_server_addrs("10.0.0.1:30000, http://h2:31000/") == ["http://10.0.0.1:30000", "http://h2:31000"]
    for bad in ("10.0.0.1", "h:0", "h:abc", " , "):
        with pytest.raises(UserError, match=ENV_ADDRS):
            parse_server_addrs(bad)
    monkeypatch.delenv(ENV_ADDRS, raising=False)
    with pytest.raises(UserError, match=f"{ENV_ADDRS}: not set"):
        launch_fleet(FleetSpec(engine="external", n_servers=0))
    dead = free_port()  # nothing listens there
    with pytest.raises(UserError, match=rf"http://127.0.0.1:{dead}: /model_info did not answer 200 within"):
        launch_fleet(FleetSpec(engine="external", n_servers=1, urls=[f"127.0.0.1:{dead}"], startup_timeout_s=0.5))


@pytest.mark.multiproc
@pytest.mark.slow
def test_server_that_fails_at_startup_shows_its_log_tail_and_no_child_remains(dirs, tmp_path):
    broken = tmp_path / "broken"  # config.json but no weights: the server exits at start
    broken.mkdir()
    (broken / "config.json").write_text((dirs[0] / "config.json").read_text())
    spec = sglang_spec(broken, tmp_path, sglang=SGLangServerArgs(str(broken)))
    with pytest.raises(UserError) as ei:
        launch_fleet(spec)
    msg = str(ei.value)
    assert msg.startswith("rollout server ") and "exited with code 2 during start-up" in msg
    assert msg.splitlines()[-1].endswith(f"{broken}: no model.safetensors (or index) found")  # the log's tail
    assert "fake sglang:" in msg  # earlier log lines are part of the tail too


@pytest.mark.multiproc
@pytest.mark.slow
def test_startup_timeout_stops_every_server(dirs, tmp_path):
    spec = sglang_spec(dirs[0], tmp_path, startup_timeout_s=0.3)
    fleet = launch_fleet(spec, wait=False)
    pgids = [p.pid for p in fleet.procs]
    with pytest.raises(UserError, match=r"not ready after \d+ s \(log .*server0.log\); last lines:\n"):
        fleet.wait_ready()
    assert wait_groups_gone(pgids, timeout_s=0) == []


@pytest.mark.multiproc
def test_check_alive_reports_a_dead_server_with_its_log_tail(dirs, tmp_path):
    fleet = launch_fleet(sglang_spec(dirs[0], tmp_path, n_servers=1), wait=False)
    try:
        os.killpg(fleet.procs[0].pid, signal.SIGKILL)
        fleet.procs[0].wait(timeout=10)
        with pytest.raises(ServerDiedError, match=r"rollout server 0 \(sglang, 127.0.0.1:\d+\) exited with code -9"
                                                  r" .*last lines:\n# areal fleet: .*sglang.launch_server"):
            fleet.check_alive()
    finally:
        fleet.stop()


PARENT = r"""
import json, os, signal, sys, time
# Ctrl-C as a terminal delivers it: a runner started in the background (nohup ... &) hands its children SIGINT
# ignored, and Python then keeps it ignored (no KeyboardInterrupt at all)
signal.signal(signal.SIGINT, signal.default_int_handler)
from areal_cli.rollout.fleet import FleetSpec, launch_fleet
from areal_cli.rollout.sglang_launcher import SGLangServerArgs
model, run_dir, mode = sys.argv[1], sys.argv[2], sys.argv[3]
fleet = launch_fleet(FleetSpec(engine="sglang", n_servers=2, model_path=model, run_dir=run_dir,
                               sglang=SGLangServerArgs(model, dtype="float32", max_total_tokens=4096),
                               env={"PYTHONPATH": sys.argv[4]}), wait=mode == "sigint")
print(json.dumps([p.pid for p in fleet.procs] + [fleet._watchdog.proc.pid]), flush=True)
if mode == "sigint":
    os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: KeyboardInterrupt, no explicit stop anywhere
time.sleep(120)
"""


def _run_parent(model: Path, tmp_path: Path, mode: str) -> tuple[subprocess.Popen, list[int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", PARENT, str(model), str(tmp_path), mode, FAKE_SGLANG],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    pids = json.loads(line)
    return proc, pids


@pytest.mark.multiproc
@pytest.mark.slow
def test_ctrl_c_in_the_parent_stops_every_server(dirs, tmp_path):
    proc, pids = _run_parent(dirs[0], tmp_path, "sigint")
    proc.wait(timeout=60)
    assert "KeyboardInterrupt" in proc.stderr.read()
    assert wait_groups_gone(pids[:2], timeout_s=0) == []  # stopped by atexit before the parent exited


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_parent_killed_without_cleanup_still_leaves_no_server(dirs, tmp_path, sig):
    proc, pids = _run_parent(dirs[0], tmp_path, "sleep")  # servers launched, still starting up
    assert all(group_alive(p) for p in pids)
    proc.send_signal(sig)  # no atexit runs: the watchdog process stops the servers
    proc.wait(timeout=30)
    assert wait_groups_gone(pids, timeout_s=20) == []

"""Multi-node launch (Slurm + torchrun): the sbatch script and plan of 2-node layouts, the torchrun commands of
each node, bad input in one line, and the node entry on loopback -- two "nodes" on 127.0.0.1 run as two
``areal launch node`` processes (SLURM_NODEID 0 and 1): servers, torchrun --nnodes 2 with a gloo all_reduce,
discovery files, the controller on node 0, a clean stop, and a failing node stopping the other one."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from areal_cli.foundations.errors import UserError
from areal_cli.launch.node import discovery_dir, torchrun_command
from areal_cli.launch.plan import build_plan, read_plan, write_plan
from areal_cli.launch.setup import plan_for_config
from areal_cli.launch.slurm import sbatch_text, write_slurm_files
from areal_cli.commands.launch import launch
from areal_cli.recipes.placement import parse_allocation, place
from areal_cli.foundations.ports import free_port
from helpers.one_line import last_error_line

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "launch_scripts"


# --- files ------------------------------------------------------------------------------------------------


def test_sbatch_script_runs_one_launch_node_task_per_node_with_slurm_host_names(tmp_path):
    plan = plan_for_config("tiny-arith", nodes=2, gpus_per_node=8, run_dir=tmp_path / "run",
                           allocation="sglang.d4m2p1+d2m2p2", model_path=tmp_path,
                           overrides=["sft.max_steps=0"])  # packed SFT has no pipeline-parallel path
    plan_path, sbatch = write_slurm_files(plan, cpus_per_task=12, time_limit="02:00:00")
    text = sbatch.read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --cpus-per-task=12", "#SBATCH --time=02:00:00",
                 f"#SBATCH --output={tmp_path / 'run' / 'logs' / 'slurm-%j.out'}",
                 'HOSTS=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)',
                 f'srun --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=1 {shlex.quote(sys.executable)} -m areal_cli.commands.main launch '
                 f'node --plan "$RUN/launch/plan.json" --hosts "$HOSTS"'):
        assert line in text.splitlines(), line
    assert os.access(sbatch, os.X_OK) and (plan.authkey_path.stat().st_mode & 0o777) == 0o600
    # the plan: 4 TP2 servers fill node 0, the 8 ranks (dp2 x tp2 x pp2) fill node 1
    got = read_plan(plan_path)
    assert got.placement.servers == [(0, (0, 1)), (0, (2, 3)), (0, (4, 5)), (0, (6, 7))]
    assert got.placement.trainer_ranks == [(1, g) for g in range(8)]
    assert got.server["engine"] == "sglang" and got.server["sglang"] == {"tp_size": 2, "pp_size": 1}
    assert got.controller["command"][1:] == [
        "-m", "areal_cli.commands.main", "train", "tiny-arith", "--out", str((tmp_path / "run" / "train").resolve()),
        "--no-live", "-o", "sft.max_steps=0", "-o", "rollout.n_servers=4", "-o", "rollout.engine=external",
        "-o", "rollout.sglang_tp_size=2", "-o", "parallel.data=2", "-o", "parallel.tensor=2",
        "-o", "parallel.pipeline=2"]
    hosts = ["gpu-a", "gpu-b"]
    assert torchrun_command(got, 0, hosts) is None  # node 0: servers and the controller only
    assert torchrun_command(got, 1, hosts, python="py") == [
        "py", "-m", "torch.distributed.run", "--nnodes", "1", "--node-rank", "0", "--nproc-per-node", "8",
        "--master-addr", "gpu-b", "--master-port", "29500", "--max-restarts", "0", "-m", "areal_cli.trainer.worker"]


def test_trainer_ranks_spanning_two_nodes_get_one_torchrun_per_node_in_rank_order(tmp_path):
    # servers: GPUs 0-3 of node 0; ranks 0-3 on node 0 (GPUs 4-7), ranks 4-11 on node 1
    p = place(parse_allocation("sglang.d2m2+d2m2p3"), nodes=2, gpus_per_node=8)
    plan = build_plan(p, tmp_path, controller_cmd=["true"], model_path=tmp_path, master_port=1234)
    assert p.trainer_ranks[:4] == [(0, g) for g in range(4, 8)] and p.trainer_ranks[4:] == [(1, g) for g in range(8)]
    cmds = [torchrun_command(plan, n, ["h0", "h1"], python="py") for n in (0, 1)]
    for cmd, node_rank, nproc in zip(cmds, ("0", "1"), ("4", "8")):
        args = dict(zip(cmd[3:13:2], cmd[4:14:2]))
        assert args == {"--nnodes": "2", "--node-rank": node_rank, "--nproc-per-node": nproc, "--master-addr": "h0",
                        "--master-port": "1234"}


def test_a_plan_edited_by_hand_is_refused(tmp_path):
    plan = build_plan(place(parse_allocation("d4"), nodes=2, gpus_per_node=2), tmp_path, controller_cmd=["true"])
    path = write_plan(plan)
    d = json.loads(path.read_text())
    d["placement"]["trainer_ranks"][0]["gpu"] = 1
    path.write_text(json.dumps(d))
    with pytest.raises(UserError, match="differs from the computed one"):
        read_plan(path)


def test_cpu_sbatch_asks_for_no_gpus(tmp_path):
    plan = build_plan(place(parse_allocation("embedded.d2+d2"), nodes=2, gpus_per_node=0), tmp_path,
                      controller_cmd=["true"], model_path=tmp_path)
    assert "--gpus-per-node" not in sbatch_text(plan)


# --- command line: bad input ----------------------------------------------------------------------------------


def test_launch_slurm_writes_the_files_and_submit_without_sbatch_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    out = tmp_path / "run"
    (tmp_path / "config.json").write_text("{}")  # stands for the model directory on the shared filesystem
    res = CliRunner().invoke(launch, ["slurm", "tiny-arith", "--nodes", "2", "--gpus-per-node", "0", "--out", str(out),
                                      "--allocation", "embedded.d2+d2", "--model", str(tmp_path), "--submit"])
    last_error_line(res, 2, "sbatch: not found on PATH", str(out / "launch" / "job.sbatch"))
    assert (out / "launch" / "plan.json").is_file() and (out / "launch" / "job.sbatch").is_file()
    assert "node 1: servers 1; trainer ranks 1" in res.output
    res = CliRunner().invoke(launch, ["slurm", "tiny-arith", "--nodes", "2", "--gpus-per-node", "0", "--out", str(out),
                                      "--allocation", "embedded.d2+d2", "--model", str(tmp_path)])
    last_error_line(res, 2, "already holds a launch plan")
    res = CliRunner().invoke(launch, ["slurm", "tiny-arith", "--nodes", "2", "--gpus-per-node", "0", "--out",
                                      str(tmp_path / "run2"), "--allocation", "embedded.d2+d2", "--model", str(out)])
    last_error_line(res, 2, "not a model directory")
    res = CliRunner().invoke(launch, ["slurm", "tiny-arith", "--nodes", "2", "--gpus-per-node", "0", "--out",
                                      "/proc/nope", "--allocation", "embedded.d2+d2", "--model", str(tmp_path)])
    last_error_line(res, 2, "cannot write the launch files")
    spaced = tmp_path / "a run"  # '#SBATCH --output=' cannot hold it
    res = CliRunner().invoke(launch, ["slurm", "tiny-arith", "--nodes", "2", "--gpus-per-node", "0", "--out",
                                      str(spaced), "--allocation", "embedded.d2+d2", "--model", str(tmp_path)])
    last_error_line(res, 2, "cannot hold a path with whitespace")
    assert not spaced.exists()


@pytest.mark.parametrize("args, needles", [
    (["--nodes", "2", "--gpus-per-node", "8", "--allocation", "sglang.d8m2+d4m2"], ["needs 24 GPUs", "2 nodes x 8"]),
    (["--nodes", "1", "--gpus-per-node", "8", "--allocation", "sglang.d0m2+d1"], ["part 'd0m2': d must be >= 1"]),
    (["--nodes", "2", "--gpus-per-node", "8", "--allocation", "vllm.d2+d2"], ["vllm backend is not launched"]),
    (["--nodes", "2", "--gpus-per-node", "8", "--allocation", "sglang.d2+d2"], ["need a model directory"]),
    (["--nodes", "2", "--gpus-per-node", "8", "-o", "nonsense=1"], ["nonsense"]),
])
def test_launch_slurm_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, needles):
    out = tmp_path / "run"
    last_error_line(CliRunner().invoke(launch, ["slurm", "tiny-arith", "--out", str(out), *args]), 2, *needles)
    assert not out.exists()


def test_launch_node_without_host_names_or_node_rank_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_NODEID", raising=False)
    plan = build_plan(place(parse_allocation("d2"), nodes=2, gpus_per_node=0), tmp_path, controller_cmd=["true"])
    path = write_plan(plan)
    last_error_line(CliRunner().invoke(launch, ["node", "--plan", str(path), "--hosts", "a,b"]), 2,
                   "node rank unknown", "SLURM_NODEID")
    last_error_line(CliRunner().invoke(launch, ["node", "--plan", str(path), "--node-rank", "1"]), 2,
                   "host names unknown for 2 nodes")
    last_error_line(CliRunner().invoke(launch, ["node", "--plan", str(path), "--node-rank", "2", "--hosts", "a,b"]), 2,
                   "node rank 2 out of range")


# --- loopback: two nodes on 127.0.0.1 ------------------------------------------------------------------------------


def loopback_plan(tmp_path: Path, allocation: str, model: Path | None) -> tuple[Path, Path, int]:
    out = tmp_path / "results"
    out.mkdir()
    p = place(parse_allocation(allocation), nodes=2, gpus_per_node=0)
    env = {"LAUNCH_TEST_OUT": str(out), "LAUNCH_TEST_RANKS": str(len(p.trainer_ranks))}
    plan = build_plan(p, tmp_path / "run", controller_cmd=["{python}", str(SCRIPTS / "controller.py")],
                      trainer_args=[str(SCRIPTS / "trainer.py")], trainer_env=env, controller_env=env,
                      model_path=model, master_port=free_port(), controller_port=free_port(),
                      embedded_extra_args=[], startup_timeout_s=120)
    return write_plan(plan), out, len(p.trainer_ranks)


def start_nodes(plan_path: Path, extra_env: dict[int, dict] | None = None) -> list[subprocess.Popen]:
    procs = []
    for k in (0, 1):
        env = {**os.environ, "SLURM_NODEID": str(k), "PYTHONPATH": str(REPO), **((extra_env or {}).get(k, {}))}
        procs.append(subprocess.Popen([sys.executable, "-m", "areal_cli.commands.main", "launch", "node", "--plan", str(plan_path),
                                       "--hosts", "127.0.0.1,127.0.0.1"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = 150) -> list[tuple[int, str, str]]:
    out = []
    try:
        for p in procs:
            so, se = p.communicate(timeout=timeout)
            out.append((p.returncode, so, se))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    return out


def children_left(run: Path) -> list[int]:
    """Child process groups recorded in the nodes' status files that still exist."""
    left = []
    for f in (run / "launch" / "status").glob("node*.json"):
        for pid in json.loads(f.read_text())["children"]:
            try:
                os.killpg(pid, 0)
                left.append(pid)
            except ProcessLookupError:
                pass
    return left


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    from areal_cli.models.tiny import build_tiny_model

    d = tmp_path_factory.mktemp("launch_model")
    build_tiny_model(d, seed=0, corpus=["1 + 2 = 3", "4 + 5 = 9", "the answer is 7"], vocab_size=270,
                     hidden_size=32, num_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                     intermediate_size=64)
    return d


@pytest.mark.multiproc
@pytest.mark.slow
def test_two_loopback_nodes_run_servers_torchrun_and_the_controller_then_stop_cleanly(tmp_path, small_model):
    plan_path, out, n_ranks = loopback_plan(tmp_path, "embedded.d2+d2", small_model)
    run = tmp_path / "run"
    results = finish(start_nodes(plan_path))
    for k, (rc, so, se) in enumerate(results):
        assert rc == 0, (k, so, se)
    # torchrun --nnodes 2: one rank per node, the gloo all_reduce of (rank + 1) over both = 3
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(n_ranks)]
    assert [(x["rank"], x["node_rank"], x["world"], x["local_world"], x["sum"]) for x in ranks] == \
        [(0, 0, 2, 1, 3.0), (1, 1, 2, 1, 3.0)]
    plan = read_plan(plan_path)
    assert {x["controller_addr"] for x in ranks} == {f"127.0.0.1:{plan.ports['controller']}"}
    # one embedded server per node, published in the discovery directory, reached by the controller
    files = sorted(p.name for p in discovery_dir(run).iterdir())
    assert files == ["0-0.url", "1-1.url"]
    urls = [(discovery_dir(run) / f).read_text().strip() for f in files]
    ctl = json.loads((out / "controller.json").read_text())
    assert ["http://" + a for a in ctl["addrs"]] == urls and len(set(urls)) == 2
    assert [(i["engine"], Path(i["served_model_name"])) for i in ctl["model_infos"]] == \
        [("areal-embedded", small_model.resolve())] * 2
    assert ctl["listen"] == f"127.0.0.1:{plan.ports['controller']}"
    assert ctl["authkey_file"] == str(plan.authkey_path) == ranks[0]["authkey_file"]
    states = {json.loads(f.read_text())["state"] for f in (run / "launch" / "status").glob("node*.json")}
    assert states == {"done", "stopped"}  # node 0 done, node 1 stopped after it
    assert children_left(run) == []


@pytest.mark.multiproc
@pytest.mark.slow
def test_two_loopback_nodes_run_a_real_areal_train_with_external_servers_and_a_two_node_trainer(tmp_path):
    """No stand-ins: node 0 runs `areal train tiny-arith -o rollout.engine=external` (the default controller
    command), each node an embedded server and one torchrun rank of the real trainer worker (DP=2 over 2 nodes)."""
    from areal_cli.recipes import load_train_config
    from areal_cli.launch.plan import controller_command
    from areal_cli.models.tiny import build_tiny_model
    from areal_cli.tasks.task import Task

    cfg, _ = load_train_config("tiny-arith")
    model = build_tiny_model(tmp_path / "model", seed=cfg.seed, corpus=Task(cfg).tokenizer_corpus(),
                             vocab_size=cfg.model.vocab_size, hidden_size=cfg.model.hidden_size,
                             num_layers=cfg.model.num_layers, chat_template=cfg.model.chat_template)
    placement = place(parse_allocation("embedded.d2+d2"), nodes=2, gpus_per_node=0)
    run = tmp_path / "run"
    overrides = [f"model.path={model}", "loop.max_steps=2", "sft.max_steps=0", "rollout.success_rate_lb=0", "loop.eval_every=0",
                 "loop.target_accuracy=0", "rollout.max_head_offpolicyness=1"]
    plan = build_plan(placement, run, controller_cmd=controller_command("tiny-arith", run, placement, overrides),
                      model_path=model, master_port=free_port(), controller_port=free_port(), startup_timeout_s=120)
    results = finish(start_nodes(write_plan(plan)), timeout=400)
    for k, (rc, so, se) in enumerate(results):
        assert rc == 0, (k, so[-2000:], se[-3000:])
    rows = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and all(r["staleness_max"] <= 1 for r in rows)
    config = json.loads((run / "train" / "config.json").read_text())
    assert (config["rollout"]["engine"], config["rollout"]["n_servers"], config["parallel"]["data"]) == ("external", 2, 2)
    summary = json.loads((run / "train" / "summary.json").read_text())
    assert summary["ok"] and summary["final_version"] == 2
    # both nodes' servers generated, both trainer ranks trained
    urls = {(discovery_dir(run) / f).read_text().strip() for f in ("0-0.url", "1-1.url")}
    assert len(urls) == 2
    assert sorted(p.name for p in run.rglob("trainer-rank*.log")) == ["trainer-rank0.log", "trainer-rank1.log"]
    assert children_left(run) == []


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_failing_node_stops_the_other_one_with_one_line(tmp_path):
    plan_path, out, _ = loopback_plan(tmp_path, "d2", None)  # training only: one rank per node
    run = tmp_path / "run"
    t0 = time.monotonic()
    results = finish(start_nodes(plan_path, {1: {"LAUNCH_TEST_FAIL_NODE": "1"}}))
    (rc0, _, err0), (rc1, _, err1) = results
    assert rc1 == 1 and err1.strip().splitlines() == [err1.strip()], err1
    assert err1.startswith("error: node 1: trainer torchrun exited with code"), err1
    assert rc0 == 1 and err0.strip().splitlines() == [err0.strip()], err0
    assert err0.startswith("error: node 1 (127.0.0.1) failed: trainer torchrun exited with code"), err0
    assert err0.strip().endswith("stopped node 0"), err0
    assert time.monotonic() - t0 < 120  # node 0 did not wait for its collective to time out
    assert not list(out.glob("rank*.json")) and children_left(run) == []


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_server_that_fails_to_start_shows_its_log_and_stops_every_node(tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "not-a-model"}')
    plan_path, out, _ = loopback_plan(tmp_path, "embedded.d1+d2", broken)  # the server on node 0, a rank per node
    run = tmp_path / "run"
    (rc0, _, err0), (rc1, _, err1) = finish(start_nodes(plan_path))
    # node 0, whose server died: exit 2, the message ends with the last lines of the server's log
    assert rc0 == 2 and err0.startswith("error: rollout server 0 (embedded, 127.0.0.1:"), err0
    assert "exited with code" in err0 and "during start-up" in err0 and "last lines:" in err0, err0
    log = run / "nodes" / "node0" / "logs" / "server0.log"
    last = [x.strip() for x in log.read_text().splitlines() if x.strip()][-1]
    assert err0.strip().endswith(last), err0
    # node 1 (trainer rank only): one line naming node 0 and why, with the server log's last line
    assert rc1 == 1 and err1.strip().splitlines() == [err1.strip()], err1
    assert err1.startswith("error: node 0 (127.0.0.1) failed: rollout server 0 (embedded"), err1
    assert f"last log line: {last}; stopped node 1" in err1, err1
    assert not (discovery_dir(run) / "0-0.url").exists() and not (out / "controller.json").exists()
    assert children_left(run) == []


@pytest.mark.multiproc
@pytest.mark.slow
def test_the_trainer_worker_ranks_of_two_nodes_attach_to_the_controller_on_node_0(tmp_path):
    # the real path of `areal train` on node 0: torchrun ... -m areal_cli.trainer.worker on each node, rank 0
    # connects to $AREAL_CONTROLLER_ADDR with the key in launch/authkey; the controller attaches and calls
    out = tmp_path / "results"
    out.mkdir()
    p = place(parse_allocation("d2"), nodes=2, gpus_per_node=0)
    plan = build_plan(p, tmp_path / "run", controller_cmd=["{python}", str(SCRIPTS / "attach_controller.py")],
                      trainer_env={"PYTHONPATH": f"{SCRIPTS}{os.pathsep}{REPO}"},
                      controller_env={"LAUNCH_TEST_OUT": str(out)}, master_port=free_port(),
                      controller_port=free_port())
    results = finish(start_nodes(write_plan(plan)))
    for k, (rc, so, se) in enumerate(results):
        assert rc == 0, (k, so, se)
    got = json.loads((out / "attach.json").read_text())
    assert got == {"world": 2, "result": {"sum": 21.0, "world": 2, "node_rank": 0}}  # (10 + 0) + (10 + 1)
    logs = tmp_path / "run" / "logs"
    assert (logs / "trainer-rank0.log").is_file() and (logs / "trainer-rank1.log").is_file()
    assert children_left(tmp_path / "run") == []

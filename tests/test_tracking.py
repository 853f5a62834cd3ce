"""Experiment tracking (areal_cli.train_loop.tracking): TensorBoard event files and an offline W&B run of a real
`areal train`, read back and compared with metrics.jsonl; bad logger names and missing packages are one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_cli.foundations.errors import UserError
from areal_cli.train_loop.tracking import flatten, parse_loggers

ROOT = Path(__file__).resolve().parents[1]


def _areal(*args, cwd, timeout=600, **env):
    return subprocess.run([sys.executable, "-m", "areal_cli.commands.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_flatten_keeps_numbers_and_joins_nested_keys():
    row = {"step": 3, "accuracy": 0.5, "evaluated": True, "phase": "rl", "reward_mean": None,
           "eval_benchmarks": {"aime24": {"pass@1": 0.25, "n": 30}}, "curve": [1, 2], "bad": float("nan")}
    assert flatten(row) == {"step": 3.0, "accuracy": 0.5, "evaluated": 1.0, "eval_benchmarks/aime24/pass@1": 0.25,
                            "eval_benchmarks/aime24/n": 30.0}


def test_logger_names_and_missing_packages_are_one_line(monkeypatch):
    assert parse_loggers("tensorboard, wandb,tensorboard") == ["tensorboard", "wandb"]
    assert parse_loggers("") == []
    with pytest.raises(UserError, match="unknown logger 'mlflow'"):
        parse_loggers("tensorboard,mlflow")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(UserError, match=r"wandb needs the 'wandb' package.*areal-cli\[tracking\]"):
        parse_loggers("wandb")


@pytest.mark.multiproc
def test_cli_refuses_an_unknown_logger_before_any_work(tmp_path):
    r = _areal("train", "--out", str(tmp_path / "o"), "-o", "loop.loggers=tensorboard,mlflow", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "field 'loop.loggers'" in r.stderr and "mlflow" in r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_run_logs_every_metrics_line_to_tensorboard_and_offline_wandb(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    r = _areal("train", "tiny-arith", "--out", str(out), "--no-live", "-o", "loop.max_steps=3", "-o", "sft.max_steps=40",
               "-o", "loop.loggers=tensorboard,wandb", "-o", "loop.wandb_project=areal-test", cwd=tmp_path,
               WANDB_MODE="offline", WANDB_SILENT="true")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"TensorBoard: {out / 'tensorboard'}" in r.stdout and "W&B: offline run" in r.stdout
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == [0, 1, 2, 3]
    assert all(0.0 <= x["reward_mean_scored"] <= 1.0 for x in rows[1:])  # every scored group, before the filter

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for key in ("accuracy", "reward_mean", "staleness_max", "loss", "grad_norm", "gen_tokens_per_s"):
        assert key in tags, key
        logged = {e.step: e.value for e in acc.Scalars(key)}
        expected = {x["step"]: x[key] for x in rows if x.get(key) is not None}
        assert logged.keys() == expected.keys(), key
        assert all(abs(logged[s] - expected[s]) <= 1e-6 * max(1.0, abs(expected[s])) for s in expected), key
    assert any("config" in t for t in acc.Tags()["tensors"])  # the run config, as text

    run_id = (out / "wandb_run_id").read_text().strip()
    (run_dir,) = (out / "wandb").glob(f"offline-run-*-{run_id}")
    records = list(_wandb_records(run_dir / f"run-{run_id}.wandb"))
    history = [{i.nested_key[0] if i.nested_key else i.key: json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [h["_step"] for h in history] == [0, 1, 2, 3]
    for h, row in zip(history, rows):
        for key in ("accuracy", "loss", "staleness_max", "groups_accepted"):
            if row.get(key) is not None:
                assert h[key] == pytest.approx(row[key]), key
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert run.project == "areal-test" and run.display_name == "run"
    assert config["loop"]["max_steps"] == 3 and config["loop"]["loggers"] == "tensorboard,wandb"
    summary = {u.key: json.loads(u.value_json) for r in records if r.WhichOneof("record_type") == "summary"
               for u in r.summary.update}
    assert summary["final_accuracy"] == pytest.approx(rows[-1]["accuracy"])


def _wandb_records(path: Path):
    """The records of an offline W&B run file: a 7-byte header (":W&B", magic, version), then LevelDB-log
    records (crc32c 4, length 2 little-endian, type 1: full / first / middle / last) in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if length == 0 and kind == 0:  # zero padding to the end of a block
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec
            buf = b""


def test_wandb_goes_online_only_when_logged_in(tmp_path, monkeypatch):
    from areal_cli.train_loop.tracking import _wandb_logged_in

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert not _wandb_logged_in()  # no ~/.netrc
    (tmp_path / ".netrc").write_text("machine example.org login me password x\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert not _wandb_logged_in()  # a netrc, but not W&B's
    (tmp_path / ".netrc").write_text("machine api.wandb.ai login user password k3y\n")
    assert _wandb_logged_in()
    monkeypatch.setenv("WANDB_API_KEY", "k")
    (tmp_path / ".netrc").unlink()
    assert _wandb_logged_in()


class _FakeWandbRun:
    """What Tracker uses of a W&B run, online: the server's next step for a resumed run, and every log call."""

    def __init__(self, starting_step: int):
        from types import SimpleNamespace

        self.starting_step, self.id, self.url = starting_step, "abc123", "https://wandb.example/run"
        self.settings = SimpleNamespace(mode="online")
        self.summary, self.logged = {}, []

    def log(self, data, step):
        self.logged.append(step)

    def finish(self):
        pass


@pytest.mark.parametrize("server_next, replayed, logged", [
    (6, [], [6, 7, 8]),  # the killed process logged steps 4-5 after checkpoint 3: W&B keeps them, takes 6 on
    (2, [2, 3], [4, 5, 6, 7, 8]),  # W&B lost steps 2-3 (killed before they reached it): re-logged from metrics.jsonl
    (4, [], [4, 5, 6, 7, 8]),  # W&B holds exactly the checkpoint's steps
])
def test_a_resumed_online_wandb_run_fills_what_it_lacks_and_never_logs_a_step_it_would_drop(
        tmp_path, monkeypatch, server_next, replayed, logged):
    import areal_cli.train_loop.tracking as tracking

    run = _FakeWandbRun(server_next)
    monkeypatch.setattr(tracking, "_start_wandb", lambda *a, **k: run)
    lines = []
    t = tracking.Tracker(["wandb"], tmp_path, {}, resume_step=3, history=[{"step": s, "accuracy": 0.1 * s} for s in range(4)],
                         log=lines.append)
    assert run.logged == replayed
    for s in range(4, 9):
        t.log({"step": s, "accuracy": 0.5})
    t.close()
    assert run.logged == replayed + logged
    assert lines == [f"W&B: https://wandb.example/run (project areal), resumed at step {server_next}"
                     + (f" ({len(replayed)} lines W&B lacked re-logged from metrics.jsonl)" if replayed else "")]


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_killed_and_resumed_run_continues_the_same_wandb_run_and_tensorboard_log_at_the_global_steps(tmp_path):
    """Checkpoint every 3 steps, SIGKILL once step 5 is written (steps 4-5 are redone), resume: the offline W&B run of
    the resumed process has the same id and every step 0..8 once, increasing, with metrics.jsonl's values (the
    checkpoint's steps re-logged, then the redone ones); TensorBoard's steps continue from the checkpoint likewise."""
    import signal
    import time

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    args = ["--no-live", "--max-steps", "8", "-o", "sft.max_steps=0", "-o", "rollout.batch_size=4",
            "-o", "rollout.group_size=2", "-o", "rollout.success_rate_lb=0", "-o", "rollout.success_rate_ub=1",
            "-o", "loop.eval_n_prompts=4", "-o", "loop.target_accuracy=0", "-o", "loop.checkpoint_every=3",
            "-o", "loop.loggers=tensorboard,wandb", "-o", "loop.wandb_project=areal-test"]
    first = subprocess.Popen([sys.executable, "-m", "areal_cli.commands.main", "train", "--out", str(out), *args], cwd=tmp_path,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def steps() -> list[int]:
        p = out / "metrics.jsonl"
        rows = p.read_text().splitlines() if p.exists() else []
        return [json.loads(x)["step"] for x in rows if x.endswith("}")]

    t0 = time.monotonic()
    try:
        while 5 not in steps():
            assert first.poll() is None and time.monotonic() - t0 < 300, "the first run ended or stalled before step 5"
            time.sleep(0.02)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the whole group: trainer, servers, reward workers, wandb's service
        first.wait()
    run_id = (out / "wandb_run_id").read_text().strip()
    r = _areal("train", "--resume", str(out), "--no-live", cwd=tmp_path, WANDB_MODE="offline", WANDB_SILENT="true")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == list(range(9)) and rows[4]["resumed_from"] == "checkpoints/step-000003"
    assert (out / "wandb_run_id").read_text().strip() == run_id  # the same W&B run

    dirs = sorted((out / "wandb").glob("offline-run-*"), key=lambda d: d.stat().st_mtime)
    assert len(dirs) == 2 and all(d.name.endswith(f"-{run_id}") for d in dirs)
    assert f"W&B: offline run {run_id} resumed in {dirs[-1]} with steps 0-3 re-logged" in r.stdout
    histories = []
    for d in dirs:
        records = list(_wandb_records(d / f"run-{run_id}.wandb"))
        assert all(x.run.run_id == run_id for x in records if x.WhichOneof("record_type") == "run")
        histories.append([{i.nested_key[0] if i.nested_key else i.key: json.loads(i.value_json) for i in x.history.item}
                          for x in records if x.WhichOneof("record_type") == "history"])
    killed, resumed = histories
    # whatever W&B flushed of the killed process (it writes its file every 15 s: often nothing) starts at 0, in order
    assert [h["_step"] for h in killed] == list(range(len(killed)))
    # the resumed process's run: every step once, increasing, no restart, each with metrics.jsonl's values
    assert [h["_step"] for h in resumed] == list(range(9))
    for h, row in zip(resumed, rows):
        for key in ("elapsed_s", "accuracy", "groups_accepted", "tokens_generated"):
            if row.get(key) is not None:
                assert h[key] == pytest.approx(row[key]), (row["step"], key)

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()  # TensorBoard drops the killed process's events after the checkpoint (purge_step)
    for key in ("elapsed_s", "accuracy", "groups_accepted"):
        logged = [(e.step, e.value) for e in acc.Scalars(key)]
        expected = [(x["step"], x[key]) for x in rows if x.get(key) is not None]
        assert [s for s, _ in logged] == [s for s, _ in expected], key
        assert all(v == pytest.approx(w, rel=1e-6) for (_, v), (_, w) in zip(logged, expected)), key

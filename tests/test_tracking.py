"""Experiment tracking (areal_cli.tracking): TensorBoard event files and an offline W&B run of a real
`areal train`, read back and compared with metrics.jsonl; bad logger names and missing packages are one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_cli.errors import UserError
from areal_cli.tracking import flatten, parse_loggers

ROOT = Path(__file__).resolve().parents[1]


def _areal(*args, cwd, timeout=600, **env):
    return subprocess.run([sys.executable, "-m", "areal_cli.cli", *args], cwd=cwd, capture_output=True, text=True,
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
    from areal_cli.tracking import _wandb_logged_in

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

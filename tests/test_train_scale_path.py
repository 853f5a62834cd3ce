"""`areal train` through the scale path on CPU: SGLang's launch command (tests/fake_sglang stands in for the
`sglang` package and runs our embedded server) and the collective weight sync (`rollout.weight_update_mode: xccl`,
gloo on CPU, the code path that uses NCCL on GPUs) give the same run as the default (embedded servers,
weights from disk), step by step."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers.warm_model import SYNC

FAKE_SGLANG = str(Path(__file__).resolve().parent / "fake_sglang")


def _run(cfg, out: Path, overrides: list[str]) -> list[dict]:
    from areal_cli.config import apply_overrides
    from areal_cli.train_loop import run_training

    run_training(apply_overrides(cfg, overrides), out, live=False)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.multiproc
@pytest.mark.slow
def test_sglang_launch_and_collective_weight_sync_train_exactly_like_the_default(warm_model, tmp_path, monkeypatch):
    from areal_cli.recipes import load_train_config

    monkeypatch.setenv("PYTHONPATH", FAKE_SGLANG + os.pathsep + os.environ.get("PYTHONPATH", ""))  # the servers
    monkeypatch.syspath_prepend(FAKE_SGLANG)  # this process: launch_servers checks that `sglang` is importable
    cfg, _ = load_train_config("tiny-arith")
    base = [*SYNC, f"model.path={warm_model}"]
    ref = _run(cfg, tmp_path / "disk", base)
    runs = {
        "xccl": _run(cfg, tmp_path / "xccl", [*base, "rollout.weight_update_mode=xccl", "rollout.weight_update_chunk_mb=0.5"]),
        "sglang+xccl": _run(cfg, tmp_path / "sglang", [*base, "rollout.engine=sglang", "rollout.n_servers=2",
                                                        "rollout.weight_update_mode=xccl"]),
        # torchrun ranks: the head rank's weight-update group must not join torchrun's agent store
        "xccl+dp2": _run(cfg, tmp_path / "xccl-dp2", [*base, "rollout.weight_update_mode=xccl", "parallel.data=2"]),
    }
    # the SGLang path really went through `python -m sglang.launch_server` (the stand-in logs its flags)
    log0 = (tmp_path / "sglang" / "logs" / "server0.log").read_text()
    assert "fake sglang: tp=1" in log0 and "mem_fraction_static=0.8" in log0
    assert (tmp_path / "sglang" / "logs" / "server1.log").exists()
    # collective sync leaves no per-step weight directories behind except the final one
    assert sorted(p.name for p in (tmp_path / "xccl" / "weights").glob("v*")) == ["v3"]
    assert [r["step"] for r in ref] == [0, 1, 2, 3]
    for name, rows in runs.items():
        assert [r["step"] for r in rows] == [0, 1, 2, 3], name
        for a, b in zip(ref[1:], rows[1:]):
            # greedy rollouts from the same weights: identical rewards, accuracy and trained tokens
            assert (a["reward_mean"], a["accuracy"], a["version"]) == (b["reward_mean"], b["accuracy"], b["version"]), (name, a["step"])
            # behaviour logprobs depend on the servers' batch composition at the 1e-7 level, hence not bit-equal
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5), (name, a["step"])
    # the servers hold the last version, loaded over the group
    summary = json.loads((tmp_path / "xccl" / "summary.json").read_text())
    assert summary["final_version"] == 3


def test_scale_path_keys_are_checked_with_their_names():
    from areal_cli.config import TrainConfig, apply_overrides
    from areal_cli.foundations.errors import UserError

    assert apply_overrides(TrainConfig(), ["rollout.weight_update_mode=xccl"]).rollout.weight_update_mode == "xccl"
    for bad in ("rollout.weight_update_mode=nccl2", "rollout.engine=vllm", "rollout.sglang_mem_fraction_static=1.5",
                "rollout.sglang_tp_size=0", "rollout.sglang_dtype=int8", "sglang_dtype=int8"):
        field = "rollout." + bad.split("=")[0].rpartition(".")[2]
        with pytest.raises(UserError, match=f"field '{field}'"):
            apply_overrides(TrainConfig(), [bad])


def test_sglang_engine_without_the_sglang_package_is_one_line_before_any_launch(tmp_path, monkeypatch):
    import importlib.util

    from areal_cli.config import TrainConfig, apply_overrides
    from areal_cli.foundations.errors import UserError
    from areal_cli.train_loop.processes import launch_servers

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    monkeypatch.setenv("AREAL_HOME", str(tmp_path / "no-engines"))  # no environment built by `areal engine setup`
    monkeypatch.delenv("AREAL_SGLANG_PYTHON", raising=False)
    cfg = apply_overrides(TrainConfig(), ["rollout.engine=sglang"])
    with pytest.raises(UserError, match="no SGLang found .* build one with `areal engine setup sglang`"):
        launch_servers(cfg, tmp_path / "model", 0, tmp_path / "out", log=lambda _: None)
    assert not (tmp_path / "out").exists()
    # a named interpreter that does not exist, and one that cannot import sglang: one line each
    bad = apply_overrides(TrainConfig(), ["rollout.engine=sglang", f"rollout.sglang_python={tmp_path / 'nope'}"])
    with pytest.raises(UserError, match="rollout.sglang_python: .*nope does not exist; build"):
        launch_servers(bad, tmp_path / "model", 0, tmp_path / "out", log=lambda _: None)
    from areal_cli.rollout.sglang_env import check_python

    import sys

    with pytest.raises(UserError, match="`import sglang` fails .*No module named sglang.*areal engine setup sglang"):
        check_python(sys.executable, full=False)
    assert not (tmp_path / "out").exists()

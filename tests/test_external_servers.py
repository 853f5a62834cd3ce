"""Servers someone else started (``rollout.engine: external``) at the start of a run: a server at the run's
version is adopted, any other is reset by loading the run's weights, with one line saying which; a server that
cannot load them is one line naming the server, its version and what to do. (Real SGLang left at version 200 made
the warm-start evaluation fail with "held-out evaluation mixed policy versions [200]", naming the wrong problem.)"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_cli.rollout.client import RolloutClient
from areal_cli.rollout.protocol import ServerError
from areal_cli.train_loop.weights import adopt_or_reset_external

from helpers.servers import spawn_server

pytestmark = pytest.mark.multiproc
ROOT = Path(__file__).resolve().parents[1]


def test_an_external_server_is_adopted_at_the_runs_version_and_reset_otherwise(dirs, tmp_path_factory):
    srv = spawn_server(dirs[1], tmp_path_factory, log_folder="ext", weight_version="200")
    lines: list[str] = []

    async def go():
        c = RolloutClient([srv.url], vocab_size=272)
        try:
            await adopt_or_reset_external(c, dirs[0], 0, lines.append)
            first = await c.model_info()
            await adopt_or_reset_external(c, dirs[0], 0, lines.append)
            with pytest.raises(ServerError) as e:
                await adopt_or_reset_external(c, dirs[0] / "missing", 3, lines.append)
            return first, str(e.value)
        finally:
            await c.aclose()

    try:
        first, err = asyncio.run(go())
    finally:
        srv.stop()
    assert first["weight_version"] == "0" and first["model_path"] == str(dirs[0].resolve())  # the run's weights
    assert lines[0] == (f"external server {srv.url}: served weight version '200'; reset: loaded the run's weights "
                        f"({dirs[0]}) as version 0")
    assert lines[1] == f"external server {srv.url}: serves weight version '0', the run's version 0: adopted"
    assert "\n" not in err and "serves weight version '0', not the run's version 3" in err
    assert "restart it on those weights with --weight-version 3" in err


@pytest.mark.slow
def test_areal_train_against_an_external_server_left_at_version_200(tmp_path, tmp_path_factory):
    from areal_cli.models.tiny import build_tiny_model
    from areal_cli.recipes import load_train_config
    from areal_cli.tasks.task import Task

    cfg, _ = load_train_config("tiny-arith")
    model = build_tiny_model(tmp_path / "model", seed=cfg.seed, corpus=Task(cfg).tokenizer_corpus(),
                             vocab_size=cfg.model.vocab_size, hidden_size=cfg.model.hidden_size,
                             num_layers=cfg.model.num_layers, chat_template=cfg.model.chat_template)
    srv = spawn_server(model, tmp_path_factory, log_folder="ext200", weight_version="200")
    try:
        out = tmp_path / "run"
        proc = subprocess.run([sys.executable, "-m", "areal_cli.commands.main", "train", "tiny-arith", "--out", str(out),
                               "--no-live", "-o", "rollout.engine=external", "-o", f"rollout.server_urls={srv.url}",
                               "-o", f"model.path={model}", "-o", "sft.max_steps=0", "-o", "loop.max_steps=1",
                               "-o", "loop.eval_n_prompts=8", "-o", "rollout.batch_size=8",
                               "-o", "rollout.success_rate_lb=0", "-o", "rollout.success_rate_ub=1"],
                              capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        srv.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "served weight version '200'; reset: loaded the run's weights" in proc.stdout
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]

"""The final summaries of `areal train`, `areal eval` and `areal reproduce` print every path whole in an 80-column
terminal: no ellipsis, no truncation, so the user can copy the run's folder from the screen. Paths go on lines of
their own after the tables (soft-wrapped: the terminal wraps them, rich never cuts or folds them)."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from areal_cli.config import TrainConfig
from areal_cli.train_loop.run_status import RunStatus

ROOT = Path(__file__).resolve().parents[1]


def _long_path(base: Path) -> Path:
    """A run folder path of well over 80 characters, with brackets (not rich markup) in it."""
    return base / "a-rather-long-folder-name-for-experiments" / "nested" / "deeper [seed 1]" / "tiny-arith-20250101-120000"


def _console(width: int = 80) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)


def _summary(out: Path) -> dict:
    ctl = {"groups_accepted": 64, "groups_rejected": 0, "groups_dropped_filter": 12, "groups_dropped_reward_failure": 0,
           "reward_ok": 300, "reward_error": 0, "reward_timeout": 0, "interruptions": 5}
    return {"warm_start": {"steps": 20, "seconds": 12.5, "accuracy": 0.31}, "time_to_target": None, "controller": ctl,
            "final_accuracy": 0.62, "final_version": 2, "elapsed_s": 40.2, "final_weights": str(out / "weights" / "v2"),
            "reward_failures": []}


def test_the_train_summary_prints_the_run_folder_and_final_weights_whole_at_80_columns(tmp_path):
    out = _long_path(tmp_path)
    assert len(str(out)) > 80
    console = _console(80)
    RunStatus(TrainConfig(), out, live=False, console=console).summary(_summary(out))
    text = console.file.getvalue()
    lines = text.splitlines()
    assert max(len(x) for x in lines if "│" in x or "┃" in x) <= 80  # the table itself fits the terminal
    # each path on one line of its own, whole, under the table
    assert f"outputs (metrics.jsonl, learning_curve.png, summary.json): {out}" in lines
    assert f"final weights: {out / 'weights' / 'v2'}" in lines
    assert "…" not in text


def test_the_eval_table_is_followed_by_its_output_folder_whole_at_80_columns(tmp_path):
    from areal_cli.eval.report import render_table

    out = _long_path(tmp_path)
    console = _console(80)
    render_table({"config": {}, "aime24": {"pass@1": 0.5, "n_problems": 30, "n_samples": 4},
                  "math_500": {"pass@1": 0.25, "n_problems": 500, "n_samples": 4}}, console, out_dir=out)
    lines = console.file.getvalue().splitlines()
    assert f"outputs (results.json, report.md, samples.jsonl): {out}" in lines


def test_the_reproduce_report_and_plan_print_their_paths_whole_at_80_columns(tmp_path, monkeypatch):
    from areal_cli.reproduce.run import _RunRecord, reproduce

    recipes = _long_path(tmp_path / "recipes")
    recipes.mkdir(parents=True)
    for name in ("tiny-arith.yaml", "tiny-arith.expected.yaml"):
        shutil.copy(ROOT / "recipes" / name, recipes / name)
    monkeypatch.setenv("AREAL_RECIPES_DIR", str(recipes))
    console = _console(80)
    plan = reproduce("tiny-arith", dry_run=True, console=console, gpus_here=0).plan
    # the plan panel folds a long path over its value column's lines, never cuts it: read without borders and blanks
    squeezed = re.sub(r"[\s│]", "", console.file.getvalue())
    assert re.sub(r"\s", "", str(recipes / "tiny-arith.yaml")) in squeezed
    assert "…" not in console.file.getvalue()

    out = _long_path(tmp_path / "reproduce")
    out.mkdir(parents=True)
    console = _console(80)
    _RunRecord(plan, out, "2025-01-01T00:00:00Z", time.monotonic(), ["areal", "reproduce"], console).finish([], {})
    lines = console.file.getvalue().splitlines()
    assert f"wrote: {out / 'manifest.json'}" in lines and f"wrote: {out / 'reproduce.json'}" in lines


@pytest.mark.multiproc
def test_areal_train_in_an_80_column_tmux_window_shows_the_whole_run_folder(tmp_path):
    """The real command in a real terminal (tmux, 80 columns, the live panel): the run folder is on screen whole
    (a soft-wrapped line: tmux joins it back with capture-pane -J)."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    out = _long_path(tmp_path)
    session = f"areal-test-{os.getpid()}"
    done = tmp_path / "done"
    cmd = (f"PYTHONPATH={ROOT} {sys.executable} -m areal_cli.commands.main train --out '{out}' --max-steps 1 "
           f"-o sft.max_steps=0 -o rollout.batch_size=2 -o rollout.group_size=2 -o loop.eval_n_prompts=4 "
           f"-o rollout.success_rate_lb=0 -o rollout.success_rate_ub=1 -o loop.target_accuracy=0; echo $? > {done}; "
           f"sleep 600")  # the window stays open until its screen is read
    subprocess.run(["tmux", "-L", session, "new-session", "-d", "-s", session, "-x", "80", "-y", "50", cmd],
                   check=True, env={**os.environ, "TERM": "xterm"})
    try:
        t0 = time.monotonic()
        while not done.exists() or not done.read_text().strip():
            assert time.monotonic() - t0 < 300, "areal train did not end in 300 s: " + _capture(session)
            time.sleep(0.5)
        screen = _capture(session)
        assert done.read_text().strip() == "0", screen
    finally:
        subprocess.run(["tmux", "-L", session, "kill-server"], capture_output=True)
    assert f"outputs (metrics.jsonl, learning_curve.png, summary.json): {out}" in screen.splitlines(), screen


def _capture(session: str) -> str:
    r = subprocess.run(["tmux", "-L", session, "capture-pane", "-p", "-J", "-S", "-200", "-t", session],
                       capture_output=True, text=True)
    return r.stdout

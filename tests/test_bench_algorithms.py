"""``areal bench algorithms``: bad input (one line, exit 2, nothing written), the interleaved dry-run plan, the
preset keys in force, and a tiny grid (2 presets x 1 seed x 2 steps) producing the table, results.json and PNG."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from areal_cli.bench.algorithms import Settings, run_plan
from areal_cli.bench.algorithms.analysis import FIGURES
from areal_cli.commands.main import main


@pytest.mark.parametrize("args, says", [
    (["--presets", "grpo,nope"], "--presets: unknown preset 'nope'"),
    (["--presets", "grpo,grpo"], "--presets: a preset is named twice"),
    (["--steps", "0"], "--steps: must be >= 1"),
    (["--seeds", "0"], "--seeds: must be >= 1"),
    (["--target", "1.5"], "--target: must be in (0, 1]"),
    (["-o", "ppo.algorithm=dapo"], "set by --presets"),
    (["-o", "rollout.max_head_offpolicyness=0"], "eta > 0"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, says):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["bench", "algorithms", "--out", str(out), *args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], res.output
    assert not out.exists()


def test_plan_is_seed_major_every_preset_once_per_seed():
    plan = run_plan(Settings(presets=["grpo", "dapo", "gspo"], seeds=3))
    assert plan == [(0, "grpo"), (0, "dapo"), (0, "gspo"), (1, "gspo"), (1, "dapo"), (1, "grpo"),
                    (2, "grpo"), (2, "dapo"), (2, "gspo")]


def test_dry_run_lists_the_interleaved_order_keys_in_force_and_an_estimate(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["bench", "algorithms", "--presets", "grpo,gspo", "--seeds", "2", "--steps", "4",
                                    "--out", str(out), "--dry-run"])
    assert res.exit_code == 0, res.output
    order = [ln.split()[1] for ln in res.output.splitlines() if ln.strip()[:1].isdigit()]
    assert order == ["000-grpo-r0", "001-gspo-r0", "002-gspo-r1", "003-grpo-r1"]
    # the preset's own keys win over the recipe's (tiny-arith sets ppo.eps_clip 0.2)
    assert "gspo: " in res.output and "ppo.eps_clip=0.0003" in res.output
    assert "ppo.importance_sampling_level=sequence" in res.output and "max_head_offpolicyness=4" in res.output
    assert "estimated wall time:" in res.output
    assert not out.exists()


@pytest.mark.multiproc
def test_tiny_grid_writes_table_results_and_png(tmp_path):
    out = tmp_path / "bench"
    res = subprocess.run([sys.executable, "-m", "areal_cli", "bench", "algorithms", "--presets", "grpo,dr_grpo",
                          "--seeds", "1", "--steps", "2", "--accuracy-every", "1", "--target", "0.35",
                          "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "areal bench algorithms" in res.stdout and "dr_grpo" in res.stdout
    d = json.loads((out / "results.json").read_text())
    assert d["schema"] == "areal.bench.algorithms/1"
    assert d["scenario"]["presets"] == ["grpo", "dr_grpo"] and d["scenario"]["steps"] == 2
    assert d["target_accuracy"] == 0.35 and d["machine"]["start"]["cpu_count"]
    assert d["preset_keys"]["dr_grpo"]["ppo.reward_norm_std_level"] == "none"
    assert [r["preset"] for r in d["runs"]] == ["grpo", "dr_grpo"]
    for r in d["runs"]:
        assert r["steps"] == 2 and r["final_accuracy"] is not None and len(r["accuracy_curve"]) == 3
        assert r["staleness_mean"] >= 0 and r["off_policy"]["iw_p50"] > 0
        assert r["off_policy"]["zero_std_group_frac"] is not None and "logprob_mismatch_mean" in r["off_policy"]
        assert (r["time_to_target_s"] is None) == (r["steps_to_target"] is None)
    for cell in d["presets"].values():
        assert set(FIGURES) <= set(cell) and cell["final_accuracy"]["n"] == 1
    assert (out / "algorithms.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| grpo |" in (out / "table.md").read_text()


def test_the_help_names_the_default_presets():
    """``--help`` is written without importing the bench (a fast CLI): it must name DEFAULT_PRESETS as they are."""
    from click.testing import CliRunner

    from areal_cli.bench.algorithms.plan import DEFAULT_PRESETS
    from areal_cli.commands.main import main

    out = CliRunner().invoke(main, ["bench", "algorithms", "--help"], terminal_width=200).output
    assert f"(default: {','.join(DEFAULT_PRESETS)})" in " ".join(out.split())
    assert ", ".join(DEFAULT_PRESETS) in " ".join(out.split())

"""Claims about `areal bench staleness`: the scenario files load and bad ones fail in one line naming file:line and
field, the plan runs eta 0 once per seed (every variant is the same algorithm there), the grid's figures (final
accuracy over seeds, time to the target on the seed-averaged curve, realised staleness) follow from the runs as
defined, and the command runs a tiny grid end to end into table.md, results.json and staleness.png."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from areal_cli.bench import staleness as st
from areal_cli.commands.bench_staleness import staleness
from areal_cli.config import TrainConfig, apply_overrides
from areal_cli.foundations.errors import UserError

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ scenario


def test_builtin_scenario_is_the_shipped_file_and_every_variant_is_a_valid_recipe_override():
    from_file = st.load_scenario(REPO / "benchmarks" / "scenarios" / "staleness-tiny-longtail.yaml")
    builtin = st.default_scenario()
    from_file.source = builtin.source
    assert from_file == builtin
    assert st.load_scenario("staleness-tiny-longtail") == st.load_scenario(
        REPO / "benchmarks" / "scenarios" / "staleness-tiny-longtail.yaml")  # by name
    full = st.load_scenario(REPO / "benchmarks" / "scenarios" / "staleness-tiny-longtail-full.yaml")
    assert set(full.variants) == set(st.VARIANTS) and full.etas == [0, 1, 2, 4, 8, 16]
    for ov in [st.SYNC_OVERRIDES, *st.VARIANTS.values()]:
        apply_overrides(TrainConfig(), [f"{k}={v}" for k, v in ov.items()])
    assert st.VARIANTS["naive"] == {"ppo.recompute_proximal": False}
    assert st.VARIANTS["decoupled"]["ppo.behav_imp_weight_mode"] == "token_mask"


@pytest.mark.parametrize("text, line, field", [
    ("name: x\nsteps: 3\nstepz: 4\n", 3, "stepz"),
    ("etas: [0, 2, 2]\n", 1, "etas"),
    ("name: x\netas: [-1]\n", 2, "etas"),
    ("variants: [decoupled, nonsense]\n", 1, "variants"),
    ("variants: {sync: {}}\n", 1, "variants"),
    ("seeds: 0\n", 1, "seeds"),
    ("target_accuracy: 1.5\n", 1, "target_accuracy"),
    ("name: x\n\ncpus: {gpu: '0'}\n", 3, "cpus"),
])
def test_bad_scenarios_fail_with_file_line_and_field(tmp_path, text, line, field):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    with pytest.raises(UserError, match=rf"s\.yaml:{line}: field '{field}'"):
        st.load_scenario(p)
    res = CliRunner().invoke(staleness, ["--scenario", str(p), "--dry-run"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and f"field '{field}'" in res.output


def test_custom_variants_and_the_plan():
    sc = st.scenario_from_dict({"etas": [4, 0, 1], "variants": {"mine": {"ppo.lr": 1e-4}, "naive": None}, "seeds": 2},
                               lambda k: "x")
    assert sc.variants == {"mine": {"ppo.lr": 1e-4}, "naive": {"ppo.recompute_proximal": False}}
    plan = st.run_plan(sc)
    assert plan == [(0, 0, "sync"), (0, 1, "mine"), (0, 1, "naive"), (0, 4, "mine"), (0, 4, "naive"),
                    (1, 0, "sync"), (1, 1, "naive"), (1, 1, "mine"), (1, 4, "naive"), (1, 4, "mine")]
    assert sc.n_runs == len(plan) == 10
    assert st.default_scenario().n_runs == 2 * (1 + 5 * 3)


@pytest.mark.multiproc
def test_command_module_imports_only_click_and_stdlib_and_is_registered(tmp_path):
    import subprocess
    import sys

    code = ("import sys; import areal_cli.commands.bench_staleness as m; "
            "print(sorted(x for x in ('torch', 'numpy', 'yaml', 'rich', 'matplotlib', 'transformers', 'httpx') "
            "if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
    from areal_cli.commands.main import main

    res = CliRunner().invoke(main, ["bench", "staleness", "--dry-run", "--etas", "0,4", "--variants", "naive",
                                    "--seeds", "2"])
    assert res.exit_code == 0, res.output
    assert res.output.count("eta  0  sync") == 2 and res.output.count("eta  4  naive") == 2
    assert "repeat 1 (seed 2)" in res.output and "one warm start + 4 runs" in res.output
    assert "estimated wall time: " in res.output and "this machine: " in res.output
    bad = CliRunner().invoke(main, ["bench", "staleness", "--dry-run", "--variants", "nope"])
    assert bad.exit_code == 2 and "unknown variant 'nope'" in bad.output
    sc = tmp_path / "sc.yaml"
    sc.write_text("name: x\nrecipe: tiny-arith\noverrides:\n  bogus: 1\n")
    bad = CliRunner().invoke(main, ["bench", "staleness", "--dry-run", "--scenario", str(sc)])
    assert bad.exit_code == 2 and f"{sc}:4: field 'overrides.bogus': unknown key" in bad.output, bad.output
    for items, field in ((["-o", "ppo.prox_logp_method=nope"], "ppo.prox_logp_method"), (["-o", "bogus=1"], "bogus")):
        bad = CliRunner().invoke(main, ["bench", "staleness", "--dry-run", *items])  # checked before the plan
        assert bad.exit_code == 2 and f"field '{field}'" in bad.output and "repeat" not in bad.output, bad.output
    (tmp_path / "old" / "warm").mkdir(parents=True)  # an --out the real run would refuse
    bad = CliRunner().invoke(main, ["bench", "staleness", "--dry-run", "--out", str(tmp_path / "old")])
    assert bad.exit_code == 2 and "already holds a benchmark" in bad.output


# ------------------------------------------------------------------------------------------------ figures


def _run(variant: str, eta: int, rep: int, curve: list[tuple[int, float, float]], stale: float = 0.0) -> dict:
    return {"label": f"{variant}-{eta}-{rep}", "variant": variant, "eta": eta, "repeat": rep, "seed": 1 + rep,
            "final_accuracy": curve[-1][2], "max_accuracy": max(c[2] for c in curve),
            "accuracy_curve": [list(c) for c in curve], "rl_seconds": curve[-1][1], "effective_tokens_per_s": 100.0,
            "staleness_mean": stale, "off_policy": {"iw_capped_frac": 0.01 * eta, "clip_frac": None}}


def test_grid_target_time_to_target_and_sync_shared_by_every_variant():
    runs = [_run("sync", 0, 0, [(0, 0.0, 0.4), (10, 20.0, 0.5), (20, 40.0, 0.6)]),
            _run("sync", 0, 1, [(0, 0.0, 0.4), (10, 22.0, 0.6), (20, 42.0, 0.7)]),  # sync final mean 0.65: target
            _run("decoupled", 4, 0, [(0, 0.0, 0.4), (10, 10.0, 0.6), (20, 20.0, 0.7)], stale=3.5),
            _run("decoupled", 4, 1, [(0, 0.0, 0.4), (10, 10.0, 0.6), (20, 20.0, 0.8)], stale=3.7),
            _run("naive", 4, 0, [(0, 0.0, 0.4), (10, 10.0, 0.3), (20, 20.0, 0.2)], stale=3.6),
            _run("naive", 4, 1, [(0, 0.0, 0.4), (10, 10.0, 0.3), (20, 20.0, 0.4)], stale=3.6)]
    g = st.aggregate(runs)
    assert g["target_accuracy"] == pytest.approx(0.65) and "synchronous" in g["target_source"]
    assert set(g["cells"]) == {"decoupled", "naive"} and set(g["cells"]["naive"]) == {0, 4}
    assert g["cells"]["naive"][0] is g["cells"]["decoupled"][0]  # eta 0: one baseline for every variant
    d4 = g["cells"]["decoupled"][4]
    assert d4["final_accuracy"]["mean"] == pytest.approx(0.75) and d4["final_accuracy"]["n"] == 2
    # seed-averaged curve 0.4 -> 0.6 -> 0.75: crosses 0.65 at 10 + 10 * (0.05 / 0.15) s
    assert d4["time_to_target_s"] == pytest.approx(10 + 10 / 3)
    assert d4["runs_reached_target"] == 2 and d4["staleness_mean"] == pytest.approx(3.6)
    sync = g["cells"]["decoupled"][0]  # mean curve 0.4 -> 0.55 (21 s) -> 0.65 (41 s)
    assert sync["time_to_target_s"] == pytest.approx(41.0) and sync["runs_reached_target"] == 1
    assert g["cells"]["naive"][4]["time_to_target_s"] is None and g["cells"]["naive"][4]["runs_reached_target"] == 0
    assert d4["off_policy"] == {"iw_capped_frac": pytest.approx(0.04), "clip_frac": None}
    assert st.aggregate(runs, target=0.3)["cells"]["naive"][4]["time_to_target_s"] == 0.0  # reached at the start


def test_run_figures_from_metrics_and_timeline():
    steps = [{"step": i, "start": i - 1.0, "end": float(i), "tokens": 100, "evaluated": i % 2 == 0,
              "eval_s": 0.5 if i % 2 == 0 else 0.0, "accuracy": 0.1 * i, "wait_s": 0.1, "train_s": 0.5,
              "publish_s": 0.1} for i in range(1, 5)]
    t = 0.0
    for s in steps:  # 1 s per step; an evaluation of 0.5 s after steps 2 and 4
        t += 1.0
        s["end"] = t
        if s["evaluated"]:
            t += s["eval_s"]
    tl = {"marks": {"rl_start": 0.0}, "steps": steps, "events": []}
    metrics = [{"phase": "warm_start_end", "accuracy": 0.05}] + [
        {"phase": "rl", "staleness_hist": {"0": 2, "2": 2}, "iw_capped_frac": 0.1, "clip_frac": 0.2,
         "iw_truncated_frac": 0.0, "iw_p99": 1.5, "iw_min": 0.5, "truncated_frac": 0.0} for _ in steps]
    r = st.summarize_run(tl, metrics, {"final_accuracy": 0.4, "controller": {}}, label="x", variant="naive", eta=2,
                         repeat=0, seed=1)
    # steps 3 (after the eval of step 2) gets the mean of the other non-first steps (1.0): 4 s in all
    assert r["accuracy_curve"] == [[0, 0.0, 0.05], [2, pytest.approx(2.0), pytest.approx(0.2)],
                                   [4, pytest.approx(4.0), pytest.approx(0.4)]]
    assert r["staleness_mean"] == pytest.approx(1.0) and r["staleness_max"] == 2
    assert r["staleness_hist"] == {0: 8, 2: 8} and r["off_policy"]["iw_capped_frac"] == pytest.approx(0.1)
    assert r["final_accuracy"] == 0.4 and r["max_accuracy"] == pytest.approx(0.4)


def test_results_table_markdown_and_plot(tmp_path):
    runs = [_run("sync", 0, 0, [(0, 0.0, 0.4), (10, 20.0, 0.6)]),
            _run("decoupled", 2, 0, [(0, 0.0, 0.4), (10, 10.0, 0.62)], stale=1.8),
            _run("naive", 2, 0, [(0, 0.0, 0.4), (10, 10.0, 0.5)], stale=1.8)]
    res = st.build_results(st.default_scenario(), runs, warm={"accuracy": 0.4, "steps": 3, "seconds": 1.0},
                           machine={}, extra_overrides=[], recipe_config={}, seconds=1.0)
    res = json.loads(json.dumps(res))  # what results.json holds (eta keys become strings)
    assert res["schema"] == st.SCHEMA and res["grid"]["target_accuracy"] == pytest.approx(0.6)
    md = st.table_markdown(res)
    assert "| decoupled | 2 | 0.620 |" in md and "| naive (= sync) | 0 | 0.600 |" in md
    st.plot_staleness(res, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "s.png").stat().st_size > 10_000
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(st.results_table(res))
    assert "decoupled" in console.export_text()


# ------------------------------------------------------------------------------------------------ end to end


@pytest.mark.multiproc
@pytest.mark.slow
def test_command_runs_a_tiny_grid_into_table_json_and_plot(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(
        "name: tiny\nrecipe: tiny-longtail\netas: [0, 2]\nvariants: [decoupled, naive]\nsteps: 2\nseeds: 1\n"
        "accuracy_every: 1\n"
        f"cpus: {{trainer: '{cpus[0]}', server: '{cpus[-1]}', controller: '{cpus[-1]}'}}\n"
        "overrides: {batch_size: 4, group_size: 2, sft_max_steps: 2, sft_n_examples: 64, sft_batch_size: 16,\n"
        "            sft_eval_every: 2, eval_n_prompts: 8, max_new_tokens: 48, rollout_process: true}\n")
    out = tmp_path / "bench"
    res = CliRunner().invoke(staleness, ["--scenario", str(scenario), "--out", str(out)])
    assert res.exit_code == 0, res.output
    results = json.loads((out / "results.json").read_text())
    assert [(r["variant"], r["eta"]) for r in results["runs"]] == [("sync", 0), ("decoupled", 2), ("naive", 2)]
    assert all(r["steps"] == 2 and r["accuracy_curve"] for r in results["runs"])
    assert [json.loads((Path(r["dir"]) / "config.json").read_text())["ppo"]["recompute_proximal"]
            for r in results["runs"]] == [False, True, False]
    assert set(results["grid"]["cells"]) == {"decoupled", "naive"}
    assert (out / "staleness.png").stat().st_size > 10_000
    assert (out / "table.md").read_text().startswith("# areal bench staleness: tiny")
    assert "final accuracy" in res.output
    again = CliRunner().invoke(staleness, ["--scenario", str(scenario), "--out", str(out)])
    assert again.exit_code == 2 and "already holds a benchmark" in again.output


def test_dry_run_estimate_uses_the_variant_at_its_eta_or_the_nearest_measured_eta(tmp_path):
    from areal_cli.bench.estimate import plan_lines

    runs = [{"variant": "sync", "eta": 0, "steps": 10, "rl_seconds": 10.0},
            {"variant": "naive", "eta": 1, "steps": 10, "rl_seconds": 5.0},
            {"variant": "naive", "eta": 8, "steps": 10, "rl_seconds": 3.0}]
    d = {"created": "2026-01-01", "scenario": {"name": "s", "recipe": "tiny-longtail"}, "grid": {}, "runs": runs,
         "warm_start": {"seconds": 20.0}, "bench_seconds": 20.0 + 18.0 + 3 * 4.0, "machine": {"start": {}}}
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text(json.dumps(d))
    per_run, lines = plan_lines("staleness", "s", "tiny-longtail",
                                [(("sync", 0), 20), (("naive", 1), 20), (("naive", 16), 20)], tmp_path, busy=0.0)
    assert per_run == pytest.approx([24.0, 14.0, 10.0])  # eta 16 not measured: naive at eta 8, the nearest
    assert "naive eta 16" in lines[2] and "sync 1.000" in lines[1]

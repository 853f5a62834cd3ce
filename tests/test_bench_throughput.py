"""Claims about `areal bench throughput`: idle fractions and effective throughput follow from a run's timeline
as defined (AReaL: tokens consumed by training / time), ratios pair runs that ran next to each other,
results.json carries every figure, the plots are written, the client records generation activity and
non-interruptible weight updates never abort a sample, and the command runs end to end."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from areal_cli.bench import throughput as tp
from areal_cli.commands.bench_throughput import throughput
from areal_cli.bench.throughput.plots import plot_throughput_bars, plot_timelines
from areal_cli.config import TrainConfig, apply_overrides, parse_cpu_list
from areal_cli.foundations.errors import UserError
from areal_cli.rollout.client import RolloutClient
from areal_cli.rollout.protocol import SamplingParams

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "sglang"


def _timeline(steps=((100, 1.0), (300, 3.0)), rl_start=0.0) -> dict:
    """A synthetic timeline.json: trainer waits, trains, publishes; one server generates and updates."""
    events = [
        {"lane": "trainer", "kind": "wait", "start": 0.0, "end": 0.6},
        {"lane": "trainer", "kind": "train", "start": 0.6, "end": 0.9},
        {"lane": "trainer", "kind": "publish", "start": 0.9, "end": 1.0},
        {"lane": "trainer", "kind": "wait", "start": 1.0, "end": 2.0},
        {"lane": "trainer", "kind": "train", "start": 2.0, "end": 2.8},
        {"lane": "trainer", "kind": "publish", "start": 2.8, "end": 3.0},
        {"lane": "server0", "kind": "generate", "start": 0.0, "end": 0.5},
        {"lane": "server0", "kind": "generate", "start": 0.4, "end": 0.6},  # overlaps: counted once
        {"lane": "server0", "kind": "update", "start": 0.9, "end": 1.0},
        {"lane": "server0", "kind": "generate", "start": 1.0, "end": 2.0},
        {"lane": "server0", "kind": "update", "start": 2.8, "end": 3.0},
    ]
    recs = []
    prev = rl_start
    for i, (tokens, end) in enumerate(steps, 1):
        recs.append({"step": i, "start": prev, "end": end, "tokens": tokens, "response_tokens": tokens // 4,
                     "n_samples": 8, "staleness": {"0": 6, "1": 2} if i > 1 else {"0": 8},
                     "wait_s": 0.5, "train_s": 0.4, "train_cpu_s": 0.3, "publish_s": 0.1, "eval_s": 0.0,
                     "accuracy": 0.5, "cpu": None, "generated_tokens": 250 * i})
        prev = end
    return {"clock": "time.monotonic", "marks": {"rl_start": rl_start, "rl_end": steps[-1][1]}, "events": events,
            "steps": recs, "cpu": {"rl_start": {"t": 0.0, "trainer_process": 1.0, "server0": 2.0},
                                   "rl_end": {"t": 3.0, "trainer_process": 2.5, "server0": 3.5}}}


def _summary(acc: float) -> dict:
    return {"final_accuracy": acc, "warm_start": {"seconds": 5.0},
            "controller": {"interruptions": 3, "groups_dropped_filter": 0}}


def _runs(sync_tps=(100.0, 110.0), async_tps=(190.0, 200.0), acc=(0.8, 0.82)) -> list[dict]:
    runs = []
    for rep in range(2):
        for mode, tps in (("sync", sync_tps[rep]), ("async", async_tps[rep])):
            tl = _timeline(steps=((int(tps), 1.0),))
            runs.append(tp.summarize_run(tl, _summary(acc[rep]), label=f"{rep}-{mode}", mode=mode, repeat=rep,
                                         eta=0 if mode == "sync" else 2, interruptible=True, eval_n_prompts=128))
    return runs


# ------------------------------------------------------------------------------------------------ accounting


def test_merged_intervals_count_overlaps_once_and_clip_to_the_window():
    assert tp.merge_intervals([(2, 3), (0, 1), (0.5, 1.5), (4, 4)]) == [(0, 1.5), (2, 3)]
    assert tp.covered_seconds([(0, 1), (0.5, 1.5), (2, 3)], (1.0, 2.5)) == pytest.approx(1.0)


def test_idle_fractions_follow_from_the_timeline():
    act = tp.activity(_timeline())
    # trainer busy = train + publish = 0.4 + 1.0 of 3 s; it waits the rest
    assert act["trainer"]["idle"] == pytest.approx(1 - 1.4 / 3)
    assert act["trainer"]["wait"] == pytest.approx(1.6 / 3)
    # server busy = generate [0,0.6) + [1,2) and updates [0.9,1) + [2.8,3) = 1.9 of 3 s
    assert act["server0"]["generate"] == pytest.approx(1.6 / 3)
    assert act["server0"]["idle"] == pytest.approx(1 - 1.9 / 3)
    # a window restricts everything to it
    assert tp.activity(_timeline(), (0.0, 1.0))["server0"]["idle"] == pytest.approx(0.3)
    with pytest.raises(ValueError):
        tp.activity(_timeline(), (1.0, 1.0))


def test_effective_throughput_is_consumed_tokens_over_step_time():
    steps = _timeline()["steps"]  # 100 tokens in [0, 1], 300 tokens in [1, 3]
    eff = tp.effective_throughput(steps, rl_start=0.0)
    assert eff["tokens"] == 400 and eff["seconds"] == pytest.approx(3.0)
    assert eff["tokens_per_s"] == pytest.approx(400 / 3)
    assert eff["step_mean_tokens_per_s"] == pytest.approx((100 / 1 + 300 / 2) / 2)
    with pytest.raises(ValueError):
        tp.effective_throughput([], 0.0)
    with pytest.raises(ValueError):
        tp.effective_throughput(steps, rl_start=2.0)  # the first step would end before it started


def test_held_out_evaluations_are_left_out_of_step_times_and_give_the_accuracy_curve():
    tl = _timeline(steps=((100, 1.0), (300, 3.5), (100, 4.5)))
    tl["steps"][0].update(evaluated=True, eval_s=0.5, accuracy=0.4)  # eval in [1.0, 1.5]: not training time
    tl["steps"][2].update(evaluated=True, eval_s=0.2, accuracy=0.6)
    eff = tp.effective_throughput(tl["steps"], rl_start=0.0)
    assert eff["seconds"] == pytest.approx(4.0) and eff["tokens_per_s"] == pytest.approx(500 / 4.0)
    r = tp.summarize_run(tl, _summary(0.6), label="x", mode="sync", repeat=0, eta=0, interruptible=True,
                         eval_n_prompts=128)
    assert r["accuracy_curve"] == [[1, pytest.approx(1.0), 0.4], [3, pytest.approx(4.0), 0.6]]


def _curve_run(mode: str, rep: int, curve: list[tuple[int, float, float]]) -> dict:
    return {"mode": mode, "repeat": rep, "final_accuracy": curve[-1][2], "accuracy_curve": [list(c) for c in curve]}


def test_time_to_equal_accuracy_uses_the_accuracy_both_modes_reach_and_pairs_repeats():
    runs = [_curve_run("sync", 0, [(10, 20.0, 0.5), (20, 40.0, 0.62), (30, 60.0, 0.7)]),
            _curve_run("async", 0, [(10, 10.0, 0.45), (20, 20.0, 0.55), (30, 30.0, 0.6)]),
            _curve_run("async", 1, [(10, 12.0, 0.5), (20, 24.0, 0.64), (30, 36.0, 0.64)]),
            _curve_run("sync", 1, [(10, 22.0, 0.55), (20, 44.0, 0.62), (30, 66.0, 0.66)])]
    t = tp.time_to_accuracy(runs)
    assert t["target_accuracy"] == pytest.approx(0.62)  # async's mean final accuracy, the lower one
    assert t["seconds"]["sync"] == {0: 40.0, 1: 44.0}
    assert t["seconds"]["async"] == {0: None, 1: 24.0}  # repeat 0's async run never got to 0.62
    assert t["runs_reached"] == {"async": 1, "sync": 2}
    assert t["ratio"]["pairs"] == [pytest.approx(44.0 / 24.0)]
    assert tp.time_to_accuracy([dict(r, accuracy_curve=r["accuracy_curve"][-1:]) for r in runs]) is None


def test_accuracy_curves_plot(tmp_path):
    from areal_cli.bench.throughput.plots import plot_accuracy_curves

    runs = [_curve_run("sync", 0, [(10, 20.0, 0.5), (20, 40.0, 0.62)]), _curve_run("async", 0, [(10, 10.0, 0.55), (20, 20.0, 0.63)])]
    plot_accuracy_curves({"runs": runs, "time_to_accuracy": tp.time_to_accuracy(runs)}, tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "a.png").stat().st_size > 10_000


def test_run_figures_generation_staleness_and_cpu():
    r = tp.summarize_run(_timeline(), _summary(0.7), label="x", mode="async", repeat=0, eta=2,
                         interruptible=True, eval_n_prompts=64)
    assert r["generated_tokens"] == 500 and r["generation_tokens_per_s"] == pytest.approx(500 / 3)
    assert r["staleness"] == {0: 14, 1: 2}
    assert r["cpu_use"] == {"trainer_process": pytest.approx(0.5), "server0": pytest.approx(0.5)}
    assert r["trainer_cpu_over_wall"] == pytest.approx(0.75)
    assert r["response_tokens_consumed"] == 25 + 75


def test_async_over_sync_ratio_pairs_runs_of_the_same_repeat():
    runs = _runs()
    r = tp.paired_ratio(runs, "async", "sync")
    assert r["pairs"] == [pytest.approx(1.9), pytest.approx(200 / 110)]
    assert r["mean"] == pytest.approx((1.9 + 200 / 110) / 2)
    assert r["of_means"] == pytest.approx(195 / 105)
    assert tp.paired_ratio(runs, "async", "async_noninterruptible") is None


def test_accuracies_two_points_apart_are_equal_within_noise_of_128_prompts():
    acc = tp.accuracy_comparison(_runs(acc=(0.80, 0.82)))
    assert acc["difference"] == pytest.approx(0.0)
    assert acc["equal_within_noise"]
    runs = _runs()
    for r in runs:
        r["final_accuracy"] = 0.9 if r["mode"] == "async" else 0.5
    far = tp.accuracy_comparison(runs)
    assert far["difference"] == pytest.approx(0.4) and not far["equal_within_noise"]


def test_runs_are_interleaved_abba():
    sc = tp.default_scenario()
    sc.repeats = 2
    assert tp.run_plan(sc) == [(0, "sync"), (0, "async"), (0, "async_noninterruptible"),
                               (1, "async_noninterruptible"), (1, "async"), (1, "sync")]
    sc.compare_interruptible = False
    assert [m for _, m in tp.run_plan(sc)] == ["sync", "async", "async", "sync"]


def test_dry_run_checks_the_settings_and_prints_the_plan_without_running(tmp_path):
    res = CliRunner().invoke(throughput, ["--dry-run", "--repeats", "2", "--no-generate-compare",
                                          "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    lines = [ln.split() for ln in res.output.splitlines() if ln.startswith("  ") and ln.split()[0][:2].isdigit()]
    assert [ln[0] for ln in lines] == ["00-sync-r0", "01-async-r0", "02-async_noninterruptible-r0",
                                       "03-async_noninterruptible-r1", "04-async-r1", "05-sync-r1"]
    assert [ln[2] for ln in lines] == ["1", "1", "1", "2", "2", "2"]  # a seed per repeat
    assert "non-interruptible updates" in res.output and "static generate" not in res.output
    assert not (tmp_path / "out").exists()
    assert "  every run: rollout.success_rate_lb=0.0 " in res.output  # the scenario's overrides
    assert "estimated wall time: " in res.output and "this machine: " in res.output  # basis: benchmarks/results/
    assert f"writes {tmp_path / 'out'}: results.json" in res.output.replace("\n", "")
    # a recipe this machine cannot run is refused as the warm start would refuse it, not planned
    import importlib.util

    if importlib.util.find_spec("sglang") is None:  # (a GPU machine with SGLang could plan it)
        no_env = {"AREAL_HOME": str(tmp_path / "no-engines"), "AREAL_SGLANG_PYTHON": ""}
        bad = CliRunner(env=no_env).invoke(throughput, ["boba2-14b-code", "--dry-run"])
        assert bad.exit_code == 2 and "rollout.engine: sglang: no SGLang found" in bad.output
        assert "areal engine setup sglang" in bad.output
    bad = CliRunner().invoke(throughput, ["--dry-run", "-o", "ppo.lrr=1"])
    assert bad.exit_code == 2 and "field 'ppo.lrr': unknown key" in bad.output
    # what the real run would refuse, the dry run refuses: an --out holding a benchmark, a cpu not ours
    (tmp_path / "old" / "warm").mkdir(parents=True)
    bad = CliRunner().invoke(throughput, ["--dry-run", "--out", str(tmp_path / "old")])
    assert bad.exit_code == 2 and "already holds a benchmark" in bad.output
    scen = tmp_path / "cpus.yaml"
    scen.write_text((REPO / "benchmarks" / "scenarios" / "throughput-tiny-arith.yaml").read_text()
                    .replace('trainer: "0"', 'trainer: "99"'))
    assert 'trainer: "99"' in scen.read_text()
    bad = CliRunner().invoke(throughput, ["--dry-run", "--scenario", str(scen), "--out", str(tmp_path / "new")])
    assert bad.exit_code == 2 and "parallel.trainer_cpus" in bad.output and "not available" in bad.output
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------------------------------------ scenario


def test_builtin_scenario_is_the_benchmarks_scenario_file():
    from_file = tp.load_scenario(REPO / "benchmarks" / "scenarios" / "throughput-tiny-arith.yaml")
    builtin = tp.default_scenario()
    from_file.source = builtin.source
    assert from_file == builtin
    # every override is a recipe field, accepted by the recipe's validation
    apply_overrides(TrainConfig(), [f"{k}={v}" for k, v in builtin.overrides.items()])


def test_bad_scenario_is_reported_with_file_and_line(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("name: x\nsteps: 3\nstepz: 4\n")
    with pytest.raises(UserError, match=r"s\.yaml:3: field 'stepz': unknown key"):
        tp.load_scenario(p)
    p.write_text("steps: 0\n")
    with pytest.raises(UserError, match=r"s\.yaml:1: field 'steps'"):
        tp.load_scenario(p)
    p.write_text("generate_compare: {n_prompts: 4, min_new_tokens: 9, max_new_tokens: 8}\n")
    with pytest.raises(UserError, match="min_new_tokens > max_new_tokens"):
        tp.load_scenario(p)


def test_unknown_scenario_key_names_file_line_and_closest_key(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("name: x\nrepeat: 2\n")
    with pytest.raises(UserError) as e:
        tp.load_scenario(p)
    assert str(e.value) == f"{p}:2: field 'repeat': unknown key (did you mean 'repeats'?)"
    p.write_text("name: x\ngenerate_compare:\n  n_prompt: 4\n")
    with pytest.raises(UserError, match=r"s\.yaml:2: field 'generate_compare.n_prompt': unknown key "
                                        r"\(did you mean 'generate_compare.n_prompts'\?\)"):
        tp.load_scenario(p)
    p.write_text("cpus: {trainr: '0'}\n")
    with pytest.raises(UserError, match=r"field 'cpus.trainr': unknown key \(did you mean 'cpus.trainer'\?\)"):
        tp.load_scenario(p)
    p.write_text("name: x\nzzz: 1\n")  # nothing close: the known keys instead
    with pytest.raises(UserError, match=r"s\.yaml:2: field 'zzz': unknown key \(no known key is close; known: "
                                        r"accuracy_every, compare_in_place, "):
        tp.load_scenario(p)


def test_scenario_of_another_benchmark_names_its_command(tmp_path):
    # a cluster-model scenario (kind: simulate) given to the throughput and staleness benches
    from areal_cli.bench.staleness import load_scenario as load_staleness

    from areal_cli.bench.throughput.scenario import resolve_scenario_path

    sim_file = resolve_scenario_path("cpu-tiny-arith")
    kind_line = next(i for i, ln in enumerate(sim_file.read_text().splitlines(), 1) if ln.startswith("kind:"))
    for load, cmd in ((tp.load_scenario, "areal bench throughput"), (load_staleness, "areal bench staleness")):
        with pytest.raises(UserError) as e:
            load(sim_file)
        assert str(e.value) == (f"{sim_file}:{kind_line}: field 'kind': 'simulate' is a scenario of `areal bench "
                                f"simulate {sim_file}`, not of `{cmd}`")
    p = tmp_path / "s.yaml"
    p.write_text("kind: throughput\nsteps: 3\n")  # its own kind is accepted
    assert tp.load_scenario(p).steps == 3
    p.write_text("steps: 3\nkind: [x]\n")
    with pytest.raises(UserError, match=r"s\.yaml:2: field 'kind': expected throughput \(or no kind\), got \['x'\]"):
        tp.load_scenario(p)


def test_bench_cli_refuses_a_simulate_scenario_in_one_line(tmp_path):
    res = CliRunner().invoke(throughput, ["--scenario", "cpu-tiny-arith", "--dry-run"])
    assert res.exit_code == 2, res.output
    assert res.output.strip().count("\n") == 0 and "field 'kind': 'simulate' is a scenario of `areal bench simulate" \
        in res.output and "Traceback" not in res.output


def test_cpu_lists_are_parsed_and_bad_ones_rejected():
    assert parse_cpu_list("") == frozenset() and parse_cpu_list("0-2,5") == {0, 1, 2, 5}
    cfg = apply_overrides(TrainConfig(), ["parallel.trainer_cpus=0", "parallel.server_cpus=1", "rollout.interruptible=false"])
    assert (cfg.parallel.trainer_cpus, cfg.parallel.server_cpus, cfg.rollout.interruptible) == ("0", "1", False)
    for bad in ("x", "3-1", "0,"):
        with pytest.raises(UserError, match="field 'parallel.server_cpus'"):
            apply_overrides(TrainConfig(), [f"parallel.server_cpus={bad}"])


# ------------------------------------------------------------------------------------------------ outputs


def test_results_json_schema_plots_and_table(tmp_path):
    runs = _runs()
    gen = {"workload": {"n_prompts": 4, "budgets": [16, 64]}, "embedded_server": {"seconds": 1.0, "tokens_per_s": 300.0},
           "hf_static_batch": {"seconds": 2.0, "tokens_per_s": 150.0}, "hf_per_prompt": None,
           "continuous_over_static": 2.0, "greedy_identical": None}
    res = tp.build_results(tp.default_scenario(), runs, warm={"steps": 3, "accuracy": 0.3, "seconds": 5.0},
                           generate=gen, machine={"start": tp.machine_description()}, extra_overrides=[],
                           recipe_config=TrainConfig().to_dict(), seconds=1.0)
    res = json.loads(json.dumps(res))  # what results.json holds
    assert res["schema"] == tp.SCHEMA
    for key in ("machine", "scenario", "warm_start", "runs", "modes", "ratios", "accuracy", "generate", "targets"):
        assert key in res
    assert res["ratios"]["async_over_sync"]["mean"] == pytest.approx((1.9 + 200 / 110) / 2)
    assert set(res["modes"]) == {"sync", "async"}
    assert res["modes"]["async"]["idle"]["trainer"]["n"] == 2
    # these runs evaluated once (no accuracy curve): no time-to-accuracy comparison, so that target is not reached
    assert res["time_to_accuracy"] is None
    assert res["targets"]["reached"] == {"async_over_sync": True, "continuous_over_static": True,
                                         "async_over_sync_time_to_equal_accuracy": False}
    m = res["machine"]["start"]
    assert m["cpu_count"] >= 1 and len(m["load_average"]) == 3 and m["torch"]
    plot_timelines([("sync", _timeline()), ("async", _timeline())], tmp_path / "timeline.png")
    plot_throughput_bars(res, tmp_path / "throughput.png")
    for name in ("timeline.png", "throughput.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tmp_path / name).stat().st_size > 10_000
    from rich.console import Console

    console = Console(record=True, width=160)
    console.print(tp.results_table(res))
    text = console.export_text()
    assert "1.86x" in text and "effective training throughput" in text
    # the headline: the median pair with its range and its fraction of the ceiling, in the table and as one line
    hl = res["headline"]["async"]
    assert hl["median"] == pytest.approx((1.9 + 200 / 110) / 2) and hl["n"] == 2
    assert hl["accuracy"]["equal_within_noise"] and hl["accuracy"]["difference"] == pytest.approx(0.0)
    assert "median of pairs [range]" in text and f"{hl['median']:.2f}x [{hl['min']:.2f}-{hl['max']:.2f}]" in text
    from areal_cli.bench.throughput.table import headline_line

    line = headline_line(res)
    assert line.startswith(f"headline (async/sync effective, median of 2 pairs; % of the "
                           f"{res['headline']['ceiling']:.2f}x overlap ceiling): async (interruptible) "
                           f"{hl['median']:.2f}x [{hl['min']:.2f}-{hl['max']:.2f}] = {hl['fraction_of_ceiling']:.0%}")
    # another process busy during a run is said in the table and the headline line
    res["machine_cpu"] = {"max_other_cores": 0.8, "max_steal_cores": 0.0, "busy_cores": 0.1, "busy_runs": ["0-sync"],
                          "busy": True}
    console = Console(record=True, width=160)
    console.print(tp.results_table(res))
    assert "BUSY MACHINE in 1 runs" in console.export_text()
    assert headline_line(res).endswith("BUSY MACHINE: other processes took up to 0.80 cores, steal 0.00")


def test_in_place_runs_get_their_own_ratios_accuracy_and_targets():
    runs = _runs()
    for rep, tps in enumerate((260.0, 280.0)):  # in-place updates: 2.6x and 2.55x the sync runs
        runs.append(tp.summarize_run(_timeline(steps=((int(tps), 1.0),)), _summary(0.81), label=f"{rep}-ip",
                                     mode="async_in_place", repeat=rep, eta=2, interruptible=True, eval_n_prompts=128))
    sc = tp.default_scenario()
    sc.target_async_over_sync = 2.5
    res = json.loads(json.dumps(tp.build_results(sc, runs, warm={}, generate=None, machine={
        "start": tp.machine_description()}, extra_overrides=[], recipe_config={}, seconds=1.0)))
    ip = res["in_place"]
    assert ip["over_sync"]["pairs"] == [pytest.approx(2.6), pytest.approx(280 / 110)]
    assert ip["over_abort"]["pairs"] == [pytest.approx(260 / 190), pytest.approx(280 / 200)]
    assert ip["accuracy"]["equal_within_noise"] and ip["time_to_accuracy"] is None  # one evaluation per run
    assert res["targets"]["reached"]["async_in_place_over_sync"] is True
    assert res["targets"]["reached"]["async_over_sync"] is False  # the aborting async runs: 1.86x
    assert set(res["modes"]) == {"sync", "async", "async_in_place"}
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(tp.results_table(res))
    text = " ".join(console.export_text().split())  # the caption wraps
    assert "async, in-place updates" in text and "2.57x" in text and "in-place updates: reached" in text
    assert tp.build_results(tp.default_scenario(), _runs(), warm={}, generate=None, machine={
        "start": tp.machine_description()}, extra_overrides=[], recipe_config={}, seconds=1.0)["in_place"] is None


@pytest.mark.multiproc
def test_command_module_imports_only_click_and_stdlib():
    code = ("import sys; import areal_cli.commands.bench_throughput as m; "
            "print(sorted(x for x in ('torch', 'numpy', 'yaml', 'rich', 'matplotlib', 'transformers', 'httpx') "
            "if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------------------------------------ client


class _FakeServer:
    """httpx.MockTransport: /generate answers a recorded SGLang response after ``delay`` seconds."""

    def __init__(self, delay: float = 0.05):
        self.delay = delay
        self.calls: list[tuple[str, dict | None]] = []
        self.resp = json.loads((FIXTURES / "generate_single.json").read_text())["response"]

    async def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.url.path, body))
        if request.url.path == "/generate":
            await asyncio.sleep(self.delay)
            return httpx.Response(200, json=self.resp)
        if request.url.path == "/update_weights_from_disk":
            return httpx.Response(200, json={"success": True, "message": "ok", "num_paused_requests": 0})
        return httpx.Response(200, json={"status": "ok", "message": "ok"})


@pytest.mark.parametrize("interruptible,pause_mode", [(True, "abort"), (False, "abort"), (True, "in_place")])
def test_client_records_generation_activity_and_update_windows(interruptible, pause_mode):
    fake = _FakeServer()
    events = []
    c = RolloutClient(["http://a:1"], vocab_size=1024, transport=httpx.MockTransport(fake.handler),
                      interruptible=interruptible, pause_mode=pause_mode, on_activity=lambda *e: events.append(e))

    async def run():
        sp = SamplingParams(max_new_tokens=16)
        await asyncio.gather(c.generate([1, 2, 3], sp), c.generate([4, 5], sp))  # overlap: one interval
        await c.update_weights_from_disk("/m", 1)
        await c.aclose()

    asyncio.run(run())
    kinds = [(u, k) for u, k, _, _ in events if k != "request"]
    assert kinds == [("http://a:1", "generate"), ("http://a:1", "update")]
    assert all(b >= a for _, _, a, b in events)
    union = next(e for e in events if e[1] == "generate")
    assert union[3] - union[2] >= 0.04
    # and each request on its own (the servers' occupancy): two, inside the union
    requests = [e for e in events if e[1] == "request"]
    assert len(requests) == 2 and all(union[2] <= a <= b <= union[3] for _, _, a, b in requests)
    paths = [p for p, _ in fake.calls]
    update = next(b for p, b in fake.calls if p == "/update_weights_from_disk")
    if interruptible:  # pause (abort, or in place) -> load -> continue
        assert "/pause_generation" in paths and "/continue_generation" in paths
        assert next(b for p, b in fake.calls if p == "/pause_generation") == {"mode": pause_mode}
        # in place: nothing to abort, the paused server loads at once and its requests decode on
        assert update["abort_all_requests"] is (pause_mode == "abort")
        # requests stay on the server: no post-load prefix-cache flush (SGLang asserts it succeeds)
        assert update.get("flush_cache") is (False if pause_mode == "in_place" else None)
    else:  # no pause: the server finishes in-flight requests before it loads
        assert "/pause_generation" not in paths and "/continue_generation" not in paths
        assert update["abort_all_requests"] is False


@pytest.mark.multiproc
@pytest.mark.slow
def test_noninterruptible_update_lets_in_flight_samples_finish_with_old_weights(tmp_path):
    from areal_cli.models.tiny import build_tiny_model
    from areal_cli.rollout.server import EmbeddedServer

    model = build_tiny_model(tmp_path / "m", seed=0)
    with EmbeddedServer.launch(model, step_delay_s=0.01) as srv:  # ~0.6 s for 60 tokens

        async def run(interruptible: bool):
            c = RolloutClient([srv.url], vocab_size=512, interruptible=interruptible)
            sp = SamplingParams(max_new_tokens=60, min_new_tokens=60, temperature=1.0)
            task = asyncio.create_task(c.generate([5, 6, 7], sp))
            await asyncio.sleep(0.2)
            await c.update_weights_from_disk(str(model), 7 if interruptible else 9)
            comp = await task
            await c.aclose()
            return comp

        ni = asyncio.run(run(False))
        assert ni.n_interruptions == 0 and len(ni.output_ids) == 60
        assert set(ni.output_versions) == {0}  # finished entirely with the weights it started with
        it = asyncio.run(run(True))
        assert it.n_interruptions >= 1 and len(it.output_ids) == 60
        assert it.output_versions[0] == 9 and it.output_versions[-1] == 7  # resumed under the new version

        async def in_place():  # PipelineRL's in-flight update: no abort, no re-prefill, the version switches
            c = RolloutClient([srv.url], vocab_size=512, pause_mode="in_place")
            async with httpx.AsyncClient(base_url=srv.url) as http:
                before = (await http.get("/server_info")).json()["internal_states"][0]["prefill_tokens"]
                sp = SamplingParams(max_new_tokens=60, min_new_tokens=60, temperature=1.0)
                task = asyncio.create_task(c.generate([5, 6, 7], sp))
                await asyncio.sleep(0.2)
                await c.update_weights_from_disk(str(model), 11)
                comp = await task
                after = (await http.get("/server_info")).json()["internal_states"][0]["prefill_tokens"]
            await c.aclose()
            return comp, before, after

        async def in_place_with_flush():  # what a client that forgets flush_cache: false gets (SGLang: an assert)
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
                gen = asyncio.create_task(http.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": {
                    "max_new_tokens": 60, "min_new_tokens": 60}}))
                await asyncio.sleep(0.2)
                await http.post("/pause_generation", json={"mode": "in_place"})
                refused = await http.post("/update_weights_from_disk", json={"model_path": str(model),
                                                                            "weight_version": "12"})
                version = (await http.get("/get_model_info")).json().get("weight_version")
                await http.post("/continue_generation", json={})
                return refused, version, (await gen).json()

        refused, version, out = asyncio.run(in_place_with_flush())
        assert refused.status_code == 400 and "flush_cache: false" in refused.json()["message"]
        assert version == "7" and out["meta_info"]["finish_reason"]["type"] == "length"  # old weights, unharmed

        ip, before, after = asyncio.run(in_place())
        assert ip.n_interruptions == 0 and len(ip.output_ids) == 60
        assert ip.output_versions[0] == 7 and ip.output_versions[-1] == 11
        assert ip.output_versions == sorted(ip.output_versions)  # one switch, old then new
        # the prompt was prefilled once: the KV of the old weights was kept (an abort re-prefills the prefix)
        assert after - before == 3


# ------------------------------------------------------------------------------------------------ end to end


@pytest.mark.multiproc
@pytest.mark.slow
def test_bench_command_writes_results_and_plots(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    scenario = tmp_path / "quick.yaml"
    scenario.write_text(
        "name: quick\nsteps: 2\nrepeats: 1\ncompare_interruptible: false\n"
        f"cpus: {{trainer: '{cpus[0]}', server: '{cpus[-1]}', controller: '{cpus[-1]}'}}\n"
        "overrides: {success_rate_lb: 0.0, success_rate_ub: 1.0, sft_max_steps: 2, eval_n_prompts: 16,\n"
        "            rollout_process: true}\n"
        "generate_compare: {n_prompts: 4, min_new_tokens: 4, max_new_tokens: 12, hf_per_prompt: false}\n")
    out = tmp_path / "bench"
    res = CliRunner().invoke(throughput, ["--scenario", str(scenario), "--out", str(out)])
    assert res.exit_code == 0, res.output
    results = json.loads((out / "results.json").read_text())
    assert [r["mode"] for r in results["runs"]] == ["sync", "async"]
    assert [r["seed"] for r in results["runs"]] == [results["recipe_config"]["seed"]] * 2  # repeat 0: recipe seed
    assert results["overlap_ceiling"]["ceiling"]["mean"] >= 1.0
    assert all(r["steps"] == 2 and r["effective_tokens_per_s"] > 0 for r in results["runs"])
    assert results["ratios"]["async_over_sync"]["mean"] > 0  # a ratio, whatever this machine gives
    assert results["generate"]["continuous_over_static"] > 0
    # the controller ran in its own process: its generation activity reached the trainer's timeline
    timeline = json.loads((Path(results["runs"][1]["dir"]) / "timeline.json").read_text())
    assert {e["kind"] for e in timeline["events"] if e["lane"] == "server0"} >= {"generate", "update", "request"}
    t0, t1 = timeline["marks"]["rl_start"], timeline["marks"]["rl_end"]
    rl_requests = [e for e in timeline["events"] if e["kind"] == "request" and t0 <= e["start"] <= t1]
    assert rl_requests  # the child's request activity arrives in bunches (with its groups, once a second)
    assert timeline["cpu"]["rl_end"]["rollout_process"] is not None
    # what `areal bench simulate --calibrate-from` reads: each server's engine step costs at RL start and end,
    # and each trained sample's response length
    costs = timeline["marks"]["step_costs"]
    assert costs["rl_end"]["server0"]["n"] > costs["rl_start"]["server0"]["n"] > 0
    assert all(len(st["response_lengths"]) == st["n_samples"] for st in timeline["steps"])
    assert (out / "timeline.png").stat().st_size > 10_000 and (out / "throughput.png").stat().st_size > 10_000
    assert "async / sync" in res.output
    # the headline line closes the output; every run says who else used the cpus meanwhile
    assert "headline (async/sync effective, median of 1 pairs" in res.output.replace("\n", " ")
    assert all(set(r["machine_cpu"]) == {"seconds", "ours_cores", "other_cores", "steal_cores", "busy"}
               for r in results["runs"]) and results["machine_cpu"]["busy_cores"] == 0.1
    # the same output folder is never overwritten
    again = CliRunner().invoke(throughput, ["--scenario", str(scenario), "--out", str(out)])
    assert again.exit_code == 2 and "already holds a benchmark" in again.output


def test_overlap_ceiling_is_the_sync_step_over_its_longer_side():
    runs = [{"mode": "sync", "step_seconds": {"wait_s": 0.3, "train_s": 0.35, "publish_s": 0.05}},
            {"mode": "sync", "step_seconds": {"wait_s": 0.5, "train_s": 0.2, "publish_s": 0.0}},
            {"mode": "async", "step_seconds": {"wait_s": 0.0, "train_s": 9.0, "publish_s": 9.0}}]
    oc = tp.overlap_ceiling(runs)
    assert oc["ceiling"]["min"] == pytest.approx(0.7 / 0.5)  # generation-bound run: (0.5+0.2)/0.5
    assert oc["ceiling"]["max"] == pytest.approx(0.7 / 0.4)  # training-bound run: (0.3+0.35+0.05)/0.4
    assert oc["phases_s"] == {"generate": pytest.approx(0.4), "train": pytest.approx(0.275),
                              "publish": pytest.approx(0.025)}
    assert oc["bound_by"] == "generation"
    assert tp.overlap_ceiling([runs[2]]) is None


def test_time_to_accuracy_of_the_seed_averaged_curves_is_interpolated():
    runs = [_curve_run("sync", 0, [(10, 20.0, 0.4), (20, 40.0, 0.6)]),
            _curve_run("sync", 1, [(10, 22.0, 0.5), (20, 42.0, 0.8)]),   # mean final 0.7
            _curve_run("async", 0, [(10, 10.0, 0.5), (20, 20.0, 0.5)]),
            _curve_run("async", 1, [(10, 12.0, 0.5), (20, 22.0, 0.7)])]  # mean final 0.6: the target
    t = tp.time_to_accuracy(runs)
    assert t["target_accuracy"] == pytest.approx(0.6)
    assert t["mean_curve"]["sync"] == [[10, 21.0, pytest.approx(0.45)], [20, 41.0, pytest.approx(0.7)]]
    # sync's mean curve crosses 0.6 at 21 + 20 * (0.6 - 0.45) / (0.7 - 0.45) = 33 s; async's at its end, 21 s
    assert t["mean_curve_seconds"] == {"sync": pytest.approx(33.0), "async": pytest.approx(21.0)}
    assert t["mean_curve_ratio"] == pytest.approx(33.0 / 21.0)
    assert t["seconds"]["async"] == {0: None, 1: 22.0}  # per run: seed 0 never got to 0.6
    assert tp.first_crossing([[5, 3.0, 0.9]], 0.5) == 3.0 and tp.first_crossing([[5, 3.0, 0.1]], 0.5) is None
    assert tp.first_crossing([[5, 3.0, 0.4], [10, 6.0, 0.8]], 0.6, interpolate=False) == 6.0


def test_seed_per_repeat_is_on_by_default_and_must_be_a_bool(tmp_path):
    sc = tp.default_scenario()
    assert sc.seed_per_repeat is True
    f = tmp_path / "s.yaml"
    f.write_text("seed_per_repeat: 3\n")
    with pytest.raises(UserError, match=r"s.yaml:1: field 'seed_per_repeat'"):
        tp.load_scenario(f)


# ------------------------------------------------------------------------------------------------ long tail


def test_request_events_are_occupancy_not_activity():
    tl = _timeline()
    base = tp.activity(tl)
    tl["events"].append({"lane": "server0", "kind": "request", "start": 2.0, "end": 2.9})
    assert tp.activity(tl) == base  # a single request is not an activity of its own
    assert tp.request_intervals(tl) == [(2.0, 2.9)]


def test_straggler_of_a_sync_batch_by_hand():
    # 4 requests (groups) submitted together at t=10, answered at 11, 11, 12 and 16
    iv = [(10.0, 11.0), (10.0, 11.0), (10.0, 12.0), (10.0, 16.0)]
    assert tp.occupancy_curve(iv) == [(10.0, 4), (11.0, 2), (12.0, 1), (16.0, 0)]
    b = tp.batch_straggler(iv)
    # span 6 s; at full occupancy the 10 request-seconds take 10/4 = 2.5 s; the rest, 3.5 s, is the integral of
    # (1 - n(t)/4): 0 on [10, 11], 0.5 x 1 on [11, 12], 0.75 x 4 on [12, 16] = 3.5 = last finish - mean finish
    assert b == {"requests": 4, "span_s": 6.0, "full_occupancy_s": 2.5, "straggler_s": 3.5}
    assert tp.mean_occupancy(iv, (10.0, 16.0)) == pytest.approx(10 / 6)
    assert tp.batch_straggler([]) is None


def _sync_timeline() -> dict:
    """Two synchronous steps: wait (batch generated), train, publish; step 1 waits 1.0 s for requests answered at
    +0.2, +0.2, +0.9 (straggler 0.9 - 0.4333 = 0.4667 s after the first submission); step 2 waits 0.8 s for
    requests answered at +0.3, +0.3, +0.3, +0.7 (straggler 0.7 - 0.4 = 0.3 s)."""
    events, steps, t = [], [], 0.0
    for i, (wait, ends) in enumerate(((1.0, (0.2, 0.2, 0.9)), (0.8, (0.3, 0.3, 0.3, 0.7))), 1):
        sub = t + 0.1  # weights loaded, the batch is submitted
        events += [{"lane": "server0", "kind": "request", "start": sub, "end": sub + e} for e in ends]
        events += [{"lane": "trainer", "kind": "wait", "start": t, "end": t + wait},
                   {"lane": "trainer", "kind": "train", "start": t + wait, "end": t + wait + 0.5},
                   {"lane": "trainer", "kind": "publish", "start": t + wait + 0.5, "end": t + wait + 0.6}]
        steps.append({"step": i, "start": t, "end": t + wait + 0.6, "tokens": 600, "response_tokens": 300,
                      "n_samples": 8, "staleness": {"0": 8}, "wait_s": wait, "train_s": 0.5, "train_cpu_s": 0.5,
                      "publish_s": 0.1, "eval_s": 0.0, "accuracy": 0.5, "cpu": None, "generated_tokens": 300 * i})
        t += wait + 0.6
    return {"marks": {"rl_start": 0.0, "rl_end": t}, "events": events, "steps": steps, "cpu": {}}


def test_sync_stragglers_and_the_decomposition_by_hand():
    tl = _sync_timeline()
    s = tp.sync_stragglers(tl)
    assert s["steps"] == 2 and s["requests"] == pytest.approx(3.5)
    assert s["straggler_s"] == pytest.approx(((0.9 - 1.3 / 3) + (0.7 - 1.6 / 4)) / 2)
    sync = tp.summarize_run(tl, _summary(0.6), label="s", mode="sync", repeat=0, eta=0, interruptible=True,
                            eval_n_prompts=128)
    assert sync["straggler"]["straggler_s"] == pytest.approx(s["straggler_s"])
    assert sync["step_s_mean"] == pytest.approx((1.6 + 1.4) / 2) and sync["tokens_per_step"] == 600
    # an async run of the same tokens per step at 0.75 s per step
    atl = _timeline(steps=((600, 0.75), (600, 1.5)))
    asy = tp.summarize_run(atl, _summary(0.6), label="a", mode="async", repeat=0, eta=4, interruptible=True,
                           eval_n_prompts=128)
    assert asy["straggler"] is None  # only synchronous batches have a straggler figure
    d = tp.decompose_ratio([sync, asy])
    G, S, T, P = 0.9, s["straggler_s"], 0.5, 0.1
    Gf = G - S
    assert d["phases_s"] == {"generate": pytest.approx(G), "straggler": pytest.approx(S),
                             "generate_full_occupancy": pytest.approx(Gf), "train": T, "publish": P}
    assert d["overlap"] == pytest.approx((Gf + T + P) / max(Gf, T + P))
    assert d["straggler"] == pytest.approx((G + T + P) / (Gf + T + P))
    assert d["ceiling"] == pytest.approx((G + T + P) / max(Gf, T + P)) and d["bound_by"] == "training"
    m = d["measured"]
    assert m["step_rate"] == pytest.approx(1.5 / 0.75) and m["tokens_per_step"] == pytest.approx(1.0)
    assert m["effective"] == pytest.approx(2.0) and m["step_rate_fraction_of_ceiling"] == pytest.approx(2.0 / d["ceiling"])
    assert tp.decompose_ratio([asy]) is None


def test_an_evaluation_in_the_loop_is_left_out_of_the_next_step_and_a_deferred_one_is_not_there():
    # steps of 1 s, 2 s, then an evaluation of 4 s in the loop whose rollouts pre-generated step 3's batch (0.2 s)
    steps = [{"step": 1, "end": 1.0, "tokens": 10}, {"step": 2, "end": 3.0, "tokens": 10, "evaluated": True,
                                                      "eval_s": 4.0},
             {"step": 3, "end": 7.2, "tokens": 10}, {"step": 4, "end": 8.7, "tokens": 10}]
    assert tp.step_durations(steps, 0.0) == [1.0, 2.0, pytest.approx(0.2), pytest.approx(1.5)]
    assert tp.effective_throughput(steps, 0.0)["seconds"] == pytest.approx(4.7)
    assert tp.after_eval(steps) == [False, False, True, False]
    # deferred (loop.eval_deferred): the evaluation ran after the loop; its eval_s is the step's own bookkeeping
    deferred = [dict(s, eval_deferred=True) if s.get("evaluated") else s for s in steps]
    deferred[1]["eval_s"] = 0.01
    deferred[2]["end"] = 3.2
    deferred[3]["end"] = 4.7
    assert tp.step_durations(deferred, 0.0) == [1.0, 2.0, pytest.approx(0.2), pytest.approx(1.5)]
    assert tp.after_eval(deferred) == [False] * 4


def test_long_tail_scenario_file():
    sc = tp.load_scenario("throughput-tiny-longtail")  # a shipped scenario, by name
    assert sc.source.endswith("benchmarks/scenarios/throughput-tiny-longtail.yaml")
    assert (sc.recipe, sc.eta_sync, sc.target_async_over_sync) == ("tiny-longtail", 0, 2.5)
    assert sc.sync_overrides == {"ppo.recompute_proximal": False} and sc.compare_interruptible and sc.compare_in_place
    plan = tp.describe_plan(sc, 1)
    assert [r["mode"] for r in plan[:8]] == ["sync", "async", "async_noninterruptible", "async_in_place",
                                             "async_in_place", "async_noninterruptible", "async", "sync"]
    assert [(r["interruptible"], r["pause_mode"]) for r in plan[1:4]] == [(True, "abort"), (False, "abort"),
                                                                          (True, "in_place")]
    apply_overrides(TrainConfig(), [f"{k}={v}" for k, v in {**sc.overrides, **sc.sync_overrides}.items()])
    builtin = tp.default_scenario()
    assert (builtin.target_async_over_sync, builtin.sync_overrides) == (1.8, {})


def test_bad_long_tail_keys_are_reported_with_file_and_line(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("name: x\ntarget_async_over_sync: -1\n")
    with pytest.raises(UserError, match=r"s\.yaml:2: field 'target_async_over_sync'"):
        tp.load_scenario(p)
    p.write_text("name: x\n\nsync_overrides: [recompute_proximal]\n")
    with pytest.raises(UserError, match=r"s\.yaml:3: field 'sync_overrides'"):
        tp.load_scenario(p)
    p.write_text("compare_in_place: yes please\n")
    with pytest.raises(UserError, match=r"s\.yaml:1: field 'compare_in_place'"):
        tp.load_scenario(p)
    # what conflicts with the runs' deferred evaluations fails before the warm start (also in --dry-run)
    p.write_text("name: x\noverrides:\n  rollout.success_rate_lb: 0.0\n  loop.checkpoint_every: 2\n")
    with pytest.raises(UserError, match=r"s\.yaml:4: field 'overrides\.loop\.checkpoint_every': must be off with "
                                        r"loop\.eval_deferred"):
        tp.check_configs(tp.load_scenario(p), [])
    p.write_text("name: x\noverrides:\n  loop.eval_deferred: false\n")
    with pytest.raises(UserError, match=r"s\.yaml:3: field 'overrides\.loop\.eval_deferred': set by the benchmark"):
        tp.check_configs(tp.load_scenario(p), [])
    p.write_text("impute_post_eval_steps: true\n")  # an earlier release's key: evaluations are deferred now
    with pytest.raises(UserError, match=r"s\.yaml:1: field 'impute_post_eval_steps': unknown key"):
        tp.load_scenario(p)


@pytest.mark.parametrize("section, text, line, needle", [
    ("overrides", "overrides:\n  batch_size: 8\n  bogus: 1\n", 5, "unknown key"),
    ("overrides", "overrides:\n  ppo.prox_logp_method: nope\n", 4, "must be one of auto, recompute, reuse"),
    ("sync_overrides", "sync_overrides:\n  stale_groups: keep\n", 4, "must be one of drop, train"),
])
def test_a_bad_recipe_override_in_a_scenario_names_its_file_and_line(tmp_path, section, text, line, needle):
    """Errors the recipe's validation raises for a scenario's overrides point at the scenario line (not at a
    '-o' the user never typed), before anything is written."""
    p = tmp_path / "sc.yaml"
    p.write_text("name: x\nrecipe: tiny-arith\n" + text)
    with pytest.raises(UserError) as err:
        tp.run_benchmark(tp.load_scenario(p), tmp_path / "out")
    key = text.splitlines()[-1].split(":")[0].strip()
    assert str(err.value).startswith(f"{p}:{line}: field '{section}.{key}': ") and needle in str(err.value)
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


def test_an_unknown_scenario_name_lists_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as err:
        tp.load_scenario("nosuch")
    assert str(err.value).startswith("nosuch: no such file") and "throughput-tiny-longtail" in str(err.value)


def test_steady_state_leaves_out_the_pipeline_fill_and_the_steps_after_an_evaluation():
    steps = [{"step": 1, "end": 1.0, "wait_s": 0.8, "train_s": 0.15, "publish_s": 0.05},  # fills the pipeline
             {"step": 2, "end": 1.3, "wait_s": 0.1, "train_s": 0.15, "publish_s": 0.05, "evaluated": True, "eval_s": 2.0},
             {"step": 3, "end": 3.4, "wait_s": 0.0, "train_s": 0.05, "publish_s": 0.05},  # batch made during the eval
             {"step": 4, "end": 3.7, "wait_s": 0.1, "train_s": 0.15, "publish_s": 0.05}]
    assert [(s["step"], pytest.approx(d)) for s, d in tp.steady_steps(steps, 0.0)] == [(2, 0.3), (4, 0.3)]
    sync = [{"mode": "sync", "repeat": r, "steady_step_s": 0.3, "steady_step_seconds":
             {"wait_s": 0.1, "train_s": 0.15, "publish_s": 0.05}} for r in (0, 1)]
    asy = [{"mode": "async", "repeat": 0, "steady_step_s": 0.25}, {"mode": "async", "repeat": 1, "steady_step_s": 0.2}]
    ss = tp.steady_state(sync + asy)
    assert ss["ceiling"] == pytest.approx(0.3 / 0.2) and ss["phases_s"]["generate"] == pytest.approx(0.1)
    assert ss["async_over_sync"]["pairs"] == [pytest.approx(1.2), pytest.approx(1.5)]
    assert ss["async_fraction_of_ceiling"] == pytest.approx(1.35 / 1.5)
    assert "async_noninterruptible_over_sync" not in ss and "ceiling_with_stragglers" not in ss
    assert tp.steady_state(asy) is None and tp.steady_state([{"mode": "sync", "step_seconds": {}}]) is None
    # long-tailed batches: G = 0.6 s of which S = 0.4 s stragglers, T + P = 0.35 s; the overlap ceiling alone
    # (0.95 / 0.6) is below what async reaches once it stops waiting for the longest samples (0.95 / 0.35)
    tail = [{"mode": "sync", "repeat": r, "steady_step_s": 0.95, "straggler": {"straggler_s": 0.4},
             "steady_step_seconds": {"wait_s": 0.6, "train_s": 0.34, "publish_s": 0.01}} for r in (0, 1)]
    fast = [{"mode": "async", "repeat": r, "steady_step_s": 0.475} for r in (0, 1)]
    ss = tp.steady_state(tail + fast)
    assert ss["ceiling"] == pytest.approx(0.95 / 0.6) and ss["async_fraction_of_ceiling"] > 1
    assert ss["ceiling_with_stragglers"] == pytest.approx(0.95 / 0.35) and ss["phases_s"]["straggler"] == 0.4
    assert ss["async_fraction_of_ceiling_with_stragglers"] == pytest.approx(2.0 / (0.95 / 0.35))
    assert "async_gap_s" not in ss  # the async runs carry no phases
    # the async step (0.475 s) above the ceiling's (T + P = 0.35 s, training-bound: G_full = 0.2 s), by hand: the
    # trainer 0.06 s slower than in the sync runs, 0.015 s more publishing, 0.05 s waiting: 0.125 s in all
    phases = {"wait_s": 0.05, "train_s": 0.40, "publish_s": 0.025}
    ss = tp.steady_state(tail + [{**r, "steady_step_seconds": phases} for r in fast])
    gap = ss["async_gap_s"]
    assert gap == {"train_slowdown": pytest.approx(0.06), "publish": pytest.approx(0.015), "wait": pytest.approx(0.05)}
    assert sum(gap.values()) == pytest.approx(0.475 - 0.35)
    assert ss["async_ceiling_under_contention"] == pytest.approx(0.95 / 0.425)
    assert ss["async_fraction_of_ceiling_under_contention"] == pytest.approx(2.0 / (0.95 / 0.425))
    # generation-bound (G_full = 0.5 s > T + P): waiting G_full - T - P = 0.15 s per step is the pipeline's due
    slow_gen = [{**r, "straggler": {"straggler_s": 0.1}} for r in tail]
    ss = tp.steady_state(slow_gen + [{**r, "steady_step_seconds": {**phases, "wait_s": 0.2}} for r in fast])
    assert ss["async_gap_s"]["wait"] == pytest.approx(0.2 - 0.15)
    assert ss["async_ceiling_under_contention"] == pytest.approx(0.95 / 0.5)


def test_only_a_slowdown_is_granted_to_the_ceiling_under_contention():
    # the async runs' training phase came out 0.02 s SHORTER than the sync runs' T (the machine sped up): the
    # ceiling stays the plain one (0.3 / 0.2), never above it; the gap keeps its sign, printed without "-0.000"
    sync = [{"mode": "sync", "repeat": r, "steady_step_s": 0.3, "steady_step_seconds":
             {"wait_s": 0.1, "train_s": 0.15, "publish_s": 0.05}} for r in (0, 1)]
    asy = [{"mode": "async", "repeat": r, "steady_step_s": 0.2, "steady_step_seconds":
            {"wait_s": 0.0, "train_s": 0.13, "publish_s": 0.0498}} for r in (0, 1)]
    ss = tp.steady_state(sync + asy)
    assert ss["async_ceiling_under_contention"] == pytest.approx(ss["ceiling"]) == pytest.approx(1.5)
    assert ss["async_fraction_of_ceiling_under_contention"] == pytest.approx(ss["async_fraction_of_ceiling"])
    assert ss["async_gap_s"]["train_slowdown"] == pytest.approx(-0.02)
    from areal_cli.bench.throughput.table import signed

    assert signed(ss["async_gap_s"]["publish"]) == "+0.000" and signed(-0.0004) == "+0.000"
    assert signed(-0.02) == "-0.020" and signed(0.0126) == "+0.013"


def test_machine_drift_above_ten_percent_of_sync_t_is_not_called_steady():
    def sync(r, t):
        return {"mode": "sync", "repeat": r, "steady_step_s": 0.3 + t,
                "steady_step_seconds": {"wait_s": 0.15, "train_s": t, "publish_s": 0.01}}

    asy = [{"mode": "async", "repeat": r, "steady_step_s": 0.2,
            "steady_step_seconds": {"wait_s": 0.0, "train_s": 0.16, "publish_s": 0.01}} for r in (0, 1, 2)]
    # T 0.150 / 0.160 / 0.170 s: (0.170 - 0.150) / 0.160 = 12.5% > 10%
    ss = tp.steady_state([sync(0, 0.15), sync(1, 0.16), sync(2, 0.17)] + asy)
    d = ss["drift"]
    assert d["sync_train_s"] == [0.15, 0.16, 0.17] and d["median"] == 0.16
    assert d["spread"] == pytest.approx(0.125) and d["threshold"] == 0.10 and d["dominates"] is True
    assert ss["steady"] is False
    ss = tp.steady_state([sync(0, 0.15), sync(1, 0.16), sync(2, 0.158)] + asy)  # 6.3%: steady
    assert ss["drift"]["spread"] == pytest.approx(0.01 / 0.158) and ss["steady"] is True
    assert tp.machine_drift([sync(0, 0.15)]) is None  # one sync run shows no drift between runs
    assert tp.steady_state([sync(0, 0.15)] + asy)["steady"] is True


def test_headline_is_the_median_pair_and_its_fraction_of_the_ceiling():
    sync = [{"mode": "sync", "repeat": r, "effective_tokens_per_s": 100.0,
             "step_seconds": {"wait_s": 0.2, "train_s": 0.19, "publish_s": 0.01}} for r in range(4)]
    asy = [{"mode": "async", "repeat": r, "effective_tokens_per_s": v} for r, v in enumerate((150, 190, 120, 170))]
    ni = [{"mode": "async_noninterruptible", "repeat": r, "effective_tokens_per_s": 180.0} for r in range(3)]
    runs = sync + asy + ni
    ceiling = tp.overlap_ceiling(runs)
    assert ceiling["ceiling"]["mean"] == pytest.approx(0.4 / 0.2)
    hl = tp.headline(runs, ceiling)
    assert hl["ceiling"] == pytest.approx(2.0)
    assert hl["async"]["median"] == pytest.approx(1.6) and (hl["async"]["min"], hl["async"]["max"]) == (1.2, 1.9)
    assert hl["async"]["fraction_of_ceiling"] == pytest.approx(0.8) and hl["async"]["n"] == 4
    assert hl["async_noninterruptible"]["median"] == pytest.approx(1.8) and hl["async_noninterruptible"]["n"] == 3
    assert "async_in_place" not in hl and tp.headline(runs, None) is None


@pytest.mark.parametrize("section,text,line", [
    ("overrides", "overrides:\n  rollout.success_rate_lb: 0.0\n  rollout.pause_mode: in_place\n", 4),
    ("overrides", "overrides: {interruptible: false}\n", 2),
    ("sync_overrides", "sync_overrides:\n  rollout.interruptible: false\n", 3),
])
def test_a_scenario_may_not_set_the_update_mode_its_modes_set(tmp_path, section, text, line):
    p = tmp_path / "sc.yaml"
    p.write_text("name: x\n" + text)
    with pytest.raises(UserError) as err:
        tp.check_configs(tp.load_scenario(p), [])
    msg = str(err.value)
    assert msg.startswith(f"{p}:{line}: field '{section}.") and "the mode of the run" in msg and "\n" not in msg
    assert "compare_in_place" in msg or "compare_interruptible" in msg


@pytest.mark.multiproc
def test_the_core_contention_benchmark_times_the_workload_beside_each_neighbour(tmp_path, capsys):
    import importlib.util
    import os

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "core_contention.py"
    spec = importlib.util.spec_from_file_location("core_contention", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--out", str(tmp_path)]) == 2  # a directory: refused before measuring, one line
    assert "core_contention: --out" in capsys.readouterr().err
    out = tmp_path / "r.json"
    rc = bench.main(["--rounds", "1", "--iters", "1", "--out", str(out)])
    if len(os.sched_getaffinity(0)) < 2:  # one usable core: refused with one line, nothing written
        assert rc == 2 and "needs two usable cores" in capsys.readouterr().err and not out.exists()
        return
    assert rc == 0
    res = json.loads(out.read_text())
    assert set(res["seconds"]) == {"idle", "spin", "memory", "engine"}
    assert all(len(v) == 1 and v[0] > 0 for v in res["seconds"].values())
    assert res["slowdown_vs_idle"]["idle"] == 1.0
    assert res["slowdown_vs_idle"]["engine"] == pytest.approx(res["seconds"]["engine"][0] / res["seconds"]["idle"][0])
    assert res["cpus"]["workload"] != res["cpus"]["neighbour"]


def test_dry_run_estimate_scales_a_measured_run_of_the_scenario_by_steps(tmp_path):
    from areal_cli.bench.estimate import find_basis, plan_lines

    def write(name, created, sync_s, async_s, scenario="throughput-tiny-arith"):
        runs = [{"mode": "sync", "steps": 40, "rl_seconds": 40 * sync_s}, {"mode": "async", "steps": 40, "rl_seconds": 40 * async_s}]
        d = {"created": created, "scenario": {"name": scenario, "recipe": "tiny-arith"}, "modes": {}, "runs": runs,
             "warm_start": {"seconds": 10.0}, "bench_seconds": 10.0 + 40 * (sync_s + async_s) + 2 * 6.0,
             "machine": {"start": {"cpu": "X", "cpu_count": 2}}}
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(d))

    write("old", "2026-01-01", 9.0, 9.0)
    write("new", "2026-02-01", 0.5, 0.25)
    write("other", "2026-03-01", 9.0, 9.0, scenario="throughput-tiny-longtail")  # another scenario: not the basis
    assert find_basis("throughput", "throughput-tiny-arith", "tiny-arith", tmp_path).path.parent.name == "new"
    # 100 steps each: steps x measured seconds per step of the mode + 6 s start-up per run; in_place runs as async
    per_run, lines = plan_lines("throughput", "throughput-tiny-arith", "tiny-arith",
                                [("sync", 100), ("async", 100), ("async_in_place", 100)], tmp_path, busy=0.0)
    assert per_run == pytest.approx([56.0, 31.0, 31.0])
    assert lines[0].startswith(f"estimated wall time: {(10 + 56 + 31 + 31) / 60:.1f} min (warm start 10 s + 3 runs")
    assert str(tmp_path / "new" / "results.json") in lines[1] and "async_in_place" in lines[2]
    none, lines = plan_lines("throughput", "nope", "tiny-longtail-x", [("sync", 1)], tmp_path / "empty")
    assert none is None and "not estimated" in lines[0]

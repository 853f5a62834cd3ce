"""``areal bench simulate``: the discrete-event cluster model, its calibration and its command."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
from click.testing import CliRunner

from areal_cli.bench import sim
from areal_cli.commands.bench_simulate import simulate as simulate_cmd
from areal_cli.foundations.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def small(**kw) -> sim.Scenario:
    """A cluster small enough to simulate in a fraction of a second: 4 servers, 4 trainer GPUs."""
    base = dict(name="small", gen_gpus=4, train_gpus=4, batch_size=16, group_size=4, prompt_tokens=100,
                max_new_tokens=2048, response_median_tokens=300, response_sigma=1.0, response_prompt_corr=0.5,
                decode_overhead_s=0.005, train_mfu=0.1, train_fixed_s=1.0, sim_steps=14, warmup_steps=4,
                sync_overhead_s=0.2, weight_io_gb_s=20.0,
                scaling_gpus=[])
    base.update(kw)
    return sim.Scenario(**base)


def exact_costs(**kw) -> dict:
    """Explicit costs, so expected times can be written down by hand."""
    d = dict(decode_step_fixed_s=1e-3, decode_step_per_seq_s=1e-4, decode_step_per_ctx_token_s=1e-6,
             prefill_s_per_token=0.0, train_gpu_s_per_token=0.0, train_gpu_s_per_token_sq=0.0, train_fixed_s=0.5,
             sync_save_s=0.1, sync_load_s=0.2, weight_poll_s=0.0)
    d.update(kw)
    return d


def test_sync_step_equals_hand_computed_decode_sum():
    # one server, one prompt of 4 samples, every response exactly 100 tokens: a sync step is
    # load 0.2 + sum over 100 decode steps of (a + b*4 + c*sum of the 4 contexts) + train 0.5 + save 0.1
    sc = sim.Scenario(gen_gpus=1, train_gpus=1, batch_size=1, group_size=4, prompt_tokens=10, max_new_tokens=1000,
                      response_median_tokens=100, response_sigma=0.0, sim_steps=6, warmup_steps=2,
                      **exact_costs())
    decode = sum(1e-3 + 4 * 1e-4 + 1e-6 * 4 * (10 + k) for k in range(100))
    r = sim.simulate(sc, "sync")
    assert r["step_s"] == pytest.approx(0.2 + decode + 0.5 + 0.1, rel=1e-9)
    assert r["tokens_per_step"] == 4 * 110
    assert r["staleness"] == {0: 1.0}


def test_prefill_stalls_decoding_for_prompt_tokens_times_cost():
    kw = dict(gen_gpus=1, train_gpus=1, batch_size=1, group_size=4, prompt_tokens=10, max_new_tokens=1000,
              response_median_tokens=100, response_sigma=0.0, sim_steps=6, warmup_steps=2)
    without = sim.simulate(sim.Scenario(**kw, **exact_costs()), "sync")["step_s"]
    with_prefill = sim.simulate(sim.Scenario(**kw, **exact_costs(prefill_s_per_token=1e-3)), "sync")["step_s"]
    # the 4 samples of a prompt share one server and its prompt cache: 10 prompt tokens are prefilled once
    assert with_prefill - without == pytest.approx(10 * 1e-3, rel=1e-9)


def test_staleness_is_zero_in_sync_one_in_overlap_and_bounded_by_eta_in_async():
    sc = small()
    assert sim.simulate(sc, "sync")["staleness"] == {0: 1.0}
    ov = sim.simulate(sc, "overlap")
    # one step behind; a server still loading version v-1 when v appears loads v before starting (lag 0)
    assert set(ov["staleness"]) <= {0, 1} and ov["staleness_mean"] > 0.9
    r = sim.simulate(sc, "async", eta=2)
    # AReaL bounds the head version at admission; a group can finish after later-admitted ones, so at most eta + 1
    assert r["staleness_max"] <= 3
    assert 0 < r["staleness_mean"] <= 2


def test_long_tail_drives_the_async_speedup():
    narrow = sim.async_sync_ratio(small(response_sigma=0.1, response_median_tokens=450))
    tailed = sim.async_sync_ratio(small(response_sigma=1.2))
    assert tailed > narrow + 0.3
    assert narrow > 1.0  # overlap of generation and training alone already helps


def test_interrupting_updates_beats_waiting_for_in_flight_requests():
    sc = small(chunk_tokens=0, train_mfu=0.5)  # generation-bound; non-interruptible waits for whole requests
    inter = sim.simulate(sc, "async")
    drain = sim.simulate(sc, "async_nointerrupt")
    assert inter["interrupted_per_step"] > 0 and drain["interrupted_per_step"] == 0
    assert inter["effective_tokens_per_s"] > 1.05 * drain["effective_tokens_per_s"]


def test_in_place_updates_cost_what_aborting_ones_cost_less_the_re_prefill():
    # one server, batches of one 4-sample prompt whose samples outlive a step: every update finds them running
    kw = dict(gen_gpus=1, train_gpus=1, batch_size=1, group_size=4, prompt_tokens=10, max_new_tokens=1000,
              response_median_tokens=300, response_sigma=0.0, sim_steps=12, warmup_steps=4, eta=4)
    free = sim.Scenario(**kw, **exact_costs())  # prefill costs nothing: the two modes run the same schedule
    abort, in_place = sim.simulate(free, "async"), sim.simulate(free, "async_inplace")
    assert abort["interrupted_per_step"] > 0 and in_place["interrupted_per_step"] == 0
    assert in_place["step_s"] == pytest.approx(abort["step_s"], rel=1e-9)
    costly = sim.Scenario(**kw, **exact_costs(prefill_s_per_token=1e-4))
    abort, in_place = sim.simulate(costly, "async"), sim.simulate(costly, "async_inplace")
    assert in_place["step_s"] < abort["step_s"]
    # in place, the server prefills each prompt once (10 tokens per step); aborting also re-prefills prefixes
    assert in_place["gen_prefill_frac"] * in_place["step_s"] == pytest.approx(10 * 1e-4, rel=1e-6)
    assert abort["gen_prefill_frac"] * abort["step_s"] > 10 * 10 * 1e-4
    with pytest.raises(ValueError, match="async_inplace"):
        sim.simulate(costly, "async_in_place")  # the known modes are named


def test_shrunk_cluster_keeps_step_times():
    sc = small(gen_gpus=16, train_gpus=16, batch_size=64)
    for mode in ("sync", "async"):
        full = sim.simulate(sc, mode)["step_s"]
        quarter = sim.simulate(sc, mode, scale=4)["step_s"]
        assert quarter == pytest.approx(full, rel=0.1)


def test_fit_constants_recovers_the_values_that_made_the_targets():
    truth = small(decode_overhead_s=0.006, train_mfu=0.15)
    targets = {m: sim.simulate(truth, m)["step_s"] for m in ("sync", "async")}
    fitted, rep = sim.fit_constants(small(decode_overhead_s=0.012, train_mfu=0.3), targets, scale=1)
    assert fitted.decode_overhead_s == pytest.approx(0.006, rel=0.05)
    assert fitted.train_mfu == pytest.approx(0.15, rel=0.05)
    assert max(abs(e) for e in rep["rel_error"].values()) < 0.01


def synthetic_run(tmp_path: Path) -> Path:
    """A made-up measured run in ``areal bench throughput`` form: an eta=0 run whose training time is
    0.2 s + 1e-4 s/token, publishing 0.05 s, evaluation 0.3 s, 40 groups finished and 32 kept per step."""
    def steps(eta: int, step_s: float) -> list[dict]:
        rows = [{"step": 0, "phase": "warm_start_end", "elapsed_s": 10.0}]
        t, tok, smp, sub, acc = 10.0, 0, 0, 0, 0
        for i in range(1, 13):
            trained = 3000 + 400 * (i % 4)
            t += step_s
            tok, smp, sub, acc = tok + 40 * 4 * 5, smp + 40 * 4, sub + 40, acc + 32
            rows.append({"step": i, "phase": "rl", "elapsed_s": t, "train_s": 0.2 + 1e-4 * trained,
                         "sync_s": 0.05, "wait_s": 0.1, "tokens_generated": tok, "samples_generated": smp,
                         "groups_submitted": sub, "groups_accepted": acc, "trained_tokens": trained,
                         "staleness_mean": 0.0 if eta == 0 else 1.5, "staleness_max": eta, "truncated_frac": 0.0})
        return rows
    p = tmp_path / "results.json"
    p.write_text(json.dumps({"runs": {"sync": {"eta": 0, "steps": steps(0, 1.0)},
                                      "async": {"eta": 2, "steps": steps(2, 0.8)}}}))
    return p


def test_calibrate_from_run_reads_trainer_costs_and_fits_decode_to_the_sync_step(tmp_path):
    base = sim.Scenario(gen_gpus=1, train_gpus=1, batch_size=32, group_size=4, prompt_tokens=20, max_new_tokens=8,
                        response_sigma=0.1, max_concurrent_groups=96, eta=2, decoupled_recompute=False,
                        decode_step_per_seq_s=0.0, decode_step_per_ctx_token_s=0.0, prefill_s_per_token=0.0,
                        sim_steps=12, warmup_steps=3, scaling_gpus=[])
    sc, rep = sim.calibrate_from_run(synthetic_run(tmp_path), base)
    assert rep["sync_run"] == "sync"
    assert sc.train_fixed_s == pytest.approx(0.2, rel=1e-6)
    assert sc.train_gpu_s_per_token == pytest.approx(1e-4, rel=1e-6)
    assert sc.sync_save_s == pytest.approx(0.05)
    assert sc.accept_fraction == pytest.approx(0.8)
    assert sc.response_median_tokens * 1.005 == pytest.approx(5.0, rel=0.01)  # mean 5 = median * exp(sigma^2/2)
    # the decode cost was solved so that the simulated synchronous step takes the measured 1.0 s
    assert rep["checks"]["sync"]["simulated_step_s"] == pytest.approx(1.0, rel=0.01)
    assert rep["checks"]["async"]["eta"] == 2 and rep["checks"]["async"]["measured_step_s"] == pytest.approx(0.8)


def test_calibrate_from_a_throughput_results_json_reads_each_runs_own_folder(tmp_path):
    """``areal bench throughput`` results.json: ``steps`` is the step count and the records are in the run's
    folder under runs/ (found beside the file even when the recorded absolute ``dir`` is elsewhere)."""
    records = json.loads(synthetic_run(tmp_path).read_text())["runs"]
    runs = []
    for label, (mode, eta) in {"00-sync-r0": ("sync", 0), "01-async-r0": ("async", 2)}.items():
        d = tmp_path / "bench" / "runs" / label
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[
            "sync" if mode == "sync" else "async"]["steps"]))
        runs.append({"label": label, "mode": mode, "eta": eta, "steps": 12, "dir": f"/elsewhere/runs/{label}"})
    results = tmp_path / "bench" / "results.json"
    results.write_text(json.dumps({"runs": runs}))
    base = sim.Scenario(gen_gpus=1, train_gpus=1, batch_size=32, group_size=4, prompt_tokens=20, max_new_tokens=8,
                        response_sigma=0.1, max_concurrent_groups=96, eta=2, decoupled_recompute=False,
                        decode_step_per_seq_s=0.0, decode_step_per_ctx_token_s=0.0, prefill_s_per_token=0.0,
                        sim_steps=12, warmup_steps=3, scaling_gpus=[])
    sc, rep = sim.calibrate_from_run(results, base)
    assert rep["sync_run"] == "00-sync-r0"
    assert sc.train_fixed_s == pytest.approx(0.2, rel=1e-6) and sc.sync_save_s == pytest.approx(0.05)


def test_calibrate_from_run_without_a_sync_run_is_a_user_error(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"runs": [{"name": "a", "eta": 4, "steps": [{"step": 1}]}]}))
    with pytest.raises(UserError, match="at least 4 RL steps"):
        sim.calibrate_from_run(p)
    p.write_text("{not json")
    with pytest.raises(UserError, match=r"r\.json:1: invalid JSON"):
        sim.calibrate_from_run(p)


def test_bad_scenario_names_file_line_and_field(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\ngen_gpus: 8\nresponse_sigma: -1\n")
    with pytest.raises(UserError, match=r"bad\.yaml:3: field 'response_sigma': must be >= 0"):
        sim.load_scenario(str(p))
    p.write_text("name: x\n\nnot_a_field: 3\n")
    with pytest.raises(UserError, match=r"bad\.yaml:3: field 'not_a_field': unknown key"):
        sim.load_scenario(str(p))
    p.write_text("name: x\nstep: 3\n")  # the closest known key is named
    with pytest.raises(UserError, match=r"bad\.yaml:2: field 'step': unknown key \(did you mean 'steps'\?\)"):
        sim.load_scenario(str(p))
    p.write_text("kind: throughput\n")
    with pytest.raises(UserError, match=r"bad\.yaml:1: field 'kind': a scenario of `areal bench throughput "
                                        r"--scenario .*bad\.yaml`, not a cluster-model one"):
        sim.load_scenario(str(p))
    p.write_text("name: x\nrecipe: tiny-arith\nsteps: 4\n")  # a throughput scenario without a kind
    with pytest.raises(UserError, match=r"bad\.yaml:2: field 'kind': a scenario of `areal bench throughput"):
        sim.load_scenario(str(p))
    p.write_text("kind: bogus\n")
    with pytest.raises(UserError, match=r"bad\.yaml:1: field 'kind': expected simulate, got 'bogus'"):
        sim.load_scenario(str(p))
    p.write_text("gen_gpus: lots\n")
    with pytest.raises(UserError, match=r"bad\.yaml:1: field 'gen_gpus': expected int"):
        sim.load_scenario(str(p))
    with pytest.raises(UserError, match=r"-o eta=x: field 'eta'"):
        sim.apply_overrides(sim.Scenario(), ["eta=x"])
    for text, field in (("response_length_counts: {0: 5}\n", "response_length_counts"),
                        ("response_length_counts: {a: 5}\n", "response_length_counts"),
                        ("decode_attention: paged\n", "decode_attention"), ("response_strata: -2\n", "response_strata"),
                        ("overlap_train_factor: 0\n", "overlap_train_factor"),
                        ("request_overhead_s: -1\n", "request_overhead_s")):
        p.write_text("name: x\n" + text)
        with pytest.raises(UserError, match=rf"bad\.yaml:2: field '{field}'"):
            sim.load_scenario(str(p))
    p.write_text("gen_gpus: lots\n")
    res = CliRunner().invoke(simulate_cmd, [str(p)])
    assert res.exit_code == 2
    assert "field 'gen_gpus'" in res.output


def test_every_shipped_scenario_loads():
    names = sim.known_scenarios()
    assert {"published-1.5b-16node", "published-7b-24node", "cpu-tiny-arith", "scaling-1.5b-ctx16k"} <= set(names)
    for n in names:
        sc = sim.load_scenario(n)
        assert sc.source.endswith(f"{n}.yaml")
    assert "throughput-tiny-arith" not in names  # `areal bench throughput`'s file in the same folder


def test_published_1p5b_setting_reproduces_the_2p77x_speedup_within_10_percent():
    # shrunk 8x with fewer simulated steps for test speed; `areal bench simulate published-1.5b-16node` runs it full size
    sc = sim.apply_overrides(sim.load_scenario("published-1.5b-16node"), ["sim_steps=18", "warmup_steps=8"])
    sync, asyn = (sim.simulate(sc, m, scale=8) for m in ("sync", "async"))
    ratio = sync["hours"] / asyn["hours"]
    assert ratio == pytest.approx(41.0 / 14.8, rel=0.10)
    assert asyn["trainer_idle_frac"] < sync["trainer_idle_frac"]


def test_command_writes_results_and_plots(tmp_path):
    scen = tmp_path / "s.yaml"
    scen.write_text("name: tiny\ngen_gpus: 4\ntrain_gpus: 4\nbatch_size: 8\ngroup_size: 4\nmax_new_tokens: 1024\n"
                    "response_median_tokens: 200\nsim_steps: 8\nwarmup_steps: 3\n"
                    "published: {sync_hours: 1.0, async_hours: 0.5}\neta_sweep: [0, 1, -1]\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(simulate_cmd, [str(scen), "--out", str(out), "--gpus", "8,16",
                                            "-o", "steps=100"])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "results.json").read_text())
    assert set(data["modes"]) == set(sim.MODES)
    assert data["scenario"]["steps"] == 100
    assert data["published_check"]["published_ratio"] == 2.0
    assert data["scaling"]["gpus"] == [8, 16] and len(data["scaling"]["async"]) == 2
    assert list(data["eta_sweep"]) == ["0", "1", "inf"]
    assert len(data["sensitivity"]["inputs"]) == len(sim.SENSITIVITY_INPUTS)
    for png in ("scaling.png", "sensitivity.png", "staleness.png"):
        assert (out / png).stat().st_size > 1000
    assert sim.load_scenario(str(out / "scenario.yaml")).steps == 100
    assert "published: sync 1.0 h, async 0.5 h = 2.00x" in res.output
    assert "4 generation + 4 training GPUs" in res.output

    # the folder reused by a CPU-core scenario without sweeps: no figure of the first simulation stays beside it
    scen.write_text(scen.read_text().replace("eta_sweep: [0, 1, -1]\n", "device: CPU core\n"))
    res = CliRunner().invoke(simulate_cmd, [str(scen), "--out", str(out), "--gpus", "none", "--no-sensitivity"])
    assert res.exit_code == 0, res.output
    assert not any((out / png).exists() for png in ("scaling.png", "sensitivity.png", "staleness.png"))
    assert "4 generation + 4 training CPU cores" in res.output
    scen.write_text(scen.read_text().replace("device: CPU core\n", "device: '[/]node'\n"))  # text, not markup
    res = CliRunner().invoke(simulate_cmd, [str(scen), "--gpus", "none", "--no-sensitivity"])
    assert res.exit_code == 0 and "4 training [/]nodes" in res.output, res.output
    scen.write_text(scen.read_text().replace("device: '[/]node'\n", "device: '  '\n"))
    res = CliRunner().invoke(simulate_cmd, [str(scen), "--gpus", "none"])
    assert res.exit_code == 2 and "field 'device'" in res.output


@pytest.mark.multiproc
def test_importing_the_command_pulls_in_no_numpy_rich_or_matplotlib():
    code = ("import sys; import areal_cli.commands.bench_simulate; "
            "print([m for m in ('numpy', 'rich', 'matplotlib', 'torch', 'yaml') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_published_7b_setting_predicts_the_2p27x_speedup_within_10_percent_without_fitting():
    """The 7B run is a check, not a fit: its efficiency constants are the 1.5B run's (scenario file), so this can
    fail when the model of step times is wrong (published: 57.7 h synchronous vs 25.4 h asynchronous)."""
    sc = sim.load_scenario("published-7b-24node")
    fitted = sim.load_scenario("published-1.5b-16node")
    for name in ("decode_bw_efficiency", "decode_flops_efficiency", "prefill_flops_efficiency", "train_mfu",
                 "decode_overhead_s", "train_fixed_s"):
        assert getattr(sc, name) == getattr(fitted, name), name  # nothing was tuned to the 7B figure
    sc = sim.apply_overrides(sc, ["sim_steps=18", "warmup_steps=8"])
    sync, asyn = (sim.simulate(sc, m, scale=8) for m in ("sync", "async"))
    assert sync["hours"] / asyn["hours"] == pytest.approx(57.7 / 25.4, rel=0.10)


# ---- the CPU machine: engine step costs, padded decode, per-request overhead, machine constants carried over ----


def _reference_sync_decode(lengths: list[int], prompt: int, max_running: int, a: float, b: float, c: float,
                           padded: bool) -> float:
    """Token-by-token continuous batching of one server, FIFO admission, no prefill cost: the seconds to
    generate ``lengths`` (a decode step costs a + b*n + c*X, X = sum of contexts or n * longest context)."""
    queue, running, t = list(lengths), [], 0.0
    while queue or running:
        while queue and len(running) < max_running:
            running.append([prompt, queue.pop(0)])  # [context, tokens left]
        n = len(running)
        ctx = [r[0] for r in running]
        t += a + b * n + c * (n * max(ctx) if padded else sum(ctx))
        for r in running:
            r[0] += 1
            r[1] -= 1
        running = [r for r in running if r[1] > 0]
    return t


def test_padded_decode_pays_for_the_longest_context_of_a_staggered_batch(tmp_path):
    """Three samples of 40, 40 and 120 tokens (stratified, so every batch has exactly these) on a server that
    runs two at a time: whenever a fresh request decodes beside an old one, the embedded engine pads it to the
    old one's context. The simulated sync step equals a token-by-token reference for the order drawn."""
    (tmp_path / "lengths.txt").write_text("40\n40\n120\n")
    costs = exact_costs(decode_step_per_ctx_token_s=1e-4)
    base = dict(gen_gpus=1, train_gpus=1, batch_size=3, group_size=1, prompt_tokens=10, max_new_tokens=1000,
                response_lengths_file=str(tmp_path / "lengths.txt"), response_strata=3, response_prompt_corr=1.0,
                max_running_per_server=2, sim_steps=6, warmup_steps=2, **costs)
    orders = [[40, 40, 120], [40, 120, 40], [120, 40, 40]]
    for padded in (False, True):
        sc = sim.Scenario(**base, decode_attention="padded" if padded else "sum")
        step = sim.simulate(sc, "sync")["step_s"] - (0.2 + 0.5 + 0.1)  # load, train, save
        refs = [_reference_sync_decode(o, 10, 2, 1e-3, 1e-4, 1e-4, padded) for o in orders]
        # the order of the batch's lengths changes from step to step: the mean lies within the orders' range
        assert min(refs) - 1e-9 <= step <= max(refs) + 1e-9
    pad_refs = [_reference_sync_decode(o, 10, 2, 1e-3, 1e-4, 1e-4, True) for o in orders]
    sum_refs = [_reference_sync_decode(o, 10, 2, 1e-3, 1e-4, 1e-4, False) for o in orders]
    assert pad_refs[0] == pytest.approx(sum_refs[0])  # the two 40s start together: nothing to pad
    assert pad_refs[1] > sum_refs[1] and pad_refs[2] > sum_refs[2]


def test_grouped_decode_splits_where_the_engine_does(tmp_path):
    """The embedded engine now splits a decode batch into groups of similar context lengths when a split saves
    more than MIN_SAVING key slots (areal_cli.rollout.decode_groups). Two requests at a time: a request of 1,200
    tokens that joins beside one already 1,210 tokens in is split off (the sum of the contexts); requests of 40
    tokens beside one at most 130 tokens in are not worth a call (padded to the longest)."""
    def steps(lengths: str) -> dict:
        (tmp_path / "lengths.txt").write_text(lengths)
        base = dict(gen_gpus=1, train_gpus=1, batch_size=4, group_size=1, prompt_tokens=10, max_new_tokens=4000,
                    response_lengths_file=str(tmp_path / "lengths.txt"), response_strata=4, response_prompt_corr=1.0,
                    max_running_per_server=2, sim_steps=6, warmup_steps=2,
                    **exact_costs(decode_step_per_ctx_token_s=1e-5))
        return {m: sim.simulate(sim.Scenario(**base, decode_attention=m), "sync")["step_s"]
                for m in ("sum", "grouped", "padded")}

    far = steps("3000\n1200\n1200\n1200\n")
    assert far["grouped"] == pytest.approx(far["sum"], rel=1e-12) and far["padded"] > 1.1 * far["sum"]
    near = steps("3000\n40\n40\n40\n")
    assert near["grouped"] == pytest.approx(near["padded"], rel=1e-12) and near["padded"] > near["sum"]


def test_a_single_order_of_lengths_matches_the_reference_exactly(tmp_path):
    (tmp_path / "lengths.txt").write_text("30\n90\n")
    for padded in (False, True):
        sc = sim.Scenario(gen_gpus=1, train_gpus=1, batch_size=1, group_size=3, prompt_tokens=10, max_new_tokens=1000,
                          response_lengths_file=str(tmp_path / "lengths.txt"), response_prompt_corr=1.0,
                          max_running_per_server=2, sim_steps=6, warmup_steps=2,
                          decode_attention="padded" if padded else "sum", **exact_costs(decode_step_per_ctx_token_s=1e-4))
        step = sim.simulate(sc, "sync")["step_s"] - 0.8
        # corr 1: every sample of a group has its prompt's length; 30 or 90 per group, each with 3 samples
        refs = [_reference_sync_decode([n] * 3, 10, 2, 1e-3, 1e-4, 1e-4, padded) for n in (30, 90)]
        assert min(refs) - 1e-9 <= step <= max(refs) + 1e-9


def test_stratified_lengths_put_every_stratum_in_every_block():
    sc = sim.Scenario(batch_size=16, group_size=4, response_median_tokens=20, response_sigma=1.5,
                      response_prompt_corr=1.0, response_strata=16, max_new_tokens=10_000)
    from areal_cli.bench.sim.lengths import ResponseLengths

    draw = ResponseLengths(sc, np.random.default_rng(0), None)
    for _ in range(5):
        block = [draw.group() for _ in range(16)]
        assert all(len(set(g)) == 1 for g in block)  # corr 1: a prompt's samples share its length
        qs = sorted(NormalDist().cdf((math.log(g[0]) - math.log(20)) / 1.5) for g in block)
        # one prompt per 1/16 quantile (rounding to whole tokens moves a quantile a little)
        assert all(j / 16 - 0.02 <= q <= (j + 1) / 16 + 0.02 for j, q in enumerate(qs))


def test_request_overhead_blocks_the_server_once_per_admitted_request():
    kw = dict(gen_gpus=1, train_gpus=1, batch_size=1, group_size=4, prompt_tokens=10, max_new_tokens=1000,
              response_median_tokens=100, response_sigma=0.0, sim_steps=6, warmup_steps=2)
    without = sim.simulate(sim.Scenario(**kw, **exact_costs()), "sync")["step_s"]
    with_overhead = sim.simulate(sim.Scenario(**kw, **exact_costs(), request_overhead_s=0.01), "sync")["step_s"]
    assert with_overhead - without == pytest.approx(4 * 0.01, rel=1e-9)


def _sums(rows: list[tuple[int, int, int, float]]) -> dict:
    from areal_cli.rollout.engine.step_costs import StepCostStats

    st = StepCostStats()
    for r in rows:
        st.record(*r)
    return st.to_dict()


def test_engine_step_costs_fit_recovers_the_constants_and_drops_a_negative_one():
    from areal_cli.bench.sim.engine_costs import fit_step_costs, window_sums

    a, b, c, p = 2e-3, 5e-5, 1e-7, 3e-6
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(500):
        n, L, pre = int(rng.integers(1, 64)), int(rng.integers(10, 400)), int(rng.choice([0, 0, 0, 200, 1600]))
        rows.append((n, n * L, pre, a + b * n + c * n * L + p * pre))
    fit = fit_step_costs([_sums(rows[:200]), _sums(rows[200:])])  # two servers' sums add up
    assert fit["steps"] == 500 and fit["r2"] == pytest.approx(1.0)
    for k, v in zip(("decode_step_fixed_s", "decode_step_per_seq_s", "decode_step_per_ctx_token_s",
                     "prefill_s_per_token"), (a, b, c, p)):
        assert fit["coef"][k] == pytest.approx(v, rel=1e-6)
    # a window is the difference of two snapshots
    w = window_sums(_sums(rows[:100]), _sums(rows[:300]))
    assert w["n"] == 200
    assert fit_step_costs([w])["coef"]["decode_step_per_seq_s"] == pytest.approx(b, rel=1e-6)
    # seconds that fall with the context: its coefficient is held at 0, the others refitted
    rows2 = [(n, ctx, pre, max(1e-4, a + b * n - 1e-8 * ctx)) for n, ctx, pre, _ in rows]
    fit2 = fit_step_costs([_sums(rows2)])
    assert fit2["coef"]["decode_step_per_ctx_token_s"] == 0.0 and fit2["coef"]["decode_step_per_seq_s"] > 0
    with pytest.raises(ValueError, match="at least 4"):
        fit_step_costs([_sums(rows[:3])])


def _bench_run(tmp_path: Path, step_costs: dict | None, more_modes: bool = False) -> Path:
    """A made-up `areal bench throughput` result with timelines: sync (eta 0) and async (eta 2) runs (and, with
    ``more_modes``, a non-interruptible run whose publish waits 0.3 s for the drain and an in-place run)."""
    records = json.loads(synthetic_run(tmp_path).read_text())["runs"]
    runs = []
    plan = {"00-sync-r0": ("sync", 0, 1.0), "01-async-r0": ("async", 2, 0.8)}
    if more_modes:
        plan.update({"02-async_noninterruptible-r0": ("async_noninterruptible", 2, 0.9),
                     "03-async_in_place-r0": ("async_in_place", 2, 0.7)})
    for label, (mode, eta, step_s) in plan.items():
        d = tmp_path / "bench" / "runs" / label
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[
            "sync" if mode == "sync" else "async"]["steps"]))
        tl = {"marks": {"step_costs": step_costs}} if step_costs else {"marks": {}}
        tl["steps"] = [{"step": r["step"], "tokens": r["trained_tokens"], "response_lengths": [4] * 100 + [6] * 60}
                       for r in records["sync" if mode == "sync" else "async"]["steps"] if r.get("phase") == "rl"]
        (d / "timeline.json").write_text(json.dumps(tl))
        runs.append({"label": label, "mode": mode, "eta": eta, "interruptible": mode != "async_noninterruptible",
                     "pause_mode": "in_place" if mode == "async_in_place" else "abort", "steps": 12, "dir": str(d),
                     "step_s_mean": step_s * 0.9, "step_seconds": {
                         "wait_s": 0.2, "train_s": 0.45, "publish_s": 0.3 if mode == "async_noninterruptible" else 0.05}})
    results = tmp_path / "bench" / "results.json"
    results.write_text(json.dumps({"runs": runs}))
    return results


def test_calibration_with_engine_step_costs_fits_decode_from_them_and_solves_the_request_overhead(tmp_path):
    a, b = 1e-3, 2e-5  # no context cost
    rows = [(n, n * L, 0, a + b * n) for n in (1, 8, 32, 64, 128, 160) for L in range(20, 40)]
    costs = {"rl_start": {"server0": _sums(rows[:6])}, "rl_end": {"server0": _sums(rows)}}
    base = sim.Scenario(gen_gpus=1, train_gpus=1, batch_size=32, group_size=4, prompt_tokens=20, max_new_tokens=8,
                        response_sigma=0.1, max_concurrent_groups=96, eta=2, decoupled_recompute=False,
                        sim_steps=12, warmup_steps=3, scaling_gpus=[])
    sc, rep = sim.calibrate_from_run(_bench_run(tmp_path, costs), base)
    assert rep["engine_step_costs"]["steps"] == 2 * (len(rows) - 6)  # both runs' RL windows
    assert sc.decode_step_fixed_s == pytest.approx(a, rel=1e-6) and sc.decode_step_per_seq_s == pytest.approx(b, rel=1e-6)
    # what today's engine records: grouped decode attention, a group's samples prefilled once (the model's prompt cache)
    assert sc.decode_attention == "grouped" and sc.prefix_cache is True
    old = {k: {"server0": {f: v for f, v in d["server0"].items() if f not in ("decode_attention", "prefill_sharing", "step_forwards")}}
           for k, d in costs.items()}
    for d in ("old", "more", "mixed", "mixed2"):
        (tmp_path / d).mkdir()
    sc_old = sim.calibrate_from_run(_bench_run(tmp_path / "old", old), base)[0]
    assert sc_old.decode_attention == "padded" and sc_old.prefix_cache is False  # engines before either field
    mixed = {"rl_start": costs["rl_start"], "rl_end": {"server0": costs["rl_end"]["server0"],
                                                       "server1": old["rl_end"]["server0"]}}
    with pytest.raises(UserError, match="grouped and padded"):
        sim.calibrate_from_run(_bench_run(tmp_path / "mixed", mixed), base)
    unshared = {k: {"server0": {**d["server0"], "prefill_sharing": "none"}} for k, d in costs.items()}
    mixed2 = {"rl_start": costs["rl_start"], "rl_end": {"server0": costs["rl_end"]["server0"],
                                                        "server1": unshared["rl_end"]["server0"]}}
    with pytest.raises(UserError, match="shared group prefills"):
        sim.calibrate_from_run(_bench_run(tmp_path / "mixed2", mixed2), base)
    (tmp_path / "mixed3").mkdir()  # session-33 engines: a prefill forward and a decode forward per step
    separate = {k: {"server0": {f: v for f, v in d["server0"].items() if f != "step_forwards"}} for k, d in costs.items()}
    assert sim.calibrate_from_run(_bench_run(tmp_path / "mixed3", separate), base)[0].decode_attention == "grouped"
    (tmp_path / "mixed4").mkdir()
    mixed3 = {"rl_start": costs["rl_start"], "rl_end": {"server0": costs["rl_end"]["server0"],
                                                        "server1": separate["rl_end"]["server0"]}}
    with pytest.raises(UserError, match="one forward per step"):
        sim.calibrate_from_run(_bench_run(tmp_path / "mixed4", mixed3), base)
    # the benchmark's own step phases (evaluations excluded): 0.9 s per sync step, publishing 0.05 s
    assert rep["measured"]["00-sync-r0"]["step_s"] == pytest.approx(0.9) and sc.sync_save_s == pytest.approx(0.05)
    assert sc.trainer_overhead_s == 0.0
    assert sc.request_overhead_s > 0
    assert rep["checks"]["00-sync-r0"]["simulated_step_s"] == pytest.approx(0.9, rel=0.01)
    # the sync run's own response lengths (12 steps of 100 x 4 and 60 x 6 tokens) are its length distribution
    assert sc.response_length_counts == {4: 1200, 6: 720}
    assert sim.length_stats(sc)["p50"] == 4 and sim.length_stats(sc)["mean"] == pytest.approx(4.75, rel=0.01)
    (tmp_path / "fitted.yaml").write_text(sim.scenario_yaml(sc))  # what --out writes, read back
    assert sim.load_scenario(str(tmp_path / "fitted.yaml")).response_length_counts == {4: 1200, 6: 720}
    # the trainer beside generation: the async run's wait (0.2 s for 3,000-4,200 tokens) is the hand-off
    assert rep["trainer_beside_generation"]["handoff_s"] == pytest.approx(0.2)
    assert sc.batch_handoff_s_per_token == pytest.approx(0.2 / rep["trainer_beside_generation"]["tokens_per_step"])
    assert sc.overlap_train_factor == pytest.approx(1.0)  # the same train + publish seconds in both runs
    assert set(rep["ratios"]) == {"async-eta2"}
    # a non-interruptible run's publish holds the drain the model simulates itself: not a slowdown of training
    sc3, rep3 = sim.calibrate_from_run(_bench_run(tmp_path / "more", costs, more_modes=True), base)
    assert sc3.overlap_train_factor == pytest.approx(1.0)
    assert set(rep3["ratios"]) == {"async-eta2", "async_nointerrupt-eta2", "async_inplace-eta2"}
    assert rep3["checks"]["03-async_in_place-r0"]["mode"] == "async_inplace"
    r = rep["ratios"]["async-eta2"]
    assert r["measured"] == pytest.approx(1.0 / 0.8) and r["rel_error"] == pytest.approx(r["simulated"] / r["measured"] - 1)


def test_machine_constants_carry_to_another_workload_and_the_command_checks_a_measured_ratio(tmp_path):
    calibrated = sim.Scenario(decode_step_fixed_s=0.002, decode_step_per_seq_s=1e-5, decode_step_per_ctx_token_s=1e-8,
                              prefill_s_per_token=1e-6, decode_attention="padded", prefix_cache=False,
                              request_overhead_s=3e-4, train_fixed_s=0.05, train_gpu_s_per_token=4e-5,
                              train_gpu_s_per_token_sq=0.0, sync_save_s=0.01, sync_load_s=0.0,
                              decoupled_recompute=False, batch_size=48, response_median_tokens=4.4)
    target = sim.Scenario(name="t", gen_gpus=1, train_gpus=1, batch_size=16, group_size=4, prompt_tokens=15,
                          max_new_tokens=400, response_median_tokens=20, response_sigma=1.5, sim_steps=10,
                          warmup_steps=3, scaling_gpus=[])
    moved = sim.with_machine_of(target, calibrated)
    assert all(getattr(moved, k) == getattr(calibrated, k) for k in sim.MACHINE_FIELDS)
    assert (moved.batch_size, moved.response_median_tokens) == (16, 20)  # the workload stays the target's
    cal_file = tmp_path / "machine.yaml"
    cal_file.write_text(sim.scenario_yaml(calibrated))
    scen = tmp_path / "t.yaml"
    scen.write_text(sim.scenario_yaml(dataclasses.replace(target, published={"async_over_sync": 1.5, "source": "x"})))
    out = tmp_path / "out"
    res = CliRunner().invoke(simulate_cmd, [str(scen), "--costs-from", str(cal_file), "--out", str(out),
                                            "--no-sensitivity", "--gpus", "none"])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "results.json").read_text())
    assert data["costs_from"]["fields"]["request_overhead_s"] == 3e-4
    assert data["scenario"]["decode_attention"] == "padded"
    mc = data["measured_check"]["async_over_sync"]
    pred = data["modes"]["sync"]["step_s"] / data["modes"]["async"]["step_s"]  # steady-state step times
    assert mc["measured"] == 1.5 and mc["predicted"] == pytest.approx(pred)
    assert f"measured async/sync 1.50x, predicted {pred:.2f}x" in res.output
    bad = CliRunner().invoke(simulate_cmd, [str(scen), "--costs-from", str(tmp_path / "missing.yaml")])
    assert bad.exit_code == 2 and "--costs-from" in bad.output and "scenario file not found" in bad.output
    # a scenario that is not a calibrated machine (its costs would come from GPU peak numbers) is refused
    (tmp_path / "empty.yaml").write_text("name: e\n")
    bad = CliRunner().invoke(simulate_cmd, [str(scen), "--costs-from", str(tmp_path / "empty.yaml")])
    assert bad.exit_code == 2 and "not a calibrated machine" in bad.output
    # -o still changes a carried constant (the machine first, then the overrides)
    res = CliRunner().invoke(simulate_cmd, [str(scen), "--costs-from", str(cal_file), "-o", "request_overhead_s=0.5",
                                            "--out", str(tmp_path / "out2"), "--no-sensitivity", "--gpus", "none"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "out2" / "results.json").read_text())["scenario"]["request_overhead_s"] == 0.5


def test_the_tiny_longtail_lengths_file_is_the_tasks_answer_length_distribution():
    from areal_cli.tasks.tiny_longtail import answer_tokens, length_stats, m_quantile

    sc = sim.load_scenario("cpu-tiny-longtail")
    from areal_cli.bench.sim.lengths import load_empirical_lengths

    got = load_empirical_lengths(sc).tolist()
    assert got == [answer_tokens(m_quantile((i + 0.5) / 4096)) for i in range(4096)]
    st = length_stats()
    assert np.median(got) == st["median"] and np.mean(got) == pytest.approx(st["mean"], rel=0.01)
    assert sc.response_strata == 16 and sc.batch_size == 16  # one stratified block per batch, as the task draws


SIM_RESULTS = REPO / "benchmarks" / "results" / "simulate"


def test_the_tiny_longtail_machine_is_what_its_recorded_runs_calibrate_to():
    """The machine constants shipped in both CPU scenario files are the calibration of the recorded tiny-longtail
    runs (measured-runs.json), to the 4 significant digits the files carry: nothing was tuned by hand."""
    fitted, rep = sim.calibrate_from_run(SIM_RESULTS / "cpu-tiny-longtail-deferred-eval-2026-12-03" / "measured-runs.json",
                                         sim.load_scenario("cpu-tiny-longtail"))
    assert rep["engine_step_costs"]["steps"] > 50_000 and rep["engine_step_costs"]["r2"] > 0.8
    # the per-sample overhead was solved so that the simulated sync step is the three sync runs' mean
    syncs = [c for c in rep["checks"].values() if c["mode"] == "sync"]
    mean = sum(c["measured_step_s"] for c in syncs) / len(syncs)
    assert len(syncs) == 3 and syncs[0]["simulated_step_s"] == pytest.approx(mean, rel=0.01)
    for name in ("cpu-tiny-arith", "cpu-tiny-longtail"):
        sc = sim.load_scenario(name)
        for k in sim.MACHINE_FIELDS:
            v, w = getattr(sc, k), getattr(fitted, k)
            assert v == (pytest.approx(w, rel=1e-3) if isinstance(w, float) else w), (name, k)


def test_tiny_arith_async_sync_ratio_is_predicted_within_10_percent_from_the_tiny_longtail_machine():
    """Out of sample: costs measured on tiny-longtail runs (long, heavy-tailed answers, eta 4) predict tiny-arith
    (4-token answers, 48 x 3 samples, eta 2) against its measured ratios (3 seeds, `published` in the file)."""
    sc = sim.load_scenario("cpu-tiny-arith")
    sync, asyn, nonint, inplace = (sim.simulate(sc, m) for m in ("sync", "async", "async_nointerrupt", "async_inplace"))
    pub = sc.published  # steady-state ratios of step times
    assert sync["step_s"] / asyn["step_s"] == pytest.approx(pub["async_over_sync"], rel=0.10)
    assert sync["step_s"] / nonint["step_s"] == pytest.approx(pub["async_noninterruptible_over_sync"], rel=0.10)
    assert sync["step_s"] / inplace["step_s"] == pytest.approx(pub["async_in_place_over_sync"], rel=0.10)
    assert sim.length_stats(sc)["p50"] == 4 and sim.length_stats(sc)["truncated_frac"] == 0  # the task's 4-5 tokens


def test_calibration_without_step_costs_does_not_keep_the_base_scenarios_engine_constants(tmp_path):
    base = dataclasses.replace(sim.load_scenario("cpu-tiny-arith"), batch_size=32, group_size=4, max_concurrent_groups=96,
                               sim_steps=12, warmup_steps=3)
    assert base.request_overhead_s > 0 and base.decode_step_per_seq_s > 0  # the shipped tiny-longtail machine
    sc, rep = sim.calibrate_from_run(synthetic_run(tmp_path), base)
    assert rep["engine_step_costs"] is None
    assert (sc.decode_step_per_seq_s, sc.decode_step_per_ctx_token_s, sc.prefill_s_per_token, sc.request_overhead_s) == (0, 0, 0, 0)
    assert (sc.batch_handoff_s_per_token, sc.overlap_train_factor) == (0.0, 1.0)  # no benchmark phases to read them
    assert rep["checks"]["sync"]["simulated_step_s"] == pytest.approx(1.0, rel=0.01)


def test_calibrating_a_scenario_on_another_workloads_runs_is_refused():
    with pytest.raises(UserError, match=r"the runs train 64 samples per step, the scenario cpu-tiny-arith 48 x 3 = 144"):
        sim.calibrate_from_run(SIM_RESULTS / "cpu-tiny-longtail-deferred-eval-2026-12-03" / "measured-runs.json", sim.load_scenario("cpu-tiny-arith"))


def test_the_sensitivity_sweep_of_a_calibrated_cpu_scenario_perturbs_its_own_costs():
    sc = sim.load_scenario("cpu-tiny-arith")
    inputs = sim.sensitivity_inputs(sc)
    # its explicit costs replace the roofline's physical constants, and its lengths are the task's (empirical)
    assert not {"train_mfu", "decode_bw_efficiency", "weight_io_gb_s", "response_median_tokens"} & set(inputs)
    assert {"request_overhead_s", "decode_step_per_seq_s", "train_gpu_s_per_token", "overlap_train_factor"} <= set(inputs)
    assert sim.sensitivity_inputs(sim.load_scenario("published-1.5b-16node")) == list(sim.SENSITIVITY_INPUTS)
    sens = sim.sensitivity(sc)
    assert set(sens["inputs"]) == set(inputs)
    assert sens["inputs"]["train_gpu_s_per_token"]["max_change"] > 0.01  # the trainer-bound side moves the ratio

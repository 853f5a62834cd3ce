"""Running ``areal bench throughput``: the warm start, the interleaved runs, and the results document.

Runs: one shared supervised warm start (reported separately, excluded from throughput), then for each repeat
the modes sync (eta = ``eta_sync``), async (eta = ``eta_async``) and, optionally, async with
non-interruptible weight updates, in ABBA order (sync, async | async, sync | ...), so that a linear drift of
the machine's speed cancels in the ratios. Every run uses the same recipe + scenario overrides; only eta
(and the interruptible switch, and a scenario's ``sync_overrides`` for the sync runs) differ. The scenario pins
the trainer thread to one core and the rollout side (server, controller, reward workers) to the other.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable

from areal_cli.bench.cpu_time import BUSY_CORES, cpu_sample, cpu_use_between
from areal_cli.bench.runs import (PER_RUN_THROUGHPUT, RUN_CHECK_ITEMS, check_out_dir, cpu_overrides, located, machine_description,
                                  output_to, override_items, refuse_per_run_overrides,
                                  refuse_per_run_scenario_overrides, shared_warm_start)
from areal_cli.bench.throughput.analysis import (accuracy_comparison, aggregate_modes, decompose_ratio, headline,
                                                 overlap_ceiling, paired_ratio, steady_state, summarize_run,
                                                 time_to_accuracy)
from areal_cli.bench.throughput.generation import compare_generation
from areal_cli.bench.throughput.scenario import MODES, PAUSE_MODE, Scenario, run_plan
from areal_cli.foundations.errors import UserError

SCHEMA = "areal.bench.throughput/1"
#: What a mode of the plan sets (``describe_plan``): a scenario's overrides may not.
MODE_KEYS = ("rollout.interruptible", "rollout.pause_mode")
TARGETS = {"async_over_sync": 1.8, "continuous_over_static": 1.5}


def _run_cfg(scenario: Scenario, extra_overrides: list[str], items: list[str], *, sync: bool = False):
    from areal_cli.config import apply_overrides
    from areal_cli.recipes import load_train_config

    cfg, _ = load_train_config(scenario.recipe)
    ov = override_items(scenario.overrides) + (override_items(scenario.sync_overrides) if sync else [])
    try:
        return apply_overrides(cfg, ov + list(extra_overrides) + items, source=f"{scenario.source} overrides / -o")
    except UserError as e:
        sections = {"overrides": scenario.overrides, **({"sync_overrides": scenario.sync_overrides} if sync else {})}
        raise located(e, sections, scenario.locations) from None



def check_configs(scenario: Scenario, extra: list[str], out: Path | None = None):
    """Build the asynchronous and the synchronous runs' configuration with ``extra`` overrides, so that a bad
    recipe, override or cpu list, a cpu this process may not use, a run that cannot start here (the checks of
    :func:`areal_cli.train_loop.preflight`: a GPU recipe's engine or model) or an ``out`` folder the run would
    refuse fails before any work (also in ``--dry-run``). Returns the base config.

    Raises:
        UserError: one line naming the scenario field, ``-o`` item or ``out`` (a file, or holding a benchmark).
    """
    from areal_cli.train_loop.processes import check_cpus

    if out is not None:
        check_out_dir(out)
    refuse_per_run_overrides(extra, PER_RUN_THROUGHPUT)
    # (the scenario may set the other per-run keys for its warm start, e.g. sft.max_steps; not the update mode)
    refuse_per_run_scenario_overrides(scenario, {k: PER_RUN_THROUGHPUT[k] for k in (*MODE_KEYS, "loop.eval_deferred")})
    cpu_items = cpu_overrides(scenario.cpus)
    base_cfg = _run_cfg(scenario, extra, cpu_items)
    for sync in (False, True):  # as every run is configured (what conflicts with deferred evaluations fails here)
        _run_cfg(scenario, extra, cpu_items + RUN_CHECK_ITEMS, sync=sync)
    check_cpus(base_cfg)  # cpus this process may use, before a warm start is written into --out
    from areal_cli.train_loop import preflight

    preflight(base_cfg)  # what the warm start would refuse (no model here, a GPU engine's package missing, ...)
    return base_cfg


def describe_plan(scenario: Scenario, base_seed: int) -> list[dict]:
    """The runs :func:`run_benchmark` makes, in order: ``{"label", "mode", "repeat", "eta", "interruptible",
    "pause_mode", "seed"}`` each (the labels of the run folders under ``DIR/runs/``)."""
    plan = []
    for i, (rep, mode) in enumerate(run_plan(scenario)):
        plan.append({"label": f"{i:02d}-{mode}-r{rep}", "mode": mode, "repeat": rep,
                     "eta": scenario.eta_sync if mode == "sync" else scenario.eta_async,
                     "interruptible": mode != "async_noninterruptible",
                     "pause_mode": PAUSE_MODE.get(mode, "abort"),
                     "seed": base_seed + (rep if scenario.seed_per_repeat else 0)})
    return plan


def run_config(scenario: Scenario, extra: list[str], run: dict, warm_weights: Path):
    """The configuration of one run of :func:`describe_plan` (``run``): the recipe with the scenario's overrides,
    ``extra`` (``-o``), the scenario's cpus, the run's seed, eta and update mode, starting from ``warm_weights``.

    Raises:
        UserError: a bad override (located in the scenario file).
    """
    items = cpu_overrides(scenario.cpus) + [
        f"seed={run['seed']}", f"model.path={warm_weights.resolve()}", "sft.max_steps=0",
        f"loop.max_steps={scenario.steps}", f"loop.eval_every={scenario.accuracy_every or scenario.steps}",
        *RUN_CHECK_ITEMS, f"rollout.max_head_offpolicyness={run['eta']}",
        f"rollout.interruptible={'true' if run['interruptible'] else 'false'}", f"rollout.pause_mode={run['pause_mode']}"]
    return _run_cfg(scenario, extra, items, sync=run["mode"] == "sync")


def run_benchmark(scenario: Scenario, out: Path, *, extra_overrides: list[str] | None = None,
                  log: Callable[[str], None] = print) -> dict:
    """Run ``scenario`` into ``out``: warm start, interleaved runs, generate comparison, results.json, plots.

    Args:
        extra_overrides: ``key=value`` recipe overrides after the scenario's (e.g. from ``-o``).
        log: receives one line per finished phase.
    Returns:
        the results dict (also ``out/results.json``).
    Raises:
        UserError: ``out`` already holds results, bad recipe/overrides, unavailable cpus.
    """
    from areal_cli.foundations.atomic import write_json_atomic
    from areal_cli.bench.throughput.plots import (plot_accuracy_curves, plot_decomposition, plot_throughput_bars,
                                                  plot_timelines)
    from areal_cli.train_loop import run_training

    extra = list(extra_overrides or [])
    base_cfg = check_configs(scenario, extra, out)  # validates everything before any work
    cpu_items = cpu_overrides(scenario.cpus)
    out.mkdir(parents=True, exist_ok=True)
    machine = {"start": machine_description()}
    t_bench = time.monotonic()

    # 1. one supervised warm start, shared by every run
    warm = shared_warm_start(_run_cfg(scenario, extra, cpu_items + ["loop.max_steps=0"]), out, log, scenario.recipe)

    # 2. interleaved runs
    runs: list[dict] = []
    timelines: dict[str, dict] = {}
    for run in describe_plan(scenario, base_cfg.seed):
        label, mode, rep, eta, interruptible, seed = (run[k] for k in ("label", "mode", "repeat", "eta",
                                                                       "interruptible", "seed"))
        cfg = run_config(scenario, extra, run, Path(warm["weights"]))
        run_dir = out / "runs" / label
        before = cpu_sample()
        with output_to(out / "runs" / f"{label}.console.log"):
            summary = run_training(cfg, run_dir, live=False, record_timeline=True)
        cpu = cpu_use_between(before, cpu_sample())
        tl = json.loads((run_dir / "timeline.json").read_text())
        r = summarize_run(tl, summary, label=label, mode=mode, repeat=rep, eta=eta, interruptible=interruptible,
                          eval_n_prompts=cfg.loop.eval_n_prompts)
        r["seed"], r["dir"], r["pause_mode"], r["machine_cpu"] = seed, str(run_dir), run["pause_mode"], cpu
        runs.append(r)
        timelines.setdefault(mode, tl)  # the first run of each mode is plotted
        log(f"{label}: {r['effective_tokens_per_s']:.0f} tok/s effective, {r['step_s_mean']:.3f} s per step, "
            f"{r['rl_seconds']:.1f} s for "
            f"{r['steps']} steps, seed {seed}, accuracy {r['final_accuracy']:.3f}, idle trainer {r['idle'].get('trainer', 0):.2f} "
            f"server {r['idle'].get('server0', 0):.2f}"
            + (f"; BUSY MACHINE: other processes {cpu['other_cores']:.2f} cores, steal {cpu['steal_cores']:.2f}"
               if cpu and cpu["busy"] else ""))

    # 3. continuous batching vs static generate
    gen = None
    if scenario.generate_compare:
        log("continuous batching vs HF static generate")
        gen = compare_generation(Path(warm['weights']), cpus=scenario.cpus["server"], **scenario.generate_compare)
        log(f"embedded server {gen['embedded_server']['tokens_per_s']:.0f} tok/s vs HF static batch "
            f"{gen['hf_static_batch']['tokens_per_s']:.0f} tok/s: {gen['continuous_over_static']:.2f}x")

    machine["end"] = machine_description()
    results = build_results(scenario, runs, warm=warm, generate=gen, machine=machine, extra_overrides=extra,
                            recipe_config=base_cfg.to_dict(), seconds=time.monotonic() - t_bench)
    plot_timelines([(m, timelines[m]) for m in MODES if m in timelines], out / results["plots"]["timeline"])
    plot_throughput_bars(results, out / results["plots"]["throughput"])
    if results["plots"].get("accuracy"):
        plot_accuracy_curves(results, out / results["plots"]["accuracy"])
    if results["plots"].get("decomposition"):
        plot_decomposition(results, [(m, timelines[m]) for m in MODES if m in timelines],
                           out / results["plots"]["decomposition"])
    write_json_atomic(out / "results.json", results)
    return results


def machine_cpu(runs: list[dict]) -> dict | None:
    """What else used the machine during the runs (:mod:`areal_cli.bench.cpu_time`): the most cores other processes
    and the hypervisor's steal took during one run, the runs where either passed ``BUSY_CORES``, and ``busy``.
    None when no run carries the figures (not Linux, or results of older versions)."""
    rs = [r for r in runs if r.get("machine_cpu")]
    if not rs:
        return None
    busy = [r["label"] for r in rs if r["machine_cpu"]["busy"]]
    return {"max_other_cores": max(r["machine_cpu"]["other_cores"] for r in rs),
            "max_steal_cores": max(r["machine_cpu"]["steal_cores"] for r in rs),
            "busy_cores": BUSY_CORES, "busy_runs": busy, "busy": bool(busy)}


def build_results(scenario: Scenario, runs: list[dict], *, warm: dict, generate: dict | None, machine: dict,
                  extra_overrides: list[str], recipe_config: dict, seconds: float) -> dict:
    """The ``results.json`` document (schema :data:`SCHEMA`) from the per-run figures of :func:`summarize_run`.

    Top-level keys: schema, created, command, machine, scenario, extra_overrides, recipe_config, definitions,
    warm_start, runs, modes (:func:`aggregate_modes`), ratios (``async_over_sync``,
    ``async_over_sync_generation``, ``interruptible_over_noninterruptible``: :func:`paired_ratio` or None),
    accuracy (:func:`accuracy_comparison`), generate (:func:`compare_generation` or None), targets (with
    ``reached``), plots, bench_seconds.
    """
    ratios = {"async_over_sync": paired_ratio(runs, "async", "sync"),
              "async_over_sync_generation": paired_ratio(runs, "async", "sync", "generation_tokens_per_s"),
              "interruptible_over_noninterruptible": paired_ratio(runs, "async", "async_noninterruptible"),
              "interruptible_over_noninterruptible_generation": paired_ratio(runs, "async", "async_noninterruptible",
                                                                             "generation_tokens_per_s")}
    accuracy = accuracy_comparison(runs)
    tta = time_to_accuracy(runs)
    in_place = None
    if any(r["mode"] == "async_in_place" for r in runs):  # the same figures for in-place updates
        in_place = {"over_sync": paired_ratio(runs, "async_in_place", "sync"),
                    "over_sync_generation": paired_ratio(runs, "async_in_place", "sync", "generation_tokens_per_s"),
                    "over_abort": paired_ratio(runs, "async_in_place", "async"),
                    "over_abort_generation": paired_ratio(runs, "async_in_place", "async", "generation_tokens_per_s"),
                    "accuracy": accuracy_comparison(runs, "async_in_place"),
                    "time_to_accuracy": time_to_accuracy(runs, "async_in_place"),
                    "decomposition": decompose_ratio(runs, async_mode="async_in_place")}
    ceiling = overlap_ceiling(runs)
    if ceiling and ratios["async_over_sync"]:
        ceiling["async_over_sync_fraction_of_ceiling"] = ratios["async_over_sync"]["mean"] / ceiling["ceiling"]["mean"]
    target = getattr(scenario, "target_async_over_sync", TARGETS["async_over_sync"])
    reached = {
        "async_over_sync_time_to_equal_accuracy": bool(tta and tta["mean_curve_ratio"]
                                                       and tta["mean_curve_ratio"] >= target),
        "async_over_sync": bool(ratios["async_over_sync"] and ratios["async_over_sync"]["mean"] >= target
                                and accuracy and accuracy["equal_within_noise"]),
        "continuous_over_static": bool(generate and generate["continuous_over_static"] >= TARGETS["continuous_over_static"]),
    }
    if in_place:
        ip_tta, ip_acc = in_place["time_to_accuracy"], in_place["accuracy"]
        reached["async_in_place_over_sync"] = bool(in_place["over_sync"] and in_place["over_sync"]["mean"] >= target
                                                   and ip_acc and ip_acc["equal_within_noise"])
        reached["async_in_place_over_sync_time_to_equal_accuracy"] = bool(
            ip_tta and ip_tta["mean_curve_ratio"] and ip_tta["mean_curve_ratio"] >= target)
    argv = sys.argv[1:]
    return {
        "schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["areal", *argv]) if argv[:2] == ["bench", "throughput"] else None,
        "machine": machine, "scenario": scenario.to_dict(), "extra_overrides": list(extra_overrides),
        "recipe_config": dict(recipe_config),
        "definitions": {
            "effective_tokens_per_s": "prompt+response tokens of trained samples / RL seconds (warm start and "
                                      "held-out evaluations excluded)",
            "generation_tokens_per_s": "all tokens the servers generated / RL wall seconds",
            "idle": "fraction of the RL window: trainer waiting for a batch; server with nothing in flight and no update",
            "staleness": "trained samples by versions between their first token and the training step",
            "overlap_ceiling": "(G + T + P) / max(G, T + P) from the sync runs' mean step phases: wait for the "
                               "batch G, train T, publish P; the most any overlap could gain",
            "time_to_accuracy": "RL seconds (evaluations excluded) to first reach the lower of the two modes' mean "
                                "final accuracies; mean_curve_ratio = sync / async time of the seed-averaged curves "
                                "(interpolated between evaluations), ratio = per-run times paired per repeat",
            "decomposition": "sync step = G + T + P; S = straggler seconds of G (per sync batch: span of its "
                             "requests minus their mean duration = integral of (1 - n(t)/N) dt, n(t) requests in "
                             "flight of N); G_full = G - S; overlap = (G_full+T+P)/max(G_full,T+P); straggler = "
                             "(G+T+P)/(G_full+T+P); ceiling = overlap x straggler; measured.step_rate = sync/async "
                             "RL seconds per step, measured.effective = async/sync effective throughput",
            "in_place": "the mode async_in_place (interruptible updates that pause the servers in place: in-flight "
                        "samples keep their KV cache) against sync (over_sync) and against aborting updates "
                        "(over_abort), with its accuracy comparison, time to accuracy and decomposition; null when "
                        "the mode did not run",
            "machine_cpu": "per run (runs[].machine_cpu) and over the runs: cores used by this benchmark's processes, "
                           "by other processes and by the hypervisor (steal) during each run; busy when either of the "
                           "last two passed busy_cores",
            "headline": "per async mode: async/sync effective throughput paired per repeat over the whole RL loop, "
                        "the median over the pairs with their range, and that median over the overlap ceiling",
            "steady_state": "the overlap ceiling and sync/async step-time ratios (paired per repeat) over each run's "
                            "steady-state steps: the first step (it fills the pipeline) and the steps right after a "
                            "held-out evaluation (their batch was generated during it) left out; what a long run "
                            "converges to, and what `areal bench simulate` predicts; steady is false when the "
                            "machine's drift dominates (the sync runs' training phase T varied by more than "
                            "drift.threshold of its median within the bench)",
        },
        "warm_start": warm, "runs": runs, "modes": aggregate_modes(runs), "ratios": ratios, "accuracy": accuracy,
        "time_to_accuracy": tta, "in_place": in_place, "overlap_ceiling": ceiling, "headline": headline(runs, ceiling),
        "machine_cpu": machine_cpu(runs),
        "steady_state": steady_state(runs),
        "decomposition": decompose_ratio(runs),
        "generate": generate, "targets": {**TARGETS, "async_over_sync": target, "reached": reached},
        "plots": {"timeline": "timeline.png", "throughput": "throughput.png",
                  **({"accuracy": "accuracy.png"} if any(r.get("accuracy_curve") for r in runs) else {}),
                  **({"decomposition": "decomposition.png"} if any(r.get("occupancy") for r in runs) else {})},
        "bench_seconds": seconds,
    }


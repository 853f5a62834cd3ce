"""The figures of ``areal bench staleness``: one run's accuracy curve and realised staleness, the grid's cells
(accuracy spread over seeds, time to the target accuracy), and the results document."""

from __future__ import annotations

import statistics
import sys
import time

from areal_cli.bench.staleness.scenario import SYNC, Scenario
from areal_cli.bench.throughput.accounting import effective_throughput
from areal_cli.bench.throughput.analysis import first_crossing, mean_accuracy_curve, run_curve, spread

SCHEMA = "areal.bench.staleness/1"

#: AReaL v0.3 blog, Table 3 (R1-Distill-Qwen-1.5B, AIME24): eta -> (naive PPO, decoupled PPO); eta 0 is sync.
PUBLISHED_AIME24 = {0: (42.0, None), 1: (41.8, 42.1), 2: (40.0, 41.8), 4: (23.3, 42.2), 8: (35.7, 41.0),
                    16: (35.8, 38.7)}


def summarize_run(timeline: dict, metrics: list[dict], summary: dict, *, label: str, variant: str, eta: int,
                  repeat: int, seed: int) -> dict:
    """One run's figures (a ``runs[]`` entry of results.json) from its timeline.json, metrics.jsonl lines and
    summary.json: accuracy curve against RL seconds (:func:`areal_cli.bench.throughput.step_durations`; the runs
    defer their evaluations to after the loop), final and best accuracy, realised staleness, off-policy statistics."""
    steps = timeline["steps"]
    rl_start = timeline["marks"]["rl_start"]
    curve, durations, rl, hist = run_curve(timeline, metrics)
    n = sum(hist.values())

    def mean_of(key: str) -> float | None:
        vals = [m[key] for m in rl if isinstance(m.get(key), (int, float)) and not isinstance(m.get(key), bool)]
        return statistics.fmean(vals) if vals else None

    accs = [c[2] for c in curve]
    eff = effective_throughput(steps, rl_start)
    return {
        "label": label, "variant": variant, "eta": eta, "repeat": repeat, "seed": seed, "steps": len(steps),
        "final_accuracy": summary.get("final_accuracy"), "max_accuracy": max(accs) if accs else None,
        "accuracy_curve": curve, "rl_seconds": round(sum(durations), 4),
        "effective_tokens_per_s": eff["tokens_per_s"],
        "staleness_hist": dict(sorted(hist.items())),
        "staleness_mean": sum(k * v for k, v in hist.items()) / n if n else 0.0,
        "staleness_max": max(hist, default=0),
        "off_policy": {k: mean_of(k) for k in ("iw_capped_frac", "iw_truncated_frac", "clip_frac", "iw_p99",
                                                "iw_min")},
        "truncated_frac": mean_of("truncated_frac"),
        "groups_dropped_stale": summary.get("controller", {}).get("groups_dropped_stale", 0),
    }


def _spread(values: list[float]) -> dict[str, float] | None:
    return spread(values) if values else None


def aggregate(runs: list[dict], target: float | None = None) -> dict:
    """The grid's figures: ``{"target_accuracy", "target_source", "cells": {variant: {eta: cell}}}`` where a
    cell holds the spread of final and best accuracy over seeds, the seed-averaged accuracy curve, the RL seconds
    at which that curve first reaches the target (interpolated; None when it never does), the runs that reached
    it on their own, the mean realised staleness and the mean off-policy statistics. The eta-0 (``sync``) cell
    is listed under every variant. ``target`` None: the sync runs' mean final accuracy."""
    sync = [r for r in runs if r["variant"] == SYNC]
    source = "scenario target_accuracy"
    if target is None:
        finals = [r["final_accuracy"] for r in sync if r["final_accuracy"] is not None]
        target = statistics.fmean(finals) if finals else None
        source = "mean final accuracy of the synchronous runs (eta 0)"
    variants = [v for v in dict.fromkeys(r["variant"] for r in runs) if v != SYNC]
    cells: dict[str, dict[int, dict]] = {}

    def cell(rs: list[dict]) -> dict:
        curve = mean_accuracy_curve(rs)
        reached = [first_crossing(r["accuracy_curve"], target, interpolate=False) for r in rs] if target else []
        off = {k: _mean([r["off_policy"].get(k) for r in rs]) for k in rs[0]["off_policy"]}
        return {
            "runs": len(rs), "final_accuracy": _spread([r["final_accuracy"] for r in rs
                                                        if r["final_accuracy"] is not None]),
            "max_accuracy": _spread([r["max_accuracy"] for r in rs if r["max_accuracy"] is not None]),
            "mean_curve": curve,
            "time_to_target_s": first_crossing(curve, target) if (curve and target) else None,
            "runs_reached_target": sum(x is not None for x in reached),
            "staleness_mean": statistics.fmean(r["staleness_mean"] for r in rs),
            "rl_seconds": statistics.fmean(r["rl_seconds"] for r in rs),
            "effective_tokens_per_s": statistics.fmean(r["effective_tokens_per_s"] for r in rs),
            "off_policy": off,
        }

    sync_cell = cell(sync) if sync else None
    for v in variants:
        cells[v] = {}
        if sync_cell is not None:
            cells[v][0] = sync_cell
        for eta in sorted({r["eta"] for r in runs if r["variant"] == v}):
            cells[v][eta] = cell([r for r in runs if r["variant"] == v and r["eta"] == eta])
    return {"target_accuracy": target, "target_source": source, "cells": cells}


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.fmean(vals) if vals else None


def build_results(scenario: Scenario, runs: list[dict], *, warm: dict, machine: dict, extra_overrides: list[str],
                  recipe_config: dict, seconds: float) -> dict:
    """The ``results.json`` document (schema :data:`SCHEMA`)."""
    argv = sys.argv[1:]
    return {
        "schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["areal", *argv]) if argv[:2] == ["bench", "staleness"] else None,
        "machine": machine, "scenario": scenario.to_dict(), "extra_overrides": list(extra_overrides),
        "recipe_config": dict(recipe_config),
        "definitions": {
            "final_accuracy": "held-out greedy accuracy after the last RL step (the task's fixed held-out prompts)",
            "time_to_target_s": "RL seconds (the runs evaluate after their RL loop, "
                                "loop.eval_deferred, from the weights kept at each evaluation step) at which the seed-averaged accuracy curve first reaches the "
                                "target, interpolated between evaluations",
            "staleness_mean": "mean over trained samples of (training step's version - version of the sample's "
                              "first token)",
            "sync": "eta = 0: one run per seed stands for every variant (all weights are 1; standard PPO)",
        },
        "warm_start": warm, "runs": runs, "grid": aggregate(runs, scenario.target_accuracy),
        "published_reference": {"source": "AReaL v0.3 blog, Table 3 (R1-Distill-Qwen-1.5B, AIME24)",
                                "eta: [naive PPO, decoupled PPO]": {str(k): list(v) for k, v in
                                                                    PUBLISHED_AIME24.items()}},
        "plots": {"staleness": "staleness.png"}, "table": "table.md", "bench_seconds": seconds,
    }


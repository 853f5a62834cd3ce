"""``areal bench staleness``: the staleness ablation (AReaL v0.3 blog, Table 3) on this machine.

AReaL trained R1-Distill-Qwen-1.5B with the maximum staleness eta in {0, 1, 2, 4, 8, 16, inf}, once with naive PPO
(the behaviour policy as the proximal one) and once with the decoupled PPO loss: AIME24 at eta 4 fell to 23.3 with
naive PPO and stayed at 42.2 with the decoupled loss. This benchmark runs the same grid on a built-in task (default
``tiny-longtail``, whose long tail makes the asynchronous pipeline run eta batches ahead of the trainer, so the
samples really are about eta versions old) and reports, per variant and eta:

- **final held-out accuracy** (greedy, the task's fixed held-out prompts) after the same number of RL steps,
  mean and spread over seeds;
- **time to target**: RL seconds (held-out evaluations excluded; the step after an evaluation imputed, as in
  ``areal bench throughput`` with ``impute_post_eval_steps``) until the seed-averaged accuracy curve first reaches
  the target (the scenario's ``target_accuracy``, or by default the synchronous runs' mean final accuracy);
- **realised staleness**: mean versions between a trained sample's first token and the step that trains it
  (AReaL's head off-policyness), and the off-policy statistics of the loss (``iw_capped_frac``, ``clip_frac``,
  ``iw_truncated_frac``) averaged over steps.

Variants (:data:`VARIANTS`; a scenario may also define its own as ``{name: {recipe field: value}}``):

=============================  =====================================================================================
``naive``                      proximal := behaviour (``recompute_proximal: false``): standard PPO on stale data
``decoupled``                  decoupled PPO, AReaL's correction: tokens with pi_prox/pi_behav above the cap masked
``decoupled-none``             decoupled PPO without any behaviour-weight correction (``behav_imp_weight_mode:
                               disabled``): what the proximal policy alone buys
``decoupled-token_truncate``   the weight truncated at the cap (TIS) instead of masked
``decoupled-sequence_mask``    one weight per sequence (geometric mean), sequences above the cap masked (MIS)
``decoupled-sequence_truncate`` the per-sequence weight truncated at the cap
``decoupled-icepop``           token mask with IcePop's lower bound 0.5 as well
=============================  =====================================================================================

With eta = 0 every variant is the same algorithm (every token comes from the policy being trained, so the
proximal policy is the behaviour policy and every weight is 1): one synchronous run per seed stands for all of
them (standard PPO: no proximal pass).

Runs share one supervised warm start (excluded from every time) and the split of the cores of ``areal bench
throughput`` (trainer on one core, rollout server + controller process on the other); repeat r uses seed
``recipe seed + r``. Writes ``DIR/results.json``, ``DIR/table.md``, ``DIR/staleness.png`` and one folder per run
under ``DIR/runs/``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from areal_cli.errors import UserError
from areal_cli.typed_yaml import LineDict, read_yaml

SCHEMA = "areal.bench.staleness/1"

#: Built-in variants: recipe overrides on top of the scenario's (eta = 0 runs once, as ``sync``).
VARIANTS: dict[str, dict[str, Any]] = {
    "naive": {"recompute_proximal": False},
    "decoupled": {"recompute_proximal": True, "behav_imp_weight_mode": "token_mask", "behav_imp_weight_lower": 0.0},
    "decoupled-none": {"recompute_proximal": True, "behav_imp_weight_mode": "disabled", "behav_imp_weight_lower": 0.0},
    "decoupled-token_truncate": {"recompute_proximal": True, "behav_imp_weight_mode": "token_truncate",
                                 "behav_imp_weight_lower": 0.0},
    "decoupled-sequence_mask": {"recompute_proximal": True, "behav_imp_weight_mode": "sequence_mask",
                                "behav_imp_weight_lower": 0.0},
    "decoupled-sequence_truncate": {"recompute_proximal": True, "behav_imp_weight_mode": "sequence_truncate",
                                    "behav_imp_weight_lower": 0.0},
    "decoupled-icepop": {"recompute_proximal": True, "behav_imp_weight_mode": "token_mask",
                         "behav_imp_weight_lower": 0.5},
}
#: The synchronous run (eta = 0) every variant shares.
SYNC = "sync"
SYNC_OVERRIDES = {"recompute_proximal": False}

#: AReaL v0.3 blog, Table 3 (R1-Distill-Qwen-1.5B, AIME24): eta -> (naive PPO, decoupled PPO); eta 0 is sync.
PUBLISHED_AIME24 = {0: (42.0, None), 1: (41.8, 42.1), 2: (40.0, 41.8), 4: (23.3, 42.2), 8: (35.7, 41.0),
                    16: (35.8, 38.7)}

DEFAULT_SCENARIO: dict[str, Any] = {
    "name": "staleness-tiny-longtail",
    "recipe": "tiny-longtail",
    "etas": [0, 1, 2, 4, 8, 16],
    "variants": ["decoupled", "naive", "decoupled-none"],
    "steps": 40,
    "seeds": 2,
    "accuracy_every": 5,
    "target_accuracy": None,
    "cpus": {"trainer": "0", "server": "1", "controller": "1"},
    "overrides": {"success_rate_lb": 0.0, "success_rate_ub": 1.0, "rollout_process": True,
                  "stale_groups": "train"},
}


@dataclass
class Scenario:
    """One staleness ablation.

    Attributes:
        recipe: recipe name or path (a built-in task; default ``tiny-longtail``).
        etas: ``max_head_offpolicyness`` values; 0 runs once per seed (the synchronous baseline).
        variants: ``{name: recipe overrides}`` of the loss variants (names of :data:`VARIANTS`, or your own).
        steps: RL steps per run (no early stop).
        seeds: runs per grid point; repeat r uses seed ``recipe seed + r``.
        accuracy_every: held-out accuracy every this many steps (the curve for the time to target).
        target_accuracy: accuracy of the time-to-target figure; None = the eta-0 runs' mean final accuracy.
        cpus: ``trainer`` / ``server`` / ``controller`` cpu lists ("" = no pinning).
        overrides: recipe fields for every run (and the warm start).
    """

    name: str
    recipe: str
    etas: list[int]
    variants: dict[str, dict[str, Any]]
    steps: int
    seeds: int
    accuracy_every: int
    target_accuracy: float | None
    cpus: dict[str, str]
    overrides: dict[str, Any]
    source: str = "built-in"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def n_runs(self) -> int:
        """Runs of the grid: per seed, one eta-0 run and one per (eta > 0, variant)."""
        return self.seeds * ((0 in self.etas) + len([e for e in self.etas if e > 0]) * len(self.variants))


def _scenario_from_dict(data: Any, where: Callable[[str], str]) -> Scenario:
    if not isinstance(data, dict):
        raise UserError(f"{where('')}: a scenario must be a mapping")
    known = {f.name for f in dataclasses.fields(Scenario)} - {"source"}
    for k in data:
        if k not in known:
            raise UserError(f"{where(k)}: field '{k}': unknown key (known: {', '.join(sorted(known))})")
    merged = {**DEFAULT_SCENARIO, **data}

    def bad(key: str, why: str) -> UserError:
        return UserError(f"{where(key)}: field '{key}': expected {why}, got {merged[key]!r}")

    def need_int(key: str, lo: int) -> int:
        v = merged[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise bad(key, f"an int >= {lo}")
        return v

    name = merged["name"]
    if not isinstance(name, str) or not name:
        raise bad("name", "a name")
    recipe = merged["recipe"]
    if not isinstance(recipe, str) or not recipe:
        raise bad("recipe", "a recipe name or path")
    etas = merged["etas"]
    if not isinstance(etas, list) or not etas or any(isinstance(e, bool) or not isinstance(e, int) or e < 0
                                                     for e in etas) or len(set(etas)) != len(etas):
        raise bad("etas", "a list of distinct ints >= 0")
    raw = merged["variants"]
    variants: dict[str, dict[str, Any]] = {}
    if isinstance(raw, list) and raw and all(isinstance(v, str) for v in raw):
        for v in raw:
            if v not in VARIANTS:
                raise UserError(f"{where('variants')}: field 'variants': unknown variant '{v}' (built in: "
                                f"{', '.join(VARIANTS)}; or a mapping name -> recipe overrides)")
            variants[v] = dict(VARIANTS[v])
    elif isinstance(raw, dict) and raw:
        for k, v in raw.items():
            if not isinstance(k, str) or k == SYNC or not (v is None or isinstance(v, dict)):
                raise bad("variants", f"a mapping of names (not '{SYNC}') to recipe overrides")
            variants[k] = dict(VARIANTS.get(k, {})) if v is None else dict(v)
    else:
        raise bad("variants", "a list of variant names or a mapping name -> recipe overrides")
    if len(set(variants)) != len(variants):
        raise bad("variants", "distinct names")
    steps = need_int("steps", 1)
    seeds = need_int("seeds", 1)
    acc_every = need_int("accuracy_every", 1)
    target = merged["target_accuracy"]
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                               or not 0 < target <= 1):
        raise bad("target_accuracy", "a fraction in (0, 1] or null")
    cpus = merged["cpus"]
    if not isinstance(cpus, dict) or any(k not in ("trainer", "server", "controller") or isinstance(v, bool)
                                         or not isinstance(v, (str, int)) for k, v in cpus.items()):
        raise bad("cpus", "keys trainer/server/controller with cpu lists")
    cpus = {k: str(cpus.get(k, "")) for k in ("trainer", "server", "controller")}
    overrides = merged["overrides"]
    if not isinstance(overrides, dict):
        raise bad("overrides", "a mapping of recipe fields")
    return Scenario(name, recipe, list(etas), variants, steps, seeds, acc_every,
                    None if target is None else float(target), cpus, dict(overrides))


def load_scenario(path: str | Path) -> Scenario:
    """Read a staleness scenario YAML (keys of :class:`Scenario`; missing keys take :data:`DEFAULT_SCENARIO`'s
    values); a bare name is looked up in the shipped scenarios.

    Raises:
        UserError: unreadable file, invalid YAML, unknown key or bad value (``file:line: field 'x': ...``).
    """
    from areal_cli.bench.throughput import resolve_scenario_path

    p = resolve_scenario_path(path)
    data = read_yaml(p, "scenario")
    lines = dict(data.lines) if isinstance(data, LineDict) else {}
    sc = _scenario_from_dict(data if data is not None else {}, lambda k: f"{p}:{lines.get(k, 1)}")
    sc.source = str(p)
    return sc


def default_scenario() -> Scenario:
    """The built-in scenario (``benchmarks/scenarios/staleness-tiny-longtail.yaml`` holds the same values)."""
    return _scenario_from_dict(json.loads(json.dumps(DEFAULT_SCENARIO)), lambda k: "built-in scenario")


def run_plan(scenario: Scenario) -> list[tuple[int, int, str]]:
    """``(repeat, eta, variant)`` in execution order: per repeat, eta ascending (eta 0 as ``sync``), the variants
    of one eta next to each other (in reversed order on odd repeats, so that a drift of the machine's speed does
    not always favour the same variant)."""
    names = list(scenario.variants)
    plan: list[tuple[int, int, str]] = []
    for r in range(scenario.seeds):
        for eta in sorted(scenario.etas):
            if eta == 0:
                plan.append((r, 0, SYNC))
            else:
                plan += [(r, eta, v) for v in (names if r % 2 == 0 else names[::-1])]
    return plan


# ----------------------------------------------------------------------------------------------------------
# Figures of one run and of the grid
# ----------------------------------------------------------------------------------------------------------


def summarize_run(timeline: dict, metrics: list[dict], summary: dict, *, label: str, variant: str, eta: int,
                  repeat: int, seed: int) -> dict:
    """One run's figures (a ``runs[]`` entry of results.json) from its timeline.json, metrics.jsonl lines and
    summary.json: accuracy curve against RL seconds (:func:`areal_cli.bench.throughput.step_durations`, the step
    after an evaluation imputed), final and best accuracy, realised staleness, off-policy statistics."""
    from areal_cli.bench.throughput import effective_throughput, step_durations

    steps = timeline["steps"]
    rl_start = timeline["marks"]["rl_start"]
    durations = step_durations(steps, rl_start, impute_after_eval=True)
    curve, t = [], 0.0
    warm_acc = next((m.get("accuracy") for m in metrics if m.get("phase") == "warm_start_end"), None)
    if warm_acc is not None:
        curve.append([0, 0.0, warm_acc])
    for s, dt in zip(steps, durations):
        t += dt
        if s.get("evaluated") and s.get("accuracy") is not None:
            curve.append([s["step"], round(t, 4), s["accuracy"]])
    rl = [m for m in metrics if m.get("phase") == "rl"]
    hist: dict[int, int] = {}
    for m in rl:
        for k, n in (m.get("staleness_hist") or {}).items():
            hist[int(k)] = hist.get(int(k), 0) + int(n)
    n = sum(hist.values())

    def mean_of(key: str) -> float | None:
        vals = [m[key] for m in rl if isinstance(m.get(key), (int, float)) and not isinstance(m.get(key), bool)]
        return statistics.fmean(vals) if vals else None

    accs = [c[2] for c in curve]
    eff = effective_throughput(steps, rl_start, impute_after_eval=True)
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
    if not values:
        return None
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "n": len(values)}


def aggregate(runs: list[dict], target: float | None = None) -> dict:
    """The grid's figures: ``{"target_accuracy", "target_source", "cells": {variant: {eta: cell}}}`` where a
    cell holds the spread of final and best accuracy over seeds, the seed-averaged accuracy curve, the RL seconds
    at which that curve first reaches the target (interpolated; None when it never does), the runs that reached
    it on their own, the mean realised staleness and the mean off-policy statistics. The eta-0 (``sync``) cell
    is listed under every variant. ``target`` None: the sync runs' mean final accuracy."""
    from areal_cli.bench.throughput import first_crossing, mean_accuracy_curve

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
            "time_to_target_s": "RL seconds (evaluations excluded, the step after an evaluation imputed with the "
                                "run's mean step time) at which the seed-averaged accuracy curve first reaches the "
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


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the results table: one row per (variant, eta)."""
    grid = results["grid"]
    head = ["variant", "eta", "final accuracy", "best accuracy",
            f"RL s to {grid['target_accuracy']:.3f}" if grid["target_accuracy"] else "RL s to target",
            "runs reaching it", "staleness (mean)", "masked / truncated tokens", "clip frac"]
    rows = []
    for v, by_eta in grid["cells"].items():
        for eta, c in sorted(by_eta.items(), key=lambda kv: int(kv[0])):
            fa, ma = c["final_accuracy"], c["max_accuracy"]
            off = c["off_policy"]

            def f(x, fmt="{:.3f}"):
                return "-" if x is None else fmt.format(x)

            rows.append([
                v if int(eta) else f"{v} (= sync)", str(eta),
                "-" if fa is None else (f"{fa['mean']:.3f} ± {fa['std']:.3f}" if fa["n"] > 1 else f"{fa['mean']:.3f}"),
                "-" if ma is None else f"{ma['mean']:.3f}",
                f(c["time_to_target_s"], "{:.1f}"), f"{c['runs_reached_target']}/{c['runs']}",
                f"{c['staleness_mean']:.2f}",
                f"{f(off.get('iw_capped_frac'), '{:.4f}')} / {f(off.get('iw_truncated_frac'), '{:.4f}')}",
                f(off.get("clip_frac"), "{:.4f}"),
            ])
    return head, rows


def results_table(results: dict):
    """A rich Table of :func:`table_rows`."""
    from rich.table import Table

    head, rows = table_rows(results)
    sc = results["scenario"]
    t = Table(title=f"areal bench staleness: {sc['name']} ({sc['steps']} RL steps, {sc['seeds']} seed(s) per cell)")
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i == 0 else "right", style="cyan" if i == 0 else None)
    for r in rows:
        t.add_row(*r)
    g = results["grid"]
    t.caption = (f"target {g['target_accuracy'] if g['target_accuracy'] is None else round(g['target_accuracy'], 3)}: "
                 f"{g['target_source']}; AReaL (AIME24, 1.5B): eta 4 naive 23.3 vs decoupled 42.2")
    return t


def table_markdown(results: dict) -> str:
    """The table as Markdown (``table.md``)."""
    head, rows = table_rows(results)
    sc, g = results["scenario"], results["grid"]
    target = "-" if g["target_accuracy"] is None else f"{g['target_accuracy']:.3f}"
    lines = [f"# areal bench staleness: {sc['name']}", "",
             f"{sc['steps']} RL steps per run, {sc['seeds']} seed(s) per cell, recipe `{sc['recipe']}`; target "
             f"accuracy {target} ({g['target_source']}).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot_staleness(results: dict, path: Path) -> None:
    """Final accuracy (mean ± spread over seeds) and time to target against eta, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from areal_cli.bench.timeline_plot import save_png

    grid = results["grid"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    etas = sorted({int(e) for c in grid["cells"].values() for e in c})
    pos = {e: i for i, e in enumerate(etas)}  # eta on an ordinal axis: 0, 1, 2, 4, 8, 16
    for i, (v, by_eta) in enumerate(grid["cells"].items()):
        pts = sorted((int(e), c) for e, c in by_eta.items())
        xs = [pos[e] + (i - (len(grid["cells"]) - 1) / 2) * 0.05 for e, _ in pts]
        fa = [c["final_accuracy"] for _, c in pts]
        axes[0].errorbar(xs, [f["mean"] if f else math.nan for f in fa],
                         yerr=[[f["mean"] - f["min"] if f else 0 for f in fa], [f["max"] - f["mean"] if f else 0 for f in fa]],
                         marker="o", ms=4, capsize=3, label=v, color=f"C{i}")
        tt = [c["time_to_target_s"] for _, c in pts]
        axes[1].plot(xs, [math.nan if x is None else x for x in tt], marker="o", ms=4, label=v, color=f"C{i}")
        for x, y in zip(xs, tt):
            if y is None:
                axes[1].plot([x], [0], marker="x", color=f"C{i}")
    warm = results.get("warm_start", {}).get("accuracy")
    if warm is not None:
        axes[0].axhline(warm, color="gray", ls=":", lw=1, label="after the warm start")
    if grid["target_accuracy"]:
        axes[0].axhline(grid["target_accuracy"], color="#d62728", ls="--", lw=1, label="target")
    for ax in axes:
        ax.set_xticks(range(len(etas)), [str(e) for e in etas])
        ax.set_xlabel("eta (max_head_offpolicyness; 0 = synchronous)")
    axes[0].set_ylabel("held-out accuracy after the last step")
    axes[0].set_title(f"final accuracy ({results['scenario']['steps']} RL steps; bars: seed range)", fontsize=10)
    axes[1].set_ylabel("RL seconds to the target (x: not reached)")
    axes[1].set_title("time to target (seed-averaged curve)", fontsize=10)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"staleness ablation: {results['scenario']['name']}", x=0.01, ha="left", fontsize=11)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------
# The benchmark
# ----------------------------------------------------------------------------------------------------------


def _items(overrides: dict[str, Any]) -> list[str]:
    return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in overrides.items()]


def _run_cfg(scenario: Scenario, extra: list[str], items: list[str]):
    from areal_cli.config import apply_overrides
    from areal_cli.recipes import load_train_config

    cfg, _ = load_train_config(scenario.recipe)
    return apply_overrides(cfg, _items(scenario.overrides) + list(extra) + items)


def run_ablation(scenario: Scenario, out: Path, *, extra_overrides: list[str] | None = None,
                 log: Callable[[str], None] = print) -> dict:
    """Run ``scenario`` into ``out``: one warm start, the grid of :func:`run_plan`, results.json, table.md, plot.

    Raises:
        UserError: ``out`` already holds results, bad recipe / overrides / variant fields, unavailable cpus.
    """
    from areal_cli.atomic import write_atomic_many, write_json_atomic
    from areal_cli.bench.throughput import machine_description, output_to
    from areal_cli.train_loop import run_training

    extra = list(extra_overrides or [])
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: --out exists and is not a directory")
    if (out / "results.json").exists() or (out / "warm").exists():
        raise UserError(f"{out}: already holds a benchmark; choose another --out")
    cpu_items = [f"trainer_cpus={scenario.cpus['trainer']}", f"server_cpus={scenario.cpus['server']}",
                 f"controller_cpus={scenario.cpus['controller']}"]
    base_cfg = _run_cfg(scenario, extra, cpu_items)  # validates everything before any work
    for name, ov in [(SYNC, SYNC_OVERRIDES), *scenario.variants.items()]:
        try:
            _run_cfg(scenario, extra, cpu_items + _items(ov))
        except UserError as e:
            raise UserError(f"{scenario.source}: variant '{name}': {e}") from None
    out.mkdir(parents=True, exist_ok=True)
    machine = {"start": machine_description()}
    t_bench = time.monotonic()

    log(f"warm start ({scenario.recipe})")
    with output_to(out / "warm" / "console.log"):
        warm_summary = run_training(_run_cfg(scenario, extra, cpu_items + ["max_steps=0"]), out / "warm", live=False)
    weights = sorted((out / "warm" / "weights").glob("sft-step*"))
    if not weights:
        raise RuntimeError(f"the warm start left no weights in {out / 'warm' / 'weights'}")
    warm = {**warm_summary["warm_start"], "weights": str(weights[-1])}
    log(f"warm start: {warm['steps']} steps, {warm['seconds']:.1f} s, accuracy {warm['accuracy']:.3f}")

    runs: list[dict] = []
    plan = run_plan(scenario)
    for i, (rep, eta, variant) in enumerate(plan):
        seed = base_cfg.seed + rep
        label = f"{i:03d}-{variant}-eta{eta}-r{rep}"
        ov = SYNC_OVERRIDES if variant == SYNC else scenario.variants[variant]
        items = cpu_items + _items(ov) + [
            f"seed={seed}", f"model_path={weights[-1].resolve()}", "sft_max_steps=0", f"max_steps={scenario.steps}",
            f"eval_every={scenario.accuracy_every}", "target_accuracy=0", "time_limit_s=0",
            f"max_head_offpolicyness={eta}"]
        cfg = _run_cfg(scenario, extra, items)
        run_dir = out / "runs" / label
        with output_to(out / "runs" / f"{label}.console.log"):
            summary = run_training(cfg, run_dir, live=False, record_timeline=True)
        tl = json.loads((run_dir / "timeline.json").read_text())
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        r = summarize_run(tl, metrics, summary, label=label, variant=variant, eta=eta, repeat=rep, seed=seed)
        r["dir"] = str(run_dir)
        runs.append(r)
        log(f"[{i + 1}/{len(plan)}] {label}: accuracy {r['final_accuracy']:.3f} (best {r['max_accuracy']:.3f}), "
            f"{r['rl_seconds']:.1f} RL s, staleness {r['staleness_mean']:.2f}")

    machine["end"] = machine_description()
    results = build_results(scenario, runs, warm=warm, machine=machine, extra_overrides=extra,
                            recipe_config=base_cfg.to_dict(), seconds=time.monotonic() - t_bench)
    plot_staleness(results, out / results["plots"]["staleness"])
    write_atomic_many({out / results["table"]: table_markdown(results)})
    write_json_atomic(out / "results.json", results)
    return results


__all__ = ["DEFAULT_SCENARIO", "SCHEMA", "Scenario", "VARIANTS", "aggregate", "build_results", "default_scenario",
           "load_scenario", "plot_staleness", "results_table", "run_ablation", "run_plan", "summarize_run",
           "table_markdown"]

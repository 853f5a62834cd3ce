"""Running ``areal bench staleness``: one supervised warm start, then the grid of :func:`run_plan`, each run pinned
to the cores of ``areal bench throughput``; writes ``results.json``, ``table.md`` and ``staleness.png``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from areal_cli.bench.runs import (RUN_CHECK_ITEMS, check_out_dir, cpu_overrides, located, machine_description, output_to,
                                  override_items, refuse_per_run_overrides, shared_warm_start)
from areal_cli.bench.staleness.analysis import build_results, summarize_run
from areal_cli.bench.staleness.report import plot_staleness, table_markdown
from areal_cli.bench.staleness.scenario import SYNC, SYNC_OVERRIDES, Scenario, run_plan
from areal_cli.foundations.errors import UserError


def _run_cfg(scenario: Scenario, extra: list[str], items: list[str]):
    from areal_cli.config import apply_overrides
    from areal_cli.recipes import load_train_config

    cfg, _ = load_train_config(scenario.recipe)
    try:
        return apply_overrides(cfg, override_items(scenario.overrides) + list(extra) + items,
                               source=f"{scenario.source} overrides / -o")
    except UserError as e:
        raise located(e, {"overrides": scenario.overrides}, scenario.locations) from None


def check_configs(scenario: Scenario, extra: list[str], out: Path | None = None):
    """Build the configuration of every variant (and the synchronous baseline) with ``extra`` overrides, so that
    a bad override, a cpu this process may not use, a run that cannot start here
    (:func:`areal_cli.train_loop.preflight`) or an ``out`` folder the run would refuse fails before any work (also in
    ``--dry-run``). Returns the base config.

    Raises:
        UserError: a bad recipe, override or variant field (one line, naming the variant); ``out`` is a file or
            already holds a benchmark.
    """
    from areal_cli.train_loop.processes import check_cpus

    if out is not None:
        check_out_dir(out)
    refuse_per_run_overrides(extra)
    cpu_items = cpu_overrides(scenario.cpus)
    base_cfg = _run_cfg(scenario, extra, cpu_items)
    check_cpus(base_cfg)  # cpus this process may use, before a warm start is written into --out
    from areal_cli.train_loop import preflight

    preflight(base_cfg)  # what the warm start would refuse (no model here, a GPU engine's package missing, ...)
    for name, ov in [(SYNC, SYNC_OVERRIDES), *scenario.variants.items()]:
        try:
            _run_cfg(scenario, extra, cpu_items + override_items(ov) + RUN_CHECK_ITEMS)
        except UserError as e:
            raise UserError(f"{scenario.source}: variant '{name}': {e}") from None
    return base_cfg


def run_ablation(scenario: Scenario, out: Path, *, extra_overrides: list[str] | None = None,
                 log: Callable[[str], None] = print) -> dict:
    """Run ``scenario`` into ``out``: one warm start, the grid of :func:`run_plan`, results.json, table.md, plot.

    Raises:
        UserError: ``out`` already holds results, bad recipe / overrides / variant fields, unavailable cpus.
    """
    from areal_cli.foundations.atomic import write_atomic_many, write_json_atomic
    from areal_cli.train_loop import run_training

    extra = list(extra_overrides or [])
    base_cfg = check_configs(scenario, extra, out)  # validates everything before any work
    cpu_items = cpu_overrides(scenario.cpus)
    out.mkdir(parents=True, exist_ok=True)
    machine = {"start": machine_description()}
    t_bench = time.monotonic()

    warm = shared_warm_start(_run_cfg(scenario, extra, cpu_items + ["loop.max_steps=0"]), out, log, scenario.recipe)

    runs: list[dict] = []
    plan = run_plan(scenario)
    for i, (rep, eta, variant) in enumerate(plan):
        seed = base_cfg.seed + rep
        label = f"{i:03d}-{variant}-eta{eta}-r{rep}"
        ov = SYNC_OVERRIDES if variant == SYNC else scenario.variants[variant]
        items = cpu_items + override_items(ov) + [
            f"seed={seed}", f"model.path={Path(warm['weights']).resolve()}", "sft.max_steps=0", f"loop.max_steps={scenario.steps}",
            f"loop.eval_every={scenario.accuracy_every}", *RUN_CHECK_ITEMS,
            f"rollout.max_head_offpolicyness={eta}"]
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

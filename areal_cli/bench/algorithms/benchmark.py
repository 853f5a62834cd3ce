"""Running ``areal bench algorithms``: one supervised warm start, then every preset once per seed in the order of
:func:`~areal_cli.bench.algorithms.plan.run_plan`; writes ``results.json``, ``table.md`` and ``algorithms.png``.
Also the ``--dry-run`` estimate."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from areal_cli.bench.algorithms.analysis import build_results, summarize_run
from areal_cli.bench.algorithms.plan import (Settings, check_configs, cpu_overrides, run_cfg, run_label, run_plan,
                                             target_of)
from areal_cli.bench.cpu_time import cpu_sample, cpu_use_between
from areal_cli.bench.runs import RUN_CHECK_ITEMS, machine_description, output_to, shared_warm_start

#: Fallback timings of tiny-arith for ``--dry-run`` when ``benchmarks/results`` holds no measured algorithms run:
#: seconds per RL step, start-up and deferred evaluation per run, warm start (measured on 2 shared cores, see
#: benchmarks/README.md).
CALIBRATION = {"recipe": "tiny-arith", "step_s": 0.25, "per_run_s": 9.0, "warm_s": 20.0}


def estimate_lines(s: Settings, busy: float | None) -> tuple[list[float], list[str]]:
    """Seconds of each planned run and the lines a dry run prints: from the most recent measured algorithms run
    of the recipe under ``benchmarks/results`` (:func:`areal_cli.bench.estimate.plan_lines`), else from
    :data:`CALIBRATION` (for tiny-arith)."""
    from areal_cli.bench.estimate import duration, machine_line, plan_lines

    plan = run_plan(s)
    per_run, lines = plan_lines("algorithms", f"algorithms-{s.recipe}", s.recipe, [(p, s.steps) for _, p in plan],
                                busy=busy, settings={"steps": s.steps, "overrides": s.overrides})
    if per_run is not None:
        return per_run, lines
    c = CALIBRATION
    per = [s.steps * c["step_s"] + c["per_run_s"]] * len(plan)
    other = "" if s.recipe == c["recipe"] else f" (measured on {c['recipe']}: {s.recipe} may differ widely)"
    return per, [f"estimated wall time: {duration(c['warm_s'] + sum(per))} (warm start {duration(c['warm_s'])} + "
                 f"{len(plan)} runs x ({s.steps} steps x {c['step_s']} s + {c['per_run_s']} s start-up and "
                 f"evaluation)){other}", "  basis: the built-in calibration of areal_cli.bench.algorithms.benchmark",
                 "  " + machine_line(None, busy)]


def run_algorithms(s: Settings, out: Path, *, extra_overrides: list[str] | None = None,
                   log: Callable[[str], None] = print) -> dict:
    """Run the grid of ``s`` into ``out``: one warm start, the runs of :func:`run_plan`, results.json, table.md,
    algorithms.png.

    Raises:
        UserError: bad settings, ``out`` already holds results, bad recipe / overrides, a refused preset,
            unavailable cpus (all before any work).
    """
    from areal_cli.bench.algorithms.report import plot_curves, table_markdown
    from areal_cli.foundations.atomic import write_atomic_many, write_json_atomic
    from areal_cli.train_loop import run_training

    extra = list(extra_overrides or [])
    base_cfg, keys = check_configs(s, extra, out)
    target, target_source = target_of(s, base_cfg)
    log(f"recipe {s.recipe}: presets {','.join(s.presets)} x {s.seeds} seed(s) = {len(run_plan(s))} runs of "
        f"{s.steps} RL steps at eta {base_cfg.rollout.max_head_offpolicyness}, target {target}, cpus {s.cpus}, "
        f"out {out}")
    cpu_items = cpu_overrides(s.cpus)
    out.mkdir(parents=True, exist_ok=True)
    machine = {"start": machine_description()}
    t_bench = time.monotonic()
    warm = shared_warm_start(run_cfg(s, extra, cpu_items + ["loop.max_steps=0"]), out, log, s.recipe)

    runs: list[dict] = []
    plan = run_plan(s)
    for i, (rep, preset) in enumerate(plan):
        seed = base_cfg.seed + rep
        label = run_label(i, rep, preset)
        items = cpu_items + [f"seed={seed}", f"model.path={Path(warm['weights']).resolve()}", "sft.max_steps=0",
                             f"loop.max_steps={s.steps}", f"loop.eval_every={s.accuracy_every}", *RUN_CHECK_ITEMS]
        cfg = run_cfg(s, extra, items, preset=preset)
        run_dir = out / "runs" / label
        before = cpu_sample()
        with output_to(out / "runs" / f"{label}.console.log"):
            summary = run_training(cfg, run_dir, live=False, record_timeline=True)
        cpu = cpu_use_between(before, cpu_sample())
        tl = json.loads((run_dir / "timeline.json").read_text())
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        r = summarize_run(tl, metrics, summary, label=label, preset=preset, repeat=rep, seed=seed, target=target)
        r["dir"], r["machine_cpu"] = str(run_dir), cpu
        runs.append(r)
        tt = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f} s"
        log(f"[{i + 1}/{len(plan)}] {label} (seed {seed}): accuracy {r['final_accuracy']:.3f}, to {target}: {tt}, "
            f"{r['rl_seconds']:.1f} RL s, staleness {r['staleness_mean']:.2f}"
            + (f"; BUSY MACHINE: other processes {cpu['other_cores']:.2f} cores, steal {cpu['steal_cores']:.2f}"
               if cpu and cpu["busy"] else ""))

    machine["end"] = machine_description()
    results = build_results(s.to_dict(), runs, presets=s.presets, keys=keys, target=target,
                            target_source=target_source, warm=warm, machine=machine, extra_overrides=extra,
                            recipe_config=base_cfg.to_dict(), seconds=time.monotonic() - t_bench)
    plot_curves(results, out / results["plots"]["accuracy"])
    write_atomic_many({out / results["table"]: table_markdown(results)})
    write_json_atomic(out / "results.json", results)
    return results

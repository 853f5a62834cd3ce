"""``areal bench throughput``: sync vs async RL measured side by side on this machine (click command).

Importing this module imports only click and the standard library; the benchmark (torch, the trainer,
matplotlib, rich) is imported when the command runs. Writes ``DIR/results.json``, ``DIR/timeline.png``,
``DIR/throughput.png``, ``DIR/accuracy.png`` (with accuracy curves), ``DIR/decomposition.png`` (server occupancy and
the overlap x straggler split of the ratio) and one folder per run under ``DIR/runs/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from areal_cli.commands.error_contract import one_line_errors


@click.command("throughput")
@click.argument("recipe", required=False, default=None)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Output folder. Default: runs/bench-throughput-<date>-<time>.")
@click.option("--scenario", "scenario_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Scenario YAML (e.g. benchmarks/scenarios/throughput-tiny-arith.yaml) or the name of a shipped "
                   "one (throughput-tiny-longtail: long-tailed generation lengths). Default: the built-in tiny-arith "
                   "scenario (the same values).")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="RL steps per run (overrides the scenario).")
@click.option("--repeats", type=click.IntRange(min=1), default=None,
              help="Runs per mode, interleaved (overrides the scenario).")
@click.option("--no-interruptible-compare", is_flag=True, help="Skip the non-interruptible async runs.")
@click.option("--in-place-compare/--no-in-place-compare", default=None,
              help="Also run async with in-place weight updates (rollout.pause_mode in_place: in-flight samples "
                   "keep their KV cache); default: the scenario's compare_in_place.")
@click.option("--no-generate-compare", is_flag=True, help="Skip continuous batching vs HF static generate.")
@click.option("--dry-run", is_flag=True,
              help="Check the settings, print the plan (runs, their order, seeds, estimated wall time per run and in "
                   "all, from a measured run of the scenario under benchmarks/results/) and exit.")
@click.option("-o", "--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe field in every run, e.g. -o rollout.group_size=8. Repeatable.")
@one_line_errors
def throughput(recipe: str | None, out_dir: Path | None, scenario_path: Path | None, steps: int | None,
               repeats: int | None, no_interruptible_compare: bool, in_place_compare: bool | None,
               no_generate_compare: bool, dry_run: bool, overrides: tuple[str, ...]) -> None:
    """Measure synchronous (eta=0) vs asynchronous RL of RECIPE (default: tiny-arith) on this machine.

    Same recipe, same cores for generation and training; only eta differs. Reports effective training
    throughput (tokens consumed by training per second, AReaL's definition), generation throughput, idle
    fractions, staleness and accuracy reached, with the async/sync ratio; also interruptible vs
    non-interruptible weight updates (and, with --in-place-compare, updates that keep the in-flight samples' KV
    cache) and continuous batching vs Hugging Face static generate.
    """
    _run(recipe, out_dir, scenario_path, steps, repeats, no_interruptible_compare, no_generate_compare,
         list(overrides), dry_run, in_place_compare)


def _run(recipe, out_dir, scenario_path, steps, repeats, no_interruptible, no_generate, overrides, dry_run,
         in_place=None) -> None:
    import time

    from rich.console import Console

    from areal_cli.bench.throughput import (check_configs, default_scenario, describe_plan, load_scenario,
                                            results_table, run_benchmark)
    from areal_cli.bench.throughput.table import headline_line

    sc = load_scenario(scenario_path) if scenario_path else default_scenario()
    if recipe:
        sc.recipe = recipe
    if steps is not None:
        sc.steps = steps
    if repeats is not None:
        sc.repeats = repeats
    if no_interruptible:
        sc.compare_interruptible = False
    if in_place is not None:
        sc.compare_in_place = in_place
    if no_generate:
        sc.generate_compare = None
    console = Console() if sys.stdout.isatty() else Console(width=160)  # a log file gets whole cells
    if dry_run:
        base = check_configs(sc, overrides, out_dir)
        plan = describe_plan(sc, base.seed)
        console.print(f"scenario {sc.name} ({sc.source}): recipe {sc.recipe}, one warm start + {len(plan)} runs of "
                      f"{sc.steps} RL steps, cpus {sc.cpus}" + (", then continuous batching vs HF static generate"
                                                               if sc.generate_compare else ""),
                      highlight=False, soft_wrap=True)
        shared = [f"{k}={v}" for k, v in sc.overrides.items()] + list(overrides)
        console.print(f"  every run: {' '.join(shared) or 'the recipe as it is'}", highlight=False, soft_wrap=True)
        if sc.sync_overrides:
            console.print("  sync runs also: " + " ".join(f"{k}={v}" for k, v in sc.sync_overrides.items()),
                          highlight=False, soft_wrap=True)
        from areal_cli.bench.estimate import cores_busy_now, duration, plan_lines

        per_run, lines = plan_lines("throughput", sc.name, sc.recipe, [(run["mode"], sc.steps) for run in plan],
                                    busy=cores_busy_now(), settings={
                                        "overrides": sc.overrides, "sync_overrides": sc.sync_overrides,
                                        "eta_async": sc.eta_async, "eta_sync": sc.eta_sync})
        for i, run in enumerate(plan):
            updates = ("" if run["mode"] == "sync" else "non-interruptible updates" if not run["interruptible"] else
                       "in-place interruptible updates" if run["pause_mode"] == "in_place" else "interruptible updates")
            est = f"~{duration(per_run[i])}" if per_run else ""
            console.print(f"  {run['label']:<28}  seed {run['seed']}  eta {run['eta']}  {updates:<30}  {est}".rstrip(),
                          highlight=False, soft_wrap=True)
        for line in lines:
            console.print(line, highlight=False, soft_wrap=True, markup=False)
        if sc.generate_compare:
            console.print("  (continuous batching vs HF static generate afterwards: not in the estimate, no measured "
                          "time)", highlight=False, soft_wrap=True)
        console.print(f"writes {out_dir if out_dir is not None else 'runs/bench-throughput-<date>-<time>'}: "
                      "results.json, the table, plots, runs/<label>/ (nothing was written now)",
                      highlight=False, soft_wrap=True)
        return
    if out_dir is None:
        out_dir = Path("runs") / f"bench-throughput-{time.strftime('%Y%m%d-%H%M%S')}"
    t0 = time.monotonic()

    def log(msg: str) -> None:
        console.print(f"[{time.monotonic() - t0:6.1f}s] {msg}", highlight=False, soft_wrap=True)

    log(f"scenario {sc.name} ({sc.source}): recipe {sc.recipe}, {sc.steps} RL steps x {sc.repeats} repeats, "
        f"eta {sc.eta_sync} vs {sc.eta_async}, cpus {sc.cpus}, out {out_dir}")
    results = run_benchmark(sc, out_dir, extra_overrides=overrides, log=log)
    console.print(results_table(results))
    line = headline_line(results)
    if line:
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    extra = "".join(f", {out_dir}/{results['plots'][k]}" for k in ("accuracy", "decomposition") if k in results["plots"])
    console.print(f"wrote {out_dir}/results.json, {out_dir}/timeline.png, {out_dir}/throughput.png{extra}")

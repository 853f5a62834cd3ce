"""``areal bench staleness``: the staleness ablation (eta x loss variant) on this machine (click command).

Importing this module imports only click and the standard library; the benchmark (torch, the trainer, matplotlib,
rich) is imported when the command runs. Writes ``DIR/results.json``, ``DIR/table.md``, ``DIR/staleness.png`` and
one folder per run under ``DIR/runs/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from areal_cli.commands.error_contract import one_line_errors


def _int_list(ctx, param, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated ints, got {value!r}") from None
    if not out or any(x < 0 for x in out) or len(set(out)) != len(out):
        raise click.BadParameter(f"expected distinct ints >= 0, got {value!r}")
    return out


@click.command("staleness")
@click.option("--scenario", "scenario_path", default=None, metavar="FILE|NAME",
              help="Scenario YAML, or the name of a shipped one (default: staleness-tiny-longtail, the built-in "
                   "values of benchmarks/scenarios/staleness-tiny-longtail.yaml).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Output folder. Default: runs/bench-staleness-<date>-<time>.")
@click.option("--etas", callback=_int_list, default=None, metavar="0,1,2,...", help="eta values (overrides the scenario).")
@click.option("--variants", default=None, metavar="NAME,...",
              help="Loss variants (overrides the scenario): naive, decoupled, decoupled-none, decoupled-token_truncate, "
                   "decoupled-sequence_mask, decoupled-sequence_truncate, decoupled-icepop.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="RL steps per run (overrides the scenario).")
@click.option("--seeds", type=click.IntRange(min=1), default=None, help="Runs per grid point (overrides the scenario).")
@click.option("--dry-run", is_flag=True,
              help="Print the plan (runs, their order, estimated wall time per run and in all, from a measured run of "
                   "the scenario under benchmarks/results/) and exit.")
@click.option("-o", "--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe field in every run, e.g. -o ppo.lr=2e-4. Repeatable.")
@one_line_errors
def staleness(scenario_path: str | None, out_dir: Path | None, etas: list[int] | None, variants: str | None,
              steps: int | None, seeds: int | None, dry_run: bool, overrides: tuple[str, ...]) -> None:
    """The staleness ablation (AReaL v0.3, Table 3): max staleness eta x {decoupled PPO, naive PPO, corrections}.

    Reports final held-out accuracy, RL time to a target accuracy and the realised staleness per variant and eta
    (table, results.json, staleness.png). Every run starts from one shared warm start; eta 0 is the synchronous
    baseline shared by every variant.
    """
    import time

    from rich.console import Console

    from areal_cli.bench.staleness import (VARIANTS, default_scenario, load_scenario, results_table, run_ablation,
                                           run_plan)
    from areal_cli.foundations.errors import UserError

    sc = load_scenario(scenario_path) if scenario_path else default_scenario()
    if etas is not None:
        sc.etas = etas
    if variants is not None:
        names = [v.strip() for v in variants.split(",") if v.strip()]
        unknown = [v for v in names if v not in VARIANTS and v not in sc.variants]
        if not names or unknown:
            raise UserError(f"--variants: unknown variant '{(unknown or [''])[0]}' (known: {', '.join(VARIANTS)})")
        sc.variants = {v: dict(sc.variants.get(v, VARIANTS.get(v, {}))) for v in names}
    if steps is not None:
        sc.steps = steps
    if seeds is not None:
        sc.seeds = seeds
    console = Console() if sys.stdout.isatty() else Console(width=160)  # a log file gets whole cells
    plan = run_plan(sc)
    if dry_run:
        from areal_cli.bench.staleness.benchmark import check_configs

        base = check_configs(sc, list(overrides), out_dir)
        from areal_cli.bench.estimate import cores_busy_now, duration, plan_lines

        per_run, lines = plan_lines("staleness", sc.name, sc.recipe, [((v, eta), sc.steps) for _, eta, v in plan],
                                    busy=cores_busy_now(), settings={"overrides": sc.overrides,
                                                                     "variants": sc.variants, "etas": sc.etas})
        console.print(f"scenario {sc.name} ({sc.source}): recipe {sc.recipe}, one warm start + {len(plan)} runs of "
                      f"{sc.steps} RL steps", highlight=False, soft_wrap=True)
        for i, (rep, eta, v) in enumerate(plan):
            est = f"  ~{duration(per_run[i])}" if per_run else ""
            console.print(f"  {i:3d}  repeat {rep} (seed {base.seed + rep})  eta {eta:2d}  {v:<28}{est}".rstrip(),
                          highlight=False)
        for line in lines:
            console.print(line, highlight=False, soft_wrap=True, markup=False)
        return
    if out_dir is None:
        out_dir = Path("runs") / f"bench-staleness-{time.strftime('%Y%m%d-%H%M%S')}"
    t0 = time.monotonic()

    def log(msg: str) -> None:
        console.print(f"[{time.monotonic() - t0:7.1f}s] {msg}", highlight=False, soft_wrap=True)

    log(f"scenario {sc.name} ({sc.source}): recipe {sc.recipe}, etas {sc.etas}, variants {list(sc.variants)}, "
        f"{sc.steps} RL steps x {sc.seeds} seed(s) = {len(plan)} runs, cpus {sc.cpus}, out {out_dir}")
    results = run_ablation(sc, out_dir, extra_overrides=list(overrides), log=log)
    console.print(results_table(results))
    console.print(f"wrote {out_dir}/results.json, {out_dir}/table.md, {out_dir}/staleness.png")

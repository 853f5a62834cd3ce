"""``areal bench algorithms``: the algorithm presets (``ppo.algorithm``) side by side on this machine (click
command).

Importing this module imports only click and the standard library; the benchmark (torch, the trainer, matplotlib,
rich) is imported when the command runs. Writes ``DIR/results.json``, ``DIR/table.md``, ``DIR/algorithms.png`` and
one folder per run under ``DIR/runs/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from areal_cli.commands.error_contract import one_line_errors


@click.command("algorithms")
@click.option("--recipe", default="tiny-arith", show_default=True, metavar="NAME|FILE",
              help="The recipe every preset trains on (its eta, rollout.max_head_offpolicyness, is used).")
@click.option("--presets", default=None, metavar="NAME,...",
              help="ppo.algorithm presets, in plan order (default: grpo,ppo,dr_grpo,dapo,gspo,rloo,cispo).")
@click.option("--seeds", type=int, default=3, show_default=True,
              help="Runs per preset; repeat r uses seed 'recipe seed + r'.")
@click.option("--steps", type=int, default=60, show_default=True, help="RL steps per run (no early stop).")
@click.option("--accuracy-every", type=int, default=5, show_default=True,
              help="Held-out accuracy every this many RL steps (evaluated after each run's RL loop).")
@click.option("--target", type=float, default=None,
              help="Accuracy of the time-to-target figure (default: the recipe's loop.target_accuracy; 0.9 for "
                   "tiny-arith).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Output folder. Default: runs/bench-algorithms-<date>-<time>.")
@click.option("--dry-run", is_flag=True,
              help="Print the plan (runs in their interleaved order, the preset keys in force, the estimated wall "
                   "time) and exit; writes nothing.")
@click.option("-o", "--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe field in every run, after the preset's keys, e.g. -o ppo.kl_ctl=0.01. "
                   "Repeatable.")
@one_line_errors
def algorithms(recipe: str, presets: str | None, seeds: int, steps: int, accuracy_every: int, target: float | None,
               out_dir: Path | None, dry_run: bool, overrides: tuple[str, ...]) -> None:
    """The algorithm presets side by side: grpo, ppo, dr_grpo, dapo, gspo, rloo, cispo on one task, at eta > 0.

    Every preset trains from one shared warm start for the same RL steps, once per seed, the runs interleaved
    seed-major. Reports per preset (mean ± std over seeds) final held-out accuracy, RL time to a target accuracy,
    staleness, the mean and median importance weight, the engine-vs-trainer logprob mismatch and the share of zero-std
    groups (table, results.json, table.md, algorithms.png).
    """
    import time

    from rich.console import Console

    from areal_cli.bench.algorithms import Settings, check_configs, check_settings, estimate_lines, run_algorithms
    from areal_cli.bench.algorithms.plan import DEFAULT_PRESETS
    from areal_cli.foundations.errors import UserError

    names = DEFAULT_PRESETS if presets is None else [p.strip() for p in presets.split(",") if p.strip()]
    if accuracy_every < 1:
        raise UserError(f"--accuracy-every: must be >= 1 (got {accuracy_every})")
    s = Settings(recipe=recipe, presets=list(names), seeds=seeds, steps=steps, accuracy_every=accuracy_every,
                 target_accuracy=target)
    check_settings(s)
    console = Console() if sys.stdout.isatty() else Console(width=160)  # a log file gets whole cells
    if dry_run:
        from areal_cli.bench.algorithms.plan import run_label, run_plan, target_of
        from areal_cli.bench.estimate import cores_busy_now, duration

        base, keys = check_configs(s, list(overrides), out_dir)
        tgt, src = target_of(s, base)
        plan = run_plan(s)
        per_run, lines = estimate_lines(s, cores_busy_now())
        console.print(f"recipe {s.recipe}: one warm start + {len(plan)} runs ({len(s.presets)} presets x {s.seeds} "
                      f"seed(s)) of {s.steps} RL steps at eta {base.rollout.max_head_offpolicyness}, held-out accuracy "
                      f"every {s.accuracy_every} steps, target {tgt} ({src}); order: seed-major, reversed on odd "
                      f"seeds", highlight=False, soft_wrap=True)
        for i, (rep, p) in enumerate(plan):
            console.print(f"  {i:3d}  {run_label(i, rep, p):<18} seed {base.seed + rep:<3d} {p:<8}  "
                          f"~{duration(per_run[i])}", highlight=False)
        console.print("preset keys in force:", highlight=False)
        for p, k in keys.items():
            console.print(f"  {p}: " + ", ".join(f"{key}={v}" for key, v in k.items() if key != "ppo.algorithm"),
                          highlight=False, soft_wrap=True, markup=False)
        for line in lines:
            console.print(line, highlight=False, soft_wrap=True, markup=False)
        return
    if out_dir is None:
        out_dir = Path("runs") / f"bench-algorithms-{time.strftime('%Y%m%d-%H%M%S')}"
    t0 = time.monotonic()

    def log(msg: str) -> None:
        console.print(f"[{time.monotonic() - t0:7.1f}s] {msg}", highlight=False, soft_wrap=True, markup=False)

    results = run_algorithms(s, out_dir, extra_overrides=list(overrides), log=log)
    from areal_cli.bench.algorithms import results_table

    console.print(results_table(results))
    console.print(f"wrote {out_dir}/results.json, {out_dir}/table.md, {out_dir}/algorithms.png", highlight=False)

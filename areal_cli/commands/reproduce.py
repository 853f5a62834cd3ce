"""``areal reproduce``: the click command (registered by ``areal_cli/commands/main.py``: ``main.add_command(reproduce)``).

Importing this module imports click and the standard library only; the work is in :mod:`areal_cli.reproduce`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from areal_cli.commands.error_contract import one_line_errors


@click.command("reproduce")
@click.argument("name")
@click.option("--dry-run", is_flag=True,
              help="Print the plan (downloads, GPUs, hours, evaluation, expected numbers) and stop; writes nothing.")
@click.option("--eval-only", is_flag=True,
              help="Evaluate the published checkpoint (pinned revision) instead of training, then compare.")
@click.option("--subject", type=click.Choice(["published", "base"]), default=None,
              help="With --eval-only: the checkpoint to judge (default published; base = the starting model).")
@click.option("--variant", default=None, help="A named variant of the recipe (e.g. sync).")
@click.option("-o", "--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a CPU recipe's TrainConfig key, or with --eval-only an eval setting (protocol, "
                   "n_samples, temperature, top_p, max_new_tokens). Recorded: the run is no longer the locked recipe.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Run folder (manifest.json, reproduce.json, train/ or eval/). "
                   "Default: runs/reproduce-<name>-<date>-<time>. Must not hold a reproduction.")
@click.option("--allow-unpinned", is_flag=True,
              help="Download a checkpoint the recipe does not pin, as it is today (recorded in the manifest).")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), default=None,
              help="With --eval-only: evaluate this local checkpoint instead of downloading it.")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="With --eval-only: benchmark files, as `areal eval --data-dir`.")
@click.option("--cf-data", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="With --eval-only: Codeforces contest data for the rating, as `areal eval --cf-data`.")
@click.option("--no-live", is_flag=True, help="Plain log lines instead of the live training panel.")
@click.option("--nodes", type=int, default=None,
              help="Place the recipe's allocation on this many nodes (default: the published run's); "
                   "with --dry-run.")
@click.option("--gpus-per-node", type=int, default=None,
              help="GPUs per node for the placement (default: the published run's; 0 = CPU processes).")
@one_line_errors
def reproduce(name: str, dry_run: bool, eval_only: bool, subject: str | None, variant: str | None,
              overrides: tuple[str, ...], out_dir: Path | None, allow_unpinned: bool, model_dir: Path | None,
              data_dir: Path | None, cf_data: Path | None, no_live: bool, nodes: int | None,
              gpus_per_node: int | None) -> None:
    """Reproduce the locked recipe NAME: plan, train (or --eval-only), evaluate, compare with the expected
    numbers and print a pass/fail table. Exit 0: all checks pass; 1: a regression (or nothing could be
    checked); 2: bad input. `areal reproduce tiny-arith` runs on CPU in a few minutes."""
    from areal_cli.foundations.errors import UserError
    from areal_cli.reproduce import reproduce as run

    if (nodes is not None or gpus_per_node is not None) and not dry_run:
        raise UserError("--nodes/--gpus-per-node place the allocation for --dry-run only (a run uses this machine)")
    outcome = run(name, out_dir=out_dir, dry_run=dry_run, eval_only=eval_only, subject=subject, variant=variant,
                  overrides=list(overrides), allow_unpinned=allow_unpinned, data_dir=data_dir, cf_data=cf_data,
                  model_dir=model_dir, live=not no_live, command=["areal", *sys.argv[1:]], nodes=nodes,
                  gpus_per_node=gpus_per_node)
    sys.exit(outcome.exit_code)

"""``areal launch slurm`` / ``areal launch node``: the click commands (registered by ``areal_cli/commands/main.py``).

Importing this module imports click and the standard library only; the work is in :mod:`areal_cli.launch`.
"""

from __future__ import annotations

import shlex

import sys
from pathlib import Path

import click

from areal_cli.commands.error_contract import one_line_errors


@click.group("launch")
def launch() -> None:
    """Multi-node runs on Slurm + torchrun: write the job (slurm), run one node of it (node)."""


def _hosts(text: str | None) -> list[str] | None:
    return [h.strip() for h in text.split(",")] if text else None


@launch.command("slurm")
@click.argument("config")
@click.option("--nodes", type=int, required=True, help="Nodes of the job.")
@click.option("--gpus-per-node", type=int, required=True, help="GPUs per node (0: CPU processes only).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True,
              help="Run directory on a filesystem every node mounts (launch/, logs/, discovery/, train/).")
@click.option("--allocation", default=None,
              help="AReaL allocation string, e.g. sglang.d4m2p1+d2m2p2 (default: the config's n_servers embedded "
                   "servers + its trainer_* degrees).")
@click.option("--model", "model_path", type=click.Path(path_type=Path), default=None,
              help="Model directory the servers load (default: the config's model.path).")
@click.option("-o", "--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config key of `areal train` (as `areal train -o`).")
@click.option("--master-port", type=int, default=29500, show_default=True, help="torchrun rendezvous port.")
@click.option("--controller-port", type=int, default=29400, show_default=True,
              help="Port the controller listens on for trainer rank 0.")
@click.option("--cpus-per-task", type=int, default=16, show_default=True, help="#SBATCH --cpus-per-task.")
@click.option("--time", "time_limit", default=None, help="#SBATCH --time (e.g. 24:00:00).")
@click.option("--partition", default=None, help="#SBATCH --partition.")
@click.option("--account", default=None, help="#SBATCH --account.")
@click.option("--submit", is_flag=True, help="Submit with sbatch after writing the files.")
@one_line_errors
def slurm(config: str, nodes: int, gpus_per_node: int, out_dir: Path, allocation: str | None,
          model_path: Path | None, overrides: tuple[str, ...], master_port: int, controller_port: int,
          cpus_per_task: int, time_limit: str | None, partition: str | None, account: str | None,
          submit: bool) -> None:
    """Write OUT/launch/plan.json and OUT/launch/job.sbatch placing CONFIG's run (an `areal train` recipe or
    YAML) on NODES x GPUS_PER_NODE; --submit also calls sbatch. Bad input: one line, exit 2."""
    from areal_cli.launch.slurm import submit as do_submit
    from areal_cli.launch.slurm import write_slurm_files
    from areal_cli.foundations.errors import UserError
    from areal_cli.launch.setup import plan_for_config

    if any(c.isspace() for c in str(Path(out_dir).resolve())):
        raise UserError(f"--out {out_dir}: a Slurm job's '#SBATCH --output' line cannot hold a path with "
                        "whitespace; choose a folder without spaces")
    if model_path is not None and not (Path(model_path) / "config.json").is_file():
        raise UserError(f"--model {model_path}: not a model directory (no config.json); every node loads it "
                        "from this path, so it must be on the shared filesystem")
    plan = plan_for_config(config, nodes=nodes, gpus_per_node=gpus_per_node, run_dir=out_dir,
                           allocation=allocation, model_path=model_path, overrides=list(overrides),
                           master_port=master_port, controller_port=controller_port)
    try:
        plan_path, sbatch = write_slurm_files(plan, cpus_per_task=cpus_per_task, time_limit=time_limit,
                                              partition=partition, account=account)
    except OSError as e:  # an --out that cannot hold a run (under a file, /proc, no permission)
        raise UserError(f"--out {out_dir}: cannot write the launch files ({e.strerror or e})") from None
    for line in plan.placement.describe():
        click.echo(line)
    click.echo(f"wrote {plan_path} and {sbatch}")
    if submit:
        click.echo(f"submitted job {do_submit(sbatch)}")
    else:
        click.echo(f"submit with: sbatch {shlex.quote(str(sbatch))}")


@launch.command("node")
@click.option("--plan", "plan_path", type=click.Path(path_type=Path), required=True, help="launch/plan.json.")
@click.option("--node-rank", type=int, default=None, help="This node's index (default: $SLURM_NODEID).")
@click.option("--hosts", default=None, help="Host names of the nodes, comma-separated, node 0 first "
                                            "(default: the plan's; the sbatch script passes Slurm's).")
@one_line_errors
def node(plan_path: Path, node_rank: int | None, hosts: str | None) -> None:
    """Run one node of a launch plan: its servers, its trainer ranks (torchrun), the controller on node 0.
    Exit 0 when the run is done; 1 when a node failed (one line naming it); 2 on bad input."""
    from areal_cli.launch.node import run_node

    sys.exit(run_node(plan_path, node_rank=node_rank, hosts=_hosts(hosts)))

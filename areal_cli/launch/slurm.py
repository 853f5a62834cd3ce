"""Slurm files of a multi-node launch: ``run_dir/launch/plan.json`` and ``run_dir/launch/job.sbatch``.

The sbatch script asks for ``--nodes N --ntasks-per-node=1 --gpus-per-node G --cpus-per-task C``, clears the
run's ``discovery/`` and ``launch/status/`` (files of an earlier launch), reads the job's host names with
``scontrol show hostnames "$SLURM_JOB_NODELIST"`` and runs one task per node::

    srun --kill-on-bad-exit=1 PYTHON -m areal_cli.commands.main launch node --plan RUN/launch/plan.json --hosts h1,h2,...

Each task takes its node rank from ``$SLURM_NODEID`` (:mod:`areal_cli.launch.node`). ``PYTHON`` is the
interpreter that wrote the files (the run directory and the environment must be on a filesystem every node
mounts at the same path).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from areal_cli.foundations.atomic import write_atomic_many
from areal_cli.foundations.errors import UserError
from areal_cli.launch.plan import LaunchPlan, write_plan


def sbatch_text(plan: LaunchPlan, *, python: str = sys.executable, cpus_per_task: int = 16,
                job_name: str = "areal", time_limit: str | None = None, partition: str | None = None,
                account: str | None = None) -> str:
    """The ``job.sbatch`` script of ``plan`` (see the module docstring)."""
    p = plan.placement
    run = Path(plan.run_dir)
    q = shlex.quote
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name}",
             f"#SBATCH --nodes={p.nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if p.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={p.gpus_per_node}")
    lines.append(f"#SBATCH --cpus-per-task={cpus_per_task}")
    lines.append(f"#SBATCH --output={run / 'logs' / 'slurm-%j.out'}")
    if time_limit:
        lines.append(f"#SBATCH --time={time_limit}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    lines += [
        f"# areal launch: {p.allocation.text} on {p.nodes} node(s) x {p.gpus_per_node} GPU(s)",
        *[f"#   {line}" for line in p.describe()],
        "set -euo pipefail",
        f"RUN={q(str(run))}",
        'rm -rf "$RUN/discovery" "$RUN/launch/status"  # files of an earlier launch of this plan',
        'HOSTS=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)',
        'echo "areal launch: job $SLURM_JOB_ID on $HOSTS"',
        f"srun --kill-on-bad-exit=1 --nodes={p.nodes} --ntasks-per-node=1 {q(python)} -m areal_cli.commands.main launch node "
        f'--plan "$RUN/launch/plan.json" --hosts "$HOSTS"',
    ]
    return "\n".join(lines) + "\n"


def write_slurm_files(plan: LaunchPlan, **sbatch_kwargs) -> tuple[Path, Path]:
    """Write ``plan.json`` (+ ``authkey``) and ``job.sbatch`` (mode 0755) under ``run_dir/launch``; create
    ``run_dir/logs``. Returns (plan path, sbatch path)."""
    plan_path = write_plan(plan)
    sbatch = plan.launch_dir / "job.sbatch"
    write_atomic_many({sbatch: sbatch_text(plan, **sbatch_kwargs)})
    sbatch.chmod(0o755)
    (Path(plan.run_dir) / "logs").mkdir(parents=True, exist_ok=True)
    return plan_path, sbatch


def submit(sbatch: Path) -> str:
    """``sbatch --parsable SCRIPT``; returns the job id.

    Raises:
        UserError: ``sbatch`` not on PATH, or it refused the script (its message).
    """
    exe = shutil.which("sbatch")
    if exe is None:
        raise UserError(f"sbatch: not found on PATH (no Slurm here); the job script is written: {sbatch}")
    r = subprocess.run([exe, "--parsable", str(sbatch)], capture_output=True, text=True)
    if r.returncode != 0:
        why = (r.stderr or r.stdout).strip().splitlines()
        raise UserError(f"sbatch {sbatch}: refused (exit {r.returncode}): {why[-1] if why else 'no message'}")
    return r.stdout.strip().split(";")[0]

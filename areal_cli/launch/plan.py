"""The launch plan of a multi-node run: what every node starts, as JSON in ``run_dir/launch/plan.json``.

Fields of the JSON (version :data:`PLAN_VERSION`):

- ``run_dir``: absolute path of the shared run directory (every node must see it at that path).
- ``placement``: :meth:`areal_cli.recipes.placement.Placement.to_dict` (allocation, nodes, GPUs per node, servers,
  trainer ranks, controller node).
- ``server``: ``engine`` (``"embedded"`` | ``"sglang"``), ``model_path``, ``sglang`` (fields of
  :class:`~areal_cli.rollout.sglang_launcher.SGLangServerArgs` besides model/host/port: tp_size = the
  allocation's inference ``m``, pp_size = its ``p``), ``embedded_extra_args``, ``startup_timeout_s``.
- ``trainer``: ``args``: what torchrun runs on every training node (default ``-m areal_cli.trainer.worker``);
  ``env``: extra environment of the ranks; ``threads``: ``OMP_NUM_THREADS``.
- ``controller``: ``command``: argv of the controller on node 0 (``{python}`` replaced by the node's
  interpreter; default ``{python} -m areal_cli.commands.main train CONFIG --out RUN/train --no-live -o rollout.n_servers=S
  -o parallel.data=D -o parallel.tensor=T -o parallel.pipeline=P``); ``env``.
- ``ports``: ``master`` (torchrun rendezvous on the first training node), ``controller`` (the controller
  listens there for trainer rank 0: ``AREAL_CONTROLLER_LISTEN`` / ``AREAL_CONTROLLER_ADDR``).
- ``hosts``: host names by node index, or null (given at run time: ``--hosts``, which the sbatch script
  fills from ``scontrol show hostnames $SLURM_JOB_NODELIST``).

Files next to it: ``authkey`` (hex, mode 0600: the controller / trainer rank 0 connection key).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_cli.foundations.atomic import write_json_atomic
from areal_cli.foundations.errors import UserError
from areal_cli.recipes.placement import Placement, placement_from_dict

PLAN_VERSION = 1
PYTHON = "{python}"  # placeholder in commands: the interpreter of the node running them
TRAINER_ARGS = ["-m", "areal_cli.trainer.worker"]


@dataclass
class LaunchPlan:
    """See the module docstring for each field."""

    run_dir: str
    placement: Placement
    server: dict[str, Any]
    trainer: dict[str, Any]
    controller: dict[str, Any]
    ports: dict[str, int]
    hosts: list[str] | None = None
    version: int = PLAN_VERSION

    @property
    def launch_dir(self) -> Path:
        return Path(self.run_dir) / "launch"

    @property
    def plan_path(self) -> Path:
        return self.launch_dir / "plan.json"

    @property
    def authkey_path(self) -> Path:
        return self.launch_dir / "authkey"

    def to_dict(self) -> dict:
        return {"version": self.version, "run_dir": self.run_dir, "placement": self.placement.to_dict(),
                "server": self.server, "trainer": self.trainer, "controller": self.controller, "ports": self.ports,
                "hosts": self.hosts}


def read_plan(path: str | Path) -> LaunchPlan:
    """Load ``plan.json``.

    Raises:
        UserError: ``PATH: ...`` missing, not JSON, wrong version, missing field, or a placement that differs
            from the one its allocation gives.
    """
    path = Path(path)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: launch plan not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a launch plan ({e})") from None
    if not isinstance(d, dict) or d.get("version") != PLAN_VERSION:
        raise UserError(f"{path}: launch plan version {d.get('version') if isinstance(d, dict) else None!r}, "
                        f"expected {PLAN_VERSION}")
    try:
        return LaunchPlan(d["run_dir"], placement_from_dict(d["placement"]), d["server"], d["trainer"],
                          d["controller"], {k: int(v) for k, v in d["ports"].items()}, d.get("hosts"))
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{path}: launch plan field missing or malformed ({e})") from None


def write_plan(plan: LaunchPlan) -> Path:
    """Write ``plan.json`` atomically and, if absent, ``authkey`` (32 random bytes as hex, mode 0600)."""
    plan.launch_dir.mkdir(parents=True, exist_ok=True)
    if not plan.authkey_path.exists():
        fd = os.open(plan.authkey_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    write_json_atomic(plan.plan_path, plan.to_dict())
    return plan.plan_path


def controller_command(config: str, run_dir: Path, placement: Placement, overrides: list[str] = ()) -> list[str]:
    """The default controller argv: ``areal train CONFIG`` into ``RUN/train`` with the allocation's degrees and
    ``rollout.engine=external`` (servers started by each node)."""
    a = placement.allocation
    cmd = [PYTHON, "-m", "areal_cli.commands.main", "train", config, "--out", str(Path(run_dir) / "train"), "--no-live"]
    # the servers run on their nodes (`areal launch node`); the controller finds them in $AREAL_LLM_SERVER_ADDRS
    engine = ["rollout.engine=external"] + ([f"rollout.sglang_tp_size={a.gen.tp}"] if a.gen is not None else [])
    for o in list(overrides) + [f"rollout.n_servers={a.n_servers}", *engine, f"parallel.data={a.train.dp}",
                                f"parallel.tensor={a.train.tp}", f"parallel.pipeline={a.train.pp}"]:
        cmd += ["-o", o]
    return cmd


def build_plan(placement: Placement, run_dir: str | Path, *, controller_cmd: list[str],
               model_path: str | Path | None = None, sglang: dict | None = None,
               embedded_extra_args: list[str] = (), startup_timeout_s: float = 600.0,
               trainer_args: list[str] | None = None, trainer_env: dict | None = None, trainer_threads: int = 1,
               controller_env: dict | None = None, master_port: int = 29500, controller_port: int = 29400,
               hosts: list[str] | None = None) -> LaunchPlan:
    """Assemble a :class:`LaunchPlan` (nothing written).

    Args:
        controller_cmd: argv of the controller (:func:`controller_command`), ``{python}`` allowed.
        model_path: model directory every server loads (required when the placement has servers).
        sglang: extra :class:`SGLangServerArgs` fields for ``sglang`` servers (e.g. mem_fraction_static).
        trainer_args: what torchrun runs (default :data:`TRAINER_ARGS`); tests pass a script.
        hosts: host names by node (None: given at run time).
    Raises:
        UserError: a ``vllm`` backend (not launched here), servers without a model directory, ports out of
            range, a host list of the wrong length.
    """
    a = placement.allocation
    engine = a.backend or "embedded"
    if engine == "vllm":
        raise UserError(f"allocation '{a.text}': the vllm backend is not launched by areal (use sglang. or embedded.)")
    if a.n_servers and model_path is None:
        raise UserError(f"allocation '{a.text}': its {a.n_servers} server(s) need a model directory "
                        f"(the config's model.path or --model)")
    for name, port in (("master", master_port), ("controller", controller_port)):
        if not 1 <= int(port) <= 65535:
            raise UserError(f"launch: {name} port {port} is not in [1, 65535]")
    if hosts is not None and len(hosts) != placement.nodes:
        raise UserError(f"launch: {len(hosts)} host(s) given for {placement.nodes} node(s)")
    sg = {"tp_size": a.gen.tp, "pp_size": a.gen.pp} if a.gen is not None else {}
    sg.update(sglang or {})
    return LaunchPlan(
        run_dir=str(Path(run_dir).resolve()), placement=placement,
        server={"engine": engine, "model_path": str(Path(model_path).resolve()) if model_path else None,
                "sglang": sg, "embedded_extra_args": list(embedded_extra_args),
                "startup_timeout_s": float(startup_timeout_s)},
        trainer={"args": list(trainer_args or TRAINER_ARGS), "env": dict(trainer_env or {}),
                 "threads": int(trainer_threads)},
        controller={"command": list(controller_cmd), "env": dict(controller_env or {})},
        ports={"master": int(master_port), "controller": int(controller_port)}, hosts=hosts)


def expand(cmd: list[str], python: str = sys.executable) -> list[str]:
    """Replace the :data:`PYTHON` placeholder with ``python``."""
    return [python if x == PYTHON else x for x in cmd]

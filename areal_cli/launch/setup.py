"""From an ``areal train`` config (recipe name or YAML) to a :class:`~areal_cli.launch.plan.LaunchPlan`."""

from __future__ import annotations

from pathlib import Path

from areal_cli.errors import UserError
from areal_cli.launch.plan import LaunchPlan, build_plan, controller_command
from areal_cli.placement import config_allocation, parse_allocation, place


def plan_for_config(config: str, *, nodes: int, gpus_per_node: int, run_dir: str | Path,
                    allocation: str | None = None, model_path: str | Path | None = None,
                    overrides: list[str] = (), master_port: int = 29500, controller_port: int = 29400,
                    hosts: list[str] | None = None, **plan_kwargs) -> LaunchPlan:
    """Check ``config`` as ``areal train`` would (with the allocation's degrees as overrides), place the
    allocation on ``nodes`` x ``gpus_per_node`` and build the plan (nothing written).

    Raises:
        UserError: unknown / invalid config or override, an allocation impossible on the nodes, servers
            without a model directory, a run directory that already holds a launch plan.
    """
    from areal_cli.config import apply_overrides, load_recipe

    cfg, path = load_recipe(config)
    cfg = apply_overrides(cfg, list(overrides))
    alloc = parse_allocation(allocation or config_allocation(cfg))
    placement = place(alloc, nodes=nodes, gpus_per_node=gpus_per_node)
    cmd = controller_command(str(path.resolve()) if Path(config).suffix in (".yaml", ".yml") else config,
                             Path(run_dir).resolve(), placement, list(overrides))
    degree_overrides = [cmd[i + 1] for i, x in enumerate(cmd) if x == "-o"]
    apply_overrides(cfg, degree_overrides)  # the controller's final config must be valid
    existing = Path(run_dir) / "launch" / "plan.json"
    if existing.exists():
        raise UserError(f"{existing}: already holds a launch plan; choose another --out")
    return build_plan(placement, run_dir, controller_cmd=cmd, model_path=model_path or cfg.model_path,
                      master_port=master_port, controller_port=controller_port, hosts=hosts, **plan_kwargs)

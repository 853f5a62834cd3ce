"""From an ``areal train`` config (recipe name or YAML) to a :class:`~areal_cli.launch.plan.LaunchPlan`."""

from __future__ import annotations

from pathlib import Path

from areal_cli.foundations.errors import UserError
from areal_cli.launch.plan import LaunchPlan, build_plan, controller_command
from areal_cli.recipes.placement import config_allocation, parse_allocation, place


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
    import shlex

    from areal_cli.config import apply_overrides
    from areal_cli.recipes import load_train_config

    cfg, path = load_train_config(config)
    published = _published_recipe(config)
    overrides = list(overrides)
    if published is not None:  # a trainer-gpu RL recipe: its base model and data must be on the shared filesystem
        if model_path is None:
            raise UserError(f"recipe '{published.name}': --model is required: its base model "
                            f"({published.file.model.repo}) on the shared filesystem (`areal download {published.name} "
                            f"--local-dir DIR`, then --model DIR/model)")
        if not any(o.split("=", 1)[0].strip() in ("dataset", "task.dataset") for o in overrides):
            data_path = published.file.data.files[0].path if published.file.data.files else "FILE"
            raise UserError(f"recipe '{published.name}': -o task.dataset=... is required: its training data on the shared "
                            f"filesystem (`areal download {published.name} --local-dir DIR`, then -o "
                            f"task.dataset=DIR/data/{data_path})")
        _check_model_dir(Path(model_path))
        overrides = [f"model.path={Path(model_path).resolve()}", *overrides]
        allocation = allocation or published.file.resources.allocation
        if allocation is None:
            raise UserError(f"recipe '{published.name}': its allocation is not published; pass --allocation")
    cfg = apply_overrides(cfg, overrides)
    if published is not None:
        # the controller runs on node 0, maybe in another directory: absolute paths; and the data is read now,
        # so that a missing or malformed file fails here rather than after every node has started
        overrides = [f"task.dataset={cfg.task.dataset}" if o.split("=", 1)[0].strip() in ("dataset", "task.dataset") else o
                     for o in overrides]
        from areal_cli.tasks.task import Task
        from areal_cli.train_loop import steps_for_epochs

        task = Task(cfg)
        if cfg.loop.epochs:
            steps_for_epochs(cfg, task)
    alloc = parse_allocation(allocation or config_allocation(cfg))
    placement = place(alloc, nodes=nodes, gpus_per_node=gpus_per_node)
    cmd = controller_command(str(path.resolve()) if Path(config).suffix in (".yaml", ".yml") else config,
                             Path(run_dir).resolve(), placement, list(overrides))
    degree_overrides = [cmd[i + 1] for i, x in enumerate(cmd) if x == "-o"]
    apply_overrides(cfg, degree_overrides)  # the controller's final config must be valid
    existing = Path(run_dir) / "launch" / "plan.json"
    if existing.exists():
        raise UserError(f"{existing}: already holds a launch plan; choose another --out")
    if cfg.rollout.engine == "sglang" and "sglang" not in plan_kwargs:  # the servers each node starts
        context = cfg.rollout.sglang_context_length or (cfg.task.max_prompt_len or 1024) + cfg.rollout.max_new_tokens
        plan_kwargs["sglang"] = {"mem_fraction_static": cfg.rollout.sglang_mem_fraction_static, "dtype": cfg.rollout.sglang_dtype or "bfloat16",
                                 "context_length": context,
                                 "skip_tokenizer_init": cfg.rollout.min_new_tokens == 0,
                                 "disable_overlap_schedule": cfg.rollout.interruptible and cfg.rollout.pause_mode == "in_place",
                                 "max_running_requests": cfg.rollout.server_max_running_requests or None,
                                 "max_total_tokens": cfg.rollout.server_max_total_tokens or None,
                                 "extra_args": shlex.split(cfg.rollout.sglang_extra_args)}
    return build_plan(placement, run_dir, controller_cmd=cmd, model_path=model_path or cfg.model.path,
                      master_port=master_port, controller_port=controller_port, hosts=hosts, **plan_kwargs)


def _check_model_dir(path: Path) -> None:
    """A Hugging Face model directory: ``config.json`` with a ``model_type``.

    Raises:
        UserError: missing, unreadable or not a model config.
    """
    import json

    cfg_file = path / "config.json"
    try:
        model_type = json.loads(cfg_file.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if not model_type:
        raise UserError(f"--model {path}: not a Hugging Face model directory ({cfg_file} with a model_type); "
                        f"every node loads the base model from this path on the shared filesystem")


def _published_recipe(config: str):
    """The locked ``trainer: gpu`` recipe named by ``config`` (a name or a recipe file), else None."""
    from areal_cli.recipes import load_recipe, recipe_path

    try:
        path = recipe_path(config)
    except UserError:
        return None
    import yaml

    try:
        head = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(head, dict) or "kind" not in head or head.get("trainer") != "gpu":
        return None
    return load_recipe(path)

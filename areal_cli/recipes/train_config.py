"""What ``areal train`` runs from a recipe: the :class:`~areal_cli.config.TrainConfig` of a locked recipe
(its ``train`` section, or a published GPU recipe mapped onto the kit) or of a train config file.

A recipe file is either a locked recipe (``recipes/*.yaml``, with a ``kind``: :mod:`areal_cli.recipes.loader`)
or a train config file: a YAML mapping of :class:`~areal_cli.config.TrainConfig` settings (a quick user recipe,
:func:`areal_cli.config.config_from_file`). :func:`load_train_config` tells them apart and returns the config;
:func:`check_runs_here` refuses, in one line naming every edit it needs, a published GPU recipe this machine
cannot run with the settings in force.
"""

from __future__ import annotations

from pathlib import Path

from areal_cli.config import TrainConfig, config_from_file
from areal_cli.foundations.errors import UserError
from areal_cli.recipes.gpu_train import gpu_train_config
from areal_cli.recipes.loader import Recipe, find_recipe_file, load_recipe, recipe_names, refuse_unknown_preset
from areal_cli.foundations.typed_yaml import read_yaml


def load_train_config(name_or_path: str) -> tuple[TrainConfig, Path]:
    """The config ``areal train`` runs from a recipe given by name (``recipes/NAME.yaml``) or by path: a locked
    recipe's (:func:`train_config_from_recipe`) or a train config file's (:func:`areal_cli.config.config_from_file`).

    Returns:
        ``(config, recipe file)``.
    Raises:
        UserError: unknown recipe name, unreadable/invalid YAML, unknown key, wrong type (file:line).
    """
    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml"):
        found = find_recipe_file(str(name_or_path))
        if found is None:
            known = ", ".join(recipe_names()) or "none"
            raise UserError(f"unknown recipe '{name_or_path}' (known: {known})")
        p = found
    if not p.is_file():
        raise UserError(f"{p}: recipe file not found")
    data = read_yaml(p, "recipe")
    if isinstance(data, dict) and "kind" in data:
        # A locked recipe (sections model/data/train/resources/eval): validated as a whole by
        # areal_cli.recipes.loader; its ``train`` section holds the TrainConfig keys.
        return train_config_from_recipe(load_recipe(p)), p
    cfg, lines = config_from_file(data, p)
    refuse_unknown_preset(cfg, p, lines.get("task.preset", getattr(data, "line", 1)))
    return cfg, p


def train_config_from_recipe(recipe: Recipe | str | Path, variant: str | None = None) -> TrainConfig:
    """The :class:`TrainConfig` of a recipe (what ``areal train`` runs): a ``trainer: cpu`` recipe's ``train``
    section, or a published RL recipe mapped by :func:`areal_cli.recipes.gpu_train.gpu_train_config` (SGLang servers
    and trainer degrees of its allocation; ``model.path`` and ``task.dataset`` left for the caller: the downloaded
    base model and data file).

    Raises:
        UserError: an SFT recipe (``areal reproduce`` runs it); a setting areal cannot run; unknown variant.
    """
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe)
    if recipe.trainer != "cpu":
        if recipe.kind == "sft":
            raise UserError(f"{recipe.path}: recipe '{recipe.name}' is supervised fine-tuning; `areal reproduce "
                            f"{recipe_ref(recipe)}` runs it (`areal train` runs RL)")
        return gpu_train_config(recipe, variant)[0]
    cfg = recipe.variant(variant)
    assert isinstance(cfg, TrainConfig)
    return cfg.copy()


def recipe_ref(recipe: Recipe) -> str:
    """How a command names ``recipe``: its name when that finds this very file (a shipped recipe, or one in
    ``--recipes-dir``), else its path (a copy elsewhere)."""
    found = find_recipe_file(recipe.name)
    try:
        if found is not None and found.resolve() == recipe.path.resolve():
            return recipe.name
    except OSError:
        pass
    return str(recipe.path)


#: The settings that place a GPU recipe's run: its servers and trainer degrees (from its allocation).
PLACEMENT_KEYS = ("rollout.n_servers", "rollout.sglang_tp_size", "parallel.data", "parallel.tensor",
                  "parallel.pipeline")


def gpu_recipe_edits(recipe: Recipe, cfg: TrainConfig, *, gpus_here: int, sglang_installed: bool) -> list[str]:
    """The edits a published GPU recipe (``trainer: gpu``) still needs before ``cfg`` (its config after ``-o``)
    runs on this machine, each as the overrides that make it and why; [] when it can run (or is not a GPU RL
    recipe, or its servers run elsewhere: ``rollout.engine external``, as ``areal launch`` starts it).

    Needed: ``model.path`` (the published base model, downloaded) and ``task.dataset`` (its data file), which the
    recipe cannot pin to a local path; the ``sglang`` package for ``rollout.engine sglang``; and, while the
    published allocation is in force (none of :data:`PLACEMENT_KEYS` changed), its GPUs.

    Args:
        gpus_here: GPUs of this machine.
        sglang_installed: whether the ``sglang`` package can be imported here.
    """
    if recipe.trainer != "gpu" or recipe.kind == "sft" or cfg.rollout.engine == "external":
        return []
    from areal_cli.config import get_value

    ref = recipe_ref(recipe)
    rf = recipe.file
    edits = []
    if cfg.model.path is None:
        model = rf.model.repo or rf.model.builtin
        edits.append(f"-o model.path=DIR/model (its base model {model}: `areal download {ref} --local-dir DIR`)")
    if not cfg.task.dataset:
        file = rf.data.files[0].path if rf.data.files else "FILE"
        edits.append(f"-o task.dataset=DIR/data/{file} (its data {rf.data.repo or rf.data.builtin}, from the same "
                     f"download)")
    if cfg.rollout.engine == "sglang" and not sglang_installed:
        from areal_cli.config.sections import RolloutSection

        caps = " ".join(f"-o rollout.{n}={getattr(RolloutSection(), n)}" for n in
                        ("server_max_running_requests", "server_max_total_tokens") if not getattr(cfg.rollout, n))
        edits.append(f"the 'sglang' package for rollout.engine sglang (not installed here), or -o "
                     f"rollout.engine=embedded{' ' + caps if caps else ''} to serve with the CPU engine")
    r = rf.resources
    if r.allocation and gpus_here < r.gpus:
        published = gpu_train_config(recipe)[0]
        if all(get_value(cfg, k) == get_value(published, k) for k in PLACEMENT_KEYS):
            small = " ".join(f"-o {k}=1" for k in PLACEMENT_KEYS)
            edits.append(f"{small} to run it on this machine (its allocation {r.allocation} needs {r.gpus} GPUs "
                         f"on {r.nodes} node(s); this machine has {gpus_here}), or on a cluster `areal launch slurm "
                         f"{ref} --nodes {r.nodes} --gpus-per-node {r.gpus_per_node} ...`")
    return edits


def check_runs_here(cfg: TrainConfig, path: Path, *, gpus_here: int | None = None,
                    sglang_installed: bool | None = None) -> None:
    """Refuse a published GPU recipe that this machine cannot run with ``cfg`` (its config after ``-o``), with
    one line naming every edit it needs at once (:func:`gpu_recipe_edits`), before anything starts; nothing
    for other recipes and train config files.

    Args:
        path: the recipe file ``cfg`` came from (:func:`load_train_config`).
        gpus_here: GPUs of this machine (default: :func:`areal_cli.foundations.manifest.gpu_count`, ``nvidia-smi``).
        sglang_installed: default: whether ``sglang`` can be imported.
    Raises:
        UserError: ``FILE: recipe 'NAME' (trainer gpu) cannot run here as written; it needs N edit(s): (1) ...``.
    """
    data = read_yaml(path, "recipe")
    if not (isinstance(data, dict) and data.get("trainer") == "gpu" and data.get("kind") != "sft"):
        return
    recipe = load_recipe(path)
    if gpus_here is None:
        from areal_cli.foundations.manifest import gpu_count

        gpus_here = gpu_count()
    if sglang_installed is None:
        import importlib.util

        sglang_installed = importlib.util.find_spec("sglang") is not None
    edits = gpu_recipe_edits(recipe, cfg, gpus_here=gpus_here, sglang_installed=sglang_installed)
    if edits:
        listed = "; ".join(f"({i}) {e}" for i, e in enumerate(edits, 1))
        raise UserError(f"{path}: recipe '{recipe.name}' (trainer gpu) cannot run here as written; it needs "
                        f"{len(edits)} edit{'s' if len(edits) > 1 else ''}: {listed}")

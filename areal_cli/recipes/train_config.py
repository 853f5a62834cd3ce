"""What ``areal train`` runs from a recipe: the :class:`~areal_cli.config.TrainConfig` of a locked recipe
(its ``train`` section, or a published GPU recipe mapped onto the kit) or of a train config file.

A recipe file is either a locked recipe (``recipes/*.yaml``, with a ``kind``: :mod:`areal_cli.recipes.loader`)
or a train config file: a YAML mapping of :class:`~areal_cli.config.TrainConfig` settings (a quick user recipe,
:func:`areal_cli.config.config_from_file`). :func:`load_train_config` tells them apart and returns the config.
"""

from __future__ import annotations

from pathlib import Path

from areal_cli.config import TrainConfig, config_from_file
from areal_cli.errors import UserError
from areal_cli.recipes.gpu_train import gpu_train_config
from areal_cli.recipes.loader import Recipe, find_recipe_file, load_recipe, recipe_names, refuse_unknown_preset
from areal_cli.typed_yaml import read_yaml


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
                            f"{recipe.name}` runs it (`areal train` runs RL)")
        return gpu_train_config(recipe, variant)[0]
    cfg = recipe.variant(variant)
    assert isinstance(cfg, TrainConfig)
    return cfg.copy()

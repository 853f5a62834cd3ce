"""Where the kit's own files live: locked recipes, benchmark declarations, bench scenarios and data cards.

In a checkout (and an editable install) they are the repository's top-level folders (``recipes/``,
``evaluation/``, ``benchmarks/scenarios/``, ``data_cards/``). A built wheel carries copies of the same folders
as package data under ``areal_cli/_shipped/`` (``setup.py``'s ``build_py``), so ``pip install .``, a wheel and
pipx give the same CLI as a checkout. This module is a foundation: it imports nothing of the kit.
"""

from __future__ import annotations

import os
from pathlib import Path

#: shipped folder name -> its path in the repository
SHIPPED = {"recipes": "recipes", "evaluation": "evaluation", "scenarios": "benchmarks/scenarios",
           "data_cards": "data_cards"}

_PKG = Path(__file__).resolve().parents[1]  # the areal_cli package


def shipped_dir(name: str) -> Path:
    """The folder of shipped files ``name`` (a key of :data:`SHIPPED`): inside the installed package when it
    carries one (wheel install), else in the repository holding this package (checkout, editable install).

    Raises:
        KeyError: ``name`` is not a shipped folder.
    """
    rel = SHIPPED[name]
    inside = _PKG / "_shipped" / name
    return inside if inside.is_dir() else _PKG.parent / rel


def user_recipe_dirs() -> list[Path]:
    """The user's own recipe folders, from ``$AREAL_RECIPES_DIR`` (``os.pathsep``-separated; ``areal
    --recipes-dir`` sets it), in the order given; they come before the shipped recipes."""
    env = os.environ.get("AREAL_RECIPES_DIR", "")
    return [Path(p).expanduser() for p in env.split(os.pathsep) if p]


def recipe_dirs() -> list[Path]:
    """Where recipe names are looked up, first match wins: the user's folders, then the shipped recipes."""
    return [*user_recipe_dirs(), shipped_dir("recipes")]

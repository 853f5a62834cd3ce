"""``areal ls`` and ``areal download``: the recipe catalogue on the command line.

Click command objects, registered by ``areal_cli/commands/main.py`` (``main.add_command(ls)``,
``main.add_command(download)``). Importing this module imports click, yaml and the stdlib only: rich is
imported when ``ls`` prints, huggingface_hub when ``download`` runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from areal_cli.commands.error_contract import one_line_errors


def _fmt_value(m) -> str:
    """One headline number, e.g. ``lcb_v5 63.0%``, ``codeforces 1962``, ``14.8 h (sync)``, ``acc >= 0.9``."""
    if m.unit == "percent":
        v = f"{m.value:.1f}%"
    elif m.unit == "elo":
        v = f"{m.value:.0f}"
    elif m.unit == "hours":
        v = f"{m.value:.1f} h"
    elif m.unit == "ratio":
        v = f"{m.value:g}x"
    else:
        v = f"{m.value:g}"
    if m.benchmark == "training":
        label = m.metric.replace("wall_clock_hours", "train time")
    elif m.metric in ("pass@1", "max_accuracy", "rating"):
        label = m.benchmark
    else:
        label = f"{m.benchmark} {m.metric.replace('_', ' ')}"
    text = f"{label} {'>= ' if m.check == 'at_least' else ''}{v}"
    return text + (f" ({m.variant})" if m.variant else "")


def _ref_text(ref) -> str:
    if ref is None:
        return "-"
    if ref.builtin:
        return f"built-in {ref.builtin}"
    return ref.repo + ("" if ref.revision else " *")


def _load_all() -> list:
    """(recipe, expected file) for every locked recipe. Raises: UserError (file:line) for an invalid one."""
    from areal_cli.recipes import load_recipe, recipe_names

    return [(r, r.expected) for r in map(load_recipe, recipe_names())]


def catalogue(pairs: list | None = None) -> list[dict]:
    """Every locked recipe as a JSON-able row (what ``areal ls --json`` prints).

    Raises:
        UserError: a recipe or expected file is invalid (file:line).
    """
    from areal_cli.recipes import headline

    def ref(x):
        return None if x is None else {"repo": x.repo, "revision": x.revision, "builtin": x.builtin}

    rows = []
    for r, exp in pairs if pairs is not None else _load_all():
        f = r.file
        rows.append({
            "name": r.name, "kind": f.kind, "trainer": f.trainer, "description": f.description.strip(),
            "model": ref(f.model), "published_model": ref(f.published_model),
            "data": {**ref(f.data), "files": [x.path for x in f.data.files], "complete": f.data.complete},
            "gpus": f.resources.gpus, "nodes": f.resources.nodes, "allocation": f.resources.allocation,
            "eval": {"protocol": f.eval.protocol, "benchmarks": f.eval.benchmarks, "n_samples": f.eval.n_samples},
            "headline": [{"key": m.key, "value": m.value, "unit": m.unit, "check": m.check,
                          "text": _fmt_value(m)} for m in headline(r, exp)],
            "path": str(r.path), "expected": str(r.expected_path),
        })
    return rows


@click.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print the catalogue as JSON.")
@one_line_errors
def ls(as_json: bool) -> None:
    """List the locked recipes: kind, model, data, GPUs, headline expected numbers."""
    pairs = _load_all()
    rows = catalogue(pairs)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="areal recipes", title_justify="left")
    for col, kw in (("recipe", {"no_wrap": True}), ("kind", {"no_wrap": True}), ("model", {}), ("data", {}),
                    ("GPUs", {"justify": "right"}), ("expected (headline)", {})):
        table.add_column(col, **kw)
    unpinned = False
    for (r, _), row in zip(pairs, rows):
        f = r.file
        model, data = _ref_text(f.model), _ref_text(f.data)
        if not f.data.complete:
            data += " (+unreleased)"
        unpinned |= "*" in model + data
        gpus = str(f.resources.gpus) if f.trainer == "gpu" else "CPU"
        table.add_row(r.name, f.kind, model, data, gpus, "; ".join(h["text"] for h in row["headline"]))
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table)
    if unpinned:
        console.print("* revision not pinned (see the recipe's revision_note); `areal download` needs --allow-unpinned")


@click.command("download")
@click.argument("target")
@click.option("--local-dir", type=click.Path(path_type=Path), default=None,
              help="Download here (a recipe: one sub-folder per part) instead of the Hugging Face cache.")
@click.option("--revision", default=None, help="Commit SHA for a single repo id (recipes pin their own).")
@click.option("--dataset", is_flag=True, help="TARGET is a dataset repo id (same as a datasets/ prefix).")
@click.option("--what", "roles", multiple=True, type=click.Choice(["model", "data", "published"]),
              help="Parts of a recipe to fetch (repeatable). Default: model and data.")
@click.option("--allow-unpinned", is_flag=True, help="Also download repos without a pinned commit (as of today).")
@one_line_errors
def download(target: str, local_dir: Path | None, revision: str | None, dataset: bool,
             roles: tuple[str, ...], allow_unpinned: bool) -> None:
    """Download RECIPE (its model and data), a MODEL repo id, or a DATASET repo id, at pinned revisions.

    Resumable; honours HF_HOME, HF_TOKEN and HF_HUB_OFFLINE; verifies the recipe's sha256 checksums.
    """
    from areal_cli.reproduce.download import download as run_download

    got = run_download(target, local_dir=local_dir, revision=revision, allow_unpinned=allow_unpinned,
                       dataset=dataset, roles=roles or ("model", "data"))
    if not got:
        click.echo(f"{target}: built-in model and data, nothing to download")
    for role, path in got.items():
        click.echo(f"{role}: {path}")

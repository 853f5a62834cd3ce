"""The plan of a reproduction (:func:`make_plan`): what ``areal reproduce`` would download, train or evaluate,
on which hardware (the allocation placed on the nodes), for how long, and which expected numbers it checks.
Nothing is downloaded or written; bad input is refused here, in one line, before a run starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_cli.foundations.errors import UserError
from areal_cli.recipes.placement import Allocation, Placement, config_allocation, parse_allocation, place
from areal_cli.recipes import (
    EVAL_OVERRIDE_KEYS,
    TRAINING_BENCHMARKS,
    UNSUPPORTED_BENCHMARKS,
    ExpectedMetric,
    Recipe,
    eval_vocabulary,
)
from areal_cli.reproduce.eval_needs import eval_needs, pin_commands
from areal_cli.reproduce.hours import HoursEstimate, estimate_hours


def recipe_placement(recipe: Recipe, variant: str | None = None, *, nodes: int | None = None,
                     gpus_per_node: int | None = None) -> tuple[Allocation | None, Placement | None]:
    """The allocation of ``recipe`` placed on its published hardware, or on ``nodes`` x ``gpus_per_node``.

    GPU recipes: ``resources.allocation`` (None when not published) on ``resources.nodes`` x
    ``resources.gpus_per_node`` (= gpus / nodes). CPU recipes: what ``areal train`` runs
    (:func:`areal_cli.recipes.placement.config_allocation`) on one host with ``gpus_per_node = 0`` (processes).

    Raises:
        UserError: the layout is impossible on the given hardware (one line, :func:`areal_cli.recipes.placement.place`),
            or ``nodes`` / ``gpus_per_node`` given for a recipe that publishes no allocation.
    """
    r = recipe.file.resources
    if recipe.trainer == "cpu":
        text, default_nodes, default_gpn = config_allocation(recipe.variant(variant)), 1, 0
    else:
        text, default_nodes, default_gpn = r.allocation, r.nodes, r.gpus_per_node
    if text is None:
        if nodes is not None or gpus_per_node is not None:
            raise UserError(f"recipe '{recipe.name}' publishes no allocation string ({' '.join((r.note or '').split())}); "
                            f"--nodes/--gpus-per-node have nothing to place")
        return None, None
    alloc = parse_allocation(text)
    return alloc, place(alloc, nodes=default_nodes if nodes is None else nodes,
                        gpus_per_node=default_gpn if gpus_per_node is None else gpus_per_node)


@dataclass
class EvalGroup:
    """One ``areal eval`` run of a reproduction: a benchmark, its settings, the expected keys it measures."""

    name: str  # output sub-folder (the benchmark, with a suffix when it has several settings)
    benchmark: str
    settings: dict[str, Any]  # protocol, n_samples, temperature, top_p, max_new_tokens
    date_window: tuple[str, str] | None
    keys: list[str]


@dataclass
class Plan:
    """What a reproduction will do (see :func:`make_plan`). ``blocker``: why it cannot run here (None: it can)."""

    recipe: Recipe
    mode: str  # "retrain" | "eval_only"
    subject: str  # "trained" (retrain) | "published" | "base"
    variant: str | None
    overrides: list[str]
    downloads: list[Any]  # areal_cli.reproduce.download.DownloadItem
    gpus_needed: int
    allocation: Allocation | None  # the recipe's allocation string, parsed (CPU recipes: embedded processes)
    placement: Placement | None  # where servers, trainer ranks and the controller run (None: not published)
    gpus_here: int
    hours: HoursEstimate
    eval_groups: list[EvalGroup]
    expected: list[ExpectedMetric]
    blocker: str | None = None
    notes: list[str] = field(default_factory=list)
    eval_needs: Any = None  # areal_cli.reproduce.eval_needs.EvalNeeds: GPUs, memory, tokens, time (None: no eval)
    pins: list[tuple[str, str]] = field(default_factory=list)  # (repo, exact commands) of each unpinned download


def relevant_entries(recipe: Recipe, mode: str, subject: str, variant: str | None) -> list[ExpectedMetric]:
    """The expected entries a run checks (the same selection as :func:`areal_cli.recipes.compare`)."""
    models = {subject} if mode == "eval_only" else {"published", "trained"}
    return [m for m in recipe.expected.metrics if m.model in models and m.variant == variant]


def parse_eval_overrides(overrides: list[str]) -> dict[str, Any]:
    """``-o KEY=VALUE`` eval settings for ``--eval-only`` (keys: :data:`EVAL_OVERRIDE_KEYS`).

    Raises:
        UserError: ``-o ITEM: ...`` malformed, unknown key, or a value of the wrong type.
    """
    out: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            raise UserError(f"-o {item}: expected key=value")
        if key not in EVAL_OVERRIDE_KEYS:
            raise UserError(f"-o {item}: field '{key}': unknown eval setting (with --eval-only: "
                            f"{', '.join(EVAL_OVERRIDE_KEYS)})")
        tp = EVAL_OVERRIDE_KEYS[key]
        try:
            value = tp(raw.strip())
        except ValueError:
            raise UserError(f"-o {item}: field '{key}': expected {tp.__name__}, got {raw!r}") from None
        if tp is not str and not (value > 0 or (key == "temperature" and value == 0)):
            raise UserError(f"-o {item}: field '{key}': must be > 0" + (" (or 0 = greedy)" if key == "temperature" else ""))
        if key == "top_p" and value > 1:
            raise UserError(f"-o {item}: field 'top_p': must be in (0, 1]")
        if key == "protocol":
            known = eval_vocabulary()[0]
            if value not in known:
                raise UserError(f"-o {item}: field 'protocol': unknown protocol (known: {', '.join(known)})")
        out[key] = value
    return out


def eval_groups(recipe: Recipe, entries: list[ExpectedMetric], overrides: dict[str, Any]) -> list[EvalGroup]:
    """One group per (benchmark, eval_overrides) among ``entries`` that ``areal eval`` can measure.

    Settings: the recipe's ``eval`` section, then the entry's ``eval_overrides``, then ``-o`` overrides.
    """
    ev = recipe.file.eval
    base = {"protocol": ev.protocol, "n_samples": ev.n_samples, "temperature": ev.temperature, "top_p": ev.top_p,
            "max_new_tokens": ev.max_new_tokens}
    groups: list[EvalGroup] = []
    for bench in ev.benchmarks:
        if bench in UNSUPPORTED_BENCHMARKS or bench in TRAINING_BENCHMARKS:
            continue
        by_over: dict[tuple, list[str]] = {}
        for m in entries:
            if m.benchmark == bench and m.evaluated and m.check != "report":
                by_over.setdefault(tuple(sorted(m.eval_overrides.items())), []).append(m.key)
        window = ev.date_windows.get(bench)
        for i, (over, keys) in enumerate(by_over.items()):
            name = bench if len(by_over) == 1 else f"{bench}-{i + 1}"
            groups.append(EvalGroup(name, bench, {**base, **dict(over), **overrides},
                                    tuple(window.split("..")) if window else None, keys))
    return groups


def make_plan(recipe: Recipe, *, eval_only: bool = False, subject: str | None = None, variant: str | None = None,
              overrides: list[str] | tuple[str, ...] = (), gpus_here: int | None = None,
              model_dir: Path | None = None, nodes: int | None = None, gpus_per_node: int | None = None) -> Plan:
    """Resolve what ``areal reproduce`` would do for ``recipe`` (nothing is downloaded or written).

    Args:
        eval_only: evaluate a checkpoint (``subject``: ``published`` default, or ``base``) instead of training.
        overrides: ``-o KEY=VALUE``: TrainConfig keys for a CPU retrain, eval settings with ``eval_only``.
        gpus_here: GPUs of this machine (default: :func:`areal_cli.foundations.manifest.gpu_count`).
        model_dir: a local checkpoint to evaluate instead of downloading one (``eval_only``).
        nodes, gpus_per_node: hardware to place the allocation on (default: the recipe's published
            resources; :func:`recipe_placement`).
    Raises:
        UserError: unknown variant, bad subject, no published checkpoint, invalid overrides, an allocation
            impossible on ``nodes`` x ``gpus_per_node``.
    """
    import areal_cli.reproduce.download as dl
    from areal_cli.foundations.manifest import gpu_count

    f = recipe.file
    recipe.variant(variant)  # unknown variant -> UserError listing the known ones
    overrides = list(overrides)
    mode = "eval_only" if eval_only else "retrain"
    if not eval_only:
        if subject not in (None, "trained"):
            raise UserError(f"--subject {subject} applies to --eval-only (a retrain checks the trained model)")
        if model_dir is not None:
            raise UserError("--model applies to --eval-only (the checkpoint to evaluate)")
        subject = "trained"
        if overrides:
            if recipe.kind == "sft":
                raise UserError(f"-o {overrides[0]}: recipe '{recipe.name}' is supervised fine-tuning; -o overrides "
                                f"an RL run's TrainConfig or, with --eval-only, the eval settings")
            from areal_cli.config import apply_overrides
            from areal_cli.recipes import train_config_from_recipe

            apply_overrides(train_config_from_recipe(recipe, variant), overrides)  # validates (UserError)
    else:
        subject = subject or "published"
        if subject not in ("published", "base"):
            raise UserError(f"--subject {subject}: expected 'published' or 'base'")
        if recipe.trainer == "cpu":
            raise UserError(f"recipe '{recipe.name}' has no published checkpoint: its numbers are measured while "
                            f"training; run `areal reproduce {recipe.name}` without --eval-only")
        if subject == "published" and f.published_model is None:
            raise UserError(f"{recipe.path}: recipe '{recipe.name}' has no published checkpoint (its numbers belong "
                            f"to a retrained model); `--eval-only --subject base` evaluates the base model")
        if variant is not None:
            raise UserError(f"--variant {variant}: a variant changes training; --eval-only evaluates one checkpoint")
        parse_eval_overrides(overrides)  # validates (UserError)
    entries = relevant_entries(recipe, mode, subject, variant)
    if eval_only and not entries:
        raise UserError(f"{recipe.expected_path}: no expected numbers for the {subject} model of '{recipe.name}'")

    roles: tuple[str, ...] = ("model", "data") if not eval_only else (("published",) if subject == "published"
                                                                      else ("model",))
    downloads = [] if model_dir is not None else dl.plan(str(recipe.path), roles=roles)
    r = f.resources
    allocation, placement = recipe_placement(recipe, variant, nodes=nodes, gpus_per_node=gpus_per_node)
    here = gpu_count() if gpus_here is None else gpus_here
    hours = estimate_hours(recipe, variant)
    groups = eval_groups(recipe, entries, parse_eval_overrides(overrides) if eval_only else {})

    blocker = None
    if not eval_only and recipe.trainer == "gpu":
        alloc = f"allocation {r.allocation}" if r.allocation else "allocation not published"
        if here < r.gpus:
            blocker = (f"recipe {recipe.name} needs {r.gpus} GPUs ({alloc}); this machine has {here}; use --dry-run, "
                       f"--eval-only, or `areal launch slurm {recipe.name} --nodes {r.nodes} --gpus-per-node "
                       f"{r.gpus_per_node} ...` on a cluster")
        elif r.allocation is None:
            blocker = (f"recipe {recipe.name}: its allocation is not published ({' '.join((r.note or '').split())}); "
                       f"train it with `areal launch slurm {recipe.name} --allocation ...`")
    notes = []
    if not f.data.complete and not eval_only:
        notes.append("part of the published training data was never released (data.complete: false): a retrain "
                     "cannot reproduce the published numbers from public data")
    pins = []
    for it in downloads:
        if not it.pinned:
            notes.append(f"{it.role} {it.repo_id} is not pinned ({it.revision_note}); the run needs --allow-unpinned, "
                         f"or pin it (commands below)")
            pins.append((f"{it.role} {it.repo_id}", pin_commands(it, recipe)))
    for m in entries:
        if not m.evaluated:
            notes.append(f"{m.key}: skipped ({m.evaluated_note.strip()})")
    plan = Plan(recipe, mode, subject, variant, overrides, downloads, r.gpus, allocation, placement, here, hours,
                groups, entries, blocker, notes, pins=pins)
    plan.eval_needs = eval_needs(plan, model_dir)
    return plan

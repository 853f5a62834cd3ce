"""``areal reproduce NAME``: plan a locked recipe's reproduction, run it, compare with the expected metrics.

Steps (:func:`reproduce`):

1. **Plan** (:func:`make_plan`; ``--dry-run`` prints it and stops, writing nothing): the recipe, model /
   data / published checkpoint at their revisions, what would be downloaded (unpinned parts flagged), GPUs
   needed, the allocation string parsed and placed on the nodes (:func:`recipe_placement`; ``--nodes`` /
   ``--gpus-per-node`` place it on other hardware), estimated hours (:func:`estimate_hours`),
   the evaluation (protocol, benchmarks, sampling) and the expected metrics with the tolerance of the mode.
2. **Run**: mode ``retrain`` trains the recipe (``trainer: cpu`` recipes on this machine with
   :func:`areal_cli.train_loop.run_training`; ``trainer: gpu`` recipes need their cluster and are refused
   with one line); mode ``eval_only`` (``--eval-only``) downloads the published checkpoint (or, with
   ``--subject base``, the base model) at its pinned revision and runs ``areal eval`` with the recipe's
   evaluation settings, one run per benchmark (each with its date window and the expected entries'
   ``eval_overrides``).
3. **Compare** (:func:`areal_cli.recipes.compare`) and print a pass / fail / skipped table. GPQA-Diamond and
   any number ``areal`` cannot measure are *skipped*, never passed.
4. **Record**: ``DIR/manifest.json`` (:mod:`areal_cli.manifest`: recipe sha256, revisions, package
   versions, git commit, hardware, times) and ``DIR/reproduce.json`` (every check and measured figure).

Exit codes: 0 when every check passes (skipped rows allowed) and at least one check was made; 1 on any
failed check, or when nothing could be checked; 2 on bad input (unknown recipe, invalid override, out
directory holding a run, corrupted checkpoint, missing download, GPU recipe without its GPUs): one line,
raised as :class:`~areal_cli.errors.UserError` before anything is written.

Imports at module load: stdlib, yaml (via :mod:`areal_cli.recipes`); rich, torch and the eval stack only when
a step needs them.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_cli.errors import UserError
from areal_cli.placement import Allocation, Placement, config_allocation, parse_allocation, place
from areal_cli.recipes import (
    EVAL_OVERRIDE_KEYS,
    TRAINING_BENCHMARKS,
    TRAINING_FIGURES,
    UNSUPPORTED_BENCHMARKS,
    Check,
    ExpectedMetric,
    Measured,
    Recipe,
    compare,
    load_recipe,
)

#: The published run that rough hour estimates are scaled from (its expected file has wall-clock hours
#: for the async run and for its ``sync`` variant).
ANCHOR_RECIPE = "async-7b-math"
#: Files that mark an output folder as holding a reproduction (refused: nothing is overwritten).
RUN_MARKERS = ("manifest.json", "reproduce.json", "train", "eval")


# --- allocation ---------------------------------------------------------------------------------------


def recipe_placement(recipe: Recipe, variant: str | None = None, *, nodes: int | None = None,
                     gpus_per_node: int | None = None) -> tuple[Allocation | None, Placement | None]:
    """The allocation of ``recipe`` placed on its published hardware, or on ``nodes`` x ``gpus_per_node``.

    GPU recipes: ``resources.allocation`` (None when not published) on ``resources.nodes`` x
    ``resources.gpus_per_node`` (= gpus / nodes). CPU recipes: what ``areal train`` runs
    (:func:`areal_cli.placement.config_allocation`) on one host with ``gpus_per_node = 0`` (processes).

    Raises:
        UserError: the layout is impossible on the given hardware (one line, :func:`areal_cli.placement.place`),
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


# --- hours ---------------------------------------------------------------------------------------------


@dataclass
class HoursEstimate:
    """Wall-clock hours of a training run: ``hours`` (None when it cannot be estimated), ``per_100_steps``
    (rough estimates), and ``basis``: where the figure comes from ("published: ..." / "rough: ..." /
    "not estimated: ...")."""

    hours: float | None
    per_100_steps: float | None
    basis: str

    def text(self) -> str:
        if self.hours is not None:
            return f"{self.hours:.1f} h ({self.basis})"
        if self.per_100_steps is not None:
            return f"{self.per_100_steps:.2f} h per 100 steps ({self.basis})"
        return self.basis


def model_params_b(repo: str | None) -> float | None:
    """Parameters in billions read from a Hub repo name (``Qwen/Qwen3-14B`` -> 14.0), None if absent."""
    m = re.search(r"(\d+(?:\.\d+)?)B\b", repo or "")
    return float(m.group(1)) if m else None


def _published_hours(recipe: Recipe, variant: str | None) -> ExpectedMetric | None:
    for m in recipe.expected.metrics:
        if m.benchmark == TRAINING_FIGURES and m.metric == "wall_clock_hours" and m.variant == variant:
            return m
    return None


def rough_hours(recipe: Recipe, variant: str | None, anchor: Recipe) -> HoursEstimate:
    """Rough training hours scaled linearly from the published run ``anchor`` (:data:`ANCHOR_RECIPE`).

    Rule: hours per step = anchor's hours per step x (model parameters / anchor's) x (samples per step /
    anchor's) x (anchor's GPUs / GPUs); the synchronous anchor (variant ``sync``) for eta 0, else the
    asynchronous one. It ignores response lengths, sequence-length caps and fixed costs: applied to the
    other published pair (async-1.5b-math: 14.8 h async, 41.0 h sync) it gives 8.2 h and 18.5 h (1.8x and
    2.2x low), so read it as a factor-of-3 figure (tests/test_reproduce.py checks that bound).
    """
    spec = recipe.variant(variant)
    sync = spec.max_head_offpolicyness == 0
    ref_variant = "sync" if sync and "sync" in anchor.file.variants else None
    ref_m = _published_hours(anchor, ref_variant)
    ref_spec = anchor.variant(ref_variant)
    p, p_ref = model_params_b(recipe.file.model.repo), model_params_b(anchor.file.model.repo)
    if ref_m is None or ref_spec.max_steps is None or p is None or p_ref is None:
        return HoursEstimate(None, None, "not estimated: model size or the reference run's steps unknown")
    per_step = (ref_m.value / ref_spec.max_steps * (p / p_ref)
                * (spec.batch_size * spec.group_size) / (ref_spec.batch_size * ref_spec.group_size)
                * anchor.file.resources.gpus / recipe.file.resources.gpus)
    basis = (f"rough, within ~3x: scaled from {anchor.name}{'@' + ref_variant if ref_variant else ''}'s published "
             f"{ref_m.value:g} h by model size, samples per step and GPUs")
    if spec.max_steps is None:
        return HoursEstimate(None, 100 * per_step, basis + "; total steps not published "
                                                           "(epochs x training prompts / batch)")
    return HoursEstimate(per_step * spec.max_steps, 100 * per_step, basis)


def estimate_hours(recipe: Recipe, variant: str | None = None) -> HoursEstimate:
    """Training hours of ``recipe``: the published wall-clock figure when its expected file has one, else
    :func:`rough_hours` for PPO recipes; CPU and SFT recipes are not estimated (said why)."""
    m = _published_hours(recipe, variant)
    if m is not None:
        return HoursEstimate(m.value, None, f"published: {m.source.strip()}")
    if recipe.trainer == "cpu":
        return HoursEstimate(None, None, "CPU recipe: minutes, not hours (see the description)")
    if recipe.kind == "sft":
        return HoursEstimate(None, None, "not estimated: SFT time is data size x epochs (size not in the recipe)")
    try:
        anchor = load_recipe(ANCHOR_RECIPE)
    except UserError:
        return HoursEstimate(None, None, f"not estimated: reference recipe {ANCHOR_RECIPE} unavailable")
    return rough_hours(recipe, variant, anchor)


# --- plan ----------------------------------------------------------------------------------------------


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
    downloads: list[Any]  # areal_cli.download.DownloadItem
    gpus_needed: int
    allocation: Allocation | None  # the recipe's allocation string, parsed (CPU recipes: embedded processes)
    placement: Placement | None  # where servers, trainer ranks and the controller run (None: not published)
    gpus_here: int
    hours: HoursEstimate
    eval_groups: list[EvalGroup]
    expected: list[ExpectedMetric]
    blocker: str | None = None
    notes: list[str] = field(default_factory=list)


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
            from areal_cli.recipes import eval_vocabulary

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
        gpus_here: GPUs of this machine (default: :func:`areal_cli.manifest.gpu_count`).
        model_dir: a local checkpoint to evaluate instead of downloading one (``eval_only``).
        nodes, gpus_per_node: hardware to place the allocation on (default: the recipe's published
            resources; :func:`recipe_placement`).
    Raises:
        UserError: unknown variant, bad subject, no published checkpoint, invalid overrides, an allocation
            impossible on ``nodes`` x ``gpus_per_node``.
    """
    from areal_cli import download as dl
    from areal_cli.manifest import gpu_count

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
    for it in downloads:
        if not it.pinned:
            notes.append(f"{it.role} {it.repo_id} is not pinned ({it.revision_note}); the run needs --allow-unpinned")
    for m in entries:
        if not m.evaluated:
            notes.append(f"{m.key}: skipped ({m.evaluated_note.strip()})")
    return Plan(recipe, mode, subject, variant, overrides, downloads, r.gpus, allocation, placement, here, hours,
                groups, entries, blocker, notes)


# --- formatting ----------------------------------------------------------------------------------------


def fmt_value(value: float | None, unit: str) -> str:
    """A figure in its unit: ``69.1%``, ``0.926``, ``2044``, ``25.4 h``, ``2.27x``; ``-`` for None."""
    if value is None:
        return "-"
    if unit == "percent":
        return f"{value:.1f}%"
    if unit == "elo":
        return f"{value:.0f}"
    if unit == "hours":
        return f"{value:.2f} h"
    if unit == "ratio":
        return f"{value:.2f}x"
    if unit == "count":
        return f"{value:.0f}"
    return f"{value:.3f}"


def fmt_tolerance(tol: float | None, unit: str) -> str:
    if tol is None:
        return "-"
    if unit == "percent":
        return f"±{tol:.2f} pt"
    if unit == "elo":
        return f"±{tol:.0f}"
    return f"±{tol:.3g}"


def _ref(ref: Any) -> str:
    if ref is None:
        return "-"
    if ref.builtin:
        return f"built-in {ref.builtin}"
    return f"{ref.repo}@{ref.revision or 'UNPINNED'}"


def render_plan(plan: Plan, console: Any) -> None:
    """Print ``plan`` as a rich panel (settings) and a table (expected metrics)."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    r, f = plan.recipe, plan.recipe.file
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()

    def row(label: str, value: str, style: str = "") -> None:  # Text: brackets in values are not markup
        t.add_row(label, Text(value, style=style))

    row("recipe", f"{r.name}{'@' + plan.variant if plan.variant else ''}  ({r.path})")
    row("", " ".join(f.description.split()))
    row("kind", f"{f.kind}, trainer {f.trainer}")
    row("mode", "retrain: train, then compare with the expected numbers" if plan.mode == "retrain"
              else f"eval-only: evaluate the {plan.subject} checkpoint, then compare")
    row("model", _ref(f.model))
    row("data", _ref(f.data) + ("" if f.data.complete else "  (incomplete: part never released)")
              + (f"  files: {', '.join(x.path for x in f.data.files)}" if f.data.files else ""))
    row("published checkpoint", _ref(f.published_model))
    if plan.downloads:
        row("downloads", "\n".join(
            f"{it.role}: {it.label()}" + ("" if it.pinned else "  [UNPINNED: needs --allow-unpinned]")
            for it in plan.downloads) + "\n(sizes are not looked up: the plan works offline)")
    else:
        row("downloads", "none (built-in model and data)" if plan.mode == "retrain" else "none (local --model)")
    res = f.resources
    if f.trainer == "cpu":
        gpus = "none (CPU)"
    else:
        gpus = f"{res.gpus} = {res.nodes} nodes x {res.gpus_per_node}"
        gpus += (f"; allocation {plan.allocation.text} = {plan.allocation.describe()}" if plan.allocation
                 else f"; allocation not published ({' '.join((res.note or '').split())})")
    row("GPUs needed", gpus + f"; this machine: {plan.gpus_here}")
    if plan.placement is not None:
        row("placement", "\n".join(plan.placement.describe()[:4]) + "\n(per node: the placement table below)")
    row("training time", plan.hours.text())
    ev = f.eval
    row("evaluation", f"protocol {ev.protocol}; {ev.n_samples} sample(s), temperature {ev.temperature:g}, "
                            f"top_p {ev.top_p:g}, {ev.max_new_tokens} new tokens")
    benches = [b + (f" ({ev.date_windows[b]})" if b in ev.date_windows else "")
               + (" [not supported: skipped]" if b in UNSUPPORTED_BENCHMARKS else "")
               + (" [measured during training]" if b in TRAINING_BENCHMARKS else "") for b in ev.benchmarks]
    row("benchmarks", ", ".join(benches))
    if plan.mode == "eval_only":
        row("eval runs", "\n".join(
            f"{g.name}: " + ", ".join(f"{k}={v}" for k, v in g.settings.items())
            + (f", window {g.date_window[0]}..{g.date_window[1]}" if g.date_window else "") for g in plan.eval_groups)
            or "none")
    if plan.overrides:
        row("overrides", " ".join(plan.overrides) + "  (not the locked recipe)")
    if plan.blocker:
        row("would run", f"refused here: {plan.blocker}", "red")
    else:
        row("would run", "train on this machine, then compare" if plan.mode == "retrain" else
            "download, evaluate, compare")
    for note in plan.notes:
        row("note", note)
    console.print(Panel(t, title=f"areal reproduce {r.name} (plan)", title_align="left"))
    if plan.placement is not None:
        console.print(plan.placement.table())

    mode = plan.mode
    x = Table(title=f"expected metrics ({'retrain' if mode == 'retrain' else 'eval-only'} tolerances, "
                    f"z = {r.expected.z:g})", title_justify="left")
    for col in ("check", "model", "expected", "tolerance", "source"):
        x.add_column(col, overflow="fold", no_wrap=col != "source")
    for m in plan.expected:
        tol = getattr(m.tolerance, mode) if m.tolerance is not None else None
        exp = ("≥ " if m.check == "at_least" else "") + fmt_value(m.value, m.unit)
        if m.check == "report":
            tol_text = "report only"
        elif not m.evaluated:
            tol_text = "skipped (not evaluated)"
        elif tol is None:
            tol_text = "from measured N"
        else:
            tol_text = fmt_tolerance(tol, m.unit)
        x.add_row(m.key, m.model, exp, tol_text, Text(" ".join(m.source.split())))
    console.print(x)


_STATUS_STYLE = {"pass": "[green]PASS[/green]", "fail": "[bold red]FAIL[/bold red]", "skipped": "[yellow]skipped[/yellow]"}


def render_checks(checks: list[Check], console: Any, title: str) -> None:
    """Print the pass / fail / skipped table and a one-line verdict."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title=Text(title), title_justify="left")
    for col, kw in (("check", {"no_wrap": True}), ("expected", {"justify": "right"}),
                    ("tolerance", {"justify": "right"}), ("measured", {"justify": "right"}), ("result", {}),
                    ("why", {"overflow": "fold"})):
        t.add_column(col, **kw)
    for c in checks:
        t.add_row(c.key, fmt_value(c.expected, c.unit), fmt_tolerance(c.tolerance, c.unit),
                  fmt_value(c.measured, c.unit), _STATUS_STYLE[c.status], Text(c.reason))
    console.print(t)
    counts = count_checks(checks)
    verdict = "[green]PASS[/green]" if exit_code_for(checks) == 0 else "[bold red]FAIL[/bold red]"
    console.print(f"{verdict}: {counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped")


def count_checks(checks: list[Check]) -> dict[str, int]:
    return {s: sum(c.status == s for c in checks) for s in ("pass", "fail", "skipped")}


def exit_code_for(checks: list[Check]) -> int:
    """0 if no check failed and at least one passed; else 1 (a regression, or nothing verified)."""
    n = count_checks(checks)
    return 0 if n["fail"] == 0 and n["pass"] > 0 else 1


# --- measurements --------------------------------------------------------------------------------------


#: Metrics of a CPU training run (``benchmark`` = the run's training benchmark, e.g. ``tiny-arith``), from its
#: summary.json and metrics.jsonl: what :func:`measured_from_training` can measure.
TRAINING_METRICS = {
    "max_accuracy": "the best held-out accuracy over the run's evaluations",
    "final_accuracy": "held-out accuracy at the last step",
    "reward_ok_fraction": "reward calls that returned a score (not error / timeout), of all calls",
    "rewarded_fraction": "trained samples with reward > 0, mean over RL steps",
    "final_version": "policy versions published (RL steps)",
    "steps_with_gradient": "RL steps whose gradient norm was > 0 (a loss that moved the weights)",
    "evaluations": "in-loop held-out evaluations (after the warm start and during RL)",
}


def _training_value(metric: str, summary: dict, rows: list[dict]) -> float | None:
    rl = [r for r in rows if r.get("phase") == "rl"]
    accs = [r["accuracy"] for r in rows if isinstance(r.get("accuracy"), (int, float))]
    if metric == "max_accuracy":
        return summary.get("max_accuracy", summary.get("best_accuracy", max(accs) if accs else None))
    if metric == "final_accuracy":
        return summary.get("final_accuracy")
    if metric == "reward_ok_fraction":
        c = summary.get("controller") or {}
        calls = sum(int(c.get(k, 0)) for k in ("reward_ok", "reward_error", "reward_timeout"))
        return c.get("reward_ok", 0) / calls if calls else None
    if metric == "rewarded_fraction":
        vals = [r["reward_positive_frac"] for r in rl if isinstance(r.get("reward_positive_frac"), (int, float))]
        return sum(vals) / len(vals) if vals else None
    if metric == "final_version":
        return summary.get("final_version")
    if metric == "steps_with_gradient":
        return float(sum(1 for r in rl if float(r.get("grad_norm") or 0.0) > 0.0)) if rl else None
    if metric == "evaluations":
        return float(sum(1 for r in rows if r.get("evaluated", r.get("phase") == "warm_start_end")))
    return None


def measured_from_training(entries: list[ExpectedMetric], summary: dict, rows: list[dict],
                           n_problems: int) -> tuple[dict[str, Measured], dict[str, str]]:
    """Figures of a CPU training run for ``entries``: the :data:`TRAINING_METRICS` of its training benchmark
    (summary.json, metrics.jsonl) and ``training/wall_clock_hours``.

    Returns:
        (key -> Measured, key -> why it was not measured).
    """
    measured: dict[str, Measured] = {}
    why: dict[str, str] = {}
    for m in entries:
        if m.benchmark in TRAINING_BENCHMARKS and m.metric in TRAINING_METRICS:
            value = _training_value(m.metric, summary, rows)
        elif m.benchmark == TRAINING_FIGURES and m.metric == "wall_clock_hours":
            value = summary["elapsed_s"] / 3600 if "elapsed_s" in summary else None
        else:
            why[m.key] = f"a CPU training run does not measure {m.benchmark}/{m.metric}"
            continue
        if value is None:
            why[m.key] = "the run recorded no value"
            continue
        accuracy = m.metric in ("max_accuracy", "final_accuracy")
        measured[m.key] = Measured(float(value), n_problems=n_problems if accuracy else None, n_samples=1)
    return measured, why


def measured_from_eval(entries: list[ExpectedMetric], benchmark: str,
                       metrics: dict[str, Any]) -> tuple[dict[str, Measured], dict[str, str]]:
    """Figures of one ``areal eval`` result (``results[benchmark]``: fractions in [0, 1]; the Codeforces
    rating / percentile under ``metrics["codeforces"]``) in each entry's unit.

    Returns:
        (key -> Measured, key -> why it was not measured, e.g. "rating needs --cf-data DIR").
    """
    measured: dict[str, Measured] = {}
    why: dict[str, str] = {}
    n, k = metrics.get("n_problems"), metrics.get("n_samples")
    for m in entries:
        if m.benchmark != benchmark:
            continue
        if benchmark == "codeforces" and m.metric in ("rating", "percentile"):
            cf = metrics.get("codeforces") or {}
            value = cf.get(m.metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                measured[m.key] = Measured(float(value))
            else:
                why[m.key] = f"not measured: {cf.get('error') or cf.get('rating') or 'no rating in the results'}"
            continue
        value = metrics.get(m.metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            scale = 100.0 if m.unit == "percent" else 1.0
            measured[m.key] = Measured(float(value) * scale, n_problems=n, n_samples=k)
        else:
            why[m.key] = f"not measured: the {benchmark} results have no '{m.metric}'"
    return measured, why


def _explain(checks: list[Check], why: dict[str, str]) -> list[Check]:
    return [dataclasses.replace(c, reason=why[c.key]) if c.status == "skipped" and c.reason == "not measured"
            and c.key in why else c for c in checks]


# --- checkpoints ---------------------------------------------------------------------------------------


def check_checkpoint(model_dir: Path) -> None:
    """Refuse a checkpoint folder that cannot be a complete Hugging Face model, before evaluating it.

    Checks: the folder and ``config.json`` (valid JSON) exist; weights exist (``*.safetensors`` or
    ``*.bin``); every shard named by ``model.safetensors.index.json`` exists; each safetensors file's header
    (8-byte little-endian length + JSON) is readable and its tensors' byte ranges fit in the file (a
    truncated or overwritten file fails here). Tensor values are not read.

    Raises:
        UserError: ``PATH: what is wrong``.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise UserError(f"{model_dir}: checkpoint folder not found")
    cfg = model_dir / "config.json"
    try:
        json.loads(cfg.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{cfg}: not found (a Hugging Face checkpoint needs config.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{cfg}: corrupted checkpoint: config.json is not valid JSON ({e})") from None
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise UserError(f"{index}: corrupted checkpoint: not a safetensors index (weight_map)") from None
        missing = sorted(s for s in shards if not (model_dir / s).is_file())
        if missing:
            raise UserError(f"{model_dir}: corrupted checkpoint: shard {missing[0]} named by {index.name} is missing "
                            f"({len(missing)} missing)")
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights and not list(model_dir.glob("*.bin")):
        raise UserError(f"{model_dir}: checkpoint has no weights (*.safetensors or *.bin)")
    for w in weights:
        _check_safetensors(w)


def _check_safetensors(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise UserError(f"{path}: corrupted checkpoint: {size} bytes, shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100 * 1024 * 1024:
            raise UserError(f"{path}: corrupted checkpoint: header length {n} does not fit the file ({size} bytes)")
        try:
            header = json.loads(fh.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise UserError(f"{path}: corrupted checkpoint: unreadable safetensors header") from None
    if not isinstance(header, dict):
        raise UserError(f"{path}: corrupted checkpoint: safetensors header is not a JSON object")
    data = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise UserError(f"{path}: corrupted checkpoint: tensor '{name}' has no data_offsets")
        if not 0 <= offsets[0] <= offsets[1] <= data:
            raise UserError(f"{path}: corrupted checkpoint: tensor '{name}' ends at byte {offsets[1]} of a "
                            f"{data}-byte data section (truncated file?)")


# --- the run -------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What :func:`reproduce` did: ``exit_code`` (0 pass, 1 fail / nothing checked), the checks, the folder."""

    exit_code: int
    checks: list[Check]
    out_dir: Path | None
    plan: Plan


def default_out_dir(name: str) -> Path:
    return Path("runs") / f"reproduce-{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_out_dir(out: Path) -> None:
    """Refuse a path that is a file or already holds a reproduction (:data:`RUN_MARKERS`).

    Raises:
        UserError: one line with the path and what is there.
    """
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: --out exists and is not a directory")
    for marker in RUN_MARKERS:
        if (out / marker).exists():
            raise UserError(f"{out}: already holds a reproduction ({marker}); choose another --out")


def reproduce(name: str, *, out_dir: Path | None = None, dry_run: bool = False, eval_only: bool = False,
              subject: str | None = None, variant: str | None = None, overrides: list[str] | tuple[str, ...] = (),
              allow_unpinned: bool = False, data_dir: Path | None = None, cf_data: Path | None = None,
              model_dir: Path | None = None, live: bool = False, console: Any = None,
              command: list[str] | None = None, gpus_here: int | None = None, nodes: int | None = None,
              gpus_per_node: int | None = None) -> Outcome:
    """Plan, run, compare and record a reproduction of recipe ``name`` (see the module docstring).

    Args:
        out_dir: run folder (default ``runs/reproduce-<name>-<timestamp>``); must not hold a reproduction.
        dry_run: print the plan only; nothing is downloaded or written.
        eval_only / subject / model_dir / data_dir / cf_data: evaluate a checkpoint (``published`` or ``base``;
            ``model_dir``: a local copy instead of the download, a HF directory or a ``.gguf`` file) on benchmark files in ``data_dir``
            (``areal eval --data-dir``), Codeforces rating data in ``cf_data``.
        overrides: ``-o KEY=VALUE`` (recorded in the manifest: the run is no longer the locked recipe).
        allow_unpinned: download unpinned checkpoints as they are today.
        live: the training run's live panel (on a terminal).
        command: argv recorded in the manifest (default ``sys.argv``).
        gpus_here: GPUs of this machine (default: ``nvidia-smi``).
        nodes, gpus_per_node: place the recipe's allocation on this hardware instead of its published one
            (printed by ``dry_run``).
    Raises:
        UserError: bad input, before anything is written (see the module docstring).
    """
    from rich.console import Console

    console = console or (Console() if sys.stdout.isatty() else Console(width=150))
    recipe = load_recipe(name)
    plan = make_plan(recipe, eval_only=eval_only, subject=subject, variant=variant, overrides=overrides,
                     gpus_here=gpus_here, model_dir=model_dir, nodes=nodes, gpus_per_node=gpus_per_node)
    if dry_run:
        render_plan(plan, console)
        return Outcome(0, [], None, plan)
    if plan.blocker:
        raise UserError(plan.blocker)
    out = Path(out_dir) if out_dir is not None else default_out_dir(recipe.name)
    check_out_dir(out)
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UserError(f"{data_dir}: --data-dir not found")
    started, t0 = _utc(), time.monotonic()
    ctx = _RunRecord(plan, out, started, t0, list(command if command is not None else sys.argv), console,
                     live=live)
    if plan.mode == "retrain":
        return ctx.guard(lambda: _retrain(ctx, allow_unpinned=allow_unpinned, data_dir=data_dir, cf_data=cf_data))
    return ctx.guard(lambda: _eval_only(ctx, allow_unpinned=allow_unpinned, data_dir=data_dir, cf_data=cf_data,
                                        model_dir=model_dir))


def _utc() -> str:
    from areal_cli.manifest import utc_now

    return utc_now()


@dataclass
class _RunRecord:
    """A run in progress: where it writes, when it started, what was downloaded; writes the records."""

    plan: Plan
    out: Path
    started: str
    t0: float
    command: list[str]
    console: Any
    live: bool = False
    created: bool = False
    downloads: dict[str, Path] = field(default_factory=dict)
    runs: dict[str, Any] = field(default_factory=dict)

    def make_dir(self) -> None:
        self.created = not self.out.exists()
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"{self.out}: cannot create the run folder: {e.strerror}") from None

    def manifest(self, status: str, exit_code: int | None) -> dict:
        from areal_cli.manifest import build_manifest

        p = self.plan
        return build_manifest(p.recipe, mode=p.mode, subject=p.subject, variant=p.variant, overrides=p.overrides,
                              command=self.command, started_at=self.started, finished_at=_utc(),
                              elapsed_s=time.monotonic() - self.t0, status=status, exit_code=exit_code,
                              downloads=self.downloads, extra={"runs": self.runs})

    def finish(self, checks: list[Check], measured: dict[str, Measured]) -> Outcome:
        from areal_cli.atomic import write_atomic_many

        p = self.plan
        code = exit_code_for(checks)
        result = {"recipe": p.recipe.name, "variant": p.variant, "mode": p.mode, "subject": p.subject,
                  "overrides": p.overrides, "passed": code == 0, "exit_code": code, "counts": count_checks(checks),
                  "checks": [dataclasses.asdict(c) for c in checks],
                  "measured": {k: dataclasses.asdict(v) for k, v in measured.items()}, "runs": self.runs}
        manifest = self.manifest("passed" if code == 0 else "failed", code)
        write_atomic_many({self.out / "manifest.json": json.dumps(manifest, indent=2) + "\n",
                           self.out / "reproduce.json": json.dumps(result, indent=2) + "\n"})
        label = "retrain" if p.mode == "retrain" else f"eval-only, {p.subject} checkpoint"
        render_checks(checks, self.console, f"areal reproduce {p.recipe.name}"
                      f"{'@' + p.variant if p.variant else ''} ({label})"
                      + (f" with overrides {' '.join(p.overrides)}" if p.overrides else ""))
        self.console.print(f"wrote {self.out / 'manifest.json'} and {self.out / 'reproduce.json'}", markup=False,
                           highlight=False)
        return Outcome(code, checks, self.out, p)

    def guard(self, fn) -> Outcome:
        """Run ``fn``; if it fails after work started in the folder, record the failure (``status``) in
        manifest.json; a failure before anything was written there leaves no trace (a folder made here is
        removed)."""
        try:
            return fn()
        except BaseException as e:
            if self.out.is_dir() and not (self.out / "manifest.json").exists():
                if not any(self.out.iterdir()):  # nothing started: leave no trace
                    if self.created:
                        self.out.rmdir()
                else:
                    status = "interrupted" if isinstance(e, KeyboardInterrupt) else \
                        f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                    from areal_cli.atomic import write_json_atomic

                    write_json_atomic(self.out / "manifest.json", self.manifest(status, None))
            raise


def _retrain(ctx: _RunRecord, *, allow_unpinned: bool = False, data_dir: Path | None = None,
             cf_data: Path | None = None) -> Outcome:
    """Train the recipe into ``OUT/train`` and compare (mode retrain): a CPU recipe's run and its training
    figures; a GPU recipe (:func:`_retrain_gpu`) trained on this machine, then evaluated."""
    from areal_cli.config import apply_overrides
    from areal_cli.recipes import train_config_from_recipe

    p = ctx.plan
    if p.recipe.trainer == "gpu":
        return _retrain_gpu(ctx, allow_unpinned=allow_unpinned, data_dir=data_dir, cf_data=cf_data)
    cfg = apply_overrides(train_config_from_recipe(p.recipe, p.variant), p.overrides)
    render_plan(p, ctx.console)
    ctx.make_dir()
    from areal_cli.train_loop import run_training

    train_dir = ctx.out / "train"
    ctx.runs["train"] = "train"
    summary = run_training(cfg, train_dir, live=ctx.live)
    rows = [json.loads(line) for line in (train_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    measured, why = measured_from_training(p.expected, summary, rows, cfg.eval_n_prompts)
    checks = _explain(compare(p.recipe.expected, measured, mode="retrain", variant=p.variant), why)
    return ctx.finish(checks, measured)


def _eval_only(ctx: _RunRecord, *, allow_unpinned: bool, data_dir: Path | None, cf_data: Path | None,
               model_dir: Path | None) -> Outcome:
    """Download (or take ``model_dir``), check the checkpoint and the data, evaluate each group, compare."""
    from areal_cli import download as dl

    p = ctx.plan
    if model_dir is None:
        role = "published" if p.subject == "published" else "model"
        got = dl.download(str(p.recipe.path), roles=(role,), allow_unpinned=allow_unpinned)
        if role not in got:
            raise UserError(f"{p.recipe.path}: the download returned no {role} checkpoint")
        model_dir = got[role]
        ctx.downloads[role] = Path(model_dir)
    else:
        from areal_cli.models.gguf import provenance_of, resolve_model

        model_dir = resolve_model(model_dir, log=lambda m: ctx.console.print(m, markup=False, highlight=False))
        if provenance_of(model_dir) is not None:  # a .gguf file, dequantised: record what it was
            ctx.runs["model_provenance"] = {"gguf": provenance_of(model_dir), "model_dir": str(model_dir)}
    check_checkpoint(Path(model_dir))
    _check_eval_data(p, data_dir)
    render_plan(p, ctx.console)  # bad input and failed downloads above end in one line, without the plan
    ctx.make_dir()
    measured, why = _evaluate_groups(ctx, Path(model_dir), data_dir, cf_data)
    checks = _explain(compare(p.recipe.expected, measured, mode="eval_only", subject=p.subject), why)
    return ctx.finish(checks, measured)


def _check_eval_data(p: Plan, data_dir: Path | None) -> None:
    """Every benchmark's data is checked before the first evaluation (or training) starts."""
    from areal_cli.eval import runner

    for g in p.eval_groups:
        runner.load_selected([g.benchmark], data_dir, date_from=g.date_window[0] if g.date_window else None,
                             date_to=g.date_window[1] if g.date_window else None)


def _evaluate_groups(ctx: _RunRecord, model_dir: Path, data_dir: Path | None, cf_data: Path | None
                     ) -> tuple[dict[str, Measured], dict[str, str]]:
    """Evaluate ``model_dir`` on every eval group of the plan into ``OUT/eval/<group>``."""
    from areal_cli.eval import runner

    p = ctx.plan
    measured: dict[str, Measured] = {}
    why: dict[str, str] = {}
    ctx.runs["eval"] = {}
    for g in p.eval_groups:
        s = g.settings
        rel = f"eval/{g.name}"
        ctx.runs["eval"][g.name] = rel
        results = runner.run_eval(
            [g.benchmark], data_dir, model_dir=model_dir, n=s["n_samples"], temperature=s["temperature"],
            top_p=s["top_p"], max_new_tokens=s["max_new_tokens"], out_dir=ctx.out / rel, protocol=s["protocol"],
            cf_data=cf_data, date_from=g.date_window[0] if g.date_window else None,
            date_to=g.date_window[1] if g.date_window else None, console=ctx.console)
        entries = [m for m in p.expected if m.key in g.keys]
        got, reasons = measured_from_eval(entries, g.benchmark, results.get(g.benchmark) or {})
        measured.update(got)
        why.update(reasons)
    return measured, why


def _download_inputs(ctx: _RunRecord, allow_unpinned: bool) -> tuple[Path, Path]:
    """The recipe's base model and training data file, downloaded at their pinned revisions (recorded).

    Raises:
        UserError: unpinned without ``allow_unpinned``, offline, not found, checksum mismatch; a data
            snapshot without the recipe's file.
    """
    from areal_cli import download as dl

    r = ctx.plan.recipe
    got = dl.download(str(r.path), roles=("model", "data"), allow_unpinned=allow_unpinned)
    ctx.downloads.update({k: Path(v) for k, v in got.items()})
    data = Path(got["data"]) / r.file.data.files[0].path
    if not data.is_file():
        raise UserError(f"{r.path}: field 'data.files[0].path': {r.file.data.files[0].path} is not in the "
                        f"downloaded snapshot {got['data']}")
    return Path(got["model"]), data


def _retrain_gpu(ctx: _RunRecord, *, allow_unpinned: bool, data_dir: Path | None, cf_data: Path | None) -> Outcome:
    """Train a published recipe on this machine (SGLang servers + torchrun trainer on its GPUs, as its
    allocation places them; :mod:`areal_cli.recipes.gpu_train`), evaluate the trained weights with the recipe's
    protocol, compare with the published numbers (mode retrain). SFT recipes: :mod:`areal_cli.sft_job`."""
    from areal_cli.config import apply_overrides
    from areal_cli.placement import parse_allocation, place

    p = ctx.plan
    r = p.recipe
    _check_eval_data(p, data_dir)
    placement = place(parse_allocation(r.file.resources.allocation), nodes=1, gpus_per_node=p.gpus_here)
    model_dir, data_file = _download_inputs(ctx, allow_unpinned)
    render_plan(p, ctx.console)
    ctx.make_dir()
    if r.kind == "sft":
        from areal_cli.sft_job import run_sft_job

        ctx.runs["train"] = "train"
        summary = run_sft_job(r.file.sft, model_dir, data_file, ctx.out / "train", placement=placement,
                              log=lambda m: ctx.console.print(m, markup=False, highlight=False))
        trained = Path(summary["weights"])
    else:
        from areal_cli.recipes import gpu_train_config
        from areal_cli.train_loop import run_training

        cfg, notes = gpu_train_config(r, p.variant, placement=placement)
        cfg.model_path, cfg.dataset, cfg.code_dir = str(model_dir), str(data_file), str(r.path.parent)
        cfg = apply_overrides(cfg, p.overrides)
        ctx.runs["train"] = "train"
        ctx.runs["deviations"] = notes
        summary = run_training(cfg, ctx.out / "train", live=ctx.live)
        trained = Path(summary["final_weights"])
    measured, why = _evaluate_groups(ctx, trained, data_dir, cf_data)
    checks = _explain(compare(r.expected, measured, mode="retrain", variant=p.variant), why)
    return ctx.finish(checks, measured)

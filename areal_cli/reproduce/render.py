"""How a reproduction is shown: the plan as a panel and a table of expected metrics, the checks as a
pass / fail / skipped table with a one-line verdict, and the exit code that verdict gives.
"""

from __future__ import annotations

from typing import Any

from areal_cli.recipes import TRAINING_BENCHMARKS, UNSUPPORTED_BENCHMARKS, Check
from areal_cli.reproduce.plan import Plan


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
    t.add_column(overflow="fold")  # paths (the recipe file, downloads) print whole, folded at narrow widths

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
    eval_only = plan.mode == "eval_only"  # training is not run: its figures are for reference only
    aside = " (training: not run with --eval-only; the evaluation's own needs are the eval rows below)"
    row("training GPUs" if eval_only else "GPUs needed",
        gpus + f"; this machine: {plan.gpus_here}" + (aside if eval_only and f.trainer != "cpu" else ""))
    if plan.placement is not None:
        row("placement", "\n".join(plan.placement.describe()[:4]) + "\n(per node: the placement table below)")
    row("training time" + (" (not run)" if eval_only else ""), plan.hours.text())
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
    if plan.eval_needs is not None:
        for label, text in plan.eval_needs.lines():
            row(label, text)
    if plan.overrides:
        row("overrides", " ".join(plan.overrides) + "  (not the locked recipe)")
    if plan.blocker:
        row("would run", f"refused here: {plan.blocker}", "red")
    else:
        row("would run", "train on this machine, then compare" if plan.mode == "retrain" else
            "download, evaluate, compare")
    for note in plan.notes:
        row("note", note)
    for what, commands in plan.pins:
        row("pin", f"{what}:\n{commands}")
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

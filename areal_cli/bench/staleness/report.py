"""Rendering ``areal bench staleness`` results: the table (terminal and Markdown) and ``staleness.png``."""

from __future__ import annotations

import math
from pathlib import Path

from areal_cli.bench.figures import save_png


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the results table: one row per (variant, eta)."""
    grid = results["grid"]
    head = ["variant", "eta", "final accuracy", "best accuracy",
            f"RL s to {grid['target_accuracy']:.3f}" if grid["target_accuracy"] else "RL s to target",
            "runs reaching it", "staleness (mean)", "masked / truncated tokens", "clip frac"]
    rows = []
    for v, by_eta in grid["cells"].items():
        for eta, c in sorted(by_eta.items(), key=lambda kv: int(kv[0])):
            fa, ma = c["final_accuracy"], c["max_accuracy"]
            off = c["off_policy"]

            def f(x, fmt="{:.3f}"):
                return "-" if x is None else fmt.format(x)

            rows.append([
                v if int(eta) else f"{v} (= sync)", str(eta),
                "-" if fa is None else (f"{fa['mean']:.3f} ± {fa['std']:.3f}" if fa["n"] > 1 else f"{fa['mean']:.3f}"),
                "-" if ma is None else f"{ma['mean']:.3f}",
                f(c["time_to_target_s"], "{:.1f}"), f"{c['runs_reached_target']}/{c['runs']}",
                f"{c['staleness_mean']:.2f}",
                f"{f(off.get('iw_capped_frac'), '{:.4f}')} / {f(off.get('iw_truncated_frac'), '{:.4f}')}",
                f(off.get("clip_frac"), "{:.4f}"),
            ])
    return head, rows


def results_table(results: dict):
    """A rich Table of :func:`table_rows`."""
    from rich.table import Table

    head, rows = table_rows(results)
    sc = results["scenario"]
    t = Table(title=f"areal bench staleness: {sc['name']} ({sc['steps']} RL steps, {sc['seeds']} seed(s) per cell)")
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i == 0 else "right", style="cyan" if i == 0 else None)
    for r in rows:
        t.add_row(*r)
    g = results["grid"]
    t.caption = (f"target {g['target_accuracy'] if g['target_accuracy'] is None else round(g['target_accuracy'], 3)}: "
                 f"{g['target_source']}; AReaL (AIME24, 1.5B): eta 4 naive 23.3 vs decoupled 42.2")
    return t


def table_markdown(results: dict) -> str:
    """The table as Markdown (``table.md``)."""
    head, rows = table_rows(results)
    sc, g = results["scenario"], results["grid"]
    target = "-" if g["target_accuracy"] is None else f"{g['target_accuracy']:.3f}"
    lines = [f"# areal bench staleness: {sc['name']}", "",
             f"{sc['steps']} RL steps per run, {sc['seeds']} seed(s) per cell, recipe `{sc['recipe']}`; target "
             f"accuracy {target} ({g['target_source']}).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot_staleness(results: dict, path: Path) -> None:
    """Final accuracy (mean ± spread over seeds) and time to target against eta, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = results["grid"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    etas = sorted({int(e) for c in grid["cells"].values() for e in c})
    pos = {e: i for i, e in enumerate(etas)}  # eta on an ordinal axis: 0, 1, 2, 4, 8, 16
    for i, (v, by_eta) in enumerate(grid["cells"].items()):
        pts = sorted((int(e), c) for e, c in by_eta.items())
        xs = [pos[e] + (i - (len(grid["cells"]) - 1) / 2) * 0.05 for e, _ in pts]
        fa = [c["final_accuracy"] for _, c in pts]
        axes[0].errorbar(xs, [f["mean"] if f else math.nan for f in fa],
                         yerr=[[f["mean"] - f["min"] if f else 0 for f in fa], [f["max"] - f["mean"] if f else 0 for f in fa]],
                         marker="o", ms=4, capsize=3, label=v, color=f"C{i}")
        tt = [c["time_to_target_s"] for _, c in pts]
        axes[1].plot(xs, [math.nan if x is None else x for x in tt], marker="o", ms=4, label=v, color=f"C{i}")
        for x, y in zip(xs, tt):
            if y is None:
                axes[1].plot([x], [0], marker="x", color=f"C{i}")
    warm = results.get("warm_start", {}).get("accuracy")
    if warm is not None:
        axes[0].axhline(warm, color="gray", ls=":", lw=1, label="after the warm start")
    if grid["target_accuracy"]:
        axes[0].axhline(grid["target_accuracy"], color="#d62728", ls="--", lw=1, label="target")
    for ax in axes:
        ax.set_xticks(range(len(etas)), [str(e) for e in etas])
        ax.set_xlabel("eta (max_head_offpolicyness; 0 = synchronous)")
    axes[0].set_ylabel("held-out accuracy after the last step")
    axes[0].set_title(f"final accuracy ({results['scenario']['steps']} RL steps; bars: seed range)", fontsize=10)
    axes[1].set_ylabel("RL seconds to the target (x: not reached)")
    axes[1].set_title("time to target (seed-averaged curve)", fontsize=10)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"staleness ablation: {results['scenario']['name']}", x=0.01, ha="left", fontsize=11)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)

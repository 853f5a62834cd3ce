"""PNG plots of run metrics (matplotlib, Agg backend; imported only when a plot is written)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def _atomic_savefig(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".png", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; a plot is an ordinary readable file
    try:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def plot_learning_curve(metrics_jsonl: Path, out_png: Path, *, target: float | None = None,
                        others: dict[str, Path] | None = None, label: str = "this run") -> Path:
    """Held-out accuracy, rewards and in-loop benchmark pass@1 vs RL step and vs wall-clock seconds; for a
    multi-turn run (metrics lines with ``eval_first_try`` / ``train_first_try``) also its first-try accuracy,
    held-out and of the conversations trained on (the held-out accuracy is then the accuracy within ``max_turns``).

    Two rewards are drawn per step: the batch the trainer took (after the success-rate filter, which keeps only
    groups with mixed outcomes, so it hovers near the middle whatever the policy does) and every group sampled
    since the previous step, before the filter (``reward_mean_scored``: what the policy actually earns).

    Args:
        metrics_jsonl: a run's metrics.jsonl (first line = state after the warm start).
        out_png: where to write the PNG (atomically).
        target: draw a horizontal line at this accuracy.
        others: extra runs {label: metrics.jsonl} drawn on the same axes (e.g. eta=0 vs eta=4).
        label: legend label of ``metrics_jsonl``.
    Returns:
        ``out_png``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {label: metrics_jsonl, **(others or {})}
    fig, (ax_step, ax_time, ax_off) = plt.subplots(1, 3, figsize=(16, 4))
    for i, (label, path) in enumerate(runs.items()):
        color = f"C{i}"
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        # the steps where held-out accuracy was measured (other lines repeat the last measurement); runs without
        # a held-out set have none
        measured = [r for r in rows if r.get("accuracy") is not None and r.get("evaluated", True)]
        steps = [r["step"] for r in measured]
        secs = [r["elapsed_s"] for r in measured]
        acc = [r["accuracy"] for r in measured]
        ax_step.plot(steps, acc, marker=".", color=color, label=f"{label}: held-out accuracy")
        ax_time.plot(secs, acc, marker=".", color=color, label=f"{label}: held-out accuracy")
        # multi-turn runs: first-try accuracy, held-out (evaluated lines) and of the conversations trained on
        first = [(r["step"], r["elapsed_s"], r["eval_first_try"]) for r in rows
                 if r.get("eval_first_try") is not None and r.get("evaluated", True)]
        if first:
            style = dict(color=color, marker="x", ms=4, ls="-", lw=1, label=f"{label}: held-out first-try accuracy")
            ax_step.plot([a for a, _, _ in first], [c for _, _, c in first], **style)
            ax_time.plot([b for _, b, _ in first], [c for _, _, c in first], **style)
        trained = [(r["step"], r["train_first_try"]) for r in rows if r.get("train_first_try") is not None]
        if trained:
            ax_step.plot([s for s, _ in trained], [v for _, v in trained], color=color, ls=(0, (1, 2)), alpha=0.6,
                         label=f"{label}: first-try accuracy of the conversations trained on")
        for j, bench in enumerate(sorted({b for r in rows for b in (r.get("eval_benchmarks") or {})})):
            pts = [(r["step"], r["elapsed_s"], r["eval_benchmarks"][bench]["pass@1"]) for r in rows
                   if bench in (r.get("eval_benchmarks") or {})]
            style = dict(color=color, ls=":", marker=("s", "^", "v", "D")[j % 4], ms=4, label=f"{label}: {bench} pass@1")
            ax_step.plot([a for a, _, _ in pts], [c for _, _, c in pts], **style)
            ax_time.plot([b for _, b, _ in pts], [c for _, _, c in pts], **style)
        rew = [(r["step"], r["reward_mean"]) for r in rows if r.get("reward_mean") is not None]
        if rew:
            ax_step.plot([s for s, _ in rew], [v for _, v in rew], alpha=0.4, color=color, ls="--",
                         label=f"{label}: batch reward (after the group filter)")
        scored = [(r["step"], r["reward_mean_scored"]) for r in rows if r.get("reward_mean_scored") is not None]
        if scored:
            ax_step.plot([s for s, _ in scored], [v for _, v in scored], alpha=0.6, color=color, ls="-.",
                         label=f"{label}: reward of all sampled groups (before the filter)")
        if rows:
            ax_time.axvline(rows[0]["elapsed_s"], color=color, ls=":", lw=1)
        _plot_off_policy(ax_off, rows, label, color)
    for ax, xlabel in ((ax_step, "RL step (policy version)"), (ax_time, "wall-clock seconds (warm start + RL)")):
        if target:
            ax.axhline(target, color="red", ls="--", lw=1, label=f"target {target}")
        ax.set_xlabel(xlabel)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    ax_step.set_ylabel("accuracy / reward")
    ax_step.legend(fontsize=7, loc="best")
    ax_time.set_title("dotted: end of warm start", fontsize=8)
    ax_off.axhline(1e-4, color="red", ls="--", lw=1, label="mismatch flag (float32)")
    ax_off.set_yscale("log")
    ax_off.set_xlabel("RL step (policy version)")
    ax_off.set_ylabel("nats / fraction")
    ax_off.set_title("off-policy diagnostics (fractions of 0 are not drawn)", fontsize=8)
    ax_off.grid(alpha=0.3, which="both")
    ax_off.legend(fontsize=6, loc="best")
    fig.tight_layout()
    _atomic_savefig(fig, Path(out_png))
    plt.close(fig)
    return Path(out_png)


def _plot_off_policy(ax, rows: list[dict], label: str, color: str) -> None:
    """Per-step |log pi_behav - log pi_prox| (max, mean) on tokens of the trainer's own version, and the fractions
    of tokens clipped (PPO) and masked by the behaviour-weight correction; zeros are not drawn (log scale)."""
    rl = [r for r in rows if r.get("phase") == "rl"]
    for key, style, what in (("logprob_mismatch_max", "-", "max |behav - prox| logprob"),
                             ("logprob_mismatch_mean", ":", "mean |behav - prox| logprob"),
                             ("clip_frac", "--", "clipped fraction"),
                             ("iw_capped_frac", "-.", "masked fraction (w outside bounds)")):
        pts = [(r["step"], r[key]) for r in rl if isinstance(r.get(key), (int, float)) and r[key] > 0]
        if pts:
            ax.plot([a for a, _ in pts], [b for _, b in pts], ls=style, marker=".", ms=3, color=color,
                    label=f"{label}: {what}")

"""Rendering ``areal bench algorithms`` results: the table (terminal and Markdown) and ``algorithms.png`` (held-out
accuracy curves: one colour per preset, each seed a thin line, the seed mean a thick one)."""

from __future__ import annotations

from pathlib import Path

from areal_cli.bench.figures import save_png


def _pm(c: dict | None, fmt: str = "{:.3f}") -> str:
    if c is None:
        return "-"
    return fmt.format(c["mean"]) + (f" ± {fmt.format(c['std'])}" if c["n"] > 1 else "")


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the results table: one row per preset, mean ± sample std over seeds."""
    target = results["target_accuracy"]
    head = ["preset", "runs", "final acc", "best acc", f"RL s to {target:.2f}" if target else "RL s to target",
            "stale", "iw mean", "iw p50", "lp mismatch", "zero-std", "RL s"]
    rows = []
    for p, c in results["presets"].items():
        tt = c["time_to_target_s"]
        reached = f"{_pm(tt, '{:.1f}')} ({c['runs_reached_target']}/{c['runs']})" if tt else "not reached"
        rows.append([p, str(c["runs"]), _pm(c["final_accuracy"]), _pm(c["max_accuracy"]),
                     reached if target else "-", _pm(c["staleness_mean"], "{:.2f}"),
                     _pm(c.get("iw_mean"), "{:.4f}"), _pm(c["iw_p50"], "{:.4f}"),
                     _pm(c["logprob_mismatch_mean"], "{:.1e}"), _pm(c["zero_std_group_frac"], "{:.2f}"),
                     _pm(c["rl_seconds"], "{:.1f}")])
    return head, rows


def caption(results: dict) -> str:
    """What the table's figures are, the target and, when other work used the machine, a BUSY MACHINE warning."""
    sc = results["scenario"]
    eta = {k.get("rollout.max_head_offpolicyness") for k in results["preset_keys"].values()}
    line = (f"recipe {sc['recipe']}, eta {','.join(str(e) for e in sorted(eta))}, {sc['steps']} RL steps, "
            f"{sc['seeds']} seed(s); mean ± std over seeds; target {results['target_accuracy']} "
            f"({results['target_source']}); RL s to target: runs that reached it (reached/runs); stale: mean "
            f"staleness; iw mean / p50: mean / median pi_prox/pi_behav; lp mismatch: engine-vs-trainer |dlogp| (nats); zero-std: "
            f"share of dead groups")
    mc = (results.get("machine") or {}).get("during_runs")
    if mc and mc.get("busy"):
        line += (f". BUSY MACHINE: other processes took up to {mc['max_other_cores']:.2f} cores, steal "
                 f"{mc['max_steal_cores']:.2f}, in {len(mc['busy_runs'])} of {len(results['runs'])} runs: times "
                 f"are partly the machine's")
    return line


def results_table(results: dict):
    """A rich Table of :func:`table_rows` with :func:`caption`."""
    from rich.table import Table

    head, rows = table_rows(results)
    t = Table(title=f"areal bench algorithms: {results['scenario']['recipe']}", caption=caption(results))
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i == 0 else "right", style="cyan" if i == 0 else None)
    for r in rows:
        t.add_row(*r)
    return t


def table_markdown(results: dict) -> str:
    """The table as Markdown (``table.md``), with the preset keys in force."""
    head, rows = table_rows(results)
    lines = [f"# areal bench algorithms: {results['scenario']['recipe']}", "", caption(results) + ".", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "Preset keys in force:", ""]
    for p, keys in results["preset_keys"].items():
        lines.append(f"- `{p}`: " + ", ".join(f"`{k}={v}`" for k, v in keys.items() if k != "ppo.algorithm"))
    return "\n".join(lines) + "\n"


def plot_curves(results: dict, path: Path) -> None:
    """Held-out accuracy against RL step and against RL seconds: one colour per preset, each seed a thin line,
    the mean over seeds a thick one; the target and the warm start's accuracy as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, (p, cell) in enumerate(results["presets"].items()):
        color = f"C{i}"
        for r in (r for r in results["runs"] if r["preset"] == p):
            c = r["accuracy_curve"]
            axes[0].plot([x[0] for x in c], [x[2] for x in c], color=color, lw=0.7, alpha=0.45)
            axes[1].plot([x[1] for x in c], [x[2] for x in c], color=color, lw=0.7, alpha=0.45)
        mc = cell["mean_curve"]
        if mc:
            axes[0].plot([x[0] for x in mc], [x[2] for x in mc], color=color, lw=2.4, label=f"{p} ({cell['runs']})")
            axes[1].plot([x[1] for x in mc], [x[2] for x in mc], color=color, lw=2.4, label=p)
    warm = (results.get("warm_start") or {}).get("accuracy")
    for ax in axes:
        if results["target_accuracy"]:
            ax.axhline(results["target_accuracy"], color="#d62728", ls="--", lw=1)
        if warm is not None:
            ax.axhline(warm, color="gray", ls=":", lw=1)
        ax.set_ylabel("held-out greedy accuracy")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("RL step")
    axes[1].set_xlabel("RL seconds (evaluations excluded)")
    axes[0].legend(fontsize=8, title="preset (seeds)", title_fontsize=8)
    sc = results["scenario"]
    fig.suptitle(f"areal bench algorithms: {sc['recipe']}, {sc['steps']} RL steps, thin: seeds, thick: mean; "
                 f"dashed: target, dotted: warm start", x=0.01, ha="left", fontsize=10)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)

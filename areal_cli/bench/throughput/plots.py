"""Plots of ``areal bench throughput``: per-worker activity timelines and throughput bars (matplotlib, Agg).

Both functions write a PNG atomically (temporary file in the same folder, then rename).
"""

from __future__ import annotations

from pathlib import Path

from areal_cli.bench.figures import save_png
from areal_cli.bench.throughput.accounting import batch_straggler, occupancy_curve, request_intervals

# kind -> colour; lanes: "trainer" then "server<i>" (see areal_cli.foundations.timeline.Timeline)
COLOURS = {"train": "#1f77b4", "publish": "#ff7f0e", "wait": "#dddddd", "eval": "#9467bd",
           "generate": "#2ca02c", "update": "#d62728"}
TITLES = {"sync": "sync (eta = 0)", "async": "async", "async_noninterruptible": "async, non-interruptible updates",
          "async_in_place": "async, in-place updates"}


def plot_timelines(runs: list[tuple[str, dict]], path: Path, *, window_s: float | None = 12.0) -> None:
    """One panel per run: a row per worker (trainer, each server) with its activity intervals.

    Args:
        runs: ``(mode, timeline)`` pairs; timeline as written by ``run_training(record_timeline=True)``.
        path: PNG to write.
        window_s: show the first ``window_s`` seconds of RL (None: the whole RL phase); x = seconds since
            the RL phase started.
    Raises:
        ValueError: no runs.
    """
    if not runs:
        raise ValueError("no runs to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 1.6 + 1.3 * len(runs)), squeeze=False, sharex=True)
    kinds_seen: set[str] = set()
    for ax, (mode, tl) in zip(axes[:, 0], runs):
        t0 = tl["marks"]["rl_start"]
        t_end = tl["marks"].get("rl_end", t0)
        x1 = min(t_end - t0, window_s) if window_s else t_end - t0
        lanes = ["trainer"] + sorted({e["lane"] for e in tl["events"] if e["lane"] != "trainer"})
        for row, lane in enumerate(lanes):
            by_kind: dict[str, list[tuple[float, float]]] = {}
            for e in tl["events"]:
                if e["kind"] == "request":  # single requests: drawn by plot_decomposition
                    continue
                if e["lane"] == lane and e["end"] > t0 and e["start"] - t0 < x1:
                    by_kind.setdefault(e["kind"], []).append((e["start"] - t0, e["end"] - e["start"]))
            # generation underneath, updates on top, so a drain during an update stays visible
            for kind in sorted(by_kind, key=lambda k: ("wait", "generate", "train", "eval", "publish", "update").index(k)
                               if k in COLOURS else 9):
                kinds_seen.add(kind)
                height = 0.5 if kind == "update" else 0.8
                ax.broken_barh(by_kind[kind], (row - height / 2, height), color=COLOURS.get(kind, "#888888"),
                               linewidth=0)
        for s in tl["steps"]:
            if s["end"] - t0 <= x1:
                ax.axvline(s["end"] - t0, color="black", linewidth=0.4, alpha=0.4)
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_ylim(-0.6, len(lanes) - 0.4)
        ax.set_xlim(0, x1)
        ax.invert_yaxis()
        ax.set_title(TITLES.get(mode, mode) + " (vertical lines: policy version published)", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds since the RL phase started")
    handles = [Patch(color=COLOURS[k], label=k) for k in COLOURS if k in kinds_seen]
    fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle("Generation and training activity per worker", x=0.01, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    save_png(fig, path)
    plt.close(fig)


def plot_throughput_bars(results: dict, path: Path) -> None:
    """Bars with the run-to-run range: effective and generation throughput per mode; and, when measured,
    the embedded server vs HF static generate tokens/s.

    Args:
        results: the ``results.json`` dict of :func:`areal_cli.bench.throughput.run_benchmark`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = results["modes"]
    names = [m for m in ("sync", "async", "async_noninterruptible", "async_in_place") if m in modes]
    gen = results.get("generate")
    fig, axes = plt.subplots(1, 2 if gen else 1, figsize=(11 if gen else 7, 4), squeeze=False)
    ax = axes[0, 0]
    width = 0.38
    for j, (key, label, colour) in enumerate((("effective_tokens_per_s", "effective training", "#1f77b4"),
                                              ("generation_tokens_per_s", "generation", "#2ca02c"))):
        xs = [i + (j - 0.5) * width for i in range(len(names))]
        d = [modes[m][key] for m in names]
        ax.bar(xs, [v["mean"] for v in d], width, color=colour, label=label,
               yerr=[[v["mean"] - v["min"] for v in d], [v["max"] - v["mean"] for v in d]], capsize=3)
        for x, v in zip(xs, d):
            ax.text(x, v["max"], f"{v['mean']:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), [TITLES.get(m, m).replace(", ", ",\n") for m in names], fontsize=8)
    ax.set_ylabel("tokens / s")
    r = results["ratios"]["async_over_sync"]
    ip = (results.get("in_place") or {}).get("over_sync")
    ax.set_title((f"RL throughput (async/sync effective: {r['mean']:.2f}x" + (f"; in place {ip['mean']:.2f}x" if ip else "")
                  + ")") if r else "RL throughput", fontsize=10)
    ax.legend(fontsize=8)
    if gen:
        ax = axes[0, 1]
        bars = [("embedded server\n(continuous batching)", gen["embedded_server"]["tokens_per_s"]),
                ("HF generate\n(static batch)", gen["hf_static_batch"]["tokens_per_s"])]
        if gen.get("hf_per_prompt"):
            bars.append(("HF generate\n(one prompt at a time)", gen["hf_per_prompt"]["tokens_per_s"]))
        ax.bar(range(len(bars)), [b[1] for b in bars], color=["#2ca02c", "#7f7f7f", "#bcbcbc"][: len(bars)])
        for i, (_, v) in enumerate(bars):
            ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
        ax.set_ylabel("useful tokens / s")
        w = gen["workload"]
        ax.set_title(f"{w['n_prompts']} prompts, {w['budgets'][0]}-{w['budgets'][1]} new tokens "
                     f"({gen['continuous_over_static']:.2f}x)", fontsize=10)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def plot_accuracy_curves(results: dict, path: Path) -> None:
    """Held-out accuracy against RL seconds (evaluations excluded) for every run, one colour per mode, with
    the time-to-equal-accuracy target as a dashed line.

    Args:
        results: the ``results.json`` dict of :func:`areal_cli.bench.throughput.run_benchmark` (runs with an
            ``accuracy_curve``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"sync": "#7f7f7f", "async": "#1f77b4", "async_noninterruptible": "#ff7f0e", "async_in_place": "#2ca02c"}
    fig, ax = plt.subplots(figsize=(7, 4))
    seen: set[str] = set()
    for r in results["runs"]:
        curve = r.get("accuracy_curve") or []
        if not curve:
            continue
        mode = r["mode"]
        ax.plot([c[1] for c in curve], [c[2] for c in curve], marker="o", ms=3, color=colours.get(mode, "k"),
                label=None if mode in seen else TITLES.get(mode, mode), alpha=0.4, lw=1)
        seen.add(mode)
    tta = results.get("time_to_accuracy")
    title = "held-out accuracy vs RL time"
    if tta:
        ax.axhline(tta["target_accuracy"], ls="--", color="#d62728", lw=1)
        for mode, curve in (tta.get("mean_curve") or {}).items():
            if curve and len(results["runs"]) > 2:  # the seed average, drawn over the runs
                ax.plot([c[1] for c in curve], [c[2] for c in curve], lw=2.5, color=colours.get(mode, "k"),
                        label=f"{TITLES.get(mode, mode)}: mean over seeds")
        if tta.get("mean_curve_ratio"):
            title += f" (time to {tta['target_accuracy']:.3f}: sync/async {tta['mean_curve_ratio']:.2f}x)"
    ax.set_xlabel("RL seconds (held-out evaluations excluded)")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def plot_decomposition(results: dict, timelines: list[tuple[str, dict]], path: Path, *,
                       window_s: float = 6.0) -> None:
    """Server occupancy against time for the first run of each mode (requests in flight; the trainer's training
    and publishing shaded underneath), the sync steps' straggler seconds hatched, and the async/sync ratio split
    into its overlap and straggler terms next to the measured ratios (:func:`areal_cli.bench.throughput.
    decompose_ratio`).

    Args:
        results: the ``results.json`` dict of :func:`areal_cli.bench.throughput.run_benchmark`.
        timelines: ``(mode, timeline)`` pairs whose timelines hold ``request`` events.
        window_s: seconds of RL shown per run, starting one step in (the first step carries start-up costs).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(m, tl) for m, tl in timelines if request_intervals(tl)]
    dc = results.get("decomposition")
    fig, axes = plt.subplots(len(runs) + (1 if dc else 0), 1, figsize=(11, 2.3 * len(runs) + (2.6 if dc else 0)),
                             squeeze=False)
    for ax, (mode, tl) in zip(axes[:, 0], runs):
        steps = tl["steps"]
        t0 = steps[0]["end"] if len(steps) > 2 else tl["marks"]["rl_start"]
        t1 = t0 + window_s
        iv = request_intervals(tl, exclude_eval=False)
        curve = occupancy_curve(iv)
        xs, ys = [], []
        for (t, n), nxt in zip(curve, curve[1:] + [(curve[-1][0], 0)]):
            xs += [t - t0, nxt[0] - t0]
            ys += [n, n]
        ax.plot(xs, ys, color="#2ca02c", lw=1, drawstyle="default", label="requests in flight")
        top = max((n for _, n in occupancy_curve(request_intervals(tl, (t0, t1)))), default=1)
        for e in tl["events"]:
            if e["lane"] == "trainer" and e["kind"] in ("train", "publish") and e["end"] > t0 and e["start"] < t1:
                ax.axvspan(e["start"] - t0, e["end"] - t0, ymax=0.06, color=COLOURS[e["kind"]], lw=0)
            if e["lane"] == "trainer" and e["kind"] == "eval" and e["end"] > t0 and e["start"] < t1:
                ax.axvspan(e["start"] - t0, e["end"] - t0, color="#dddddd", alpha=0.6, lw=0)
                ax.text(max(e["start"] - t0, 0) + 0.02, top * 1.02, "held-out eval (cut)", fontsize=7, va="bottom")
        if mode == "sync":
            for s in steps:
                b_iv = request_intervals(tl, (s["start"], s["start"] + s["wait_s"]))
                b = batch_straggler(b_iv)
                if b is None or s["start"] > t1 or s["start"] + s["wait_s"] < t0:
                    continue
                end = max(e for _, e in b_iv)
                ax.axvspan(end - b["straggler_s"] - t0, end - t0, color="#d62728", alpha=0.15, lw=0)
        for s in steps:
            if t0 < s["end"] < t1:
                ax.axvline(s["end"] - t0, color="black", lw=0.4, alpha=0.4)
        ax.set_xlim(0, window_s)
        ax.set_ylim(0, top * 1.25 + 0.5)
        ax.set_ylabel("requests\nin flight")
        title = TITLES.get(mode, mode) + ": server occupancy (bottom strip: trainer training / publishing"
        title += "; red: straggler seconds of each sync batch)" if mode == "sync" else ")"
        ax.set_title(title, fontsize=9, loc="left")
    if runs:
        axes[len(runs) - 1, 0].set_xlabel("seconds (from the end of the first RL step)")
    if dc:
        ax = axes[-1, 0]
        me = dc.get("measured") or {}
        bars = [("overlap", dc["overlap"], "#1f77b4"), ("straggler", dc["straggler"], "#d62728"),
                ("ceiling =\noverlap x straggler", dc["ceiling"], "#7f7f7f")]
        if me.get("step_rate"):
            bars.append(("measured:\nsteps per second", me["step_rate"], "#2ca02c"))
        if me.get("effective"):
            bars.append(("measured:\neffective tok/s", me["effective"], "#98df8a"))
        ip = ((results.get("in_place") or {}).get("decomposition") or {}).get("measured") or {}
        if ip.get("effective"):
            bars.append(("measured, in-place\nupdates: effective", ip["effective"], "#2ca02c"))
        ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
        for i, (_, v, _) in enumerate(bars):
            ax.text(i, v, f"{v:.2f}x", ha="center", va="bottom", fontsize=8)
        ax.axhline(1.0, color="black", lw=0.5)
        ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
        ph = dc["phases_s"]
        ax.set_title(f"async / sync: sync step = G {ph['generate']:.3f} s (of which straggler {ph['straggler']:.3f}) "
                     f"+ T {ph['train']:.3f} + P {ph['publish']:.3f}", fontsize=9, loc="left")
        ax.set_ylabel("x")
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)

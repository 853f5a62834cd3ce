"""``areal bench simulate``: predict synchronous vs asynchronous RL throughput for a cluster (click command).

Importing this module imports only click and the standard library; numpy, rich and matplotlib are imported
when the command runs. Writes ``DIR/results.json`` (every figure, the scenario and the machine it ran on),
``DIR/scaling.png``, ``DIR/sensitivity.png`` and, when the scenario lists ``eta_sweep``, ``DIR/staleness.png``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from areal_cli.bench.figures import save_png


def _machine() -> dict:
    """Where the simulation ran (it is single-threaded Python)."""
    import os
    import platform

    from areal_cli.foundations.manifest import cpu_model

    return {"python": platform.python_version(), "platform": platform.platform(), "cpu": cpu_model(),
            "cpu_count": os.cpu_count()}


def plot_scaling(scaling: dict, reference: dict, title: str, path: Path) -> None:
    """Effective throughput vs GPUs (log-log) for each simulated mode, a linear-scaling line from the first
    async point, and published reference points (markers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    gpus = scaling["gpus"]
    labels = {"async": "async (AReaL, simulated)", "sync": "sync, same split (simulated)",
              "sync_colocated": "sync, colocated like verl (simulated)"}
    for i, mode in enumerate(m for m in ("async", "sync", "sync_colocated") if m in scaling):
        ax.plot(gpus, [v / 1e3 for v in scaling[mode]], marker="o", color=f"C{i}", label=labels[mode])
    if "async" in scaling:
        base = scaling["async"][0] / gpus[0]
        ax.plot(gpus, [base * g / 1e3 for g in gpus], ls=":", color="gray", label="linear scaling")
    for j, (label, ref) in enumerate(reference.items()):
        ax.plot(ref["gpus"], [v / 1e3 for v in ref["tokens_per_s"]], ls="none", marker="x^sv"[j % 4],
                markersize=8, color=f"C{j + 3}", label=f"{label} (published)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(gpus)
    ax.set_xticklabels([str(g) for g in gpus])
    ax.set_xlabel("GPUs (generation + training)")
    ax.set_ylabel("effective training throughput (k tokens/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_png(fig, path)
    plt.close(fig)


def plot_sensitivity(sens: dict, title: str, path: Path) -> None:
    """Tornado chart: the async/sync ratio with each input at -rel and +rel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(sens["inputs"].items())[::-1]
    base = sens["base"]
    fig, ax = plt.subplots(figsize=(7.5, 0.35 * len(rows) + 1.2))
    for i, (name, r) in enumerate(rows):
        ax.barh(i, r["low"] - base, left=base, color="C0", alpha=0.8, label=f"-{sens['rel']:.0%}" if i == 0 else None)
        ax.barh(i, r["high"] - base, left=base, color="C3", alpha=0.8, label=f"+{sens['rel']:.0%}" if i == 0 else None)
    ax.axvline(base, color="black", lw=1)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([n for n, _ in rows], fontsize=8)
    ax.set_xlabel(f"predicted async/sync speed-up (base {base:.2f}x)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    save_png(fig, path)
    plt.close(fig)


def plot_eta_sweep(sweep: dict, published: dict, title: str, path: Path) -> None:
    """Effective throughput vs eta, simulated and (if given) published."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(sweep)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    x = range(len(keys))
    ax.plot(x, [sweep[k]["effective_tokens_per_s"] / 1e3 for k in keys], marker="o", label="simulated")
    if published:
        pts = [(i, published[k]) for i, k in enumerate(keys) if k in published]
        ax.plot([p[0] for p in pts], [p[1] / 1e3 for p in pts], marker="x", ls="--", label="published (Fig. 7)")
    ax.set_xticks(list(x))
    ax.set_xticklabels([("∞" if k == "inf" else k) for k in keys])
    ax.set_xlabel("eta (max staleness); 0 = synchronous")
    ax.set_ylabel("effective training throughput (k tokens/s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save_png(fig, path)
    plt.close(fig)


#: ``published`` keys of a measured CPU scenario -> the simulated mode they check.
MEASURED_RATIOS = (("async_over_sync", "async"), ("async_noninterruptible_over_sync", "async_nointerrupt"),
                   ("async_in_place_over_sync", "async_inplace"))


def _measured_check(sc, modes: dict) -> dict | None:
    """Predicted vs measured async/sync ratios of steady-state step times (sync seconds per step / async seconds
    per step, as ``areal bench throughput`` reports in ``steady_state``), for a scenario whose ``published`` holds
    a measured ``async_over_sync`` (and optionally ``async_noninterruptible_over_sync``,
    ``async_in_place_over_sync``)."""
    pub = sc.published or {}
    out = {}
    for key, mode in MEASURED_RATIOS:
        if key in pub:
            pred = modes["sync"]["step_s"] / modes[mode]["step_s"]
            out[key] = {"measured": float(pub[key]), "predicted": pred, "rel_error": pred / float(pub[key]) - 1}
    if out:
        out["source"] = pub.get("source", "")
    return out or None


def _published_check(sc, modes: dict) -> dict | None:
    pub = sc.published or {}
    if "sync_hours" not in pub or "async_hours" not in pub:
        return None
    ratio_pub = pub["sync_hours"] / pub["async_hours"]
    ratio = modes["sync"]["hours"] / modes["async"]["hours"]
    return {"published_sync_hours": pub["sync_hours"], "published_async_hours": pub["async_hours"],
            "published_ratio": ratio_pub, "predicted_sync_hours": modes["sync"]["hours"],
            "predicted_async_hours": modes["async"]["hours"], "predicted_ratio": ratio,
            "ratio_rel_error": ratio / ratio_pub - 1, "source": pub.get("source", "")}


def _sweep_scale(sc, requested: int) -> int:
    """Shrink factor for sweeps: at most ``requested``, keeping >= 8 servers and >= 16 groups per step."""
    return max(1, min(requested, sc.n_servers // 8, sc.batch_size // 16))


def run_simulation(sc, out: Path | None, *, gpus: list[int] | None, scale: int, sweep_scale: int,
                   sensitivity_on: bool, fit: bool, calibrate_from: Path | None, console,
                   costs_from=None) -> dict:
    """Everything the command does, returning the results dict (also written to ``out/results.json``).

    ``costs_from``: the machine scenario of ``--costs-from`` (the command has already carried its constants into
    ``sc``), recorded in the results."""
    import dataclasses

    from areal_cli.foundations.atomic import write_atomic_many, write_json_atomic
    from areal_cli.bench import sim

    t0 = time.perf_counter()
    results: dict = {"machine": _machine(), "command": " ".join(["areal", "bench", "simulate", *sys.argv[3:]])
                     if sys.argv[1:3] == ["bench", "simulate"] else None}
    if costs_from is not None:  # the machine scenario, already applied by the command (before its -o overrides)
        results["costs_from"] = {"scenario": costs_from.source,
                                 "fields": {k: getattr(costs_from, k) for k in sim.MACHINE_FIELDS}}
        console.print(f"machine constants from {costs_from.source} ({len(sim.MACHINE_FIELDS)} fields); "
                      f"workload from {sc.source or sc.name}")
    if calibrate_from is not None:
        sc, rep = sim.calibrate_from_run(calibrate_from, sc)
        results["calibration"] = rep
        console.print(f"calibrated on {calibrate_from}: decode step {sc.decode_step_fixed_s * 1e3:.2f} ms, "
                      f"train {sc.train_fixed_s:.3f} s + {sc.train_gpu_s_per_token * 1e6:.1f} us/token")
    if fit:
        sc, rep = sim.fit_to_published(sc, scale=scale)
        results["fit"] = rep
        console.print("fitted to the published step times: " + ", ".join(f"{k} = {v:.4g}" for k, v in rep["params"].items()))
    results["scenario"] = {k: v for k, v in sc.to_dict().items()}
    results["costs"] = dataclasses.asdict(sim.derive_costs(sc))
    results["response_lengths"] = sim.length_stats(sc)
    extra = ("async_inplace",) if "async_in_place_over_sync" in (sc.published or {}) else ()
    modes = sim.compare_modes(sc, sim.MODES + extra, scale=scale)
    results["modes"] = modes
    results["async_sync_ratio"] = modes["sync"]["step_s"] / modes["async"]["step_s"]
    results["interruptible_gain"] = {
        "effective": modes["async"]["effective_tokens_per_s"] / modes["async_nointerrupt"]["effective_tokens_per_s"] - 1,
        "generation": modes["async"]["gen_tokens_per_s"] / modes["async_nointerrupt"]["gen_tokens_per_s"] - 1,
        "chunk_tokens": sc.chunk_tokens}
    if sc.chunk_tokens:  # the same ablation when a weight update waits for whole requests
        whole = sim.simulate(dataclasses.replace(sc, chunk_tokens=0), "async_nointerrupt", scale=scale)
        results["interruptible_gain"]["effective_vs_whole_request_drain"] = (
            modes["async"]["effective_tokens_per_s"] / whole["effective_tokens_per_s"] - 1)
    results["published_check"] = _published_check(sc, modes)
    results["measured_check"] = _measured_check(sc, modes)
    _print_modes(console, sc, modes, results)
    ss = _sweep_scale(sc, sweep_scale)
    if sc.eta_sweep:
        results["eta_sweep"] = sim.eta_sweep(sc, sc.eta_sweep, scale=ss)
    if sensitivity_on:
        results["sensitivity"] = sim.sensitivity(sc, scale=ss)
        results["sensitivity"]["scale"] = ss
        _print_sensitivity(console, results["sensitivity"])
    if gpus:
        sweep = {}
        for total in gpus:
            g, t = sim.split_gpus(sc, total)
            s2 = dataclasses.replace(sc, gen_gpus=g, train_gpus=t)
            one = sim.scaling(s2, [total], modes=("sync", "async", "sync_colocated"), scale=_sweep_scale(s2, sweep_scale))
            for k, v in one.items():
                sweep.setdefault(k, []).extend(v)
        results["scaling"] = sweep
        _print_scaling(console, sweep)
    results["runtime_s"] = time.perf_counter() - t0
    if out is not None:
        write_json_atomic(out / "results.json", results)
        write_atomic_many({out / "scenario.yaml": sim.scenario_yaml(sc, "scenario as simulated (after -o, fit, calibration)")})
        title = sc.name
        for name, drawn in (("scaling.png", gpus), ("sensitivity.png", sensitivity_on), ("staleness.png", sc.eta_sweep)):
            if not drawn:  # a reused folder: no figure of an earlier simulation beside this one's results
                (out / name).unlink(missing_ok=True)
        if gpus:
            plot_scaling(results["scaling"], sc.scaling_reference, f"{title}: predicted scaling", out / "scaling.png")
        if sensitivity_on:
            plot_sensitivity(results["sensitivity"], f"{title}: sensitivity of the async/sync ratio",
                             out / "sensitivity.png")
        if sc.eta_sweep:
            plot_eta_sweep(results["eta_sweep"], (sc.published or {}).get("eta_throughput", {}),
                           f"{title}: throughput vs staleness", out / "staleness.png")
        console.print(f"wrote {out / 'results.json'}")
    return results


def _print_modes(console, sc, modes: dict, results: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(f"{sc.name}: {sc.gen_gpus} generation + {sc.train_gpus} training "
                           f"{_plural(sc.device, sc.train_gpus)}, {sc.batch_size}x{sc.group_size} samples/step, "
                           f"{sc.steps} steps"))
    for col in ("mode", "eta", "s/step", "hours", "effective k tok/s", "gen k tok/s", "gen idle", "trainer idle",
                "staleness mean/max", "vs sync"):
        t.add_column(col, justify="right" if col != "mode" else "left")
    for m, r in modes.items():
        t.add_row(m, "-" if r["eta"] is None else str(r["eta"]), _fmt(r["step_s"]), _fmt(r["hours"]),
                  f"{r['effective_tokens_per_s'] / 1e3:.1f}", f"{r['gen_tokens_per_s'] / 1e3:.1f}",
                  f"{r['gen_idle_frac']:.0%}", f"{r['trainer_idle_frac']:.0%}",
                  f"{r['staleness_mean']:.2f}/{r['staleness_max']}", f"{r['speedup_vs_sync']:.2f}x")
    console.print(t)
    pc = results["published_check"]
    if pc:
        console.print(f"published: sync {pc['published_sync_hours']:.1f} h, async {pc['published_async_hours']:.1f} h "
                      f"= {pc['published_ratio']:.2f}x; predicted {pc['predicted_sync_hours']:.1f} h / "
                      f"{pc['predicted_async_hours']:.1f} h = {pc['predicted_ratio']:.2f}x "
                      f"({pc['ratio_rel_error']:+.1%})")
    mc = results.get("measured_check") or {}
    for key, label in (("async_over_sync", "async"), ("async_noninterruptible_over_sync", "async non-interruptible"),
                       ("async_in_place_over_sync", "async in-place")):
        if key in mc:
            console.print(f"measured {label}/sync {mc[key]['measured']:.2f}x, predicted {mc[key]['predicted']:.2f}x "
                          f"({mc[key]['rel_error']:+.1%})")
    cal = results.get("calibration") or {}
    for name, r in (cal.get("ratios") or {}).items():
        console.print(f"calibration run, {name}/sync: measured {r['measured']:.2f}x, simulated {r['simulated']:.2f}x "
                      f"({r['rel_error']:+.1%})")
    g = results["interruptible_gain"]
    console.print(f"interruptible vs non-interruptible updates (chunk {g['chunk_tokens'] or 'whole request'}): "
                  f"{g['effective']:+.1%} effective, {g['generation']:+.1%} generation throughput"
                  + (f"; vs waiting for whole requests: {g['effective_vs_whole_request_drain']:+.1%} effective"
                     if "effective_vs_whole_request_drain" in g else ""))


def _plural(device: str, n: int) -> str:
    """``device`` for ``n`` of them: GPU -> GPUs, CPU core -> CPU cores (a name already ending in s is kept)."""
    return device if n == 1 or device.endswith("s") else device + "s"


def _fmt(v: float) -> str:
    """One decimal from 10 up, three decimals from 0.01 (a CPU scenario's steps take 0.2-0.5 s), 3 significant
    digits in scientific notation below (a CPU scenario's hours)."""
    if abs(v) >= 9.95:
        return f"{v:.1f}"
    return f"{v:.3f}" if abs(v) >= 0.01 else f"{v:.2e}"


def _print_sensitivity(console, sens: dict) -> None:
    from rich.table import Table

    t = Table(title=f"async/sync ratio with one input at -{sens['rel']:.0%} / +{sens['rel']:.0%} "
                    f"(base {sens['base']:.2f}x)")
    for col in ("input", "value", f"-{sens['rel']:.0%}", f"+{sens['rel']:.0%}", "largest change"):
        t.add_column(col, justify="right" if col != "input" else "left")
    for name, r in sens["inputs"].items():
        t.add_row(name, f"{r['base_value']:.4g}", f"{r['low']:.2f}", f"{r['high']:.2f}", f"{r['max_change']:.2f}")
    console.print(t)


def _print_scaling(console, sweep: dict) -> None:
    from rich.table import Table

    t = Table(title="predicted scaling (effective k tokens/s)")
    for col in ("GPUs", "gen+train", "sync", "sync colocated", "async", "async/sync"):
        t.add_column(col, justify="right")
    for i, g in enumerate(sweep["gpus"]):
        t.add_row(str(g), f"{sweep['gen_gpus'][i]}+{sweep['train_gpus'][i]}", f"{sweep['sync'][i] / 1e3:.1f}",
                  f"{sweep['sync_colocated'][i] / 1e3:.1f}", f"{sweep['async'][i] / 1e3:.1f}",
                  f"{sweep['async'][i] / sweep['sync'][i]:.2f}x")
    console.print(t)


def _parse_gpus(text: str | None, default: list[int]) -> list[int]:
    from areal_cli.foundations.errors import UserError

    if text is None:
        return list(default)
    if text.strip().lower() in ("", "none", "0"):
        return []
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--gpus {text}: expected comma-separated integers, e.g. 32,64,128") from None
    if any(v < 2 for v in vals):
        raise UserError(f"--gpus {text}: every entry must be >= 2")
    return vals


@click.command("simulate")
@click.argument("scenario")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Write results.json, scenario.yaml and the plots here.")
@click.option("--gpus", default=None, metavar="LIST",
              help="Total GPU counts for the scaling sweep, e.g. 32,64,128,1024 ('none' to skip). "
                   "Default: the scenario's scaling_gpus.")
@click.option("-o", "--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a scenario field, e.g. -o response_sigma=1.2. Repeatable.")
@click.option("--scale", type=int, default=1, show_default=True,
              help="Simulate the main modes on a cluster shrunk this many times (faster, same per-server load).")
@click.option("--sweep-scale", type=int, default=8, show_default=True,
              help="Shrink factor for the sweeps (kept >= 8 servers).")
@click.option("--no-sensitivity", is_flag=True, help="Skip the +-20% sensitivity sweep.")
@click.option("--fit", is_flag=True,
              help="First fit decode_overhead_s and train_mfu to the scenario's published sync/async hours.")
@click.option("--calibrate-from", type=click.Path(path_type=Path), default=None,
              help="First fit the scenario to a measured run (metrics.jsonl of an eta=0 run, or "
                   "`areal bench throughput` results.json).")
@click.option("--costs-from", default=None, metavar="SCENARIO",
              help="Take the machine's constants (engine step costs, per-request overhead, training and publishing "
                   "costs) from a calibrated scenario, e.g. DIR/scenario.yaml of `--calibrate-from RUN --out DIR`; "
                   "the workload stays SCENARIO's: predict another workload on a measured machine.")
def simulate(scenario: str, out_dir: Path | None, gpus: str | None, overrides: tuple[str, ...], scale: int,
             sweep_scale: int, no_sensitivity: bool, fit: bool, calibrate_from: Path | None,
             costs_from: str | None) -> None:
    """Predict synchronous, one-step-overlap and fully asynchronous RL throughput for SCENARIO.

    SCENARIO is a shipped scenario name (benchmarks/scenarios/ in the repository, areal_cli/_shipped/scenarios/ in
    a wheel; e.g. published-1.5b-16node) or a YAML path.
    """
    from rich.console import Console

    from areal_cli.bench import sim
    from areal_cli.foundations.errors import UserError

    console = Console() if sys.stdout.isatty() else Console(width=130)
    try:
        if scale < 1 or sweep_scale < 1:
            raise UserError("--scale and --sweep-scale must be >= 1")
        sc, machine = sim.load_scenario(scenario), None
        if costs_from is not None:  # the machine first, so that -o can still change one of its constants
            try:
                machine = sim.load_scenario(costs_from)
                sc = sim.with_machine_of(sc, machine)
            except UserError as e:
                raise UserError(f"--costs-from {costs_from}: {e}") from None
        sc = sim.apply_overrides(sc, list(overrides))
        gpu_list = _parse_gpus(gpus, sc.scaling_gpus)
        run_simulation(sc, out_dir, gpus=gpu_list, scale=scale, sweep_scale=sweep_scale,
                       sensitivity_on=not no_sensitivity, fit=fit, calibrate_from=calibrate_from, console=console,
                       costs_from=machine)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)

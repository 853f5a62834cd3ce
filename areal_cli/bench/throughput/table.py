"""The terminal table of ``areal bench throughput`` results (modes as columns, async/sync last)."""

from __future__ import annotations

from areal_cli.bench.throughput.benchmark import TARGETS
from areal_cli.bench.throughput.scenario import MODES


#: The asynchronous modes of the steady-state rows, with their short labels.
_ASYNC_LABELS = (("async", "async"), ("async_noninterruptible", "non-interr."), ("async_in_place", "in place"))


def signed(x: float, digits: int = 3) -> str:
    """``x`` with its sign at ``digits`` decimals, a value that rounds to zero as ``+0.000`` (never ``-0.000``)."""
    v = round(x, digits)
    return f"{(v if v != 0 else 0.0):+.{digits}f}"


def results_table(results: dict):
    """A rich Table of the results (modes as columns, ratio last)."""
    from rich.table import Table

    modes = results["modes"]
    cols = [m for m in MODES if m in modes]
    t = Table(title=f"areal bench throughput: {results['scenario']['name']} "
                    f"({results['scenario']['steps']} RL steps x {results['scenario']['repeats']} repeats)")
    t.add_column("metric", style="cyan", overflow="fold")
    names = {"sync": f"sync (eta={results['scenario']['eta_sync']})",
             "async": f"async (eta={results['scenario']['eta_async']})",
             "async_noninterruptible": "async, non-interruptible",
             "async_in_place": "async, in-place updates"}
    for m in cols:  # fold, never cut, in a narrow terminal
        t.add_column(names[m], justify="right", overflow="fold")
    t.add_column("async / sync", justify="right", style="bold", overflow="fold")

    def ms(d: dict, fmt: str = "{:.0f}") -> str:
        return (fmt + " ± " + fmt).format(d["mean"], d["std"]) if d["n"] > 1 else fmt.format(d["mean"])

    hl = results.get("headline") or {}
    if hl:
        t.add_row(f"async/sync effective, median of pairs \\[range]; % of the {hl['ceiling']:.2f}x overlap ceiling",
                  *["" if m not in hl else f"{hl[m]['median']:.2f}x [{hl[m]['min']:.2f}-{hl[m]['max']:.2f}]; "
                    f"{hl[m]['fraction_of_ceiling']:.0%}" for m in cols],
                  f"{hl['async']['median']:.2f}x ({hl['async']['fraction_of_ceiling']:.0%})" if "async" in hl else "-")
    r = results["ratios"]["async_over_sync"]
    rg = results["ratios"]["async_over_sync_generation"]
    t.add_row("effective training throughput (tok/s)", *[ms(modes[m]["effective_tokens_per_s"]) for m in cols],
              f"{r['mean']:.2f}x mean [{r['min']:.2f}-{r['max']:.2f}]" if r else "-")
    t.add_row("generation throughput (tok/s)", *[ms(modes[m]["generation_tokens_per_s"]) for m in cols],
              f"{rg['mean']:.2f}x" if rg else "-")
    t.add_row("RL wall time (s)", *[ms(modes[m]["rl_seconds"], "{:.1f}") for m in cols], "")
    for lane in sorted({lane for m in cols for lane in modes[m]["idle"]}):
        t.add_row(f"idle fraction: {lane}", *[ms(modes[m]["idle"][lane], "{:.2f}") if lane in modes[m]["idle"]
                                               else "-" for m in cols], "")
    t.add_row("staleness (samples by versions behind)",
              *[" ".join(f"{k}:{n}" for k, n in modes[m]["staleness"].items()) for m in cols], "")
    acc = results["accuracy"]
    t.add_row("held-out accuracy after the last step", *[ms(modes[m]["final_accuracy"], "{:.3f}") for m in cols],
              (f"{acc['difference']:+.3f} ({'equal' if acc['equal_within_noise'] else 'NOT equal'} within "
               f"±{acc['two_standard_errors']:.3f})") if acc else "")
    oc = results.get("overlap_ceiling")
    if oc:
        ph = oc["phases_s"]
        t.add_row(f"overlap ceiling (G+T+P)/max(G,T+P): sync step = {ph['generate']:.3f} + {ph['train']:.3f} + "
                  f"{ph['publish']:.3f} s", *["" for _ in cols],
                  f"{oc['ceiling']['mean']:.2f}x" + (f" (async reached {oc['async_over_sync_fraction_of_ceiling']:.0%})"
                                                    if "async_over_sync_fraction_of_ceiling" in oc else ""))
    ss = results.get("steady_state")
    drift = (ss or {}).get("drift")
    if drift:
        t.add_row(f"machine drift: the sync runs' T {drift['min']:.3f}-{drift['max']:.3f} s, "
                  f"{drift['spread']:.0%} of its median (limit {drift['threshold']:.0%})", *["" for _ in cols],
                  "DOMINATES: not steady" if drift["dominates"] else "within the limit")
    if ss:
        ph = ss["phases_s"]
        t.add_row(("  NOT STEADY (machine drift above the limit; figures of a machine whose speed moved): "
                   if ss.get("steady") is False else "  steady state ")
                  + f"(first step left out; and steps after an in-loop evaluation, in older runs): sync step = "
                  f"{ph['generate']:.3f} + {ph['train']:.3f} + {ph['publish']:.3f} s, ceiling {ss['ceiling']:.2f}x"
                  + (f" ({ss['ceiling_with_stragglers']:.2f}x with stragglers)" if "ceiling_with_stragglers" in ss
                     else ""),
                  *["" for _ in cols],
                  "; ".join(f"{label} {ss[f'{m}_over_sync']['mean']:.2f}x ({ss[f'{m}_fraction_of_ceiling']:.0%}"
                            + (f", {ss[f'{m}_fraction_of_ceiling_with_stragglers']:.0%} with stragglers)"
                               if f"{m}_fraction_of_ceiling_with_stragglers" in ss else ")")
                            for m, label in _ASYNC_LABELS if f"{m}_over_sync" in ss))
        gaps = [(label, ss[f"{m}_gap_s"], ss.get(f"{m}_fraction_of_ceiling_under_contention"))
                for m, label in _ASYNC_LABELS if f"{m}_gap_s" in ss]
        if gaps:
            t.add_row("  steady step above the ceiling's (s per step): training phase above the sync runs' T, "
                      "waits for a batch, publishing above P; fraction of the ceiling once that longer training is "
                      "granted",
                      *["" for _ in cols],
                      "; ".join(f"{label} {signed(gp['train_slowdown'])} / {signed(gp['wait'])} / "
                                f"{signed(gp['publish'])}"
                                + (f" ({fr:.0%})" if fr is not None else "") for label, gp, fr in gaps))
    dc = results.get("decomposition")
    if dc:
        ph = dc["phases_s"]
        t.add_row(f"decomposition: sync step G {ph['generate']:.3f} (straggler S {ph['straggler']:.3f}) + T "
                  f"{ph['train']:.3f} + P {ph['publish']:.3f} s", *["" for _ in cols],
                  f"overlap {dc['overlap']:.2f}x * straggler {dc['straggler']:.2f}x = {dc['ceiling']:.2f}x")
        me = dc.get("measured")
        if me and me.get("step_rate"):
            t.add_row("  measured: sync/async s per step, effective; tokens per step async/sync",
                      *["" for _ in cols],
                      f"{me['step_rate']:.2f}x ({me['step_rate_fraction_of_ceiling']:.0%}), "
                      f"{me['effective']:.2f}x; {me['tokens_per_step']:.2f}")
    tta = results.get("time_to_accuracy")
    if tta:
        secs, mc = tta["seconds"], tta.get("mean_curve_seconds") or {}
        t.add_row(f"RL time to accuracy {tta['target_accuracy']:.3f} (s), mean curve over seeds",
                  *[("-" if mc.get(m) is None else f"{mc[m]:.1f}") if m in secs else "" for m in cols],
                  f"{tta['mean_curve_ratio']:.2f}x" if tta.get("mean_curve_ratio") else "-")
        t.add_row("  per seed (- = that run never got there)",
                  *[", ".join("-" if v is None else f"{v:.1f}" for v in secs[m].values()) if m in secs else ""
                    for m in cols],
                  f"{[round(p, 2) for p in tta['ratio']['pairs']]}" if tta["ratio"] else "-")
    ri = results["ratios"]["interruptible_over_noninterruptible"]
    if ri:
        t.add_row("interruptible / non-interruptible (effective)", *["" for _ in cols],
                  f"{ri['mean']:.2f}x [{ri['min']:.2f}-{ri['max']:.2f}]")
    rig = results["ratios"].get("interruptible_over_noninterruptible_generation")
    if rig:
        t.add_row("interruptible / non-interruptible (generation)", *["" for _ in cols],
                  f"{rig['mean']:.2f}x [{rig['min']:.2f}-{rig['max']:.2f}]")
    ip = results.get("in_place")
    if ip and ip["over_sync"]:
        o, a = ip["over_sync"], ip["over_abort"]
        acc = ip["accuracy"]
        t.add_row("in-place updates (KV kept): async / sync effective; over aborting updates", *["" for _ in cols],
                  f"{o['mean']:.2f}x [{o['min']:.2f}-{o['max']:.2f}]" + (f"; {a['mean']:.2f}x" if a else ""))
        if acc:
            t.add_row("  in place: accuracy difference to sync", *["" for _ in cols],
                      f"{acc['difference']:+.3f} ({'equal' if acc['equal_within_noise'] else 'NOT equal'} within "
                      f"±{acc['two_standard_errors']:.3f})")
        tt = ip.get("time_to_accuracy")
        if tt and tt.get("mean_curve_ratio"):
            t.add_row(f"  in place: RL time to accuracy {tt['target_accuracy']:.3f}, mean curves",
                      *["" for _ in cols], f"{tt['mean_curve_ratio']:.2f}x")
    g = results.get("generate")
    if g:
        t.add_row(f"continuous batching vs HF static generate: {g['embedded_server']['tokens_per_s']:.0f} vs "
                  f"{g['hf_static_batch']['tokens_per_s']:.0f} tok/s", *["" for _ in cols],
                  f"{g['continuous_over_static']:.2f}x")
    mc = results.get("machine_cpu")
    if mc:
        t.add_row("other processes / hypervisor steal during a run: most cores", *["" for _ in cols],
                  f"{mc['max_other_cores']:.2f} / {mc['max_steal_cores']:.2f}"
                  + (f": BUSY MACHINE in {len(mc['busy_runs'])} runs (> {mc['busy_cores']:.2f}), ratios partly the "
                     "machine's" if mc["busy"] else ""))
    load = results["machine"]["start"]["load_average"]
    reached = results["targets"]["reached"]

    def said(key: str) -> str:
        return "reached" if reached.get(key) else "not reached"

    in_place = (f"; in-place updates: {said('async_in_place_over_sync')}, in time to equal accuracy: "
                f"{said('async_in_place_over_sync_time_to_equal_accuracy')}" if "async_in_place_over_sync" in reached
                else "")
    t.caption = (f"{results['machine']['start']['cpu']}, {results['machine']['start']['cpu_count']} cpus, load "
                 f"{load} at start; targets: async/sync >= {results['targets']['async_over_sync']}x at equal accuracy "
                 f"({said('async_over_sync')}; in time to equal accuracy: "
                 f"{said('async_over_sync_time_to_equal_accuracy')}{in_place}), "
                 f"continuous/static >= {TARGETS['continuous_over_static']}x "
                 f"({'not measured' if not results.get('generate') else said('continuous_over_static')})")
    return t


def headline_line(results: dict) -> str | None:
    """One line a bench ends with: each async mode's median async/sync effective ratio over the pairs, its range
    and its fraction of the overlap ceiling; whether the machine's drift or other processes make it unsteady.
    None without a headline (no sync runs)."""
    hl = results.get("headline")
    if not hl:
        return None
    names = dict(_ASYNC_LABELS) | {"async": "async (interruptible)"}
    def accuracy(a: dict | None) -> str:
        return "" if not a else (f", accuracy {signed(a['difference'])} vs sync ("
                                 f"{'equal' if a['equal_within_noise'] else 'NOT equal'} within "
                                 f"{a['two_standard_errors']:.3f})")

    parts = [f"{names[m]} {hl[m]['median']:.2f}x [{hl[m]['min']:.2f}-{hl[m]['max']:.2f}] = "
             f"{hl[m]['fraction_of_ceiling']:.0%}{accuracy(hl[m].get('accuracy'))}" for m, _ in _ASYNC_LABELS if m in hl]
    line = f"headline (async/sync effective, median of {max(hl[m]['n'] for m, _ in _ASYNC_LABELS if m in hl)} " \
           f"pairs; % of the {hl['ceiling']:.2f}x overlap ceiling): " + "; ".join(parts)
    drift = (results.get("steady_state") or {}).get("drift")
    if drift:
        line += (f". Machine drift: sync T varied {drift['spread']:.0%}"
                 + (f" (> {drift['threshold']:.0%}): not a steady state" if drift["dominates"] else ""))
    mc = results.get("machine_cpu")
    if mc and mc["busy"]:
        line += (f". BUSY MACHINE: other processes took up to {mc['max_other_cores']:.2f} cores, steal "
                 f"{mc['max_steal_cores']:.2f}")
    return line


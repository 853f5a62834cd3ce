"""The figures of ``areal bench throughput``: one run's figures, and the modes compared over runs.

What is measured (AReaL v0.3, reference (c) and (e) of the workspace notes):

- **Effective training throughput** = tokens consumed by training / time. AReaL's definition: "tokens used in
  each RL training step / time of that step"; generated tokens the trainer never consumes (groups dropped by
  the success-rate filter, samples still in flight at the end) are not counted. Consumed tokens are prompt +
  response tokens of every trained sample (AReaL's ``ppo_actor/n_tokens``). Reported two ways:
  ``effective_tokens_per_s`` = sum of step tokens / RL wall time (warm start excluded), and
  ``effective_tokens_per_s_step_mean`` = mean over steps of tokens_i / (end_i - end_{i-1}).
- **Generation throughput** = every token the servers generated (kept or not) / RL wall time.
- **Idle fractions** over the RL window, from the run's timeline (``timeline.json`` of
  :func:`areal_cli.train_loop.run_training`): trainer idle = time waiting for a batch; server idle = time
  with no request in flight and no weight update.
- **Staleness distribution**: trained samples by (policy version at training) - (version of their first
  token), AReaL's head off-policyness.
- **Accuracy reached**: held-out greedy accuracy after the same number of RL steps, same eval set, for every
  run; "equal within noise" compares the mean difference with two binomial standard errors.

Long-tailed generation (scenario ``throughput-tiny-longtail``): the ratio is split into an overlap term and a
straggler term (:func:`decompose_ratio`) from the sync runs' step phases and their servers' occupancy over time (the
client's ``request`` events: each ``/generate`` from submission to answer; :func:`sync_stragglers`), and drawn in
``decomposition.png``. Scenario keys for it: ``sync_overrides`` (the sync baseline is standard PPO, without the
proximal pass) and ``target_async_over_sync``. Every run defers its held-out evaluations to after its RL loop
(``loop.eval_deferred``), so that no evaluation hands the rollout side free generation time.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from areal_cli.bench.throughput.accounting import (activity, after_eval, cpu_use, effective_throughput, mean_occupancy,
                                                   occupancy_curve, request_intervals, staleness_distribution,
                                                   step_durations, sync_stragglers)
from areal_cli.bench.throughput.scenario import MODES


def summarize_run(timeline: dict, summary: dict, *, label: str, mode: str, repeat: int, eta: int,
                  interruptible: bool, eval_n_prompts: int) -> dict:
    """One run's figures (a ``runs[]`` entry of results.json) from its timeline.json and summary.json.

    Steps right after an evaluation in the loop (runs of earlier versions; the benchmark now defers evaluations)
    are left out of the mean step phases (``step_seconds``).
    """
    steps = timeline["steps"]
    rl_start = timeline["marks"]["rl_start"]
    eff = effective_throughput(steps, rl_start)
    generated = steps[-1].get("generated_tokens", 0)
    act = activity(timeline, (rl_start, steps[-1]["end"]))
    train_wall = sum(s["train_s"] for s in steps)
    curve, t = [], 0.0  # (step, RL seconds without evaluations, held-out accuracy) at each evaluation
    for s, dt in zip(steps, step_durations(steps, rl_start)):
        t += dt
        if s.get("evaluated"):
            curve.append([s["step"], round(t, 4), s["accuracy"]])
    phase_steps = [s for s, p in zip(steps, after_eval(steps)) if not p] or steps
    steady = steady_steps(steps, rl_start)
    reqs = request_intervals(timeline, (rl_start, steps[-1]["end"]))
    occ = None
    if reqs:
        occ = {"mean_requests_in_flight": mean_occupancy(reqs, (rl_start, steps[-1]["end"])),
               "max_requests_in_flight": max(n for _, n in occupancy_curve(reqs)), "requests": len(reqs)}
    return {
        "label": label, "mode": mode, "repeat": repeat, "eta": eta, "interruptible": interruptible,
        "steps": eff["steps"], "rl_seconds": round(eff["seconds"], 4), "tokens_consumed": eff["tokens"],
        "step_s_mean": eff["seconds"] / eff["steps"], "tokens_per_step": eff["tokens"] / eff["steps"],
        "occupancy": occ, "straggler": sync_stragglers(timeline) if eta == 0 else None,
        "response_tokens_consumed": sum(s["response_tokens"] for s in steps),
        "effective_tokens_per_s": eff["tokens_per_s"],
        "effective_tokens_per_s_step_mean": eff["step_mean_tokens_per_s"],
        "generated_tokens": generated, "generation_tokens_per_s": generated / eff["seconds"],
        "idle": {lane: fr["idle"] for lane, fr in act.items()}, "activity": act,
        "cpu_use": cpu_use(timeline),
        "trainer_cpu_over_wall": sum(s["train_cpu_s"] for s in steps) / train_wall if train_wall > 0 else None,
        "step_seconds": {k: statistics.fmean(s[k] for s in phase_steps) for k in ("wait_s", "train_s", "publish_s")},
        "steady_step_s": statistics.fmean(d for _, d in steady) if steady else None,
        "steady_step_seconds": ({k: statistics.fmean(s[k] for s, _ in steady) for k in ("wait_s", "train_s", "publish_s")}
                                if steady else None),
        "staleness": staleness_distribution(steps),
        "final_accuracy": summary["final_accuracy"], "eval_n_prompts": eval_n_prompts, "accuracy_curve": curve,
        "interruptions": summary["controller"]["interruptions"],
        "groups_dropped_filter": summary["controller"]["groups_dropped_filter"],
        "groups_dropped_stale": summary["controller"].get("groups_dropped_stale", 0),
        "eval_deferred": any(s.get("eval_deferred") for s in steps),
        "warm_start_s": summary["warm_start"]["seconds"],
    }


def spread(values: list[float]) -> dict[str, float]:
    """``{"mean", "std" (sample, 0 for one value), "min", "max", "n"}`` of ``values``."""
    if not values:
        raise ValueError("no values")
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "n": len(values)}


def paired_ratio(runs: list[dict], num_mode: str, den_mode: str, key: str = "effective_tokens_per_s") -> dict | None:
    """Ratio num/den of ``key`` per repeat (runs of the same repeat are neighbours in time), and its spread.

    Returns ``None`` when a mode has no run. ``of_means`` = mean(num) / mean(den).
    """
    num = {r["repeat"]: r[key] for r in runs if r["mode"] == num_mode}
    den = {r["repeat"]: r[key] for r in runs if r["mode"] == den_mode}
    pairs = [num[k] / den[k] for k in sorted(num) if k in den and den[k] > 0]
    if not pairs:
        return None
    return {**spread(pairs), "pairs": pairs,
            "of_means": statistics.fmean(num.values()) / statistics.fmean(den.values())}


def accuracy_comparison(runs: list[dict], a: str = "async", b: str = "sync") -> dict | None:
    """Mean final accuracy of modes ``a`` and ``b`` and whether they are equal within noise.

    Noise: two standard errors of the difference of means, each mean's error from the binomial error of one
    eval (sqrt(p(1-p)/n_prompts)) over the number of runs, plus the runs' own spread when there are several.
    """
    acc = {m: [r["final_accuracy"] for r in runs if r["mode"] == m] for m in (a, b)}
    if not acc[a] or not acc[b]:
        return None
    n_eval = runs[0]["eval_n_prompts"]

    def var_of_mean(xs: list[float]) -> float:
        p = statistics.fmean(xs)
        binom = max(p * (1 - p), 1.0 / n_eval) / n_eval
        run_var = statistics.variance(xs) if len(xs) > 1 else 0.0
        return max(binom, run_var) / len(xs)

    diff = statistics.fmean(acc[a]) - statistics.fmean(acc[b])
    noise = 2 * math.sqrt(var_of_mean(acc[a]) + var_of_mean(acc[b]))
    return {a: statistics.fmean(acc[a]), b: statistics.fmean(acc[b]), "difference": diff,
            "two_standard_errors": noise, "equal_within_noise": abs(diff) <= noise}


def time_to_accuracy(runs: list[dict], a: str = "async", b: str = "sync") -> dict | None:
    """RL time each run needs to first reach the accuracy both modes reach: the target is the lower of the
    two modes' mean final accuracies (fixed by the data, not chosen), each run's time is that of its first
    evaluation at or above it (evaluations excluded from the time), and the ratio ``b``/``a`` of those times
    is paired per repeat as in :func:`paired_ratio`. This is AReaL's comparison: wall time to train to the
    same accuracy. Runs that never reach the target count as not reached (no time).

    Returns None without accuracy curves (``accuracy_every: 0``) or without both modes.
    """
    acc = {m: [r["final_accuracy"] for r in runs if r["mode"] == m] for m in (a, b)}
    if not acc[a] or not acc[b] or not all(len(r.get("accuracy_curve", [])) > 1 for r in runs if r["mode"] in (a, b)):
        return None
    target = min(statistics.fmean(acc[a]), statistics.fmean(acc[b]))

    curves = {m: mean_accuracy_curve([r for r in runs if r["mode"] == m]) for m in (a, b)}
    crossing = {m: first_crossing(curves[m], target) if curves[m] else None for m in (a, b)}
    times = {m: {r["repeat"]: first_crossing(r["accuracy_curve"], target, interpolate=False)
                 for r in runs if r["mode"] == m} for m in (a, b)}
    pairs = [times[b][k] / times[a][k] for k in sorted(times[a]) if times[a].get(k) and times[b].get(k)]
    reached = {m: sum(v is not None for v in times[m].values()) for m in (a, b)}
    mean_t = {m: statistics.fmean([v for v in times[m].values() if v is not None]) if reached[m] else None
              for m in (a, b)}
    return {"target_accuracy": target, "seconds": {m: times[m] for m in (a, b)}, "runs_reached": reached,
            "mean_seconds": mean_t, "ratio": {**spread(pairs), "pairs": pairs} if pairs else None,
            "ratio_of_means": mean_t[b] / mean_t[a] if mean_t[a] and mean_t[b] else None,
            "mean_curve": curves, "mean_curve_seconds": crossing,
            "mean_curve_ratio": crossing[b] / crossing[a] if crossing[a] and crossing[b] else None}


def mean_accuracy_curve(runs: list[dict]) -> list[list[float]] | None:
    """Mean over ``runs`` (one mode, every seed) of their accuracy curves: ``[[step, mean RL seconds, mean
    accuracy], ...]`` at the evaluation steps all runs share; None when they share fewer than two. Averaging
    across seeds before asking "when is the target reached" keeps runs whose own final accuracy falls below
    the target in the comparison (the per-run times cannot).
    """
    if not runs:
        return None
    shared = set.intersection(*({c[0] for c in r["accuracy_curve"]} for r in runs))
    if len(shared) < 2:
        return None
    by_step = [{c[0]: c for c in r["accuracy_curve"]} for r in runs]
    return [[st, statistics.fmean(c[st][1] for c in by_step), statistics.fmean(c[st][2] for c in by_step)]
            for st in sorted(shared)]


def run_curve(timeline: dict, metrics: list[dict]) -> tuple[list[list], list[float], list[dict], dict[int, int]]:
    """What the staleness and algorithms benches read from one run: the held-out accuracy curve against RL seconds
    (``[[step, seconds, accuracy], ...]``, the warm start's accuracy at ``[0, 0.0, acc]``; a run's evaluations
    after its loop are not counted in the seconds), each step's duration (s), the run's RL lines of metrics.jsonl
    and the realised staleness histogram over them (``{staleness: samples}``).

    Args:
        timeline: the run's timeline.json (``steps``, ``marks.rl_start``). metrics: its metrics.jsonl lines.
    """
    steps = timeline["steps"]
    durations = step_durations(steps, timeline["marks"]["rl_start"])
    curve, t = [], 0.0
    warm_acc = next((m.get("accuracy") for m in metrics if m.get("phase") == "warm_start_end"), None)
    if warm_acc is not None:
        curve.append([0, 0.0, warm_acc])
    for s, dt in zip(steps, durations):
        t += dt
        if s.get("evaluated") and s.get("accuracy") is not None:
            curve.append([s["step"], round(t, 4), s["accuracy"]])
    rl = [m for m in metrics if m.get("phase") == "rl"]
    hist: dict[int, int] = {}
    for m in rl:
        for k, n in (m.get("staleness_hist") or {}).items():
            hist[int(k)] = hist.get(int(k), 0) + int(n)
    return curve, durations, rl, hist


def first_crossing(curve: list[list[float]], target: float, *, interpolate: bool = True) -> float | None:
    """RL seconds at which ``curve`` ([[step, seconds, accuracy], ...]) first reaches ``target``: linearly
    interpolated between the evaluation below and the first one at or above it, or (``interpolate=False``, and
    when the first evaluation is already there) that evaluation's own time. None when it never does."""
    prev = None
    for _, t, x in curve:
        if x >= target - 1e-12:
            if not interpolate or prev is None or prev[1] >= x:
                return t
            return prev[0] + (t - prev[0]) * (target - prev[1]) / (x - prev[1])
        prev = (t, x)
    return None


def overlap_ceiling(runs: list[dict], sync_mode: str = "sync") -> dict | None:
    """The most any overlap of generation and training could gain on this workload, from the sync runs' phases.

    A synchronous step is G + T + P: the trainer waits G for its batch (the servers load the last version,
    generate and score it), trains for T, publishes (saves) for P. Perfect overlap costs max(G, T + P) per
    step, so no asynchronous schedule on the same split of the hardware beats

        ceiling = (G + T + P) / max(G, T + P)       (2.0 only when G = T + P)

    Per sync run, from the mean step phases (``step_seconds``). Returns ``{"ceiling": spread,
    "phases_s": {"generate": G, "train": T, "publish": P} (means over the sync runs),
    "bound_by": "training" | "generation"}`` or None without sync runs.
    """
    rs = [r for r in runs if r["mode"] == sync_mode and r.get("step_seconds")]
    if not rs:
        return None
    ceil = []
    for r in rs:
        g, t, p = (r["step_seconds"][k] for k in ("wait_s", "train_s", "publish_s"))
        ceil.append((g + t + p) / max(g, t + p))
    g, t, p = mean_phases(rs, "step_seconds")
    return {"ceiling": spread(ceil), "phases_s": {"generate": g, "train": t, "publish": p},
            "bound_by": "training" if t + p >= g else "generation"}


def mean_phases(runs: list[dict], key: str) -> tuple[float, float, float]:
    """Mean (wait, train, publish) seconds per step over ``runs``, from each run's ``key`` (``step_seconds`` or
    ``steady_step_seconds``)."""
    return tuple(statistics.fmean(r[key][k] for r in runs) for k in ("wait_s", "train_s", "publish_s"))


def steady_steps(steps: list[dict], rl_start: float) -> list[tuple[dict, float]]:
    """The steady-state steps of a run with their durations: every step but the first (which fills the pipeline:
    an asynchronous run's first batch costs a whole generation) and those right after a held-out evaluation
    in the loop (whose batch was (partly) generated during the evaluation; none when evaluations are deferred).
    Durations are end to end, as :func:`step_durations`."""
    if not steps:
        return []
    dur = step_durations(steps, rl_start)
    post = after_eval(steps)
    return [(s, d) for i, (s, d, p) in enumerate(zip(steps, dur, post)) if i > 0 and not p]


def steady_state(runs: list[dict], sync_mode: str = "sync", async_modes: tuple[str, ...] = ("async",
                 "async_noninterruptible", "async_in_place")) -> dict | None:
    """The overlap ceiling and the async/sync ratio of step times in steady state (:func:`steady_steps`): the
    figures a long run converges to, without the pipeline fill and evaluation effects that a 40-step benchmark
    run carries. Returns ``{"ceiling", "phases_s", "<mode>_over_sync": paired ratio of steady step times,
    "<mode>_fraction_of_ceiling"}`` or None without runs that carry steady figures (results of older versions).

    ``ceiling`` is the overlap ceiling (G + T + P) / max(G, T + P); where the sync runs have straggler figures
    (:func:`decompose_ratio`) also ``ceiling_with_stragglers`` = (G + T + P) / max(G - S, T + P) with their mean
    straggler seconds S per step, and ``<mode>_fraction_of_ceiling_with_stragglers``: with long-tailed lengths
    an asynchronous pipeline also stops waiting for the longest samples, so the plain overlap ceiling understates
    what it can reach (fractions above 1).

    ``<mode>_gap_s`` splits the asynchronous step's phases (wait + train + publish; the end-to-end step adds ~1 ms
    of the loop's own) above the ceiling's step ``max(G_full, T + P)`` (``G_full`` = G - S with straggler figures,
    else G) into seconds per step (means over the mode's runs); a generation-bound pipeline hides a longer training
    phase behind generation, and it is counted all the same:
    ``train_slowdown`` (its training phase minus the sync runs' T, which train with the rollout side idle: beside
    a busy one the trainer's process also handles the batches arriving during its step, and the cores share caches
    and memory bandwidth, 3-6% of a step here: ``benchmarks/core_contention.py``), ``publish`` (its publish phase
    minus P) and ``wait`` (the trainer waiting for a batch beyond the ``max(0, G_full - T - P)`` a
    generation-bound pipeline must wait: the pipeline fill of the first steps, a generator slower than in the
    sync runs). ``<mode>_ceiling_under_contention`` = (G + T + P) /
    max(G_full, T' + P') with the mode's own T' and P': the ceiling once the trainer's slowdown is granted, and
    ``<mode>_fraction_of_ceiling_under_contention`` the mode's ratio over it; only slowdowns are granted (T' and P'
    below T and P count as T and P), so it is never below ``<mode>_fraction_of_ceiling``.

    ``drift`` is :func:`machine_drift` of the sync runs, and ``steady`` False when it dominates: the steady-state
    figures are then not a steady state of this workload but of a machine whose speed moved during the bench."""
    rs = [r for r in runs if r["mode"] == sync_mode and r.get("steady_step_seconds")]
    if not rs:
        return None
    g, t, p = mean_phases(rs, "steady_step_seconds")
    ceiling = (g + t + p) / max(g, t + p, 1e-12)
    drift = machine_drift(runs, sync_mode)
    out: dict[str, Any] = {"ceiling": ceiling, "phases_s": {"generate": g, "train": t, "publish": p},
                           "sync_step_s": statistics.fmean(r["steady_step_s"] for r in rs),
                           "drift": drift, "steady": not (drift and drift["dominates"])}
    strag = [r["straggler"]["straggler_s"] for r in rs if r.get("straggler")]
    full, g_full = None, g
    if len(strag) == len(rs):
        s_ = statistics.fmean(strag)
        g_full = g - s_
        full = (g + t + p) / max(g_full, t + p, 1e-12)
        out["phases_s"]["straggler"] = s_
        out["ceiling_with_stragglers"] = full
    for mode in async_modes:
        ratio = paired_ratio([r for r in runs if r.get("steady_step_s")], sync_mode, mode, "steady_step_s")
        if ratio:
            out[f"{mode}_over_sync"] = ratio
            out[f"{mode}_fraction_of_ceiling"] = ratio["mean"] / ceiling
            if full:
                out[f"{mode}_fraction_of_ceiling_with_stragglers"] = ratio["mean"] / full
        ra = [r for r in runs if r["mode"] == mode and r.get("steady_step_seconds")]
        if ra:
            w, t_a, p_a = mean_phases(ra, "steady_step_seconds")
            out[f"{mode}_gap_s"] = {"train_slowdown": t_a - t, "publish": p_a - p,
                                    "wait": w - max(0.0, g_full - t - p)}
            # only slowdowns are granted: a training or publish phase that came out shorter than the sync runs'
            # (by the machine's drift) leaves the ceiling as it is
            under = (g + t + p) / max(g_full, max(t_a, t) + max(p_a, p), 1e-12)
            out[f"{mode}_ceiling_under_contention"] = under
            if ratio:
                out[f"{mode}_fraction_of_ceiling_under_contention"] = ratio["mean"] / under
    return out


#: The most the sync runs' training phase T may vary within one bench (``(max - min) / median``) for its
#: steady-state figures to be called steady: beyond it the machine's drift, not the schedule, moves the ratios.
DRIFT_THRESHOLD = 0.10


def machine_drift(runs: list[dict], sync_mode: str = "sync", threshold: float = DRIFT_THRESHOLD) -> dict | None:
    """How much the machine's speed moved during one bench, read off the sync runs' training phase T.

    Every sync run trains the same batches of the same size with the rollout side idle, so its mean T (steady
    steps, else all steps; seconds per step) measures the trainer core's speed at that time:
    ``spread = (max T - min T) / median T`` over the bench's sync runs, ``dominates = spread > threshold``.

    Returns ``{"sync_train_s": [T per sync run, in run order], "min", "max", "median", "spread", "threshold",
    "dominates"}``, or None with fewer than two sync runs (one run shows no drift between runs).
    """
    ts = [(r.get("steady_step_seconds") or r["step_seconds"])["train_s"] for r in runs
          if r["mode"] == sync_mode and (r.get("steady_step_seconds") or r.get("step_seconds"))]
    if len(ts) < 2:
        return None
    med = statistics.median(ts)
    spread_ = (max(ts) - min(ts)) / med if med > 0 else 0.0
    return {"sync_train_s": ts, "min": min(ts), "max": max(ts), "median": med, "spread": spread_,
            "threshold": threshold, "dominates": spread_ > threshold}


def headline(runs: list[dict], ceiling: dict | None, sync_mode: str = "sync",
             async_modes: tuple[str, ...] = ("async", "async_noninterruptible", "async_in_place")) -> dict | None:
    """The figure a bench leads with: per asynchronous mode, async/sync effective training throughput paired
    per repeat (:func:`paired_ratio`; whole RL loop, pipeline fill included), as the median over the pairs with
    their range, and that median's fraction of the overlap ceiling (:func:`overlap_ceiling`, whole-run sync
    phases; the mean of the sync runs' ceilings).

    A throughput ratio counts at equal accuracy only: ``accuracy`` is the mode's :func:`accuracy_comparison` with
    the sync runs (difference of mean final accuracies, two standard errors, equal within them).

    Returns ``{mode: {"median", "min", "max", "n", "pairs", "fraction_of_ceiling", "accuracy"}, "ceiling": float}``
    for the modes that ran, or None without sync runs or a ceiling.
    """
    if not ceiling:
        return None
    out: dict[str, Any] = {"ceiling": ceiling["ceiling"]["mean"]}
    for mode in async_modes:
        ratio = paired_ratio(runs, mode, sync_mode)
        if ratio:
            med = statistics.median(ratio["pairs"])
            out[mode] = {"median": med, "min": ratio["min"], "max": ratio["max"], "n": ratio["n"],
                         "pairs": ratio["pairs"], "fraction_of_ceiling": med / out["ceiling"]}
            acc = accuracy_comparison(runs, mode, sync_mode) if all("final_accuracy" in r and "eval_n_prompts" in r
                                                                   for r in runs) else None
            if acc:
                out[mode]["accuracy"] = {"difference": acc["difference"], "two_standard_errors":
                                         acc["two_standard_errors"], "equal_within_noise": acc["equal_within_noise"]}
    return out if len(out) > 1 else None


def decompose_ratio(runs: list[dict], sync_mode: str = "sync", async_mode: str = "async") -> dict | None:
    """Split the async/sync ratio into an overlap term and a straggler term, from the sync runs' step phases and
    their measured timelines (:func:`sync_stragglers`).

    A synchronous step costs ``G + T + P``: wait for the batch ``G`` (load the new weights, generate, score),
    train ``T``, publish ``P``. Of ``G``, ``S`` is straggler time (the batch's longest samples running on with the
    server under-occupied; :func:`batch_straggler`) and ``G_full = G - S`` what the batch costs at full
    occupancy. An asynchronous pipeline keeps the servers full and overlaps the two sides, so at best a step
    costs ``max(G_full, T + P)``:

        overlap   = (G_full + T + P) / max(G_full, T + P)      hiding training behind generation (<= 2)
        straggler = (G + T + P) / (G_full + T + P)             no waiting for the longest samples
        ceiling   = overlap * straggler = (G + T + P) / max(G_full, T + P)

    ``measured`` compares it with the async/sync ratio of step rates (``step_rate``: sync step time / async step
    time, both RL seconds per step) and of effective throughput (``effective``: tokens consumed per second; it
    differs from the step-rate ratio by the ratio of tokens per step, i.e. when async batches hold shorter or
    longer samples than sync ones). Returns None without sync runs that have straggler figures.
    """
    rs = [r for r in runs if r["mode"] == sync_mode and r.get("straggler") and r.get("step_seconds")]
    if not rs:
        return None
    g, t, p = mean_phases(rs, "step_seconds")
    st = statistics.fmean(r["straggler"]["straggler_s"] for r in rs)
    g_full = max(g - st, 0.0)
    overlap = (g_full + t + p) / max(g_full, t + p)
    straggler = (g + t + p) / (g_full + t + p)
    out: dict[str, Any] = {
        "phases_s": {"generate": g, "straggler": st, "generate_full_occupancy": g_full, "train": t, "publish": p},
        "batch": {k: statistics.fmean(r["straggler"][k] for r in rs)
                  for k in ("requests", "span_s", "full_occupancy_s", "straggler_s")},
        "overlap": overlap, "straggler": straggler, "ceiling": overlap * straggler,
        "bound_by": "training" if t + p >= g_full else "generation",
    }
    ra = [r for r in runs if r["mode"] == async_mode]
    if ra:
        step_rate = paired_ratio(runs, sync_mode, async_mode, "step_s_mean")
        eff = paired_ratio(runs, async_mode, sync_mode)
        tok = paired_ratio(runs, async_mode, sync_mode, "tokens_per_step")
        out["measured"] = {"step_rate": step_rate["mean"] if step_rate else None,
                           "effective": eff["mean"] if eff else None,
                           "tokens_per_step": tok["mean"] if tok else None,
                           "async_step_s": statistics.fmean(r["step_s_mean"] for r in ra),
                           "sync_step_s": statistics.fmean(r["step_s_mean"] for r in rs)}
        if out["measured"]["step_rate"]:
            out["measured"]["step_rate_fraction_of_ceiling"] = out["measured"]["step_rate"] / out["ceiling"]
        if out["measured"]["effective"]:
            out["measured"]["effective_fraction_of_ceiling"] = out["measured"]["effective"] / out["ceiling"]
    return out


def aggregate_modes(runs: list[dict]) -> dict[str, dict]:
    """Per mode: spread of effective/generation throughput, idle fractions, accuracy; merged staleness."""
    out: dict[str, dict] = {}
    for mode in MODES:
        rs = [r for r in runs if r["mode"] == mode]
        if not rs:
            continue
        stale: dict[int, int] = {}
        for r in rs:
            for k, n in r["staleness"].items():
                stale[int(k)] = stale.get(int(k), 0) + n
        lanes = sorted({lane for r in rs for lane in r["idle"]})
        out[mode] = {
            "eta": rs[0]["eta"], "interruptible": rs[0]["interruptible"], "runs": len(rs),
            "effective_tokens_per_s": spread([r["effective_tokens_per_s"] for r in rs]),
            "effective_tokens_per_s_step_mean": spread([r["effective_tokens_per_s_step_mean"] for r in rs]),
            "generation_tokens_per_s": spread([r["generation_tokens_per_s"] for r in rs]),
            "idle": {lane: spread([r["idle"][lane] for r in rs if lane in r["idle"]]) for lane in lanes},
            "final_accuracy": spread([r["final_accuracy"] for r in rs]),
            "rl_seconds": spread([r["rl_seconds"] for r in rs]),
            "staleness": dict(sorted(stale.items())),
            "staleness_mean": sum(k * n for k, n in stale.items()) / max(sum(stale.values()), 1),
            "interruptions": spread([float(r["interruptions"]) for r in rs]),
        }
    return out


"""``areal bench throughput``: synchronous vs asynchronous RL measured side by side on this machine.

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

Runs: one shared supervised warm start (reported separately, excluded from throughput), then for each repeat
the modes sync (eta = ``eta_sync``), async (eta = ``eta_async``) and, optionally, async with
non-interruptible weight updates, in ABBA order (sync, async | async, sync | ...), so that a linear drift of
the machine's speed cancels in the ratios. Every run uses the same recipe + scenario overrides; only eta
(and the interruptible switch, and a scenario's ``sync_overrides`` for the sync runs) differ. The scenario pins
the trainer thread to one core and the rollout side (server, controller, reward workers) to the other.

Long-tailed generation (scenario ``throughput-tiny-longtail``): the ratio is split into an overlap term and a
straggler term (:func:`decompose_ratio`) from the sync runs' step phases and their servers' occupancy over time (the
client's ``request`` events: each ``/generate`` from submission to answer; :func:`sync_stragglers`), and drawn in
``decomposition.png``. Scenario keys for it: ``sync_overrides`` (the sync baseline is standard PPO, without the
proximal pass), ``impute_post_eval_steps`` (:func:`step_durations`) and ``target_async_over_sync``.

Also: the embedded server's continuous batching vs Hugging Face static ``generate`` on one variable-length
workload (:func:`compare_generation`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from areal_cli.errors import UserError
from areal_cli.typed_yaml import LineDict, read_yaml

SCHEMA = "areal.bench.throughput/1"
TARGETS = {"async_over_sync": 1.8, "continuous_over_static": 1.5}
MODES = ("sync", "async", "async_noninterruptible")

# The built-in scenario; benchmarks/scenarios/throughput-tiny-arith.yaml holds the same values with the
# reasons for each (a test keeps the two equal).
DEFAULT_SCENARIO: dict[str, Any] = {
    "name": "throughput-tiny-arith",
    "recipe": "tiny-arith",
    "steps": 40,
    "repeats": 4,
    "eta_sync": 0,
    "eta_async": 1,
    "compare_interruptible": True,
    "accuracy_every": 5,
    "seed_per_repeat": True,
    "cpus": {"trainer": "0", "server": "1", "controller": "1"},
    "overrides": {"success_rate_lb": 0.0, "success_rate_ub": 1.0, "batch_size": 48, "group_size": 3,
                  "rollout_process": True},
    "generate_compare": {"n_prompts": 32, "min_new_tokens": 16, "max_new_tokens": 256, "seed": 0,
                         "hf_per_prompt": True},
    "target_async_over_sync": 1.8,
    "sync_overrides": {},
    "impute_post_eval_steps": False,
}

_GEN_KEYS = {"n_prompts": int, "min_new_tokens": int, "max_new_tokens": int, "seed": int, "hf_per_prompt": bool}


@dataclass
class Scenario:
    """One throughput benchmark: the recipe, the overrides shared by every run, and the run plan.

    Attributes:
        steps: RL steps per run (every run trains exactly this many; no early stop).
        repeats: how many times each mode runs (interleaved, ABBA order).
        eta_sync, eta_async: ``max_head_offpolicyness`` of the two modes.
        compare_interruptible: also run async with non-interruptible weight updates.
        accuracy_every: held-out accuracy every this many steps (0: after the last step only); gives each
            run's accuracy curve against RL time and the time-to-equal-accuracy ratio.
        seed_per_repeat: repeat ``r`` runs every mode with ``seed = recipe seed + r`` (training problems and
            sampling), so the repeats sample the run-to-run spread of accuracy and each sync/async pair shares
            its seed; False: every run uses the recipe seed (repeats then differ only by timing).
        cpus: ``trainer`` / ``server`` / ``controller`` Linux cpu lists ("" = no pinning).
        overrides: recipe fields set for every run (and the warm start).
        generate_compare: workload of :func:`compare_generation`, or None to skip it.
        target_async_over_sync: the async/sync target of this workload (effective throughput at equal accuracy,
            and time to equal accuracy): 1.8 for tiny-arith, 2.5 for the long-tail scenario.
        sync_overrides: recipe fields set for the sync runs only, after ``overrides`` (e.g. ``recompute_proximal:
            false``: with eta = 0 every token of a batch comes from the policy being trained, so the proximal pass
            of decoupled PPO recomputes the behaviour logprobs; AReaL's synchronous baseline is standard PPO).
        impute_post_eval_steps: a step right after a held-out evaluation counts the mean step time of its run
            (:func:`step_durations`): the rollout side keeps generating during an evaluation, which otherwise
            gives a sync run one batch per evaluation for free.
    """

    name: str
    recipe: str
    steps: int
    repeats: int
    eta_sync: int
    eta_async: int
    compare_interruptible: bool
    accuracy_every: int
    seed_per_repeat: bool
    cpus: dict[str, str]
    overrides: dict[str, Any]
    generate_compare: dict[str, Any] | None
    target_async_over_sync: float = 1.8
    sync_overrides: dict[str, Any] = field(default_factory=dict)
    impute_post_eval_steps: bool = False
    source: str = "built-in"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _scenario_from_dict(data: Any, where: Callable[[str], str]) -> Scenario:
    """Validate a scenario mapping; ``where(key)`` names the location of ``key`` for error messages."""
    if not isinstance(data, dict):
        raise UserError(f"{where('')}: a scenario must be a mapping")
    known = {f.name for f in dataclasses.fields(Scenario)} - {"source"}
    for k in data:
        if k not in known:
            raise UserError(f"{where(k)}: field '{k}': unknown key (known: {', '.join(sorted(known))})")
    merged = {**DEFAULT_SCENARIO, **data}

    def need(key: str, typ: type, ok: Callable[[Any], bool] = lambda v: True, why: str = "") -> Any:
        v = merged[key]
        if typ is int and isinstance(v, bool) or not isinstance(v, typ) or not ok(v):
            raise UserError(f"{where(key)}: field '{key}': expected {why or typ.__name__}, got {v!r}")
        return v

    name = need("name", str)
    recipe = need("recipe", str, lambda v: bool(v), "a recipe name or path")
    steps = need("steps", int, lambda v: v >= 1, "an int >= 1")
    repeats = need("repeats", int, lambda v: v >= 1, "an int >= 1")
    eta_sync = need("eta_sync", int, lambda v: v >= 0, "an int >= 0")
    eta_async = need("eta_async", int, lambda v: v >= 1, "an int >= 1")
    compare = need("compare_interruptible", bool)
    acc_every = need("accuracy_every", int, lambda v: v >= 0, "an int >= 0")
    seed_per_repeat = need("seed_per_repeat", bool)
    cpus = need("cpus", dict)
    for k, v in cpus.items():
        if k not in ("trainer", "server", "controller") or not isinstance(v, (str, int)) or isinstance(v, bool):
            raise UserError(f"{where('cpus')}: field 'cpus': keys trainer/server/controller with cpu lists, "
                            f"got {k}: {v!r}")
    cpus = {k: str(cpus.get(k, "")) for k in ("trainer", "server", "controller")}
    overrides = need("overrides", dict)
    gen = merged["generate_compare"]
    if gen is False or gen is None:
        gen = None
    else:
        if not isinstance(gen, dict):
            raise UserError(f"{where('generate_compare')}: field 'generate_compare': a mapping or false")
        gen = {**DEFAULT_SCENARIO["generate_compare"], **gen}
        for k, v in gen.items():
            typ = _GEN_KEYS.get(k)
            if typ is None or not isinstance(v, typ) or (typ is int and (isinstance(v, bool) or v < (k != "seed"))):
                raise UserError(f"{where('generate_compare')}: field 'generate_compare.{k}': bad value {v!r}")
        if gen["min_new_tokens"] > gen["max_new_tokens"]:
            raise UserError(f"{where('generate_compare')}: field 'generate_compare': min_new_tokens > max_new_tokens")
    target = merged["target_async_over_sync"]
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not target > 0:
        raise UserError(f"{where('target_async_over_sync')}: field 'target_async_over_sync': expected a number > 0, "
                        f"got {target!r}")
    sync_overrides = need("sync_overrides", dict)
    impute = need("impute_post_eval_steps", bool)
    return Scenario(name, recipe, steps, repeats, eta_sync, eta_async, compare, acc_every, seed_per_repeat, cpus,
                    dict(overrides), gen, float(target), dict(sync_overrides), impute)


def resolve_scenario_path(path: str | Path) -> Path:
    """``path`` itself when it exists; else a bare name (``throughput-tiny-longtail``) is looked up as
    ``NAME.yaml`` in the shipped scenarios (``benchmarks/scenarios/``, or ``$AREAL_SCENARIOS_DIR``)."""
    p = Path(path)
    if p.exists() or len(p.parts) != 1:
        return p
    from areal_cli.bench.simulate import scenarios_dir

    named = scenarios_dir() / (p.name if p.suffix == ".yaml" else f"{p.name}.yaml")
    return named if named.is_file() else p


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario YAML (keys of :class:`Scenario`; missing keys take the built-in values). A bare name
    is looked up in the shipped scenarios (:func:`resolve_scenario_path`).

    Raises:
        UserError: unreadable file, invalid YAML, unknown key or bad value (``file:line: field 'x': ...``).
    """
    p = resolve_scenario_path(path)
    data = read_yaml(p, "scenario")
    lines = dict(data.lines) if isinstance(data, LineDict) else {}
    sc = _scenario_from_dict(data if data is not None else {}, lambda k: f"{p}:{lines.get(k, 1)}")
    sc.source = str(p)
    return sc


def default_scenario(recipe: str | None = None) -> Scenario:
    """The built-in scenario (tiny-arith), optionally for another ``recipe``."""
    sc = _scenario_from_dict(json.loads(json.dumps(DEFAULT_SCENARIO)), lambda k: "built-in scenario")
    if recipe:
        sc.recipe = recipe
    return sc


# ----------------------------------------------------------------------------------------------------------
# Pure accounting on a run's timeline (timeline.json of run_training)
# ----------------------------------------------------------------------------------------------------------


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of ``[start, end)`` intervals as sorted, disjoint intervals (empty ones dropped)."""
    out: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def covered_seconds(intervals: Iterable[tuple[float, float]], window: tuple[float, float]) -> float:
    """Seconds of ``window`` covered by the union of ``intervals``."""
    w0, w1 = window
    return sum(max(0.0, min(b, w1) - max(a, w0)) for a, b in merge_intervals(intervals))


def activity(timeline: dict, window: tuple[float, float] | None = None) -> dict[str, dict[str, float]]:
    """Fraction of the window each lane spends in each kind of activity, plus ``idle``.

    Args:
        timeline: ``{"events": [{"lane", "kind", "start", "end"}], "marks": {"rl_start", "rl_end"}}``.
        window: ``(start, end)`` in the timeline's clock; default the RL window.
    Returns:
        ``{lane: {kind: fraction, ..., "idle": fraction}}``. Trainer idle = not train/publish/eval (it waits
        for a batch); server idle = neither generating nor updating weights. Fractions of one lane's kinds
        can overlap (e.g. a server generating while an update drains it), so they need not sum to 1.
    Raises:
        ValueError: an empty window.
    """
    w = window or (timeline["marks"]["rl_start"], timeline["marks"]["rl_end"])
    span = w[1] - w[0]
    if span <= 0:
        raise ValueError(f"empty window {w}")
    by_lane: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for e in timeline["events"]:
        if e["kind"] == "request":  # single requests (occupancy), not a worker's activity
            continue
        by_lane.setdefault(e["lane"], {}).setdefault(e["kind"], []).append((e["start"], e["end"]))
    out: dict[str, dict[str, float]] = {}
    for lane, kinds in sorted(by_lane.items()):
        fr = {k: covered_seconds(iv, w) / span for k, iv in sorted(kinds.items())}
        busy_kinds = ("train", "publish", "eval") if lane == "trainer" else ("generate", "update")
        busy = [iv for k in busy_kinds for iv in kinds.get(k, [])]
        fr["idle"] = 1.0 - covered_seconds(busy, w) / span
        out[lane] = fr
    return out


def after_eval(steps: list[dict]) -> list[bool]:
    """For each step: whether the step before it ended with a held-out evaluation."""
    return [i > 0 and bool(steps[i - 1].get("evaluated")) for i in range(len(steps))]


def step_durations(steps: list[dict], rl_start: float, *, impute_after_eval: bool = False) -> list[float]:
    """RL seconds of each step: from the previous step's end (or ``rl_start``) to its own, the time of an
    evaluation after step i (``eval_s`` of a step with ``evaluated``) left out of step i+1's time.

    ``impute_after_eval``: a step right after an evaluation gets instead the mean duration of the run's other
    steps (the first step excluded, it carries start-up costs), when there are such steps. The rollout side keeps
    generating during an evaluation, so that step finds its batch (partly) generated: a synchronous run generates
    the whole next batch there, and its step then costs T + P instead of G + T + P, which would credit the
    evaluation's time to the synchronous mode.

    Raises:
        ValueError: no steps, or step times that are not increasing.
    """
    if not steps:
        raise ValueError("no RL steps")
    prev, skip, out = rl_start, 0.0, []
    for s in steps:
        dt = s["end"] - prev - skip
        if dt <= 0:
            raise ValueError(f"step {s.get('step')}: end {s['end']} is not after {prev} (+{skip:.3f} s of eval)")
        out.append(dt)
        prev, skip = s["end"], (s.get("eval_s", 0.0) if s.get("evaluated") else 0.0)
    if impute_after_eval:
        post = after_eval(steps)
        normal = [d for i, (d, p) in enumerate(zip(out, post)) if i > 0 and not p]
        if normal:
            mean = statistics.fmean(normal)
            out = [mean if p else d for d, p in zip(out, post)]
    return out


def effective_throughput(steps: list[dict], rl_start: float, *, impute_after_eval: bool = False) -> dict[str, float]:
    """Effective training throughput of one run (AReaL: tokens used by each step / time of the step).

    Held-out evaluations are bookkeeping, not training: the time of an evaluation after step i
    (``eval_s`` of a step with ``evaluated``) is left out of step i+1's time (:func:`step_durations`, also for
    ``impute_after_eval``).

    Args:
        steps: step records ``{"tokens", "end", ...}`` in order (``end``: new version published, before any
            evaluation).
        rl_start: time the RL phase started (the first step's time runs from here).
    Returns:
        ``{"tokens", "seconds", "tokens_per_s", "step_mean_tokens_per_s", "steps"}``; ``tokens_per_s`` is
        the sum of step tokens over the sum of step times, the other the mean of per-step ratios.
    Raises:
        ValueError: no steps, or step times that are not increasing.
    """
    durations = step_durations(steps, rl_start, impute_after_eval=impute_after_eval)
    per_step = [s["tokens"] / dt for s, dt in zip(steps, durations)]
    tokens = sum(s["tokens"] for s in steps)
    seconds = sum(durations)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "step_mean_tokens_per_s": sum(per_step) / len(per_step), "steps": len(steps)}


def staleness_distribution(steps: list[dict]) -> dict[int, int]:
    """Trained samples by staleness (versions behind at their first token), summed over ``steps``."""
    out: dict[int, int] = {}
    for s in steps:
        for k, n in s["staleness"].items():
            out[int(k)] = out.get(int(k), 0) + int(n)
    return dict(sorted(out.items()))


def request_intervals(timeline: dict, window: tuple[float, float] | None = None, *,
                      exclude_eval: bool = True) -> list[tuple[float, float]]:
    """``(start, end)`` of every ``/generate`` request of the run (timeline events of kind ``request``, every
    server), sorted; with ``window``, only the requests that started inside it; ``exclude_eval``: not those that
    started during a held-out evaluation (the trainer's ``eval`` intervals: its requests are the evaluation's)."""
    out = [(e["start"], e["end"]) for e in timeline["events"] if e["kind"] == "request" and e["end"] >= e["start"]]
    if window is not None:
        out = [iv for iv in out if window[0] <= iv[0] <= window[1]]
    if exclude_eval:
        evals = merge_intervals((e["start"], e["end"]) for e in timeline["events"]
                                if e["lane"] == "trainer" and e["kind"] == "eval")
        if evals:
            out = [iv for iv in out if not any(a <= iv[0] < b for a, b in evals)]
    return sorted(out)


def occupancy_curve(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, int]]:
    """Requests in flight over time as a step function ``[(t, n), ...]``: ``n`` requests from ``t`` on (until the
    next point). A request ending when another starts is counted out first."""
    changes = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda c: (c[0], c[1]))
    out: list[tuple[float, int]] = []
    n = 0
    for t, d in changes:
        n += d
        if out and out[-1][0] == t:
            out[-1] = (t, n)
        else:
            out.append((t, n))
    return out


def mean_occupancy(intervals: list[tuple[float, float]], window: tuple[float, float]) -> float:
    """Time-weighted mean number of requests in flight over ``window`` (= summed request-seconds / window)."""
    span = window[1] - window[0]
    if span <= 0:
        raise ValueError(f"empty window {window}")
    return sum(max(0.0, min(b, window[1]) - max(a, window[0])) for a, b in intervals) / span


def batch_straggler(intervals: list[tuple[float, float]]) -> dict[str, float] | None:
    """The straggler time of ONE synchronous batch, from its requests (submitted together when its policy version
    was loaded; a request is one group of ``group_size`` samples).

    With ``N`` requests and ``n(t)`` of them in flight, the batch occupies the server from its first submission to
    its last answer (``span``); at full occupancy ``N`` the same request-seconds would take
    ``full = (1/N) * integral n(t) dt = mean request duration``; the rest is waiting for the longest samples:

        straggler = span - full = integral over the span of (1 - n(t)/N) dt

    which, when all requests start together, is (longest finish) - (mean finish): the time a sync step waits for
    its longest samples beyond the mean. Returns ``{"requests", "span_s", "full_occupancy_s", "straggler_s"}``, or
    None without requests.
    """
    if not intervals:
        return None
    n = len(intervals)
    span = max(b for _, b in intervals) - min(a for a, _ in intervals)
    full = sum(b - a for a, b in intervals) / n
    return {"requests": n, "span_s": span, "full_occupancy_s": full, "straggler_s": max(0.0, span - full)}


def sync_stragglers(timeline: dict) -> dict[str, Any] | None:
    """Straggler time per step of a SYNCHRONOUS run: each step's batch is the requests submitted while the trainer
    waited for it (``[start, start + wait_s]`` of the step record; with eta = 0 nothing generates otherwise).

    Returns ``{"steps", "requests_per_step", "span_s", "full_occupancy_s", "straggler_s"}`` (means over the
    steps that had requests; seconds per step) or None when the timeline holds no request events (older runs).
    """
    iv = request_intervals(timeline)
    if not iv:
        return None
    per = [b for b in (batch_straggler(request_intervals(timeline, (s["start"], s["start"] + s["wait_s"])))
                       for s in timeline["steps"]) if b is not None]
    if not per:
        return None
    return {"steps": len(per), **{k: statistics.fmean(b[k] for b in per)
                                   for k in ("requests", "span_s", "full_occupancy_s", "straggler_s")}}


def _cpu_use(timeline: dict) -> dict[str, float | None]:
    """CPU seconds per wall second of each process over the RL window (1.0 = one core all the time)."""
    c0, c1 = timeline["cpu"].get("rl_start", {}), timeline["cpu"].get("rl_end", {})
    span = c1.get("t", 0) - c0.get("t", 0)
    out: dict[str, float | None] = {}
    for k in c0:
        if k == "t":
            continue
        a, b = c0.get(k), c1.get(k)
        out[k] = (b - a) / span if (a is not None and b is not None and span > 0) else None
    return out


def summarize_run(timeline: dict, summary: dict, *, label: str, mode: str, repeat: int, eta: int,
                  interruptible: bool, eval_n_prompts: int, impute_after_eval: bool = False) -> dict:
    """One run's figures (a ``runs[]`` entry of results.json) from its timeline.json and summary.json.

    ``impute_after_eval``: step times of steps right after an evaluation are imputed (:func:`step_durations`), and
    those steps are left out of the mean step phases (``step_seconds``).
    """
    steps = timeline["steps"]
    rl_start = timeline["marks"]["rl_start"]
    eff = effective_throughput(steps, rl_start, impute_after_eval=impute_after_eval)
    generated = steps[-1].get("generated_tokens", 0)
    act = activity(timeline, (rl_start, steps[-1]["end"]))
    train_wall = sum(s["train_s"] for s in steps)
    curve, t = [], 0.0  # (step, RL seconds without evaluations, held-out accuracy) at each evaluation
    for s, dt in zip(steps, step_durations(steps, rl_start, impute_after_eval=impute_after_eval)):
        t += dt
        if s.get("evaluated"):
            curve.append([s["step"], round(t, 4), s["accuracy"]])
    phase_steps = steps
    if impute_after_eval:
        phase_steps = [s for s, p in zip(steps, after_eval(steps)) if not p] or steps
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
        "cpu_use": _cpu_use(timeline),
        "trainer_cpu_over_wall": sum(s["train_cpu_s"] for s in steps) / train_wall if train_wall > 0 else None,
        "step_seconds": {k: statistics.fmean(s[k] for s in phase_steps) for k in ("wait_s", "train_s", "publish_s")},
        "staleness": staleness_distribution(steps),
        "final_accuracy": summary["final_accuracy"], "eval_n_prompts": eval_n_prompts, "accuracy_curve": curve,
        "interruptions": summary["controller"]["interruptions"],
        "groups_dropped_filter": summary["controller"]["groups_dropped_filter"],
        "groups_dropped_stale": summary["controller"].get("groups_dropped_stale", 0),
        "impute_after_eval": impute_after_eval,
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
    g, t, p = (statistics.fmean(r["step_seconds"][k] for r in rs) for k in ("wait_s", "train_s", "publish_s"))
    return {"ceiling": spread(ceil), "phases_s": {"generate": g, "train": t, "publish": p},
            "bound_by": "training" if t + p >= g else "generation"}


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
    g, t, p = (statistics.fmean(r["step_seconds"][k] for r in rs) for k in ("wait_s", "train_s", "publish_s"))
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


def run_plan(scenario: Scenario) -> list[tuple[int, str]]:
    """``(repeat, mode)`` in execution order: ABBA interleaving (odd repeats reversed)."""
    modes = ["sync", "async"] + (["async_noninterruptible"] if scenario.compare_interruptible else [])
    plan = []
    for r in range(scenario.repeats):
        plan += [(r, m) for m in (modes if r % 2 == 0 else modes[::-1])]
    return plan


# ----------------------------------------------------------------------------------------------------------
# Machine description
# ----------------------------------------------------------------------------------------------------------


def machine_description() -> dict:
    """CPU model, core counts, load average, memory, Python/torch versions of this machine."""
    from areal_cli.manifest import cpu_model, memory_bytes

    cpu = cpu_model()
    mem = memory_bytes()
    mem_gib = round(mem / 2**30, 1) if mem is not None else None
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {
        "cpu": cpu, "cpu_count": os.cpu_count(),
        "cpus_usable": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "memory_gib": mem_gib, "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch_version,
    }


# ----------------------------------------------------------------------------------------------------------
# Continuous batching (embedded server) vs Hugging Face static generate
# ----------------------------------------------------------------------------------------------------------


def generation_workload(vocab_size: int, n_prompts: int, min_new_tokens: int, max_new_tokens: int,
                        seed: int) -> tuple[list[list[int]], list[int]]:
    """Deterministic variable-length workload: prompt i has 4 + (7i mod 37) random ids in [3, V) and a
    budget of ``min + (37 i mod (max - min + 1))`` new tokens (defaults: prompts 4-40, budgets 16-256)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab_size, (4 + (i * 7) % 37,), generator=g).tolist() for i in range(n_prompts)]
    budgets = [min_new_tokens + (i * 37) % (max_new_tokens - min_new_tokens + 1) for i in range(n_prompts)]
    return prompts, budgets


def compare_generation(model_dir: str | Path, *, n_prompts: int = 32, min_new_tokens: int = 16,
                       max_new_tokens: int = 256, seed: int = 0, hf_per_prompt: bool = True,
                       cpus: str = "") -> dict:
    """Embedded server (continuous batching, all prompts sent at once) vs HF ``generate`` on one workload.

    Greedy, ``ignore_eos``, one torch thread each; tokens/s = useful tokens (sum of budgets) / wall s. HF
    static batching: one left-padded batch decoded to the largest budget (the finished rows keep computing);
    ``hf_per_prompt`` also times HF one prompt at a time (each only as long as its budget) and checks that
    the server's greedy outputs equal HF's. ``cpus``: pin this process and the server to these cpus (both
    sides then run on the same core, one after the other).

    Returns:
        ``{"workload", "embedded_server", "hf_static_batch", "hf_per_prompt", "continuous_over_static",
        "greedy_identical"}`` with seconds and tokens/s for each side.
    Raises:
        RuntimeError: the server did not return exactly the budgeted number of tokens.
    """
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from areal_cli.config import parse_cpu_list
    from areal_cli.rollout.client import RolloutClient
    from areal_cli.rollout.protocol import SamplingParams
    from areal_cli.rollout.server import EmbeddedServer
    from areal_cli.processes import pin_process

    pin = parse_cpu_list(cpus)
    before = os.sched_getaffinity(0) if pin else None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if pin:
            pin_process(0, pin)
        hf_logging.disable_progress_bar()
        hf = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
        V = hf.config.vocab_size
        prompts, budgets = generation_workload(V, n_prompts, min_new_tokens, max_new_tokens, seed)
        useful = sum(budgets)
        with EmbeddedServer.launch(model_dir, num_threads=1, max_running_requests=max(64, n_prompts)) as srv:
            if pin:
                pin_process(srv.proc.pid, pin)

            async def run():
                c = RolloutClient([srv.url], vocab_size=V)
                try:
                    await c.generate(prompts[0], SamplingParams(4, temperature=0.0))  # warm-up
                    t = time.perf_counter()
                    outs = await asyncio.gather(*(
                        c.generate(p, SamplingParams(m, temperature=0.0, ignore_eos=True))
                        for p, m in zip(prompts, budgets)))
                    return outs, time.perf_counter() - t
                finally:
                    await c.aclose()

            outs, dt_srv = asyncio.run(run())
        if sum(len(o.output_ids) for o in outs) != useful:
            raise RuntimeError("the server did not generate exactly the budgeted tokens")

        hf.generation_config.eos_token_id = None  # = ignore_eos (min_new_tokens would MASK eos instead)
        pad = hf.config.pad_token_id if hf.config.pad_token_id is not None else 0
        L = max(map(len, prompts))
        ids = torch.full((n_prompts, L), pad)
        mask = torch.zeros(n_prompts, L, dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding; HF derives position_ids from the mask
            ids[i, L - len(p):] = torch.tensor(p)
            mask[i, L - len(p):] = 1
        with torch.no_grad():
            hf.generate(ids[:2], attention_mask=mask[:2], max_new_tokens=4, do_sample=False, pad_token_id=pad)
            t = time.perf_counter()
            hf.generate(ids, attention_mask=mask, max_new_tokens=max(budgets), do_sample=False, pad_token_id=pad)
            dt_hf = time.perf_counter() - t
            per_prompt = None
            if hf_per_prompt:
                t = time.perf_counter()
                seq = [hf.generate(torch.tensor([p]), max_new_tokens=m, do_sample=False,
                                   pad_token_id=pad)[0, len(p):].tolist() for p, m in zip(prompts, budgets)]
                dt_seq = time.perf_counter() - t
                per_prompt = {"seconds": dt_seq, "tokens_per_s": useful / dt_seq}
                same = sum(o.output_ids == s for o, s in zip(outs, seq))
    finally:
        torch.set_num_threads(threads)
        if before is not None:
            pin_process(0, frozenset(before))
    return {
        "workload": {"n_prompts": n_prompts, "prompt_lengths": [min(map(len, prompts)), max(map(len, prompts))],
                     "budgets": [min(budgets), max(budgets)], "useful_tokens": useful, "greedy": True,
                     "ignore_eos": True, "seed": seed, "torch_threads": 1, "cpus": cpus or None},
        "embedded_server": {"seconds": dt_srv, "tokens_per_s": useful / dt_srv},
        "hf_static_batch": {"seconds": dt_hf, "tokens_per_s": useful / dt_hf,
                            "computed_tokens_per_s": n_prompts * max(budgets) / dt_hf},
        "hf_per_prompt": per_prompt,
        "continuous_over_static": dt_hf / dt_srv,
        "greedy_identical": f"{same}/{n_prompts}" if per_prompt else None,
    }


# ----------------------------------------------------------------------------------------------------------
# The benchmark
# ----------------------------------------------------------------------------------------------------------


def _as_items(overrides: dict[str, Any]) -> list[str]:
    return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in overrides.items()]


def _run_cfg(scenario: Scenario, extra_overrides: list[str], items: list[str], *, sync: bool = False):
    from areal_cli.config import apply_overrides
    from areal_cli.recipes import load_train_config

    cfg, _ = load_train_config(scenario.recipe)
    ov = _as_items(scenario.overrides) + (_as_items(scenario.sync_overrides) if sync else [])
    return apply_overrides(cfg, ov + list(extra_overrides) + items)


@contextlib.contextmanager
def output_to(path: Path):
    """Send this process's stdout (the run's status lines and summary table) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f, contextlib.redirect_stdout(f):
        yield


def run_benchmark(scenario: Scenario, out: Path, *, extra_overrides: list[str] | None = None,
                  log: Callable[[str], None] = print) -> dict:
    """Run ``scenario`` into ``out``: warm start, interleaved runs, generate comparison, results.json, plots.

    Args:
        extra_overrides: ``key=value`` recipe overrides after the scenario's (e.g. from ``-o``).
        log: receives one line per finished phase.
    Returns:
        the results dict (also ``out/results.json``).
    Raises:
        UserError: ``out`` already holds results, bad recipe/overrides, unavailable cpus.
    """
    from areal_cli.atomic import write_json_atomic
    from areal_cli.bench.timeline_plot import (plot_accuracy_curves, plot_decomposition, plot_throughput_bars,
                                               plot_timelines)
    from areal_cli.train_loop import run_training

    extra = list(extra_overrides or [])
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: --out exists and is not a directory")
    if (out / "results.json").exists() or (out / "warm").exists():
        raise UserError(f"{out}: already holds a benchmark; choose another --out")
    cpu_items = [f"trainer_cpus={scenario.cpus['trainer']}", f"server_cpus={scenario.cpus['server']}",
                 f"controller_cpus={scenario.cpus['controller']}"]
    base_cfg = _run_cfg(scenario, extra, cpu_items)  # validates everything before any work
    _run_cfg(scenario, extra, cpu_items, sync=True)
    out.mkdir(parents=True, exist_ok=True)
    machine = {"start": machine_description()}
    t_bench = time.monotonic()

    # 1. one supervised warm start, shared by every run
    log(f"warm start ({scenario.recipe})")
    with output_to(out / "warm" / "console.log"):
        warm_summary = run_training(_run_cfg(scenario, extra, cpu_items + ["max_steps=0"]), out / "warm", live=False)
    weights = sorted((out / "warm" / "weights").glob("sft-step*"))
    if not weights:
        raise RuntimeError(f"the warm start left no weights in {out / 'warm' / 'weights'}")
    warm = {**warm_summary["warm_start"], "weights": str(weights[-1])}
    log(f"warm start: {warm['steps']} steps, {warm['seconds']:.1f} s, accuracy {warm['accuracy']:.3f}")

    # 2. interleaved runs
    runs: list[dict] = []
    timelines: dict[str, dict] = {}
    for i, (rep, mode) in enumerate(run_plan(scenario)):
        eta = scenario.eta_sync if mode == "sync" else scenario.eta_async
        interruptible = mode != "async_noninterruptible"
        label = f"{i:02d}-{mode}-r{rep}"
        seed = base_cfg.seed + (rep if scenario.seed_per_repeat else 0)
        items = cpu_items + [f"seed={seed}", f"model_path={weights[-1].resolve()}", "sft_max_steps=0",
                             f"max_steps={scenario.steps}", f"eval_every={scenario.accuracy_every or scenario.steps}",
                             "target_accuracy=0",
                             "time_limit_s=0", f"max_head_offpolicyness={eta}",
                             f"interruptible={'true' if interruptible else 'false'}"]
        cfg = _run_cfg(scenario, extra, items, sync=mode == "sync")
        run_dir = out / "runs" / label
        with output_to(out / "runs" / f"{label}.console.log"):
            summary = run_training(cfg, run_dir, live=False, record_timeline=True)
        tl = json.loads((run_dir / "timeline.json").read_text())
        r = summarize_run(tl, summary, label=label, mode=mode, repeat=rep, eta=eta, interruptible=interruptible,
                          eval_n_prompts=cfg.eval_n_prompts, impute_after_eval=scenario.impute_post_eval_steps)
        r["seed"], r["dir"] = seed, str(run_dir)
        runs.append(r)
        timelines.setdefault(mode, tl)  # the first run of each mode is plotted
        log(f"{label}: {r['effective_tokens_per_s']:.0f} tok/s effective, {r['step_s_mean']:.3f} s per step, "
            f"{r['rl_seconds']:.1f} s for "
            f"{r['steps']} steps, seed {seed}, accuracy {r['final_accuracy']:.3f}, idle trainer {r['idle'].get('trainer', 0):.2f} "
            f"server {r['idle'].get('server0', 0):.2f}")

    # 3. continuous batching vs static generate
    gen = None
    if scenario.generate_compare:
        log("continuous batching vs HF static generate")
        gen = compare_generation(weights[-1], cpus=scenario.cpus["server"], **scenario.generate_compare)
        log(f"embedded server {gen['embedded_server']['tokens_per_s']:.0f} tok/s vs HF static batch "
            f"{gen['hf_static_batch']['tokens_per_s']:.0f} tok/s: {gen['continuous_over_static']:.2f}x")

    machine["end"] = machine_description()
    results = build_results(scenario, runs, warm=warm, generate=gen, machine=machine, extra_overrides=extra,
                            recipe_config=base_cfg.to_dict(), seconds=time.monotonic() - t_bench)
    plot_timelines([(m, timelines[m]) for m in MODES if m in timelines], out / results["plots"]["timeline"])
    plot_throughput_bars(results, out / results["plots"]["throughput"])
    if results["plots"].get("accuracy"):
        plot_accuracy_curves(results, out / results["plots"]["accuracy"])
    if results["plots"].get("decomposition"):
        plot_decomposition(results, [(m, timelines[m]) for m in MODES if m in timelines],
                           out / results["plots"]["decomposition"])
    write_json_atomic(out / "results.json", results)
    return results


def build_results(scenario: Scenario, runs: list[dict], *, warm: dict, generate: dict | None, machine: dict,
                  extra_overrides: list[str], recipe_config: dict, seconds: float) -> dict:
    """The ``results.json`` document (schema :data:`SCHEMA`) from the per-run figures of :func:`summarize_run`.

    Top-level keys: schema, created, command, machine, scenario, extra_overrides, recipe_config, definitions,
    warm_start, runs, modes (:func:`aggregate_modes`), ratios (``async_over_sync``,
    ``async_over_sync_generation``, ``interruptible_over_noninterruptible``: :func:`paired_ratio` or None),
    accuracy (:func:`accuracy_comparison`), generate (:func:`compare_generation` or None), targets (with
    ``reached``), plots, bench_seconds.
    """
    ratios = {"async_over_sync": paired_ratio(runs, "async", "sync"),
              "async_over_sync_generation": paired_ratio(runs, "async", "sync", "generation_tokens_per_s"),
              "interruptible_over_noninterruptible": paired_ratio(runs, "async", "async_noninterruptible"),
              "interruptible_over_noninterruptible_generation": paired_ratio(runs, "async", "async_noninterruptible",
                                                                             "generation_tokens_per_s")}
    accuracy = accuracy_comparison(runs)
    tta = time_to_accuracy(runs)
    ceiling = overlap_ceiling(runs)
    if ceiling and ratios["async_over_sync"]:
        ceiling["async_over_sync_fraction_of_ceiling"] = ratios["async_over_sync"]["mean"] / ceiling["ceiling"]["mean"]
    target = getattr(scenario, "target_async_over_sync", TARGETS["async_over_sync"])
    reached = {
        "async_over_sync_time_to_equal_accuracy": bool(tta and tta["mean_curve_ratio"]
                                                       and tta["mean_curve_ratio"] >= target),
        "async_over_sync": bool(ratios["async_over_sync"] and ratios["async_over_sync"]["mean"] >= target
                                and accuracy and accuracy["equal_within_noise"]),
        "continuous_over_static": bool(generate and generate["continuous_over_static"] >= TARGETS["continuous_over_static"]),
    }
    argv = sys.argv[1:]
    return {
        "schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["areal", *argv]) if argv[:2] == ["bench", "throughput"] else None,
        "machine": machine, "scenario": scenario.to_dict(), "extra_overrides": list(extra_overrides),
        "recipe_config": dict(recipe_config),
        "definitions": {
            "effective_tokens_per_s": "prompt+response tokens of trained samples / RL seconds (warm start and "
                                      "held-out evaluations excluded)",
            "generation_tokens_per_s": "all tokens the servers generated / RL wall seconds",
            "idle": "fraction of the RL window: trainer waiting for a batch; server with nothing in flight and no update",
            "staleness": "trained samples by versions between their first token and the training step",
            "overlap_ceiling": "(G + T + P) / max(G, T + P) from the sync runs' mean step phases: wait for the "
                               "batch G, train T, publish P; the most any overlap could gain",
            "time_to_accuracy": "RL seconds (evaluations excluded) to first reach the lower of the two modes' mean "
                                "final accuracies; mean_curve_ratio = sync / async time of the seed-averaged curves "
                                "(interpolated between evaluations), ratio = per-run times paired per repeat",
            "decomposition": "sync step = G + T + P; S = straggler seconds of G (per sync batch: span of its "
                             "requests minus their mean duration = integral of (1 - n(t)/N) dt, n(t) requests in "
                             "flight of N); G_full = G - S; overlap = (G_full+T+P)/max(G_full,T+P); straggler = "
                             "(G+T+P)/(G_full+T+P); ceiling = overlap x straggler; measured.step_rate = sync/async "
                             "RL seconds per step, measured.effective = async/sync effective throughput",
        },
        "warm_start": warm, "runs": runs, "modes": aggregate_modes(runs), "ratios": ratios, "accuracy": accuracy,
        "time_to_accuracy": tta, "overlap_ceiling": ceiling, "decomposition": decompose_ratio(runs),
        "generate": generate, "targets": {**TARGETS, "async_over_sync": target, "reached": reached},
        "plots": {"timeline": "timeline.png", "throughput": "throughput.png",
                  **({"accuracy": "accuracy.png"} if any(r.get("accuracy_curve") for r in runs) else {}),
                  **({"decomposition": "decomposition.png"} if any(r.get("occupancy") for r in runs) else {})},
        "bench_seconds": seconds,
    }


def results_table(results: dict):
    """A rich Table of the results (modes as columns, ratio last)."""
    from rich.table import Table

    modes = results["modes"]
    cols = [m for m in MODES if m in modes]
    t = Table(title=f"areal bench throughput: {results['scenario']['name']} "
                    f"({results['scenario']['steps']} RL steps x {results['scenario']['repeats']} repeats)")
    t.add_column("metric", style="cyan")
    names = {"sync": f"sync (eta={results['scenario']['eta_sync']})",
             "async": f"async (eta={results['scenario']['eta_async']})",
             "async_noninterruptible": "async, non-interruptible"}
    for m in cols:
        t.add_column(names[m], justify="right")
    t.add_column("async / sync", justify="right", style="bold")

    def ms(d: dict, fmt: str = "{:.0f}") -> str:
        return (fmt + " ± " + fmt).format(d["mean"], d["std"]) if d["n"] > 1 else fmt.format(d["mean"])

    r = results["ratios"]["async_over_sync"]
    rg = results["ratios"]["async_over_sync_generation"]
    t.add_row("effective training throughput (tok/s)", *[ms(modes[m]["effective_tokens_per_s"]) for m in cols],
              f"{r['mean']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]" if r else "-")
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
    g = results.get("generate")
    if g:
        t.add_row(f"continuous batching vs HF static generate: {g['embedded_server']['tokens_per_s']:.0f} vs "
                  f"{g['hf_static_batch']['tokens_per_s']:.0f} tok/s", *["" for _ in cols],
                  f"{g['continuous_over_static']:.2f}x")
    load = results["machine"]["start"]["load_average"]
    t.caption = (f"{results['machine']['start']['cpu']}, {results['machine']['start']['cpu_count']} cpus, load "
                 f"{load} at start; targets: async/sync >= {results['targets']['async_over_sync']}x at equal accuracy "
                 f"({'reached' if results['targets']['reached']['async_over_sync'] else 'not reached'}; in time "
                 f"to equal accuracy: {'reached' if results['targets']['reached'].get('async_over_sync_time_to_equal_accuracy') else 'not reached'}), "
                 f"continuous/static >= {TARGETS['continuous_over_static']}x "
                 f"({'not measured' if not results.get('generate') else 'reached' if results['targets']['reached']['continuous_over_static'] else 'not reached'})")
    return t

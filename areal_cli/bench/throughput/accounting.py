"""Pure accounting on a run's timeline (``timeline.json`` of :func:`areal_cli.train_loop.run_training`).

Busy and idle seconds per lane, step durations and effective throughput, the staleness distribution, and the
servers' occupancy over time with the straggler seconds of each synchronous batch. No I/O.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable


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
    """For each step: whether the step before it ended with a held-out evaluation in the loop (not deferred)."""
    return [i > 0 and bool(steps[i - 1].get("evaluated")) and not steps[i - 1].get("eval_deferred")
            for i in range(len(steps))]


def step_durations(steps: list[dict], rl_start: float) -> list[float]:
    """RL seconds of each step: from the previous step's end (or ``rl_start``) to its own, the time of an
    evaluation in the loop after step i (``eval_s`` of a step with ``evaluated``, not ``eval_deferred``) left out
    of step i+1's time. (The benchmarks defer evaluations to after the loop, ``loop.eval_deferred``: the rollout
    side keeps generating during an evaluation in the loop, so the steps after it find batches generated in
    advance, up to eta of them, and leaving the evaluation's time out does not undo that.)

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
        prev, skip = s["end"], (s.get("eval_s", 0.0) if s.get("evaluated") and not s.get("eval_deferred") else 0.0)
    return out


def effective_throughput(steps: list[dict], rl_start: float) -> dict[str, float]:
    """Effective training throughput of one run (AReaL: tokens used by each step / time of the step).

    Held-out evaluations are bookkeeping, not training: the time of an evaluation after step i
    (``eval_s`` of a step with ``evaluated``) is left out of step i+1's time (:func:`step_durations`).

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
    durations = step_durations(steps, rl_start)
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
    was loaded; a request is one group of ``rollout.group_size`` samples).

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


def cpu_use(timeline: dict) -> dict[str, float | None]:
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


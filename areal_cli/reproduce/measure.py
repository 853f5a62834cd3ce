"""Measured figures of a reproduction, in each expected entry's unit: from a CPU training run (summary.json,
metrics.jsonl) or from one ``areal eval`` result, with the reason for every figure that was not measured.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from areal_cli.recipes import TRAINING_BENCHMARKS, TRAINING_FIGURES, Check, ExpectedMetric, Measured


#: Metrics of a CPU training run (``benchmark`` = the run's training benchmark, e.g. ``tiny-arith``), from its
#: summary.json and metrics.jsonl: what :func:`measured_from_training` can measure.
TRAINING_METRICS = {
    "max_accuracy": "the best held-out accuracy over the run's evaluations",
    "final_accuracy": "held-out accuracy at the last step",
    "reward_ok_fraction": "reward calls that returned a score (not error / timeout), of all calls",
    "rewarded_fraction": "trained samples with reward > 0, mean over RL steps",
    "final_version": "policy versions published (RL steps)",
    "steps_with_gradient": "RL steps whose gradient norm was > 0 (a loss that moved the weights)",
    "evaluations": "in-loop held-out evaluations (after the warm start and during RL)",
}


def _training_value(metric: str, summary: dict, rows: list[dict]) -> float | None:
    rl = [r for r in rows if r.get("phase") == "rl"]
    accs = [r["accuracy"] for r in rows if isinstance(r.get("accuracy"), (int, float))]
    if metric == "max_accuracy":
        return summary.get("max_accuracy", summary.get("best_accuracy", max(accs) if accs else None))
    if metric == "final_accuracy":
        return summary.get("final_accuracy")
    if metric == "reward_ok_fraction":
        c = summary.get("controller") or {}
        calls = sum(int(c.get(k, 0)) for k in ("reward_ok", "reward_error", "reward_timeout"))
        return c.get("reward_ok", 0) / calls if calls else None
    if metric == "rewarded_fraction":
        vals = [r["reward_positive_frac"] for r in rl if isinstance(r.get("reward_positive_frac"), (int, float))]
        return sum(vals) / len(vals) if vals else None
    if metric == "final_version":
        return summary.get("final_version")
    if metric == "steps_with_gradient":
        return float(sum(1 for r in rl if float(r.get("grad_norm") or 0.0) > 0.0)) if rl else None
    if metric == "evaluations":
        return float(sum(1 for r in rows if r.get("evaluated", r.get("phase") == "warm_start_end")))
    return None


def measured_from_training(entries: list[ExpectedMetric], summary: dict, rows: list[dict],
                           n_problems: int) -> tuple[dict[str, Measured], dict[str, str]]:
    """Figures of a CPU training run for ``entries``: the :data:`TRAINING_METRICS` of its training benchmark
    (summary.json, metrics.jsonl) and ``training/wall_clock_hours``.

    Returns:
        (key -> Measured, key -> why it was not measured).
    """
    measured: dict[str, Measured] = {}
    why: dict[str, str] = {}
    for m in entries:
        if m.benchmark in TRAINING_BENCHMARKS and m.metric in TRAINING_METRICS:
            value = _training_value(m.metric, summary, rows)
        elif m.benchmark == TRAINING_FIGURES and m.metric == "wall_clock_hours":
            value = summary["elapsed_s"] / 3600 if "elapsed_s" in summary else None
        else:
            why[m.key] = f"a CPU training run does not measure {m.benchmark}/{m.metric}"
            continue
        if value is None:
            why[m.key] = "the run recorded no value"
            continue
        accuracy = m.metric in ("max_accuracy", "final_accuracy")
        measured[m.key] = Measured(float(value), n_problems=n_problems if accuracy else None, n_samples=1)
    return measured, why


def measured_from_eval(entries: list[ExpectedMetric], benchmark: str,
                       metrics: dict[str, Any]) -> tuple[dict[str, Measured], dict[str, str]]:
    """Figures of one ``areal eval`` result (``results[benchmark]``: fractions in [0, 1]; the Codeforces
    rating / percentile under ``metrics["codeforces"]``) in each entry's unit.

    Returns:
        (key -> Measured, key -> why it was not measured, e.g. "rating needs --cf-data DIR").
    """
    measured: dict[str, Measured] = {}
    why: dict[str, str] = {}
    n, k = metrics.get("n_problems"), metrics.get("n_samples")
    for m in entries:
        if m.benchmark != benchmark:
            continue
        if benchmark == "codeforces" and m.metric in ("rating", "percentile"):
            cf = metrics.get("codeforces") or {}
            value = cf.get(m.metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                measured[m.key] = Measured(float(value))
            else:
                why[m.key] = f"not measured: {cf.get('error') or cf.get('rating') or 'no rating in the results'}"
            continue
        value = metrics.get(m.metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            scale = 100.0 if m.unit == "percent" else 1.0
            measured[m.key] = Measured(float(value) * scale, n_problems=n, n_samples=k)
        else:
            why[m.key] = f"not measured: the {benchmark} results have no '{m.metric}'"
    return measured, why


def explain_skips(checks: list[Check], why: dict[str, str]) -> list[Check]:
    """``checks`` with the reason of each row skipped as "not measured" replaced by ``why[key]`` when known."""
    return [dataclasses.replace(c, reason=why[c.key]) if c.status == "skipped" and c.reason == "not measured"
            and c.key in why else c for c in checks]

"""The decode and prefill constants of the cluster model, fitted from a measured run's engine step-cost sums.

The embedded server's engine keeps, for every step it takes, least-squares sums of ``seconds`` against the step's
shape (:mod:`areal_cli.rollout.engine.step_costs`: a constant, decode sequences ``n``, the key slots its attention
read (``n`` x longest context, or per length group: ``decode_attention``), padded prefill tokens). A run that records a timeline stores each server's sums at the start and the end of RL
(``timeline.json`` ``marks.step_costs``); their difference is the statistics of the engine steps of the RL phase
(its held-out evaluations included: they are engine steps too). This module
solves the non-negative least-squares problem for ``(a, b, c, p)`` of ``a + b*n + c*slots + p*prefill``.
"""

from __future__ import annotations

import math

import numpy as np

FEATURES = ("step", "decode_seqs", "decode_ctx_tokens", "prefill_tokens")
SCENARIO_FIELDS = ("decode_step_fixed_s", "decode_step_per_seq_s", "decode_step_per_ctx_token_s",
                   "prefill_s_per_token")


def _arrays(d: dict) -> tuple[int, np.ndarray, np.ndarray, float]:
    if not isinstance(d, dict) or list(d.get("features", [])) != list(FEATURES):
        raise ValueError(f"step-cost features {d.get('features') if isinstance(d, dict) else d!r} are not "
                         f"{list(FEATURES)}")
    k = len(FEATURES)
    n, xtx, xty, yy = int(d["n"]), np.asarray(d["xtx"], dtype=float), np.asarray(d["xty"], dtype=float), float(d["yy"])
    if xtx.shape != (k, k) or xty.shape != (k,):
        raise ValueError(f"'xtx' must be {k} x {k} and 'xty' {k} numbers, got shapes {xtx.shape} and {xty.shape}")
    if n < 0 or not (np.isfinite(xtx).all() and np.isfinite(xty).all() and math.isfinite(yy)):
        raise ValueError("'n' must be >= 0 and the sums finite")
    return n, xtx, xty, yy


#: Fields of step-cost sums that say how the recording engine worked: name -> (its two values, the value of a snapshot
#: without the field, i.e. of an engine from before it). decode_attention: how a decode step read the KV cache (the
#: meaning of decode_ctx_tokens): one padded block per group of similar context lengths, or one block padded to the
#: longest context. prefill_sharing: whether the requests of one prefill batch with the same sequence (a group's
#: samples) were prefilled once (session 33 on). step_forwards: whether a step's prefill and decode shared one
#: forward (session 34 on).
_TAGS = {"decode_attention": (("grouped", "padded"), "padded"), "prefill_sharing": (("batch", "none"), "none"),
         "step_forwards": (("mixed", "separate"), "separate")}
#: What sums that differ in each tag come from (they are never fitted together).
_MIXED = {"decode_attention": "grouped and padded decode attention",
          "prefill_sharing": "engines with and without shared group prefills",
          "step_forwards": "engines with one forward per step and with separate prefill and decode forwards"}


def _tag(sums: dict, field: str) -> str:
    (a, b), absent = _TAGS[field]
    mode = sums.get(field, absent)
    if mode not in (a, b):
        raise ValueError(f"'{field}' must be {a} or {b}, got {mode!r}")
    return mode


def window_sums(start: dict | None, end: dict) -> dict:
    """The sums of the steps between two snapshots of one server (``start`` None: since the server started).

    Raises:
        ValueError: snapshots of different features, or ``end`` older than ``start``.
    """
    n1, a1, b1, y1 = _arrays(end)
    tags = {f: _tag(end, f) for f in _TAGS}
    if start is None:
        return {"features": list(FEATURES), "n": n1, "xtx": a1.tolist(), "xty": b1.tolist(), "yy": y1, **tags}
    n0, a0, b0, y0 = _arrays(start)
    if n1 < n0:
        raise ValueError("the end snapshot has fewer steps than the start snapshot")
    return {"features": list(FEATURES), **tags, "n": n1 - n0, "xtx": (a1 - a0).tolist(), "xty": (b1 - b0).tolist(),
            "yy": y1 - y0}


def fit_step_costs(sums: list[dict]) -> dict:
    """Non-negative least squares for ``seconds = a + b*n + c*n*L_max + p*prefill`` over the steps of ``sums``.

    Args:
        sums: step-cost sums (one per server, or per window), as :func:`window_sums` returns; they are added.
    Returns:
        ``{"steps": n, "coef": {scenario field: seconds}, "rmse_s": ..., "mean_step_s": ..., "r2": ...,
        "decode_attention": "grouped" | "padded", "prefill_sharing": "batch" | "none", "step_forwards": "mixed" |
        "separate"}`` (how the recording engines worked: ``_TAGS``);
        a feature never seen (e.g. no prefill) or whose unconstrained coefficient is negative gets 0 (active set:
        the most negative one is dropped and the rest refitted).
    Raises:
        ValueError: fewer steps than features, sums of other features, or of engines that read the KV cache,
            prefilled a group or split a step into forwards differently.
    """
    tags = {}
    for field, engines in _MIXED.items():
        seen = {_tag(d, field) for d in sums}
        if len(seen) > 1:
            raise ValueError(f"step-cost sums of {engines} cannot be fitted together")
        tags[field] = seen.pop() if seen else _TAGS[field][1]
    k = len(FEATURES)
    n, xtx, xty, yy = 0, np.zeros((k, k)), np.zeros(k), 0.0
    for d in sums:
        dn, a, b, y = _arrays(d)
        n, xtx, xty, yy = n + dn, xtx + a, xty + b, yy + y
    if n < k:
        raise ValueError(f"need at least {k} engine steps to fit their cost, got {n}")
    active = [i for i in range(k) if xtx[i, i] > 0]
    coef = np.zeros(k)
    while active:
        sub = np.ix_(active, active)
        scale = np.sqrt(np.diag(xtx)[active])  # columns to unit norm: the features span 1 .. 1e5
        sol = np.linalg.lstsq(xtx[sub] / np.outer(scale, scale), xty[active] / scale, rcond=None)[0] / scale
        if (sol >= 0).all():
            coef[:] = 0.0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    sse = float(yy - 2 * coef @ xty + coef @ xtx @ coef)
    mean = float(xty[0] / n)
    sst = float(yy - n * mean * mean)
    return {"steps": n, "coef": {f: float(v) for f, v in zip(SCENARIO_FIELDS, coef)},
            "rmse_s": math.sqrt(max(sse, 0.0) / n), "mean_step_s": mean,
            "r2": 1.0 - max(sse, 0.0) / sst if sst > 0 else 1.0, **tags}


def step_costs_of_timeline(timeline: dict) -> list[dict] | None:
    """Each server's sums over the RL window of a ``timeline.json`` (``marks.step_costs``), or None when the run
    did not record them (runs of older versions)."""
    marks = (timeline.get("marks") or {}).get("step_costs") or {}
    end = marks.get("rl_end") or {}
    if not end:
        return None
    start = marks.get("rl_start") or {}
    if not isinstance(end, dict) or not isinstance(start, dict):
        raise ValueError("'rl_start' and 'rl_end' must map timeline lanes (server0, ...) to step-cost sums")
    return [window_sums(start.get(lane), end[lane]) for lane in sorted(end)]

"""What the cluster model predicts across settings: modes compared, the async/sync ratio, its sensitivity
to each input, scaling with GPUs and the staleness (eta) sweep.

Every run of a sweep uses the scenario's random seed (common random numbers), so differences between settings are
not sampling noise.
"""

from __future__ import annotations

import dataclasses
import typing

from areal_cli.bench.sim.modes import MODES
from areal_cli.bench.sim.scenario import Scenario
from areal_cli.bench.sim.steady_state import simulate


def compare_modes(sc: Scenario, modes: typing.Sequence[str] = MODES, *, scale: int = 1) -> dict:
    """Simulate each mode; adds ``speedup_vs_sync`` (sync step time / mode step time) to each result."""
    res = {m: simulate(sc, m, scale=scale) for m in modes}
    if "sync" in res:
        for r in res.values():
            r["speedup_vs_sync"] = res["sync"]["step_s"] / r["step_s"]
    return res


def async_sync_ratio(sc: Scenario, *, scale: int = 1) -> float:
    """Predicted speed-up of fully asynchronous over synchronous RL (sync step time / async step time)."""
    return simulate(sc, "sync", scale=scale)["step_s"] / simulate(sc, "async", scale=scale)["step_s"]



# --------------------------------------------------------------------------------------------------------
# sweeps

SENSITIVITY_INPUTS = (
    "response_median_tokens", "response_sigma", "response_prompt_corr", "max_new_tokens", "prompt_tokens",
    "decode_overhead_s", "decode_bw_efficiency", "decode_flops_efficiency", "prefill_flops_efficiency",
    "train_mfu", "train_fixed_s", "weight_io_gb_s", "sync_overhead_s", "gen_gpus", "train_gpus",
    "max_concurrent_groups",
)


# derived-cost inputs, and the explicit costs that replace them (derive_costs: an explicit cost wins)
_DERIVED_BY = {"decode_overhead_s": ("decode_step_fixed_s",),
               "decode_bw_efficiency": ("decode_step_fixed_s", "decode_step_per_ctx_token_s"),
               "decode_flops_efficiency": ("decode_step_per_seq_s",), "prefill_flops_efficiency": ("prefill_s_per_token",),
               "train_mfu": ("train_gpu_s_per_token", "train_gpu_s_per_token_sq"),
               "weight_io_gb_s": ("sync_save_s", "sync_load_s"), "sync_overhead_s": ("sync_load_s",)}
_EXPLICIT = ("decode_step_fixed_s", "decode_step_per_seq_s", "decode_step_per_ctx_token_s", "prefill_s_per_token",
             "request_overhead_s", "train_fixed_s", "train_gpu_s_per_token", "sync_save_s", "overlap_train_factor")


def sensitivity_inputs(sc: Scenario) -> list[str]:
    """The inputs that act on ``sc``: :data:`SENSITIVITY_INPUTS` without the physical constants whose derived cost
    the scenario gives explicitly, and without the lognormal's median and spread when its lengths are empirical;
    plus the explicit costs themselves (non-zero ones), as a calibrated CPU scenario has them."""
    empirical = bool(sc.response_length_counts or sc.response_lengths_file)
    out = [n for n in SENSITIVITY_INPUTS
           if not (n in _DERIVED_BY and all(getattr(sc, e) is not None for e in _DERIVED_BY[n]))]
    out = [n for n in out if not (empirical and n in ("response_median_tokens", "response_sigma"))]
    extra = [n for n in _EXPLICIT if getattr(sc, n) not in (None, 0, 0.0) and n not in out
             and not (n == "overlap_train_factor" and sc.overlap_train_factor == 1.0)]
    return out + extra


def sensitivity(sc: Scenario, *, rel: float = 0.2, inputs: typing.Sequence[str] | None = None,
                scale: int = 1) -> dict:
    """Change each input by -rel and +rel (one at a time) and report the async/sync ratio (``inputs``: default
    :func:`sensitivity_inputs`).

    Efficiency constants are capped at 1. Integer inputs are rounded (``gen_gpus`` to a multiple of
    ``gen_tp``). ``max_concurrent_groups`` 0 is read as ``batch_size``. The same random seed is used for every
    run (common random numbers), so differences are not sampling noise.

    Returns:
        ``{"base": ratio, "rel": rel, "inputs": {name: {"base_value", "low_value", "high_value", "low", "high",
        "max_change"}}}`` sorted by decreasing ``max_change`` = max |ratio(+-rel) - base| (not |high - low|:
        near a balance point of generation and training both directions can lower the ratio).
    """
    base = async_sync_ratio(sc, scale=scale)
    rows = {}
    for name in (sensitivity_inputs(sc) if inputs is None else inputs):
        v0 = getattr(sc, name)
        if name == "max_concurrent_groups" and not v0:
            v0 = sc.batch_size
        vals = []
        for f in (1 - rel, 1 + rel):
            v = v0 * f
            if name.endswith("efficiency") or name == "train_mfu" or name == "response_prompt_corr":
                v = min(v, 1.0)
            if isinstance(getattr(Scenario(), name), int) and not isinstance(getattr(Scenario(), name), bool):
                v = max(1, round(v))
                if name == "gen_gpus":
                    v = max(sc.gen_tp, round(v / sc.gen_tp) * sc.gen_tp)
            vals.append(v)
        ratios = [async_sync_ratio(dataclasses.replace(sc, **{name: v}), scale=scale) for v in vals]
        rows[name] = {"base_value": v0, "low_value": vals[0], "high_value": vals[1],
                      "low": ratios[0], "high": ratios[1],
                      "max_change": max(abs(ratios[0] - base), abs(ratios[1] - base))}
    rows = dict(sorted(rows.items(), key=lambda kv: -kv[1]["max_change"]))
    return {"base": base, "rel": rel, "inputs": rows}


def split_gpus(sc: Scenario, total: int) -> tuple[int, int]:
    """(generation GPUs, training GPUs) for ``total`` GPUs at the scenario's generation fraction."""
    frac = sc.scaling_gen_fraction or sc.gen_gpus / (sc.gen_gpus + sc.train_gpus)
    gen = max(sc.gen_tp, round(total * frac / sc.gen_tp) * sc.gen_tp)
    gen = min(gen, total - 1)
    return gen, total - gen


def scaling(sc: Scenario, gpus: typing.Sequence[int], modes: typing.Sequence[str] = ("sync", "async"),
            *, scale: int = 1) -> dict:
    """Effective throughput vs total GPUs (same workload, same generation fraction).

    Returns:
        ``{"gpus": [...], "gen_gpus": [...], "train_gpus": [...], mode: [tokens/s, ...], mode+"_step_s": [...]}``.
    """
    out: dict = {"gpus": list(gpus), "gen_gpus": [], "train_gpus": []}
    for m in modes:
        out[m] = []
        out[m + "_step_s"] = []
    for total in gpus:
        g, t = split_gpus(sc, total)
        out["gen_gpus"].append(g)
        out["train_gpus"].append(t)
        s2 = dataclasses.replace(sc, gen_gpus=g, train_gpus=t)
        for m in modes:
            r = simulate(s2, m, scale=scale)
            out[m].append(r["effective_tokens_per_s"])
            out[m + "_step_s"].append(r["step_s"])
    return out


def eta_sweep(sc: Scenario, etas: typing.Sequence[int], *, scale: int = 1) -> dict:
    """Effective throughput of the interruptible async mode for each eta (eta 0 = the sync mode)."""
    rows = {}
    for e in etas:
        r = simulate(sc, "sync", scale=scale) if e == 0 else simulate(sc, "async", eta=e, scale=scale)
        rows["inf" if e < 0 else str(e)] = {"effective_tokens_per_s": r["effective_tokens_per_s"],
                                            "step_s": r["step_s"], "staleness_mean": r["staleness_mean"]}
    return rows

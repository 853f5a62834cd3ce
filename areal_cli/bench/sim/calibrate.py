"""Fitting the cluster model: constants to target step times (Gauss-Newton) and a scenario to a measured run.

:func:`fit_to_published` fits two constants to a paper's sync and async hours; :func:`calibrate_from_run` reads
the trainer side of a measured synchronous run directly and solves the generation side by simulation.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path

import numpy as np

from areal_cli.bench.sim.events import simulate
from areal_cli.bench.sim.scenario import Scenario
from areal_cli.errors import UserError

_FIELD_TYPES = typing.get_type_hints(Scenario)


def fit_constants(sc: Scenario, targets: dict[str, float], params: typing.Sequence[str] = ("decode_overhead_s",
                  "train_mfu"), *, scale: int = 8, iters: int = 12, tol: float = 0.005) -> tuple[Scenario, dict]:
    """Fit positive scenario constants so simulated step times match ``targets`` (mode -> seconds per step).

    Gauss-Newton on logarithms (finite differences, the same random seed for every run), step halving when
    the error grows; efficiencies are capped at 1. With as many targets as parameters this solves the
    equations when a solution exists; otherwise it returns the least-squares compromise.

    Returns:
        (fitted scenario, ``{"params": {name: value}, "targets": ..., "achieved": {mode: s}, "rel_error":
        {mode: e}, "iterations": n}``).
    Raises:
        ValueError: no targets / no params, or a parameter that is not a positive float field.
    """
    if not targets or not params:
        raise ValueError("need at least one target and one parameter")
    for p in params:
        if _FIELD_TYPES.get(p) is not float or not getattr(sc, p) > 0:
            raise ValueError(f"cannot fit {p!r}: must be a positive float field")
    modes = list(targets)
    y = np.log([targets[m] for m in modes])

    def clamp(name: str, v: float) -> float:
        return min(v, 1.0) if name.endswith("efficiency") or name == "train_mfu" else v

    def run(x: np.ndarray) -> tuple[Scenario, np.ndarray]:
        s2 = dataclasses.replace(sc, **{p: clamp(p, float(math.exp(v))) for p, v in zip(params, x)})
        return s2, np.log([simulate(s2, m, scale=scale)["step_s"] for m in modes])

    x = np.log([getattr(sc, p) for p in params])
    cur_sc, f = run(x)
    it = 0
    for it in range(1, iters + 1):
        r = f - y
        if np.max(np.abs(r)) < tol:
            break
        h = 0.05
        jac = np.empty((len(modes), len(params)))
        for j in range(len(params)):
            xj = x.copy()
            xj[j] += h
            jac[:, j] = (run(xj)[1] - f) / h
        step, *_ = np.linalg.lstsq(jac, -r, rcond=None)
        step = np.clip(step, -1.0, 1.0)
        for _ in range(6):
            cand_sc, cand_f = run(x + step)
            if np.sum((cand_f - y) ** 2) < np.sum(r ** 2):
                x, f, cur_sc = x + step, cand_f, cand_sc
                break
            step = step / 2
        else:
            break
    achieved = {m: float(math.exp(v)) for m, v in zip(modes, f)}
    return cur_sc, {
        "params": {p: getattr(cur_sc, p) for p in params},
        "targets": dict(targets), "achieved": achieved,
        "rel_error": {m: achieved[m] / targets[m] - 1 for m in modes}, "iterations": it, "scale": scale,
    }


def fit_to_published(sc: Scenario, **kw) -> tuple[Scenario, dict]:
    """Fit ``decode_overhead_s`` and ``train_mfu`` to the scenario's ``published`` sync and async hours
    (seconds per step = hours * 3600 / ``steps``). Raises: UserError if the scenario has no such figures."""
    pub = sc.published or {}
    if "sync_hours" not in pub or "async_hours" not in pub:
        raise UserError(f"{sc.source or 'scenario'}: field 'published': needs sync_hours and async_hours to fit")
    targets = {"sync": pub["sync_hours"] * 3600 / sc.steps, "async": pub["async_hours"] * 3600 / sc.steps}
    return fit_constants(sc, targets, **kw)


def _read_run_records(path: Path) -> dict[str, tuple[int | None, list[dict]]]:
    """Per-step records of the runs in ``path``: ``{run name: (eta or None, [step dicts])}``.

    Accepts an ``areal train`` ``metrics.jsonl`` (one run) or a JSON file with ``runs``: a list or mapping of
    runs, each with ``steps`` / ``metrics`` (a list of step dicts) or ``metrics_jsonl`` (a path, relative to the
    JSON file) or ``dir`` (a run folder with ``metrics.jsonl`` and optionally ``timeline.json``, as in
    ``areal bench throughput`` results), and optionally ``name`` / ``label`` and ``eta``.

    Raises:
        UserError: unreadable file, bad JSON, or no step records (``file:line`` for JSONL).
    """
    import json

    if not path.is_file():
        raise UserError(f"{path}: file not found")

    def jsonl(p: Path) -> list[dict]:
        rows = []
        try:
            text = p.read_text()
        except OSError as e:
            raise UserError(f"{p}: cannot read: {e.strerror}") from None
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise UserError(f"{p}:{i}: invalid JSON: {e.msg}") from None
        return rows

    if path.suffix == ".jsonl":
        return {path.stem: (None, jsonl(path))}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    runs = data.get("runs") if isinstance(data, dict) else None
    if isinstance(runs, dict):
        runs = [dict(v, name=v.get("name", k)) for k, v in runs.items() if isinstance(v, dict)]
    if not isinstance(runs, list) or not runs:
        raise UserError(f"{path}: field 'runs': expected a list or mapping of runs with per-step records")
    out = {}
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise UserError(f"{path}: field 'runs[{i}]': expected a mapping")
        name = str(run.get("name", run.get("label", run.get("mode", f"run{i}"))))
        steps = run.get("steps") if isinstance(run.get("steps"), list) else run.get("metrics")
        # (`areal bench throughput` runs carry ``steps`` as their step count and their records in ``dir``)
        if steps is None and run.get("metrics_jsonl"):
            mp = Path(run["metrics_jsonl"])
            steps = jsonl(mp if mp.is_absolute() else path.parent / mp)
        if steps is None and run.get("dir"):  # `areal bench throughput`: the run's own folder
            d = Path(run["dir"])
            cands = [d, path.parent / d, path.parent / "runs" / d.name]
            d = next((c for c in cands if (c / "metrics.jsonl").is_file()), None)
            if d is None:
                raise UserError(f"{path}: field 'runs[{i}].dir': no metrics.jsonl in {run['dir']}")
            steps = jsonl(d / "metrics.jsonl")
            if (d / "timeline.json").is_file():  # exact tokens trained per step
                tl = json.loads((d / "timeline.json").read_text())
                tok = {t["step"]: t["tokens"] for t in tl.get("steps", []) if "tokens" in t}
                for r in steps:
                    if r.get("step") in tok:
                        r["trained_tokens"] = tok[r["step"]]
        if not isinstance(steps, list):
            raise UserError(f"{path}: field 'runs[{i}]': no 'steps', 'metrics', 'metrics_jsonl' or 'dir'")
        eta = run.get("eta", run.get("max_head_offpolicyness"))
        out[name] = (int(eta) if isinstance(eta, int) else None, steps)
    return out


def measured_step_figures(records: list[dict]) -> dict:
    """Means over the RL steps of one run (records as in ``metrics.jsonl``): seconds per step, training,
    publishing, waiting and other (evaluation) time per step, tokens and samples generated per step,
    accepted fraction, mean response length, truncated fraction. The first RL step (pipeline fill) and the last
    (final evaluation) are left out.

    Raises:
        UserError: fewer than 3 RL steps, or a record without the needed fields.
    """
    rl = [r for r in records if r.get("phase", "rl") == "rl" and "step" in r]
    if len(rl) < 4:
        raise UserError(f"need at least 4 RL steps with per-step timings, got {len(rl)}")
    need = ("elapsed_s", "train_s", "sync_s", "wait_s", "tokens_generated", "samples_generated")
    for r in rl:
        miss = [k for k in need if k not in r]
        if miss:
            raise UserError(f"step {r.get('step')}: field '{miss[0]}' missing")
    rows = rl[1:-1]  # the first step fills the pipeline; the last often carries the final evaluation
    n = len(rows) - 1
    dt = (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]) / n
    d = lambda k: (rows[-1][k] - rows[0][k]) / n  # noqa: E731 - cumulative counters per step
    train = float(np.mean([r["train_s"] for r in rows[1:]]))
    sync = float(np.mean([r["sync_s"] for r in rows[1:]]))
    wait = float(np.mean([r["wait_s"] for r in rows[1:]]))
    sub = d("groups_submitted") if "groups_submitted" in rows[0] else None
    acc = d("groups_accepted") if "groups_accepted" in rows[0] else None
    return {
        "steps": n, "step_s": dt, "train_s": train, "sync_s": sync, "wait_s": wait,
        "other_s": max(0.0, dt - train - sync - wait),
        "tokens_generated_per_step": d("tokens_generated"), "samples_per_step": d("samples_generated"),
        "response_mean_tokens": d("tokens_generated") / max(d("samples_generated"), 1e-9),
        "accept_fraction": (acc / sub) if sub and acc else 1.0,
        "truncated_frac": float(np.mean([r.get("truncated_frac", 0.0) for r in rows])),
        "staleness_mean": float(np.mean([r.get("staleness_mean", 0.0) for r in rows])),
    }


def calibrate_from_run(results_json: str | Path, base: Scenario | None = None, *, sync_run: str | None = None,
                       scale: int = 1) -> tuple[Scenario, dict]:
    """Fit a scenario to a measured run on this machine.

    From the synchronous run (eta 0: generation, training and publishing do not overlap) the trainer side is
    read directly: ``train_fixed_s`` + per-token cost from a least-squares line of ``train_s`` against the
    tokens trained per step; ``sync_save_s`` = mean publish time (the loop saves and loads inside it;
    ``sync_load_s`` = 0); ``trainer_overhead_s`` = mean of the rest of the step (held-out evaluation);
    ``accept_fraction`` and the mean response length from the counters. The generation side is fitted by
    simulation: ``decode_step_fixed_s`` (one decode step of the CPU server, batch-independent on the tiny
    model) is solved so that the simulated synchronous step time equals the measured one.

    Args:
        results_json: ``metrics.jsonl`` of an ``areal train`` run with ``max_head_offpolicyness=0`` or a
            results JSON with several runs (see :func:`_read_run_records`).
        base: scenario to start from (cluster shape, batch, group size, max_new_tokens, prompt length).
        sync_run: name of the synchronous run in a multi-run file (default: the one whose staleness is 0).
    Returns:
        (fitted scenario, report with the measured figures of every run, the fitted values, and for each
        other run the simulated vs measured step time).
    Raises:
        UserError: unreadable input, no synchronous run, missing fields.
    """
    path = Path(results_json)
    runs = _read_run_records(path)
    figs = {name: measured_step_figures(rows) for name, (_, rows) in runs.items()}
    if sync_run is None:
        cands = [n for n, f in figs.items() if runs[n][0] == 0 or (runs[n][0] is None and f["staleness_mean"] == 0.0)]
        if not cands:
            raise UserError(f"{path}: no synchronous run (eta 0, staleness 0 in every step) to calibrate on")
        sync_run = cands[0]
    if sync_run not in figs:
        raise UserError(f"{path}: no run named {sync_run!r} (runs: {', '.join(figs)})")
    f = figs[sync_run]
    sync_rows = [r for r in runs[sync_run][1] if r.get("phase", "rl") == "rl" and "step" in r][1:-1]
    sc = dataclasses.replace(base or Scenario(), lines={})
    seq = sc.prompt_tokens + f["response_mean_tokens"]
    default_tokens = sc.batch_size * sc.group_size * seq  # when a record does not say how many tokens it trained
    tokens = np.array([r.get("trained_tokens", default_tokens) for r in sync_rows], dtype=float)
    train_s = np.array([r["train_s"] for r in sync_rows], dtype=float)
    slope, intercept = np.polyfit(tokens, train_s, 1) if np.ptp(tokens) > 0 else (0.0, 0.0)
    if slope <= 0 or intercept < 0:  # no usable spread in tokens: all cost per token
        slope, intercept = float(train_s.mean() / tokens.mean()), 0.0
    sigma = sc.response_sigma
    med = f["response_mean_tokens"] / math.exp(sigma * sigma / 2)
    sc = dataclasses.replace(
        sc, train_fixed_s=float(intercept), train_gpu_s_per_token=float(slope) * sc.train_gpus,
        train_gpu_s_per_token_sq=0.0, sync_save_s=f["sync_s"], sync_load_s=0.0, trainer_overhead_s=f["other_s"],
        accept_fraction=min(1.0, max(1e-3, f["accept_fraction"])), response_median_tokens=max(1.0, med),
        decode_step_per_seq_s=sc.decode_step_per_seq_s or 0.0, decode_step_per_ctx_token_s=sc.decode_step_per_ctx_token_s or 0.0,
        prefill_s_per_token=sc.prefill_s_per_token or 0.0, decode_step_fixed_s=sc.decode_step_fixed_s or 0.01,
    )
    # solve decode_step_fixed_s: simulated sync step time = measured (bisection on a monotone function)
    lo, hi = 1e-6, 1.0
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        t = simulate(dataclasses.replace(sc, decode_step_fixed_s=mid), "sync", scale=scale)["step_s"]
        lo, hi = (mid, hi) if t < f["step_s"] else (lo, mid)
        if hi / lo < 1.002:
            break
    sc = dataclasses.replace(sc, decode_step_fixed_s=math.sqrt(lo * hi))
    checks = {}
    for name, fig in figs.items():
        eta = runs[name][0]
        if eta is None:
            eta = 0 if name == sync_run else sc.eta
        r = simulate(sc, "sync", scale=scale) if eta == 0 else simulate(sc, "async", eta=eta, scale=scale)
        checks[name] = {"eta": eta, "measured_step_s": fig["step_s"], "simulated_step_s": r["step_s"],
                        "rel_error": r["step_s"] / fig["step_s"] - 1,
                        "measured_staleness_mean": fig["staleness_mean"], "simulated_staleness_mean": r["staleness_mean"]}
    report = {"source": str(path), "sync_run": sync_run, "measured": figs,
              "fitted": {k: getattr(sc, k) for k in ("decode_step_fixed_s", "train_fixed_s", "train_gpu_s_per_token",
                                                       "sync_save_s", "trainer_overhead_s", "accept_fraction",
                                                       "response_median_tokens")},
              "checks": checks}
    return sc, report

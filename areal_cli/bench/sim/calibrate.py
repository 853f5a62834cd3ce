"""Fitting the cluster model: constants to target step times (Gauss-Newton) and a scenario to a measured run.

:func:`fit_to_published` fits two constants to a paper's sync and async hours; :func:`calibrate_from_run` reads
the trainer side of a measured synchronous run directly and solves the generation side by simulation.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import typing
from pathlib import Path

import numpy as np

from areal_cli.bench.sim.scenario import Scenario
from areal_cli.bench.sim.steady_state import simulate
from areal_cli.foundations.errors import UserError

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


class MeasuredRun(typing.NamedTuple):
    """One measured run: its eta (None if unknown), per-step records, ``timeline.json`` (or None) and, for an
    ``areal bench throughput`` run, its entry in that benchmark's results (or None)."""

    eta: int | None
    steps: list[dict]
    timeline: dict | None = None
    summary: dict | None = None


def _read_run_records(path: Path) -> dict[str, MeasuredRun]:
    """Per-step records of the runs in ``path``: ``{run name: MeasuredRun}``.

    Accepts an ``areal train`` ``metrics.jsonl`` (one run) or a JSON file with ``runs``: a list or mapping of
    runs, each with ``steps`` / ``metrics`` (a list of step dicts) or ``metrics_jsonl`` (a path, relative to the
    JSON file) or ``dir`` (a run folder with ``metrics.jsonl`` and optionally ``timeline.json``, as in
    ``areal bench throughput`` results), optionally ``timeline`` (the run's ``timeline.json`` inline), ``name`` /
    ``label`` and ``eta``.

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
        return {path.stem: MeasuredRun(None, jsonl(path))}
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
        tl = run.get("timeline") if isinstance(run.get("timeline"), dict) else None  # inline (measured-runs.json)
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
            if (d / "timeline.json").is_file():  # exact tokens trained per step, the engines' step costs
                try:
                    tl = json.loads((d / "timeline.json").read_text())
                except json.JSONDecodeError as e:
                    raise UserError(f"{d / 'timeline.json'}:{e.lineno}: invalid JSON: {e.msg}") from None
        if not isinstance(steps, list):
            raise UserError(f"{path}: field 'runs[{i}]': no 'steps', 'metrics', 'metrics_jsonl' or 'dir'")
        if tl is not None:  # exact tokens trained per step
            tok = {t["step"]: t["tokens"] for t in tl.get("steps", []) if isinstance(t, dict) and "tokens" in t}
            for r in steps:
                if isinstance(r, dict) and r.get("step") in tok:
                    r["trained_tokens"] = tok[r["step"]]
        eta = run.get("eta", run.get("max_head_offpolicyness"))
        out[name] = MeasuredRun(int(eta) if isinstance(eta, int) else None, steps, tl,
                                run if "step_s_mean" in run else None)
    return out


def measured_step_figures(records: list[dict]) -> dict:
    """Means over the RL steps of one run (records as in ``metrics.jsonl``): seconds per step, training,
    publishing, waiting and other (evaluation) time per step, tokens and samples generated per step,
    accepted fraction, mean response length, truncated fraction. The first RL step (pipeline fill) and the last
    (final evaluation) are left out.

    Raises:
        UserError: fewer than 4 RL steps, or a record without the needed fields.
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


MACHINE_FIELDS = ("decode_step_fixed_s", "decode_step_per_seq_s", "decode_step_per_ctx_token_s", "prefill_s_per_token",
                  "decode_attention", "prefix_cache", "request_overhead_s", "batch_handoff_s_per_token",
                  "overlap_train_factor", "train_fixed_s", "train_gpu_s_per_token",
                  "train_gpu_s_per_token_sq", "sync_save_s", "sync_load_s")
"""What :func:`calibrate_from_run` measures of the machine (not of the workload): the fields
:func:`with_machine_of` carries from a calibrated scenario to a scenario of another workload."""


def with_machine_of(target: Scenario, calibrated: Scenario) -> Scenario:
    """``target`` (its cluster shape and workload) with the machine constants of ``calibrated``
    (:data:`MACHINE_FIELDS`): predict another workload on the machine a run was calibrated on.

    Raises:
        UserError: ``calibrated`` is not a calibrated machine (its explicit cost fields are unset, so its costs
            would be derived from GPU peak numbers).
    """
    missing = [k for k in ("decode_step_fixed_s", "train_gpu_s_per_token", "sync_save_s")
               if getattr(calibrated, k) is None]
    if missing:
        raise UserError(f"{calibrated.source or 'scenario'}: field '{missing[0]}': not set, so this is not a calibrated "
                        f"machine (write one with `areal bench simulate SCENARIO --calibrate-from RUN --out DIR`: "
                        f"DIR/scenario.yaml)")
    return dataclasses.replace(target, **{k: getattr(calibrated, k) for k in MACHINE_FIELDS})


def _figures(run: MeasuredRun) -> dict:
    """:func:`measured_step_figures`, with an ``areal bench throughput`` run's own step phases when it has them:
    its steady state when recorded (``steady_step_s``: the first step, which fills the pipeline, and the steps
    right after a held-out evaluation left out; the simulator's steady state leaves out the same), else its mean
    step (held-out evaluations excluded)."""
    f = measured_step_figures(run.steps)
    b = run.summary
    if b and isinstance(b.get("step_seconds"), dict):
        steady = isinstance(b.get("steady_step_seconds"), dict) and b.get("steady_step_s")
        ph = b["steady_step_seconds"] if steady else b["step_seconds"]
        f.update(step_s=float(b["steady_step_s"] if steady else b["step_s_mean"]),
                 train_s=float(ph.get("train_s", f["train_s"])), sync_s=float(ph.get("publish_s", f["sync_s"])),
                 wait_s=float(ph.get("wait_s", f["wait_s"])), other_s=0.0, evaluations_excluded=True,
                 steady_state=bool(steady))
        if b.get("effective_tokens_per_s"):
            f["effective_tokens_per_s"] = float(b["effective_tokens_per_s"])
    return f


def _solve(fn, target: float, lo: float, hi: float) -> float:
    """Geometric bisection for ``fn(x) = target`` with ``fn`` increasing on ``[lo, hi]``."""
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if fn(mid) < target else (lo, mid)
        if hi / lo < 1.002:
            break
    return math.sqrt(lo * hi)


def calibrate_from_run(results_json: str | Path, base: Scenario | None = None, *, sync_run: str | None = None,
                       scale: int = 1) -> tuple[Scenario, dict]:
    """Fit a scenario to a measured run on this machine.

    From the synchronous run (eta 0: generation, training and publishing do not overlap) the trainer side is
    read directly: ``train_fixed_s`` + per-token cost from a least-squares line of ``train_s`` against the
    tokens trained per step; ``sync_save_s`` = mean publish time (the loop saves and loads inside it;
    ``sync_load_s`` = 0); ``trainer_overhead_s`` = mean of the rest of the step (held-out evaluation; 0 for an
    ``areal bench throughput`` run, whose step phases leave evaluations out); ``accept_fraction`` and the mean
    response length from the counters; when the timelines list each trained sample's response length, the
    synchronous runs' lengths become ``response_length_counts`` (the run's own length distribution).

    The generation side: when the runs recorded their engines' step costs (``timeline.json``
    ``marks.step_costs``, :mod:`areal_cli.rollout.engine.step_costs`), the decode and prefill constants are
    fitted to every engine step of every run in the file (:func:`~areal_cli.bench.sim.engine_costs.
    fit_step_costs`; ``decode_attention`` as the recording engine read its KV cache, ``grouped`` or, for runs of
    engines before the length groups, ``padded``; ``prefix_cache`` true when the recording engine prefilled a group's
    samples once, ``prefill_sharing: batch``, else false: each sample prefilled its prompt) and
    ``request_overhead_s`` (server-core time per request outside the engine) is solved so that the simulated
    synchronous step equals the measured one. Without step costs (older runs), ``decode_step_fixed_s`` (one
    batch-independent decode step) is solved instead.

    The trainer beside generation, from the asynchronous runs of an ``areal bench throughput`` result: the
    smallest lowest-decile step wait for a batch among them is the hand-off of a ready batch
    (``batch_handoff_s_per_token`` = it / tokens per step; the servers were ahead in those steps), and the mean training + publishing time of the
    interruptible ones (all of them when none is: a non-interruptible publish may include the drain, which the model
    simulates) over the synchronous runs', per trained token, is ``overlap_train_factor``. Both are 0 / 1 without
    such runs.

    Args:
        results_json: ``metrics.jsonl`` of an ``areal train`` run with ``max_head_offpolicyness=0`` or a
            results JSON with several runs (see :func:`_read_run_records`).
        base: scenario to start from (cluster shape, batch, group size, max_new_tokens, prompt length).
        sync_run: name of the synchronous run in a multi-run file (default: the one whose staleness is 0).
    Returns:
        (fitted scenario, report with the measured figures of every run, the fitted values, the engine cost fit,
        for each other run the simulated vs measured step time, and measured vs simulated async/sync ratios).
    Raises:
        UserError: unreadable input, no synchronous run, missing fields.
    """
    from areal_cli.bench.sim.engine_costs import fit_step_costs, step_costs_of_timeline

    path = Path(results_json)
    runs = _read_run_records(path)
    figs = {}
    for name, run in runs.items():
        try:
            figs[name] = _figures(run)
        except UserError as e:
            raise UserError(f"{path}: run {name!r}: {e}") from None
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise UserError(f"{path}: run {name!r}: unreadable step figures ({type(e).__name__}: {e})") from None
    if sync_run is None:
        cands = [n for n, f in figs.items()
                 if runs[n].eta == 0 or (runs[n].eta is None and f["staleness_mean"] == 0.0)]
        if not cands:
            raise UserError(f"{path}: no synchronous run (eta 0, staleness 0 in every step) to calibrate on")
        sync_run = cands[0]
    if sync_run not in figs:
        raise UserError(f"{path}: no run named {sync_run!r} (runs: {', '.join(figs)})")
    syncs = [n for n in figs if runs[n].eta == 0] if runs[sync_run].eta == 0 else [sync_run]
    f = {k: (float(np.mean([figs[n][k] for n in syncs])) if isinstance(v, float) else v)
         for k, v in figs[sync_run].items()}  # the mean of the synchronous runs (repeats)
    sync_rows = [r for n in syncs for r in runs[n].steps if r.get("phase", "rl") == "rl" and "step" in r][1:-1]
    sc = dataclasses.replace(base or Scenario(), lines={})
    trained = sorted(st["n_samples"] for n in syncs if runs[n].timeline for st in runs[n].timeline.get("steps", [])
                     if isinstance(st, dict) and isinstance(st.get("n_samples"), int))
    per_step = trained[len(trained) // 2] if trained else None  # the median
    if per_step is not None and per_step != sc.batch_size * sc.group_size:
        raise UserError(f"{path}: the runs train {per_step} samples per step, the scenario "
                        f"{sc.name} {sc.batch_size} x {sc.group_size} = {sc.batch_size * sc.group_size}: calibrate the "
                        f"scenario of the runs' own workload, then carry its machine to this one with --costs-from")
    seq = sc.prompt_tokens + f["response_mean_tokens"]
    default_tokens = sc.batch_size * sc.group_size * seq  # when a record does not say how many tokens it trained
    tokens = np.array([r.get("trained_tokens", default_tokens) for r in sync_rows], dtype=float)
    train_s = np.array([r["train_s"] for r in sync_rows], dtype=float)
    slope, intercept = np.polyfit(tokens, train_s, 1) if np.ptp(tokens) > 0 else (0.0, 0.0)
    if slope <= 0 or intercept < 0:  # no usable spread in tokens: all cost per token
        slope, intercept = float(train_s.mean() / tokens.mean()), 0.0
    measured_lengths = collections.Counter(
        int(x) for n in syncs if runs[n].timeline for st in runs[n].timeline.get("steps", [])
        for x in st.get("response_lengths", ()) if isinstance(x, int) and x > 0)
    # the calibration run's own length distribution (its sync runs' trained samples); without it, a lognormal
    # with the measured mean (the base scenario's spread)
    sc = dataclasses.replace(sc, response_length_counts=dict(sorted(measured_lengths.items())), response_lengths_file=(
        sc.response_lengths_file if measured_lengths else None))
    sigma = sc.response_sigma
    med = f["response_mean_tokens"] / math.exp(sigma * sigma / 2)
    sc = dataclasses.replace(
        sc, train_fixed_s=float(intercept), train_gpu_s_per_token=float(slope) * sc.train_gpus,
        train_gpu_s_per_token_sq=0.0, sync_save_s=f["sync_s"], sync_load_s=0.0, trainer_overhead_s=f["other_s"],
        accept_fraction=min(1.0, max(1e-3, f["accept_fraction"])), response_median_tokens=max(1.0, med),
    )  # the decode and prefill constants are set below, from the step costs or by solving the sync step
    # the trainer beside generation (asynchronous runs of an `areal bench throughput` result): its wait for a batch
    # when the servers are ahead is the hand-off; training + publishing slow down by the overlap factor
    beside = [n for n in figs if (runs[n].eta or 0) > 0 and runs[n].summary]
    overlap, handoff, factor = None, 0.0, 1.0  # without asynchronous runs: no hand-off, no slowdown
    if beside:
        # a step whose batch was ready waits only for the hand-off: the lowest decile of the asynchronous steps'
        # waits (a generation-bound run waits for generation in most of its steps, so its mean says nothing of it)
        step_waits = {n: sorted(float(st["wait_s"]) for st in (runs[n].timeline or {}).get("steps", [])[1:]
                                if isinstance(st, dict) and isinstance(st.get("wait_s"), (int, float)))
                      for n in beside}
        low = {n: (w[len(w) // 10] if w else figs[n]["wait_s"]) for n, w in step_waits.items()}
        n_min = min(beside, key=lambda n: low[n])
        tok = float(runs[n_min].summary.get("tokens_per_step") or default_tokens)
        def per_token(n: str) -> float:  # training + publishing seconds per trained token
            return (figs[n]["train_s"] + figs[n]["sync_s"]) / float((runs[n].summary or {}).get("tokens_per_step")
                                                                    or default_tokens)

        base_tp = float(np.mean([per_token(n) for n in syncs]))
        # per token: asynchronous steps train a few % more tokens (long samples are not left out), which the model
        # simulates itself. A non-interruptible run's publish may include waiting for the servers to drain, which
        # the model simulates too: the slowdown comes from the interruptible runs when there are any
        inter = [n for n in beside if runs[n].summary.get("interruptible", True)] or beside
        factor = float(np.mean([per_token(n) for n in inter])) / base_tp if base_tp > 0 else 1.0
        handoff = low[n_min] / tok
        overlap = {"handoff_run": n_min, "handoff_s": low[n_min], "tokens_per_step": tok,
                   "train_publish_factor": factor}
    sc = dataclasses.replace(sc, batch_handoff_s_per_token=handoff, overlap_train_factor=factor)
    engine = None
    try:
        sums = [d for run in runs.values() if run.timeline for d in (step_costs_of_timeline(run.timeline) or [])]
        engine = fit_step_costs(sums) if sums else None
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise UserError(f"{path}: timeline field 'marks.step_costs': {type(e).__name__}: {e}") from None
    if engine is not None:
        sc = dataclasses.replace(sc, **engine["coef"], decode_attention=engine["decode_attention"],
                                 prefix_cache=engine["prefill_sharing"] == "batch", request_overhead_s=0.0)

        def sync_step(r: float) -> float:
            return simulate(dataclasses.replace(sc, request_overhead_s=r), "sync", scale=scale)["step_s"]

        engine["sync_step_without_overhead_s"] = t0 = sync_step(0.0)
        r = 0.0 if t0 >= f["step_s"] else _solve(sync_step, f["step_s"], 1e-7, 1.0)
        sc = dataclasses.replace(sc, request_overhead_s=r)
    else:  # no step costs: one batch-independent decode step, solved so that the simulated sync step = measured
        sc = dataclasses.replace(sc, decode_step_per_seq_s=0.0, decode_step_per_ctx_token_s=0.0, prefill_s_per_token=0.0,
                                 request_overhead_s=0.0)
        sc = dataclasses.replace(sc, decode_step_fixed_s=_solve(
            lambda a: simulate(dataclasses.replace(sc, decode_step_fixed_s=a), "sync", scale=scale)["step_s"],
            f["step_s"], 1e-6, 1.0))
    checks, sim_by_mode = {}, {}
    for name, fig in figs.items():
        eta = runs[name].eta
        if eta is None:
            eta = 0 if name == sync_run else sc.eta
        summary = runs[name].summary or {}
        mode = ("sync" if eta == 0 else "async_nointerrupt" if not summary.get("interruptible", True)
                else "async_inplace" if summary.get("pause_mode") == "in_place" else "async")
        key = (mode, eta)
        if key not in sim_by_mode:
            sim_by_mode[key] = simulate(sc, mode, eta=None if eta == 0 else eta, scale=scale)
        r = sim_by_mode[key]
        checks[name] = {"mode": mode, "eta": eta, "measured_step_s": fig["step_s"], "simulated_step_s": r["step_s"],
                        "rel_error": r["step_s"] / fig["step_s"] - 1,
                        "measured_staleness_mean": fig["staleness_mean"], "simulated_staleness_mean": r["staleness_mean"]}
    report = {"source": str(path), "sync_run": sync_run, "sync_runs": syncs, "measured": figs,
              "fitted": {k: getattr(sc, k) for k in MACHINE_FIELDS + ("trainer_overhead_s", "accept_fraction",
                                                                      "response_median_tokens")},
              "engine_step_costs": engine, "trainer_beside_generation": overlap, "checks": checks, "ratios": _ratios(figs, checks, sim_by_mode)}
    return sc, report


def _ratios(figs: dict, checks: dict, sim_by_mode: dict) -> dict:
    """Measured (mean over runs) vs simulated async/sync ratios of seconds per step, per async mode."""
    out = {}
    sync = [figs[n]["step_s"] for n, c in checks.items() if c["mode"] == "sync"]
    sim_sync = [r["step_s"] for (m, _), r in sim_by_mode.items() if m == "sync"]
    if not sync or not sim_sync:
        return out
    for (mode, eta), r in sim_by_mode.items():
        if mode == "sync":
            continue
        meas = [figs[n]["step_s"] for n, c in checks.items() if c["mode"] == mode and c["eta"] == eta]
        m, s_ = float(np.mean(sync)) / float(np.mean(meas)), sim_sync[0] / r["step_s"]
        out[f"{mode}-eta{eta}"] = {"measured": m, "simulated": s_, "rel_error": s_ / m - 1}
    return out

"""Wall-time estimates of a benchmark's plan for ``--dry-run`` (``areal bench throughput`` / ``staleness``).

Basis: a measured run of the same scenario (else of the same recipe) under ``benchmarks/results/*/results.json``,
the most recent one (:func:`find_basis`). From it, per run kind (a throughput mode, a staleness variant at its eta):
seconds per RL step (``rl_seconds / steps``, averaged over its runs), the start-up and evaluation time of a run
outside its RL steps (``(bench_seconds - warm start - all RL seconds) / runs``) and the shared warm start. A planned
run takes ``steps x seconds per step of its kind + the per-run start-up``; the plan adds the warm start.

The measured machine is named beside this one, with the cores other processes use here now (a one-second sample,
:mod:`areal_cli.bench.cpu_time`): the figures hold for the same machine, idle; a busier or smaller one is slower.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Hashable


def results_dir() -> Path:
    """``benchmarks/results`` beside the shipped scenarios (a checkout; a wheel carries none: no basis then)."""
    from areal_cli.foundations.resources import shipped_dir

    return shipped_dir("scenarios").parent / "results"


@dataclass
class Basis:
    """Timings measured by one benchmark run (see the module docstring)."""

    path: Path
    scenario: str
    recipe: str
    created: str
    machine: dict[str, Any]
    per_step: dict[Hashable, float]  # run kind -> seconds per RL step
    per_run_s: float  # a run's start-up and evaluation outside its RL steps
    warm_s: float
    same_scenario: bool
    settings: dict[str, Any] = field(default_factory=dict)  # the measured scenario's fields

    def step_s(self, kind: Hashable) -> tuple[float, bool]:
        """Seconds per step of ``kind`` and whether it was measured for ``kind`` itself; else of the nearest kind (a
        staleness variant at the nearest measured eta; an asynchronous mode: ``async``), else the mean of all."""
        if kind in self.per_step:
            return self.per_step[kind], True
        if isinstance(kind, tuple):
            same = [k for k in self.per_step if isinstance(k, tuple) and k[0] == kind[0]]
            if same:
                return self.per_step[min(same, key=lambda k: abs((k[1] or 0) - (kind[1] or 0)))], False
        elif str(kind).startswith("async") and "async" in self.per_step:
            return self.per_step["async"], False
        return sum(self.per_step.values()) / len(self.per_step), False


def run_kind(bench: str, run: dict[str, Any]) -> Hashable:
    """The kind of a run record: its mode (throughput), (variant, eta) (staleness) or preset (algorithms)."""
    if bench == "algorithms":
        return run.get("preset")
    return run.get("mode") if bench == "throughput" else (run.get("variant"), run.get("eta"))


def read_basis(path: Path, bench: str) -> Basis | None:
    """The timings of one ``results.json`` of ``bench`` ("throughput" | "staleness" | "algorithms"); None when it
    is another benchmark's file or lacks a figure."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        if {"throughput": "modes", "staleness": "grid", "algorithms": "presets"}[bench] not in d:
            return None
        runs = [r for r in d["runs"] if r.get("steps") and r.get("rl_seconds") is not None]
        warm = float((d.get("warm_start") or {}).get("seconds") or 0.0)
        total = float(d["bench_seconds"])
        sc = d["scenario"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not runs:
        return None
    steps: dict[Hashable, list[float]] = {}
    for r in runs:
        steps.setdefault(run_kind(bench, r), []).append(float(r["rl_seconds"]) / int(r["steps"]))
    per_run = max(0.0, (total - warm - sum(float(r["rl_seconds"]) for r in runs)) / len(runs))
    return Basis(path, str(sc.get("name")), str(sc.get("recipe")), str(d.get("created") or ""),
                 (d.get("machine") or {}).get("start") or {}, {k: sum(v) / len(v) for k, v in steps.items()},
                 per_run, warm, False, sc)


def find_basis(bench: str, scenario: str, recipe: str, directory: Path | None = None,
               settings: dict[str, Any] | None = None) -> Basis | None:
    """The measured run of ``scenario`` under ``directory`` (default :func:`results_dir`), else of the same
    ``recipe``, that shares most of ``settings`` (scenario fields: overrides, etas, ...), the most recent of those;
    None when there is none."""
    directory = results_dir() if directory is None else directory
    found: list[Basis] = []
    for path in sorted(directory.glob("*/results.json")) if directory.is_dir() else []:
        b = read_basis(path, bench)
        if b is not None and (b.scenario == scenario or b.recipe == recipe):
            b.same_scenario = b.scenario == scenario
            found.append(b)
    if not found:
        return None
    settings = settings or {}
    return max(found, key=lambda b: (b.same_scenario, sum(json.dumps(b.settings.get(k), sort_keys=True) ==
                                                          json.dumps(v, sort_keys=True) for k, v in settings.items()),
                                     b.created))


def cores_busy_now(seconds: float = 0.5) -> float | None:
    """Cores other processes (and the hypervisor's steal) keep busy on this machine over ``seconds`` (None where it
    cannot be measured)."""
    from areal_cli.bench.cpu_time import cpu_sample, cpu_use_between

    a = cpu_sample()
    time.sleep(seconds)
    b = cpu_sample()
    use = cpu_use_between(a, b)
    return None if use is None else round(use["other_cores"] + use["steal_cores"], 2)


@dataclass
class Estimate:
    """Estimated seconds of each planned run (``per_run``, in plan order) and of the whole plan."""

    per_run: list[float]
    total_s: float
    basis_line: str
    unmeasured: list[str]


def estimate(runs: list[tuple[Hashable, int]], basis: Basis) -> Estimate:
    """Seconds of each planned run ``(kind, steps)`` and of the plan (+ the warm start)."""
    per_run, unmeasured = [], []
    for kind, steps in runs:
        s, measured = basis.step_s(kind)
        if not measured and _kind_text(kind) not in unmeasured:
            unmeasured.append(_kind_text(kind))
        per_run.append(steps * s + basis.per_run_s)
    cpu = basis.machine.get("cpu", "?")
    cores = basis.machine.get("cpu_count", "?")
    groups: dict[str, list[float]] = {}
    for k, v in basis.per_step.items():
        groups.setdefault(k[0] if isinstance(k, tuple) else str(k), []).append(v)
    kinds = ", ".join(f"{name} {sum(v) / len(v):.3f}" + (f" ({min(v):.3f}-{max(v):.3f} over eta)" if len(v) > 1 else "")
                      for name, v in groups.items())
    other = "" if basis.same_scenario else f", another scenario of recipe {basis.recipe}"
    line = (f"basis: {basis.path} (scenario {basis.scenario}{other}, measured {basis.created[:10] or '?'} on {cpu}, "
            f"{cores} cores): warm start "
            f"{basis.warm_s:.0f} s, {basis.per_run_s:.1f} s start-up and evaluation per run, seconds per RL step: "
            f"{kinds}")
    return Estimate(per_run, basis.warm_s + sum(per_run), line, unmeasured)


def _kind_text(kind: Hashable) -> str:
    return f"{kind[0]} eta {kind[1]}" if isinstance(kind, tuple) else str(kind)


def duration(seconds: float) -> str:
    """``42 s``, ``5.1 min``, ``2.3 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def machine_line(basis: Basis | None, busy: float | None) -> str:
    """This machine beside the measured one: CPU, cores, and the cores other processes use now."""
    from areal_cli.foundations.manifest import cpu_model

    here = f"this machine: {cpu_model()}, {os.cpu_count()} cores"
    if busy is not None:
        here += f", other processes use {busy:.2f} cores now"
    if basis is not None and (basis.machine.get("cpu_count") != os.cpu_count() or
                              basis.machine.get("cpu") != cpu_model()):
        here += " (not the measured machine: expect other times)"
    elif busy is not None and busy >= 0.1:
        here += " (busy: expect longer)"
    return here


def plan_lines(bench: str, scenario: str, recipe: str, runs: list[tuple[Hashable, int]],
               directory: Path | None = None, busy: float | None = None,
               settings: dict[str, Any] | None = None) -> tuple[list[float] | None, list[str]]:
    """The per-run estimates (None without a basis: :func:`find_basis` with ``settings``) and the summary lines a
    dry run prints."""
    basis = find_basis(bench, scenario, recipe, directory, settings)
    if basis is None:
        return None, [f"estimated wall time: not estimated (no measured {bench} run of scenario {scenario} or recipe "
                      f"{recipe} under {results_dir() if directory is None else directory}; measure one: rerun "
                      f"without --dry-run with --steps 2, and keep its results.json there)",
                      machine_line(None, busy)]
    est = estimate(runs, basis)
    lines = [f"estimated wall time: {duration(est.total_s)} (warm start {duration(basis.warm_s)} + {len(runs)} runs: "
             f"steps x measured seconds per step of the run's kind + start-up per run)", "  " + est.basis_line]
    if est.unmeasured:
        lines.append(f"  not measured in the basis: {', '.join(est.unmeasured)} (the nearest kind's time is used)")
    lines.append("  " + machine_line(basis, busy))
    return est.per_run, lines

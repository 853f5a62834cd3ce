"""What every measured benchmark needs around its recipe runs: the machine it ran on, each run's console to a
file, and a scenario's recipe overrides as ``key=value`` items."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

from areal_cli.foundations.errors import UserError


def machine_description() -> dict:
    """CPU model, core counts, load average, memory, Python/torch versions of this machine."""
    from areal_cli.foundations.manifest import cpu_model, memory_bytes

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


def override_items(overrides: dict[str, Any]) -> list[str]:
    """``key=value`` items of ``overrides`` (strings as they are, other values as JSON) for ``apply_overrides``;
    a section written as a mapping (``rollout: {group_size: 2}``) gives one item per key."""
    from areal_cli.config import SECTIONS

    flat: dict[str, Any] = {}
    for k, v in overrides.items():
        if k in SECTIONS and isinstance(v, dict) and not (k == "task" and not v):
            flat.update({f"{k}.{sub}": x for sub, x in v.items()})
        else:
            flat[k] = v
    return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in flat.items()]


#: Settings a benchmark sets for every run itself (what sets them): a ``-o`` of one of them would be replaced.
PER_RUN = {"seed": "the repeat / seed of the plan", "model.path": "the shared warm start",
           "sft.max_steps": "the shared warm start", "loop.max_steps": "the scenario's steps",
           "loop.eval_every": "the scenario's accuracy_every", "loop.target_accuracy": "the benchmark (0: no early stop)",
           "loop.eval_deferred": "the benchmark (true: evaluations after the RL loop)",
           "loop.time_limit_s": "the benchmark (0)", "rollout.max_head_offpolicyness": "the scenario's eta (etas, eta_sync / eta_async)",
           "parallel.trainer_cpus": "the scenario's cpus",
           "parallel.server_cpus": "the scenario's cpus", "parallel.controller_cpus": "the scenario's cpus"}

#: What every run of a benchmark sets (no early stop, no time limit, evaluations after the loop), and what it is
#: validated with before any work: deferred evaluations refuse early stopping, checkpoints and in-loop benchmarks.
RUN_CHECK_ITEMS = ["loop.target_accuracy=0", "loop.eval_deferred=true", "loop.time_limit_s=0"]

#: What ``areal bench throughput`` sets per run on top of :data:`PER_RUN` (its modes).
PER_RUN_THROUGHPUT = {**PER_RUN,
                      "rollout.interruptible": "the mode of the run (compare_interruptible, --no-interruptible-compare)",
                      "rollout.pause_mode": "the mode of the run (compare_in_place, --in-place-compare)"}


def _dotted(written: str) -> str:
    """The dotted setting a scenario key names: itself, or the key of a flat name of earlier releases (unknown
    keys unchanged: the recipe's validation reports them)."""
    from areal_cli.config import FLAT_NAMES, KEYS

    return written if written in KEYS else FLAT_NAMES.get(written, written)


def refuse_per_run_scenario_overrides(scenario: Any, per_run: dict[str, str]) -> None:
    """Refuse a scenario ``overrides`` / ``sync_overrides`` entry for a setting the benchmark sets for every run
    (``per_run``): it would be replaced without a word.

    Raises:
        UserError: ``file:line: field 'overrides.KEY': set by ... for every run``.
    """
    for section in ("overrides", "sync_overrides"):
        for written in getattr(scenario, section, None) or {}:
            dotted = _dotted(written)
            if dotted in per_run:
                where = scenario.locations.get(f"{section}.{written}", scenario.source)
                raise UserError(f"{where}: field '{section}.{written}': set by {per_run[dotted]} for every run; "
                                f"remove it from the scenario")


def refuse_per_run_overrides(extra: list[str], per_run: dict[str, str] = PER_RUN) -> None:
    """Refuse a ``-o`` of a setting the benchmark sets for every run (``per_run``, default :data:`PER_RUN`): it
    would be replaced without a word.

    Raises:
        UserError: ``-o ITEM: field 'KEY': set by ... for every run; change the scenario instead``.
    """
    from areal_cli.config import resolve_key

    for item in extra:
        key = item.split("=", 1)[0].strip()
        dotted, _ = resolve_key(key, f"-o {item}")
        if dotted in per_run:
            raise UserError(f"-o {item}: field '{dotted}': set by {per_run[dotted]} for every run; change the "
                            f"scenario (--scenario FILE) instead")


def override_locations(data: Any, path: Path, sections: tuple[str, ...] = ("overrides", "sync_overrides")) -> dict:
    """``{"overrides.KEY": "file:line"}`` for the recipe overrides of a scenario file (``data`` as read by
    :func:`~areal_cli.foundations.typed_yaml.read_yaml`: mappings that carry their keys' lines)."""
    out = {}
    for section in sections:
        mapping = data.get(section) if isinstance(data, dict) else None
        lines = getattr(mapping, "lines", {}) or {}
        for key, line in lines.items():
            out[f"{section}.{key}"] = f"{path}:{line}"
    return out


def located(err: UserError, sections: dict[str, dict], locations: dict[str, str]) -> UserError:
    """``err`` (a recipe-validation error naming ``field 'KEY'``, a dotted setting) pointed at the scenario line
    that set KEY (as a dotted key or a flat name of earlier releases) in one of ``sections``
    (``{"overrides": {...}}``), when ``locations`` knows it; else ``err`` unchanged."""
    m = re.search(r"field '([^']+)': (.*)$", str(err), re.S)
    if m:
        key, why = m.groups()
        for section, mapping in sections.items():
            for written in mapping:
                if key in (written, _dotted(written)) and f"{section}.{written}" in locations:
                    return UserError(f"{locations[f'{section}.{written}']}: field '{section}.{written}': {why}")
    return err


def cpu_overrides(cpus: dict[str, str]) -> list[str]:
    """A scenario's CPU split (``{trainer, server, controller}``) as ``-o`` items."""
    return [f"parallel.trainer_cpus={cpus['trainer']}", f"parallel.server_cpus={cpus['server']}",
            f"parallel.controller_cpus={cpus['controller']}"]


def check_out_dir(out: Path) -> None:
    """Refuse an ``--out`` that is a file or already holds a benchmark.

    Raises:
        UserError: one line naming ``out``.
    """
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: --out exists and is not a directory")
    if (out / "results.json").exists() or (out / "warm").exists():
        raise UserError(f"{out}: already holds a benchmark; choose another --out")


def shared_warm_start(cfg, out: Path, log, recipe: str) -> dict:
    """The one supervised warm start every run of a benchmark starts from: ``cfg`` (``recipe``'s, with
    ``loop.max_steps=0``) trained into ``out/warm`` (console in ``out/warm/console.log``). Returns the run summary's ``warm_start`` plus
    ``weights`` (the last SFT checkpoint's folder).

    Raises:
        RuntimeError: the warm start left no weights.
    """
    from areal_cli.config import flush_notes
    from areal_cli.train_loop import run_training

    flush_notes()  # every run's settings were checked: the deprecation notes, if any, now

    log(f"warm start ({recipe})")
    with output_to(out / "warm" / "console.log"):
        summary = run_training(cfg, out / "warm", live=False)
    weights = sorted((out / "warm" / "weights").glob("sft-step*"))
    if not weights:
        raise RuntimeError(f"the warm start left no weights in {out / 'warm' / 'weights'}")
    warm = {**summary["warm_start"], "weights": str(weights[-1])}
    log(f"warm start: {warm['steps']} steps, {warm['seconds']:.1f} s, accuracy {warm['accuracy']:.3f}")
    return warm


@contextlib.contextmanager
def output_to(path: Path):
    """Send this process's stdout (the run's status lines and summary table) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f, contextlib.redirect_stdout(f):
        yield

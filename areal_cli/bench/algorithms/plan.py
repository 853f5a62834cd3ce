"""The settings of ``areal bench algorithms`` (recipe, presets, seeds, steps, target), its run order and the
recipe configuration of each run.

Each preset's own keys (:data:`areal_cli.config.algorithms.ALGORITHMS`) are written as overrides after the recipe,
so a recipe that sets one of them (tiny-arith sets ``ppo.eps_clip: 0.2``) does not shadow the preset; ``-o`` items
come last and win over both (the keys in force are recorded per preset in results.json).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from areal_cli.bench.runs import (PER_RUN, RUN_CHECK_ITEMS, check_out_dir, cpu_overrides, override_items,
                                  refuse_per_run_overrides)
from areal_cli.foundations.errors import UserError

#: The presets run by default, in plan order.
DEFAULT_PRESETS = ["grpo", "ppo", "dr_grpo", "dapo", "gspo", "rloo", "cispo"]

#: Recipe fields every run (and the warm start) gets: the success-rate filter off, so that every preset trains on
#: the same sampled groups and ``zero_std_group_frac`` is the share of dead groups each one trains on; the
#: controller in its own process, as in ``areal bench throughput``.
DEFAULT_OVERRIDES: dict[str, Any] = {"rollout.success_rate_lb": 0.0, "rollout.success_rate_ub": 1.0,
                                     "parallel.rollout_process": True}

#: What this benchmark sets per run on top of :data:`~areal_cli.bench.runs.PER_RUN`.
PER_RUN_ALGORITHMS = {**PER_RUN, "ppo.algorithm": "--presets (one preset per run)"}
PER_RUN_ALGORITHMS.pop("rollout.max_head_offpolicyness")  # eta is the recipe's (or -o): every preset the same


@dataclass
class Settings:
    """One ``areal bench algorithms`` grid.

    Attributes:
        recipe: recipe name or path (default ``tiny-arith``); its eta (``rollout.max_head_offpolicyness``) is used.
        presets: ``ppo.algorithm`` values, in plan order.
        seeds: runs per preset; repeat r uses seed ``recipe seed + r``.
        steps: RL steps per run (no early stop).
        accuracy_every: held-out accuracy every this many steps (evaluated after the RL loop).
        target_accuracy: accuracy of the time-to-target figure; None = the recipe's ``loop.target_accuracy``.
        cpus: ``trainer`` / ``server`` / ``controller`` cpu lists ("" = no pinning).
        overrides: recipe fields for every run and the warm start.
    """

    recipe: str = "tiny-arith"
    presets: list[str] = field(default_factory=lambda: list(DEFAULT_PRESETS))
    seeds: int = 3
    steps: int = 60
    accuracy_every: int = 5
    target_accuracy: float | None = None
    cpus: dict[str, str] = field(default_factory=lambda: {"trainer": "0", "server": "1", "controller": "1"})
    overrides: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_OVERRIDES))

    def to_dict(self) -> dict:
        """The settings as results.json records them."""
        return asdict(self)


def check_settings(s: Settings) -> None:
    """Refuse an unknown preset, a repeated one, ``steps`` or ``seeds`` below 1, a target outside (0, 1].

    Raises:
        UserError: one line naming the option.
    """
    from areal_cli.config.algorithms import ALGORITHMS

    unknown = [p for p in s.presets if p not in ALGORITHMS]
    if not s.presets or unknown:
        raise UserError(f"--presets: unknown preset '{(unknown or [''])[0]}' (known: {', '.join(ALGORITHMS)})")
    if len(set(s.presets)) != len(s.presets):
        raise UserError(f"--presets: a preset is named twice ({','.join(s.presets)})")
    if s.steps < 1:
        raise UserError(f"--steps: must be >= 1 (got {s.steps})")
    if s.seeds < 1:
        raise UserError(f"--seeds: must be >= 1 (got {s.seeds})")
    if s.target_accuracy is not None and not 0 < s.target_accuracy <= 1:
        raise UserError(f"--target: must be in (0, 1] (got {s.target_accuracy})")


def run_plan(s: Settings) -> list[tuple[int, str]]:
    """``[(repeat, preset), ...]`` in run order: seed-major (every preset once per seed, so that drift of the
    machine over the benchmark hits every preset alike), the preset order reversed on odd repeats (ABBA: a
    preset's position within a seed's round averages out)."""
    out = []
    for rep in range(s.seeds):
        order = s.presets if rep % 2 == 0 else list(reversed(s.presets))
        out.extend((rep, p) for p in order)
    return out


def run_label(i: int, rep: int, preset: str) -> str:
    """A run's folder name: ``003-dapo-r1``."""
    return f"{i:03d}-{preset}-r{rep}"


def preset_items(preset: str) -> list[str]:
    """``ppo.algorithm=PRESET`` and the preset's own keys as override items (so a recipe's value of one of those
    keys does not shadow the preset)."""
    from areal_cli.config.algorithms import ALGORITHMS

    return [f"ppo.algorithm={preset}", *override_items(ALGORITHMS[preset])]


def run_cfg(s: Settings, extra: list[str], items: list[str], preset: str | None = None):
    """The recipe's config with the settings' overrides, ``preset``'s keys, ``extra`` (``-o``) and then
    ``items`` (what the benchmark sets per run) applied and validated."""
    from areal_cli.config import apply_overrides
    from areal_cli.recipes import load_train_config

    cfg, _ = load_train_config(s.recipe)
    pre = preset_items(preset) if preset else []
    return apply_overrides(cfg, override_items(s.overrides) + pre + list(extra) + items, source="bench algorithms / -o")


def keys_in_force(cfg) -> dict[str, Any]:
    """The values a run trains with of every key some preset fills, plus ``ppo.kl_ctl`` and the eta."""
    from areal_cli.config.algorithms import PRESET_KEYS

    out = {"ppo.algorithm": cfg.ppo.algorithm}
    for key in (*PRESET_KEYS, "ppo.kl_ctl"):
        sec, name = key.split(".", 1)
        out[key] = getattr(getattr(cfg, sec), name)
    out["rollout.max_head_offpolicyness"] = cfg.rollout.max_head_offpolicyness
    return out


def check_configs(s: Settings, extra: list[str], out: Path | None = None):
    """Check the settings and build every preset's configuration with ``extra`` (``-o``) before any work (also in
    ``--dry-run``): bad input, a refused preset combination, cpus this process may not use, a run that cannot
    start here, an ``out`` that holds a benchmark. Returns ``(base config, {preset: keys in force})``.

    Raises:
        UserError: one line (naming the preset where a preset's configuration is refused).
    """
    from areal_cli.train_loop import preflight
    from areal_cli.train_loop.processes import check_cpus

    check_settings(s)
    if out is not None:
        check_out_dir(out)
    try:
        refuse_per_run_overrides(extra, PER_RUN_ALGORITHMS)
    except UserError as e:  # the shared message points at a scenario file, which this benchmark has not
        raise UserError(str(e).split("; change the scenario")[0] + "; use the options of areal bench algorithms "
                        "(--presets, --seeds, --steps, --accuracy-every)") from None
    cpu_items = cpu_overrides(s.cpus)
    base = run_cfg(s, extra, cpu_items)
    if base.rollout.max_head_offpolicyness < 1:
        raise UserError(f"{s.recipe}: rollout.max_head_offpolicyness is {base.rollout.max_head_offpolicyness}: the "
                        "benchmark compares the presets asynchronously (eta > 0); set -o "
                        "rollout.max_head_offpolicyness=N")
    check_cpus(base)
    preflight(base)
    keys = {}
    for p in s.presets:
        try:
            keys[p] = keys_in_force(run_cfg(s, extra, cpu_items + RUN_CHECK_ITEMS, preset=p))
        except UserError as e:
            raise UserError(f"preset '{p}': {e}") from None
    return base, keys


def target_of(s: Settings, base_cfg) -> tuple[float | None, str]:
    """The target accuracy and where it comes from (``--target``, else the recipe's ``loop.target_accuracy``)."""
    if s.target_accuracy is not None:
        return s.target_accuracy, "--target"
    t = base_cfg.loop.target_accuracy
    return (t, f"the recipe's loop.target_accuracy ({s.recipe})") if t else (None, "none (the recipe sets none)")

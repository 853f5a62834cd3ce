"""A staleness ablation scenario: the grid of eta x loss variant, its YAML files and its run order.

The loss variants are recipe overrides (:data:`VARIANTS`); eta = 0 runs once per seed as :data:`SYNC` (standard
PPO, :data:`SYNC_OVERRIDES`), standing for every variant.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from areal_cli.foundations.errors import UserError
from areal_cli.foundations.typed_yaml import unknown_key

#: Built-in variants: recipe overrides on top of the scenario's (eta = 0 runs once, as ``sync``).
VARIANTS: dict[str, dict[str, Any]] = {
    "naive": {"ppo.recompute_proximal": False},
    "decoupled": {"ppo.recompute_proximal": True, "ppo.behav_imp_weight_mode": "token_mask",
                  "ppo.behav_imp_weight_lower": 0.0},
    "decoupled-none": {"ppo.recompute_proximal": True, "ppo.behav_imp_weight_mode": "disabled",
                       "ppo.behav_imp_weight_lower": 0.0},
    "decoupled-token_truncate": {"ppo.recompute_proximal": True, "ppo.behav_imp_weight_mode": "token_truncate",
                                 "ppo.behav_imp_weight_lower": 0.0},
    "decoupled-sequence_mask": {"ppo.recompute_proximal": True, "ppo.behav_imp_weight_mode": "sequence_mask",
                                "ppo.behav_imp_weight_lower": 0.0},
    "decoupled-sequence_truncate": {"ppo.recompute_proximal": True, "ppo.behav_imp_weight_mode": "sequence_truncate",
                                    "ppo.behav_imp_weight_lower": 0.0},
    "decoupled-icepop": {"ppo.recompute_proximal": True, "ppo.behav_imp_weight_mode": "token_mask",
                         "ppo.behav_imp_weight_lower": 0.5},
}
#: The synchronous run (eta = 0) every variant shares.
SYNC = "sync"
SYNC_OVERRIDES = {"ppo.recompute_proximal": False}

DEFAULT_SCENARIO: dict[str, Any] = {
    "name": "staleness-tiny-longtail",
    "recipe": "tiny-longtail",
    "etas": [0, 1, 2, 4, 8, 16],
    "variants": ["decoupled", "naive", "decoupled-none"],
    "steps": 40,
    "seeds": 2,
    "accuracy_every": 5,
    "target_accuracy": None,
    "cpus": {"trainer": "0", "server": "1", "controller": "1"},
    "overrides": {"rollout.success_rate_lb": 0.0, "rollout.success_rate_ub": 1.0, "parallel.rollout_process": True,
                  "rollout.stale_groups": "train", "ppo.n_minibatches": 4, "rollout.pause_mode": "in_place"},
}


@dataclass
class Scenario:
    """One staleness ablation.

    Attributes:
        recipe: recipe name or path (a built-in task; default ``tiny-longtail``).
        etas: ``rollout.max_head_offpolicyness`` values; 0 runs once per seed (the synchronous baseline).
        variants: ``{name: recipe overrides}`` of the loss variants (names of :data:`VARIANTS`, or your own).
        steps: RL steps per run (no early stop).
        seeds: runs per grid point; repeat r uses seed ``recipe seed + r``.
        accuracy_every: held-out accuracy every this many steps (the curve for the time to target).
        target_accuracy: accuracy of the time-to-target figure; None = the eta-0 runs' mean final accuracy.
        cpus: ``trainer`` / ``server`` / ``controller`` cpu lists ("" = no pinning).
        overrides: recipe fields for every run (and the warm start).
    """

    name: str
    recipe: str
    etas: list[int]
    variants: dict[str, dict[str, Any]]
    steps: int
    seeds: int
    accuracy_every: int
    target_accuracy: float | None
    cpus: dict[str, str]
    overrides: dict[str, Any]
    source: str = "built-in"
    # "overrides.KEY" -> "file:line" of that override (errors the recipe's validation raises point there)
    locations: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def n_runs(self) -> int:
        """Runs of the grid: per seed, one eta-0 run and one per (eta > 0, variant)."""
        return self.seeds * ((0 in self.etas) + len([e for e in self.etas if e > 0]) * len(self.variants))


def scenario_from_dict(data: Any, where: Callable[[str], str]) -> Scenario:
    """Validate a scenario mapping (missing keys from :data:`DEFAULT_SCENARIO`; variant names of :data:`VARIANTS`
    or ``{name: recipe overrides}``); ``where(key)`` names the location of ``key`` for error messages.

    Raises:
        UserError: unknown key or bad value (``where(key): field 'x': ...``).
    """
    if not isinstance(data, dict):
        raise UserError(f"{where('')}: a scenario must be a mapping")
    known = {f.name for f in dataclasses.fields(Scenario)} - {"source", "locations"}
    for k in data:
        if k not in known:
            raise unknown_key(where(k), k, known)
    merged = {**DEFAULT_SCENARIO, **data}

    def bad(key: str, why: str) -> UserError:
        return UserError(f"{where(key)}: field '{key}': expected {why}, got {merged[key]!r}")

    def need_int(key: str, lo: int) -> int:
        v = merged[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise bad(key, f"an int >= {lo}")
        return v

    name = merged["name"]
    if not isinstance(name, str) or not name:
        raise bad("name", "a name")
    recipe = merged["recipe"]
    if not isinstance(recipe, str) or not recipe:
        raise bad("recipe", "a recipe name or path")
    etas = merged["etas"]
    if not isinstance(etas, list) or not etas or any(isinstance(e, bool) or not isinstance(e, int) or e < 0
                                                     for e in etas) or len(set(etas)) != len(etas):
        raise bad("etas", "a list of distinct ints >= 0")
    raw = merged["variants"]
    variants: dict[str, dict[str, Any]] = {}
    if isinstance(raw, list) and raw and all(isinstance(v, str) for v in raw):
        for v in raw:
            if v not in VARIANTS:
                raise UserError(f"{where('variants')}: field 'variants': unknown variant '{v}' (built in: "
                                f"{', '.join(VARIANTS)}; or a mapping name -> recipe overrides)")
            variants[v] = dict(VARIANTS[v])
    elif isinstance(raw, dict) and raw:
        for k, v in raw.items():
            if not isinstance(k, str) or k == SYNC or not (v is None or isinstance(v, dict)):
                raise bad("variants", f"a mapping of names (not '{SYNC}') to recipe overrides")
            variants[k] = dict(VARIANTS.get(k, {})) if v is None else dict(v)
    else:
        raise bad("variants", "a list of variant names or a mapping name -> recipe overrides")
    if len(set(variants)) != len(variants):
        raise bad("variants", "distinct names")
    steps = need_int("steps", 1)
    seeds = need_int("seeds", 1)
    acc_every = need_int("accuracy_every", 1)
    target = merged["target_accuracy"]
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                               or not 0 < target <= 1):
        raise bad("target_accuracy", "a fraction in (0, 1] or null")
    cpus = merged["cpus"]
    if not isinstance(cpus, dict) or any(k not in ("trainer", "server", "controller") or isinstance(v, bool)
                                         or not isinstance(v, (str, int)) for k, v in cpus.items()):
        raise bad("cpus", "keys trainer/server/controller with cpu lists")
    cpus = {k: str(cpus.get(k, "")) for k in ("trainer", "server", "controller")}
    overrides = merged["overrides"]
    if not isinstance(overrides, dict):
        raise bad("overrides", "a mapping of recipe fields")
    return Scenario(name, recipe, list(etas), variants, steps, seeds, acc_every,
                    None if target is None else float(target), cpus, dict(overrides))


def load_scenario(path: str | Path) -> Scenario:
    """Read a staleness scenario YAML (keys of :class:`Scenario`; missing keys take :data:`DEFAULT_SCENARIO`'s
    values); a bare name is looked up in the shipped scenarios.

    Raises:
        UserError: unreadable file, invalid YAML, unknown key or bad value (``file:line: field 'x': ...``).
    """
    from areal_cli.bench.throughput.scenario import read_scenario

    return read_scenario(path, scenario_from_dict, "staleness")


def default_scenario() -> Scenario:
    """The built-in scenario (``benchmarks/scenarios/staleness-tiny-longtail.yaml`` holds the same values)."""
    return scenario_from_dict(json.loads(json.dumps(DEFAULT_SCENARIO)), lambda k: "built-in scenario")


def run_plan(scenario: Scenario) -> list[tuple[int, int, str]]:
    """``(repeat, eta, variant)`` in execution order: per repeat, eta ascending (eta 0 as ``sync``), the variants
    of one eta next to each other (in reversed order on odd repeats, so that a drift of the machine's speed does
    not always favour the same variant)."""
    names = list(scenario.variants)
    plan: list[tuple[int, int, str]] = []
    for r in range(scenario.seeds):
        for eta in sorted(scenario.etas):
            if eta == 0:
                plan.append((r, 0, SYNC))
            else:
                plan += [(r, eta, v) for v in (names if r % 2 == 0 else names[::-1])]
    return plan


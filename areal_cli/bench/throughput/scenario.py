"""A throughput benchmark scenario: the recipe, the overrides shared by every run, and the run plan.

Read from ``benchmarks/scenarios/*.yaml`` (:func:`load_scenario`; missing keys take the built-in values of
:data:`DEFAULT_SCENARIO`); :func:`run_plan` orders the runs ABBA so that a linear drift of the machine cancels.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from areal_cli.foundations.errors import UserError
from areal_cli.bench.runs import override_locations
from areal_cli.foundations.typed_yaml import LineDict, read_yaml, unknown_key

MODES = ("sync", "async", "async_noninterruptible", "async_in_place")

#: ``rollout.pause_mode`` of a mode's runs (an interruptible update of ``async_in_place`` keeps the KV of
#: in-flight samples; every other mode's updates abort them, or, non-interruptible, wait for them).
PAUSE_MODE = {"async_in_place": "in_place"}

# The built-in scenario; benchmarks/scenarios/throughput-tiny-arith.yaml holds the same values with the
# reasons for each (a test keeps the two equal).
DEFAULT_SCENARIO: dict[str, Any] = {
    "name": "throughput-tiny-arith",
    "recipe": "tiny-arith",
    "steps": 40,
    "repeats": 4,
    "eta_sync": 0,
    "eta_async": 2,
    "compare_interruptible": True,
    "compare_in_place": False,
    "accuracy_every": 5,
    "seed_per_repeat": True,
    "cpus": {"trainer": "0", "server": "1", "controller": "1"},
    "overrides": {"rollout.success_rate_lb": 0.0, "rollout.success_rate_ub": 1.0, "rollout.batch_size": 48,
                  "rollout.group_size": 3, "parallel.rollout_process": True},
    "generate_compare": {"n_prompts": 32, "min_new_tokens": 16, "max_new_tokens": 256, "seed": 0,
                         "hf_per_prompt": True},
    "target_async_over_sync": 1.8,
    "sync_overrides": {},
}

_GEN_KEYS = {"n_prompts": int, "min_new_tokens": int, "max_new_tokens": int, "seed": int, "hf_per_prompt": bool}


@dataclass
class Scenario:
    """One throughput benchmark: the recipe, the overrides shared by every run, and the run plan.

    Attributes:
        steps: RL steps per run (every run trains exactly this many; no early stop).
        repeats: how many times each mode runs (interleaved, ABBA order).
        eta_sync, eta_async: ``rollout.max_head_offpolicyness`` of the two modes.
        compare_interruptible: also run async with non-interruptible weight updates.
        compare_in_place: also run async with in-place interruptible updates (``rollout.pause_mode: in_place``:
            in-flight samples keep their KV cache across a weight update instead of being aborted and
            re-prefilled; PipelineRL's in-flight weight updates), mode ``async_in_place``.
        accuracy_every: held-out accuracy every this many steps (0: after the last step only); gives each
            run's accuracy curve against RL time and the time-to-equal-accuracy ratio.
        seed_per_repeat: repeat ``r`` runs every mode with ``seed = recipe seed + r`` (training problems and
            sampling), so the repeats sample the run-to-run spread of accuracy and each sync/async pair shares
            its seed; False: every run uses the recipe seed (repeats then differ only by timing).
        cpus: ``trainer`` / ``server`` / ``controller`` Linux cpu lists ("" = no pinning).
        overrides: recipe fields set for every run (and the warm start).
        generate_compare: workload of :func:`compare_generation`, or None to skip it.
        target_async_over_sync: the async/sync target of this workload (effective throughput at equal accuracy,
            and time to equal accuracy): 1.8 for tiny-arith, 2.5 for the long-tail scenario.
        sync_overrides: recipe fields set for the sync runs only, after ``overrides`` (e.g. ``recompute_proximal:
            false``: with eta = 0 every token of a batch comes from the policy being trained, so the proximal pass
            of decoupled PPO recomputes the behaviour logprobs; AReaL's synchronous baseline is standard PPO).
    """

    name: str
    recipe: str
    steps: int
    repeats: int
    eta_sync: int
    eta_async: int
    compare_interruptible: bool
    accuracy_every: int
    seed_per_repeat: bool
    cpus: dict[str, str]
    overrides: dict[str, Any]
    generate_compare: dict[str, Any] | None
    target_async_over_sync: float = 1.8
    sync_overrides: dict[str, Any] = field(default_factory=dict)
    compare_in_place: bool = False
    source: str = "built-in"
    # "overrides.KEY" -> "file:line" of that override (errors the recipe's validation raises point there)
    locations: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def scenario_from_dict(data: Any, where: Callable[[str], str]) -> Scenario:
    """Validate a scenario mapping; ``where(key)`` names the location of ``key`` for error messages."""
    if not isinstance(data, dict):
        raise UserError(f"{where('')}: a scenario must be a mapping")
    known = {f.name for f in dataclasses.fields(Scenario)} - {"source", "locations"}
    for k in data:
        if k not in known:
            raise unknown_key(where(k), k, known)
    merged = {**DEFAULT_SCENARIO, **data}

    def need(key: str, typ: type, ok: Callable[[Any], bool] = lambda v: True, why: str = "") -> Any:
        v = merged[key]
        if typ is int and isinstance(v, bool) or not isinstance(v, typ) or not ok(v):
            raise UserError(f"{where(key)}: field '{key}': expected {why or typ.__name__}, got {v!r}")
        return v

    name = need("name", str)
    recipe = need("recipe", str, lambda v: bool(v), "a recipe name or path")
    steps = need("steps", int, lambda v: v >= 1, "an int >= 1")
    repeats = need("repeats", int, lambda v: v >= 1, "an int >= 1")
    eta_sync = need("eta_sync", int, lambda v: v >= 0, "an int >= 0")
    eta_async = need("eta_async", int, lambda v: v >= 1, "an int >= 1")
    compare = need("compare_interruptible", bool)
    acc_every = need("accuracy_every", int, lambda v: v >= 0, "an int >= 0")
    seed_per_repeat = need("seed_per_repeat", bool)
    cpus = need("cpus", dict)
    for k, v in cpus.items():
        if k not in ("trainer", "server", "controller"):
            raise unknown_key(where("cpus"), k, ("trainer", "server", "controller"), prefix="cpus")
        if not isinstance(v, (str, int)) or isinstance(v, bool):
            raise UserError(f"{where('cpus')}: field 'cpus': keys trainer/server/controller with cpu lists, "
                            f"got {k}: {v!r}")
    cpus = {k: str(cpus.get(k, "")) for k in ("trainer", "server", "controller")}
    overrides = need("overrides", dict)
    gen = merged["generate_compare"]
    if gen is False or gen is None:
        gen = None
    else:
        if not isinstance(gen, dict):
            raise UserError(f"{where('generate_compare')}: field 'generate_compare': a mapping or false")
        gen = {**DEFAULT_SCENARIO["generate_compare"], **gen}
        for k, v in gen.items():
            typ = _GEN_KEYS.get(k)
            if typ is None:
                raise unknown_key(where('generate_compare'), k, _GEN_KEYS, prefix="generate_compare")
            if not isinstance(v, typ) or (typ is int and (isinstance(v, bool) or v < (k != "seed"))):
                raise UserError(f"{where('generate_compare')}: field 'generate_compare.{k}': bad value {v!r}")
        if gen["min_new_tokens"] > gen["max_new_tokens"]:
            raise UserError(f"{where('generate_compare')}: field 'generate_compare': min_new_tokens > max_new_tokens")
    target = merged["target_async_over_sync"]
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not target > 0:
        raise UserError(f"{where('target_async_over_sync')}: field 'target_async_over_sync': expected a number > 0, "
                        f"got {target!r}")
    sync_overrides = need("sync_overrides", dict)
    in_place = need("compare_in_place", bool)
    return Scenario(name, recipe, steps, repeats, eta_sync, eta_async, compare, acc_every, seed_per_repeat, cpus,
                    dict(overrides), gen, float(target), dict(sync_overrides), in_place)


def resolve_scenario_path(path: str | Path) -> Path:
    """``path`` itself when it exists; else a bare name (``throughput-tiny-longtail``) is looked up as
    ``NAME.yaml`` in the shipped scenarios (``benchmarks/scenarios/``, or ``$AREAL_SCENARIOS_DIR``).

    Raises:
        UserError: a bare name that is neither a file nor a shipped scenario (the shipped names listed)."""
    p = Path(path)
    if p.exists() or len(p.parts) != 1:
        return p
    from areal_cli.bench.sim.scenario import scenarios_dir

    named = scenarios_dir() / (p.name if p.suffix == ".yaml" else f"{p.name}.yaml")
    if named.is_file():
        return named
    shipped = sorted(f.stem for f in scenarios_dir().glob("*.yaml"))
    raise UserError(f"{path}: no such file, nor a shipped scenario of that name (shipped: {', '.join(shipped)})")


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario YAML (keys of :class:`Scenario`; missing keys take the built-in values). A bare name
    is looked up in the shipped scenarios (:func:`resolve_scenario_path`).

    Raises:
        UserError: unreadable file, invalid YAML, unknown key or bad value (``file:line: field 'x': ...``).
    """
    return read_scenario(path, scenario_from_dict)


def read_scenario(path: str | Path, from_dict: Callable[[dict, Callable[[str], str]], Any],
                  kind: str = "throughput") -> Any:
    """A benchmark scenario read from ``path`` (a file, or a shipped name: :func:`resolve_scenario_path`) by
    ``from_dict(data, where)`` (``where(key)`` gives ``file:line``), with its ``source`` and the
    ``locations`` of its recipe overrides set.

    An optional top-level ``kind:`` names the benchmark the file is for
    (:data:`areal_cli.bench.sim.scenario.SCENARIO_KINDS`): ``kind`` itself
    is accepted and dropped; another benchmark's kind (a ``kind: simulate`` cluster-model scenario given to
    ``areal bench throughput``) is refused with one line naming the command that reads it.

    Raises:
        UserError: unreadable file, invalid YAML, a scenario of another kind, or what ``from_dict`` raises.
    """
    from areal_cli.bench.sim.scenario import SCENARIO_KINDS

    p = resolve_scenario_path(path)
    data = read_yaml(p, "scenario")
    lines = dict(data.lines) if isinstance(data, LineDict) else {}
    if isinstance(data, dict) and "kind" in data:
        other = data.pop("kind")
        if other != kind:
            reads = SCENARIO_KINDS.get(other) if isinstance(other, str) else None
            raise UserError(f"{p}:{lines.get('kind', 1)}: field 'kind': " + (
                f"'{other}' is a scenario of `{reads} {p}`, not of `{SCENARIO_KINDS[kind]}`" if reads else
                f"expected {kind} (or no kind), got {other!r}"))
    sc = from_dict(data if data is not None else {}, lambda k: f"{p}:{lines.get(k, 1)}")
    sc.source = str(p)
    sc.locations = override_locations(data, p)
    return sc


def default_scenario(recipe: str | None = None) -> Scenario:
    """The built-in scenario (tiny-arith), optionally for another ``recipe``."""
    sc = scenario_from_dict(json.loads(json.dumps(DEFAULT_SCENARIO)), lambda k: "built-in scenario")
    if recipe:
        sc.recipe = recipe
    return sc


def run_plan(scenario: Scenario) -> list[tuple[int, str]]:
    """``(repeat, mode)`` in execution order: ABBA interleaving (odd repeats reversed)."""
    modes = (["sync", "async"] + (["async_noninterruptible"] if scenario.compare_interruptible else [])
             + (["async_in_place"] if scenario.compare_in_place else []))
    plan = []
    for r in range(scenario.repeats):
        plan += [(r, m) for m in (modes if r % 2 == 0 else modes[::-1])]
    return plan


""":class:`TrainConfig`: every setting of an ``areal train`` run, in sections (:mod:`areal_cli.config.sections`)."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from areal_cli.config.keys import FLAT_NAMES, KEYS, TOP_LEVEL, note_flat_names, read_mapping, set_value
from areal_cli.config.sections import (CriticSection, LoopSection, ModelSection, ParallelSection, PPOSection, RolloutSection,
                                       SECTIONS, SftSection, TaskSection)


@dataclass
class TrainConfig:
    """Every setting of an ``areal train`` run: two identity fields and eight sections.

    Read from a recipe (:func:`areal_cli.recipes.load_train_config`) and ``-o section.field=value`` overrides
    (:func:`areal_cli.config.apply_overrides`); written to a run's ``config.json`` by :meth:`to_dict` and read
    back by :meth:`from_dict`. ``cfg.rollout.group_size``, ``cfg.ppo.lr``: the flat attribute names of earlier
    releases (``cfg.group_size``) raise an ``AttributeError`` that names the new one.
    """

    recipe: str = "tiny-arith"
    """Name of the run's recipe (a train config file: its stem unless it says otherwise)."""
    seed: int = 1
    """Seed of the warm start, sampling, data order and held-out split."""
    model: ModelSection = field(default_factory=ModelSection)
    task: TaskSection = field(default_factory=TaskSection)
    sft: SftSection = field(default_factory=SftSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    ppo: PPOSection = field(default_factory=PPOSection)
    critic: CriticSection = field(default_factory=CriticSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    loop: LoopSection = field(default_factory=LoopSection)

    def __getattr__(self, name: str) -> Any:  # only reached when normal lookup fails
        if name in FLAT_NAMES:
            raise AttributeError(f"TrainConfig.{name} is now TrainConfig.{FLAT_NAMES[name]}")
        raise AttributeError(f"'TrainConfig' object has no attribute '{name}'")

    def validate(self, source: str = "config", lines: dict[str, int] | None = None,
                 where: dict[str, str] | None = None) -> None:
        """Fill the keys ``ppo.algorithm``'s preset sets and the config leaves unset, then check types of
        enumerations (``Literal``) and value ranges (:func:`areal_cli.config.validate.validate`).

        Args:
            source: where the values come from (a file path or "overrides").
            lines: dotted key -> line number in ``source``, to report ``file:line``.
            where: dotted key -> the whole location of its value (``-o rollout.group_size=0``).
        Raises:
            UserError: ``source:line: field 'section.key': why (got value)``.
        """
        from areal_cli.config.algorithms import fill_algorithm
        from areal_cli.config.validate import validate

        fill_algorithm(self)  # ppo.algorithm's preset fills the keys not set (areal_cli.config.algorithms)
        validate(self, source, lines, where)

    def copy(self) -> TrainConfig:
        """A deep copy (sections are not shared)."""
        return copy.deepcopy(self)

    def with_values(self, values: dict[str, Any]) -> TrainConfig:
        """A copy with ``values`` (dotted key -> value, taken as given: no conversion, no validation) set.

        Raises:
            KeyError: an unknown dotted key.
        """
        out = self.copy()
        for key, value in values.items():
            if key not in KEYS:
                raise KeyError(f"unknown setting {key!r} (dotted keys: rollout.group_size, ...)")
            set_value(out, key, value)
        return out

    def to_dict(self) -> dict:
        """``{"recipe", "seed", "model": {...}, "task": {...}, ...}``: what a run's ``config.json`` holds."""
        return dataclasses.asdict(self)

    def flat_dict(self) -> dict[str, Any]:
        """``{"recipe": ..., "rollout.group_size": 8, ...}``: one level, dotted keys (tables, tracking)."""
        out: dict[str, Any] = {n: getattr(self, n) for n in TOP_LEVEL}
        for sec in SECTIONS:
            for k, v in dataclasses.asdict(getattr(self, sec)).items():
                out[f"{sec}.{k}"] = v
        return out

    @classmethod
    def from_dict(cls, data: dict, source: str = "config", *, note: bool = True) -> TrainConfig:
        """The config :meth:`to_dict` wrote, or a run's ``config.json`` of an earlier release (flat names; one
        note on stderr unless ``note`` is False). Values are taken as stored (they were checked when the run
        started).

        Raises:
            UserError: a key that is no setting (``source: field 'key': unknown key``).
        """
        cfg = cls()
        entries = read_mapping(data, source)
        for e in entries:
            set_value(cfg, e.dotted, e.value)
        if note:
            note_flat_names(source, [e.written for e in entries])
        return cfg


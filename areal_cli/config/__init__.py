"""Training configuration: :class:`TrainConfig` in sections, set from a recipe and ``-o section.key=value``.

- :mod:`~areal_cli.config.sections`: the sections (model, task, sft, rollout, ppo, critic, parallel, loop), a docstring
  and a type per setting, enumerations as ``Literal``.
- :mod:`~areal_cli.config.train`: :class:`TrainConfig` (two identity fields and the sections), to and from a
  run's ``config.json``.
- :mod:`~areal_cli.config.keys`: dotted keys, the flat names of earlier releases, reading a mapping.
- :mod:`~areal_cli.config.loading`: a train config file, a recipe's ``train`` section, overrides, paths.
- :mod:`~areal_cli.config.validate`: ranges and combinations.

Values are converted by the one rule of :func:`areal_cli.foundations.typed_yaml.coerce`; unknown keys and wrong types are
:class:`~areal_cli.foundations.errors.UserError` with ``file:line: field 'section.key'``. A foundation: it imports no torch
and nothing above the typed YAML reader (import-linter contract in pyproject.toml).
"""

from areal_cli.config.cpus import parse_cpu_list
from areal_cli.config.keys import (FLAT_NAMES, KEYS, field_docs, flush_notes, get_value, note_flat_names, resolve_key,
                                   set_value)
from areal_cli.config.loading import PATH_FIELDS, apply_overrides, config_from_file, resolve_paths, settings_into
from areal_cli.config.sections import BEHAV_IMP_WEIGHT_MODES, SECTIONS
from areal_cli.config.train import TrainConfig

__all__ = ["BEHAV_IMP_WEIGHT_MODES", "FLAT_NAMES", "KEYS", "PATH_FIELDS", "SECTIONS", "TrainConfig",
           "apply_overrides", "config_from_file", "field_docs", "flush_notes", "get_value", "note_flat_names", "parse_cpu_list", "resolve_key",
           "resolve_paths", "set_value", "settings_into"]

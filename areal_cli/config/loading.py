"""Settings into a :class:`~areal_cli.config.train.TrainConfig`: a train config file, a recipe's ``train``
section, ``-o key=value`` overrides; relative paths made absolute against where they were written."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from areal_cli.config.keys import KEYS, coerce_value, get_value, note_flat_names, read_mapping, resolve_key, set_value
from areal_cli.config.train import TrainConfig
from areal_cli.errors import UserError
from areal_cli.typed_yaml import parse_override, plain


def settings_into(cfg: TrainConfig, data: Any, path: Path, prefix: str = "") -> tuple[dict[str, int], list[str]]:
    """Set the settings of YAML mapping ``data`` (sections, dotted keys or flat names of earlier releases) on
    ``cfg``, converted to their types; relative paths are made absolute against ``path``'s folder.

    Returns:
        ``(lines, written)``: dotted key -> line, for :meth:`TrainConfig.validate`; the keys as written, for
        :func:`~areal_cli.config.keys.note_flat_names` once the config is valid (an error stays one line).
    Raises:
        UserError: unknown key, wrong type, not a mapping (``file:line: field 'prefix.key': ...``).
    """
    entries = read_mapping(data, str(path), prefix)
    for e in entries:
        set_value(cfg, e.dotted, coerce_value(e.dotted, e.value, f"{path}:{e.line}"))
    lines = {e.dotted: e.line for e in entries}
    resolve_paths(cfg, path.parent, set(lines))
    return lines, [e.written for e in entries]


def config_from_file(data: Any, path: Path) -> tuple[TrainConfig, dict[str, int]]:
    """The config of a train config file (a quick user recipe): ``data`` (read by
    :func:`areal_cli.typed_yaml.read_yaml`) is a mapping of settings (``rollout: {group_size: 8}``,
    ``rollout.group_size: 8`` or the flat ``group_size: 8`` of earlier releases). The config is named by the
    file's stem unless it sets ``recipe``.

    Returns:
        ``(config, lines)``: lines maps each dotted key the file set to its line (for checks made above this
        layer, e.g. the task preset).

    Raises:
        UserError: not a mapping, unknown key, wrong type or bad value (``file:line: field 'key': ...``).
    """
    if not isinstance(data, dict):
        raise UserError(f"{path}:1: a recipe must be a mapping of key: value")
    cfg = TrainConfig(recipe=path.stem)
    lines, written = settings_into(cfg, data, path)
    cfg.validate(str(path), lines)
    note_flat_names(str(path), written)
    return cfg, lines


#: Settings naming user code or data by path: made absolute when the recipe is read (see resolve_paths).
PATH_FIELDS = ("task.dataset", "task.eval_dataset", "task.reward", "task.workflow", "task.code_dir", "model.path",
               "loop.eval_data_dir")


def resolve_paths(cfg: TrainConfig, base_dir: Path, keys: set[str], *, set_code_dir: bool = True) -> None:
    """Make the relative paths of ``cfg``'s settings in ``keys`` (dotted) absolute against ``base_dir`` (the
    recipe's folder, or the current directory for ``-o``): data files and folders, ``file.py:attr`` names,
    ``task.code_dir``, ``model.path``. ``task.code_dir`` defaults to ``base_dir`` (``set_code_dir``). Module
    names, ``hf:`` sources and absolute paths are unchanged."""
    from areal_cli.api.loading import absolute_spec, is_file_spec

    base = Path(base_dir).resolve()
    for key in PATH_FIELDS:
        value = get_value(cfg, key)
        if key not in keys or not value:
            continue
        if key in ("task.reward", "task.workflow") or (key in ("task.dataset", "task.eval_dataset")
                                                       and is_file_spec(value)):
            set_value(cfg, key, absolute_spec(value, base))
        elif key in ("task.dataset", "task.eval_dataset"):
            if value.startswith("hf:") or (":" in value and "/" not in value.rpartition(":")[0]
                                           and not value.endswith((".jsonl", ".json", ".parquet"))):
                continue  # a Hub dataset or a module:function
            set_value(cfg, key, str((base / Path(value).expanduser()).resolve()))
        else:
            set_value(cfg, key, str((base / Path(value).expanduser()).resolve()))
    if set_code_dir and not cfg.task.code_dir:
        cfg.task.code_dir = str(base)


#: Mapping settings whose single entries ``-o`` may set (``-o task.workflow_args.max_turns=3``).
MAPPING_KEYS = ("task.workflow_args",)


def apply_overrides(cfg: TrainConfig, overrides: list[str], source: str = "-o") -> TrainConfig:
    """Apply ``key=value`` overrides (``rollout.group_size=8``; value parsed as a YAML scalar; flat names of
    earlier releases accepted with one note) to a copy of ``cfg``, and validate it. ``task.workflow_args.NAME=V``
    sets one argument and keeps the others; ``task.workflow_args={...}`` replaces them all. A text setting takes
    the text as written (``-o task.prompt_field=true`` is the string ``true``); an empty value unsets an optional
    one (``-o model.path=`` is None).

    Args:
        source: who wrote the overrides, for the deprecation note (``-o``, or a scenario file).
    Raises:
        UserError: malformed override, unknown key, wrong type or out-of-range value (``-o ITEM: field ...``).
    """
    cfg = cfg.copy()
    written, where_of = [], {}
    for item in overrides:  # later overrides of the same key win, as on any command line
        where = f"-o {item}"
        key, value = parse_override(item)
        mapping = next((m for m in MAPPING_KEYS if key.startswith(m + ".") and len(key) > len(m) + 1), None)
        if mapping is not None:
            get_value(cfg, mapping)[key[len(mapping) + 1:]] = plain(value)
            where_of[mapping] = where
            continue
        dotted, _ = resolve_key(key, where)
        raw = item.split("=", 1)[1].strip()
        allowed = typing.get_args(KEYS[dotted].type) or (KEYS[dotted].type,)
        if str in allowed and raw == "" and type(None) in allowed:
            value = None
        elif str in allowed and isinstance(value, (bool, int, float)):
            value = raw  # YAML read `true` or `7`: a text setting keeps the text
        set_value(cfg, dotted, coerce_value(dotted, value, where))
        written.append(key)
        where_of[dotted] = where
        if dotted in PATH_FIELDS:
            resolve_paths(cfg, Path.cwd(), {dotted}, set_code_dir=False)
    cfg.validate("overrides", where=where_of)
    note_flat_names(source, written)
    return cfg

"""Settings into a :class:`~areal_cli.config.train.TrainConfig`: a train config file, a recipe's ``train``
section, ``-o key=value`` overrides; relative paths made absolute against where they were written."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, Sequence

from areal_cli.config.algorithms import prefer_preset
from areal_cli.config.keys import FLAT_NAMES, KEYS, coerce_value, get_value, note_flat_names, read_mapping, resolve_key, set_value
from areal_cli.config.train import TrainConfig
from areal_cli.foundations.errors import UserError
from areal_cli.foundations.typed_yaml import parse_override, plain


def settings_into(cfg: TrainConfig, data: Any, path: Path, prefix: str = "",
                  fallback_dirs: Sequence[Path] = ()) -> tuple[dict[str, int], list[str]]:
    """Set the settings of YAML mapping ``data`` (sections, dotted keys or flat names of earlier releases) on
    ``cfg``, converted to their types; relative paths are made absolute against ``path``'s folder (or the
    first of ``fallback_dirs`` holding them when they do not exist there: :func:`resolve_paths`).

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
    resolve_paths(cfg, path.parent, set(lines), fallback_dirs=fallback_dirs)
    return lines, [e.written for e in entries]


def config_from_file(data: Any, path: Path) -> tuple[TrainConfig, dict[str, int]]:
    """The config of a train config file (a quick user recipe): ``data`` (read by
    :func:`areal_cli.foundations.typed_yaml.read_yaml`) is a mapping of settings (``rollout: {group_size: 8}``,
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


#: Entries of ``loop.eval_benchmarks`` that name a task file (a task YAML or records), not a benchmark.
TASK_FILE_SUFFIXES = (".yaml", ".yml", ".jsonl", ".json", ".parquet")
#: Settings naming user code or data by path: made absolute when the recipe is read (see resolve_paths).
PATH_FIELDS = ("task.dataset", "task.eval_dataset", "task.reward", "task.workflow", "task.code_dir", "model.path",
               "loop.eval_data_dir")


def resolve_paths(cfg: TrainConfig, base_dir: Path, keys: set[str], *, set_code_dir: bool = True,
                  fallback_dirs: Sequence[Path] = ()) -> None:
    """Make the relative paths of ``cfg``'s settings in ``keys`` (dotted) absolute against ``base_dir`` (the
    recipe's folder, or the current directory for ``-o``): data files and folders, ``file.py:attr`` names,
    ``task.code_dir``, ``model.path``, the task files among ``loop.eval_benchmarks`` (entries ending in
    :data:`TASK_FILE_SUFFIXES`). ``task.code_dir`` defaults to ``base_dir`` (``set_code_dir``). Module names,
    ``hf:`` sources, benchmark names and absolute paths are unchanged.

    Args:
        fallback_dirs: folders tried in order for a relative path that does not exist under ``base_dir`` (a
            copied locked recipe reads its original's data from the shipped recipes folder); the path stays
            under ``base_dir`` when none holds it either (so a message names where it was looked for first).
    """
    from areal_cli.api.loading import is_file_spec

    base = Path(base_dir).resolve()

    def absolute(rel: str) -> str:
        p = Path(rel).expanduser()
        if p.is_absolute():
            return str(p.resolve())
        for d in (base, *(Path(f).resolve() for f in fallback_dirs)):
            if (d / p).exists():
                return str((d / p).resolve())
        return str((base / p).resolve())

    for key in PATH_FIELDS:
        value = get_value(cfg, key)
        if key not in keys or not value:
            continue
        if key in ("task.reward", "task.workflow") or (key in ("task.dataset", "task.eval_dataset")
                                                       and is_file_spec(value)):
            if is_file_spec(value):
                file, _, attr = value.rpartition(":")
                set_value(cfg, key, f"{absolute(file)}:{attr}")
        elif key in ("task.dataset", "task.eval_dataset"):
            if value.startswith("hf:") or (":" in value and "/" not in value.rpartition(":")[0]
                                           and not value.endswith((".jsonl", ".json", ".parquet"))):
                continue  # a Hub dataset or a module:function
            set_value(cfg, key, absolute(value))
        else:
            set_value(cfg, key, absolute(value))
    if "loop.eval_benchmarks" in keys:  # task files among the benchmark names (areal_cli.eval.custom_task)
        cfg.loop.eval_benchmarks = [absolute(b) if isinstance(b, str) and b.strip().lower().endswith(TASK_FILE_SUFFIXES)
                                    else b for b in cfg.loop.eval_benchmarks]
    if set_code_dir and not cfg.task.code_dir:
        cfg.task.code_dir = str(base)


#: Mapping settings that ``-o`` merges into (``-o task.workflow_args.max_turns=3``, ``-o task.workflow_args={...}``).
MAPPING_KEYS = ("task.workflow_args",)


def merge_patch(target: Any, patch: Any) -> Any:
    """``patch`` applied to ``target`` by JSON Merge Patch (RFC 7396): a mapping patch merges key by key,
    recursively (a key whose value is None is removed; a mapping value merges into the target's mapping under
    that key); any other patch replaces the target. Neither argument is modified."""
    if not isinstance(patch, dict):
        return plain(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _mapping_entry(key: str) -> tuple[str, list[str]] | None:
    """``(mapping key, path inside it)`` when override key ``key`` names an entry of a mapping setting
    (``task.workflow_args.agent_args.max_turns`` -> ``("task.workflow_args", ["agent_args", "max_turns"])``;
    the flat name of earlier releases, ``workflow_args.NAME``, too); None otherwise."""
    for mapping in MAPPING_KEYS:
        for name in (mapping, *(flat for flat, dotted in FLAT_NAMES.items() if dotted == mapping)):
            if key.startswith(name + ".") and len(key) > len(name) + 1:
                return mapping, key[len(name) + 1:].split(".")
    return None


def _merge_into_mapping(cfg: TrainConfig, mapping: str, path: list[str], value: Any, where: str) -> None:
    """Merge override ``value`` into mapping setting ``mapping`` of ``cfg`` (at ``path`` inside it; [] = the
    whole mapping) by :func:`merge_patch`.

    Raises:
        UserError: an empty entry name (``-o task.workflow_args..x=1``), or a whole-mapping value that is not
            a mapping (``where: field 'task.workflow_args': expected a mapping ...``).
    """
    if any(not part.strip() for part in path):
        raise UserError(f"{where}: field '{mapping}.{'.'.join(path)}': empty argument name")
    if not path:
        if value is None or value == "":
            set_value(cfg, mapping, {})  # RFC 7396: a null patch removes the whole value (here: every entry)
            return
        if not isinstance(value, dict):
            raise UserError(f"{where}: field '{mapping}': expected a mapping {{name: value, ...}} to merge into "
                            f"the recipe's (or {mapping}.NAME=VALUE for one entry), got {plain(value)!r}")
    patch: Any = value
    for part in reversed(path):
        patch = {part: patch}
    set_value(cfg, mapping, merge_patch(get_value(cfg, mapping), patch))


def apply_overrides(cfg: TrainConfig, overrides: list[str], source: str = "-o") -> TrainConfig:
    """Apply ``key=value`` overrides (``rollout.group_size=8``; value parsed as a YAML scalar; flat names of
    earlier releases accepted with one note) to a copy of ``cfg``, and validate it. A text setting takes
    the text as written (``-o task.prompt_field=true`` is the string ``true``); an empty value unsets an optional
    one (``-o model.path=`` is None).

    Mapping settings (:data:`MAPPING_KEYS`, ``task.workflow_args``) are merged into, never replaced, by JSON Merge
    Patch (RFC 7396, :func:`merge_patch`), and both forms agree: ``task.workflow_args.NAME=V`` is the patch
    ``{NAME: V}`` (``task.workflow_args.A.B=V`` is ``{A: {B: V}}``) and ``task.workflow_args={NAME: V, ...}`` is
    that mapping, so the recipe's other arguments are kept; an argument whose value is ``null`` is removed
    (``task.workflow_args.NAME=null``, ``task.workflow_args={NAME: null}``); ``task.workflow_args=null`` (or an
    empty value) removes them all. Any other value for the whole mapping is refused.

    Args:
        source: who wrote the overrides, for the deprecation note (``-o``, or a scenario file).
    Raises:
        UserError: malformed override, unknown key, wrong type or out-of-range value, a mapping setting given
            something else than a mapping (``-o ITEM: field ...``).
    """
    cfg = cfg.copy()
    written, where_of = [], {}
    for item in overrides:  # later overrides of the same key win, as on any command line
        where = f"-o {item}"
        key, value = parse_override(item)
        entry = _mapping_entry(key)
        if entry is not None:
            mapping, path = entry
            _merge_into_mapping(cfg, mapping, path, value, where)
            written.append(key[: len(key) - len(".".join(path)) - 1])  # the mapping as written (a flat name?)
            where_of[mapping] = where
            continue
        dotted, _ = resolve_key(key, where)
        if dotted in MAPPING_KEYS:
            _merge_into_mapping(cfg, dotted, [], value, where)
            written.append(key)
            where_of[dotted] = where
            continue
        raw = item.split("=", 1)[1].strip()
        allowed = typing.get_args(KEYS[dotted].type) or (KEYS[dotted].type,)
        if str in allowed and raw == "" and type(None) in allowed:
            value = None
        elif str in allowed and isinstance(value, (bool, int, float)):
            value = raw  # YAML read `true` or `7`: a text setting keeps the text
        set_value(cfg, dotted, coerce_value(dotted, value, where))
        written.append(key)
        where_of[dotted] = where
        if dotted in PATH_FIELDS or dotted == "loop.eval_benchmarks":
            resolve_paths(cfg, Path.cwd(), {dotted}, set_code_dir=False)
    if "ppo.algorithm" in where_of:  # chosen here, after the recipe: its preset's keys win over the recipe's
        prefer_preset(cfg, set(where_of))
    cfg.validate("overrides", where=where_of)
    note_flat_names(source, written)
    return cfg

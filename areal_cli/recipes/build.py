"""Strict dataclass building from YAML mappings: every key checked, every type exact, errors at ``file:line``.

:func:`build` turns a :class:`~areal_cli.foundations.typed_yaml.LineDict` into a dataclass (nested dataclasses, lists,
``Literal`` choices, ``X | None``); the built object remembers where it came from so later checks report
``file:line: field 'section.key': ...`` (:func:`where`). Strict on purpose (a locked recipe states exact
values): YAML types must match the annotation, only an int is accepted for a float, and a bool follows the one
bool rule of :mod:`areal_cli.foundations.typed_yaml` (a YAML bool or a word of ``BOOL_WORDS``). The flat train settings use
the looser :func:`areal_cli.foundations.typed_yaml.coerce` (strings that parse as the type are accepted).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

from areal_cli.foundations.errors import UserError
from areal_cli.foundations.typed_yaml import BOOL_WORDS, LineDict


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if typing.get_origin(tp) is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if typing.get_origin(tp) is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, file: Path, name: str, line: int) -> Any:
    """Check ``value`` against the annotation ``tp`` (strict: YAML types must match; int is accepted for
    float). Returns the value (dataclasses built, floats made float).

    Raises:
        UserError: ``file:line: field 'name': expected T, got V``.
    """
    def bad() -> UserError:
        got = "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list) else repr(value)
        return UserError(f"{file}:{line}: field '{name}': expected {_type_name(tp)}, got {got}")

    origin = typing.get_origin(tp)
    if isinstance(tp, types.UnionType) or origin is typing.Union:
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise bad()
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, file, name, line)
            except UserError:
                continue
        raise bad()
    if value is None:
        raise UserError(f"{file}:{line}: field '{name}': must not be null (expected {_type_name(tp)})")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise UserError(f"{file}:{line}: field '{name}': must be one of {_type_name(tp)}, got {value!r}")
    if tp is Any:
        return value
    if tp is bool:  # the one bool rule of every settings file (areal_cli.foundations.typed_yaml.BOOL_WORDS)
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in BOOL_WORDS:
            return BOOL_WORDS[value.lower()]
        raise bad()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad()
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise bad()
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad()
    if origin is list:
        if not isinstance(value, list):
            raise bad()
        (item_tp,) = typing.get_args(tp)
        return [_convert(v, item_tp, file, f"{name}[{i}]", getattr(v, "line", line)) for i, v in enumerate(value)]
    if tp is dict:  # a raw section (validated later by its own schema): keep its line numbers
        if not isinstance(value, dict):
            raise bad()
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise bad()
        val_tp = typing.get_args(tp)[1] if typing.get_args(tp) else Any
        return {str(k): _convert(v, val_tp, file, f"{name}.{k}", value.at(k) if isinstance(value, LineDict)
                                 else line) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, file, name, line)
    raise TypeError(f"unsupported annotation {tp!r}")  # a schema bug, not bad input


def build(cls: type, data: Any, file: Path, prefix: str = "", line: int = 1) -> Any:
    """Build dataclass ``cls`` from the YAML mapping ``data``, checking every key.

    Every dataclass field without a default is required. The built object remembers where it came from
    (``obj.__source__ = (file, {field: line}, line)``) so later checks can report ``file:line``.

    Raises:
        UserError: not a mapping, unknown key (lists the known keys), missing required key, wrong type.
    """
    if not isinstance(data, dict):
        what = f"field '{prefix}'" if prefix else "the file"
        raise UserError(f"{file}:{line}: {what}: expected a mapping of key: value, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    lines = dict(data.lines) if isinstance(data, LineDict) else {}
    here = data.line if isinstance(data, LineDict) else line
    kwargs = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        kline = lines.get(key, here)
        if key not in fields:
            known = ", ".join(fields)
            raise UserError(f"{file}:{kline}: field '{name}': unknown key (known: {known})")
        kwargs[key] = _convert(value, hints[key], file, name, kline)
    for f in fields.values():
        if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            name = f"{prefix}.{f.name}" if prefix else f.name
            raise UserError(f"{file}:{here}: field '{name}': required key missing")
    obj = cls(**kwargs)
    object.__setattr__(obj, "__source__", (file, lines, here))
    return obj


def where(obj: Any, key: str | None = None) -> str:
    """``file:line`` of ``obj`` (built by :func:`build`) or of one of its keys."""
    file, lines, line = getattr(obj, "__source__", ("?", {}, 1))
    return f"{file}:{lines.get(key, line) if key else line}"

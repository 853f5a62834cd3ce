"""Typed YAML settings: files read with the line of every key, one coercion rule, ``-o key=value`` overrides.

The one reader behind recipes (:mod:`areal_cli.recipes`), flat train configs (:mod:`areal_cli.config`) and
bench scenarios (:mod:`areal_cli.bench`). Every problem is a one-line :class:`~areal_cli.foundations.errors.UserError`
that names ``file:line`` and the field:

- :func:`read_yaml`: mappings come back as :class:`LineDict` (the line of each key); a key given twice in one
  mapping is refused with both lines; dates stay text (``2024-10-01`` is a string, not a ``date``).
- :func:`coerce`: a value to a field's declared type. One rule for every settings file: a bool is a YAML bool
  or one of the words ``true/false/yes/no/1/0`` (any case); an int is never a bool; an int is accepted for a
  float; a string is converted when it parses as the type (``"8"`` for an int); ``list[str]`` accepts one
  string as a comma-separated list (``question,answer``; one name without a comma is a one-item list).
- :func:`parse_override`: ``key=value`` with the value read as a YAML scalar by the same loader.

A foundation: imports yaml and :mod:`areal_cli.foundations.errors` only.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

import yaml

from areal_cli.foundations.errors import UserError

#: The words a string may spell a bool with (any case), and what they mean.
BOOL_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


class LineDict(dict):
    """A mapping from YAML that remembers where it is: ``line`` (its first line) and ``lines[key]``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.line: int = 1
        self.lines: dict = {}

    def at(self, key: str) -> int:
        """The line of ``key`` (the mapping's own line when the key has none)."""
        return self.lines.get(key, self.line)


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # the C parser when PyYAML has libyaml
    """SafeLoader whose mappings are :class:`LineDict` and that rejects duplicate keys.

    Dates stay strings (no implicit timestamp resolver): ``2024-10-01`` in a recipe is text.
    """


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_mapping(loader: _Loader, node: yaml.MappingNode):
    data = LineDict()
    data.line = node.start_mark.line + 1
    yield data
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in data.lines:
            raise _DuplicateKey(str(key), line, data.lines[key])
        data.lines[key] = line
        data[key] = loader.construct_object(value_node, deep=True)


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def read_yaml(path: Path, what: str = "") -> Any:
    """Parse ``path`` into plain values whose mappings are :class:`LineDict`.

    Args:
        what: the kind of file, for the unreadable-file message (``cannot read recipe: ...``).
    Raises:
        UserError: unreadable file, not UTF-8, invalid YAML (with line), duplicate key (with both lines).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not a UTF-8 text file (byte {e.start})") from None
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read{' ' + what if what else ''}: {e.strerror}") from None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except _DuplicateKey as e:
        raise UserError(f"{path}:{e.line}: field '{e.key}': duplicate key (first at line {e.first})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise UserError(f"{path}{line}: invalid YAML: {getattr(e, 'problem', None) or e}") from None


def parse_override(item: str) -> tuple[str, Any]:
    """``key=value`` -> ``(key, value)``, the value read as YAML (``8`` an int, ``[a, b]`` a list, text that is
    not YAML kept as text; an empty value is ``""``). Messages about it start with ``-o ITEM``.

    Raises:
        UserError: ``-o ITEM: expected key=value``.
    """
    if "=" not in item:
        raise UserError(f"-o {item}: expected key=value")
    key, raw = item.split("=", 1)
    try:
        value = yaml.load(raw, Loader=_Loader) if raw.strip() else ""  # noqa: S506 - a SafeLoader
    except (yaml.YAMLError, _DuplicateKey):
        value = raw
    return key.strip(), value


def plain(value: Any) -> Any:
    """``value`` with every :class:`LineDict` inside it made a plain ``dict`` (what ``yaml.safe_dump`` and
    equality with other settings expect once the line numbers have served)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def coerce(name: str, value: object, tp: Any, where: str) -> object:
    """``value`` converted to the declared type ``tp`` of field ``name`` (the rule in the module docstring).

    Args:
        tp: the field's annotation: ``bool``, ``int``, ``float``, ``str``, ``X | None``, ``list[str]``,
            ``list``, ``dict``, ``Literal[...]`` (one of its values, as written).
        where: ``file:line`` or ``-o key=value``, the start of the error message.
    Raises:
        UserError: ``where: field 'name': expected T, got V`` (or ``must not be null``, ``must be one of``).
    """
    if typing.get_origin(tp) is typing.Literal:
        options = typing.get_args(tp)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and value in options:
            return value
        raise UserError(f"{where}: field '{name}': must be one of {', '.join(map(str, options))} (got {value!r})")
    if typing.get_origin(tp) is list:
        # one string is a comma-separated list (``-o task.required_fields=question,answer``; names never hold commas)
        items = ([x.strip() for x in value.split(",") if x.strip()] if isinstance(value, str)
                 else ([] if value is None else value))
        if isinstance(items, list) and all(isinstance(x, str) for x in items):
            return list(items)
        raise UserError(f"{where}: field '{name}': expected a list of strings, got {value!r}")
    if tp is list:
        if isinstance(value, list):
            return plain(value)
        raise UserError(f"{where}: field '{name}': expected a list, got {value!r}")
    if tp is dict:
        if value in ("", None):
            return {}
        if isinstance(value, dict):
            return plain(value)
        raise UserError(f"{where}: field '{name}': expected a mapping, got {value!r}")
    allowed = typing.get_args(tp) if isinstance(tp, types.UnionType) else (tp,)
    if value is None:
        if type(None) in allowed:
            return None
        raise UserError(f"{where}: field '{name}': must not be null")
    for t in allowed:
        if t is type(None):
            continue
        if t is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in BOOL_WORDS:
                return BOOL_WORDS[value.lower()]
            continue
        if t is int and isinstance(value, bool):
            continue
        if t is str and isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # e.g. a cpu list "0" that YAML read as an int
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, t):
            return value
        if isinstance(value, str):
            try:
                return t(value)
            except (TypeError, ValueError):
                continue
    names = "/".join(t.__name__ for t in allowed)
    raise UserError(f"{where}: field '{name}': expected {names}, got {value!r}")


def unknown_key(where: str, key: Any, known: typing.Iterable[str], *, prefix: str = "") -> UserError:
    """The one-line error for a key that is no field: ``where: field 'prefix.key': unknown key (did you mean
    'closest'?)``, with the closest known key by :func:`difflib.get_close_matches` (ratio >= 0.6), else the known
    keys listed (sorted).

    Args:
        where: ``file:line`` of the key (or ``-o ITEM``).
        prefix: the dotted path of the mapping that holds ``key`` (``generate_compare``), without the dot.
    Returns:
        the :class:`~areal_cli.foundations.errors.UserError` to raise.
    """
    import difflib

    names = sorted(str(k) for k in known)
    close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
    dotted = f"{prefix}.{key}" if prefix else str(key)
    full = [f"{prefix}.{c}" if prefix else c for c in close]
    hint = f"did you mean '{full[0]}'?" if close else f"no known key is close; known: {', '.join(names)}"
    return UserError(f"{where}: field '{dotted}': unknown key ({hint})")

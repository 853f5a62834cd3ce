"""Every setting of :class:`~areal_cli.config.train.TrainConfig` as text: ``areal train --list-settings``."""

from __future__ import annotations

import re
import textwrap
import types
import typing
from typing import Any

from areal_cli.config.algorithms import describe_presets
from areal_cli.config.keys import FLAT_NAMES, KEYS, field_docs, get_value
from areal_cli.config.sections import SECTIONS


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return " | ".join(map(str, typing.get_args(tp)))
    if typing.get_origin(tp) is not None or isinstance(tp, types.UnionType):  # list[str], str | None
        return str(tp).replace("typing.", "").replace("NoneType", "None")
    return getattr(tp, "__name__", None) or str(tp)


def plain_text(doc: str) -> str:
    """A docstring's text without reST markup (``:mod:`x``` -> x, double backquotes -> single), whitespace folded."""
    doc = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)
    return " ".join(doc.replace("``", "`").split())


def describe_settings(cfg: Any, width: int = 100) -> list[str]:
    """Lines: per section its docstring, then per setting ``key = value  (type; was: flat name)`` and its
    docstring, indented. ``cfg``'s values are shown (a recipe with its overrides, or the defaults)."""
    docs, old = field_docs(), {v: k for k, v in FLAT_NAMES.items() if k not in KEYS and k != "task"}
    out: list[str] = []

    def entry(key: str) -> None:
        was = f"; was {old[key]}" if key in old else ""
        out.append(f"  {key} = {get_value(cfg, key)!r}  ({_type_name(KEYS[key].type)}{was})")
        out.extend(textwrap.wrap(plain_text(docs.get(key, "")), width, initial_indent="      ",
                                 subsequent_indent="      "))

    for key in ("recipe", "seed"):
        entry(key)
    for sec, cls in SECTIONS.items():
        out.append("")
        out.extend(textwrap.wrap(f"{sec}: " + plain_text(cls.__doc__ or ""), width))
        for key in (k for k in KEYS if k.startswith(sec + ".")):
            entry(key)
            if key == "ppo.algorithm":  # what each preset fills (the keys a recipe leaves unset)
                for line in describe_presets():
                    out.extend(textwrap.wrap(f"preset {line}", width, initial_indent="      ",
                                             subsequent_indent="          "))
    return out

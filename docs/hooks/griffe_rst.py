"""Griffe extension for the API reference: the kit's docstrings use reST inline markup (``:class:`~x.Y```,
double backquotes), which Markdown would show raw. Roles become code spans with the name as written (``~``:
its last part), double backquotes single ones. Nothing else in a docstring changes."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`<]+?)(?:\s*<[^>]+>)?`")


def rst_inline_to_markdown(text: str) -> str:
    def role(m: re.Match) -> str:
        name = m.group(2).strip()
        return f"`{name.rsplit('.', 1)[-1] if m.group(1) else name}`"

    text = _ROLE.sub(role, text)
    text = re.sub(r"(?<=\S)::$", ":", text, flags=re.M)  # reST's "text::" before a literal block
    return re.sub(r"``([^`]+?)``", r"`\1`", text)


def escape_html(text: str) -> str:
    """``<`` and ``>`` outside code spans as entities: a docstring's ``<think>`` is text, not an HTML tag."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts)


class RestInline(griffe.Extension):
    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        doc = getattr(obj, "docstring", None)
        if doc is not None and doc.value:
            doc.value = rst_inline_to_markdown(doc.value)

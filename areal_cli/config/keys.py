"""Dotted keys of :class:`~areal_cli.config.train.TrainConfig`: the table of every setting, the flat names of
earlier releases, and reading a (nested, dotted or flat) mapping of settings.

A key is ``section.field`` (``rollout.group_size``) or a top-level field (``recipe``, ``seed``). In YAML a
section is a mapping (``rollout: {group_size: 8}``); a dotted key (``rollout.group_size: 8``) is the same
setting. ``task: NAME`` is short for ``task.preset: NAME``. The flat names of earlier releases
(:data:`FLAT_NAMES`: ``group_size``, ``sft_lr``, ``trainer_data_parallel``, ...) are still read; each source that
uses them gets one line on stderr naming the new keys.
"""

from __future__ import annotations

import ast
import difflib
import sys
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from areal_cli.config.peer_names import peer_hint
from areal_cli.config.sections import SECTIONS
from areal_cli.foundations.errors import UserError
from areal_cli.foundations.typed_yaml import LineDict, coerce

#: Top-level fields of TrainConfig (not in a section).
TOP_LEVEL = ("recipe", "seed")

#: Flat names whose field was renamed inside its section (the rest keep their name: ``group_size`` ->
#: ``rollout.group_size``; every ``sft`` field was ``sft_<name>``).
_RENAMED = {
    "model.path": "model_path", "model.hidden_size": "model_hidden_size", "model.num_layers": "model_num_layers",
    "model.vocab_size": "model_vocab_size", "model.chat_template": "model_chat_template",
    "task.preset": "task", "rollout.engine": "rollout_engine", "ppo.n_minibatches": "ppo_n_minibatches",
    "parallel.data": "trainer_data_parallel", "parallel.tensor": "trainer_tensor_parallel",
    "parallel.pipeline": "trainer_pipeline_parallel",
}


#: Settings added after the flat names were deprecated: they never had one.
_NO_FLAT_NAME = frozenset({"rollout.pause_mode", "loop.eval_deferred", "loop.log_samples_every",
                           "loop.log_samples_n", "ppo.algorithm", "ppo.eps_clip_higher", "ppo.c_clip",
                           "ppo.loss_agg_mode", "ppo.importance_sampling_level", "ppo.loss_fn",
                           "ppo.reward_norm_mean_level", "ppo.reward_norm_std_level", "ppo.reward_norm_mean_leave1out",
                           "ppo.overlong_reward_penalty", "ppo.overlong_tokens", "ppo.overlong_penalty_factor",
                           "ppo.discount", "ppo.gae_lambda", "ppo.entropy_coeff"})


@dataclass(frozen=True)
class Key:
    """One setting: its dotted name, section (None for a top-level field), field name and declared type."""

    dotted: str
    section: str | None
    name: str
    type: Any


def _table() -> tuple[dict[str, Key], dict[str, str]]:
    keys: dict[str, Key] = {n: Key(n, None, n, {"recipe": str, "seed": int}[n]) for n in TOP_LEVEL}
    flat: dict[str, str] = {}
    for sec, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            dotted = f"{sec}.{f.name}"
            keys[dotted] = Key(dotted, sec, f.name, hints[f.name])
            if dotted in _NO_FLAT_NAME or sec == "critic":
                continue
            old = _RENAMED.get(dotted) or (f"sft_{f.name}" if sec == "sft" else f.name)
            if old in flat:
                raise AssertionError(f"flat name {old} for both {flat[old]} and {dotted}")
            flat[old] = dotted
    return keys, flat


#: Every setting: dotted name -> :class:`Key`.
KEYS, FLAT_NAMES = _table()
#: FLAT_NAMES: the flat name of earlier releases -> the dotted key (``"sft_lr" -> "sft.lr"``).


def resolve_key(key: str, where: str, prefix: str = "") -> tuple[str, bool]:
    """The dotted key for ``key`` as written, and whether it was a flat name of an earlier release.

    Args:
        where: ``file:line`` or ``-o ITEM``, the start of an error message.
        prefix: how the settings are reached in the file (``train.``), shown before the key in messages.
    Raises:
        UserError: ``where: field 'prefix.key': unknown key`` (with the closest known keys).
    """
    if key in KEYS:
        return key, False
    if key == "task":
        return "task.preset", False  # task: NAME is short for task.preset: NAME
    if key in FLAT_NAMES:
        return FLAT_NAMES[key], True
    if key in SECTIONS:
        raise UserError(f"{where}: field '{prefix}{key}': a section, not a setting (write {key}.KEY, e.g. "
                        f"{key}.{fields(SECTIONS[key])[0].name})")
    peer = peer_hint(key)
    if peer:
        raise UserError(f"{where}: field '{prefix}{key}': unknown key ({peer})")
    head, dot, tail = key.partition(".")
    if dot and head not in SECTIONS:  # a misspelled section
        close = difflib.get_close_matches(head, list(SECTIONS), n=1, cutoff=0.6)
        if close:
            raise UserError(f"{where}: field '{prefix}{key}': unknown section '{head}' (did you mean {close[0]}?)")
    close = difflib.get_close_matches(key, list(KEYS) + list(FLAT_NAMES), n=3, cutoff=0.75)
    close = list(dict.fromkeys(FLAT_NAMES.get(c, c) for c in close))
    hint = f" (did you mean {' or '.join(close)}?)" if close else " (the keys: `areal train --list-settings`)"
    raise UserError(f"{where}: field '{prefix}{key}': unknown key{hint}")


def coerce_value(dotted: str, value: object, where: str) -> object:
    """``value`` converted to the declared type of setting ``dotted`` (:func:`areal_cli.foundations.typed_yaml.coerce`).

    Raises:
        UserError: ``where: field 'dotted': expected T, got V`` (or ``must be one of ...`` for a ``Literal``).
    """
    return coerce(dotted, value, KEYS[dotted].type, where)


def get_value(cfg: Any, dotted: str) -> Any:
    """The value of setting ``dotted`` in ``cfg``."""
    k = KEYS[dotted]
    return getattr(getattr(cfg, k.section), k.name) if k.section else getattr(cfg, k.name)


def set_value(cfg: Any, dotted: str, value: Any) -> None:
    """Set setting ``dotted`` of ``cfg`` to ``value`` (no conversion, no check), and note on ``cfg`` that it was set
    (``cfg._set_keys``: an algorithm preset fills only the keys not set, :mod:`areal_cli.config.algorithms`)."""
    k = KEYS[dotted]
    setattr(getattr(cfg, k.section) if k.section else cfg, k.name, value)
    if hasattr(cfg, "__dict__"):
        vars(cfg).setdefault("_set_keys", set()).add(dotted)


@dataclass
class Entry:
    """One setting read from a file or an override: the dotted key, the value as written, its line and the key
    as the user wrote it (a flat name of an earlier release, a dotted key or a section's field)."""

    dotted: str
    value: Any
    line: int
    written: str


def read_mapping(data: Any, source: str, prefix: str = "") -> list[Entry]:
    """The settings of a YAML mapping (read by :func:`areal_cli.foundations.typed_yaml.read_yaml`): sections as mappings,
    dotted keys, top-level fields and flat names of earlier releases, in any mix.

    Args:
        data: the mapping (a :class:`~areal_cli.foundations.typed_yaml.LineDict` gives line numbers).
        source: the file, for messages (``file:line: field 'prefix.key'``; ``source: field ...`` when ``data``
            carries no lines, e.g. a run's ``config.json``).
        prefix: how the mapping is reached in the file (``train`` for a recipe's section), for messages.
    Raises:
        UserError: not a mapping, a section that is not a mapping, unknown key, a key given twice (flat and
            dotted), each with ``file:line`` and the field.
    """
    pre = f"{prefix}." if prefix else ""
    line_of = data.at if isinstance(data, LineDict) else (lambda k: 1)
    at = (lambda n: f"{source}:{n}") if isinstance(data, LineDict) else (lambda n: source)
    if not isinstance(data, dict):
        raise UserError(f"{source}:{getattr(data, 'line', 1)}: {prefix or 'settings'}: expected a mapping of "
                        f"key: value")
    out: list[Entry] = []
    for key, value in data.items():
        key_s, line = str(key), line_of(key)
        if key_s in SECTIONS and (isinstance(value, dict) or value is None):  # None: a section with no key left
            sub_line = value.at if isinstance(value, LineDict) else (lambda k, _line=line: _line)
            for sub, v in (value or {}).items():
                dotted = f"{key_s}.{sub}"
                if dotted not in KEYS:
                    peer = peer_hint(dotted)
                    if peer:
                        raise UserError(f"{at(sub_line(sub))}: field '{pre}{dotted}': unknown key ({peer})")
                    names = [f.name for f in fields(SECTIONS[key_s])]
                    close = ([FLAT_NAMES[sub]] if sub in FLAT_NAMES else  # a flat name put in a section
                             [f"{key_s}.{c}" for c in difflib.get_close_matches(str(sub), names, n=2, cutoff=0.6)])
                    hint = (f"did you mean {' or '.join(close)}?" if close else
                            f"`areal train --list-settings` lists the {len(names)} keys of {key_s}")
                    raise UserError(f"{at(sub_line(sub))}: field '{pre}{dotted}': unknown key ({hint})")
                out.append(Entry(dotted, v, sub_line(sub), dotted))
            continue
        if key_s not in KEYS and key_s not in FLAT_NAMES and "." not in key_s:
            close = difflib.get_close_matches(key_s, list(SECTIONS), n=1, cutoff=0.7)
            if close and isinstance(value, dict):  # a misspelled section
                raise UserError(f"{at(line)}: field '{pre}{key_s}': unknown section (did you mean {close[0]}?)")
        if key_s in SECTIONS and key_s != "task":
            raise UserError(f"{at(line)}: field '{pre}{key_s}': expected a mapping of {key_s} settings, "
                            f"got {value!r}")
        dotted, _ = resolve_key(key_s, at(line), pre)
        out.append(Entry(dotted, value, line, key_s))
    seen: dict[str, Entry] = {}
    for e in out:
        if e.dotted in seen:
            first = seen[e.dotted]
            raise UserError(f"{at(e.line)}: field '{pre}{e.dotted}': given twice ('{first.written}' at line "
                            f"{first.line}, '{e.written}' here)")
        seen[e.dotted] = e
    return out


_noted: set[str] = set()
_pending: dict[str, list[str]] | None = None  # source -> flat names, while notes are deferred


def note_flat_names(source: str, written: list[str]) -> None:
    """One line on stderr when ``source`` used flat names of earlier releases (``written``), naming the new
    keys; said once per source and set of names. While deferred (:func:`defer_notes`, the CLI) the names are
    kept until :func:`flush_notes` (one line per source) or dropped by :func:`drop_notes` (an error is reported
    instead: a bad input stays one line)."""
    old = [w for w in dict.fromkeys(written) if w in FLAT_NAMES and w not in KEYS and w != "task"]
    if not old:
        return
    if _pending is not None:
        _pending.setdefault(source, []).extend(old)
        return
    _say(source, old)


def defer_notes() -> None:
    """Keep the notes of :func:`note_flat_names` until :func:`flush_notes` or :func:`drop_notes`."""
    global _pending
    _pending = {}


def flush_notes() -> None:
    """Say the kept notes (one line per source) and stop deferring."""
    global _pending
    pending, _pending = _pending or {}, None
    for source, names in pending.items():
        _say(source, list(dict.fromkeys(names)))


def drop_notes() -> None:
    """Forget the kept notes (an error is reported instead) and stop deferring."""
    global _pending
    _pending = None


def _say(source: str, old: list[str]) -> None:
    pairs = [f"{w} -> {FLAT_NAMES[w]}" for w in old]
    shown = ", ".join(pairs[:4]) + (f" and {len(pairs) - 4} more" if len(pairs) > 4 else "")
    msg = f"note: {source}: flat setting names are deprecated, use the sectioned keys ({shown})"
    if msg not in _noted:
        _noted.add(msg)
        print(msg, file=sys.stderr)


def field_docs() -> dict[str, str]:
    """Dotted key -> the docstring written after its field in :mod:`areal_cli.config.sections` (and the
    top-level fields' in :mod:`areal_cli.config.train`), whitespace folded."""
    docs: dict[str, str] = {}
    by_class = {cls.__name__: sec for sec, cls in SECTIONS.items()}
    here = Path(__file__).parent
    for file in ("sections.py", "train.py"):
        tree = ast.parse((here / file).read_text(encoding="utf-8"))
        for node in tree.body:
            if not isinstance(node, ast.ClassDef) or node.name not in (*by_class, "TrainConfig"):
                continue
            sec = by_class.get(node.name)
            body = node.body
            for a, b in zip(body, body[1:]):
                if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                        and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)):
                    name = f"{sec}.{a.target.id}" if sec else a.target.id
                    if name in KEYS:
                        docs[name] = " ".join(b.value.value.split())
    return docs

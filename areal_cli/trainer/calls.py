"""Trainer call names: what ``await group.call(name, *args, **kwargs)`` runs on each rank, and how a rank builds its
engine (:mod:`areal_cli.trainer.group` on the controller, :mod:`areal_cli.trainer.worker` on the ranks).

Call names (:func:`resolve`): ``"engine.<attr>[.<attr>...]"`` -- an attribute of the engine, called with the
arguments when callable, else returned (then no arguments allowed); ``"pkg.module:function"`` -- imported and
called as ``function(engine, *args, **kwargs)``. SPMD: every rank runs the same call with the same arguments
(the engine splits work over its data-parallel ranks itself); the result of global rank 0 is returned.
"""

from __future__ import annotations

import importlib
import re
from typing import Any


def check_name(name: str) -> None:
    """Syntax of a call name (see the module docstring).

    Raises:
        ValueError: neither ``engine.<attr>`` nor ``pkg.module:function``.
    """
    if not isinstance(name, str):
        raise ValueError(f"trainer call name must be a str, got {type(name).__name__}")
    ident = r"[A-Za-z_][A-Za-z0-9_]*"
    if re.fullmatch(rf"engine(\.{ident})+", name) or re.fullmatch(rf"{ident}(\.{ident})*:{ident}(\.{ident})*", name):
        return
    raise ValueError(f"trainer call name {name!r}: expected 'engine.<attribute>' or 'pkg.module:function'")


def resolve(name: str, engine: Any) -> tuple[Any, bool]:
    """``(target, is_function)`` for a call name: an engine attribute (callable or value) or an imported
    function (to be called with ``engine`` first).

    Raises:
        ValueError: bad syntax. ImportError / AttributeError: nothing of that name.
    """
    check_name(name)
    if name.startswith("engine."):
        obj = engine
        for part in name.split(".")[1:]:
            obj = getattr(obj, part)
        return obj, False
    module, _, attr = name.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"trainer call {name!r}: not a function")
    return obj, True


def run_call(engine: Any, name: str, args: tuple, kwargs: dict) -> Any:
    """Run one call on this process's ``engine`` (what every rank does for ``group.call``)."""
    target, is_function = resolve(name, engine)
    if is_function:
        return target(engine, *args, **kwargs)
    if callable(target):
        return target(*args, **kwargs)
    if args or kwargs:
        raise TypeError(f"trainer call {name!r}: an attribute, takes no arguments")
    return target


def build_engine(factory: str, engine_kwargs: dict) -> Any:
    """``factory(**engine_kwargs)`` where ``factory`` is ``"pkg.module:Class"``."""
    module, _, attr = factory.partition(":")
    cls = importlib.import_module(module)
    for part in attr.split("."):
        cls = getattr(cls, part)
    return cls(**engine_kwargs)


def engine_info(engine: Any) -> dict:
    """What the controller reads once: ``{"vocab_size", "world_size"}`` (vocab_size None if the engine has none)."""
    try:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_initialized() else 1
    except ImportError:  # pragma: no cover - torch is a dependency
        world = 1
    return {"vocab_size": getattr(engine, "vocab_size", None), "world_size": world}


def parallel_kwargs(tp: int, pp: int) -> dict:
    """Engine keyword arguments for model parallelism: only the sizes > 1 (an engine without them works)."""
    out = {}
    if tp > 1:
        out["tensor_parallel"] = int(tp)
    if pp > 1:
        out["pipeline_parallel"] = int(pp)
    return out

"""Names of user code: ``"package.module:attr"`` or ``"path/to/file.py:attr"``.

A recipe names its dataset, reward function and rollout workflow this way, so user code plugs in with no
edit to the kit:

- ``my_pkg.rewards:exact_match`` -- an importable module (installed, on ``PYTHONPATH``, or in the run's
  ``task.code_dir``, which :func:`add_code_dir` puts first on ``sys.path``: by default the recipe's folder);
- ``rewards.py:exact_match`` / ``/abs/path/rewards.py:exact_match`` -- a Python file; a relative path is
  relative to the recipe's folder (``-o`` overrides: to the current directory). :func:`absolute_spec` fixes
  it when the recipe is read, so checkpoints and child processes see the same file.

``attr`` may be a dotted chain (``module:Class.method``). A file is imported once per process under a
module name derived from its absolute path (``_areal_user_<stem>_<hash>``), so classes defined there
pickle by reference in the processes that loaded it.

Errors are one line (:class:`~areal_cli.foundations.errors.UserError`): a malformed name, a missing file or module,
an exception while importing (type, message and the ``file:line`` it came from), a missing attribute.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from areal_cli.foundations.errors import UserError

_MODULE_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_ATTR = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def is_file_spec(spec: str) -> bool:
    """True for ``"some/file.py:attr"`` (the part before the last ``:`` ends in ``.py``)."""
    head, sep, _ = spec.rpartition(":")
    return bool(sep) and head.endswith(".py")


def check_spec(spec: Any, what: str) -> str:
    """Return ``spec`` if it has the form ``module:attr`` or ``file.py:attr``.

    Raises:
        UserError: ``<what>: expected 'package.module:attr' or 'path/file.py:attr', got ...``.
    """
    if isinstance(spec, str):
        head, sep, attr = spec.rpartition(":")
        if sep and _ATTR.match(attr) and (is_file_spec(spec) or _MODULE_SPEC.match(spec)):
            return spec
    raise UserError(f"{what}: expected 'package.module:attr' or 'path/file.py:attr', got {spec!r}")


def absolute_spec(spec: str, base_dir: Path | str) -> str:
    """``spec`` with a relative file path made absolute against ``base_dir`` (module names unchanged)."""
    if not is_file_spec(spec):
        return spec
    path, _, attr = spec.rpartition(":")
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = Path(base_dir) / p
    return f"{p.resolve()}:{attr}"


def add_code_dir(code_dir: str | Path | None) -> None:
    """Put ``task.code_dir`` first on ``sys.path`` (once) so ``module:attr`` names find the user's modules there.

    Child processes started with ``spawn`` (reward workers, the rollout process) inherit ``sys.path``.
    """
    if not code_dir:
        return
    d = str(Path(code_dir).resolve())
    if d not in sys.path:
        sys.path.insert(0, d)


def _origin(exc: BaseException) -> str:
    """``file:line`` where user code raised: a syntax error's own location, else the innermost frame that is
    not the import machinery's; ``""`` when unknown."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" ({exc.filename}:{exc.lineno})"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
    return f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return " ".join(text.split())[:400]


def _import_file(path: Path, what: str):
    if not path.is_file():
        raise UserError(f"{what}: file {path} not found")
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_areal_user_{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"{what}: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - anything raised by user code at import
        del sys.modules[name]
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise UserError(f"{what}: importing {path} raised {_one_line(exc)}{_origin(exc)}") from None
    return module


def _import_module(name: str, what: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise UserError(f"{what}: no module named '{exc.name}' (install it, put it on PYTHONPATH or in the "
                            f"recipe's folder, or name a file: path/to/file.py:attr)") from None
        raise UserError(f"{what}: importing {name} raised {_one_line(exc)}{_origin(exc)}") from None
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise UserError(f"{what}: importing {name} raised {_one_line(exc)}{_origin(exc)}") from None


def load_object(spec: str, what: str = "object") -> Any:
    """The object named by ``spec`` (``module:attr`` or ``file.py:attr``; see the module docstring).

    Args:
        what: how the error message names it, e.g. ``"field 'task.reward'"``.
    Raises:
        UserError: one line (malformed name, missing file/module/attribute, exception at import).
    """
    check_spec(spec, what)
    head, _, attr = spec.rpartition(":")
    module = _import_file(Path(head), what) if is_file_spec(spec) else _import_module(head, what)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserError(f"{what}: {head} has no attribute '{attr}'") from None
    return obj

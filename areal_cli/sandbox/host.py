"""What the host gives the sandbox: the interpreter that runs programs, the paths they may read, whether an
unprivileged uid can reach them, the uid range, and the settings read from the environment.

Grader-side only (the harness never imports this). Everything here is decided per call, from the
environment variables documented in :mod:`areal_cli.sandbox.runner`, so that a test (or a user) can change
them without restarting the process.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_UID_RANGE = (1 << 24, (1 << 30) - 1)


class HostConfigError(ValueError):
    """An ``AREAL_SANDBOX_*`` environment variable has a value the sandbox cannot use (one line)."""


@dataclass(frozen=True)
class Interpreter:
    """The Python that runs sandboxed programs.

    Attributes:
        executable: its path (the harness is started with it).
        prefixes: its ``base_prefix``/``prefix`` (and exec variants), symlinks resolved.
        stdlib_path: its ``sys.path`` without site-packages (``-I -S``), the program's standard library.
        own: True when it is the grader's own interpreter (``sys.executable``).
    """

    executable: str
    prefixes: tuple[str, ...]
    stdlib_path: tuple[str, ...]
    own: bool


def interpreter() -> Interpreter:
    """The sandbox interpreter: ``AREAL_SANDBOX_PYTHON`` when set, else this process's interpreter.

    Raises:
        HostConfigError: ``AREAL_SANDBOX_PYTHON`` is not a runnable Python of this major.minor version.
    """
    chosen = os.environ.get("AREAL_SANDBOX_PYTHON", "").strip()
    if not chosen:
        prefixes = (sys.base_prefix, sys.base_exec_prefix)
        stdlib = tuple(p for p in sys.path if p and os.path.realpath(p).startswith(tuple(os.path.realpath(x) for x in prefixes)) and "-packages" not in p)
        return Interpreter(sys.executable, _resolved(prefixes), stdlib, True)
    return _query(chosen)


@functools.lru_cache(maxsize=8)
def _query(executable: str) -> Interpreter:
    where = f"AREAL_SANDBOX_PYTHON={executable}"
    if not os.path.isabs(executable) or not os.path.isfile(executable) or not os.access(executable, os.X_OK):
        raise HostConfigError(f"{where}: not an absolute path to an executable file (e.g. /usr/bin/python3.11)")
    code = "import sys, json; print(json.dumps([list(sys.version_info[:2]), sys.base_prefix, sys.base_exec_prefix, sys.path]))"
    try:
        out = subprocess.run([executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30, check=True)
        version, base, base_exec, path = json.loads(out.stdout)
    except subprocess.CalledProcessError as exc:
        raise HostConfigError(f"{where}: cannot run it as Python (exit status {exc.returncode})") from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise HostConfigError(f"{where}: cannot run it as Python ({type(exc).__name__}: {exc})") from None
    except ValueError:
        raise HostConfigError(f"{where}: cannot run it as Python (it printed no interpreter information)") from None
    if tuple(version) != tuple(sys.version_info[:2]):
        raise HostConfigError(
            f"{where}: Python {version[0]}.{version[1]}, but the grader runs {sys.version_info[0]}.{sys.version_info[1]} "
            "(programs import this environment's packages, so the versions must match)"
        )
    return Interpreter(executable, _resolved((base, base_exec)), tuple(p for p in path if p), False)


def _resolved(paths) -> tuple[str, ...]:
    return tuple(sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)}))


def _dedupe_nested(paths: list[str]) -> list[str]:
    out: list[str] = []
    for path in sorted(set(paths)):
        if not any(path == r or path.startswith(r.rstrip("/") + "/") for r in out):
            out.append(path)
    return out


def read_roots(interp: Interpreter | None = None) -> list[str]:
    """Host paths a sandboxed program may read: the interpreter's installation, this environment's
    packages (a virtual environment's prefix) and the system libraries.

    ``/usr``, ``/lib*``, ``/etc/ld.so.cache`` and the prefixes; symlinks resolved, nested paths dropped.
    Home directories, the repository, data sets and ``/tmp`` are not among them.
    """
    interp = interp or interpreter()
    candidates = [*interp.prefixes, "/usr", "/etc/ld.so.cache", *(f"/{n}" for n in ("lib", "lib32", "lib64", "libx32"))]
    if sys.prefix != sys.base_prefix:  # a virtual environment: its site-packages
        candidates += [sys.prefix, sys.exec_prefix]
    if interp.own:
        candidates += [sys.base_prefix, sys.base_exec_prefix]
    return _dedupe_nested([os.path.realpath(p) for p in candidates if os.path.exists(p)])


def program_sys_path(interp: Interpreter, roots: list[str]) -> list[str]:
    """The program's import path: the interpreter's standard library, then this process's entries that lie
    inside the read roots (site-packages)."""
    out = [p for p in interp.stdlib_path if os.path.isdir(p)]
    for p in sys.path:
        if not p or not os.path.isdir(p) or p in out:
            continue
        real = os.path.realpath(p)
        if "-packages" in real and any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
            out.append(p)
    return out


def unreachable(paths: list[str]) -> str | None:
    """Why an unprivileged uid cannot reach ``paths``, or None when it can.

    Every directory on the way must let others search it (the ``o+x`` bit): e.g.
    ``"/root is mode 700, on the way to /root/.pyenv/versions/3.11.7"``.
    """
    for path in paths:
        p = Path(path)
        for d in [*reversed(p.parents), p]:
            try:
                mode = os.stat(d).st_mode
            except OSError as exc:
                return f"{d}: {exc.strerror}"
            if stat.S_ISDIR(mode) and not mode & 0o001:
                return f"{d} is mode {stat.S_IMODE(mode):o}, on the way to {path}"
    return None


def uid_range() -> tuple[int, int]:
    """``AREAL_SANDBOX_UID_RANGE`` (``LO-HI``, inclusive) or the default ``2**24 .. 2**30 - 1``.

    Raises:
        HostConfigError: malformed, or not within 1 .. 2**32 - 2.
    """
    raw = os.environ.get("AREAL_SANDBOX_UID_RANGE", "").strip()
    if not raw:
        return DEFAULT_UID_RANGE
    try:
        lo, hi = (int(x) for x in raw.split("-"))
    except ValueError:
        raise HostConfigError(f"AREAL_SANDBOX_UID_RANGE={raw!r}: expected LO-HI, e.g. 200000-265535") from None
    if not 1 <= lo <= hi <= (1 << 32) - 2:
        raise HostConfigError(f"AREAL_SANDBOX_UID_RANGE={raw!r}: need 1 <= LO <= HI <= 4294967294")
    return lo, hi


def isolation_setting() -> str:
    """``AREAL_SANDBOX_ISOLATION`` (``auto`` or ``strict``; default ``auto``).

    Raises:
        HostConfigError: any other value.
    """
    raw = os.environ.get("AREAL_SANDBOX_ISOLATION", "").strip() or "auto"
    if raw not in ("auto", "strict"):
        raise HostConfigError(f"AREAL_SANDBOX_ISOLATION={raw!r}: expected 'auto' or 'strict'")
    return raw


def refuse_namespaces() -> bool:
    """``AREAL_SANDBOX_REFUSE_NAMESPACES`` is set to 1/true/yes: simulate a container that refuses them."""
    return os.environ.get("AREAL_SANDBOX_REFUSE_NAMESPACES", "").strip().lower() in ("1", "true", "yes")

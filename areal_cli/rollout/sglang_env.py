"""SGLang in an environment of its own: build it (CPU mode, pinned), check it, and find the Python that runs it.

Real SGLang pins ``torch==2.14.1`` (a CUDA build) while the kit's trainer pins ``torch==2.13.0``, so SGLang
usually lives in a separate virtual environment, and the kit starts its servers with that environment's Python
(``rollout.sglang_python``). :func:`build_env` makes such an environment for SGLang's CPU mode
(``SGLANG_USE_CPU_ENGINE=1``, ``--device cpu``, ``--attention-backend torch_native``) from the files in
``sglang_cpu/`` next to this module:

- ``requirements.txt``: every package at an exact version, installed with ``pip --no-deps`` (SGLang's own
  metadata asks for CUDA-only packages its CPU mode never imports), with the kit's CPU ``torch==2.13.0``;
- ``sgl_kernel/``: a stand-in for SGLang's compiled kernels (imported at module import time, never called on a CPU
  without AMX); each of its functions raises ``NotImplementedError`` naming itself if called;
- ``areal_torchvision_ops.py`` + ``.pth``: the two ``torchvision`` operator schemas its CUDA-linked wheel fails to
  register beside a CPU torch, defined before torchvision is first imported.

The measured recipe, endpoint table and figures: ``shared/reference/sglang_cpu.md`` of the workspace. What this
proves and what it does not (SGLang's scheduler, HTTP API, weight loading and radix cache on CPU with torch-native
attention; not its CUDA kernels, NCCL or CUDA graphs): docs/guides/real-sglang.md.

A finished environment holds :data:`MARKER` (written last); one being built holds :data:`BUILDING`. Only a folder
with one of them is ever removed (an unfinished build, or pins that changed): a virtual environment of someone
else's is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from areal_cli.foundations.errors import UserError

SGLANG_VERSION = "0.5.23"
FILES = Path(__file__).resolve().parent / "sglang_cpu"
MARKER = "areal-sglang-env.json"
BUILDING = "areal-sglang-env.building"
ENV_PYTHON = "AREAL_SGLANG_PYTHON"  # overrides where "auto" looks first
SETUP_COMMAND = "areal engine setup sglang"
SHIMS = ("sgl_kernel", "areal_torchvision_ops.py", "areal_torchvision_ops.pth")

#: What the full check imports in the environment: SGLang's HTTP server module (which loads torch, torchvision and
#: sgl_kernel as a server start does; 10-20 s). The quick check only finds the packages and reads their versions
#: (``import sglang`` alone takes 5-8 s here).
_CHECK = """
import importlib.util, json, os, sys
from importlib.metadata import version
spec = importlib.util.find_spec("sglang")
if spec is None:
    sys.exit("No module named sglang")
real = any(os.path.isdir(os.path.join(p, "srt")) for p in (spec.submodule_search_locations or []))
if {full} and real:
    import sglang.srt.entrypoints.http_server
print(json.dumps({{"sglang": version("sglang") if real else __import__("sglang").__version__,
                  "torch": version("torch")}}))
"""


def default_env_dir() -> Path:
    """Where :func:`build_env` puts the environment by default: ``$AREAL_HOME/engines/sglang-<version>-cpu``
    (``AREAL_HOME`` defaults to ``~/.cache/areal``)."""
    home = os.environ.get("AREAL_HOME") or str(Path.home() / ".cache" / "areal")
    return Path(home) / "engines" / f"sglang-{SGLANG_VERSION}-cpu"


def env_python(env_dir: Path) -> Path:
    """The interpreter of the virtual environment ``env_dir``."""
    return Path(env_dir) / "bin" / "python"


def requirements_digest() -> str:
    """sha256 of the pinned requirements and the shims (a changed pin or shim means a stale environment)."""
    h = hashlib.sha256()
    for p in sorted(FILES.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(FILES)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise UserError(f"{python}: cannot run it ({out.stderr.strip().splitlines()[-1:] or out.returncode})")
    return Path(out.stdout.strip())


def _fix_for(py: Path) -> str:
    """What to do about a Python that cannot run SGLang: rebuild the environment areal built it in, or build one."""
    env = py.parent.parent
    if built_env(env) is not None or (env / BUILDING).exists():
        return f"rebuild it with `{SETUP_COMMAND} --env {env} --force`"
    return f"it is not an SGLang environment: build one with `{SETUP_COMMAND}` and use its Python"


def check_python(python: str | Path, *, full: bool = True, timeout_s: float = 300.0) -> dict:
    """Import SGLang in ``python``: its HTTP server module as a server start would (``SGLANG_USE_CPU_ENGINE=1``;
    10-20 s), or with ``full=False`` only find the packages and read their versions (a fraction of a second: what a
    run checks before it starts).

    Returns:
        ``{"sglang": version, "torch": version}`` of that environment.
    Raises:
        UserError: one line: the interpreter is missing or cannot run, or the import fails (its last error line),
            with what to do (rebuild the environment areal built, or build one).
    """
    py = Path(python)
    if not py.exists():
        raise UserError(f"SGLang's Python {py} does not exist; build an environment with `{SETUP_COMMAND}` "
                        f"(or give the Python of an environment with SGLang)")
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1")
    try:
        out = subprocess.run([str(py), "-c", _CHECK.format(full=bool(full))], capture_output=True, text=True,
                             timeout=timeout_s, env=env)
    except PermissionError:
        raise UserError(f"SGLang's Python {py} cannot be run (permission denied): it must be an executable "
                        f"interpreter (chmod +x), e.g. ENV/bin/python of `{SETUP_COMMAND} --env ENV`") from None
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UserError(f"SGLang's Python {py} cannot be run ({type(e).__name__}: {e}); {_fix_for(py)}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        raise UserError(f"SGLang's Python {py}: `import sglang` fails ({last}); {_fix_for(py)}")
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise UserError(f"SGLang's Python {py}: unexpected output of the import check: "
                        f"{out.stdout.strip()[-200:]!r}") from None


def built_env(env_dir: Path) -> dict | None:
    """The marker of a finished environment in ``env_dir`` (None: not built, or built unfinished)."""
    try:
        return json.loads((Path(env_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def build_env(env_dir: Path | None = None, *, python: str = sys.executable, force: bool = False,
              log: Callable[[str], None] = print) -> Path:
    """Build (or verify) SGLang's CPU environment in ``env_dir``; return its Python.

    Steps: ``python -m venv``; ``pip install --no-deps -r sglang_cpu/requirements.txt`` (about 3.2 GB, 2-3 minutes
    with a warm pip cache); the shims copied into its site-packages; :func:`check_python`; the marker written last.
    An environment whose marker matches the pinned files is only checked (``force``: rebuilt anyway); one without
    a marker (an interrupted build) or with another digest is removed and rebuilt.

    Args:
        env_dir: default :func:`default_env_dir`.
        python: the interpreter that creates the venv (SGLang 0.5.23 needs Python 3.10-3.12; torch 2.13.0's CPU
            build is on this machine's disk for 3.11).
    Raises:
        UserError: one line: the folder is not ours to replace or cannot be written, the interpreter is
            unsupported, pip failed (its output is kept in ``<env_dir>.build.log`` beside the folder; removed after a
            build that succeeds), or the check failed.
    """
    env_dir = Path(env_dir or default_env_dir()).expanduser().absolute()
    digest = requirements_digest()
    marker = built_env(env_dir)
    py = env_python(env_dir)
    if marker is not None and marker.get("digest") == digest and not force:
        info = check_python(py)
        log(f"SGLang {info['sglang']} environment ready: {py}")
        return py
    ours = marker is not None or (env_dir / BUILDING).exists()
    if env_dir.is_file() or (env_dir.is_dir() and any(env_dir.iterdir()) and not ours):
        raise UserError(f"{env_dir}: exists and is not an environment `{SETUP_COMMAND}` built; give another --env")
    try:
        vi = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                            capture_output=True, text=True, timeout=120).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UserError(f"{python}: cannot run it ({type(e).__name__}: {e})") from None
    if vi not in ("3.10", "3.11", "3.12"):
        raise UserError(f"{python}: Python {vi or '?'}; SGLang {SGLANG_VERSION} needs 3.10-3.12")
    build_log = env_dir.parent / f"{env_dir.name}.build.log"
    pre_existing = env_dir.is_dir()  # an empty folder given as --env stays (emptied) after a failed build
    try:
        if ours:
            log(f"removing the {'stale' if marker and marker.get('digest') != digest else 'unfinished'} "
                f"environment {env_dir}" if not force else f"removing {env_dir} to build it again (--force)")
            (env_dir / MARKER).unlink(missing_ok=True)  # first: a removal cut short is an unfinished build
            (env_dir / BUILDING).write_text("")
            for p in env_dir.iterdir():
                if p.name != BUILDING:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        env_dir.mkdir(parents=True, exist_ok=True)
        (env_dir / BUILDING).write_text("")
        logf = open(build_log, "w")
    except OSError as e:
        raise UserError(f"{env_dir}: cannot write there ({e.strerror or e}); give another --env") from None
    steps = [
        ("creating the virtual environment", [python, "-m", "venv", str(env_dir)]),
        (f"installing SGLang {SGLANG_VERSION} and its CPU dependencies (pinned, --no-deps; 2-3 min, ~3.2 GB)",
         [str(py), "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q",
          "-r", str(FILES / "requirements.txt")]),
    ]
    try:
        with logf:
            for what, cmd in steps:
                log(what)
                logf.write(f"$ {' '.join(cmd)}\n")
                logf.flush()
                rc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT).returncode
                if rc != 0:
                    tail = [ln for ln in build_log.read_text(errors="replace").splitlines() if ln.strip()][-1:]
                    raise UserError(f"building the SGLang environment failed while {what} (exit {rc}): "
                                    f"{tail[0] if tail else ''} (log {build_log})")
        site = _site_packages(py)
        for name in SHIMS:
            src, dst = FILES / name, site / name
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, dst)
        log("checking that SGLang's server imports")
        info = check_python(py)
        (env_dir / MARKER).write_text(json.dumps({"digest": digest, **info}, indent=1) + "\n")
        (env_dir / BUILDING).unlink()
    except BaseException:  # an unfinished environment is never left behind (the build log is kept)
        if pre_existing:
            for p in list(env_dir.iterdir()) if env_dir.is_dir() else ():
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink()
        else:
            shutil.rmtree(env_dir, ignore_errors=True)
        raise
    build_log.unlink(missing_ok=True)
    log(f"SGLang {info['sglang']} environment ready: {py} (torch {info['torch']})")
    return py


def resolve_sglang_python(setting: str = "", *, what: str = "rollout.sglang_python") -> str:
    """The Python that runs SGLang servers for ``rollout.sglang_python = setting`` (``what``: how the setting is
    named in messages, e.g. ``--python``).

    ``""`` (auto): ``$AREAL_SGLANG_PYTHON`` when set, else this interpreter when it can import ``sglang``, else the
    environment :func:`build_env` made at :func:`default_env_dir` when it is finished. A path: that interpreter (or
    a virtual environment folder: its ``bin/python``).

    Raises:
        UserError: one line naming :data:`SETUP_COMMAND` when none is found.
    """
    import importlib.util

    setting = (setting or "").strip() or os.environ.get(ENV_PYTHON, "").strip()
    if setting:
        p = Path(setting).expanduser()
        if p.is_dir():
            p = env_python(p)
        if not p.exists():
            raise UserError(f"{what}: {p} does not exist; build SGLang's environment with "
                            f"`{SETUP_COMMAND} --env DIR` and give DIR/bin/python")
        return str(p)
    if importlib.util.find_spec("sglang") is not None:
        return sys.executable
    d = default_env_dir()
    if built_env(d) is not None:
        return str(env_python(d))
    if what != "rollout.sglang_python":
        raise UserError(f"no SGLang found (not importable here, no environment at {d}): build one with "
                        f"`{SETUP_COMMAND}`, or give {what} PY")
    raise UserError(f"rollout.engine: sglang: no SGLang found (not importable here, no environment at {d}): "
                    f"build one with `{SETUP_COMMAND}` (CPU mode), or set rollout.sglang_python to the Python "
                    f"of an environment with SGLang; or use rollout.engine=embedded")

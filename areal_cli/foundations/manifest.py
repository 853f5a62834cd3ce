"""The manifest of a reproduction run: what ran, from which files, with which software, on which machine.

``areal reproduce`` writes ``DIR/manifest.json`` for every run it starts (also one that fails or is
interrupted: its ``status`` says so). Fields (:func:`build_manifest`):

- ``recipe``: name, variant, path, ``sha256`` of the recipe file's bytes, the expected-metrics file and its
  sha256, command-line overrides (a run with overrides is not the locked recipe);
- ``mode`` (``retrain`` | ``eval_only``), ``subject`` (the checkpoint judged), ``status``, ``exit_code``;
- ``model`` / ``data`` / ``published_model``: Hub repo + pinned revision (or built-in), and per downloaded part
  the snapshot folder and the commit it resolved to (the Hub cache names snapshot folders by commit);
- ``packages``: versions of torch, megatron-core, transformers, math-verify, huggingface_hub, areal-cli
  (``importlib.metadata``; ``null`` when not installed);
- ``git``: commit and dirty flag of the checkout the package runs from (``"unknown"`` outside a checkout);
- ``hardware``: CPU model, logical cores, cores usable by this process, memory, GPUs (``nvidia-smi``) and
  what torch.cuda sees; ``python``, ``platform``; ``command`` (argv); ``started_at`` / ``finished_at`` (UTC
  ISO 8601) and ``elapsed_s``.

Imports: stdlib only; torch is imported only by :func:`torch_cuda_info` (when the manifest is built).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

#: Distributions whose versions a manifest records (PyPI names).
PACKAGES = ("areal-cli", "torch", "megatron-core", "transformers", "tokenizers", "math-verify", "huggingface_hub",
            "safetensors", "datasets", "numpy")
MANIFEST_SCHEMA = 1
_SNAPSHOT = re.compile(r"^[0-9a-f]{40}$")


def utc_now() -> str:
    """The current time, UTC, ISO 8601 with seconds (``2025-06-01T12:00:00Z``)."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def file_sha256(path: Path) -> str:
    """Hex sha256 of the bytes of ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """``{distribution: version}`` from the installed metadata; None for one that is not installed."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_info(root: Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the git checkout at ``root`` (default: the one holding this package).

    ``dirty`` is True when tracked files differ from the commit (untracked files do not count, as
    ``git describe --dirty``). Read-only: ``GIT_OPTIONAL_LOCKS=0`` keeps ``git status`` from refreshing the index.

    Returns:
        ``{"commit": sha | "unknown", "dirty": bool | None, "root": str | None}``; "unknown" when ``root``
        is not a checkout or git is missing.
    """
    root = Path(root) if root is not None else Path(__file__).resolve().parents[2]
    unknown = {"commit": "unknown", "dirty": None, "root": None}
    if not (root / ".git").exists() or shutil.which("git") is None:
        return unknown
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=20, env=env)
        if commit.returncode != 0:
            return unknown
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return unknown
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return {"commit": commit.stdout.strip(), "dirty": dirty, "root": str(root)}


def cpu_model() -> str:
    """The CPU model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_bytes() -> int | None:
    """Total physical memory in bytes (``/proc/meminfo`` MemTotal; ``sysconf`` elsewhere), None if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def nvidia_gpus(timeout_s: float = 15.0) -> list[dict[str, Any]] | None:
    """GPUs listed by ``nvidia-smi`` (index, name, memory MiB, driver), honouring ``CUDA_VISIBLE_DEVICES``
    when it lists indices. None when nvidia-smi is missing or fails (no NVIDIA driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        p = subprocess.run([exe, "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    gpus = []
    for line in p.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) != 4:
            continue
        idx, name, mem, driver = parts
        gpus.append({"index": int(idx) if idx.isdigit() else idx, "name": name,
                     "memory_mib": int(mem) if mem.isdigit() else mem, "driver": driver})
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and re.fullmatch(r"[\d,\s]*", visible):
        keep = {int(x) for x in visible.split(",") if x.strip()}
        gpus = [g for g in gpus if g["index"] in keep]
    return gpus


def gpu_count() -> int:
    """GPUs usable here, from :func:`nvidia_gpus` (0 without an NVIDIA driver). Does not import torch."""
    return len(nvidia_gpus() or [])


def torch_cuda_info() -> dict[str, Any] | None:
    """What torch sees: ``{"torch", "cuda_available", "device_count", "devices", "cuda"}``; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    available = bool(torch.cuda.is_available())
    return {"torch": torch.__version__, "cuda_available": available,
            "device_count": torch.cuda.device_count() if available else 0,
            "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if available else [],
            "cuda": torch.version.cuda}


def hardware_info() -> dict[str, Any]:
    """CPU model, cores (logical, usable by this process), memory, GPUs (nvidia-smi) and torch.cuda."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "cpus_usable": usable, "memory_bytes": memory_bytes(),
            "gpus": nvidia_gpus(), "torch_cuda": torch_cuda_info(), "machine": platform.machine()}


def snapshot_revision(path: Path) -> str | None:
    """The commit a Hub snapshot folder resolved to: the cache names it ``.../snapshots/<40-hex>``; None for
    a plain local folder."""
    name = Path(path).name
    return name if _SNAPSHOT.match(name) and Path(path).parent.name == "snapshots" else None


def hub_ref(ref: Any) -> dict[str, Any] | None:
    """A recipe's :class:`~areal_cli.recipes.HubRef` as JSON (repo, revision, builtin), None for no reference."""
    if ref is None:
        return None
    return {"repo": ref.repo, "revision": ref.revision, "builtin": ref.builtin}


def build_manifest(recipe: Any, *, mode: str, subject: str, variant: str | None, overrides: list[str],
                   command: list[str], started_at: str, finished_at: str, elapsed_s: float, status: str,
                   exit_code: int | None, downloads: dict[str, Path] | None = None,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of one run of ``recipe`` (an :class:`areal_cli.recipes.Recipe`); see the module docstring.

    Args:
        status: ``passed`` | ``failed`` | ``error: <one line>`` | ``interrupted``.
        downloads: role -> snapshot folder of what was downloaded for this run.
        extra: more top-level fields (e.g. the run folders).
    """
    f = recipe.file
    manifest: dict[str, Any] = {
        "schema": MANIFEST_SCHEMA,
        "recipe": {"name": recipe.name, "variant": variant, "path": str(recipe.path),
                   "sha256": file_sha256(recipe.path), "expected_path": str(recipe.expected_path),
                   "expected_sha256": file_sha256(recipe.expected_path), "overrides": list(overrides),
                   "kind": f.kind, "trainer": f.trainer},
        "mode": mode, "subject": subject, "status": status, "exit_code": exit_code,
        "model": hub_ref(f.model), "data": {**hub_ref(f.data), "files": [{"path": x.path, "sha256": x.sha256}
                                                                         for x in f.data.files]},
        "published_model": hub_ref(f.published_model),
        "downloads": {role: {"path": str(p), "resolved_revision": snapshot_revision(p)}
                      for role, p in (downloads or {}).items()},
        "packages": package_versions(), "git": git_info(), "hardware": hardware_info(),
        "python": sys.version.split()[0], "platform": platform.platform(), "command": list(command),
        "started_at": started_at, "finished_at": finished_at, "elapsed_s": round(elapsed_s, 3),
    }
    manifest.update(extra or {})
    return manifest

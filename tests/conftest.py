"""Shared test settings: one torch thread per process (the machines are 2 shared cores); the sandbox's reduced
mode as a container that refuses namespaces runs it."""

import os
import sys
from pathlib import Path

import pytest

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared folder beside the repository (real data, SGLang fixtures)."""
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} not found: tests need ../shared beside the repository")
    return SHARED


def reachable_python() -> str | None:
    """A Python of this major.minor that an unprivileged uid can run: this one, or a system one."""
    from areal_cli.sandbox import host

    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for exe in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if not os.path.exists(exe):
            continue
        if exe != sys.executable:
            os.environ["AREAL_SANDBOX_PYTHON"] = exe
        try:
            interp = host.interpreter()
            if host.unreachable(host.read_roots(interp)) is None:
                return exe
        except host.HostConfigError:
            continue
        finally:
            os.environ.pop("AREAL_SANDBOX_PYTHON", None)
    return None


@pytest.fixture
def reduced_mode(monkeypatch) -> dict:
    """The sandbox as a container that refuses namespaces runs it (``AREAL_SANDBOX_REFUSE_NAMESPACES=1``).

    As root, the program must drop to an unprivileged uid, which must reach the interpreter: when this one
    lives under a private directory (``/root/.pyenv``), a system Python of the same version runs programs
    (``AREAL_SANDBOX_PYTHON``), as the refusal message tells users to do. Returns the environment set.
    """
    env = {"AREAL_SANDBOX_REFUSE_NAMESPACES": "1"}
    if os.geteuid() == 0:
        exe = reachable_python()
        if exe is None:
            pytest.fail("no Python of this version that other users can read: install one (e.g. the system's "
                        "python3) so that the reduced mode can be tested")
        if exe != sys.executable:
            env["AREAL_SANDBOX_PYTHON"] = exe
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env

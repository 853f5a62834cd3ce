"""Shared test settings and fixtures.

Settings: one torch thread per process (the machines are 2 shared cores). Every test runs under the default
per-test timeout of pyproject.toml's ``[tool.pytest.ini_options] timeout = 900`` (pytest-timeout): a hung test
fails after 15 minutes instead of hanging CI; a test that needs longer says so with ``@pytest.mark.timeout(n)``.

Markers (registered in pyproject.toml): ``slow`` (learning runs, long multi-process runs) and ``multiproc``
(tests that start processes: servers, torchrun, CLI subprocesses). The fast part is
``pytest -m "not slow and not multiproc"``; CI runs everything.

Fixtures: ``shared_dir`` (../shared), ``dirs`` (the tiny model pair of the rollout tests, one per module),
``warm_model`` (the tiny recipe's model after a short warm start, one per module), ``reduced_mode`` (the sandbox
as a container that refuses namespaces runs it). Helpers that are not fixtures live in ``tests/helpers/``.
"""

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


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): one worker per core (at most 4) for a run over several test files, none
    for one file or a few tests of one file (``pytest tests/test_cli.py``): xdist's start-up would cost more than it
    saves. An explicit ``-n N`` is used as given."""
    files = {str(a).split("::")[0] for a in config.args}
    if len(files) == 1 and next(iter(files)).endswith(".py"):
        return 0
    return None  # xdist's own count (cores), capped by --maxprocesses


def pytest_collection_modifyitems(config, items):
    """Longest test files first (their measured seconds in ``tests/file_durations.json``; see
    :mod:`helpers.file_durations`), each file's tests in their own order. With ``--dist=loadfile`` and
    ``--no-loadscope-reorder`` (pyproject's addopts) xdist queues files in this order, so no long file starts
    last and alone sets the end of the run. Every worker sorts the same collection the same way."""
    from helpers.file_durations import DEFAULT_S, load

    seconds = load()
    if not seconds:
        return
    first = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], i)
    items.sort(key=lambda it: (-seconds.get(it.nodeid.split("::")[0], DEFAULT_S),
                               first[it.nodeid.split("::")[0]]))


def pytest_addoption(parser):
    parser.addoption("--real-sglang", metavar="PY", default=None,
                     help="run tests/real_sglang/ against real SGLang servers started with this Python (the "
                          "environment `areal engine setup sglang` builds; .ci/real_sglang does both)")


def pytest_ignore_collect(collection_path, config):
    """``tests/real_sglang/`` needs a real SGLang environment: it is collected only with ``--real-sglang PY`` (the
    real-SGLang CI job, ``.ci/real_sglang``), which then fails loudly if that environment is broken."""
    if "real_sglang" in Path(collection_path).parts and not config.getoption("--real-sglang"):
        return True
    return None


def pytest_configure(config):
    """Stop at once, with one line, when ../shared is missing: many modules read its data and SGLang recordings
    at import or collection time and would otherwise fail with raw FileNotFoundErrors."""
    if not SHARED.is_dir():
        raise pytest.UsageError(f"{SHARED} not found: the tests need the read-only ../shared folder beside the "
                                f"repository (README, 'Two commands')")


@pytest.fixture(autouse=True)
def _sandbox_isolation_restored():
    """Jobs export their sandbox setting to ``AREAL_SANDBOX_ISOLATION`` for the grader processes they start
    (:func:`areal_cli.sandbox.status.isolation_in_force`); in one pytest process that would leak a test's
    ``strict`` into the next tests, so each test gets the variable back as it found it."""
    before = os.environ.get("AREAL_SANDBOX_ISOLATION")
    yield
    if before is None:
        os.environ.pop("AREAL_SANDBOX_ISOLATION", None)
    else:
        os.environ["AREAL_SANDBOX_ISOLATION"] = before


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared folder beside the repository (real data, SGLang fixtures)."""
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} not found: tests need ../shared beside the repository")
    return SHARED


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> tuple[Path, Path]:
    """(tiny model, same model with perturbed weights): built once per session, see helpers.tiny_models."""
    from helpers.tiny_models import tiny_dirs

    return tiny_dirs(tmp_path_factory)


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory) -> Path:
    """The tiny recipe's model after 30 warm-start (SFT stage) steps: rewards are neither all 0 nor all 1."""
    from helpers.warm_model import build_warm_model

    return build_warm_model(tmp_path_factory.mktemp("warm"))


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

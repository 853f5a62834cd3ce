"""Real SGLang 0.5.23 servers (CPU mode) for the tests in this folder, started through the kit's own launcher.

Collected only with ``pytest --real-sglang PY`` (``.ci/real_sglang``): PY is the Python of the environment
``areal engine setup sglang`` builds. The servers are shared: one real SGLang server and one embedded server on the
same tiny model for the whole session (a real server takes 25-100 s to start here); each test that changes a
server's weights or pauses it puts it back (:func:`reset`).
"""

from __future__ import annotations

import pytest

from helpers.real_sglang import SERVER_LOGS, real_fleet


@pytest.fixture(scope="session")
def sglang_python(request) -> str:
    """The interpreter given with ``--real-sglang``, checked: SGLang 0.5.23's server imports there (or the session
    fails with the check's one line)."""
    from areal_cli.rollout.sglang_env import SGLANG_VERSION, check_python

    py = request.config.getoption("--real-sglang")
    info = check_python(py, full=True)
    assert info["sglang"] == SGLANG_VERSION, info
    return py


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """(tiny Qwen3 model, the same model with perturbed weights): the two policy versions of these tests."""
    from helpers.tiny_models import tiny_dirs

    return tiny_dirs(tmp_path_factory)


@pytest.fixture(scope="session")
def real_servers(sglang_python, models, tmp_path_factory):
    """Two real SGLang servers (CPU mode, float32, torch-native attention) on the tiny model, label "0", started
    together: as the kit starts them for abort-mode runs (SGLang's defaults, overlap scheduler on), and as for
    in-place runs (``--disable-overlap-schedule``)."""
    fleets = {name: real_fleet(sglang_python, models[0], tmp_path_factory.mktemp(f"real-sglang-{name}"),
                               in_place=name == "in_place", wait=False) for name in ("default", "in_place")}
    try:
        for fleet in fleets.values():
            fleet.wait_ready()
            SERVER_LOGS[fleet.urls[0]] = fleet.log_paths[0]
        yield {name: fleet.urls[0] for name, fleet in fleets.items()}
    finally:
        for fleet in fleets.values():
            fleet.stop()


@pytest.fixture(scope="session")
def real_server(real_servers):
    """The real server started with SGLang's defaults (abort-mode runs)."""
    return real_servers["default"]


@pytest.fixture(scope="session")
def real_in_place_server(real_servers):
    """The real server started as for in-place runs (``--disable-overlap-schedule``)."""
    return real_servers["in_place"]


@pytest.fixture(scope="session")
def embedded_server(models, tmp_path_factory):
    """The kit's embedded server on the same model and label, started as SGLang starts by default (requests'
    ``sampling_seed`` ignored)."""
    from helpers.servers import spawn_server

    srv = spawn_server(models[0], tmp_path_factory, log_folder="embedded", weight_version="0",
                       extra_args=["--no-deterministic-inference", "--skip-tokenizer-init"])
    yield srv.url
    srv.stop()

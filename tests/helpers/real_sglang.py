"""Real SGLang servers in tests: start them as the kit does on a CPU machine, wait until one decodes, put a shared
one back between tests. Used by ``tests/real_sglang/`` (collected only with ``pytest --real-sglang PY``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from areal_cli.rollout.protocol import (ContinueGenerationRequest, UpdateWeightsFromDiskRequest,
                                        build_abort_payload)


def real_fleet(python: str, model_dir, run_dir, *, n_servers: int = 1, weight_version: str = "0",
               in_place: bool = False, wait: bool = True):
    """Real SGLang servers on ``model_dir`` started as ``rollout.engine=sglang`` starts them on a CPU machine
    (:func:`areal_cli.rollout.sglang_launcher.cpu_mode`); ``in_place``: as for ``rollout.pause_mode: in_place``
    (``--disable-overlap-schedule``)."""
    from areal_cli.rollout.fleet import FleetSpec, launch_fleet
    from areal_cli.rollout.sglang_launcher import CPU_ENV, cpu_mode, sglang_args_from_config

    args = cpu_mode(sglang_args_from_config(str(model_dir), max_total_tokens=65536, max_running_requests=64,
                                            seed=0, weight_version=weight_version, disable_overlap_schedule=in_place),
                    dtype_given=False)
    return launch_fleet(FleetSpec(engine="sglang", n_servers=n_servers, model_path=model_dir, sglang=args,
                                  python=python, env=dict(CPU_ENV), run_dir=run_dir, startup_timeout_s=600), wait=wait)


#: url -> log file of the real servers started here (:func:`wait_decoding` reads SGLang's decode log lines)
SERVER_LOGS: dict[str, Path] = {}


def wait_decoding(url: str, timeout_s: float = 120.0) -> None:
    """Return once the server at ``url`` is decoding a request submitted before the call: a real server has
    logged a new "Decode batch" line (SGLang logs one every 40 decode steps), an embedded one has decoded 40 more
    tokens (``/server_info``); fails the test after ``timeout_s``."""
    t0 = time.monotonic()
    if url in SERVER_LOGS:
        def count() -> int:
            return SERVER_LOGS[url].read_text(errors="replace").count("Decode batch")
    else:
        def count() -> int:
            return httpx.get(url + "/server_info", timeout=10).json()["internal_states"][0]["decode_tokens"] // 40
    base = count()
    while count() <= base:
        assert time.monotonic() - t0 < timeout_s, f"{url}: nothing decoded within {timeout_s} s"
        time.sleep(0.05)


def reset(url: str, model_dir, version: str = "0") -> None:
    """Put a shared server back: generation continued, every request aborted, ``model_dir`` loaded as ``version``
    (SGLang flushes its prefix cache after the load: nothing cached survives from the test before)."""
    with httpx.Client(timeout=120) as h:
        h.post(url + "/continue_generation", json=ContinueGenerationRequest().to_json())
        h.post(url + "/abort_request", json=build_abort_payload(abort_all=True))
        r = h.post(url + "/update_weights_from_disk",
                   json=UpdateWeightsFromDiskRequest(str(model_dir), weight_version=version).to_json())
        assert r.status_code == 200 and r.json()["success"], r.text


def run(coro):
    """``asyncio.run`` for the async checks of these tests."""
    return asyncio.run(coro)

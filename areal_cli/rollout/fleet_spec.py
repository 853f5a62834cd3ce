"""What a rollout fleet launches: :class:`FleetSpec`, its checks, server addresses, and each child's command
and environment.

Everything here is decided before a process starts (:func:`areal_cli.rollout.fleet.launch_fleet` runs it
first, so a bad spec raises ``UserError`` naming the field and nothing is launched):

- :func:`check_spec`: engine, server count, ports, GPU lists, start-up timeout.
- :func:`check_model_dir`: the model directory every launched server loads.
- :func:`parse_server_addrs`: external servers' ``host:port`` list (``spec.urls`` or env
  ``AREAL_LLM_SERVER_ADDRS``) -> ``http://`` URLs.
- :func:`server_command`: ``python -m areal_cli.rollout.server ...`` (embedded) or the SGLang command line
  (:func:`areal_cli.rollout.sglang_launcher.build_sglang_command`) of server i.
- :func:`child_env`: server i's environment (``CUDA_VISIBLE_DEVICES`` from its GPU list, this ``areal_cli`` on
  ``PYTHONPATH``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from areal_cli.foundations.errors import UserError
from areal_cli.rollout.sglang_launcher import SGLangServerArgs, build_sglang_command, for_server

ENGINES = ("embedded", "sglang", "external")
ENV_ADDRS = "AREAL_LLM_SERVER_ADDRS"


@dataclass
class FleetSpec:
    """What to launch.

    Attributes:
        engine: "embedded" | "sglang" | "external".
        n_servers: number of servers (external: taken from the URL list when 0).
        model_path: HF model directory every server loads at start (not used for external).
        host: address the servers listen on.
        ports: one port per server, or None to pick free ones.
        gpu_ids: per server the GPU ids it may see (``CUDA_VISIBLE_DEVICES``), or None to leave the
            environment as it is. For SGLang each list must hold tp*dp*pp ids.
        max_running_requests, max_total_tokens, seed, weight_version, num_threads, context_length:
            embedded-server settings (server i gets seed + i).
        embedded_extra_args: more flags for ``areal_cli.rollout.server`` (tests: ``--step-delay-s``).
        sglang: template of the SGLang settings (model path, host, port and seed are set per server:
            seed = ``sglang.random_seed or 0`` + i); None -> ``SGLangServerArgs(model_path)`` defaults.
        urls: external mode: server URLs (``http://host:port`` or ``host:port``); None -> env
            ``AREAL_LLM_SERVER_ADDRS``.
        run_dir: logs go to ``run_dir/logs/server{i}.log``; None -> a new temporary directory (kept).
        startup_timeout_s: :meth:`~areal_cli.rollout.fleet.Fleet.wait_ready` gives up after this long (counted
            from the launch).
        python: interpreter for the children.
        env: extra environment variables for every child (e.g. ``PYTHONPATH`` additions).
    """

    engine: str = "embedded"
    n_servers: int = 1
    model_path: str | Path | None = None
    host: str = "127.0.0.1"
    ports: list[int] | None = None
    gpu_ids: list[list[int]] | None = None
    max_running_requests: int = 64
    max_total_tokens: int = 65536
    seed: int = 0
    weight_version: str = "0"
    num_threads: int = 1
    context_length: int | None = None
    embedded_extra_args: list[str] = field(default_factory=list)
    sglang: SGLangServerArgs | None = None
    urls: list[str] | None = None
    run_dir: str | Path | None = None
    startup_timeout_s: float = 600.0
    python: str = sys.executable
    env: dict[str, str] | None = None


def parse_server_addrs(text: str, where: str = ENV_ADDRS) -> list[str]:
    """``"h1:p1,h2:p2"`` (or full ``http://`` URLs) -> ``["http://h1:p1", "http://h2:p2"]``.

    Raises:
        UserError: an empty list or an entry that is not host:port with a port in [1, 65535].
    """
    urls = []
    for raw in (x.strip() for x in text.split(",")):
        if not raw:
            continue
        addr = raw.split("://", 1)[1] if "://" in raw else raw
        host, _, port = addr.rstrip("/").rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise UserError(f"{where}: {raw!r} is not host:port")
        urls.append(f"http://{host}:{int(port)}")
    if not urls:
        raise UserError(f"{where}: no server address given (expected host:port[,host:port...])")
    return urls


def check_model_dir(model_path, engine: str) -> str:
    """The model directory of a launched fleet as a string.

    A local path (existing, absolute or starting with ``.``; any path for the embedded engine) must hold a
    ``config.json``; anything else is passed to SGLang as is (a Hub name).

    Raises:
        UserError: no model path, or a local path that is not a model directory.
    """
    if model_path is None or not str(model_path).strip():
        raise UserError(f"fleet.model_path: required for engine {engine!r}")
    p = Path(model_path)
    local = p.exists() or p.is_absolute() or str(model_path).startswith(".")
    if (engine == "embedded" or local) and not (p / "config.json").is_file():
        raise UserError(f"{p}: not a model directory (no config.json)")
    return str(p)


def check_spec(spec: FleetSpec) -> None:
    """Check ``spec``'s fields before anything is launched (the model directory: :func:`check_model_dir`).

    Raises:
        UserError: naming the field: an unknown engine, ``n_servers`` not an integer >= 1 (>= 0 for external),
            ports not one distinct port in [1, 65535] per server, GPU lists not one non-empty list of ids >= 0
            per server (for SGLang: of tp*dp*pp ids), ``startup_timeout_s <= 0``.
    """
    if spec.engine not in ENGINES:
        raise UserError(f"fleet.engine: must be one of {', '.join(ENGINES)}, got {spec.engine!r}")
    n = spec.n_servers
    if not isinstance(n, int) or isinstance(n, bool) or n < (0 if spec.engine == "external" else 1):
        raise UserError(f"fleet.n_servers: must be an integer >= 1, got {n!r}")
    if spec.ports is not None:
        if len(spec.ports) != n:
            raise UserError(f"fleet.ports: {len(spec.ports)} ports for {n} servers")
        for p in spec.ports:
            if not isinstance(p, int) or isinstance(p, bool) or not 1 <= p <= 65535:
                raise UserError(f"fleet.ports: {p!r} is not a port in [1, 65535]")
        if len(set(spec.ports)) != n:
            raise UserError(f"fleet.ports: ports repeat ({spec.ports})")
    if spec.gpu_ids is not None:
        if len(spec.gpu_ids) != n:
            raise UserError(f"fleet.gpu_ids: {len(spec.gpu_ids)} GPU lists for {n} servers")
        for i, ids in enumerate(spec.gpu_ids):
            if not ids or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in ids):
                raise UserError(f"fleet.gpu_ids[{i}]: must be a non-empty list of GPU ids >= 0, got {ids!r}")
        if spec.engine == "sglang":
            need = (spec.sglang or SGLangServerArgs("x")).n_gpus
            for i, ids in enumerate(spec.gpu_ids):
                if len(ids) != need:
                    raise UserError(f"fleet.gpu_ids[{i}]: {len(ids)} GPUs for a server of tp*dp*pp = {need}")
    if spec.startup_timeout_s <= 0:
        raise UserError(f"fleet.startup_timeout_s: must be > 0, got {spec.startup_timeout_s!r}")


def child_env(spec: FleetSpec, i: int) -> dict[str, str]:
    """Environment of server ``i``: this process's, plus ``spec.env``, this ``areal_cli`` first on
    ``PYTHONPATH``, ``CUDA_VISIBLE_DEVICES`` from ``spec.gpu_ids[i]`` (when given), ``OMP_NUM_THREADS`` =
    ``spec.num_threads`` for embedded servers (unless set), and without ``AREAL_LLM_SERVER_ADDRS``."""
    env = dict(os.environ)
    env.update(spec.env or {})
    pkg_root = str(Path(__file__).resolve().parents[2])  # so a child imports this areal_cli
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if spec.gpu_ids is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpu_ids[i])
    if spec.engine == "embedded":
        env.setdefault("OMP_NUM_THREADS", str(spec.num_threads))
    env.pop(ENV_ADDRS, None)
    return env


def server_command(spec: FleetSpec, model_path: str, host: str, port: int, index: int) -> list[str]:
    """argv of server ``index`` listening on ``host:port`` and loading ``model_path``: SGLang's
    ``launch_server`` command (from ``spec.sglang``, seed + index) or ``python -m areal_cli.rollout.server``
    with the embedded settings of ``spec`` (seed + index, ``--parent-pid`` = this process,
    ``--enable-deterministic-inference``: requests' ``sampling_seed`` honoured, which the kit's evaluations use)."""
    if spec.engine == "sglang":
        template = spec.sglang or SGLangServerArgs(model_path)
        return build_sglang_command(for_server(template, model_path=model_path, host=host, port=port,
                                               server_index=index), python=spec.python)
    cmd = [spec.python, "-m", "areal_cli.rollout.server", "--model-path", model_path, "--host", host,
           "--port", str(port), "--max-running-requests", str(spec.max_running_requests),
           "--max-total-tokens", str(spec.max_total_tokens), "--seed", str(spec.seed + index),
           "--weight-version", str(spec.weight_version), "--num-threads", str(spec.num_threads),
           "--parent-pid", str(os.getpid()), "--enable-deterministic-inference"]
    if spec.context_length is not None:
        cmd += ["--context-length", str(spec.context_length)]
    return cmd + list(spec.embedded_extra_args)

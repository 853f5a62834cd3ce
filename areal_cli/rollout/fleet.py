"""A fleet of rollout servers: embedded servers or SGLang servers as child processes, or external URLs.

``launch_fleet(FleetSpec(engine, n_servers, model_path, ...)) -> Fleet`` gives the same handle for the three
kinds, so ``areal train`` drives any of them with one :class:`~areal_cli.rollout.client.RolloutClient`
over ``fleet.urls``:

- ``"embedded"``: ``python -m areal_cli.rollout.server`` per server (CPU, the default).
- ``"sglang"``: ``python -m sglang.launch_server`` per server (command from
  :func:`areal_cli.rollout.sglang_launcher.build_sglang_command`), ``CUDA_VISIBLE_DEVICES`` per server.
- ``"external"``: servers someone else started (``spec.urls`` or env ``AREAL_LLM_SERVER_ADDRS``,
  comma-separated ``host:port``); nothing is launched or stopped.

Lifecycle:

- Before anything is launched: every port is checked by binding it (``UserError("127.0.0.1:30000: port
  already in use (server 0)")``), the model directory and the GPU lists are checked.
- Each server runs in its own session / process group (``start_new_session``); its stdout+stderr go to
  ``run_dir/logs/server{i}.log``.
- Readiness (:meth:`Fleet.wait_ready`) = the process is alive AND ``GET /model_info`` answers 200. ``/health``
  is never called: on SGLang 0.5.23 it runs a generation, blocks while generation is paused and marks the
  server unhealthy after 20 s (``shared/fixtures/sglang/README.md``).
- A server that exits (or is not ready in time) during start-up: every child is stopped and ``UserError`` is
  raised; its message ends with the last 20 lines of that server's log.
- :meth:`Fleet.stop` (idempotent): SIGTERM to every process group, wait up to ``grace_s``, SIGKILL what is
  left. It runs on context exit, at interpreter exit (``atexit``: normal exit, an exception, Ctrl-C), and --
  when this process dies without running atexit (SIGTERM, SIGKILL) -- from a watchdog process: a small
  ``python -c`` child in its own session that holds the read end of a pipe from this process; when the pipe
  closes (this process is gone) or its parent changes, it SIGTERMs then SIGKILLs every server group
  (:mod:`areal_cli.rollout.watchdog`).
  Embedded servers also get ``--parent-pid`` (their own watchdog thread).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from areal_cli.errors import UserError
from areal_cli.log_tail import log_tail
from areal_cli.ports import free_ports, port_is_free
from areal_cli.rollout.sglang_launcher import SGLangServerArgs, build_sglang_command, for_server
from areal_cli.rollout.watchdog import Watchdog, group_alive, killpg

ENGINES = ("embedded", "sglang", "external")
ENV_ADDRS = "AREAL_LLM_SERVER_ADDRS"
TAIL_LINES = 20


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
        startup_timeout_s: :meth:`Fleet.wait_ready` gives up after this long (counted from the launch).
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


class ServerDiedError(UserError):
    """A rollout server went down in a way the run cannot heal (printed as one line like bad input, but with
    exit code 1: the input was fine)."""

    exit_code = 1


@dataclass
class _Server:
    index: int
    host: str
    port: int
    url: str
    cmd: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    log_file: object = None
    model_info: dict | None = None
    auto_port: bool = False  # picked by us: may be re-picked if another process took it first
    respawns: int = 0


# ----------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------


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


def _check_model_dir(model_path, engine: str) -> str:
    if model_path is None or not str(model_path).strip():
        raise UserError(f"fleet.model_path: required for engine {engine!r}")
    p = Path(model_path)
    local = p.exists() or p.is_absolute() or str(model_path).startswith(".")
    if (engine == "embedded" or local) and not (p / "config.json").is_file():
        raise UserError(f"{p}: not a model directory (no config.json)")
    return str(p)


# ----------------------------------------------------------------------------------------------------------
# Fleet
# ----------------------------------------------------------------------------------------------------------

_LIVE: "set[Fleet]" = set()  # strong references: a launched fleet lives until stop() or interpreter exit


@atexit.register
def _stop_all_at_exit() -> None:
    for f in list(_LIVE):
        try:
            f.stop()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


class Fleet:
    """Handle on the servers of one :class:`FleetSpec` (create with :func:`launch_fleet`).

    Attributes:
        spec: the spec.
        urls: ``["http://host:port", ...]``, server i first.
        procs: the ``subprocess.Popen`` of every launched server (empty for external); each is the leader of
            its own process group (pgid == pid).
        log_paths: ``run_dir/logs/server{i}.log`` per launched server.
        model_infos: ``GET /model_info`` of each server once :meth:`wait_ready` returned.
    Usable as a context manager; :meth:`stop` is idempotent.
    """

    def __init__(self, spec: FleetSpec, servers: list[_Server], t_launch: float):
        self.spec = spec
        self._servers = servers
        self._t_launch = t_launch
        self._lock = threading.Lock()
        self._stopped = False
        self._watchdog: Watchdog | None = None
        self._model_path = str(spec.model_path)
        _LIVE.add(self)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self._servers]

    @property
    def procs(self) -> list[subprocess.Popen]:
        return [s.proc for s in self._servers if s.proc is not None]

    @property
    def log_paths(self) -> list[Path]:
        return [s.log_path for s in self._servers if s.log_path is not None]

    @property
    def model_infos(self) -> list[dict | None]:
        return [s.model_info for s in self._servers]

    def _spawn(self, s: _Server) -> None:
        """Start server ``s`` (command ``s.cmd``), appending to its log, in a new session."""
        if s.log_file is None or s.log_file.closed:
            s.log_file = open(s.log_path, "ab")
        s.log_file.write(f"# areal fleet: {' '.join(s.cmd)}\n".encode())
        s.log_file.flush()
        s.proc = subprocess.Popen(s.cmd, stdout=s.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=_child_env(self.spec, s.index), start_new_session=True)
        if self._watchdog is not None:
            self._watchdog.add(s.proc.pid)

    def _respawn_on_new_port(self, s: _Server) -> bool:
        """A server on a port we picked lost it to another process before binding: start it again on a
        fresh port (at most twice). True when respawned."""
        if not s.auto_port or s.respawns >= 2 or "address already in use" not in log_tail(s.log_path, TAIL_LINES).lower():
            return False
        s.respawns += 1
        killpg(s.proc.pid, signal.SIGKILL)  # anything the failed start left in its group
        s.port = free_ports(s.host, 1)[0]
        s.url = f"http://{s.host}:{s.port}"
        s.cmd = _command(self.spec, self._model_path, s)
        self._spawn(s)
        return True

    def _describe(self, s: _Server) -> str:
        return f"rollout server {s.index} ({self.spec.engine}, {s.host}:{s.port})"

    def wait_ready(self, timeout_s: float | None = None) -> "Fleet":
        """Block until every server is alive and answers ``GET /model_info`` with 200 (polled every 0.2 s).

        Args:
            timeout_s: default ``spec.startup_timeout_s`` counted from the launch.
        A server on a port this fleet picked itself that lost the port to another process before binding
        ("address already in use" in its log) is restarted on a fresh port (twice at most); ``urls`` then
        changes, so read it after this returns.

        Raises:
            UserError: a server exited during start-up or was not ready in time; every child is stopped and
                the message ends with the last lines of that server's log (external: the last error).
            RuntimeError: :meth:`stop` was called meanwhile (from another thread).
        """
        import httpx

        deadline = (self._t_launch + self.spec.startup_timeout_s if timeout_s is None
                    else time.monotonic() + timeout_s)
        pending = [s for s in self._servers if s.model_info is None]
        last_err: dict[int, str] = {}
        with httpx.Client(timeout=5.0, trust_env=False) as c:
            while pending:
                if self._stopped:  # stop() from elsewhere (Ctrl-C, atexit) while this waited in a thread
                    raise RuntimeError(f"{self!r} was stopped while waiting for its servers")
                for s in list(pending):
                    if s.proc is not None and s.proc.poll() is not None:
                        if self._respawn_on_new_port(s):
                            continue
                        rc = s.proc.returncode
                        self.stop()
                        raise UserError(f"{self._describe(s)} exited with code {rc} during start-up "
                                        f"(log {s.log_path}); last lines:\n{log_tail(s.log_path, TAIL_LINES)}")
                    try:
                        r = c.get(s.url + "/model_info")
                        if r.status_code == 200:
                            try:
                                s.model_info = r.json()
                            except ValueError:
                                s.model_info = {}
                            pending.remove(s)
                        else:
                            last_err[s.index] = f"HTTP {r.status_code}"
                    except httpx.HTTPError as e:
                        last_err[s.index] = f"{type(e).__name__}: {e}"
                if not pending:
                    break
                if time.monotonic() > deadline:
                    s = pending[0]
                    waited = time.monotonic() - self._t_launch
                    self.stop()
                    if s.proc is None:
                        raise UserError(f"{s.url}: /model_info did not answer 200 within {waited:.0f} s "
                                        f"(last error: {last_err.get(s.index, 'none')})")
                    raise UserError(f"{self._describe(s)} not ready after {waited:.0f} s "
                                    f"(log {s.log_path}); last lines:\n{log_tail(s.log_path, TAIL_LINES)}")
                time.sleep(0.2)
        return self

    def index_of(self, url: str) -> int | None:
        """Index of the server at ``url`` (None if it is not one of this fleet's)."""
        return next((s.index for s in self._servers if s.url == url), None)

    def can_restart(self, index: int) -> bool:
        """Whether server ``index`` was launched by this fleet (external servers are not)."""
        return self._servers[index].proc is not None

    def exit_code(self, index: int) -> int | None:
        """The exit code of launched server ``index`` if its process has exited, else None."""
        p = self._servers[index].proc
        return p.poll() if p is not None else None

    def describe(self, index: int) -> str:
        """``"rollout server i (engine, host:port) ... (log PATH)"`` for messages."""
        s = self._servers[index]
        return self._describe(s) + (f" (log {s.log_path})" if s.log_path else "")

    def restart(self, index: int, model_path: str | Path, weight_version: int | str,
                timeout_s: float | None = None) -> None:
        """Kill what is left of launched server ``index`` and start it again on the same port, loading
        ``model_path`` with the label ``weight_version``; block until it answers ``/model_info``.

        Raises:
            UserError: an external server, or the restarted server did not come up (the fleet is stopped then;
                the message ends with its log tail).
        """
        s = self._servers[index]
        if s.proc is None:
            raise UserError(f"{self._describe(s)}: an external server cannot be restarted from here")
        if self._stopped:
            raise RuntimeError(f"{self!r} is stopped")
        killpg(s.proc.pid, signal.SIGKILL)
        try:
            s.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        label = str(weight_version)
        spec = dataclasses.replace(self.spec, weight_version=label, sglang=dataclasses.replace(
            self.spec.sglang, weight_version=label) if self.spec.sglang is not None else None)
        s.cmd = _command(spec, str(model_path), s)
        s.model_info = None
        s.auto_port = False  # the client knows this url: keep the port
        self._spawn(s)
        self.wait_ready(timeout_s=timeout_s if timeout_s is not None else self.spec.startup_timeout_s)

    def check_alive(self) -> None:
        """Raise if a launched server process has exited (external servers: nothing to check).

        Raises:
            ServerDiedError: naming the server, its exit code, and ending with the last lines of its log.
        """
        for s in self._servers:
            if s.proc is not None and s.proc.poll() is not None:
                raise ServerDiedError(f"{self._describe(s)} exited with code {s.proc.returncode} "
                                      f"(log {s.log_path}); last lines:\n{log_tail(s.log_path, TAIL_LINES)}")

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop every launched server: SIGTERM to each process group, wait up to ``grace_s`` s in total,
        SIGKILL what is left (leader and any process left in its group). Idempotent, thread-safe."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        launched = [s for s in self._servers if s.proc is not None]
        for s in launched:
            killpg(s.proc.pid, signal.SIGTERM)
        end = time.monotonic() + grace_s
        for s in launched:
            try:
                s.proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        while time.monotonic() < end and any(group_alive(s.proc.pid) for s in launched):
            time.sleep(0.05)
        for s in launched:
            if group_alive(s.proc.pid) or s.proc.poll() is None:
                killpg(s.proc.pid, signal.SIGKILL)
                try:
                    s.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            if s.log_file is not None and not s.log_file.closed:
                s.log_file.close()
        if self._watchdog is not None:
            self._watchdog.close()
        _LIVE.discard(self)

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Fleet({self.spec.engine}, {self.urls}, {'stopped' if self._stopped else 'running'})"


# ----------------------------------------------------------------------------------------------------------
# launch
# ----------------------------------------------------------------------------------------------------------


def _check_spec(spec: FleetSpec) -> None:
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


def _child_env(spec: FleetSpec, i: int) -> dict[str, str]:
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


def _command(spec: FleetSpec, model_path: str, s: _Server) -> list[str]:
    if spec.engine == "sglang":
        template = spec.sglang or SGLangServerArgs(model_path)
        return build_sglang_command(for_server(template, model_path=model_path, host=s.host, port=s.port,
                                               server_index=s.index), python=spec.python)
    cmd = [spec.python, "-m", "areal_cli.rollout.server", "--model-path", model_path, "--host", s.host,
           "--port", str(s.port), "--max-running-requests", str(spec.max_running_requests),
           "--max-total-tokens", str(spec.max_total_tokens), "--seed", str(spec.seed + s.index),
           "--weight-version", str(spec.weight_version), "--num-threads", str(spec.num_threads),
           "--parent-pid", str(os.getpid())]
    if spec.context_length is not None:
        cmd += ["--context-length", str(spec.context_length)]
    return cmd + list(spec.embedded_extra_args)


def launch_fleet(spec: FleetSpec, *, wait: bool = True) -> Fleet:
    """Check ``spec``, launch its servers (nothing for external) and, with ``wait``, wait until ready.

    Args:
        spec: see :class:`FleetSpec`.
        wait: False returns right after spawning (call :meth:`Fleet.wait_ready` later, e.g. in a thread
            while the trainer loads).
    Returns:
        a :class:`Fleet` (stop it, or use it as a context manager).
    Raises:
        UserError: a bad spec (field named), a port in use (``"HOST:PORT: port already in use (server i)"``,
            raised before anything is launched), a missing model directory, a server that failed to start
            (message ends with its log tail; every child is stopped), external servers not answering.
    """
    _check_spec(spec)
    t0 = time.monotonic()
    if spec.engine == "external":
        text = ",".join(spec.urls) if spec.urls else os.environ.get(ENV_ADDRS, "")
        where = "fleet.urls" if spec.urls else ENV_ADDRS
        if not text:
            raise UserError(f"{ENV_ADDRS}: not set (external servers need rollout.server_urls=host:port,... or {ENV_ADDRS}=host:port,...)")
        urls = parse_server_addrs(text, where)
        if spec.n_servers and spec.n_servers != len(urls):
            raise UserError(f"{where}: {len(urls)} addresses for n_servers = {spec.n_servers}")
        servers = []
        for i, u in enumerate(urls):
            host, _, port = u[len("http://"):].rpartition(":")
            servers.append(_Server(i, host, int(port), u))
        fleet = Fleet(spec, servers, t0)
        return fleet.wait_ready() if wait else fleet
    model_path = _check_model_dir(spec.model_path, spec.engine)
    n = spec.n_servers
    if spec.ports is not None:
        for i, p in enumerate(spec.ports):
            if not port_is_free(spec.host, p):
                raise UserError(f"{spec.host}:{p}: port already in use (server {i})")
        ports = list(spec.ports)
    else:
        ports = free_ports(spec.host, n)
    servers = [_Server(i, spec.host, p, f"http://{spec.host}:{p}", auto_port=spec.ports is None)
               for i, p in enumerate(ports)]
    for s in servers:  # every command is built (and validated) before anything starts
        s.cmd = _command(spec, model_path, s)
    log_dir = (Path(spec.run_dir) if spec.run_dir is not None
               else Path(tempfile.mkdtemp(prefix="areal-fleet-"))) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(spec, servers, t0)
    fleet._model_path = model_path
    try:
        fleet._watchdog = Watchdog(spec.python)
        for s in servers:
            s.log_path = log_dir / f"server{s.index}.log"
            fleet._spawn(s)
    except BaseException:
        fleet.stop()
        raise
    fleet._t_launch = time.monotonic()
    return fleet.wait_ready() if wait else fleet

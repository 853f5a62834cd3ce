"""A fleet of rollout servers: embedded servers or SGLang servers as child processes, or external URLs.

``launch_fleet(FleetSpec(engine, n_servers, model_path, ...)) -> Fleet`` gives the same handle for the three
kinds, so ``areal train`` drives any of them with one :class:`~areal_cli.rollout.client.RolloutClient`
over ``fleet.urls``:

- ``"embedded"``: ``python -m areal_cli.rollout.server`` per server (CPU, the default).
- ``"sglang"``: ``python -m sglang.launch_server`` per server (command from
  :func:`areal_cli.rollout.sglang_launcher.build_sglang_command`), ``CUDA_VISIBLE_DEVICES`` per server.
- ``"external"``: servers someone else started (``spec.urls`` or env ``AREAL_LLM_SERVER_ADDRS``,
  comma-separated ``host:port``); nothing is launched or stopped.

The spec, its checks, address parsing and each child's command and environment:
:mod:`areal_cli.rollout.fleet_spec`.

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
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from areal_cli.foundations.errors import UserError
from areal_cli.foundations.log_tail import log_tail
from areal_cli.foundations.ports import free_ports, port_is_free
from areal_cli.rollout.fleet_spec import (ENGINES, ENV_ADDRS, FleetSpec, check_model_dir, check_spec, child_env,
                                          parse_server_addrs, server_command)
from areal_cli.rollout.watchdog import Watchdog, group_alive, killpg

__all__ = ["ENGINES", "ENV_ADDRS", "Fleet", "FleetSpec", "ServerDiedError", "launch_fleet", "parse_server_addrs"]

TAIL_LINES = 20


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
                                  env=child_env(self.spec, s.index), start_new_session=True)
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
        s.cmd = server_command(self.spec, self._model_path, s.host, s.port, s.index)
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
                        tail = log_tail(s.log_path, TAIL_LINES)
                        hint = ""
                        if self.spec.engine == "sglang" and ("ImportError" in tail or "ModuleNotFoundError" in tail):
                            hint = " - SGLang's environment is broken: rebuild it with `areal engine setup sglang --force`"
                        raise UserError(f"{self._describe(s)} exited with code {rc} during start-up "
                                        f"(log {s.log_path}){hint}; last lines:\n{tail}")
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
        s.cmd = server_command(spec, str(model_path), s.host, s.port, s.index)
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
    check_spec(spec)
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
    model_path = check_model_dir(spec.model_path, spec.engine)
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
        s.cmd = server_command(spec, model_path, s.host, s.port, s.index)
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

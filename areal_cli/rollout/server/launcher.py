"""The parent side of an embedded server: start ``python -m areal_cli.rollout.server`` as a child process,
wait until it answers, stop its process group (on ``stop()``, on context exit, at interpreter exit; the child's
watchdog thread covers a parent that dies)."""

import atexit
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

from areal_cli.foundations.log_tail import log_tail
from areal_cli.foundations.ports import free_port

_LIVE: "weakref.WeakSet[EmbeddedServer]" = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    for s in list(_LIVE):
        try:
            s.stop()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


class EmbeddedServer:
    """Handle on one embedded server child process (create with :meth:`launch`).

    Attributes:
        url: ``"http://HOST:PORT"``. host, port, model_path, log_path, proc (``subprocess.Popen``).
    Usable as a context manager (``with EmbeddedServer.launch(...) as srv:``); :meth:`stop` is idempotent.
    """

    def __init__(self, proc: subprocess.Popen, host: str, port: int, model_path: str, log_path: Path,
                 log_file, auto_log: bool = False):
        self.proc = proc
        self.host = host
        self.port = port
        self.url = f"http://{host}:{port}"
        self.model_path = model_path
        self.log_path = log_path
        self._log_file = log_file
        self._auto_log = auto_log  # log_path is a temporary file we created (removed after a clean stop)
        self._t_spawn = time.monotonic()
        self._startup_timeout_s = 120.0
        _LIVE.add(self)

    @classmethod
    def launch(cls, model_path: str | Path, *, host: str = "127.0.0.1", port: int | None = None,
               max_running_requests: int = 64, max_total_tokens: int = 65536, seed: int = 0,
               log_path: Path | None = None, weight_version: str = "0", startup_timeout_s: float = 120,
               num_threads: int = 1, context_length: int | None = None, step_delay_s: float = 0.0,
               extra_args: list[str] | None = None, wait: bool = True) -> "EmbeddedServer":
        """Start ``python -m areal_cli.rollout.server`` and return once ``GET /health`` answers 200.

        Args:
            model_path: Hugging Face Qwen3 model directory.
            port: None picks a free port (retried up to 3 times if another process takes it first).
            max_running_requests, max_total_tokens, seed, weight_version, context_length: engine settings.
            log_path: child stdout+stderr; default a temporary file (path in ``.log_path``).
            startup_timeout_s: give up (kill the child, raise) after this many seconds.
            num_threads: torch threads in the child (default 1: machines are shared).
            step_delay_s: testing knob, sleep after each engine step.
            extra_args: more flags; ``--no-deterministic-inference`` (not passed on) starts it as SGLang starts by
                default, ignoring requests' ``sampling_seed`` (otherwise ``--enable-deterministic-inference``).
            wait: (added) False returns right after spawning; call :meth:`wait_until_ready` later (lets a
                caller overlap the child's start-up with its own work).
        Raises:
            UserError: ``model_path`` is not a directory with config.json.
            RuntimeError: the child exited or did not become ready in time; the message ends with the last
                lines of its log.
        """
        from areal_cli.foundations.errors import UserError

        mp = Path(model_path)
        if not (mp / "config.json").is_file():
            raise UserError(f"{mp}: not a model directory (no config.json)")
        attempts = 3 if port is None else 1
        last_err: Exception | None = None
        for _ in range(attempts):
            p = free_port(host) if port is None else port
            try:
                srv = cls._spawn(mp, host, p, max_running_requests, max_total_tokens, seed, log_path,
                                 weight_version, num_threads, context_length, step_delay_s, extra_args or [])
                srv._startup_timeout_s = startup_timeout_s
                srv._t_spawn = time.monotonic()
                if wait:
                    srv.wait_until_ready()
                return srv
            except RuntimeError as e:
                last_err = e
                if "address already in use" not in str(e).lower():
                    raise
        raise last_err  # type: ignore[misc]

    @classmethod
    def _spawn(cls, mp, host, port, max_running_requests, max_total_tokens, seed, log_path, weight_version,
               num_threads, context_length, step_delay_s, extra_args) -> "EmbeddedServer":
        import tempfile

        auto_log = log_path is None
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"areal-server-{port}-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "areal_cli.rollout.server", "--model-path", str(mp), "--host", host,
               "--port", str(port), "--max-running-requests", str(max_running_requests),
               "--max-total-tokens", str(max_total_tokens), "--seed", str(seed),
               "--weight-version", str(weight_version), "--num-threads", str(num_threads),
               "--parent-pid", str(os.getpid())]
        if "--no-deterministic-inference" in extra_args:  # the SGLang default: sampling_seed ignored
            extra_args = [a for a in extra_args if a != "--no-deterministic-inference"]
        else:  # the kit's launches honour each request's sampling_seed (evaluations are seeded per sample)
            cmd.append("--enable-deterministic-inference")
        if context_length is not None:
            cmd += ["--context-length", str(context_length)]
        if step_delay_s:
            cmd += ["--step-delay-s", str(step_delay_s)]
        cmd += extra_args
        env = dict(os.environ)
        pkg_root = str(Path(__file__).resolve().parents[3])  # so the child imports this areal_cli
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("OMP_NUM_THREADS", str(num_threads))
        log_file = open(log_path, "ab")
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        return cls(proc, host, port, str(mp), log_path, log_file, auto_log)

    def wait_until_ready(self, timeout_s: float | None = None) -> "EmbeddedServer":
        """Poll ``GET /health`` until 200 (every 0.1 s).

        Args:
            timeout_s: default the ``startup_timeout_s`` given to :meth:`launch`, counted from the spawn.
        Raises:
            RuntimeError: the child exited, or was not ready in time (it is then killed); the message ends
                with the last lines of its log.
        """
        import httpx

        if timeout_s is None:
            deadline = self._t_spawn + self._startup_timeout_s
        else:
            deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as c:
            while True:
                rc = self.proc.poll()
                if rc is not None:
                    self.stop()
                    raise RuntimeError(f"embedded server exited with code {rc} during startup "
                                       f"(log {self.log_path}); last lines:\n{log_tail(self.log_path, 40, empty='')}")
                try:
                    if c.get(self.url + "/health").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"embedded server not ready after {deadline - self._t_spawn:.0f} s "
                                       f"(log {self.log_path}); last lines:\n{log_tail(self.log_path, 40, empty='')}")
                time.sleep(0.1)

    def alive(self) -> bool:
        """True while the child process runs."""
        return self.proc.poll() is None

    def stop(self) -> None:
        """Terminate the child's process group (SIGTERM, then SIGKILL after 5 s). Idempotent."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=5)
        if self._log_file is not None and not self._log_file.closed:
            self._log_file.close()
        if self._auto_log and self.proc.returncode in (0, -signal.SIGTERM):
            # a temporary log of a server that stopped cleanly holds nothing worth keeping
            self.log_path.unlink(missing_ok=True)
        _LIVE.discard(self)

    def __enter__(self) -> "EmbeddedServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive() else f"exited({self.proc.returncode})"
        return f"EmbeddedServer({self.url}, {self.model_path}, {state})"

"""The trainer as a group: one in-process engine (:class:`LocalTrainer`) or torchrun ranks (:class:`TorchrunTrainer`).

The controller (``areal_cli.train_loop``) drives either through one API, in order, one call at a time::

    group = await LocalTrainer.launch(engine_kwargs)                   # today's trainer thread
    group = await TorchrunTrainer.launch(engine_kwargs, world=4, tp=2, pp=1, run_dir=out)
    out = await group.call("engine.save_hf", path)                     # a method (or attribute) of the engine
    stats = await group.call("areal_cli.trainer.steps:ppo_update", batch, cfg)  # function(engine, batch, cfg)
    group.info["vocab_size"]; group.close()

Call names: :mod:`areal_cli.trainer.calls`. SPMD: every rank runs the same call with the same arguments (the
engine splits work over its data-parallel ranks itself); the result of global rank 0 is returned.

Protocol of :class:`TorchrunTrainer` (messages are pickled tuples over a ``multiprocessing.connection``
socket on which both ends authenticate with a random key; the key travels in a file readable only by the
user, path in ``AREAL_CONTROLLER_AUTHKEY_FILE``):

- rank 0 connects to ``AREAL_CONTROLLER_ADDR`` (``host:port``) and sends ``("hello", {"world", "pids",
  "hosts"})``;
- controller -> rank 0: ``("init", factory, engine_kwargs)``, ``("call", name, args, kwargs)``, ``("stop",)``;
  rank 0 broadcasts each message to every rank (``broadcast_object_list`` on the default group; while idle
  it broadcasts ``("ping",)`` every :data:`PING_S` seconds so no rank sits in a collective long enough to time
  out), every rank runs it, the outcomes are gathered on rank 0;
- rank 0 -> controller: ``("ok", result)`` or ``("error", [(rank, type_name, message, traceback), ...])``.

Errors on the controller: :class:`TrainerError` ``"trainer rank R: Type: message"`` (a ``UserError`` raised by
a rank stays a ``UserError``); a group that dies (a rank killed, torchrun exited, the connection lost):
:class:`TrainerError` ending with the last lines of the failed ranks' logs ``run_dir/logs/trainer-rank{r}.log``
(and of ``trainer-torchrun.log``). This module imports no torch.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Client, Listener
from pathlib import Path
from typing import Any, Callable

from areal_cli.foundations.errors import RunFailure, UserError
from areal_cli.foundations.log_tail import log_tail
from areal_cli.foundations.ports import free_port
from areal_cli.trainer.calls import build_engine, check_name, engine_info, parallel_kwargs, run_call

DEFAULT_FACTORY = "areal_cli.trainer.megatron_engine:MegatronEngine"
PING_S = 60.0  # rank 0 broadcasts a no-op this often while the controller sends nothing
LOG_TAIL_LINES = 15
ENV_ADDR = "AREAL_CONTROLLER_ADDR"  # host:port rank 0 connects to
ENV_AUTHKEY_FILE = "AREAL_CONTROLLER_AUTHKEY_FILE"  # file holding the hex auth key
ENV_LOG_DIR = "AREAL_TRAINER_LOG_DIR"  # ranks write trainer-rank{r}.log here (optional)
ENV_TIMEOUT = "AREAL_TRAINER_TIMEOUT_S"  # collective timeout of the ranks' process group


class TrainerError(RunFailure):
    """A trainer call failed on some rank, or the trainer group died. ``ranks``: the failed global ranks;
    ``headline``: one line (which rank, how, where its log is)."""

    def __init__(self, message: str, ranks: tuple[int, ...] = (), headline: str | None = None):
        super().__init__(message, headline)
        self.ranks = ranks


# --------------------------------------------------------------------------------------------------------
# the API
# --------------------------------------------------------------------------------------------------------
class TrainerGroup:
    """The controller's handle on the trainer (see the module docstring). Calls run one at a time, in order."""

    info: dict
    pids: list[int]  # local process ids of the trainer ranks (for CPU accounting); empty when remote

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    async def __aenter__(self) -> "TrainerGroup":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


class LocalTrainer(TrainerGroup):
    """The engine in this process, every call on one dedicated thread (pinned to ``cpus`` when given).

    Exceptions of a call propagate unchanged; arguments and results are passed by reference.
    """

    def __init__(self, cpus: frozenset[int] | None = None):
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="trainer",
            initializer=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        self.engine: Any = None
        self.info: dict = {}
        self.pids = [os.getpid()]

    @classmethod
    async def launch(cls, engine_kwargs: dict, *, tp: int = 1, pp: int = 1, cpus: frozenset[int] | None = None,
                     factory: str = DEFAULT_FACTORY) -> "LocalTrainer":
        """Build the engine on the trainer thread: ``factory(**engine_kwargs, **parallel_kwargs(tp, pp))``."""
        self = cls(cpus)
        try:
            loop = asyncio.get_running_loop()
            kw = {**engine_kwargs, **parallel_kwargs(tp, pp)}
            self.engine = await loop.run_in_executor(self.executor, build_engine, factory, kw)
            self.info = await loop.run_in_executor(self.executor, engine_info, self.engine)
        except BaseException:
            self.close()
            raise
        return self

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        check_name(name)
        return await asyncio.get_running_loop().run_in_executor(self.executor, run_call, self.engine, name, args,
                                                                kwargs)

    async def run(self, fn: Callable, *args: Any) -> Any:
        """Run a plain ``fn(*args)`` on the trainer thread (work that must not block the event loop)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def close(self) -> None:
        self.executor.shutdown(wait=True)


class TorchrunTrainer(TrainerGroup):
    """Trainer ranks launched by torchrun (:meth:`launch`) or externally (:meth:`attach`); see the module docstring.

    Attributes:
        proc: the torchrun process (its own process group), None in attach mode.
        log_dir: where the ranks' logs are (``run_dir/logs``), None if unknown.
    """

    def __init__(self, listener: Listener, authkey_file: Path | None, *, log_dir: Path | None,
                 proc: subprocess.Popen | None = None, torchrun_log=None, own_key_dir: Path | None = None):
        self.listener = listener
        self.authkey_file = authkey_file
        self.log_dir = log_dir
        self.proc = proc
        self._torchrun_log = torchrun_log
        self._own_key_dir = own_key_dir
        self.conn = None
        self.info: dict = {}
        self.pids: list[int] = []
        self.world = 0
        self._dead: str | None = None
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer-conn")
        self._closed = False

    # ---------------------------------------------------------------- start
    @classmethod
    async def launch(cls, engine_kwargs: dict, *, world: int, tp: int = 1, pp: int = 1, run_dir: str | Path,
                     cpus: frozenset[int] | None = None, timeout_s: float = 300.0, torch_threads: int = 1,
                     factory: str = DEFAULT_FACTORY, env: dict | None = None) -> "TorchrunTrainer":
        """Start ``world`` ranks on this machine: ``python -m torch.distributed.run --nproc-per-node world
        --master-port <free> -m areal_cli.trainer.worker``, then build the engine on every rank.

        Args:
            engine_kwargs: keyword arguments of the engine (``factory``), e.g. ``hf_model_dir``, ``lr``, ``seed``.
            world: number of ranks (= data x tensor x pipeline parallel).
            tp, pp: tensor / pipeline parallel sizes, passed to the engine only when > 1.
            run_dir: logs go to ``run_dir/logs/trainer-rank{r}.log`` and ``trainer-torchrun.log``.
            cpus: pin torchrun and its ranks to these cpus.
            timeout_s: for rank 0 to connect and for the engine to be built.
            torch_threads: ``OMP_NUM_THREADS`` of every rank.
            env: extra environment of the ranks.
        Raises:
            UserError: world/tp/pp inconsistent. TrainerError: the group did not start (with log tails).
        """
        if world < 1 or tp < 1 or pp < 1 or world % (tp * pp):
            raise UserError(f"trainer group: world {world} must be a positive multiple of tensor x pipeline "
                            f"parallel {tp} x {pp}")
        log_dir = Path(run_dir) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        key = secrets.token_bytes(32)
        key_dir = Path(tempfile.mkdtemp(prefix="areal-trainer-"))  # mode 0700
        key_file = key_dir / "authkey"
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key.hex())
        listener = Listener(("127.0.0.1", 0), authkey=key)
        host, port = listener.address
        child_env = {**os.environ, **(env or {}), ENV_ADDR: f"{host}:{port}", ENV_AUTHKEY_FILE: str(key_file),
                     ENV_LOG_DIR: str(log_dir), "OMP_NUM_THREADS": str(torch_threads)}
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):  # not ours to inherit
            child_env.pop(k, None)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(world),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--max-restarts", "0",
               "-m", "areal_cli.trainer.worker"]
        tlog = open(log_dir / "trainer-torchrun.log", "w")
        try:
            proc = subprocess.Popen(cmd, env=child_env, stdout=tlog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True,
                                    preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        except BaseException:
            tlog.close()
            listener.close()
            _rmtree(key_dir)
            raise
        self = cls(listener, key_file, log_dir=log_dir, proc=proc, torchrun_log=tlog, own_key_dir=key_dir)
        try:
            await self._start(factory, {**engine_kwargs, **parallel_kwargs(tp, pp)}, timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    @classmethod
    async def attach(cls, listen_addr: str, engine_kwargs: dict, *, authkey_file: str | Path, tp: int = 1,
                     pp: int = 1, log_dir: str | Path | None = None, timeout_s: float = 600.0,
                     factory: str = DEFAULT_FACTORY) -> "TorchrunTrainer":
        """Listen on ``listen_addr`` (``host:port``) for rank 0 of ranks launched elsewhere (multi-node: each
        node runs ``torchrun ... -m areal_cli.trainer.worker`` with ``AREAL_CONTROLLER_ADDR`` = this address
        and ``AREAL_CONTROLLER_AUTHKEY_FILE`` = ``authkey_file``, a file of hex key on a shared filesystem).

        Raises:
            UserError: bad address or unreadable key file. TrainerError: no rank 0 within ``timeout_s``.
        """
        host, sep, port = listen_addr.rpartition(":")
        if not sep or not port.isdigit():
            raise UserError(f"trainer listen address '{listen_addr}': expected host:port")
        key = read_authkey(authkey_file)
        try:
            listener = Listener((host or "0.0.0.0", int(port)), authkey=key)
        except OSError as e:
            raise UserError(f"trainer listen address {listen_addr}: {e.strerror}") from None
        self = cls(listener, Path(authkey_file), log_dir=Path(log_dir) if log_dir else None)
        try:
            await self._start(factory, {**engine_kwargs, **parallel_kwargs(tp, pp)}, timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    async def _start(self, factory: str, engine_kwargs: dict, timeout_s: float) -> None:
        t_end = time.monotonic() + timeout_s
        self.conn = await asyncio.to_thread(self._accept, timeout_s)
        hello = await asyncio.get_running_loop().run_in_executor(self.executor, self._recv, "start", t_end)
        if hello[0] != "hello":
            raise TrainerError(f"trainer group: unexpected first message {hello[0]!r}")
        self.world, self.pids = int(hello[1]["world"]), list(hello[1]["pids"]) if self.proc is not None else []
        await asyncio.get_running_loop().run_in_executor(self.executor, self._roundtrip, ("init", factory, engine_kwargs),
                                                         "init", t_end)
        self.info = await self.call("areal_cli.trainer.calls:engine_info")

    def _accept(self, timeout_s: float):
        """Wait for rank 0's authenticated connection; fail early when torchrun exits."""
        box: dict = {}
        abandoned = threading.Event()

        def accept() -> None:
            while not abandoned.is_set():
                try:
                    c = self.listener.accept()
                except Exception as e:  # noqa: BLE001 - wrong key (AuthenticationError) / closed listener
                    if isinstance(e, OSError) and abandoned.is_set():
                        return
                    if not isinstance(e, OSError):
                        continue
                    box["error"] = e
                    return
                if abandoned.is_set():
                    c.close()
                    return
                box["conn"] = c
                return

        th = threading.Thread(target=accept, name="trainer-accept", daemon=True)
        th.start()
        t_end = time.monotonic() + timeout_s
        why = None
        while th.is_alive():
            th.join(0.1)
            if self.proc is not None and self.proc.poll() is not None and th.is_alive():
                why = f"torchrun exited (code {self.proc.returncode}) before rank 0 connected"
                break
            if time.monotonic() > t_end and th.is_alive():
                why = f"rank 0 did not connect within {timeout_s:.0f} s"
                break
        if why is not None:
            abandoned.set()
            try:  # wake the accept() call
                Client(self.listener.address, authkey=read_authkey(self.authkey_file)).close()
            except Exception:  # noqa: BLE001
                pass
            th.join(2)
            raise TrainerError(self._with_logs(f"trainer group: {why}"))
        if "conn" not in box:
            raise TrainerError(self._with_logs(f"trainer group: accept failed: {box.get('error')}"))
        return box["conn"]

    # ---------------------------------------------------------------- calls
    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        check_name(name)
        if self._closed:
            raise TrainerError(f"trainer group closed; cannot call {name!r}")
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._roundtrip,
                                                                ("call", name, args, kwargs), name, None)

    async def run(self, fn: Callable, *args: Any) -> Any:
        """Run a plain ``fn(*args)`` on a worker thread of this process (not on the ranks)."""
        return await asyncio.to_thread(fn, *args)

    def _roundtrip(self, msg: tuple, what: str, t_end: float | None) -> Any:
        if self._dead is not None:
            raise TrainerError(self._dead)
        try:
            send_msg(self.conn, msg)
        except (OSError, EOFError, ValueError):
            self._died(what)
        reply = self._recv(what, t_end)
        if reply[0] == "ok":
            return reply[1]
        if reply[0] == "error":
            raise self._error(reply[1], what)
        raise TrainerError(f"trainer group: unexpected reply {reply[0]!r} to {what!r}")

    def _recv(self, what: str, t_end: float | None) -> tuple:
        while True:
            wait = 1.0 if t_end is None else max(0.0, min(1.0, t_end - time.monotonic()))
            try:
                if self.conn.poll(wait):
                    return recv_msg(self.conn)
            except (OSError, EOFError):
                self._died(what)
            if self.proc is not None and self.proc.poll() is not None:
                try:  # the last reply may already be in the socket
                    if self.conn.poll(0):
                        return recv_msg(self.conn)
                except (OSError, EOFError):
                    pass
                self._died(what)
            if t_end is not None and time.monotonic() >= t_end:
                raise TrainerError(self._with_logs(f"trainer group: no reply to {what!r} in time"))

    def _error(self, errors: list, what: str) -> Exception:
        ranks = tuple(r for r, *_ in errors)
        r, tname, msg, tb = errors[0]
        more = f" (and ranks {list(ranks[1:])})" if len(ranks) > 1 else ""
        if tname == "UserError":
            return UserError(msg)
        tb_tail = "\n".join(tb.rstrip().splitlines()[-6:])
        return TrainerError(f"trainer rank {r}: {tname}: {msg}{more} [in {what!r}]\n{tb_tail}", ranks)

    def _died(self, what: str) -> None:
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                code = None
        exit_txt = f" (torchrun exit code {code})" if code is not None else ""
        self._dead = self._with_logs(f"trainer group died during {what!r}{exit_txt}")
        cause = self.root_cause()
        if cause is not None:
            rank, how = cause
            log = f"; log {self.log_dir / f'trainer-rank{rank}.log'}" if self.log_dir is not None else ""
            raise TrainerError(self._dead, (rank,), f"trainer rank {rank} died ({how}) during {what!r}{log}")
        raise TrainerError(self._dead)

    def root_cause(self) -> tuple[int, str] | None:
        """``(rank, "exitcode -9 (SIGKILL)")`` of the first failure torchrun observed (its "Root Cause" section
        of ``trainer-torchrun.log``), or None when torchrun did not report one."""
        if self.log_dir is None:
            return None
        try:
            text = (self.log_dir / "trainer-torchrun.log").read_text(errors="replace")
        except OSError:
            return None
        _, found, rest = text.rpartition("Root Cause (first observed failure):")
        m = re.search(r"rank\s*:\s*(\d+)\s*\(local_rank.*?exitcode\s*:\s*(-?\d+)[^\n]*?(\((SIG\w+)\))?\s*$",
                      rest, re.S | re.M) if found else None
        if m is None:
            return None
        how = f"exit code {m.group(2)}" + (f", {m.group(4)}" if m.group(4) else "")
        return int(m.group(1)), how

    def failed_ranks(self) -> list[int]:
        """Ranks named as failed in torchrun's summary (``rank : R (local_rank: ...)``), if any."""
        if self.log_dir is None:
            return []
        try:
            text = (self.log_dir / "trainer-torchrun.log").read_text(errors="replace")
        except OSError:
            return []
        return sorted({int(m) for m in re.findall(r"rank\s*:\s*(\d+)\s*\(local_rank", text)})

    def _with_logs(self, message: str) -> str:
        """``message`` + the last lines of the failed ranks' logs (else rank 0's) and of torchrun's log."""
        if self.log_dir is None:
            return message
        ranks = self.failed_ranks() or [0]
        parts = [message]
        for r in ranks[:4]:
            p = self.log_dir / f"trainer-rank{r}.log"
            tail = log_tail(p, LOG_TAIL_LINES, missing=f"({p}: no log)", empty=f"({p}: empty)")
            parts.append(f"--- last lines of {p}:\n{tail}")
        p = self.log_dir / "trainer-torchrun.log"
        if p.exists():
            tail = log_tail(p, 8, missing=f"({p}: no log)", empty=f"({p}: empty)")
            parts.append(f"--- last lines of {p}:\n{tail}")
        return "\n".join(parts)

    # ---------------------------------------------------------------- stop
    def close(self, timeout_s: float = 20.0) -> None:
        """Stop the ranks (``("stop",)``), wait for torchrun, then SIGTERM / SIGKILL its process group.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.conn is not None:
            try:
                if self._dead is None:
                    send_msg(self.conn, ("stop",))
            except (OSError, EOFError, ValueError):
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                    try:
                        os.killpg(self.proc.pid, sig)
                    except ProcessLookupError:
                        break
                    try:
                        self.proc.wait(timeout=wait)
                        break
                    except subprocess.TimeoutExpired:
                        continue
            try:  # ranks left behind by a killed torchrun agent (same process group)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.conn is not None:
            self.conn.close()
        self.listener.close()
        self.executor.shutdown(wait=False)
        if self._torchrun_log is not None:
            self._torchrun_log.close()
        if self._own_key_dir is not None:
            _rmtree(self._own_key_dir)


def send_msg(conn, msg: Any) -> None:
    """Send ``msg`` pickled by value (plain :mod:`pickle`: the connection's default pickler would share torch
    tensors through file descriptors of this process, which the other end cannot open)."""
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def recv_msg(conn) -> Any:
    """Receive a message of :func:`send_msg`. Raises EOFError / OSError when the other end is gone."""
    return pickle.loads(conn.recv_bytes())


def read_authkey(path: str | Path | None) -> bytes:
    """The auth key in ``path`` (hex text).

    Raises:
        UserError: missing or unreadable file, not hex.
    """
    if path is None:
        raise UserError(f"trainer group: no auth key file ({ENV_AUTHKEY_FILE})")
    try:
        return bytes.fromhex(Path(path).read_text().strip())
    except OSError as e:
        raise UserError(f"{path}: cannot read the trainer auth key: {e.strerror}") from None
    except ValueError:
        raise UserError(f"{path}: the trainer auth key is not hex") from None


def _rmtree(d: Path) -> None:
    import shutil

    shutil.rmtree(d, ignore_errors=True)

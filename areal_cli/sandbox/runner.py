"""Run untrusted Python programs in the sandbox: the grader-side half (spawns and watches the harness).

One harness process per call runs every test of one program, each test in a fresh forked child
(see ``harness.py`` for the process layout and why). This module builds the job, enforces the total
time cap, streams per-test records to a callback (so a grader can stop at the first failure, as
LiveCodeBench does), and always cleans up: the harness's process group is killed, stragglers of its
session are swept, and the temporary directory is removed.

Isolation levels (``isolation=``):

- ``"auto"`` (default): every layer the machine allows. With namespaces: pid/net/mount/ipc/uts namespaces,
  a minimal read-only root, an unprivileged uid (as root) or a capability-less user namespace (as a
  normal user). Without: rlimits, process group, scrubbed environment and the audit hook only.
- ``"namespaces"``: as auto, but refuse to run (``SandboxError``) unless the full fs root could be built.
- ``"none"``: skip namespaces (rlimits, process group, fresh directory, scrubbed environment and the audit
  hook still apply). Used to test the fallback on machines that have namespaces.

What each run reports is in :class:`RunResult`; :func:`network_isolation` says what this machine gives.
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Sequence

from areal_cli.sandbox.limits import Limits

Isolation = Literal["auto", "namespaces", "none"]

HARNESS = Path(__file__).with_name("harness.py")

# LiveCodeBench's ``import_string`` (lcb_runner/evaluation/testing_util.py), prepended to every program
# in both modes there: solutions may use e.g. ``List``, ``defaultdict``, ``stdin`` without importing them.
LCB_PRELUDE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"
)

# Imported once by the harness before forking tests, so that the prelude costs a dict lookup per test.
_WARM_IMPORTS = (
    "import string, re, datetime, collections, heapq, bisect, copy, math, random, statistics, itertools, "
    "functools, operator, io, json, typing, decimal, fractions, array, threading, atexit, traceback\n"
)

_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


class SandboxError(RuntimeError):
    """The sandbox itself could not run (harness failed to start, required isolation unavailable).

    Never raised for anything a program does: a program can only make its own tests fail.
    """


@dataclass(frozen=True)
class RunResult:
    """One run of a program (one test).

    Attributes:
        returncode: exit status when it exited, else ``None`` (killed by a signal).
        stdout: everything it wrote to stdout (UTF-8, undecodable bytes replaced), at most
            ``Limits.max_file_bytes`` bytes.
        stderr: the last 4000 characters of its stderr.
        timed_out: killed for exceeding ``Limits.wall_s`` (wall clock) or ``Limits.cpu_s`` (SIGXCPU).
        killed_by: name of the signal that ended it (``"SIGKILL"``, ``"SIGXCPU"``, ``"SIGSEGV"``...) or None.
        wall_s, cpu_s: wall-clock and CPU seconds (user + system) of the run.
        max_rss_bytes: peak resident memory.
        outcome: how the harness saw the program end: ``"completed"``, ``"system_exit"``, ``"raised"``
            (stdin mode); ``"returned"``, ``"raised"``, ``"exit_before_call"``, ``"exit_during_call"``,
            ``"missing_function"``, ``"unserializable"`` (call-based); ``None`` when it ended without the
            harness getting to report (``os._exit``, a signal, a timeout).
        value_json: the JSON of the returned value (call-based, outcome ``"returned"``), else None.
        error: one line for ``"raised"`` and similar outcomes, else "".
        stdout_truncated: the program wrote more than the limit.
    """

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    killed_by: str | None
    wall_s: float
    cpu_s: float
    max_rss_bytes: int
    outcome: str | None = None
    value_json: str | None = None
    error: str = ""
    stdout_truncated: bool = False


@dataclass
class SandboxRun:
    """All runs of one program.

    Attributes:
        results: one :class:`RunResult` per test that ran, in order (fewer than the tests when stopped early,
            timed out overall, or the harness died).
        isolation: what isolation took effect (from the harness: ``pid_ns``, ``net_ns``, ``fs_root``,
            ``user``, ``nproc_limit``, ``errors``...).
        compile_error: the SyntaxError when the program did not compile (no test ran).
        setup_error: why the harness could not set up (then :func:`run_tests` raises ``SandboxError``).
        stopped_early: the ``on_result`` callback asked to stop.
        total_timed_out: the whole run exceeded ``total_timeout_s`` and was killed.
        harness_died: the harness ended before reporting every test (only a program attacking it, or a bug,
            can cause this; the missing tests did not pass).
        wall_s: seconds from spawn to cleanup.
        harness_pid: pid of the harness (its session id and process group id), for checks that it is gone.
    """

    results: list[RunResult] = field(default_factory=list)
    isolation: dict = field(default_factory=dict)
    compile_error: str | None = None
    setup_error: str | None = None
    stopped_early: bool = False
    total_timed_out: bool = False
    harness_died: bool = False
    wall_s: float = 0.0
    harness_pid: int | None = None

    @property
    def sandbox_uid(self) -> int | None:
        """The unprivileged uid the program ran as, when the harness switched to one (running as root)."""
        user = str(self.isolation.get("user", ""))
        return int(user.split()[1]) if user.startswith("uid ") else None


def read_roots() -> list[str]:
    """Host paths a sandboxed program may read: the Python installation and system libraries.

    The interpreter's prefixes (``sys.base_prefix``, ``sys.prefix`` for a venv) and ``/usr``, ``/lib*``,
    ``/etc/ld.so.cache``; symlinks resolved, nested paths dropped. Home directories, the repository, data
    sets and ``/tmp`` are not among them.
    """
    candidates = [sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix, "/usr", "/etc/ld.so.cache"]
    candidates += [f"/{name}" for name in ("lib", "lib32", "lib64", "libx32")]
    real = sorted({os.path.realpath(p) for p in candidates if os.path.exists(p)})
    out: list[str] = []
    for path in real:
        if not any(path == r or path.startswith(r.rstrip("/") + "/") for r in out):
            out.append(path)
    return out


def _program_sys_path(roots: list[str]) -> list[str]:
    """The parent's import path restricted to the read roots (stdlib, lib-dynload, site-packages)."""
    out = []
    for p in sys.path:
        if not p or not os.path.isdir(p):
            continue
        real = os.path.realpath(p)
        if any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
            out.append(p)
    return out


def _traversable_by_others(paths: list[str]) -> bool:
    """True when every directory on the way to each path has the others-execute bit (a dropped uid can
    reach the Python installation without namespaces)."""
    for path in paths:
        p = Path(path)
        for d in [p, *p.parents]:
            try:
                if d.is_dir() and not os.stat(d).st_mode & 0o001:
                    return False
            except OSError:
                return False
    return True


def _sweep_session(sid: int) -> None:
    """SIGKILL every process still in session ``sid`` (stragglers that left the harness's process group)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
            fields = stat[stat.rindex(b")") + 2 :].split()
            if int(fields[3]) == sid:  # fields after "comm": state ppid pgrp session ...
                os.kill(int(name), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue


def _result_from_record(rec: dict) -> RunResult:
    sig = rec.get("signal")
    killed_by = None
    if sig:
        try:
            killed_by = signal.Signals(sig).name
        except ValueError:
            killed_by = f"signal {sig}"
    result = rec.get("result") or {}
    return RunResult(
        returncode=rec.get("returncode"),
        stdout=rec.get("stdout", ""),
        stderr=rec.get("stderr", ""),
        timed_out=bool(rec.get("timed_out")) or killed_by == "SIGXCPU",
        killed_by=killed_by,
        wall_s=float(rec.get("wall_s", 0.0)),
        cpu_s=float(rec.get("cpu_s", 0.0)),
        max_rss_bytes=int(rec.get("max_rss_bytes", 0)),
        outcome=result.get("kind"),
        value_json=result.get("value_json"),
        error=str(result.get("error", "")),
        stdout_truncated=bool(rec.get("stdout_truncated")),
    )


def run_tests(
    source: str,
    tests: Sequence[str] | Sequence[list],
    *,
    fn_name: str | None = None,
    limits: Limits = Limits(),
    total_timeout_s: float = 60.0,
    prelude: str = LCB_PRELUDE,
    isolation: Isolation = "auto",
    on_result: Callable[[int, RunResult], bool] | None = None,
    probe_paths: Sequence[str] = (),
    audit_hook: bool = True,
) -> SandboxRun:
    """Run ``source`` once per test inside one sandbox, tests in order.

    Args:
        source: the program (Python 3).
        tests: stdin mode (``fn_name is None``): the stdin text of each run. Call-based mode: the positional
            arguments of each call (JSON-able lists).
        fn_name: None for stdin/stdout programs; else the function (or ``Solution`` method, when the source
            defines ``class Solution``, as LiveCodeBench decides) to call.
        limits: per-run limits (``limits.wall_s`` is the per-test timeout).
        total_timeout_s: cap on the whole call; tests not finished by then have no result.
        prelude: text prepended to the program (LiveCodeBench's imports by default).
        isolation: ``"auto"``, ``"namespaces"`` or ``"none"`` (see the module docstring).
        on_result: called after each test with (index, result); return False to stop (the rest do not run).
        probe_paths: host paths whose visibility the harness reports in ``isolation["probe"]`` (tests and
            :func:`network_isolation` use this; it also turns on the network probe).
        audit_hook: install the in-process guard (default). ``False`` exists only so that tests can show
            what the operating-system layers contain on their own; never turn it off for real grading.
    Returns:
        a :class:`SandboxRun`.
    Raises:
        SandboxError: the harness could not start or set up (never for program behaviour).
        ValueError: malformed arguments.
    """
    if isolation not in ("auto", "namespaces", "none"):
        raise ValueError(f"isolation must be 'auto', 'namespaces' or 'none', got {isolation!r}")
    if fn_name is None and not all(isinstance(t, str) for t in tests):
        raise ValueError("stdin-mode tests must be strings")
    if fn_name is not None and not all(isinstance(t, list) for t in tests):
        raise ValueError("call-based tests must be lists of arguments")
    roots = read_roots()
    tmp = tempfile.mkdtemp(prefix="areal-sandbox-")
    rng = random.SystemRandom()
    uid = rng.randrange(1 << 24, 1 << 30)
    job = {
        "code": source,
        "mode": "stdin" if fn_name is None else "call",
        "fn_name": fn_name,
        "tests": list(tests),
        "prelude": prelude,
        "warm_imports": _WARM_IMPORTS,
        "limits": limits.to_job(),
        "isolation": isolation,
        "read_roots": roots,
        "sys_path": _program_sys_path(roots),
        "env": _ENV,
        "staging": os.path.join(tmp, "root"),
        "workdir": os.path.join(tmp, "work"),
        "uid": uid,
        "gid": uid,
        "fallback_uid_ok": _traversable_by_others([*roots, tmp]),
        "probe": bool(probe_paths),
        "probe_paths": list(probe_paths),
        "audit_hook": bool(audit_hook),
    }
    run = SandboxRun()
    t0 = time.monotonic()
    proc = None
    try:
        os.chmod(tmp, 0o711)
        os.mkdir(job["staging"], 0o755)
        os.mkdir(job["workdir"], 0o700)
        with tempfile.TemporaryFile() as errfile:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-B", "-X", "utf8", str(HARNESS)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=errfile,
                    cwd=tmp,
                    env=dict(_ENV),
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise SandboxError(f"cannot start the sandbox harness: {exc}") from exc
            run.harness_pid = proc.pid
            try:
                proc.stdin.write(json.dumps(job).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            if _read_records(proc, run, len(job["tests"]), t0 + total_timeout_s, on_result):
                # Finished normally: let the harness exit by itself, so that its CPU time (and its
                # children's) is accounted to this process (RUSAGE_CHILDREN), as benchmarks read it.
                _wait_exit_unreaped(proc.pid, 2.0)
            errfile.seek(0)
            harness_err = errfile.read()[-2000:].decode("utf-8", "replace").strip()
        if run.setup_error is not None:
            raise SandboxError(f"sandbox setup failed: {run.setup_error}" + (f" ({harness_err})" if harness_err else ""))
        if not run.isolation and run.compile_error is None and not run.total_timed_out:
            raise SandboxError(f"sandbox harness exited without reporting: {harness_err or 'no message'}")
    finally:
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            if not run.isolation.get("pid_ns"):
                _sweep_session(proc.pid)
            _kill_group(proc)
        shutil.rmtree(tmp, ignore_errors=True)
        run.wall_s = time.monotonic() - t0
    return run


def _wait_exit_unreaped(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` has exited but leave it unreaped (a zombie keeps its pid, so the process-group
    kill and session sweep that follow cannot hit a process that reused the number). True if it exited."""
    deadline = time.monotonic() + timeout_s
    delay = 0.0005
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the harness's process group (it is a session leader: pgid == pid) and reap it.
    The caller sweeps the session before this reaps the harness."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
        pass
    if proc.stdout is not None:
        proc.stdout.close()


def _read_records(
    proc: subprocess.Popen,
    run: SandboxRun,
    n_tests: int,
    deadline: float,
    on_result: Callable[[int, RunResult], bool] | None,
) -> bool:
    """Read the harness's JSON lines until ``done``, an error, EOF, the deadline, or a stop request.
    Returns True only when the harness reported ``done``."""
    fd = proc.stdout.fileno()
    poller = select.poll()  # not select.select: it fails on fds >= 1024, common in a busy grader process
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            run.total_timed_out = True
            return False
        if not poller.poll(max(1, int(left * 1000))):
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            if len(run.results) < n_tests and run.compile_error is None and run.isolation:
                run.harness_died = True
            return False
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            rec = json.loads(line)
            event = rec.get("event")
            if event == "ready":
                run.isolation = rec["isolation"]
            elif event == "error":
                run.setup_error = rec["error"]
                return False
            elif event == "compile_error":
                run.compile_error = rec["error"]
                return True
            elif event == "done":
                return True
            elif event == "test":
                result = _result_from_record(rec)
                run.results.append(result)
                if on_result is not None and not on_result(rec["i"], result):
                    run.stopped_early = True
                    return False


def run_python(
    source: str,
    *,
    stdin: str = "",
    limits: Limits = Limits(),
    isolation: Isolation = "auto",
    prelude: str = "",
) -> RunResult:
    """Run one program once with ``stdin`` as its input (no prelude by default).

    Returns:
        its :class:`RunResult`. A program that does not compile comes back with ``outcome="raised"``,
        ``returncode=1`` and the SyntaxError in ``error``.
    Raises:
        SandboxError: the sandbox could not run.
    """
    run = run_tests(
        source, [stdin], limits=limits, total_timeout_s=limits.wall_s + 30.0, prelude=prelude, isolation=isolation
    )
    if run.compile_error is not None:
        return RunResult(1, "", run.compile_error, False, None, 0.0, 0.0, 0, "raised", None, run.compile_error)
    if not run.results:
        raise SandboxError("the sandbox reported no result" + (" (total timeout)" if run.total_timed_out else ""))
    return run.results[0]


def network_isolation(isolation: Isolation = "auto") -> dict:
    """What isolation this machine gives a sandboxed program, checked by running the harness once.

    Returns:
        the harness's isolation report plus ``"network"``: ``"network namespace"`` (no route anywhere:
        only a downed loopback) or ``"audit hook only"`` (the fallback: the in-process guard refuses
        ``socket`` creation and name resolution; weaker, since native code could bypass it), and
        ``"probe"``: the interfaces seen and whether a route to the internet exists.
    """
    run = run_tests("", [], isolation=isolation, prelude="", probe_paths=[str(Path.home()), tempfile.gettempdir()])
    info = dict(run.isolation)
    probe = info.get("probe", {})
    no_route = probe.get("route_to_internet") is False
    info["network"] = "network namespace" if info.get("net_ns") and no_route else "audit hook only"
    return info

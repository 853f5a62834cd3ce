"""What a sandbox run reports: :class:`RunResult` per test, :class:`SandboxRun` per program,
:class:`SandboxError` when the sandbox itself could not run, the harness's test record read into a
RunResult, and :func:`describe_isolation` (the isolation level and layers in one line).

Grader-side only (the harness never imports this); stdlib only."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field


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
        exit_code: the status the program ended with as ``python main.py`` would exit (stdin mode: 0 when it
            ran to its end, the ``SystemExit`` status -- a message counts as 1 -- or 1 when it raised), as the
            harness reports it; None when the harness did not get to report (the process status is then in
            ``returncode``). The process itself always ends with status 0 after a ``SystemExit``.
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
    exit_code: int | None = None


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



def describe_isolation(info: dict) -> str:
    """One line for a person: the level and the layers in force, from a run's ``isolation`` report.

    E.g. ``"full: pid, net and mount namespaces, read-only root, an unprivileged uid, <= 16 tasks, rlimits,
    audit hook"`` or ``"reduced: no namespaces (unshare: Operation not permitted); host file system visible
    (read per its permissions); network reachable except through the audit hook; an unprivileged uid,
    <= 16 tasks, rlimits, audit hook"``.
    """
    level = info.get("level", "reduced")
    layers = []
    ns = [name for key, name in (("pid_ns", "pid"), ("net_ns", "net"), ("mount_ns", "mount")) if info.get(key)]
    if ns:
        layers.append(", ".join(ns[:-1]) + (" and " if len(ns) > 1 else "") + ns[-1] + " namespaces")
    if info.get("fs_root"):
        layers.append("read-only root")
    user = str(info.get("user", "unchanged"))
    layers.append("the caller's uid" if user == "unchanged" else "an unprivileged uid" if user.startswith("uid ") else user)
    if info.get("nproc_limit") is not None:
        layers.append(f"<= {info['nproc_limit']} tasks")
    layers.append("rlimits")
    if info.get("guard"):
        layers.append("audit hook")
    if level == "full":
        return "full: " + ", ".join(layers)
    missing = []
    if not info.get("pid_ns") or not info.get("net_ns") or not info.get("mount_ns"):
        why = "; ".join(info.get("errors") or []) or "namespaces not used"
        missing.append(f"no namespaces ({why})")
    if not info.get("fs_root"):
        missing.append("host file system visible (read per its permissions)")
    if not info.get("net_ns"):
        missing.append("network reachable except through the audit hook")
    return "reduced: " + "; ".join(missing) + "; " + ", ".join(layers)



def result_from_record(rec: dict) -> RunResult:
    """The :class:`RunResult` of one ``{"event": "test", ...}`` record of the harness (a ``SIGXCPU`` is a
    timeout; the signal number becomes its name)."""
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
        exit_code=result.get("exit_code") if isinstance(result.get("exit_code"), int) else None,
    )

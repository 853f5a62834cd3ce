"""Resource limits for one sandboxed program run (one test)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Limits applied to every run of an untrusted program (each test is one run).

    Attributes:
        wall_s: wall-clock seconds per run, enforced from outside the program (it is killed on overrun).
            LiveCodeBench and AReaL use 6 s per test case (``SINGLE_CASE_EXEC_TIMEOUT``).
        cpu_s: CPU seconds per run (``RLIMIT_CPU``; the kernel sends SIGXCPU/SIGKILL). ``None``: wall_s + 1,
            a backstop for the wall-clock kill.
        memory_bytes: address space per process (``RLIMIT_AS``); allocation beyond it fails (MemoryError).
        max_procs: tasks (processes + threads) the sandbox may hold at once, its harness worker included
            (``RLIMIT_NPROC``). Exact when the sandbox has a uid or user namespace of its own; with a shared
            uid the limit is set this many above the uid's current count; as root without namespaces it
            cannot be enforced and the audit hook's refusal of fork/exec is what remains (see
            ``harness._setup_isolation``).
        max_file_bytes: largest file the program may write (``RLIMIT_FSIZE``); stdout and stderr are files
            too, so this also caps the output.
        max_open_files: open file descriptors (``RLIMIT_NOFILE``).
        work_bytes: size of the program's working directory (a tmpfs, when the fs root can be built).
    """

    wall_s: float = 6.0
    cpu_s: float | None = None
    memory_bytes: int = 2 * GiB
    max_procs: int = 16
    max_file_bytes: int = 32 * MiB
    max_open_files: int = 64
    work_bytes: int = 64 * MiB

    def __post_init__(self) -> None:
        if not (self.wall_s > 0 and math.isfinite(self.wall_s)):
            raise ValueError(f"Limits.wall_s must be a positive number of seconds, got {self.wall_s!r}")
        if self.cpu_s is not None and not self.cpu_s > 0:
            raise ValueError(f"Limits.cpu_s must be positive or None, got {self.cpu_s!r}")
        for name in ("memory_bytes", "max_procs", "max_file_bytes", "max_open_files", "work_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
        if self.max_open_files < 8:
            raise ValueError(f"Limits.max_open_files must be >= 8 (the interpreter needs a few), got {self.max_open_files}")

    @property
    def cpu_limit_s(self) -> int:
        """Whole seconds for ``RLIMIT_CPU``: ``cpu_s`` or ``ceil(wall_s) + 1``."""
        return int(math.ceil(self.cpu_s if self.cpu_s is not None else self.wall_s + 1))

    def to_job(self) -> dict:
        """The limits as the harness reads them (JSON-able)."""
        out = asdict(self)
        out["cpu_s"] = self.cpu_limit_s
        return out

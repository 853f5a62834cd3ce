"""Process groups of child servers that must not outlive this process: a watchdog process that stops them when
this process dies without running atexit (SIGTERM, SIGKILL), and the group helpers (list, alive, kill).

The watchdog is a small ``python -c`` child in its own session that holds the read end of a pipe from this
process (``+pgid`` registers a group, ``exit`` ends it without touching them); when the pipe closes (this
process is gone) or its parent changes, it SIGTERMs then SIGKILLs every registered group. Used by
:mod:`areal_cli.rollout.fleet`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_WATCHDOG_SRC = r"""
import os, select, signal, sys, time
parent = int(sys.argv[1]); groups = set(); buf = b""
def alive(g):
    try:
        os.killpg(g, 0); return True
    except (ProcessLookupError, PermissionError):
        return False
while True:
    r, _, _ = select.select([0], [], [], 0.5)
    if r:
        chunk = os.read(0, 4096)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for ln in lines:
            if ln == b"exit":
                sys.exit(0)
            if ln.startswith(b"+"):
                groups.add(int(ln[1:]))
            elif ln.startswith(b"-"):
                groups.discard(int(ln[1:]))
    elif os.getppid() != parent:
        break
for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
    for g in groups:
        try:
            os.killpg(g, sig)
        except (ProcessLookupError, PermissionError):
            pass
    end = time.monotonic() + wait
    while any(alive(g) for g in groups) and time.monotonic() < end:
        time.sleep(0.1)
"""


class Watchdog:
    """Stops registered process groups when this process dies (see module docstring).

    Args:
        python: the interpreter that runs the watchdog (``python -c``).
    """

    def __init__(self, python: str):
        self.proc = subprocess.Popen([python, "-c", _WATCHDOG_SRC, str(os.getpid())], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)

    def _send(self, line: str) -> None:
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def add(self, pgid: int) -> None:
        """Register process group ``pgid``: stopped if this process dies before :meth:`close`."""
        self._send(f"+{pgid}")

    def close(self) -> None:
        """Tell the watchdog the groups are stopped; it exits without touching them."""
        if self.proc.poll() is None:
            self._send("exit")
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def killpg(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; a group that is gone (or not ours) is ignored."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_pids(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, read from ``/proc`` on Linux.

    Elsewhere: ``[pgid]`` while ``killpg(pgid, 0)`` succeeds (zombies then count as alive), else ``[]``.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    out = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(d.name))
    return out


def group_alive(pgid: int) -> bool:
    """True while process group ``pgid`` has a live (not zombie) process (:func:`group_pids`)."""
    return bool(group_pids(pgid))

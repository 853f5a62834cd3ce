"""Who used this machine's CPUs during a measurement: this process tree, other processes, the hypervisor.

A benchmark that pins its two sides to two cores assumes nothing else runs there. :func:`cpu_sample` reads the
machine's CPU counters (Linux ``/proc/stat``: busy and steal seconds, all cores) and the CPU seconds of this
process and its descendants (``/proc/PID/stat`` utime + stime + the reaped children's cutime + cstime);
:func:`cpu_use_between` turns two samples into cores used over the interval:

- ``ours_cores``: this process tree (trainer, servers, controller, reward workers);
- ``other_cores``: every other process (busy - ours): a test suite, a build or a second benchmark beside ours;
- ``steal_cores``: time the hypervisor gave this VM's virtual CPUs to someone else (noisy neighbours).

Either of the last two above :data:`BUSY_CORES` means the measured ratios are partly the machine's, not the
schedule's. Elsewhere than Linux nothing is measured (None).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

#: Cores of other processes (or of steal) over a run above which the machine counts as busy.
BUSY_CORES = 0.10

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuSample:
    """CPU counters at one moment (seconds since boot, all cores summed)."""

    t: float       # time.monotonic()
    busy: float    # user + nice + system + irq + softirq over all cores
    steal: float   # stolen by the hypervisor over all cores
    ours: float    # this process tree: utime + stime + cutime + cstime


def _proc_stat_fields(pid: str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ...


def _tree_seconds(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants (their reaped children included through cutime)."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        f = _proc_stat_fields(entry)
        if f is None:
            continue
        pid, ppid = int(entry), int(f[1])
        children.setdefault(ppid, []).append(pid)
        times[pid] = sum(int(x) for x in f[11:15]) / _TICK  # utime stime cutime cstime (fields 14-17)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def cpu_sample() -> CpuSample | None:
    """The machine's and this process tree's CPU counters now; None where ``/proc`` has none (not Linux)."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu" or len(first) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first[1:9])
    return CpuSample(time.monotonic(), (user + nice + system + irq + softirq) / _TICK, steal / _TICK,
                     _tree_seconds(os.getpid()))


def cpu_use_between(a: CpuSample | None, b: CpuSample | None) -> dict | None:
    """Cores used between samples ``a`` and ``b``: ``{"seconds": wall, "ours_cores", "other_cores",
    "steal_cores", "busy": other or steal above BUSY_CORES}`` (cores = CPU seconds / wall seconds; other_cores
    is clamped at 0: a process of ours that ended unreaped leaves its seconds uncounted). None without samples."""
    if a is None or b is None or b.t <= a.t:
        return None
    wall = b.t - a.t
    ours = (b.ours - a.ours) / wall
    other = max(0.0, (b.busy - a.busy) / wall - ours)
    steal = (b.steal - a.steal) / wall
    return {"seconds": round(wall, 3), "ours_cores": round(ours, 3), "other_cores": round(other, 3),
            "steal_cores": round(steal, 3), "busy": other > BUSY_CORES or steal > BUSY_CORES}

"""What ran when during ``areal train`` (``timeline.json``), for ``areal bench throughput``'s accounting.

Times are ``time.monotonic()`` seconds. Off by default (``run_training(record_timeline=True)`` turns it on).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Timeline:
    """Activity intervals, per-step records and CPU counters of one run.

    ``events``: ``{"lane", "kind", "start", "end"}`` intervals. Lanes: ``"trainer"`` (kinds ``wait`` for
    a batch, ``train`` = proximal recompute + PPO update, ``publish`` = save weights + load on the servers,
    ``eval``) and ``"server<i>"`` (``generate``: at least one request of this server in flight, seen by the
    client; ``update``: weight-update window). ``steps``: one record per RL step (see
    :func:`areal_cli.train_loop.loop.rl_loop`). ``cpu``: CPU seconds of this process and of every server process at
    RL start and end.
    """

    events: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    marks: dict = field(default_factory=dict)
    cpu: dict = field(default_factory=dict)

    def add(self, lane: str, kind: str, start: float, end: float) -> None:
        self.events.append({"lane": lane, "kind": kind, "start": round(start, 6), "end": round(end, 6)})

    def to_dict(self) -> dict:
        return {"clock": "time.monotonic", "marks": self.marks, "events": self.events, "steps": self.steps,
                "cpu": self.cpu}


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads) from ``/proc``; None if unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def cpu_snapshot(*, trainer_pids: list[int] = (), rollout_pid: int | None = None,
                 server_pids: list[int] = ()) -> dict:
    """``{"t": monotonic s, "trainer_process": CPU s of this process, "server<i>": CPU s of server i,
    "trainer_rank<r>": CPU s of torchrun trainer rank r, "rollout_process": CPU s of the rollout process}``."""
    import time

    snap = {"t": time.monotonic(), "trainer_process": process_cpu_seconds(os.getpid())}
    for r, pid in enumerate(trainer_pids):
        snap[f"trainer_rank{r}"] = process_cpu_seconds(pid)
    if rollout_pid is not None:
        snap["rollout_process"] = process_cpu_seconds(rollout_pid)
    for i, pid in enumerate(server_pids):
        snap[f"server{i}"] = process_cpu_seconds(pid)
    return snap

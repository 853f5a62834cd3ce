"""Keeps a run's rollout fleet serving: servers that die or stop answering are restarted with the current
weights, and their in-flight samples are re-issued elsewhere, while training continues.

Detection (every ``poll_s``), never through ``/health`` (on SGLang it runs a generation, blocks while
generation is paused and then marks the server unhealthy):

- a launched server's process has exited (``kill -9``, a crash, the OOM killer);
- the client saw a ``/generate`` connection fail or break and the server did not answer a ``/model_info``
  probe (:meth:`RolloutClient._server_failed`);
- a server that owes answers (generations in flight with no ``/generate`` answer, or a pause, continue or
  weight load still waiting on it) for ``stall_s`` seconds and does not answer ``/model_info`` within 5 s
  ("stopped answering": a hung or stopped process; :meth:`RolloutClient.stalled_for`).

Healing: the server is marked down (routing skips it; its in-flight samples are re-issued on a live server
with their prefixes, see :mod:`areal_cli.rollout.client`), its process group is killed and it is started again
on the same port with the weights the fleet currently serves and their policy version as label
(``weights_of()``), under ``lock`` so that no weight update runs meanwhile; then it rejoins the rotation.
A server that went down more than ``max_restarts`` times ends the run with one line
(:class:`~areal_cli.rollout.fleet.ServerDiedError`), as does any outage that cannot be healed: an external
server that does not answer again within ``external_grace_s``, and any server under ``weight_update_mode:
xccl`` (a restarted server cannot rejoin the NCCL weight-update group of the running trainer).

Counters (:attr:`stats`): restarts per server, outages, and the client's re-issued samples; ``events`` lists
what happened and when (run clock).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from areal_cli.rollout.fleet import ServerDiedError


@dataclass
class SupervisorStats:
    """What the supervisor did (reported in metrics and summary.json ``fleet``)."""

    outages: int = 0
    restarts: dict[str, int] = field(default_factory=dict)  # url -> restarts
    events: list[dict] = field(default_factory=list)

    def as_dict(self, reissued_samples: int) -> dict:
        return {"server_outages": self.outages, "server_restarts": sum(self.restarts.values()),
                "reissued_samples": reissued_samples}


class FleetSupervisor:
    """Watches ``fleet`` through ``client`` and heals it (see the module docstring).

    Args:
        fleet: the run's :class:`~areal_cli.rollout.fleet.Fleet`.
        client: the run's :class:`~areal_cli.rollout.client.RolloutClient` (its ``on_server_down`` is taken).
        weights_of: ``() -> (model_dir, policy_version)`` the fleet serves now.
        lock: held around weight updates by the loop; held here around a restart.
        can_restart: False under ``rollout.weight_update_mode: xccl`` (an outage then ends the run).
        max_restarts: restarts allowed per server.
        stall_s: seconds without a ``/generate`` answer (with requests in flight) before a probe.
        log: one-line status messages.
        clock: the run's clock for ``events`` (seconds).
    """

    def __init__(self, fleet: Any, client: Any, *, weights_of: Callable[[], tuple[Path, int]], lock: asyncio.Lock,
                 can_restart: bool = True, max_restarts: int = 3, stall_s: float = 60.0,
                 log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = 0.5, external_grace_s: float = 120.0) -> None:
        self.fleet, self.client = fleet, client
        self.weights_of, self.lock = weights_of, lock
        self.can_restart, self.max_restarts, self.stall_s = can_restart, int(max_restarts), float(stall_s)
        self.log, self.clock, self.poll_s, self.external_grace_s = log, clock, float(poll_s), float(external_grace_s)
        self.stats = SupervisorStats()
        self._wake = asyncio.Event()
        self._down_since: dict[str, float] = {}
        self._probed_ok: dict[str, float] = {}  # url -> when a stalled-looking server last answered a probe
        client.on_server_down = self._on_down

    def metrics(self) -> dict:
        """``{"server_outages", "server_restarts", "reissued_samples"}`` so far."""
        return self.stats.as_dict(self.client.reissued_samples)

    def _on_down(self, url: str, reason: str) -> None:
        self.stats.outages += 1
        self._down_since[url] = time.monotonic()
        self.stats.events.append({"t": round(self.clock(), 3), "server": url, "event": "down", "reason": reason})
        self.log(f"rollout server {url} is down ({reason}); its samples are re-issued on the others")
        self._wake.set()

    async def run(self) -> None:
        """Watch and heal until cancelled.

        Raises:
            ServerDiedError: an outage that cannot be healed (one line: which server, why, its log).
        """
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            await self._detect()
            for url in list(self.client.down):
                await self._heal(url)

    async def _detect(self) -> None:
        now = time.monotonic()
        for url in self.client.live_urls():
            i = self.fleet.index_of(url)
            code = self.fleet.exit_code(i) if i is not None else None
            if code is not None:
                self.client.mark_down(url, f"process exited with code {code}")
                continue
            stalled = self.client.stalled_for(url)
            if stalled > self.stall_s and now - self._probed_ok.get(url, 0.0) > self.stall_s:
                if not await self.client.probe(url, timeout_s=5.0):
                    self.client.mark_down(url, f"stopped answering (owed an answer for {stalled:.0f} s, "
                                               f"no /model_info answer in 5 s)")
                else:
                    self._probed_ok[url] = now  # alive, only slow: look again after stall_s

    async def _heal(self, url: str) -> None:
        i = self.fleet.index_of(url)
        where = self.fleet.describe(i) if i is not None else url
        reason = self.client.down.get(url, "down")
        if not self.can_restart:
            raise ServerDiedError(f"{where} went down ({reason}); rollout.weight_update_mode xccl cannot re-admit a "
                                  f"restarted server (weight_update_mode: disk heals the fleet)")
        if i is None or not self.fleet.can_restart(i):  # external: wait for it to answer again
            if await self.client.probe(url, timeout_s=5.0):
                async with self.lock:
                    path, version = self.weights_of()
                    await self.client.load_weights_on(url, str(Path(path).resolve()), version)
                self._up(url, "back")
            elif time.monotonic() - self._down_since.get(url, time.monotonic()) > self.external_grace_s:
                raise ServerDiedError(f"{where} went down ({reason}) and did not answer again within "
                                      f"{self.external_grace_s:.0f} s")
            return
        n = self.stats.restarts.get(url, 0)
        if n >= self.max_restarts:
            raise ServerDiedError(f"{where} went down {n + 1} times (last: {reason}); "
                                  f"server_max_restarts is {self.max_restarts}")
        self.stats.restarts[url] = n + 1
        async with self.lock:
            path, version = self.weights_of()
            self.log(f"restarting {where} with policy version {version} (restart {n + 1}/{self.max_restarts})")
            t0 = time.monotonic()
            await asyncio.to_thread(self.fleet.restart, i, path, version)
            self._up(url, f"restarted in {time.monotonic() - t0:.1f} s")

    def _up(self, url: str, how: str) -> None:
        self.client.mark_up(url)
        self._down_since.pop(url, None)
        self.stats.events.append({"t": round(self.clock(), 3), "server": url, "event": "up", "how": how})
        self.log(f"rollout server {url} is serving again ({how})")

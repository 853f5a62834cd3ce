"""Staleness admission control: how many new rollout groups may start now.

This is AReaL's capacity rule (AReaL-lite ``StalenessManager.get_capacity``; boba² ``is_staled`` in
``gserver_manager.py``; DESIGN §3)::

    capacity = min(max_concurrent - running,
                   (eta + version + 1) * batch_size - (accepted + running))

with ``eta = max_head_offpolicyness``. A group admitted now starts generating with weights of at least
``version``; it can be trained at the earliest at step ``(accepted + running) // batch_size``, so the rule
bounds how many policy versions old the *head* of a trained sample can be by ``eta``. ``eta = 0`` is
synchronous PPO: exactly one batch is generated per policy version.

Units: all counters count *groups* (one prompt with its n samples). A rejected (filtered) group gives its
slot back: it counts neither as running nor as accepted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StalenessManager:
    """Counts admitted, running and accepted rollout groups and answers how many may start.

    Args:
        batch_size: groups consumed by one training step (consumer batch size), > 0.
        max_head_offpolicyness: eta >= 0, the staleness bound in policy versions.
        max_concurrent: cap on groups generating at once, > 0.

    Raises:
        ValueError: on a non-positive batch_size / max_concurrent or a negative eta.
    """

    batch_size: int
    max_head_offpolicyness: int
    max_concurrent: int
    version: int = 0
    running: int = 0
    accepted: int = 0
    rejected: int = 0

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {self.batch_size}")
        if self.max_concurrent <= 0:
            raise ValueError(f"max_concurrent must be > 0, got {self.max_concurrent}")
        if self.max_head_offpolicyness < 0:
            raise ValueError(f"max_head_offpolicyness must be >= 0, got {self.max_head_offpolicyness}")

    def capacity(self) -> int:
        """Number of new groups that may be admitted now (never negative)."""
        by_concurrency = self.max_concurrent - self.running
        by_staleness = (self.max_head_offpolicyness + self.version + 1) * self.batch_size - (
            self.accepted + self.running
        )
        return max(0, min(by_concurrency, by_staleness))

    def on_submit(self) -> None:
        """A group was admitted and starts generating.

        Raises:
            RuntimeError: if there is no capacity (the caller must check :meth:`capacity` first).
        """
        if self.capacity() <= 0:
            raise RuntimeError("admission without capacity: check capacity() before on_submit()")
        self.running += 1

    def on_accept(self) -> None:
        """A running group finished and was kept for training."""
        self._finish()
        self.accepted += 1

    def on_reject(self) -> None:
        """A running group finished and was dropped (e.g. by the success-rate filter); its slot is freed."""
        self._finish()
        self.rejected += 1

    def on_stale(self) -> None:
        """An accepted group was dropped at consumption because its head is more than ``eta`` versions older
        than the consumer (a straggler: re-issued after its server died, or slow); its slot is freed."""
        if self.accepted <= 0:
            raise RuntimeError("a stale group was dropped but none was accepted")
        self.accepted -= 1
        self.rejected += 1

    def set_version(self, version: int) -> None:
        """The trainer published policy ``version`` (number of completed train steps)."""
        if version < self.version:
            raise ValueError(f"policy version went backwards: {self.version} -> {version}")
        self.version = version

    def _finish(self) -> None:
        if self.running <= 0:
            raise RuntimeError("a group finished but none was running")
        self.running -= 1

    def state_dict(self) -> dict[str, int]:
        """Counters, for checkpoints and metrics."""
        return {
            "version": self.version,
            "running": self.running,
            "accepted": self.accepted,
            "rejected": self.rejected,
        }

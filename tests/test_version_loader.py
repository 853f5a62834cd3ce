"""VersionLoader: the servers load published versions in the background, the newest winning; the trainer waits
only when it needs the servers on its version."""

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from areal_cli.train_loop.weights import VersionLoader


class Client:
    """update_weights_from_disk that blocks until released (a non-interruptible load waiting for a drain)."""

    def __init__(self):
        self.loads: list[int] = []
        self.gate = asyncio.Event()
        self.fail_on: int | None = None

    async def update_weights_from_disk(self, path: str, version: int) -> None:
        await self.gate.wait()
        if version == self.fail_on:
            raise RuntimeError(f"load of v{version} failed")
        self.loads.append(version)


def make(tmp_path):
    client = Client()
    ctx = SimpleNamespace(client=client, fleet_lock=None, version=0, served=(tmp_path / "warm", 0))
    notified: list[int] = []
    controller = SimpleNamespace(notify_version=notified.append)
    return VersionLoader(ctx, controller), ctx, client, notified


def test_a_load_in_progress_does_not_block_publishing_and_the_newest_pending_version_wins(tmp_path):
    async def main():
        loader, ctx, client, notified = make(tmp_path)
        loader.publish(Path("v1"), 1)  # returns at once
        await asyncio.sleep(0)
        assert loader.floor(0) == 0  # v1 loading, the warm start served: nothing may go
        loader.publish(Path("v2"), 2)
        loader.publish(Path("v3"), 3)  # replaces v2, which is never loaded
        assert client.loads == [] and notified == []
        client.gate.set()
        await loader.wait()
        assert client.loads == [1, 3]
        assert notified == [3]  # the controller hears of the newest only (v3 loaded right after v1)
        assert (ctx.version, ctx.served) == (3, (Path("v3"), 3))
        assert loader.floor(5) == 3  # the served version is still needed
        loader.publish(Path("v4"), 4)
        await loader.wait()
        assert client.loads == [1, 3, 4] and notified == [3, 4]

    asyncio.run(main())


def test_a_failed_load_raises_at_the_next_publish_or_wait(tmp_path):
    async def main():
        loader, _, client, notified = make(tmp_path)
        client.fail_on = 1
        client.gate.set()
        loader.publish(Path("v1"), 1)
        await asyncio.sleep(0.01)
        with pytest.raises(RuntimeError, match="load of v1 failed"):
            loader.publish(Path("v2"), 2)
        loader.publish(Path("v2"), 2)  # the error was reported once; later loads go on
        await loader.wait()
        assert client.loads == [2] and notified == [2]
        client.fail_on = 3
        loader.publish(Path("v3"), 3)
        with pytest.raises(RuntimeError, match="load of v3 failed"):
            await loader.wait()

    asyncio.run(main())


def test_cancel_stops_a_running_load(tmp_path):
    async def main():
        loader, _, client, notified = make(tmp_path)
        loader.publish(Path("v1"), 1)
        await asyncio.sleep(0)
        await loader.cancel()
        client.gate.set()
        await asyncio.sleep(0.01)
        await loader.wait()
        assert client.loads == [] and notified == []

    asyncio.run(main())

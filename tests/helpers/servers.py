"""The embedded rollout server as the tests spawn it: a child process on the tiny model, its log in a fresh
temp folder, and a wait until it is decoding (so that an abort or a weight update lands mid-generation)."""

from __future__ import annotations

import asyncio
import time

import httpx

from areal_cli.rollout.server import EmbeddedServer


def spawn_server(model_dir, tmp_path_factory, *, log_folder: str = "srv", **launch) -> EmbeddedServer:
    """``EmbeddedServer.launch(model_dir, log_path=<fresh temp folder>/server.log, **launch)``: the caller
    stops it. Pass ``wait=False`` to load other things while the child starts, then ``wait_until_ready()``."""
    log = tmp_path_factory.mktemp(log_folder) / "server.log"
    return EmbeddedServer.launch(model_dir, log_path=log, **launch)


async def wait_generating(url: str, at_least: int = 5) -> None:
    """Return once the server at ``url`` has decoded ``at_least`` more tokens (``/server_info``'s
    ``decode_tokens``); fails the test after 20 s."""
    async with httpx.AsyncClient() as h:
        async def n():
            return (await h.get(url + "/server_info")).json()["internal_states"][0]["decode_tokens"]
        base, t0 = await n(), time.monotonic()
        while await n() < base + at_least:
            assert time.monotonic() - t0 < 20
            await asyncio.sleep(0.01)

"""Controller for tests/test_launch.py that drives the real trainer group in attach mode (what `areal train`
does on node 0 with $AREAL_CONTROLLER_LISTEN): waits for rank 0 of the torchrun ranks launched on the nodes,
builds the engine, makes one collective call, stops the group, writes ``$LAUNCH_TEST_OUT/attach.json``."""

import asyncio
import json
import os
from pathlib import Path

from areal_cli.trainer.group import TorchrunTrainer


async def main() -> None:
    group = await TorchrunTrainer.attach(os.environ["AREAL_CONTROLLER_LISTEN"], {},
                                         authkey_file=os.environ["AREAL_CONTROLLER_AUTHKEY_FILE"],
                                         factory="launch_engine:AllReduceEngine", timeout_s=120)
    try:
        result = await group.call("engine.all_reduce", 10.0)
        world = group.world
    finally:
        group.close()
    Path(os.environ["LAUNCH_TEST_OUT"], "attach.json").write_text(json.dumps({"world": world, "result": result}))


asyncio.run(main())

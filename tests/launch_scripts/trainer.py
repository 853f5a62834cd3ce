"""Stand-in trainer rank for tests/test_launch.py, run by torchrun on each "node".

Joins the default process group over gloo, all-reduces ``rank + 1`` and writes
``$LAUNCH_TEST_OUT/rank{RANK}.json`` with the sum, its node rank (torchrun's ``GROUP_RANK``), world size and
the controller address the launcher passed. With ``LAUNCH_TEST_FAIL_NODE`` equal to its node rank it exits
with code 3 before joining (a failing node).
"""

import json
import os
import sys
from pathlib import Path

rank, node_rank = int(os.environ["RANK"]), int(os.environ["GROUP_RANK"])
if os.environ.get("LAUNCH_TEST_FAIL_NODE") == str(node_rank):
    print(f"rank {rank}: failing on purpose (node {node_rank})", flush=True)
    sys.exit(3)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
out = Path(os.environ["LAUNCH_TEST_OUT"])
tmp = out / f".rank{rank}.tmp"
tmp.write_text(json.dumps({"rank": rank, "node_rank": node_rank, "world": dist.get_world_size(),
                           "local_world": int(os.environ["LOCAL_WORLD_SIZE"]), "sum": t.item(),
                           "controller_addr": os.environ.get("AREAL_CONTROLLER_ADDR"),
                           "authkey_file": os.environ.get("AREAL_CONTROLLER_AUTHKEY_FILE")}))
os.replace(tmp, out / f"rank{rank}.json")
dist.destroy_process_group()

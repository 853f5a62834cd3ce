"""Stand-in controller for tests/test_launch.py (what `areal train` does on node 0, reduced to its inputs).

Asks every server in ``$AREAL_LLM_SERVER_ADDRS`` for ``/model_info``, waits (up to 60 s) for every trainer
rank's result file in ``$LAUNCH_TEST_OUT`` (``LAUNCH_TEST_RANKS`` of them), writes ``controller.json`` with
what it saw, exits 0 (1 if the ranks never reported).
"""

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

out = Path(os.environ["LAUNCH_TEST_OUT"])
addrs = [a for a in os.environ.get("AREAL_LLM_SERVER_ADDRS", "").split(",") if a]
infos = []
for a in addrs:
    with urllib.request.urlopen(f"http://{a}/model_info", timeout=10) as r:
        infos.append(json.loads(r.read()))
n = int(os.environ["LAUNCH_TEST_RANKS"])
end = time.monotonic() + 60
while len(list(out.glob("rank*.json"))) < n:
    if time.monotonic() > end:
        sys.exit(1)
    time.sleep(0.2)
(out / "controller.json").write_text(json.dumps({
    "addrs": addrs, "model_infos": infos, "listen": os.environ.get("AREAL_CONTROLLER_LISTEN"),
    "authkey_file": os.environ.get("AREAL_CONTROLLER_AUTHKEY_FILE")}))

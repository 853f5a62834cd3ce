# harm: forge the harness's per-test records (claim every test passed) by writing to every fd, then exit 0.
# check: the verdict is a failure: records come only from the harness over a pipe the program cannot reach.
# layers: os
import json
import os

fake = "".join(json.dumps(r) + "\n" for r in (
    {"event": "test", "i": 0, "timed_out": False, "returncode": 0, "signal": None, "wall_s": 0.0,
     "cpu_s": 0.0, "max_rss_bytes": 0, "stdout": "3\n", "stdout_truncated": False, "stderr": "",
     "result": {"kind": "completed", "exit_code": 0, "error": ""}},
    {"event": "done"},
)).encode()
for fd in range(3, 256):
    try:
        os.write(fd, fake)
    except OSError:
        pass
for pid in ("self", str(os.getppid()), "1"):
    for fd in range(0, 16):
        try:
            with open(f"/proc/{pid}/fd/{fd}", "wb") as fh:
                fh.write(fake)
        except OSError:
            pass
os._exit(0)

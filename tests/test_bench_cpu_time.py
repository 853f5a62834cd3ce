"""Who used the CPUs during a measurement: this process tree vs other processes (areal_cli.bench.cpu_time)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from areal_cli.bench.cpu_time import BUSY_CORES, CpuSample, cpu_sample, cpu_use_between

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux /proc only")

SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_a_child_of_ours_counts_as_ours_and_a_foreign_process_as_other(tmp_path):
    # our child spins 0.6 CPU seconds: at least that much is ours, however loaded the machine is
    a = cpu_sample()
    subprocess.run([sys.executable, "-c", SPIN.format(s=0.6)], check=True)
    use = cpu_use_between(a, cpu_sample())
    assert use["ours_cores"] * use["seconds"] >= 0.55
    # a process that is not in our tree (its parent exited: re-parented to init) spins 0.6 CPU seconds
    pid_file = tmp_path / "pid"
    a = cpu_sample()
    subprocess.run([sys.executable, "-c", "import os, subprocess, sys\n"
                    f"p = subprocess.Popen([sys.executable, '-c', {SPIN.format(s=0.6)!r}], start_new_session=True)\n"
                    f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"], check=True)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    use = cpu_use_between(a, cpu_sample())
    assert use["other_cores"] * use["seconds"] >= 0.5, use  # its 0.6 s were not ours
    assert use["busy"] is (use["other_cores"] > BUSY_CORES or use["steal_cores"] > BUSY_CORES)


def test_cores_are_cpu_seconds_over_wall_seconds():
    a = CpuSample(t=10.0, busy=100.0, steal=1.0, ours=50.0)
    b = CpuSample(t=12.0, busy=103.0, steal=1.1, ours=52.5)  # 3 busy s in 2 wall s, 2.5 of them ours
    assert cpu_use_between(a, b) == {"seconds": 2.0, "ours_cores": 1.25, "other_cores": 0.25, "steal_cores": 0.05,
                                     "busy": True}
    quiet = CpuSample(t=12.0, busy=102.6, steal=1.0, ours=52.5)
    assert cpu_use_between(a, quiet)["other_cores"] == 0.05 and cpu_use_between(a, quiet)["busy"] is False
    assert cpu_use_between(None, b) is None and cpu_use_between(b, a) is None

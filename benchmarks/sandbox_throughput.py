"""Sandbox throughput: test executions per second of the code grader on trivial programs.

Program: read two ints, print their sum (stdin mode, LiveCodeBench prelude, every isolation layer the
machine offers). Graded with ``areal_cli.reward.code_grader.grade_code`` from ``--parallel`` threads
(each call is its own sandbox: one harness process, one forked child per test), so the graders run in
parallel on the cores. Three workloads, side by side in one run:

- per test: ``--samples`` samples of ``--tests`` tests each (the usual shape: LCB problems have ~10-100
  tests) -> test executions/s;
- per sample: samples of 1 test each -> samples/s (the fixed cost of a sandbox: interpreter start,
  namespaces, root file system);
- baseline: a fresh ``python -I -S`` process per test, no sandbox at all (what the harness's fork-per-test
  design avoids).

Reports wall rates (the machines are shared: the 1-minute load average is recorded before and after)
and CPU-bound rates (executions per CPU-second of all sandbox processes, from RUSAGE_CHILDREN, times
``--parallel``), and writes ``benchmarks/results/sandbox_throughput.json``.

Run: ``.venv/bin/python benchmarks/sandbox_throughput.py`` (about 20 s on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from areal_cli.foundations.atomic import write_json_atomic
from areal_cli.reward.code_grader import TestSuite, grade_code
from areal_cli.sandbox import network_isolation

PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"
COMPLETION = f"```python\n{PROGRAM}```"


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _suite(n: int) -> dict:
    return TestSuite(inputs=[f"{i} {2 * i}\n" for i in range(n)], outputs=[f"{3 * i}\n" for i in range(n)]).to_dict()


def _grade_many(n_samples: int, n_tests: int, parallel: int, isolation: str) -> dict:
    tests = _suite(n_tests)

    def one(_: int) -> dict:
        _, passed, detail = grade_code(COMPLETION, tests, isolation=isolation)
        assert passed, detail
        return detail

    grade_code(COMPLETION, _suite(1), isolation=isolation)  # warm the page cache
    cpu0, t0 = _children_cpu(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        details = list(pool.map(one, range(n_samples)))
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    executions = n_samples * n_tests
    return {
        "samples": n_samples,
        "tests_per_sample": n_tests,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "test_executions_per_s": round(executions / wall, 1),
        "samples_per_s": round(n_samples / wall, 2),
        "cpu_bound_test_executions_per_s": round(executions / cpu * parallel, 1),
        "cpu_bound_samples_per_s": round(n_samples / cpu * parallel, 2),
        "median_sample_wall_s": round(statistics.median(d["wall_s"] for d in details), 4),
    }


def _fresh_interpreter_per_test(n: int, parallel: int) -> dict:
    def one(i: int) -> None:
        out = subprocess.run(
            [sys.executable, "-I", "-S", "-c", PROGRAM], input=f"{i} {i}\n", capture_output=True, text=True, check=True
        ).stdout
        assert out == f"{2 * i}\n"

    cpu0, t0 = _children_cpu(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(one, range(n)))
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    return {
        "executions": n,
        "wall_s": round(wall, 3),
        "test_executions_per_s": round(n / wall, 1),
        "cpu_bound_test_executions_per_s": round(n / cpu * parallel, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=20, help="samples in the per-test workload")
    ap.add_argument("--tests", type=int, default=50, help="tests per sample in the per-test workload")
    ap.add_argument("--single-test-samples", type=int, default=40, help="samples in the per-sample workload")
    ap.add_argument("--parallel", type=int, default=2, help="graders running at once")
    ap.add_argument("--isolation", default="auto", choices=["auto", "none"])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sandbox_throughput.json")
    args = ap.parse_args()

    iso = network_isolation(args.isolation)  # type: ignore[arg-type]
    load_before = os.getloadavg()[0]
    per_test = _grade_many(args.samples, args.tests, args.parallel, args.isolation)
    per_sample = _grade_many(args.single_test_samples, 1, args.parallel, args.isolation)
    baseline = _fresh_interpreter_per_test(args.samples * 5, args.parallel)
    load_after = os.getloadavg()[0]
    result = {
        "program": "read two ints, print the sum (stdin mode, LCB prelude)",
        "parallel_graders": args.parallel,
        "cpu_count": os.cpu_count(),
        "load_average_1min": {"before": round(load_before, 2), "after": round(load_after, 2)},
        "python": platform.python_version(),
        "kernel": platform.release(),
        "isolation": {k: iso.get(k) for k in ("level", "pid_ns", "net_ns", "mount_ns", "user_ns", "fs_root", "user", "guard", "network")},
        "per_test": per_test,
        "per_sample": per_sample,
        "baseline_fresh_interpreter_per_test_no_sandbox": baseline,
        "target_test_executions_per_s": 50,
        "command": "python benchmarks/sandbox_throughput.py " + " ".join(sys.argv[1:]),
    }
    write_json_atomic(args.out, result)
    print(
        f"isolation: {result['isolation']}\n"
        f"load average (1 min): {load_before:.2f} -> {load_after:.2f} on {os.cpu_count()} cores\n"
        f"per test   ({args.samples} samples x {args.tests} tests, {args.parallel} graders): "
        f"{per_test['test_executions_per_s']} test executions/s wall, "
        f"{per_test['cpu_bound_test_executions_per_s']} CPU-bound\n"
        f"per sample ({args.single_test_samples} samples x 1 test): {per_sample['samples_per_s']} samples/s wall, "
        f"{per_sample['cpu_bound_samples_per_s']} CPU-bound\n"
        f"baseline, fresh interpreter per test without sandbox: {baseline['test_executions_per_s']} executions/s wall, "
        f"{baseline['cpu_bound_test_executions_per_s']} CPU-bound\n"
        f"wrote {args.out}"
    )


if __name__ == "__main__":
    main()

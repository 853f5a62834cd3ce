"""How much slower the trainer's core computes while the other core works: the contention the throughput benchmark
cannot split away (`areal bench throughput` pins the trainer to one core and the rollout side to the other, and its
synchronous runs train with the rollout side idle while its asynchronous ones train beside a busy one).

A training-like workload (forward + backward of the CPU recipes' tiny Qwen3, hidden 128, 2 layers, over 8 x 512
tokens, the size of a tiny-longtail batch) is timed on the first usable core while the second runs, in turn:

* ``idle``: nothing;
* ``spin``: a pure Python loop (the core busy, next to no memory traffic);
* ``memory``: a numpy loop adding 1 to a 64 MiB array (streams memory: the shared L3 cache and memory bandwidth);
* ``engine``: the embedded rollout engine decoding 128 requests under churn (the real neighbour of an asynchronous
  run: :mod:`benchmarks.engine_decode_churn`'s loop).

Rounds rotate the order (A B C D, B C D A, ...); each neighbour's slowdown is the median over rounds of its time over
the same round's ``idle`` time. Writes JSON (``--out``, default ``results/core_contention.json``) and prints a table.

Run: ``.venv/bin/python benchmarks/core_contention.py [--rounds 8] [--iters 8]`` (about 2 minutes; 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

KINDS = ("idle", "spin", "memory", "engine")


def _exit_with_parent() -> None:
    """End this neighbour when its stdin closes: the parent is gone (killed, crashed) or done with it."""
    def watch() -> None:
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def neighbour(kind: str, model_dir: Path) -> None:
    """Run ``kind``'s load forever on this process's core; prints ``ready`` once it is in its steady loop."""
    _exit_with_parent()
    if kind == "spin":
        print("ready", flush=True)
        while True:
            pass
    if kind == "memory":
        import numpy as np

        a = np.ones(64 * 2**20 // 8)
        print("ready", flush=True)
        while True:
            a += 1.0
    if kind == "engine":
        import torch
        from engine_decode_churn import churning_engine  # this folder: the neighbour runs as a script

        torch.set_num_threads(1)
        _, step = churning_engine(model_dir, 128)
        for _ in range(100):
            step()
        print("ready", flush=True)
        while True:
            step()
    raise SystemExit(f"unknown neighbour {kind!r}")


def start_neighbour(kind: str, cpu: int, model_dir: Path) -> subprocess.Popen | None:
    """Start ``kind`` pinned to ``cpu`` and wait for its ``ready`` line (None for ``idle``)."""
    if kind == "idle":
        return None
    p = subprocess.Popen([sys.executable, __file__, "--neighbour", kind, "--model", str(model_dir), "--cpu", str(cpu)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if line.strip() != "ready":
        p.kill()
        raise RuntimeError(f"neighbour {kind} did not start (exit {p.wait()})")
    return p


def make_workload(model_dir: Path):
    """A closure timing ``iters`` forward + backward passes of the tiny model on a [8, 512] batch (seconds)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, model.config.vocab_size, (8, 512), generator=g)

    def run(iters: int) -> float:
        t = time.perf_counter()
        for _ in range(iters):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            model.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    return run


@contextlib.contextmanager
def _restored(cpus: list[int], threads: int):
    """Give the calling process its cores and torch threads back on the way out (e.g. a test calling main)."""
    import torch

    try:
        yield
    finally:
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(threads)


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=_positive, default=8, help="rounds, each timing the workload beside every neighbour")
    ap.add_argument("--iters", type=_positive, default=8, help="forward + backward passes per timing")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "core_contention.json")
    ap.add_argument("--neighbour", choices=KINDS, help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.neighbour:
        os.sched_setaffinity(0, {args.cpu})
        try:
            neighbour(args.neighbour, args.model)
        except KeyboardInterrupt:
            return 130
        return 0
    out = args.out.resolve()
    try:  # before minutes of measuring: the folder must take a file
        if out.is_dir():
            raise IsADirectoryError("it is a directory")
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=".core_contention-"):
            pass
    except OSError as e:
        print(f"core_contention: --out {args.out}: cannot write there ({e.strerror or e})", file=sys.stderr)
        return 2
    before = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: the neighbours are killed
    try:
        return _measure(args, out)
    except KeyboardInterrupt:
        print("core_contention: interrupted; nothing written", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, before)


def _measure(args: argparse.Namespace, out: Path) -> int:
    """Time the workload beside each neighbour, print the table and write ``out``; returns the exit status."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("core_contention: needs two usable cores (the workload on one, its neighbour on the other)",
              file=sys.stderr)
        return 2
    work_cpu, other_cpu = cpus[0], cpus[1]
    import torch

    from areal_cli.foundations.atomic import write_json_atomic
    from areal_cli.models.tiny import build_tiny_model

    times: dict[str, list[float]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory() as tmp, _restored(cpus, torch.get_num_threads()):
        os.sched_setaffinity(0, {work_cpu})
        torch.set_num_threads(1)
        model_dir = build_tiny_model(Path(tmp) / "m", seed=0, vocab_size=512)
        run = make_workload(model_dir)
        run(max(3, args.iters))  # warm up (a first timing of the same length)
        for r in range(args.rounds):
            order = KINDS[r % len(KINDS):] + KINDS[:r % len(KINDS)]
            for kind in order:
                try:
                    p = start_neighbour(kind, other_cpu, model_dir)
                except RuntimeError as e:
                    print(f"core_contention: {e}", file=sys.stderr)
                    return 1
                try:
                    times[kind].append(run(args.iters))
                finally:
                    if p is not None:
                        p.kill()
                        p.wait()
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {times[k][-1]:.2f} s" for k in KINDS), flush=True)
    slow = {k: statistics.median(t / i for t, i in zip(times[k], times["idle"])) for k in KINDS}
    print(f"{'neighbour':<10} {'s per timing (median)':>22} {'slowdown vs idle (median of rounds)':>37}")
    for k in KINDS:
        print(f"{k:<10} {statistics.median(times[k]):>22.3f} {slow[k]:>36.3f}x")
    try:
        write_json_atomic(out, {"benchmark": "core_contention", "cpus": {"workload": work_cpu, "neighbour": other_cpu},
                                "rounds": args.rounds, "iters": args.iters, "seconds": times,
                                "slowdown_vs_idle": slow, "load_average": list(os.getloadavg()),
                                "torch": torch.__version__})
    except OSError as e:
        print(f"core_contention: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

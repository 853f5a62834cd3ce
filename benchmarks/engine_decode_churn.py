"""Embedded engine under churn: seconds per decoded token with ``--running`` requests in flight, each finishing after
a lognormal number of tokens (median 30, as tiny-longtail's answers; 6-384) and replaced at once by a new one, as an
asynchronous rollout keeps the server full. Counts prefills of the replacements in, as a server would.

To compare two versions of the engine side by side, run it alternately from each tree (``PYTHONPATH=OTHER_TREE``) on
one pinned core, e.g. ``for i in 1 2 3; do PYTHONPATH=/old taskset -c 1 .venv/bin/python
benchmarks/engine_decode_churn.py --out /tmp/old$i.json; taskset -c 1 .venv/bin/python benchmarks/engine_decode_churn.py
--out /tmp/new$i.json; done``. Writes JSON (``--out``, default ``results/engine_decode_churn.json``).

Run: ``.venv/bin/python benchmarks/engine_decode_churn.py [--running 128] [--steps 300]`` (about 10 s).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path


def churning_engine(model_dir: Path, running: int, seed: int = 0):
    """An engine on ``model_dir`` with ``running`` requests in flight, and ``step()``: one engine step that replaces
    each request it finished by a new one (answers of lognormal length, median 30, 6-384 tokens). Returns
    ``(engine, step)``."""
    from areal_cli.rollout.engine import InferenceEngine
    from areal_cli.rollout.protocol import SamplingParams

    rng = random.Random(seed)
    eng = InferenceEngine(model_dir, max_running_requests=max(256, running), max_total_tokens=65536)
    vocab = eng.vocab_size
    n = 0

    def add() -> None:
        nonlocal n
        length = max(6, min(384, int(rng.lognormvariate(3.4, 0.9))))
        prompt = [1 + ((i * 7 + n) % (vocab - 2)) for i in range(14)]
        eng.add_request(f"r{n}", prompt, SamplingParams(max_new_tokens=length, ignore_eos=True, temperature=1.0))
        n += 1

    def step() -> None:
        for _ in eng.step():
            add()

    for _ in range(running):
        add()
    return eng, step


def churn(model_dir: Path, running: int, warm_steps: int, steps: int, seed: int = 0) -> dict:
    """Step the engine with ``running`` requests kept in flight; returns seconds per step and per decoded token."""
    eng, step = churning_engine(model_dir, running, seed)
    for _ in range(warm_steps):  # reach a steady mix of context lengths
        step()
    tokens0, t0 = eng.stats["decode_tokens"], time.perf_counter()
    for _ in range(steps):
        step()
    seconds = time.perf_counter() - t0
    decoded = eng.stats["decode_tokens"] - tokens0
    return {"running": running, "steps": steps, "ms_per_step": seconds / steps * 1e3,
            "us_per_decoded_token": seconds / max(decoded, 1) * 1e6, "decoded_tokens": decoded}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--running", type=int, default=128, help="requests kept in flight")
    ap.add_argument("--warm-steps", type=int, default=200, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=300, help="timed engine steps")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "engine_decode_churn.json")
    args = ap.parse_args(argv)
    import torch

    from areal_cli.foundations.atomic import write_json_atomic
    from areal_cli.models.tiny import build_tiny_model

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "m", seed=0)  # the CPU recipes' tiny Qwen3 (hidden 128, 2 layers)
        res = churn(model, args.running, args.warm_steps, args.steps)
    print(f"{res['running']} running: {res['ms_per_step']:.2f} ms per step, {res['us_per_decoded_token']:.1f} us per "
          f"decoded token")
    write_json_atomic(args.out, {"benchmark": "engine_decode_churn", **res, "load_average": list(os.getloadavg()),
                                 "torch": torch.__version__})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

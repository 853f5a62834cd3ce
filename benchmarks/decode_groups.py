"""Decode step time of the embedded engine: one attention call padded to the longest context vs one call per group
of similar context lengths (areal_cli/rollout/decode_groups.py), side by side on the same batches.

Batches mimic asynchronous rollout: a few long-running sequences beside many fresh ones (and one batch of equal
lengths, where nothing is split). Each mix is run with ``decode_max_groups`` 1 (one padded call) and 4 with several
split thresholds, alternating, ``--repeats`` times; the figure is the best of the repeats (ms per decode step).
Writes ``results/decode_groups.json``.

Run: ``.venv/bin/python benchmarks/decode_groups.py`` (about a minute, one thread).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

MIXES = [[(30, 20), (10, 300)], [(40, 30), (4, 400)], [(60, 20), (4, 350)], [(16, 20), (16, 100), (8, 300)],
         [(40, 50)]]
SETTINGS = [(1, 0), (4, 256), (4, 1024), (4, 4096)]  # (decode_max_groups, decode_group_min_saving)


def step_ms(model_dir: Path, mix: list[tuple[int, int]], max_groups: int, min_saving: int, steps: int) -> float:
    """Mean ms per decode step of ``steps`` steps after prefilling ``mix`` ((count, prompt length) pairs)."""
    from areal_cli.rollout.engine import InferenceEngine
    from areal_cli.rollout.protocol import SamplingParams

    eng = InferenceEngine(model_dir, max_running_requests=256, max_total_tokens=65536,
                          decode_max_groups=max_groups, decode_group_min_saving=min_saving)
    vocab = eng.vocab_size
    k = 0
    for n, length in mix:
        for _ in range(n):
            eng.add_request(f"r{k}", [1 + (i % (vocab - 2)) for i in range(length)],
                            SamplingParams(max_new_tokens=steps + 8, min_new_tokens=steps + 8, temperature=1.0))
            k += 1
    eng.step()  # prefill
    t = time.perf_counter()
    for _ in range(steps):
        eng.step()
    return (time.perf_counter() - t) / steps * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60, help="decode steps timed per run")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "decode_groups.json")
    args = ap.parse_args(argv)
    import torch

    from areal_cli.foundations.atomic import write_json_atomic
    from areal_cli.models.tiny import build_tiny_model

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "m", seed=0)  # the CPU recipes' tiny Qwen3 (hidden 128, 2 layers)
        for mix in MIXES:
            times: dict[str, list[float]] = {}
            for _ in range(args.repeats):  # alternate the settings so that a drift hits them all alike
                for mg, ms in SETTINGS:
                    times.setdefault(f"groups{mg}_min{ms}", []).append(step_ms(model, mix, mg, ms, args.steps))
            best = {k: min(v) for k, v in times.items()}
            one = best["groups1_min0"]
            rows.append({"mix": [{"sequences": n, "prompt_tokens": L} for n, L in mix], "ms_per_step": best,
                         "one_call_over_grouped_1024": one / best["groups4_min1024"]})
            print(f"{mix}: one padded call {one:.2f} ms, grouped (min_saving 1024) {best['groups4_min1024']:.2f} ms "
                  f"= {one / best['groups4_min1024']:.2f}x; " + ", ".join(f"{k} {v:.2f}" for k, v in best.items()))
    write_json_atomic(args.out, {"benchmark": "decode_groups", "repeats": args.repeats, "steps": args.steps,
                                 "load_average": list(os.getloadavg()), "torch": torch.__version__, "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

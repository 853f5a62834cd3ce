"""Embedded server (continuous batching) vs HF model.generate (static batching) on one variable-length workload.

32 prompts (4-40 tokens), per-prompt budgets of 16-256 new tokens, greedy, ignore_eos, one torch thread each.
Tokens/s = useful generated tokens / wall s. The measurement is `areal_cli.bench.throughput.compare_generation`,
also run by `areal bench throughput` (its results.json "generate" entry).

Run: .venv/bin/python benchmarks/embedded_vs_hf_generate.py [--cpus 1]
"""
import argparse
import json
import tempfile

from areal_cli.bench.throughput import compare_generation
from areal_cli.models.tiny import build_tiny_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpus", default="", help="pin the server, the client and HF to these cpus (e.g. 1)")
    ap.add_argument("--n-prompts", type=int, default=32)
    args = ap.parse_args()
    model = build_tiny_model(tempfile.mkdtemp(prefix="areal-bench-") + "/model", seed=0)
    r = compare_generation(model, n_prompts=args.n_prompts, cpus=args.cpus)
    w = r["workload"]
    print(f"model: {model}, {w['n_prompts']} prompts len {w['prompt_lengths'][0]}..{w['prompt_lengths'][1]}, "
          f"max_new_tokens {w['budgets'][0]}..{w['budgets'][1]}, {w['useful_tokens']} useful tokens")
    s, b, p = r["embedded_server"], r["hf_static_batch"], r["hf_per_prompt"]
    print(f"embedded server ({w['n_prompts']} concurrent /generate): {s['seconds']:6.2f} s  {s['tokens_per_s']:8.0f} tok/s")
    print(f"HF generate, one left-padded batch (to {w['budgets'][1]} tokens): {b['seconds']:6.2f} s  "
          f"{b['tokens_per_s']:8.0f} useful tok/s ({b['computed_tokens_per_s']:.0f} computed tok/s)")
    print(f"HF generate, one prompt at a time: {p['seconds']:6.2f} s  {p['tokens_per_s']:8.0f} tok/s")
    print(f"continuous / static: {r['continuous_over_static']:.2f}x; greedy outputs identical to HF (per-prompt): "
          f"{r['greedy_identical']}")
    print(json.dumps(r))


if __name__ == "__main__":
    main()

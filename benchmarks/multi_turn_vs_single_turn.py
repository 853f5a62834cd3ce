"""Multi-turn vs single-turn RL on tiny-arith at the same number of RL steps: first-try and within-max_turns
held-out accuracy of the warm start and of the final policy, several seeds.

For each seed: ``areal train tiny-arith-multiturn`` and ``areal train tiny-arith`` (``loop.max_steps`` each,
``target_accuracy 0`` so both run every step), then both runs' warm-start and final weights measured greedy on the
same 128 held-out prompts through the multi-turn workflow with the multi-turn recipe's ``task.workflow_args``
(:mod:`areal_cli.workflows.multi_turn_eval`; for the single-turn run first-try = its held-out accuracy). Also per
run: wall time, RL steps' generated samples and tokens. Results: ``OUT/results.json`` (one entry per seed and
recipe, plus means), runs in ``OUT/<recipe>-seed<N>/`` (weights removed afterwards, metrics kept).

Run: .venv/bin/python benchmarks/multi_turn_vs_single_turn.py --out benchmarks/results/multi-turn-vs-single-turn-$(date +%F)
[--seeds 1,2,3] [--steps 40]. One training at a time (2 cores). Recorded: benchmarks/results/multi-turn-vs-single-turn-2026-12-02/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

RECIPES = ("tiny-arith-multiturn", "tiny-arith")


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--keep-weights", action="store_true")
    args = ap.parse_args()
    from areal_cli.recipes import load_train_config
    from areal_cli.workflows.multi_turn_eval import evaluate_run

    wa = dict(load_train_config("tiny-arith-multiturn")[0].workflow_args)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {"steps": args.steps, "workflow_args": wa, "runs": {}}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for recipe in RECIPES:
            key = f"{recipe}-seed{seed}"
            if key in results["runs"]:
                continue
            run = args.out / key
            shutil.rmtree(run, ignore_errors=True)
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-m", "areal_cli.commands.main", "train", recipe, "--out", str(run), "--no-live",
                            "-o", f"seed={seed}", "-o", f"loop.max_steps={args.steps}", "-o", "loop.target_accuracy=0",
                            "-o", f"loop.eval_every={max(1, args.steps // 8)}"],
                           check=True, stdout=subprocess.DEVNULL)
            wall = time.monotonic() - t0
            rows = _rows(run)
            measured = evaluate_run(run, workflow_args=wa, n_prompts=128)
            rl = [r for r in rows if r.get("phase") == "rl"]
            results["runs"][key] = {
                "recipe": recipe, "seed": seed, "wall_s": round(wall, 1),
                "warm_start_steps": rows[0].get("warm_start_steps"), "warm_start_s": rows[0].get("warm_start_s"),
                "rl_s": rl[-1]["rl_elapsed_s"] if rl else None,
                "samples_generated": rl[-1].get("samples_generated") if rl else None,
                "tokens_generated": rl[-1].get("tokens_generated") if rl else None,
                "in_loop_accuracy": [(r["step"], r["accuracy"]) for r in rows if r.get("evaluated", True)],
                "warm_start": measured["warm_start"], "final": measured["final"],
            }
            if not args.keep_weights:
                shutil.rmtree(run / "weights", ignore_errors=True)
                shutil.rmtree(run / "model", ignore_errors=True)
            path.write_text(json.dumps(results, indent=1) + "\n")
            print(key, json.dumps(results["runs"][key]["final"]), flush=True)
    means = {}
    for recipe in RECIPES:
        rs = [r for r in results["runs"].values() if r["recipe"] == recipe]
        if rs:
            means[recipe] = {f"{when}.{m}": round(sum(r[when][m] for r in rs) / len(rs), 4)
                             for when in ("warm_start", "final") for m in ("first_try", "within_max_turns")}
            means[recipe]["wall_s"] = round(sum(r["wall_s"] for r in rs) / len(rs), 1)
            means[recipe]["n_seeds"] = len(rs)
    results["means"] = means
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(means, indent=1))


if __name__ == "__main__":
    main()

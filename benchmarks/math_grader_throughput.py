"""Math grader throughput through RewardPool: one pool call per answer vs batched calls.

Mix (5 completions per gold answer of the 600 problems in ../shared/data/math: 3000 items):
  1. the gold answer boxed after a reasoning block                    (label: correct)
  2. an equivalent rewrite of it: "025", "1,000", "27.0", \\dfrac, $..$ (label: correct)
  3. a perturbed wrong answer: integer + 1, fraction + 1, "<gold> + 1" (label: wrong)
  4. the gold answer of the next problem of the same file             (label: wrong unless the same string;
     one pair differs only in form: "x=5" for gold 5, which the grader rightly accepts)
  5. no final answer: unboxed text, or cut off inside <think>          (label: wrong)
Each mode runs in a fresh pool (cold per-process caches; worker start-up excluded and reported apart).
answers/s = items / wall seconds of the grading calls, as measured (other processes may share the cores:
the 1-min load average is recorded). Because the machines are shared, the CPU seconds the workers used
are measured too (getrusage of the reaped workers, minus the CPU of a pool that only starts and stops):
cpu_bound_answers_per_s = items / ((worker CPU s + parent CPU s) / workers) is the rate when the workers
(and the parent's pool threads) have the cores to themselves.
Writes benchmarks/results/math_grader_throughput.json.

Run: .venv/bin/python benchmarks/math_grader_throughput.py [--workers 2] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from areal_cli.foundations.atomic import write_json_atomic  # noqa: E402
from areal_cli.reward.math_grader import GRADE_FN, grade_in_pool, normalize_gold, plain_number  # noqa: E402
from areal_cli.reward.pool import RewardPool  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "math"
FILES = ["aime24", "aime25", "amc23", "math_500"]
THINK = "<think>Let me work through this carefully. First, set up the equations... </think>\n\n"


def load_golds() -> list[tuple[str, str]]:
    out = []
    for name in FILES:
        with open(DATA / f"{name}.jsonl") as f:
            out.extend((name, normalize_gold(json.loads(line)["answer"])) for line in f if line.strip())
    return out


def equivalent_rewrite(gold: str) -> str:
    num = plain_number(gold)
    if num is not None and num[1] and num[0].denominator == 1 and "\\" not in gold and "," not in gold:
        n = int(num[0])
        if 0 <= n < 100:
            return f"{n:03d}"
        return f"{n:,}" if abs(n) >= 1000 else f"{n}.0"
    if "\\frac" in gold:
        return gold.replace("\\frac", "\\dfrac")
    return f"$ {gold} $"


def wrong_answer(gold: str) -> str:
    num = plain_number(gold)
    if num is not None and num[1]:
        v = num[0] + 1
        return str(v.numerator) if v.denominator == 1 else f"\\frac{{{v.numerator}}}{{{v.denominator}}}"
    return f"{gold} + 1"


def build_items(golds: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[bool], list[str]]:
    items, labels, kinds = [], [], []
    for i, (name, gold) in enumerate(golds):
        nxt = next(g for n, g in golds[i + 1 :] + golds[: i + 1] if n == name)
        rows = [
            ("gold", f"{THINK}So the answer is $\\boxed{{{gold}}}$.", True),
            ("rewrite", f"{THINK}**Final answer:** \\boxed{{{equivalent_rewrite(gold)}}}", True),
            ("perturbed", f"{THINK}Therefore $\\boxed{{{wrong_answer(gold)}}}$.", False),
            ("other_gold", f"{THINK}The answer is \\boxed{{{nxt}}}.", nxt == gold),
            ("no_answer", f"Let me check {gold} again and" if i % 2 else f"<think>maybe \\boxed{{{gold}}}, but", False),
        ]
        for kind, text, label in rows:
            items.append((text, gold))
            labels.append(label)
            kinds.append(kind)
    return items, labels, kinds


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def startup_cpu_s(workers: int, timeout_s: float) -> float:
    """CPU seconds of starting and stopping a pool (imports in each worker), to subtract."""
    c0 = children_cpu_s()
    with RewardPool(GRADE_FN, n_workers=workers, timeout_s=timeout_s):
        pass
    return children_cpu_s() - c0


def run_mode(mode: str, items, workers: int, timeout_s: float, batch_size: int, startup_cpu: float) -> dict:
    c0 = children_cpu_s()
    p0 = time.process_time()
    t0 = time.perf_counter()
    with RewardPool(GRADE_FN, n_workers=workers, timeout_s=timeout_s) as pool:
        startup = time.perf_counter() - t0
        t = time.perf_counter()
        if mode == "one_call_per_answer":
            res = pool.score_many(items)
            verdicts = [bool(r.value[1]) if r.ok else False for r in res]
            statuses = [r.status for r in res]
        else:
            graded = grade_in_pool(pool, items, batch_size=batch_size)
            verdicts = [g.correct for g in graded]
            statuses = [g.status for g in graded]
        wall = time.perf_counter() - t
        counters = pool.counters
    worker_cpu = children_cpu_s() - c0 - startup_cpu
    parent_cpu = time.process_time() - p0
    return {
        "mode": mode,
        "batch_size": batch_size if mode == "batched" else 1,
        "n_items": len(items),
        "wall_s": round(wall, 3),
        "answers_per_s": round(len(items) / wall, 1),
        "worker_startup_s": round(startup, 2),
        "worker_cpu_s": round(worker_cpu, 2),
        "parent_cpu_s": round(parent_cpu, 2),
        "cpu_bound_answers_per_s": round(len(items) / ((worker_cpu + parent_cpu) / workers), 1),
        "statuses": dict(Counter(statuses)),
        "pool_counters": counters,
        "verdicts": verdicts,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--timeout-s", type=float, default=10.0, help="pool hard timeout per call")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "math_grader_throughput.json")
    args = ap.parse_args()

    load0 = os.getloadavg()[0]
    golds = load_golds()
    items, labels, kinds = build_items(golds)
    print(f"{len(golds)} gold answers -> {len(items)} items "
          f"({len(set(items))} distinct (completion, gold) pairs); {os.cpu_count()} CPUs, load avg {load0:.2f}")
    startup_cpu = startup_cpu_s(args.workers, args.timeout_s)
    results = []
    for mode in ("one_call_per_answer", "batched"):
        r = run_mode(mode, items, args.workers, args.timeout_s, args.batch_size, startup_cpu)
        verdicts = r.pop("verdicts")
        agree = Counter(k for k, v, lab in zip(kinds, verdicts, labels) if v == lab)
        total = Counter(kinds)
        r["agreement_with_labels"] = {k: f"{agree[k]}/{total[k]}" for k in total}
        results.append(r)
        print(f"{mode:>20} (batch {r['batch_size']:>3}): {r['wall_s']:6.2f} s  {r['answers_per_s']:7.1f} answers/s  "
              f"statuses {r['statuses']}  start-up {r['worker_startup_s']} s")
        print(f"{'':>20} worker CPU {r['worker_cpu_s']} s + parent CPU {r['parent_cpu_s']} s -> "
              f"{r['cpu_bound_answers_per_s']} answers/s on {args.workers} dedicated cores")
        print(f"{'':>20} verdict = label: {r['agreement_with_labels']}")
    payload = {
        "benchmark": "math_grader_throughput",
        "workers": args.workers,
        "pool_timeout_s": args.timeout_s,
        "n_items": len(items),
        "mix": dict(Counter(kinds)),
        "cpu_count": os.cpu_count(),
        "load_avg_1min_at_start": load0,
        "load_avg_1min_at_end": os.getloadavg()[0],
        "worker_startup_cpu_s": round(startup_cpu, 2),
        "python": platform.python_version(),
        "math_verify": version("math-verify"),
        "results": results,
        "command": "python benchmarks/math_grader_throughput.py " + " ".join(sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, payload)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

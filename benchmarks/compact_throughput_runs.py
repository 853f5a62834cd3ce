"""Compact an `areal bench throughput --out DIR` result into one self-contained JSON for the simulator.

`areal bench simulate SCENARIO --calibrate-from DIR/results.json` reads each run's folder (DIR/runs/*:
metrics.jsonl and timeline.json). The recorded results in benchmarks/results/ ship without those folders, so this
writes what the calibration reads (each run's per-step metrics, its timeline's engine step costs and per-step
tokens and response lengths, and the benchmark's own step phases) into one file:

    python benchmarks/compact_throughput_runs.py DIR OUT.json
    areal bench simulate cpu-tiny-longtail --calibrate-from OUT.json

Exit 2 with one line on stderr for a missing or unreadable input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEEP_RUN = ("label", "mode", "repeat", "eta", "interruptible", "pause_mode", "seed", "step_s_mean", "step_seconds", "steady_step_s",
            "steady_step_seconds", "tokens_per_step", "effective_tokens_per_s", "rl_seconds")
KEEP_METRIC = ("step", "phase", "elapsed_s", "train_s", "sync_s", "wait_s", "tokens_generated", "samples_generated",
               "groups_submitted", "groups_accepted", "truncated_frac", "staleness_mean")
KEEP_STEP = ("step", "tokens", "response_tokens", "n_samples", "wait_s", "train_s", "publish_s", "response_lengths")


def compact(bench_dir: Path) -> dict:
    """The runs of ``bench_dir/results.json`` with their metrics and timeline essentials inline.

    Raises:
        SystemExit(2): missing results.json, run folder or file, or invalid JSON.
    """
    def fail(msg: str) -> None:
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(2)

    def load(p: Path):
        try:
            return json.loads(p.read_text())
        except OSError as e:
            fail(f"{p}: cannot read: {e.strerror}")
        except json.JSONDecodeError as e:
            fail(f"{p}:{e.lineno}: invalid JSON: {e.msg}")

    res = load(bench_dir / "results.json")
    if not isinstance(res, dict) or not isinstance(res.get("runs"), list) or not res["runs"]:
        fail(f"{bench_dir / 'results.json'}: field 'runs': no runs (not an `areal bench throughput` result?)")
    runs = []
    for run in res["runs"]:
        d = bench_dir / "runs" / Path(run.get("dir", run.get("label", ""))).name
        try:
            metrics = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
        except OSError as e:
            fail(f"{d / 'metrics.jsonl'}: cannot read: {e.strerror}")
        except json.JSONDecodeError as e:
            fail(f"{d / 'metrics.jsonl'}: invalid JSON: {e.msg}")
        tl = load(d / "timeline.json")
        metrics = [{k: r[k] for k in KEEP_METRIC if k in r} for r in metrics]
        runs.append({**{k: run[k] for k in KEEP_RUN if k in run}, "name": run.get("label"), "steps": metrics,
                     "timeline": {"marks": {"step_costs": tl.get("marks", {}).get("step_costs", {})},
                                  "steps": [{k: s[k] for k in KEEP_STEP if k in s} for s in tl.get("steps", [])]}})
    return {"source": f"areal bench throughput results in {bench_dir.name}/ ({res.get('command', '')})",
            "created": res.get("created"), "machine": res.get("machine"), "scenario": res.get("scenario"),
            "ratios": res.get("ratios"), "steady_state": res.get("steady_state"), "runs": runs}


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print("usage: python benchmarks/compact_throughput_runs.py BENCH_DIR OUT.json\n\n" + (__doc__ or "").strip())
        return 0
    if len(argv) != 2:
        print("error: usage: python benchmarks/compact_throughput_runs.py BENCH_DIR OUT.json", file=sys.stderr)
        return 2
    out = compact(Path(argv[0]))
    dest = Path(argv[1])
    if not dest.parent.is_dir():
        print(f"error: {dest}: folder {dest.parent} does not exist", file=sys.stderr)
        return 2
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    tmp.replace(dest)  # all or nothing
    print(f"wrote {dest}: {len(out['runs'])} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

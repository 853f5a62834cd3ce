"""The CPU miniatures of the published recipes (mini-math: boba-rl-7b-math's code path; mini-code: boba2's) run
in CI and meet their expected numbers; `areal eval` benchmarks evaluate in the loop on one policy version."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def areal(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "areal_cli.commands.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mini-math", "mini-code"])
def test_the_miniature_trains_async_with_graded_rewards_and_meets_its_expected_numbers(name, tmp_path):
    r = areal("reproduce", name, "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    result = json.loads((tmp_path / "o" / "reproduce.json").read_text())
    assert result["passed"] and result["counts"]["fail"] == 0
    lines = rows(tmp_path / "o" / "train" / "metrics.jsonl")
    rl = [x for x in lines if x["phase"] == "rl"]
    assert [x["version"] for x in rl] == [1, 2, 3, 4]
    assert max(x["staleness_max"] for x in rl) >= 1  # asynchronous: batches of older versions were trained
    assert all(x["n_micro_batches"] >= 2 for x in rl)  # the token budget split every batch
    assert rl[-1]["reward_ok"] >= 4 * 4 * 4 and rl[-1]["reward_error"] == rl[-1]["reward_timeout"] == 0
    assert len({x["loss"] for x in rl}) > 1 and all(x["grad_norm"] > 0 for x in rl)
    # off-policy diagnostics in every step: the servers' logprobs equal the trainer's on its own version's tokens
    measured = [x["logprob_mismatch_max"] for x in rl if x["logprob_mismatch_max"] is not None]
    assert measured and max(measured) < 1e-4 and not any(x["logprob_mismatch_flagged"] for x in rl)
    for x in rl:
        assert 0 < x["iw_min"] <= x["iw_p50"] <= x["iw_p90"] <= x["iw_p99"] <= x["iw_max"]
        assert max(int(k) for k in x["staleness_hist"]) == x["staleness_max"]
    assert (tmp_path / "o" / "train" / "learning_curve.png").stat().st_size > 0
    summary = json.loads((tmp_path / "o" / "train" / "summary.json").read_text())
    if name == "mini-code":  # the sandbox's isolation is stated in the training metrics and the summary
        assert lines[0]["sandbox_isolation"] == "full" and summary["sandbox_isolation"]["level"] == "full"
    else:
        assert "sandbox_isolation" not in lines[0] and "sandbox_isolation" not in summary


@pytest.mark.multiproc
@pytest.mark.slow
def test_areal_eval_benchmarks_run_in_the_loop_on_one_policy_version(tmp_path, shared_dir):
    out = tmp_path / "run"
    r = areal("train", "mini-math", "--out", str(out), "--no-live", "-o", "loop.max_steps=2", "-o", "loop.eval_every=1",
              "-o", "loop.eval_benchmarks=[aime24, math_500]", "-o", f"loop.eval_data_dir={shared_dir / 'data' / 'math'}",
              "-o", "loop.eval_max_problems=3", "-o", "loop.eval_protocol=r1-distill", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    lines = rows(out / "metrics.jsonl")
    assert [x["step"] for x in lines] == [0, 1, 2]
    for x in lines:
        assert set(x["eval_benchmarks"]) == {"aime24", "math_500"}
        for res in x["eval_benchmarks"].values():
            assert res["version"] == x["version"] and res["n_problems"] == 3 and res["grader_failures"] == 0
            assert 0.0 <= res["pass@1"] <= 1.0
            assert 0 <= res["n_truncated"] <= 3 * res["n_samples"] and 0 <= res["n_no_answer"] <= 3 * res["n_samples"]
        assert x["aime24/pass@1"] == x["eval_benchmarks"]["aime24"]["pass@1"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_benchmarks"]["protocol"]["name"] == "r1-distill"
    assert summary["eval_benchmarks"]["benchmarks"] == {"aime24": 3, "math_500": 3}


@pytest.mark.multiproc
def test_unknown_benchmark_data_is_one_line_and_leaves_no_run(tmp_path):
    r = areal("train", "mini-math", "--out", str(tmp_path / "o"), "--no-live", "-o", "loop.eval_benchmarks=[aime24]",
              "-o", f"loop.eval_data_dir={tmp_path}", cwd=tmp_path)
    assert r.returncode == 2 and "field 'loop.eval_benchmarks'" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_an_evaluation_whose_tokens_mix_versions_is_refused():
    """A weight update must not mix an evaluation: a sample with a token of another version is an error."""
    from areal_cli.eval.in_loop import BenchmarkEval
    from areal_cli.rollout.client import Completion
    from areal_cli.rollout.protocol import SamplingParams

    class Problem:
        dataset, id, problem, answer, kind = "aime24", "1", "q", "2", "math"

    class Prompt:
        problem, text, ids, think_open = Problem(), "q", [1, 2], False

    class Client:
        async def generate(self, ids, params, rid=None):
            return Completion(ids, [5, 6], [-0.1, -0.2], [3, 4], "stop", 1, "u")

    class Graders:
        async def grade(self, problem, text, think_open, **prompt):
            return {"correct": False, "grader_status": "ok"}

    class Proto:
        n_samples, stop = 1, ()

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "x"

    ev = BenchmarkEval(Proto(), {"aime24": [Prompt()]}, SamplingParams(max_new_tokens=2), Graders(), 0)
    with pytest.raises(RuntimeError, match=r"mixed policy versions \[3, 4\] \(expected 3\)"):
        asyncio.run(ev.run(Client(), Tok(), 3))

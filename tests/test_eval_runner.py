"""Claims: `areal eval`'s run_eval validates every input (datasets, records, options, model directory,
prompt length) BEFORE generating anything and then writes nothing; results are written atomically
(complete files or none); end to end against the embedded server it writes results.json and
samples.jsonl of the documented shape."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from areal_cli.foundations.errors import UserError
from areal_cli.eval.runner import ensure_tiny_model, render_table, run_eval, write_results

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DATA = SHARED / "data" / "math"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def tiny_dir(cache_dir):
    # the same call run_eval makes when no --model is given
    return ensure_tiny_model(cache_dir)


def call(out_dir, **overrides):
    kwargs = dict(datasets=["aime24"], data_dir=DATA, model_dir=None, n=2, temperature=1.0, top_p=1.0,
                  max_new_tokens=16, out_dir=out_dir, seed=0, show_progress=False)
    kwargs.update(overrides)
    return run_eval(**kwargs)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(datasets=["aime24", "gsm8k"]), "unknown dataset 'gsm8k'; known datasets: aime24, aime25, amc23, "),
        (dict(n=0), "option 'n_samples': must be an integer >= 1, got 0"),
        (dict(temperature=-0.5), "option 'temperature': must be >= 0 and finite, got -0.5"),
        (dict(protocol="r1"), "unknown protocol 'r1'; known protocols: qwen3-think, "),
        (dict(protocol="qwen3-think-pure"), "protocol 'qwen3-think-pure' is for code benchmarks; 'aime24' is a math "
                                            "benchmark (its default protocol: qwen3-think)"),
        (dict(protocol="qwen3-think"), "protocol 'qwen3-think' uses "),
        (dict(top_p=0.0), "option 'top_p': must be in (0, 1], got 0.0"),
        (dict(max_new_tokens=0), "option 'max_new_tokens': must be an integer >= 1, got 0"),
        (dict(server_url="localhost:3000"), "option 'server_url': must start with http:// or https://, got 'localhost:3000'"),
        (dict(server_url="http://127.0.0.1:1"), "option 'server_url' needs option 'model' (the directory of the "
                                                 "served model, for its tokenizer and vocabulary)"),
    ],
)
def test_bad_options_and_names_fail_before_anything_is_written(tmp_path, overrides, message):
    out = tmp_path / "out"
    with pytest.raises(UserError) as info:
        call(out, **overrides)
    assert str(info.value).startswith(message)
    assert not out.exists()


def test_bad_record_in_a_later_dataset_fails_before_generation(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(DATA / "aime24.jsonl", data / "aime24.jsonl")
    (data / "amc23.jsonl").write_text('{"id": 1, "problem": "p", "answer": 1}\n{"id": 2, "problem": "q"}\n')
    out = tmp_path / "out"
    with pytest.raises(UserError) as info:
        call(out, datasets="aime24,amc23", data_dir=data)
    assert str(info.value) == f"{data / 'amc23.jsonl'}:2: field 'answer' missing"
    assert not out.exists()


def test_missing_model_dir_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"no_model: no such file or directory: expected a model directory or a \.gguf "
                                        r"file \(a published model: `areal download MODEL_REPO_ID --local-dir DIR`\)"):
        call(tmp_path / "out", model_dir=tmp_path / "no_model")
    assert not (tmp_path / "out").exists()


def test_prompt_longer_than_model_context_is_reported_with_file_and_line(tmp_path, tiny_dir):
    out = tmp_path / "out"
    with pytest.raises(UserError) as info:
        call(out, datasets=["math_500"], model_dir=tiny_dir, max_new_tokens=1900, protocol="chat-template")
    msg = str(info.value)
    assert msg.startswith(f"{DATA / 'math_500.jsonl'}:") and "exceeds the model's max_position_embeddings (2048)" in msg
    assert not out.exists()


def test_results_are_written_atomically_or_not_at_all(tmp_path):
    out = tmp_path / "out"
    write_results(out, {"config": {"n": 1}, "d": {"pass@1": 1.0}}, [{"dataset": "d", "text": "x"}])
    before = {p.name: p.read_text() for p in out.iterdir()}
    assert sorted(before) == ["report.md", "results.json", "samples.jsonl"]
    with pytest.raises(TypeError):  # a sample that cannot be serialised: nothing changes, no temp files
        write_results(out, {"config": {"n": 2}}, [{"dataset": "d", "bad": object()}])
    assert {p.name: p.read_text() for p in out.iterdir()} == before
    with pytest.raises(TypeError):
        write_results(out, {"config": {"n": 2}, "bad": {1, 2}}, [{"dataset": "d"}])
    assert {p.name: p.read_text() for p in out.iterdir()} == before


def test_render_table_prints_percentages(capsys):
    from rich.console import Console

    console = Console(width=150, force_terminal=False)
    render_table({"config": {}, "aime24": {"pass@1": 0.5, "pass@2": 5 / 6, "maj@2": 1.0, "n_problems": 30,
                                           "n_samples": 2, "n_no_answer": 3, "n_grader_errors": 0,
                                           "n_grader_timeouts": 1}}, console)
    printed = capsys.readouterr().out
    assert "aime24" in printed and "50.0" in printed and "83.3" in printed and "100.0" in printed
    lines = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in printed.splitlines() if line.count("│") >= 3}
    assert lines["pass@2"] == "83.3" and lines["grader timeouts"] == "1" and lines["problems"] == "30"


BENCH = Path(__file__).resolve().parent / "data" / "benchmarks"  # small code benchmarks, upstream schemas


class ScriptedGenerator:
    """Stands in for a server: answers each problem with a fixed completion (by problem id in the rid)."""

    def __init__(self, tokenizer, texts):
        self.tok, self.texts, self.rids = tokenizer, texts, []

    async def generate(self, prompt_ids, params, rid=None):
        from types import SimpleNamespace

        self.rids.append(rid)
        pid = rid.split("-", 3)[3].rsplit("-", 1)[0]
        return SimpleNamespace(output_ids=self.tok.encode(self.texts[pid], add_special_tokens=False),
                               finish_reason="stop")

    async def aclose(self):
        pass


@pytest.mark.multiproc
def test_code_benchmark_is_generated_then_graded_by_running_its_tests(tmp_path, tiny_dir):
    from transformers import AutoTokenizer

    fence = "```python\n{}\n```"
    texts = {"abc375_a": fence.format("n = int(input())\ns = input()\nprint(sum(s[i:i+3] == '#.#' for i in range(n)))"),
             "3496": fence.format("class Solution:\n    def sumArray(self, nums):\n        return sum(nums)"),
             "2053_B": "I cannot solve this.",
             "abc391_b": fence.format("a, b = map(int, input().split())\nprint(a - b)")}
    gen = ScriptedGenerator(AutoTokenizer.from_pretrained(str(tiny_dir)), texts)
    out = tmp_path / "out"
    res = run_eval("lcb_v5", BENCH, tiny_dir, n=2, max_new_tokens=64, out_dir=out, protocol="chat-template",
                   show_progress=False, generator=gen)
    m = res["lcb_v5"]
    assert len(gen.rids) == 8 and (m["n_problems"], m["n_samples"]) == (4, 2)
    assert (m["pass@1"], m["pass@2"]) == (0.5, 0.5)
    assert m["code_status_counts"] == {"passed": 4, "no_code": 2, "wrong_answer": 2}
    assert m["breakdown"]["platform"]["leetcode"]["pass@1"] == 1.0
    assert res["config"]["grader"] == {"code": "areal_cli.reward.code_grader:grade_code (last fenced block after "
                                                "</think>; sandboxed tests)"}
    assert res["config"]["data"]["lcb_v5"]["n_problems"] == 4  # the loader's report: window, files, hashes
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {s["code_status"] for s in samples if s["problem_id"] == "abc391_b"} == {"wrong_answer"}


def small_data_dir(root: Path) -> Path:
    data = root / "data"
    data.mkdir()
    for name, k in (("aime24", 3), ("amc23", 2)):
        lines = (DATA / f"{name}.jsonl").read_text().splitlines()[:k]
        (data / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return data


@pytest.mark.multiproc
@pytest.mark.slow
def test_end_to_end_with_embedded_server_writes_results_and_samples_reproducibly(tmp_path, cache_dir, tiny_dir):
    from transformers import AutoTokenizer

    data = small_data_dir(tmp_path)
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    # default model path: the tiny model is built into the cache dir, the embedded server is launched
    res = call(out1, datasets="aime24,amc23", data_dir=data, n=2, max_new_tokens=12, seed=3, cache_dir=cache_dir)
    model_dir = Path(res["config"]["model_dir"])
    assert model_dir == tiny_dir and model_dir.parent == cache_dir / "models"
    assert res["config"]["model"].startswith("tiny-default")
    assert json.loads((out1 / "results.json").read_text()) == res
    assert [k for k in res] == ["config", "aime24", "amc23"]
    for ds, n_problems in (("aime24", 3), ("amc23", 2)):
        m = res[ds]
        assert {"pass@1", "pass@2", "maj@2", "n_problems", "n_samples"} <= set(m)
        assert (m["n_problems"], m["n_samples"]) == (n_problems, 2)
        assert 0.0 <= m["pass@1"] <= m["pass@2"] <= 1.0 and 0.0 <= m["maj@2"] <= 1.0
        assert m["n_grader_errors"] == 0 and m["n_grader_timeouts"] == 0
    cfg = res["config"]
    assert (cfg["n"], cfg["temperature"], cfg["max_new_tokens"], cfg["seed"]) == (2, 1.0, 12, 3)
    assert cfg["protocol"]["name"] == "chat-template"
    assert sorted(cfg["protocol"]["overrides"]) == ["max_new_tokens", "n_samples", "temperature", "top_p"]
    assert cfg["protocol"]["preset"] == {"n_samples": 1, "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 512}
    assert not (out1 / "samples.partial.jsonl").exists()
    from areal_cli import __version__
    from areal_cli.foundations.manifest import git_info

    assert cfg["kit"] == {"version": __version__, **git_info()}  # the kit's commit and whether its tree was clean
    assert cfg["kit"]["commit"] == "unknown" or len(cfg["kit"]["commit"]) == 40

    samples = [json.loads(line) for line in (out1 / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 10
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    for s in samples:
        assert {"dataset", "problem_id", "sample_index", "output_ids", "text", "extracted", "correct",
                "grader_status", "finish_reason"} <= set(s)
        assert 1 <= len(s["output_ids"]) <= 12 and all(0 <= t < vocab for t in s["output_ids"])
        assert s["text"] == tok.decode(s["output_ids"], skip_special_tokens=True)
        assert s["grader_status"] == "ok" and isinstance(s["correct"], bool)
    assert sorted((s["dataset"], s["problem_id"], s["sample_index"]) for s in samples) == sorted(
        (ds, pid, i) for ds, pids in (("aime24", ["60", "61", "62"]), ("amc23", ["0", "1"])) for pid in pids for i in (0, 1)
    )

    # same seed, against an already running server (--server-url), one request at a time: identical samples
    # (per-request seeds), and the config records the server it used.
    from areal_cli.rollout.server import EmbeddedServer

    with EmbeddedServer.launch(model_dir, seed=3) as server:
        res2 = call(out2, datasets="aime24,amc23", data_dir=data, model_dir=model_dir, n=2, max_new_tokens=12,
                    seed=3, max_concurrency=1, server_url=server.url, protocol="chat-template")
    assert res2["config"]["server_url"] == server.url and not (out2 / "eval_server.log").exists()
    assert res2["config"]["server_honours_seeds"] is True  # the kit starts it with --enable-deterministic-inference
    key = lambda s: (s["dataset"], s["problem_id"], s["sample_index"])  # noqa: E731
    again = sorted((json.loads(line) for line in (out2 / "samples.jsonl").read_text().splitlines()), key=key)
    assert [s["output_ids"] for s in again] == [s["output_ids"] for s in sorted(samples, key=key)]
    assert {ds: res2[ds] for ds in ("aime24", "amc23")} == {ds: res[ds] for ds in ("aime24", "amc23")}
    report = (out1 / "report.md").read_text()
    assert "- protocol: chat-template" in report and f"- config hash: {res['config']['config_hash']}" in report


# ------------------------------------------------------------------ what the metrics hide: truncation, no answer
def graded_records(n_problems: int, n: int, *, greedy_truncated: bool) -> list[dict]:
    """Graded math records: sample 0 of each problem cut by the budget (no answer), the others right; one greedy
    completion per problem, all cut by the budget (no answer) when ``greedy_truncated``."""
    recs = []
    for p in range(n_problems):
        for i in range(n):
            cut = i == 0
            recs.append({"dataset": "aime24", "problem_id": str(p), "sample_index": i, "output_ids": [1] * (8 if cut else 3),
                         "finish_reason": "length" if cut else "stop", "extracted": None if cut else "7",
                         "correct": not cut, "grader_status": "ok"})
        recs.append({"pass": "greedy", "dataset": "aime24", "problem_id": str(p), "sample_index": 0,
                     "output_ids": [1] * 8, "finish_reason": "length" if greedy_truncated else "stop",
                     "extracted": None if greedy_truncated else "7", "correct": not greedy_truncated,
                     "grader_status": "ok"})
    return recs


def test_truncated_and_no_answer_are_counted_per_pass_and_shown_in_table_and_report(capsys):
    from rich.console import Console

    from areal_cli.eval.report import render_markdown
    from areal_cli.eval.summary import summarize

    m = summarize(graded_records(5, 3, greedy_truncated=True))["aime24"]
    # the greedy pass: every completion cut by the budget -> every one counted (and none hidden in the sampled count)
    assert (m["greedy_n_truncated"], m["greedy_n_no_answer"], m["greedy_acc"]) == (5, 5, 0.0)
    assert (m["n_truncated"], m["n_no_answer"], m["n_samples"]) == (5, 5, 3)
    assert summarize(graded_records(5, 3, greedy_truncated=False))["aime24"]["greedy_n_truncated"] == 0
    no_reason = [{k: v for k, v in r.items() if k != "finish_reason"} for r in graded_records(2, 2, greedy_truncated=True)]
    assert "n_truncated" not in summarize(no_reason)["aime24"]  # unknown, not 0
    results = {"config": {"kit": {"version": "9.9", "commit": "a" * 40, "dirty": True}}, "aime24": m}
    render_table(results, Console(width=150, force_terminal=False))
    printed = capsys.readouterr().out
    rows = {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in printed.splitlines() if ln.count("│") >= 3}
    assert (rows["truncated (sampled)"], rows["no answer (sampled)"]) == ("5", "5")
    assert (rows["truncated (greedy)"], rows["no answer (greedy)"]) == ("5", "5")
    report = render_markdown(results)
    header = next(ln for ln in report.splitlines() if ln.startswith("| dataset | problems"))
    row = next(ln for ln in report.splitlines() if ln.startswith("| aime24 | 5 |"))
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["truncated (greedy)"] == cells["truncated (sampled)"] == "5"
    assert "- kit: areal 9.9, commit aaaaaaaaaaaa (dirty)" in report
    no_greedy = summarize([r for r in graded_records(2, 2, greedy_truncated=True) if r.get("pass") != "greedy"])
    render_table({"config": {}, **no_greedy}, Console(width=150, force_terminal=False))
    assert "(greedy)" not in capsys.readouterr().out


def test_each_sample_record_carries_its_prompt_and_the_resume_file_keeps_it(tmp_path):
    import asyncio
    from types import SimpleNamespace

    from areal_cli.eval.benchmarks import Problem
    from areal_cli.eval.generate import Job, Prompt, generate_sample
    from areal_cli.eval.resume import PartialRun
    from areal_cli.rollout.protocol import SamplingParams

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "x" * len(ids)

    class Gen:
        async def generate(self, prompt_ids, params, rid=None):
            return SimpleNamespace(output_ids=[5, 6], finish_reason="length")

    problem = Problem(dataset="aime24", id="60", problem="1+1?", answer="2", path="f", line=1)
    job = Job(Prompt(problem, "<user>1+1?</user><think>", [1, 2, 3], True), "sample", 0)
    rec = asyncio.run(generate_sample(Gen(), job, SamplingParams(max_new_tokens=2), 0, Tok(), ()))
    assert rec["prompt"] == "<user>1+1?</user><think>" and rec["text"] == "xx" and rec["finish_reason"] == "length"
    part = PartialRun.open(tmp_path, {"c": 1}, {job.key})
    part.append({**rec, "extracted": None, "correct": False, "grader_status": "ok"})
    part.close()
    again = PartialRun.open(tmp_path, {"c": 1}, {job.key})
    assert again.records[0]["prompt"] == rec["prompt"]
    again.remove()


def test_in_loop_benchmark_evaluation_counts_truncated_and_no_answer_beside_pass_at_1():
    import asyncio
    from types import SimpleNamespace

    from areal_cli.eval.in_loop import BenchmarkEval
    from areal_cli.rollout.protocol import SamplingParams

    class Client:
        async def generate(self, ids, params, rid=None):  # problem "b": every completion cut by the budget
            cut = "-b-" in rid
            return SimpleNamespace(output_ids=[1] * (4 if cut else 2), finish_reason="length" if cut else "stop",
                                   output_versions=[3] * (4 if cut else 2))

    class Graders:
        async def grade(self, problem, text, think_open, **kw):
            return {"correct": problem.id == "a", "extracted": "1" if problem.id == "a" else None,
                    "grader_status": "ok"}

    prompts = {"aime24": [SimpleNamespace(problem=SimpleNamespace(dataset="aime24", id=pid), ids=[1], think_open=False,
                                          text="q") for pid in ("a", "b")]}
    ev = BenchmarkEval(SimpleNamespace(n_samples=3, stop=()), prompts, SamplingParams(max_new_tokens=4), Graders(), 0)
    tok = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: "y" * len(ids))
    res = asyncio.run(ev.run(Client(), tok, 3))["aime24"]
    assert (res["pass@1"], res["n_truncated"], res["n_no_answer"], res["n_samples"]) == (0.5, 3, 3, 3)

"""Claims: `areal eval`'s run_eval validates every input (datasets, records, options, model directory,
prompt length) BEFORE generating anything and then writes nothing; results are written atomically
(complete files or none); end to end against the embedded server it writes results.json and
samples.jsonl of the documented shape."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from areal_cli.errors import UserError
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
        (dict(datasets=["aime24", "gsm8k"]), "unknown dataset 'gsm8k'; known datasets: aime24, aime25, amc23, math_500"),
        (dict(n=0), "option 'n': must be an integer >= 1, got 0"),
        (dict(temperature=-0.5), "option 'temperature': must be a number >= 0, got -0.5"),
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
    assert str(info.value) == message
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
    with pytest.raises(UserError, match="model directory not found"):
        call(tmp_path / "out", model_dir=tmp_path / "no_model")
    assert not (tmp_path / "out").exists()


def test_prompt_longer_than_model_context_is_reported_with_file_and_line(tmp_path, tiny_dir):
    out = tmp_path / "out"
    with pytest.raises(UserError) as info:
        call(out, datasets=["math_500"], model_dir=tiny_dir, max_new_tokens=1900)
    msg = str(info.value)
    assert msg.startswith(f"{DATA / 'math_500.jsonl'}:") and "exceeds the model's max_position_embeddings (2048)" in msg
    assert not out.exists()


def test_results_are_written_atomically_or_not_at_all(tmp_path):
    out = tmp_path / "out"
    write_results(out, {"config": {"n": 1}, "d": {"pass@1": 1.0}}, [{"dataset": "d", "text": "x"}])
    before = {p.name: p.read_text() for p in out.iterdir()}
    assert sorted(before) == ["results.json", "samples.jsonl"]
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


def small_data_dir(root: Path) -> Path:
    data = root / "data"
    data.mkdir()
    for name, k in (("aime24", 3), ("amc23", 2)):
        lines = (DATA / f"{name}.jsonl").read_text().splitlines()[:k]
        (data / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return data


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

    # same seed, explicit model dir, one request at a time: identical samples (per-request seeds)
    call(out2, datasets="aime24,amc23", data_dir=data, model_dir=model_dir, n=2, max_new_tokens=12, seed=3,
         max_concurrency=1)
    key = lambda s: (s["dataset"], s["problem_id"], s["sample_index"])  # noqa: E731
    again = sorted((json.loads(line) for line in (out2 / "samples.jsonl").read_text().splitlines()), key=key)
    assert [s["output_ids"] for s in again] == [s["output_ids"] for s in sorted(samples, key=key)]

"""Claims: an interrupted `areal eval` run keeps every finished sample in OUT/samples.partial.jsonl; run
again with the same --out and configuration it regenerates none of them (counted generate calls) and
ends with exactly the results and samples of an uninterrupted run; a torn last line (killed mid-write)
is dropped, not an error; a different configuration, a damaged resume file or a finished run is refused
with one line; a run that fails before finishing any sample leaves nothing behind. Also: the protocol's
greedy pass adds greedy accuracy, explicit options override the preset and are recorded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from areal_cli.foundations.errors import UserError
from areal_cli.eval.datasets import load_datasets
from areal_cli.eval.grading import Graders
from areal_cli.eval.runner import run_eval
from helpers.one_line import assert_one_line

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DATA = SHARED / "data" / "math"
PARTIAL = "samples.partial.jsonl"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A model directory with the tiny model's tokenizer and config.json but no weights: generation is
    faked, only prompts and decoding need the tokenizer."""
    from areal_cli.models.tiny import CHAT_TEMPLATE, IM_END, IM_START, PAD_TOKEN, default_corpus, train_tokenizer

    d = tmp_path_factory.mktemp("tok_model")
    tok = train_tokenizer(default_corpus(), 512)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": PAD_TOKEN, "eos_token": IM_END,
        "additional_special_tokens": [IM_START], "chat_template": CHAT_TEMPLATE}))
    (d / "config.json").write_text(json.dumps({"vocab_size": tok.get_vocab_size(), "max_position_embeddings": 4096,
                                               "eos_token_id": tok.token_to_id(IM_END)}))
    return d


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    for name, k in (("aime24", 3), ("amc23", 2)):
        (d / f"{name}.jsonl").write_text("\n".join((DATA / f"{name}.jsonl").read_text().splitlines()[:k]) + "\n")
    return d


class FakeGenerator:
    """Answers from the request's seed: the gold answer when the seed is even (and always when greedy),
    else 7. Records every call; raises after ``fail_after`` calls (a crash mid-run)."""

    def __init__(self, model_dir: Path, data_dir: Path, fail_after: int | None = None):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.gold = {(ds, p.id): p.answer for ds, ps in load_datasets(["aime24", "amc23"], data_dir).items() for p in ps}
        self.fail_after = fail_after
        self.calls: list[tuple[str, str, str, int]] = []

    async def generate(self, prompt_ids, params, rid=None):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            await asyncio.sleep(0.3)  # let the samples already generated finish grading first
            raise RuntimeError("generator died")
        _, pass_name, ds, rest = rid.split("-", 3)
        pid, index = rest.rsplit("-", 1)
        self.calls.append((pass_name, ds, pid, int(index)))
        gold = self.gold[(ds, pid)]
        answer = gold if params.temperature == 0 or params.seed % 2 == 0 else "7"
        await asyncio.sleep(0)
        return SimpleNamespace(output_ids=self.tok.encode(f"So \\boxed{{{answer}}}", add_special_tokens=False),
                               finish_reason="stop")

    async def aclose(self):
        pass


@pytest.fixture(scope="module")
def graders():
    with Graders(math_timeout_s=10.0, n_workers=1) as g:  # one set of grader processes for all runs here
        yield g


@pytest.fixture
def evaluate(model_dir, data_dir, graders):
    def run(out, generator, **overrides):
        kwargs = dict(datasets="aime24,amc23", data_dir=data_dir, model_dir=model_dir, n=4, temperature=1.0,
                      out_dir=out, seed=5, protocol="chat-template", greedy_pass=True, max_concurrency=1,
                      show_progress=False, generator=generator, graders=graders)
        kwargs.update(overrides)
        return run_eval(**kwargs)

    return run


def metrics_of(results):
    return {k: v for k, v in results.items() if k != "config"}


def saved_keys(out: Path):
    lines = (out / PARTIAL).read_text().splitlines()[1:]
    return [(r["pass"], r["dataset"], r["problem_id"], r["sample_index"]) for r in map(json.loads, lines)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, model_dir, data_dir, graders):
    out = tmp_path_factory.mktemp("ref") / "out"
    gen = FakeGenerator(model_dir, data_dir)
    res = run_eval(datasets="aime24,amc23", data_dir=data_dir, model_dir=model_dir, n=4, temperature=1.0,
                   out_dir=out, seed=5, protocol="chat-template", greedy_pass=True, show_progress=False,
                   generator=gen, graders=graders)  # max_concurrency left at its default (64)
    return SimpleNamespace(out=out, results=res, calls=gen.calls,
                           samples=(out / "samples.jsonl").read_text().splitlines())


def interrupt(evaluate, out, model_dir, data_dir, after=8):
    with pytest.raises(RuntimeError, match="generator died"):
        evaluate(out, FakeGenerator(model_dir, data_dir, fail_after=after))
    assert not (out / "results.json").exists() and not (out / "report.md").exists()
    return saved_keys(out)


@pytest.mark.multiproc
def test_uninterrupted_run_has_greedy_pass_and_records_the_protocol(reference):
    res = reference.results
    # 5 problems x (1 greedy + 4 samples), each generated once
    assert len(reference.calls) == 25 == len(set(reference.calls)) == len(reference.samples)
    for ds in ("aime24", "amc23"):
        assert res[ds]["greedy_acc"] == 1.0  # the fake answers right when greedy
        assert 0.0 < res[ds]["pass@1"] < 1.0 and res[ds]["n_samples"] == 4
    proto = res["config"]["protocol"]
    assert proto["name"] == "chat-template" and proto["greedy_pass"] is True and proto["n_samples"] == 4
    assert sorted(proto["overrides"]) == ["greedy_pass", "n_samples", "temperature"]
    assert not (reference.out / PARTIAL).exists()


@pytest.mark.multiproc
def test_interrupted_run_resumes_without_regenerating_and_matches_uninterrupted(tmp_path, model_dir, data_dir,
                                                                               reference, evaluate):
    out = tmp_path / "out"
    saved = interrupt(evaluate, out, model_dir, data_dir)
    assert 1 <= len(saved) <= 8
    gen = FakeGenerator(model_dir, data_dir)
    res = evaluate(out, gen)
    assert len(gen.calls) == 25 - len(saved) and not set(gen.calls) & set(saved)
    assert metrics_of(res) == metrics_of(reference.results)
    assert res["config"]["resumed_samples"] == len(saved)
    assert res["config"]["config_hash"] == reference.results["config"]["config_hash"]
    assert (out / "samples.jsonl").read_text().splitlines() == reference.samples
    assert not (out / PARTIAL).exists()


@pytest.mark.multiproc
def test_torn_last_line_is_dropped_and_that_sample_generated_again(tmp_path, model_dir, data_dir, reference,
                                                                  evaluate):
    out = tmp_path / "out"
    saved = interrupt(evaluate, out, model_dir, data_dir)
    with open(out / PARTIAL, "a") as fh:
        fh.write('{"pass": "sample", "dataset": "aime24", "problem_id": "62", "sample_')  # killed mid-write
    gen = FakeGenerator(model_dir, data_dir)
    res = evaluate(out, gen)
    assert len(gen.calls) == 25 - len(saved)
    assert metrics_of(res) == metrics_of(reference.results)


@pytest.mark.multiproc
def test_different_configuration_is_refused_naming_what_differs(tmp_path, model_dir, data_dir, evaluate):
    out = tmp_path / "out"
    interrupt(evaluate, out, model_dir, data_dir)
    before = (out / PARTIAL).read_text()
    gen = FakeGenerator(model_dir, data_dir)
    with pytest.raises(UserError) as info:
        evaluate(out, gen, temperature=0.7, seed=6)
    msg = str(info.value)
    assert msg.startswith(f"{out / PARTIAL}: an interrupted run with a different configuration")
    assert_one_line(msg, "differs in: protocol.temperature, seed")
    assert gen.calls == [] and (out / PARTIAL).read_text() == before


@pytest.mark.multiproc
def test_damaged_resume_file_is_reported_with_file_and_line(tmp_path, model_dir, data_dir, evaluate):
    out = tmp_path / "out"
    interrupt(evaluate, out, model_dir, data_dir)
    lines = (out / PARTIAL).read_text().splitlines(keepends=True)
    lines.insert(1, "{not json\n")
    (out / PARTIAL).write_text("".join(lines))
    with pytest.raises(UserError, match=f"^{out / PARTIAL}:2: malformed JSON"):
        evaluate(out, FakeGenerator(model_dir, data_dir))


@pytest.mark.multiproc
def test_finished_run_is_refused(reference, model_dir, data_dir, evaluate):
    gen = FakeGenerator(model_dir, data_dir)
    with pytest.raises(UserError, match="already holds results.json; choose another --out"):
        evaluate(reference.out, gen)
    assert gen.calls == []


def test_failure_before_any_finished_sample_leaves_nothing_behind(tmp_path, model_dir, data_dir, evaluate):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="generator died"):
        evaluate(out, FakeGenerator(model_dir, data_dir, fail_after=0))
    assert not out.exists()

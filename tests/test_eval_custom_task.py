"""Claims: `areal eval --data` takes one's own task -- a records file, or a task YAML with a math, code or
`module:function` reward grader -- and gives it every metric and output the built-in benchmarks get (pass@k,
maj@k for math, greedy accuracy, counts, results.json with the task's files and sha256, samples.jsonl, regrade);
`loop.eval_benchmarks` takes the same tasks; bad tasks are one line naming file, line and field, exit 2, before any
model or generation, with nothing written; a run of one's own task writes the command that evaluates its final
weights on its held-out records."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from areal_cli.commands.main import main
from areal_cli.eval.runner import ensure_tiny_model, run_eval
from areal_cli.foundations.errors import UserError
from helpers.one_line import one_line_error

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DATA = SHARED / "data" / "math"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def tiny_dir(cache_dir):
    return ensure_tiny_model(cache_dir)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir))


class ScriptedGenerator:
    """Stands in for a server: answers each problem with a fixed completion, found by the problem id at the end of
    the request id (``eval-<pass>-<dataset>-<id>-<i>``; dataset names may hold dashes)."""

    def __init__(self, tokenizer, texts):
        self.tok, self.texts, self.rids, self.prompts = tokenizer, texts, [], []

    async def generate(self, prompt_ids, params, rid=None):
        self.rids.append(rid)
        self.prompts.append(self.tok.decode(prompt_ids))
        head = rid.rsplit("-", 1)[0]
        pid = max((p for p in self.texts if head.endswith("-" + p)), key=len)
        ids = self.tok.encode(self.texts[pid], add_special_tokens=False)
        return SimpleNamespace(output_ids=ids, finish_reason="stop", output_versions=[0] * len(ids))

    async def aclose(self):
        pass


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


REWARD_PY = '''
def score(prompt, completion, prompt_ids, completion_ids, *, answer, unit, **fields):
    assert "Q:" in prompt and isinstance(prompt_ids, list) and isinstance(completion_ids, list)
    if completion.strip() == f"{answer} {unit}":
        return 1.0
    return 0.5 if answer in completion else 0.0
'''


def reward_task(root: Path, **extra) -> Path:
    """A task folder: records with a unit, a template, a reward beside the YAML (file.py:function)."""
    root.mkdir(parents=True, exist_ok=True)
    write_jsonl(root / "test.jsonl", [{"qid": "a", "question": "2+2", "answer": "4", "unit": "kg"},
                                      {"qid": "b", "question": "3+3", "answer": "6", "unit": "m"},
                                      {"qid": "c", "question": "1+0", "answer": "1", "unit": "s"}])
    (root / "rewards.py").write_text(REWARD_PY)
    keys = {"records": "test.jsonl", "id_field": "qid", "prompt_field": "question",
            "prompt_template": "Q: {question} (in {unit})", "answer_field": "answer", "grader": "rewards.py:score",
            "pass_threshold": 1.0, "samples": 2, **extra}
    (root / "my-task.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in keys.items() if v is not None))
    return root / "my-task.yaml"


# ------------------------------------------------------------------------------------ a records file, end to end
@pytest.mark.multiproc
def test_records_file_is_evaluated_end_to_end_with_every_metric(tmp_path, cache_dir, tiny_dir):
    rows = [{"question": q, "answer": a} for q, a in (("1+1?", "2"), ("2+3?", "5"), ("4+4?", "8"))]
    data = write_jsonl(tmp_path / "arith.jsonl", rows)
    out = tmp_path / "out"
    res = run_eval(str(data), None, None, n=2, temperature=1.0, max_new_tokens=8, out_dir=out, greedy_pass=True,
                   cache_dir=cache_dir, show_progress=False)
    m = res["arith"]
    assert {"pass@1", "pass@2", "maj@2", "greedy_acc", "pass@1_stderr", "n_no_answer", "n_grader_errors"} <= set(m)
    assert (m["n_problems"], m["n_samples"]) == (3, 2) and m["n_grader_errors"] == 0
    data_rep = res["config"]["data"]["arith"]
    assert data_rep["loader"] == "task" and data_rep["grader"] == "math" and data_rep["task_file"] is None
    import hashlib

    assert data_rep["files"] == [{"path": str(data.resolve()), "bytes": data.stat().st_size,
                                  "sha256": hashlib.sha256(data.read_bytes()).hexdigest()}]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert sorted({s["problem_id"] for s in samples}) == ["1", "2", "3"]  # no id field: the line numbers
    assert len(samples) == 9 and (out / "report.md").is_file()
    assert "arith" in (out / "report.md").read_text()


# ------------------------------------------------------------------------------------ a reward grader
@pytest.mark.multiproc
def test_yaml_task_with_a_reward_grader_is_scored_by_it_and_regraded(tmp_path, tiny_dir, tokenizer):
    task = reward_task(tmp_path / "task")
    gen = ScriptedGenerator(tokenizer, {"a": "4 kg", "b": "it is 6", "c": "no idea"})
    out = tmp_path / "out"
    res = run_eval(str(task), None, tiny_dir, max_new_tokens=16, out_dir=out, protocol="chat-template",
                   show_progress=False, generator=gen)
    m = res["my-task"]
    assert len(gen.rids) == 6 and m["n_samples"] == 2  # the task's `samples: 2`
    assert all("Q: 2+2 (in kg)" in p for p, r in zip(gen.prompts, gen.rids) if r.endswith(("-a-0", "-a-1")))
    assert (m["pass@1"], m["pass@2"], m["n_problems"]) == (pytest.approx(1 / 3), pytest.approx(1 / 3), 3)
    assert m["mean_reward"] == pytest.approx(0.5) and "maj@2" not in m and m["n_grader_errors"] == 0
    cfg = res["config"]
    assert cfg["grader"]["reward"].startswith("the task's reward function")
    rep = cfg["data"]["my-task"]
    assert rep["grader"] == f"{(tmp_path / 'task' / 'rewards.py').resolve()}:score" and rep["pass_threshold"] == 1.0
    assert [Path(f["path"]).name for f in rep["files"]] == ["my-task.yaml", "test.jsonl"]
    assert all(len(f["sha256"]) == 64 for f in rep["files"])
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {s["problem_id"]: s["reward"] for s in samples} == {"a": 1.0, "b": 0.5, "c": 0.0}

    from areal_cli.eval.regrade import run_regrade

    again = run_regrade(out / "samples.jsonl", tmp_path / "regrade", datasets=str(task), show_progress=False)
    assert {k: again["my-task"][k] for k in ("pass@1", "pass@2", "mean_reward")} == \
        {k: m[k] for k in ("pass@1", "pass@2", "mean_reward")}
    # without --data: the task is named from the results.json beside the file
    with pytest.raises(UserError, match=r"samples.jsonl:1: field 'dataset': unknown benchmark 'my-task'; it is the "
                                        r"task .*my-task.yaml \(results.json beside the file\): pass --data "):
        run_regrade(out / "samples.jsonl", tmp_path / "regrade2", show_progress=False)


@pytest.mark.multiproc
def test_a_task_by_name_in_data_dir_mixes_with_a_builtin_benchmark(tmp_path, tiny_dir, tokenizer):
    data = tmp_path / "data"
    data.mkdir()
    (data / "aime24.jsonl").write_text("".join((DATA / "aime24.jsonl").read_text().splitlines(True)[:2]))
    write_jsonl(data / "sums.jsonl", [{"id": "s1", "problem": "1+1", "answer": 2},
                                      {"id": "s2", "problem": "2+2", "answer": 4.0}])
    (data / "sums.yaml").write_text("records: sums.jsonl\nprompt_template: \"Add: {problem}. Box it.\"\n")
    gen = ScriptedGenerator(tokenizer, {"60": "\\boxed{204}", "61": "\\boxed{0}", "s1": "\\boxed{3}", "s2": "\\boxed{4}"})
    res = run_eval("aime24,sums", data, tiny_dir, n=1, max_new_tokens=16, out_dir=tmp_path / "out",
                   protocol="chat-template", show_progress=False, generator=gen)
    assert list(res)[1:] == ["aime24", "sums"]
    assert (res["sums"]["pass@1"], res["sums"]["maj@1"]) == (0.5, 0.5)  # the math grader: 4.0 reads as 4
    assert any("Add: 1+1. Box it." in p and "Please reason" not in p for p in gen.prompts)  # the template is the message


# ------------------------------------------------------------------------------------ bad input
def _bad(tmp_path: Path, name: str) -> tuple[Path, str]:
    root = tmp_path / "t"
    if name == "missing records":
        return reward_task(root, records="nope.jsonl"), "my-task.yaml:1: field 'records': {root}/nope.jsonl not found"
    if name == "missing answer":
        task = reward_task(root)
        write_jsonl(root / "test.jsonl", [{"qid": "a", "question": "q", "answer": "1", "unit": "kg"},
                                          {"qid": "b", "question": "q", "unit": "kg"}])
        return task, "{root}/test.jsonl:2: field 'answer' missing (task my-task.yaml: answer_field)"
    if name == "missing prompt":
        task = reward_task(root, prompt_template=None)
        write_jsonl(root / "test.jsonl", [{"qid": "a", "answer": "1", "unit": "kg"}])
        return task, "{root}/test.jsonl:1: field 'question' missing (task my-task.yaml: prompt_field)"
    if name == "unknown grader":
        return reward_task(root, grader="maths"), ("my-task.yaml:6: field 'grader': unknown grader 'maths' (did you "
                                                   "mean 'math'? math, code, or a reward function")
    if name == "grader does not import":
        return reward_task(root, grader="no_such_mod_xyz:score"), \
            "my-task.yaml:6: field 'grader': no module named 'no_such_mod_xyz'"
    if name == "grader signature":
        task = reward_task(root, grader="rewards.py:judge")
        (root / "rewards.py").write_text("def judge(completion):\n    return 1.0\n")
        return task, "my-task.yaml:6: field 'grader': {root}/rewards.py:judge(completion) cannot take (prompt, " \
                     "completion, prompt_ids, completion_ids)"
    if name == "unknown key":
        task = reward_task(root)
        task.write_text(task.read_text().replace("prompt_field:", "promt_field:"))
        return task, "my-task.yaml:3: field 'promt_field': unknown key (did you mean 'prompt_field'?)"
    if name == "template field":
        return reward_task(root, prompt_template="Q: {questoin}"), \
            "{root}/test.jsonl:1: field 'questoin' missing (task my-task.yaml: prompt_template)"
    if name == "grader cannot take the fields":  # score() needs 'unit', the second record has none
        task = reward_task(root, prompt_template=None)
        write_jsonl(root / "test.jsonl", [{"qid": "a", "question": "q", "answer": "1", "unit": "kg"},
                                          {"qid": "b", "question": "q", "answer": "1"}])
        return task, "{root}/test.jsonl:2: task my-task.yaml: grader: {root}/rewards.py:score(prompt, completion, " \
                     "prompt_ids, completion_ids, *, answer, unit, **fields) cannot take the record's fields"
    if name == "async grader":
        task = reward_task(root, grader="rewards.py:judge")
        (root / "rewards.py").write_text("async def judge(prompt, completion, prompt_ids, completion_ids, **f):\n"
                                         "    return 1.0\n")
        return task, "my-task.yaml:6: field 'grader': {root}/rewards.py:judge is an async function"
    raise AssertionError(name)


BAD = ["missing records", "missing answer", "missing prompt", "unknown grader", "grader does not import",
       "grader signature", "unknown key", "template field", "grader cannot take the fields", "async grader"]


@pytest.mark.parametrize("name", BAD)
def test_bad_task_is_one_line_before_any_model_and_writes_nothing(tmp_path, name):
    task, needle = _bad(tmp_path, name)
    needle = needle.format(root=(tmp_path / "t").resolve())
    out = tmp_path / "out"
    # a model path that does not exist: the task is refused before the model is even looked at
    res = CliRunner().invoke(main, ["eval", "--data", str(task), "--model", str(tmp_path / "no-model"),
                                    "--out", str(out)])
    line = one_line_error(res, needle)
    assert line.startswith("error: ") and not out.exists()


def test_missing_records_file_and_unknown_name_are_one_line(tmp_path):
    res = CliRunner().invoke(main, ["eval", "--data", str(tmp_path / "gone.jsonl"), "--out", str(tmp_path / "o")])
    one_line_error(res, f"{tmp_path / 'gone.jsonl'}: file not found (option '--data': a records file)")
    res = CliRunner().invoke(main, ["eval", "--data", "my-task", "--data-dir", str(tmp_path), "--out",
                                    str(tmp_path / "o")])
    one_line_error(res, "unknown dataset 'my-task'; known datasets: aime24", f"{tmp_path}/my-task.yaml")
    assert not (tmp_path / "o").exists()


def test_code_task_reads_its_tests_and_refuses_undecodable_ones(tmp_path):
    from areal_cli.eval.custom_task import load_task_with_report

    tests = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    write_jsonl(tmp_path / "code.jsonl", [{"id": 1, "prompt": "add two ints", "tests": tests},
                                          {"id": 2, "prompt": "x", "tests": {"inputs": ["1"], "outputs": []}}])
    (tmp_path / "code.yaml").write_text("records: code.jsonl\ngrader: code\n")
    with pytest.raises(UserError, match=r"code\.jsonl:2: field 'tests': undecodable tests: tests: 1 inputs but 0 "
                                        r"outputs \(task code\.yaml: tests_field\)"):
        load_task_with_report(tmp_path / "code.yaml")
    write_jsonl(tmp_path / "code.jsonl", [{"id": 1, "prompt": "add two ints", "tests": tests}])
    task, problems, report = load_task_with_report(tmp_path / "code.yaml")
    assert (task.kind, problems[0].kind, problems[0].answer, report["kind"]) == ("code", "code", "", "code")
    assert problems[0].tests["inputs"] == ["1 2\n"]


# ------------------------------------------------------------------------------------ in the training loop
def test_loop_eval_benchmarks_takes_task_files(tmp_path, monkeypatch):
    from areal_cli.config import TrainConfig, apply_overrides

    task = reward_task(tmp_path / "task")
    monkeypatch.chdir(tmp_path)
    cfg = apply_overrides(TrainConfig(), ["loop.eval_benchmarks=[task/my-task.yaml, aime24]"])
    assert cfg.loop.eval_benchmarks == [str(task.resolve()), "aime24"]  # made absolute, names kept
    with pytest.raises(UserError, match=r"field 'loop.eval_benchmarks': task file .*gone\.yaml not found"):
        apply_overrides(TrainConfig(), ["loop.eval_benchmarks=[gone.yaml]"])
    recipe = tmp_path / "task" / "r.yaml"
    recipe.write_text("loop:\n  eval_benchmarks: [my-task.yaml]\n")
    from areal_cli.config.loading import config_from_file
    from areal_cli.foundations.typed_yaml import read_yaml

    cfg2, _ = config_from_file(read_yaml(recipe), recipe)
    assert cfg2.loop.eval_benchmarks == [str(task.resolve())]  # relative to the recipe's folder


@pytest.mark.multiproc
def test_in_loop_evaluation_grades_a_task_with_its_reward(tmp_path, tiny_dir, tokenizer):
    import asyncio

    from areal_cli.config import TrainConfig, apply_overrides
    from areal_cli.eval.in_loop import BenchmarkEval

    task = reward_task(tmp_path / "task")
    cfg = apply_overrides(TrainConfig(), [f"loop.eval_benchmarks=[{task}]", "loop.eval_n_samples=1",
                                          "rollout.max_new_tokens=16"])
    vocab = json.loads((tiny_dir / "config.json").read_text())["vocab_size"]
    bench = BenchmarkEval.prepare(cfg, tokenizer, tiny_dir, [], vocab, tiny_model=True)
    try:
        assert bench.names == ["my-task"]
        gen = ScriptedGenerator(tokenizer, {"a": "4 kg", "b": "6 m", "c": "1"})
        # the in-loop request id is bench-<dataset>-<id>-<i>-v<version>
        client = SimpleNamespace(generate=lambda ids, params, rid: gen.generate(ids, params, rid.rsplit("-", 1)[0]))
        res = asyncio.run(bench.run(client, tokenizer, 0))
    finally:
        bench.close()
    assert res["my-task"]["pass@1"] == pytest.approx(2 / 3) and res["my-task"]["grader_failures"] == 0


# ------------------------------------------------------------------------------------ after training
def test_a_training_task_is_written_as_an_eval_task_with_its_command(tmp_path):
    from areal_cli.api.records import Record
    from areal_cli.eval.custom_task import load_task_with_report
    from areal_cli.eval.heldout_task import heldout_eval_command

    (tmp_path / "rewards.py").write_text(REWARD_PY)
    records = [Record({"question": "2+2", "answer": "4", "unit": "kg"}, "d.jsonl:3", "d.jsonl:3"),
               Record({"question": "3+3", "answer": "6", "unit": "m"}, "d.jsonl:7", "d.jsonl:7")]
    task = SimpleNamespace(name="custom", heldout_records=records, prompt_field="question", prompt_template="chat",
                           id_field="", reward_spec=f"{tmp_path / 'rewards.py'}:score", code_dir=str(tmp_path),
                           workflow_spec="areal_cli.workflows.rlvr:RLVRWorkflow", dataset="d.jsonl")
    cfg = SimpleNamespace(recipe="mine", loop=SimpleNamespace(eval_temperature=0.0, eval_n_samples=1),
                          rollout=SimpleNamespace(max_new_tokens=6, top_p=1.0, top_k=-1))
    run = tmp_path / "run"
    command, why = heldout_eval_command(task, cfg, run, run / "weights" / "v3")
    yaml_path = run / "eval-task" / "mine-heldout.yaml"
    assert why == "" and command == (f"areal eval --model {run / 'weights' / 'v3'} --data {yaml_path} --protocol "
                                     f"chat-template --temperature 0 --top-p 1 --top-k -1 -n 1 --max-new-tokens 6 "
                                     f"--out {run / 'eval-final'}")
    spaced = tmp_path / "st run"  # pasted into a shell, the printed command works as printed
    command, _ = heldout_eval_command(task, cfg, spaced, spaced / "weights" / "v3")
    assert shlex.split(command)[3] == str(spaced / "weights" / "v3")
    spec, problems, _ = load_task_with_report(yaml_path)
    assert [p.id for p in problems] == ["d.jsonl:3", "d.jsonl:7"] and spec.kind == "reward"
    assert problems[0].problem == "2+2" and problems[0].fields["unit"] == "kg"
    multi = SimpleNamespace(**{**vars(task), "workflow_spec": "my_flow:Agent"})
    assert heldout_eval_command(multi, cfg, run, run)[0] is None


def test_the_guides_example_task_loads_and_its_reward_scores(tmp_path):
    import re

    from areal_cli.api.reward import call_reward
    from areal_cli.eval.custom_task import load_task_with_report

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "evaluation.md").read_text()
    section = guide.split("## Your own task", 1)[1]
    yaml_text = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    py_text = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    root = tmp_path / "my-task"
    (root / "data").mkdir(parents=True)
    (root / "my-task.yaml").write_text(yaml_text)
    (root / "rewards.py").write_text(py_text)
    write_jsonl(root / "data" / "test.jsonl", [{"qid": "q1", "question": "2 kg + 2 kg", "unit": "kg", "answer": "4"}])
    task, problems, report = load_task_with_report(root / "my-task.yaml")
    assert (task.name, task.kind, task.samples, report["default_protocol"]) == ("my-task", "reward", 4, "chat-template")
    assert problems[0].problem == "2 kg + 2 kg (in kg)\nPut the final answer in \\boxed{}."
    p = problems[0]
    assert call_reward(p.reward.spec, p.reward.code_dir, "prompt", "so \\boxed{4}", [], [], p.fields) == 1.0
    assert call_reward(p.reward.spec, p.reward.code_dir, "prompt", "\\boxed{5}", [], [], p.fields) == 0.0

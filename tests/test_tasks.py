"""Tasks as programs: the public API (dataset, reward, workflow by module:attr), the built-in math and code RL
tasks on the upstream record formats, prompt rendering, and bad input in one line."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_cli.api.records import heldout_by_hash, iter_records, parse_source, read_records
from areal_cli.api.reward import reward_kwargs
from areal_cli.config import TrainConfig
from helpers.one_line import assert_one_line
from areal_cli.foundations.errors import UserError

REPO = Path(__file__).resolve().parents[1]
MINI_MATH = REPO / "recipes" / "data" / "boba-106k-mini.jsonl"
MINI_CODE = REPO / "recipes" / "data" / "boba2-rl-code-mini.jsonl"


def areal(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "areal_cli.commands.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------ a user's own task
def readme_block(first_line: str) -> str:
    """The code block of the own-task guide whose first line is ``first_line`` (the worked example a user copies)."""
    text = (REPO / "docs" / "guides" / "own-task.md").read_text()
    start = text.index(first_line)
    return text[start: text.index("```", start)]


def write_user_task(d: Path) -> Path:
    (d / "data").mkdir(parents=True)
    words = ["ab", "cd", "ef", "gh", "ij", "kl", "mn", "op", "qr", "st", "uv", "wx", "yz", "ba", "dc", "fe", "hg",
             "ji", "lk", "nm"]
    with (d / "data" / "copy.jsonl").open("w") as f:
        for i, w in enumerate(words):
            f.write(json.dumps({"id": f"q{i}", "question": f"copy {w}", "answer": w}) + "\n")
    (d / "rewards.py").write_text(readme_block("# my-task/rewards.py"))
    (d / "my_workflow.py").write_text(readme_block("# my-task/my_workflow.py"))
    recipe = d / "my-task.yaml"
    recipe.write_text(readme_block("# my-task/my-task.yaml"))
    return recipe


@pytest.mark.multiproc
@pytest.mark.slow
def test_the_readme_task_defined_in_a_temporary_directory_trains_for_3_steps(tmp_path):
    recipe = write_user_task(tmp_path / "mytask")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    r = areal("train", str(recipe), "--out", str(tmp_path / "run"), "--no-live", cwd=elsewhere)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = rows(tmp_path / "run" / "metrics.jsonl")
    assert [x["step"] for x in lines] == [0, 1, 2, 3] and lines[-1]["version"] == 3
    rl = lines[1:]
    assert all(x["reward_error"] == 0 and x["reward_timeout"] == 0 for x in rl) and rl[-1]["reward_ok"] > 0
    assert rl[-1]["groups_rejected"] > 0  # q7 and q17 are rejected by the user's workflow, and counted
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["task"] == "custom" and summary["final_version"] == 3
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["task"]["reward"] == f"{(tmp_path / 'mytask' / 'rewards.py').resolve()}:exact_match"
    assert config["task"]["code_dir"] == str((tmp_path / "mytask").resolve())


@pytest.mark.multiproc
def test_user_code_that_cannot_load_is_one_line_and_nothing_is_written(tmp_path):
    recipe = write_user_task(tmp_path / "t")
    cases = [
        (["-o", "task.reward=no_such_module_x:f"], "field 'task.reward': no module named 'no_such_module_x'"),
        (["-o", "task.reward=rewards.py:nope"], "has no attribute 'nope'"),
        (["-o", "task.workflow=my_workflow:Missing"], "field 'task.workflow': my_workflow has no attribute 'Missing'"),
        (["-o", "task.workflow_args={colour: 3}"], "field 'task.workflow': my_workflow:SkipSevens(**workflow_args) failed"),
        (["-o", "task.dataset=hf:someone/data", "-o", f"task.dataset_revision={'a' * 40}"],
         "field 'task.dataset': cannot load hf:someone/data at revision"),
        (["-o", "task.dataset=hf:someone/data"], "needs 'task.dataset_revision'"),
    ]
    for extra, message in cases:
        out = tmp_path / f"run{len(message)}"
        r = areal("train", str(recipe), "--out", str(out), "--no-live", *extra, cwd=tmp_path / "t",
                  env={"HF_HUB_OFFLINE": "1"})
        assert r.returncode == 2, (extra, r.stderr[-1500:])
        assert message in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (extra, r.stderr)
        assert not out.exists()
    (tmp_path / "t" / "my_workflow.py").write_text("x = 1\ny = 1 / 0\n")
    r = areal("train", str(recipe), "--out", str(tmp_path / "o"), "--no-live", cwd=tmp_path)
    assert r.returncode == 2 and "raised ZeroDivisionError: division by zero" in r.stderr
    assert "my_workflow.py:2)" in r.stderr and not (tmp_path / "o").exists()
    (tmp_path / "t" / "rewards.py").write_text("def exact_match(:\n    pass\n")
    r = areal("train", str(recipe), "--out", str(tmp_path / "o"), "--no-live", "-o", "task.workflow=", cwd=tmp_path)
    assert r.returncode == 2 and "raised SyntaxError" in r.stderr and "rewards.py:1)" in r.stderr, r.stderr


BROKEN_REWARD = """\
def always(prompt, completion, prompt_ids, completion_ids, **fields):
    return fields["no_such_field"]


def flaky(prompt, completion, prompt_ids, completion_ids, *, answer, **fields):
    if answer in {BAD}:
        raise ValueError("cannot grade " + answer)
    return float(completion.strip() == answer)
"""

BAD_DATA = """\
def records(split, seed):
    for i in range(10 ** 6):
        yield {{"id": str(i), "question": "copy ab" if i < {N} else 42, "answer": "ab"}}
"""

DICT_WORKFLOW = """\
class Dict:
    async def arun_episode(self, client, item):
        return {"samples": []}
"""


@pytest.mark.multiproc
@pytest.mark.slow
def test_failures_after_the_start_end_the_run_in_one_line_or_are_counted(tmp_path):
    from areal_cli.api.records import Record

    recipe = write_user_task(tmp_path / "t")
    words = [json.loads(x) for x in (tmp_path / "t" / "data" / "copy.jsonl").read_text().splitlines()]
    _, held = heldout_by_hash([Record(w, "", w["id"]) for w in words], 0.25)
    (tmp_path / "t" / "broken.py").write_text(BROKEN_REWARD.replace("{BAD}", repr({r.fields["answer"] for r in held})))
    (tmp_path / "t" / "bad_data.py").write_text(BAD_DATA.format(N=40))
    (tmp_path / "t" / "dict_wf.py").write_text(DICT_WORKFLOW)
    fast = ["-o", "sft.max_steps=0", "-o", "loop.max_steps=6"]
    cases = [
        (["-o", "task.reward=broken.py:always"], "calls failed (e.g. error on record ",
         f"KeyError: 'no_such_field' (raised at {tmp_path / 't' / 'broken.py'}:"),
        (["-o", "task.dataset=bad_data.py:records", "-o", "task.eval_dataset=data/copy.jsonl", "-o", "loop.max_steps=100"],
         "bad_data.py:records(train) item 41: field 'question': expected a non-empty string", ""),
        (["-o", "task.workflow=dict_wf.py:Dict", "-o", "task.workflow_args.skip_suffix=null"], "workflow ", "returned dict, expected a Group"),
    ]
    for extra, a, b in cases:
        out = tmp_path / f"o{len(a)}"
        r = areal("train", str(recipe), "--out", str(out), "--no-live", *fast, *extra, cwd=tmp_path / "t")
        assert r.returncode == 2, (extra, r.stdout[-1500:], r.stderr[-1500:])
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and a in err[0] and b in err[0] and "Traceback" not in r.stderr, (extra, r.stderr)
        assert not out.exists()  # stopped before an RL step finished: nothing left behind
    # a reward failing on the held-out records only: each failure is counted as wrong, the run goes on
    out = tmp_path / "flaky"
    r = areal("train", str(recipe), "--out", str(out), "--no-live", "-o", "task.reward=broken.py:flaky",
              "-o", "loop.max_steps=2", cwd=tmp_path / "t")
    assert r.returncode == 0, r.stderr[-2000:]
    rows_ = rows(out / "metrics.jsonl")
    assert all(x["eval_reward_failures"] == len(held) for x in rows_[1:]) and rows_[-1]["reward_error"] == 0


@pytest.mark.multiproc
def test_a_record_without_a_required_field_names_file_line_and_field(tmp_path):
    recipe = write_user_task(tmp_path / "t")
    data = tmp_path / "t" / "data" / "copy.jsonl"
    lines = data.read_text().splitlines()
    lines[2] = json.dumps({"id": "q2", "question": "copy ef"})
    data.write_text("\n".join(lines) + "\n")
    r = areal("train", str(recipe), "--out", str(tmp_path / "o"), "--no-live", cwd=tmp_path)
    assert r.returncode == 2 and f"{data}:3: field 'answer': missing" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.multiproc
def test_a_prompt_template_mismatch_is_one_line_and_leaves_no_run(tmp_path):
    """R1-template records on a tokenizer without R1's markers (a chatml tiny model)."""
    r = areal("train", "mini-math", "--out", str(tmp_path / "o"), "--no-live", "-o", "model.chat_template=chatml",
              "-o", "task.prompt_template=chat", cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "field 'prompt': prompt template mismatch: the record carries the r1 chat template" in r.stderr
    assert "boba-106k-mini.jsonl:" in r.stderr and not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------ records
def test_jsonl_and_parquet_records_with_locations_and_a_stable_heldout_split(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    recs = [{"query_id": i, "prompt": f"p{i}", "solutions": ["1"]} for i in range(40)]
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "d.parquet")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    for name in ("d.parquet", "d.jsonl"):
        got = read_records(parse_source(name, what="dataset", base_dir=tmp_path), what="dataset", id_field="query_id")
        assert [r.id for r in got] == [str(i) for i in range(40)]
        assert got[3].where.endswith(("d.jsonl:4", "d.parquet: row 4"))
        train, held = heldout_by_hash(got, 0.25)
        assert 4 <= len(held) <= 18 and len(train) + len(held) == 40
        # the split depends on the ids only: reversed order, same held-out ids
        assert {r.id for r in heldout_by_hash(got[::-1], 0.25)[1]} == {r.id for r in held}
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: malformed JSON"):
        read_records(parse_source(str(tmp_path / "bad.jsonl"), what="dataset"), what="dataset")
    with pytest.raises(UserError, match="field 'task.dataset': .*nothing.jsonl not found"):
        parse_source("nothing.jsonl", what="field 'task.dataset'", base_dir=tmp_path)


def test_function_datasets_stream_records_lazily():
    src = parse_source("areal_cli.tasks.tiny_arith:records", what="dataset")
    it = iter_records(src, what="dataset", split="train", seed=1, required=("prompt", "answer"), id_field="id")
    first = [next(it) for _ in range(3)]
    assert all(r.fields["prompt"].startswith("reverse ") for r in first)
    assert first[0].where == "areal_cli.tasks.tiny_arith:records(train) item 1"


# ---------------------------------------------------------------------------------------- math-rl
def test_math_rl_reward_is_the_eval_grader_over_every_solution():
    from areal_cli.tasks import math_rl

    r1 = "<｜User｜>What is 1+1?<｜Assistant｜><think>\n"
    assert math_rl.reward(r1, "so 2</think>\n\\boxed{2}", [1], [2], solutions=["\\boxed{2}"]) == 1.0
    assert math_rl.reward(r1, "so 2</think>\nThe answer is \\boxed{\\frac{4}{2}}", [1], [2], solutions=["2"]) == 1.0
    # an answer boxed only inside the unfinished thinking is not the final answer (areal eval's rule)
    assert math_rl.reward(r1, "maybe \\boxed{2} hmm", [1], [2], solutions=["\\boxed{2}"]) == 0.0
    assert math_rl.reward(r1, "</think>\\boxed{-3, 3}", [1], [2], solutions=["\\boxed{3, -3}", "\\boxed{0}"]) == 1.0
    assert math_rl.reward(r1, "</think>\\boxed{5}", [1], [2], solutions=["\\boxed{3}", "\\boxed{4}"]) == 0.0
    assert math_rl.reward("plain prompt", "\\boxed{7}", [1], [2], solutions=["\\boxed{7}"], task="math") == 1.0


def test_math_rl_records_are_checked_as_upstream():
    from areal_cli.tasks.math_rl import check_record

    check_record({"prompt": "x", "task": "math", "query_id": "a", "solutions": ["\\boxed{1}"]})
    check_record({"prompt": "x", "query_id": 3, "solutions": ["1"]})  # a missing task means math
    for bad, msg in (({"prompt": "x", "task": "code", "solutions": ["1"]}, "field 'task'"),
                     ({"prompt": "x", "solutions": []}, "field 'solutions'"),
                     ({"prompt": "x", "solutions": "\\boxed{1}"}, "field 'solutions'"),
                     ({"prompt": 3, "solutions": ["1"]}, "field 'prompt'")):
        with pytest.raises(ValueError, match=msg):
            check_record(bad)


def test_mini_math_prompts_are_used_verbatim_with_r1_bos(tmp_path):
    from areal_cli.models.tiny import build_tiny_model, load_tokenizer
    from areal_cli.tasks.task import Task

    cfg = TrainConfig().with_values({"task.preset": "math-rl", "task.dataset": str(MINI_MATH),
                                     "task.prompt_template": "r1-distill", "task.heldout_fraction": 0.2})
    task = Task(cfg)
    tok = load_tokenizer(build_tiny_model(tmp_path / "m", corpus=task.tokenizer_corpus(), chat_template="r1"))
    task.bind(tok)
    raw = [json.loads(line) for line in MINI_MATH.read_text().splitlines()]
    items = task.heldout(50) + [next(task.train_stream()) for _ in range(3)]
    for item in items:
        rec = next(r for r in raw if r["query_id"] == item.id)
        assert item.prompt == rec["prompt"]  # detected as templated: not wrapped a second time
        assert item.prompt_ids[0] == tok.bos_token_id and item.prompt_ids.count(tok.bos_token_id) == 1
        assert tok.decode(item.prompt_ids[1:]) == rec["prompt"]
    # a plain record is wrapped by the protocol (R1's template with the boxed instruction)
    text, ids = task._renderer.render({"prompt": "What is 2+2?"}, "x:1")
    assert text.startswith("<｜User｜>What is 2+2?\nPlease reason step by step") and text.endswith("<think>\n")


# ---------------------------------------------------------------------------------------- code-rl
@pytest.mark.multiproc
def test_every_mini_code_reference_solution_passes_and_a_wrong_one_fails():
    from areal_cli.tasks import code_rl

    recs = [json.loads(line) for line in MINI_CODE.read_text().splitlines()]
    assert {bool(json.loads(r["input_output"])["fn_name"]) for r in recs} == {True, False}
    prompt = "<|im_start|>user\nq\n/think<|im_end|>\n<|im_start|>assistant\n<think>"
    for r in recs:
        code_rl.check_record(r)
        done = f"ok</think>\n```python\n{r['solutions'][0]}\n```"
        assert code_rl.reward(prompt, done, [1], [2], **reward_kwargs(r)) == 1.0, r["query_id"]
    wrong = "</think>\n```python\nprint('definitely not the answer')\n```"
    assert code_rl.reward(prompt, wrong, [1], [2], **reward_kwargs(recs[0])) == 0.0


@pytest.mark.multiproc
def test_code_rl_honours_a_tolerance_its_statement_declares():
    """The reward reads the tolerance from the prompt, as areal eval's loaders read it from the statement."""
    from areal_cli.tasks import code_rl

    io = json.dumps({"inputs": ["1 3\n"], "outputs": ["0.333333333\n"], "fn_name": ""})
    close = "```python\na, b = map(int, input().split())\nprint(f'{a / b:.7f}')\n```"  # 0.3333333: off by 3e-8
    far = "```python\na, b = map(int, input().split())\nprint(f'{a / b:.3f}')\n```"  # 0.333: off by 3e-4
    plain = "Print a/b."
    declared = "Print a/b. Your answer is considered correct if its absolute or relative error does not exceed 10^{-6}."
    assert code_rl.reward(plain, close, [1], [2], input_output=io) == 0.0  # exact without a declaration, as LCB
    assert code_rl.reward(declared, close, [1], [2], input_output=io) == 1.0
    assert code_rl.reward(declared, far, [1], [2], input_output=io) == 0.0


def test_code_records_are_checked_as_upstream():
    from areal_cli.tasks.code_rl import check_record

    ok = {"prompt": "p", "input_output": json.dumps({"inputs": ["1\n"], "outputs": ["2\n"], "fn_name": ""})}
    check_record(ok)
    for io, msg in ((json.dumps({"inputs": ["1"], "outputs": []}), "1 inputs but 0 outputs"),
                    ("{not json", "not JSON"),
                    (json.dumps({"inputs": ["1"], "outputs": ["1"], "remote": True}), "remote test files"),
                    (json.dumps({"inputs": ["[1, 2"], "outputs": ["3"], "fn_name": "f"}), "not one JSON value per line"),
                    (json.dumps({"inputs": [], "outputs": []}), "no test cases"),
                    ({"inputs": ["1"]}, "expected a JSON-encoded string")):
        with pytest.raises(ValueError, match=msg):
            check_record({**ok, "input_output": io})
    with pytest.raises(ValueError, match="field 'language'"):
        check_record({**ok, "language": "CPP"})


def test_prompts_over_max_prompt_len_are_dropped_and_counted(tmp_path):
    from itertools import islice

    from areal_cli.models.tiny import build_tiny_model, load_tokenizer
    from areal_cli.tasks.task import Task

    cfg = TrainConfig().with_values({"task.preset": "math-rl", "task.dataset": str(MINI_MATH),
                                     "task.prompt_template": "r1-distill", "task.heldout_fraction": 0.0})
    task = Task(cfg)
    tok = load_tokenizer(build_tiny_model(tmp_path / "m", corpus=task.tokenizer_corpus(), chat_template="r1"))
    lengths = sorted(len(task.bind(tok).item(r).prompt_ids) for r in task.train_records)
    limit = lengths[len(lengths) // 2]
    task = Task(cfg.with_values({"task.max_prompt_len": limit})).bind(tok)
    items = list(islice(task.train_stream(), 60))
    assert all(len(i.prompt_ids) <= limit for i in items) and task.dropped_too_long > 0
    # a limit no prompt fits is found when the tokenizer is bound, before the run starts
    with pytest.raises(UserError, match=r"field 'task.max_prompt_len': every prompt of .* checked \(41\) is longer than 3"):
        Task(cfg.with_values({"task.max_prompt_len": 3})).bind(tok)


def test_a_record_without_the_warm_starts_target_says_missing_and_names_the_setting(tmp_path):
    from areal_cli.models.tiny import build_tiny_model, load_tokenizer
    from areal_cli.tasks.task import Task

    data = tmp_path / "trl.jsonl"  # TRL-style records: the target is in "solution", not "answer"
    data.write_text("".join(json.dumps({"question": f"{i}+1?", "solution": str(i + 1)}) + "\n" for i in range(6)))
    (tmp_path / "r.py").write_text("def reward(prompt, completion, prompt_ids, completion_ids, **fields):\n    return 0.0\n")
    cfg = TrainConfig().with_values({"task.preset": "custom", "task.dataset": str(data), "task.prompt_field": "question",
                                     "task.reward": f"{tmp_path / 'r.py'}:reward", "task.heldout_fraction": 0.0,
                                     "sft.target_field": "answer"})
    task = Task(cfg)
    task.bind(load_tokenizer(build_tiny_model(tmp_path / "m", corpus=task.tokenizer_corpus())))
    with pytest.raises(UserError) as e:
        task.sft_examples(4)
    assert_one_line(str(e.value))
    assert re.fullmatch(rf"{re.escape(str(data))}:\d: field 'answer': missing; the warm start's target is read from it "
                        r"\(sft.target_field; this record has 'question', 'solution'; -o sft.target_field=NAME, or "
                        r"-o sft.max_steps=0 for no warm start\)", str(e.value))
    assert [t for _, t in Task(cfg.with_values({"sft.target_field": "solution"})).bind(task.tokenizer)
            .sft_examples(2)] != []

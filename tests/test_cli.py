"""The command line: bad input gives one line, exit 2, no traceback, nothing half-written."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from areal_cli.commands.main import main
from areal_cli.config import TrainConfig, apply_overrides
from areal_cli.recipes import load_train_config
from helpers.one_line import cli_error_line


def run(args):
    res = CliRunner().invoke(main, args)
    return res.exit_code, res.output


@pytest.mark.multiproc
def test_help_does_not_import_torch():
    code = (
        "import sys; from click.testing import CliRunner; from areal_cli.commands.main import main; "
        "r = CliRunner().invoke(main, ['--help']); assert r.exit_code == 0; "
        "assert 'train' in r.output and 'eval' in r.output; "
        "bad = [m for m in ('torch', 'transformers', 'megatron') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.multiproc
def test_python_dash_m_areal_cli_is_the_areal_command():
    r = subprocess.run([sys.executable, "-m", "areal_cli", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("Usage: areal ") and "reproduce" in r.stdout, r.stderr


def test_unknown_recipe(tmp_path):
    cli_error_line(*run(["train", "no-such-recipe", "--out", str(tmp_path / "o")]),
                          "unknown recipe 'no-such-recipe'", "tiny-arith")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "override,needles",
    [
        ("no_such_key=1", ["field 'no_such_key'", "unknown key"]),
        ("rollout.batch_size=abc", ["field 'rollout.batch_size'", "expected int"]),
        ("rollout.max_head_offpolicyness=-1", ["field 'rollout.max_head_offpolicyness'", ">= 0"]),
        ("sft.stop_accuracy=0.7", ["field 'sft.stop_accuracy'", "0.5"]),
        ("lr", ["expected key=value"]),
    ],
)
def test_invalid_override(tmp_path, override, needles):
    cli_error_line(*run(["train", "--out", str(tmp_path / "o"), "-o", override]), *needles)
    assert not (tmp_path / "o").exists()


def test_recipe_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("recipe: x\nbatch_size: 4\nbogus: 1\n")
    cli_error_line(*run(["train", str(bad), "--out", str(tmp_path / "o")]), f"{bad}:3", "field 'bogus'")
    bad.write_text("recipe: x\ngroup_size: [1, 2]\n")
    cli_error_line(*run(["train", str(bad), "--out", str(tmp_path / "o")]), f"{bad}:2", "field 'rollout.group_size'")
    bad.write_text("recipe: x\n  : : :\n")
    cli_error_line(*run(["train", str(bad), "--out", str(tmp_path / "o")]), str(bad), "invalid YAML")


def test_existing_run_dir_is_not_overwritten(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    cli_error_line(*run(["train", "--out", str(out), "--max-steps", "1"]), "already holds a run")
    assert (out / "metrics.jsonl").read_text() == '{"step": 0}\n'


def test_shipped_recipe_is_valid_and_overrides_apply():
    cfg, path = load_train_config("tiny-arith")
    assert path.name == "tiny-arith.yaml" and cfg.recipe == "tiny-arith"
    cfg2 = apply_overrides(cfg, ["rollout.max_head_offpolicyness=0", "ppo.lr=1e-4", "ppo.recompute_proximal=false"])
    assert (cfg2.rollout.max_head_offpolicyness, cfg2.ppo.lr, cfg2.ppo.recompute_proximal) == (0, 1e-4, False)
    assert cfg.rollout.max_head_offpolicyness != 0 or cfg2 is not cfg  # the loaded recipe is not mutated
    r = TrainConfig().rollout
    assert r.effective_max_concurrent == r.batch_size * (r.max_head_offpolicyness + 1)


def _eval(tmp_path, data_dir, *extra):
    return run(["eval", "--data", "aime24", "--data-dir", str(data_dir), "--out", str(tmp_path / "out"), *extra])


def test_eval_unknown_dataset(tmp_path):
    code, out = run(["eval", "--data", "aime24,gsm9k", "--data-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    cli_error_line(code, out, "gsm9k", "aime24")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_eval_missing_file(tmp_path):
    cli_error_line(*_eval(tmp_path, tmp_path), "aime24.jsonl", "not found")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_eval_malformed_jsonl_line(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "aime24.jsonl").write_text(json.dumps({"id": 1, "problem": "p", "answer": "1"}) + "\n{not json\n")
    cli_error_line(*_eval(tmp_path, d), f"{d / 'aime24.jsonl'}:2")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_eval_record_without_answer(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "aime24.jsonl").write_text(json.dumps({"id": 1, "problem": "p"}) + "\n")
    cli_error_line(*_eval(tmp_path, d), f"{d / 'aime24.jsonl'}:1", "field 'answer'")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.multiproc
def test_bad_input_via_console_script_has_no_traceback(tmp_path):
    exe = Path(sys.executable).with_name("areal")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "areal_cli.commands.main"]
    p = subprocess.run(cmd + ["train", "nope", "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "Traceback" not in p.stderr


def test_more_bad_inputs_are_one_line(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00recipe")
    cli_error_line(*run(["train", str(binary), "--out", str(tmp_path / "o")]), str(binary), "UTF-8")
    dup = tmp_path / "dup.yaml"
    dup.write_text("batch_size: 32\nbatch_size: 16\n")
    cli_error_line(*run(["train", str(dup), "--out", str(tmp_path / "o")]), f"{dup}:2", "duplicate key")
    rng = tmp_path / "range.yaml"
    rng.write_text("recipe: r\nrollout:\n  max_new_tokens: 0\n")
    cli_error_line(*run(["train", str(rng), "--out", str(tmp_path / "o")]), f"{rng}:3", "rollout.max_new_tokens")
    rng.write_text("recipe: r\nmax_new_tokens: 0\n")  # a flat name of earlier releases: the error alone, one line
    cli_error_line(*run(["train", str(rng), "--out", str(tmp_path / "o")]), f"{rng}:2", "rollout.max_new_tokens")
    afile = tmp_path / "afile"
    afile.write_text("x")
    cli_error_line(*run(["train", "--out", str(afile)]), "not a directory")
    cli_error_line(*run(["train", "--out", str(tmp_path / "o"), "-o", "loop.target_accuracy=2"]), "target_accuracy")
    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
    (interrupted / "config.json").write_text("{}")
    cli_error_line(*run(["train", "--out", str(interrupted)]), "already holds a run")


def test_eval_refuses_to_overwrite_results(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("{}")
    (tmp_path / "aime24.jsonl").write_text(json.dumps({"id": 1, "problem": "p", "answer": "1"}) + "\n")
    code, text = run(["eval", "--data", "aime24", "--data-dir", str(tmp_path), "--out", str(out)])
    cli_error_line(code, text, "already holds results.json")
    assert (out / "results.json").read_text() == "{}"


def _math_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "aime24.jsonl").write_text(json.dumps({"id": 1, "problem": "p", "answer": "1"}) + "\n")
    return d


@pytest.mark.parametrize(
    "args,needles",
    [
        ([], ["option '--data' is required"]),
        (["--data", "aime24"], ["benchmark 'aime24' is read from a local file: pass --data-dir"]),
        (["--data", "aime24", "--data-dir", "{data}", "--protocol", "r2"], ["unknown protocol 'r2'", "chat-template"]),
        (["--data", "aime24", "--data-dir", "{data}", "--top-p", "0"], ["option 'top_p': must be in (0, 1], got 0.0"]),
        (["--data", "aime24", "--data-dir", "{data}", "--protocol", "qwen3-think-pure"],
         ["protocol 'qwen3-think-pure' is for code benchmarks; 'aime24' is a math benchmark"]),
        (["--regrade", "{data}/none.jsonl"], ["none.jsonl: generations file not found"]),
        (["--regrade", "{data}/aime24.jsonl", "--server-url", "http://x"], ["does not take --server-url"]),
        # a server that is not there: refused at once, not after the 600 s a generation waits for a server
        (["--data", "aime24", "--data-dir", "{data}", "--server-url", "http://127.0.0.1:9", "--model", "{data}"],
         ["option 'server_url': http://127.0.0.1:9 does not answer GET /model_info", "is the server running?"]),
    ],
)
def test_eval_bad_options_are_one_line_and_write_nothing(tmp_path, args, needles):
    data = _math_dir(tmp_path)
    args = [a.replace("{data}", str(data)) for a in args]
    cli_error_line(*run(["eval", *args, "--out", str(tmp_path / "out")]), *needles)
    assert not (tmp_path / "out").exists()


def test_eval_undecodable_code_tests_name_file_line_and_problem(tmp_path):
    import base64

    src = Path(__file__).resolve().parent / "data" / "benchmarks" / "lcb_v5.jsonl"
    rows = [json.loads(line) for line in src.read_text().splitlines()]
    rows[1]["private_test_cases"] = base64.b64encode(b"not zlib").decode()
    d = tmp_path / "data"
    d.mkdir()
    (d / "lcb_v5.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out = run(["eval", "--data", "lcb_v5", "--data-dir", str(d), "--out", str(tmp_path / "out")])
    cli_error_line(code, out, f"{d / 'lcb_v5.jsonl'}:2: problem '{rows[1]['question_id']}': undecodable tests")
    assert not (tmp_path / "out").exists()

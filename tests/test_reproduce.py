"""``areal reproduce``: the plan of every shipped recipe, allocation split, hour estimates, the pass/fail table,
bad input (one line, exit 2, nothing written or overwritten), the eval-only path with a stand-in download and
evaluation, and the CPU recipe end to end (the CI regression of tiny-arith's expected numbers)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from areal_cli.reproduce import download as dl
from areal_cli.foundations.errors import UserError
from areal_cli.eval import runner
from areal_cli.recipes import Measured, allocation_gpus, compare, load_recipe, recipe_names
from areal_cli.recipes.placement import parse_allocation
from areal_cli.reproduce import (
    check_checkpoint,
    estimate_hours,
    eval_groups,
    exit_code_for,
    make_plan,
    measured_from_training,
    relevant_entries,
    render_checks,
    reproduce,
    rough_hours,
)
from areal_cli.commands.reproduce import reproduce as reproduce_cmd
from helpers.consoles import quiet_console, text_of
from helpers.one_line import assert_one_line, one_line_error

SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"


# --- plan --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", recipe_names())
def test_dry_run_plans_every_shipped_recipe_and_writes_nothing(name, tmp_path):
    recipe = load_recipe(name)
    console = quiet_console()
    out = tmp_path / "never"
    outcome = reproduce(name, dry_run=True, out_dir=out, console=console, gpus_here=0)
    text = text_of(console)
    assert outcome.exit_code == 0 and outcome.checks == [] and not out.exists()
    plan = outcome.plan
    assert plan.gpus_needed == recipe.file.resources.gpus
    if recipe.file.resources.allocation:
        assert plan.allocation.total == recipe.file.resources.gpus
        assert recipe.file.resources.allocation in text
        # placed on the published nodes: every GPU of every node used, each line of the summary printed
        r = recipe.file.resources
        assert (plan.placement.nodes, plan.placement.gpus_per_node) == (r.nodes, r.gpus_per_node)
        assert sum(s.gpus_used for s in plan.placement.summary()) == r.gpus
        flat = " ".join(text.split())
        for line in plan.placement.describe()[:4]:
            assert " ".join(line.split()) in flat, line
    for ref in (recipe.file.model, recipe.file.data):
        assert (ref.builtin or ref.repo) in text
        if ref.revision:
            assert ref.revision in text
    for m in plan.expected:
        assert m.key in text
    assert plan.hours.text().split(" (")[0] in " ".join(text.split())
    if recipe.trainer == "gpu":
        assert plan.blocker and f"needs {recipe.file.resources.gpus} GPUs" in plan.blocker
        assert "refused here" in text
    else:
        assert plan.blocker is None and "train on this machine" in text


@pytest.mark.parametrize("name", [n for n in recipe_names() if load_recipe(n).file.published_model is not None])
def test_eval_only_plan_runs_each_supported_benchmark_with_the_recipe_settings(name):
    recipe = load_recipe(name)
    plan = make_plan(recipe, eval_only=True, gpus_here=0)
    ev = recipe.file.eval
    assert plan.blocker is None and [it.role for it in plan.downloads] == ["published"]
    assert {g.benchmark for g in plan.eval_groups} == {b for b in ev.benchmarks if b != "gpqa_diamond"}
    for g in plan.eval_groups:
        assert g.settings["protocol"] == ev.protocol and g.settings["n_samples"] == ev.n_samples
        if g.benchmark in ev.date_windows:
            assert "..".join(g.date_window) == ev.date_windows[g.benchmark]
    assert all(m.model == "published" for m in plan.expected)


@pytest.mark.parametrize("allocation, inference, training", [
    ("sglang.d80m2p1+d4m2p4", 160, 32),  # boba2-8b-code: 80 TP2 servers + DP4 x TP2 x PP4
    ("sglang.d80m4p1+d4p8m2", 320, 64),  # boba2-14b-code
    ("sglang.d64p1m1+d32p2m1", 64, 64),
    ("d32p1m4", 0, 128),  # SFT: no generation part
])
def test_allocation_counts_inference_and_training_gpus_as_the_recipe_check_does(allocation, inference, training):
    a = parse_allocation(allocation)
    assert (a.inference_gpus, a.training_gpus) == (inference, training)
    assert a.total == allocation_gpus(allocation)


def test_allocation_describes_each_part_with_its_degrees():
    assert parse_allocation("sglang.d80m2p1+d4m2p4").describe() == \
        "160 inference (sglang: d80 x m2 x p1) + 32 training (d4 x m2 x p4)"


def test_dry_run_places_the_14b_recipe_on_its_48_nodes():
    console = quiet_console()
    plan = reproduce("boba2-14b-code", dry_run=True, console=console, gpus_here=0).plan
    p = plan.placement
    assert len(p.servers) == 80 and all(len(g) == 4 for _, g in p.servers)
    assert {n for n, _ in p.servers} == set(range(40)) and p.training_nodes == list(range(40, 48))
    assert len(p.trainer_ranks) == 64
    flat = " ".join(text_of(console).split())
    assert "80 sglang servers (tp 4, pp 1; 4 GPUs each) on nodes 0-39" in flat
    assert "384 of 384 GPUs placed" in flat and "torchrun --nnodes 8" in flat


def test_dry_run_places_on_other_hardware_given_on_the_command_line():
    console = quiet_console()
    plan = reproduce("boba2-8b-code", dry_run=True, console=console, gpus_here=0, nodes=12, gpus_per_node=16).plan
    assert (plan.placement.nodes, plan.placement.gpus_per_node) == (12, 16)
    assert plan.placement.training_nodes == [10, 11]
    assert "192 of 192 GPUs placed" in " ".join(text_of(console).split())


@pytest.mark.parametrize("args, needles", [
    (["boba2-14b-code", "--dry-run", "--nodes", "2", "--gpus-per-node", "8"],
     ["allocation 'sglang.d80m4p1+d4p8m2' needs 384 GPUs", "2 nodes x 8 GPUs = 16"]),
    (["boba2-14b-code", "--dry-run", "--nodes", "192", "--gpus-per-node", "2"],
     ["one sglang server uses tp*pp = 4 GPUs, more than a node's 2"]),
    # 384 GPUs are there, but a TP4 server per 6-GPU node leaves 2 idle: 80 + 11 nodes are needed
    (["boba2-14b-code", "--dry-run", "--nodes", "64", "--gpus-per-node", "6"],
     ["does not fit on 64 x 6 GPUs", "takes 91 nodes"]),
    (["async-7b-math", "--dry-run", "--nodes", "4"], ["publishes no allocation string"]),
    (["boba2-8b-code", "--nodes", "4"], ["--dry-run only"]),
])
def test_impossible_placement_on_the_command_line_is_one_line_exit_2(args, needles):
    one_line_error(CliRunner().invoke(reproduce_cmd, args), *needles)


def test_published_wall_clock_hours_are_used_when_the_expected_file_has_them():
    recipe = load_recipe("async-7b-math")
    assert estimate_hours(recipe).hours == 25.4 and estimate_hours(recipe, "sync").hours == 57.7
    assert estimate_hours(recipe).basis.startswith("published:")


def test_rough_hours_rule_is_within_3x_of_the_other_published_run():
    anchor, other = load_recipe("async-7b-math"), load_recipe("async-1.5b-math")
    for variant, published in ((None, 14.8), ("sync", 41.0)):
        est = rough_hours(other, variant, anchor)
        assert published / 3 <= est.hours <= published * 3, (variant, est)
        assert est.basis.startswith("rough")


def test_hours_of_a_recipe_without_total_steps_are_given_per_100_steps():
    est = estimate_hours(load_recipe("boba2-14b-code"))
    assert est.hours is None and est.per_100_steps > 0 and "steps not published" in est.basis


# --- comparison table ----------------------------------------------------------------------------------


def test_check_table_shows_pass_fail_and_skipped_and_a_regression_exits_1():
    recipe = load_recipe("boba-rl-7b-math")
    checks = compare(recipe.expected, {"aime24/pass@1": Measured(61.0), "aime25/pass@1": Measured(30.0),
                                       "gpqa_diamond/pass@1": Measured(47.6)}, mode="eval_only")
    status = {c.key: c.status for c in checks}
    assert status == {"aime24/pass@1": "pass", "aime25/pass@1": "fail", "gpqa_diamond/pass@1": "skipped"}
    console = quiet_console()
    render_checks(checks, console, "boba-rl-7b-math")
    text = text_of(console)
    for needle in ("aime24/pass@1", "61.9%", "±6.65 pt", "61.0%", "PASS", "FAIL", "skipped",
                   "FAIL: 1 passed, 1 failed, 1 skipped"):
        assert needle in text, needle
    assert exit_code_for(checks) == 1


def test_gpqa_is_never_evaluated_nor_passed():
    recipe = load_recipe("boba-rl-7b-math")
    entries = relevant_entries(recipe, "eval_only", "published", None)
    assert "gpqa_diamond" not in {g.benchmark for g in eval_groups(recipe, entries, {})}
    (row,) = [c for c in compare(recipe.expected, {"gpqa_diamond/pass@1": 47.6}) if c.benchmark == "gpqa_diamond"]
    assert row.status == "skipped"


def test_nothing_checked_is_not_a_pass():
    recipe = load_recipe("boba-rl-7b-math")
    only_skipped = compare(recipe.expected, {}, mode="eval_only")
    assert {c.status for c in only_skipped} == {"skipped"} and exit_code_for(only_skipped) == 1
    passed = compare(recipe.expected, {"aime24/pass@1": 61.9}, mode="eval_only")
    assert exit_code_for(passed) == 0


def test_training_figures_are_the_best_and_the_last_held_out_accuracy():
    recipe = load_recipe("tiny-arith")
    rows = [{"step": 0, "accuracy": 0.4}, {"step": 1, "accuracy": 0.93}, {"step": 2, "accuracy": 0.91}]
    measured, why = measured_from_training(recipe.expected.metrics, {"final_accuracy": 0.91, "elapsed_s": 90}, rows, 128)
    assert why == {}
    assert measured["tiny-arith/max_accuracy"].value == 0.93
    assert measured["tiny-arith/final_accuracy"].value == 0.91
    assert all(c.status == "pass" for c in compare(recipe.expected, measured, mode="retrain"))
    stalled, _ = measured_from_training(recipe.expected.metrics, {"final_accuracy": 0.7}, [{"accuracy": 0.7}], 128)
    checks = compare(recipe.expected, stalled, mode="retrain")
    assert {c.key: c.status for c in checks} == {"tiny-arith/max_accuracy": "fail", "tiny-arith/final_accuracy": "fail"}


# --- bad input: one line, exit 2, nothing written ------------------------------------------------------


def test_unknown_recipe_is_one_line_and_exit_2(tmp_path):
    res = CliRunner().invoke(reproduce_cmd, ["no-such-recipe", "--out", str(tmp_path / "o")])
    one_line_error(res, "unknown recipe 'no-such-recipe'", "tiny-arith")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, needle", [
    (["tiny-arith", "-o", "no_such_key=1"], "no_such_key"),
    (["tiny-arith", "-o", "loop.max_steps=-3"], "max_steps"),
    (["tiny-arith", "-o", "max_steps"], "key=value"),
    (["boba2-8b-code", "--eval-only", "-o", "n_samples=many"], "n_samples"),
    (["boba2-8b-code", "--eval-only", "-o", "ppo.lr=1e-5"], "unknown eval setting"),
    (["boba2-8b-code", "--eval-only", "-o", "protocol=chatty"], "unknown protocol"),
    (["boba2-8b-code", "--eval-only", "-o", "rollout.temperature=-1"], "temperature"),
    (["boba2-8b-code", "-o", "nope=1e-5"], "field 'nope': unknown key"),
    (["boba-sft-32b", "-o", "ppo.lr=1e-5"], "supervised fine-tuning"),
    (["tiny-arith", "--variant", "sync"], "no variant 'sync'"),
])
def test_invalid_overrides_are_one_line_and_write_nothing(tmp_path, args, needle):
    out = tmp_path / "o"
    res = CliRunner().invoke(reproduce_cmd, [*args, "--out", str(out)])
    one_line_error(res, needle)
    assert not out.exists()


def test_an_out_dir_holding_a_reproduction_is_refused_and_left_untouched(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "manifest.json").write_text("earlier run\n")
    res = CliRunner().invoke(reproduce_cmd, ["tiny-arith", "--out", str(out)])
    one_line_error(res, str(out), "already holds a reproduction (manifest.json)")
    assert (out / "manifest.json").read_text() == "earlier run\n" and sorted(os.listdir(out)) == ["manifest.json"]


def test_a_gpu_recipe_without_its_gpus_is_refused_in_one_line(tmp_path):
    res = CliRunner().invoke(reproduce_cmd, ["boba2-14b-code", "--out", str(tmp_path / "o")])
    line = one_line_error(res, "recipe boba2-14b-code needs 384 GPUs (allocation sglang.d80m4p1+d4p8m2); "
                               "this machine has ", "use --dry-run, --eval-only, or `areal launch slurm")
    assert not (tmp_path / "o").exists(), line


def test_eval_only_of_a_recipe_without_a_published_checkpoint_points_to_the_base_model(tmp_path):
    res = CliRunner().invoke(reproduce_cmd, ["async-7b-math", "--eval-only", "--out", str(tmp_path / "o")])
    one_line_error(res, "no published checkpoint", "--subject base")
    res = CliRunner().invoke(reproduce_cmd, ["tiny-arith", "--eval-only", "--out", str(tmp_path / "o")])
    one_line_error(res, "no published checkpoint", "without --eval-only")
    assert not (tmp_path / "o").exists()


def test_eval_only_refuses_an_unpinned_checkpoint_without_allow_unpinned(tmp_path, monkeypatch):
    import huggingface_hub

    def no_network(*a, **k):  # pragma: no cover - the refusal comes first
        raise AssertionError("snapshot_download must not be called")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    res = CliRunner().invoke(reproduce_cmd, ["boba2-8b-code", "--eval-only", "--out", str(tmp_path / "o")])
    one_line_error(res, "inclusionAI/AReaL-boba-2-8B", "no pinned revision", "--allow-unpinned")
    assert not (tmp_path / "o").exists()


def test_eval_only_offline_fails_with_the_download_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(runner, "run_eval", lambda *a, **k: pytest.fail("evaluated without a checkpoint"))
    res = CliRunner().invoke(reproduce_cmd, ["boba2-8b-code", "--eval-only", "--allow-unpinned",
                                             "--out", str(tmp_path / "o")])
    one_line_error(res, "cannot reach the Hugging Face hub", "inclusionAI/AReaL-boba-2-8B")
    assert not (tmp_path / "o").exists()


# --- checkpoints ---------------------------------------------------------------------------------------


def write_checkpoint(folder: Path, *, truncate: int = 0) -> Path:
    """A minimal Hugging Face folder: config.json + one safetensors file with one 4-float tensor."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"vocab_size": 16}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    blob = struct.pack("<Q", len(header)) + header + bytes(16)
    (folder / "model.safetensors").write_bytes(blob[: len(blob) - truncate])
    return folder


def test_a_complete_checkpoint_passes_the_check(tmp_path):
    check_checkpoint(write_checkpoint(tmp_path / "ok"))


@pytest.mark.parametrize("damage, needle", [
    ("truncate", "tensor 'w' ends at byte 16"),
    ("config", "config.json is not valid JSON"),
    ("no_config", "needs config.json"),
    ("header", "header length"),
    ("shard", "shard model-00002-of-00002.safetensors"),
])
def test_a_corrupted_checkpoint_is_refused_in_one_line(tmp_path, damage, needle):
    ck = write_checkpoint(tmp_path / "ck", truncate=4 if damage == "truncate" else 0)
    if damage == "config":
        (ck / "config.json").write_text("{not json")
    elif damage == "no_config":
        (ck / "config.json").unlink()
    elif damage == "header":
        (ck / "model.safetensors").write_bytes(struct.pack("<Q", 10**6) + b"{}")
    elif damage == "shard":
        (ck / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"w": "model.safetensors", "v": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(UserError) as e:
        check_checkpoint(ck)
    assert_one_line(str(e.value), needle)
    res = CliRunner().invoke(reproduce_cmd, ["boba2-8b-code", "--eval-only", "--model", str(ck),
                                             "--out", str(tmp_path / "o")])
    one_line_error(res, needle)
    assert not (tmp_path / "o").exists()


# --- eval-only with a stand-in download and evaluation --------------------------------------------------


class FakeEval:
    """Stands in for ``areal eval``: records each call, returns ``results`` for the asked benchmark."""

    def __init__(self, results: dict):
        self.results, self.calls = results, []

    def __call__(self, datasets, data_dir, model_dir=None, **kw):
        self.calls.append({"datasets": list(datasets), "data_dir": data_dir, "model_dir": model_dir, **kw})
        Path(kw["out_dir"]).mkdir(parents=True)
        (Path(kw["out_dir"]) / "results.json").write_text("{}")
        return {"config": {}, datasets[0]: self.results[datasets[0]]}


def stand_ins(tmp_path, monkeypatch, results: dict) -> tuple[FakeEval, list]:
    ckpt = write_checkpoint(tmp_path / "hub" / "models--x" / "snapshots" / SNAPSHOT)
    downloads = []

    def fake_download(target, **kw):
        downloads.append((target, kw))
        return {kw["roles"][0]: ckpt}

    fake = FakeEval(results)
    monkeypatch.setattr(dl, "download", fake_download)
    monkeypatch.setattr(runner, "load_selected", lambda names, data_dir, **kw: ({}, {}))
    monkeypatch.setattr(runner, "run_eval", fake)
    return fake, downloads


CODE_RESULTS = {  # fractions, as areal eval writes them
    "lcb_v5": {"pass@1": 0.70, "n_problems": 279, "n_samples": 8},
    "codecontests": {"pass@1": 0.30, "n_problems": 165, "n_samples": 8},
    "codeforces": {"pass@1": 0.4, "n_problems": 400, "n_samples": 8, "codeforces": {"rating": "needs --cf-data DIR"}},
}


@pytest.mark.multiproc
def test_eval_only_downloads_the_checkpoint_evaluates_each_benchmark_and_reports_a_regression(tmp_path, monkeypatch):
    fake, downloads = stand_ins(tmp_path, monkeypatch, CODE_RESULTS)
    out, data = tmp_path / "o", tmp_path / "data"
    data.mkdir()
    console = quiet_console()
    outcome = reproduce("boba2-14b-code", eval_only=True, out_dir=out, allow_unpinned=True, data_dir=data,
                        console=console, command=["areal", "reproduce", "boba2-14b-code", "--eval-only"])
    assert downloads == [(str(load_recipe("boba2-14b-code").path), {"roles": ("published",), "allow_unpinned": True})]
    assert [c["datasets"] for c in fake.calls] == [["lcb_v5"], ["codeforces"], ["codecontests"]]
    lcb = fake.calls[0]
    assert (lcb["protocol"], lcb["n"], lcb["temperature"], lcb["top_p"], lcb["max_new_tokens"]) == \
        ("qwen3-think-pure", 8, 1.0, 0.95, 32768)
    assert (lcb["date_from"], lcb["date_to"]) == ("2024-10-01", "2025-02-01") and lcb["data_dir"] == data
    assert lcb["out_dir"] == out / "eval" / "lcb_v5" and lcb["model_dir"].name == SNAPSHOT

    status = {c.key: (c.status, c.reason) for c in outcome.checks}
    assert status["lcb_v5/pass@1"][0] == "pass"  # 70.0 vs 69.1, tolerance from the measured N = 279
    assert status["codecontests/pass@1"][0] == "fail"  # 30.0 vs 46.1
    assert status["codeforces/rating"] == ("skipped", "not measured: needs --cf-data DIR")
    assert outcome.exit_code == 1 and "FAIL: 1 passed, 1 failed, 2 skipped" in text_of(console)

    result = json.loads((out / "reproduce.json").read_text())
    assert result["mode"] == "eval_only" and result["exit_code"] == 1 and result["counts"]["fail"] == 1
    assert result["measured"]["lcb_v5/pass@1"] == {"value": 70.0, "n_problems": 279, "n_samples": 8}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["downloads"]["published"]["resolved_revision"] == SNAPSHOT
    assert manifest["status"] == "failed" and manifest["command"][:2] == ["areal", "reproduce"]


@pytest.mark.multiproc
def test_eval_only_of_the_base_model_checks_the_base_rows_and_passes(tmp_path, monkeypatch):
    results = {"aime24": {"pass@1": 0.55, "n_problems": 30, "n_samples": 32},
               "aime25": {"pass@1": 0.40, "n_problems": 30, "n_samples": 32}}
    fake, downloads = stand_ins(tmp_path, monkeypatch, results)
    outcome = reproduce("boba-rl-7b-math", eval_only=True, subject="base", out_dir=tmp_path / "o",
                        console=quiet_console())
    assert downloads[0][1]["roles"] == ("model",)
    assert {c["temperature"] for c in fake.calls} == {0.6}  # the base rows' eval_overrides
    assert {c.key: c.status for c in outcome.checks} == {
        "aime24/pass@1#base": "pass", "aime25/pass@1#base": "pass", "gpqa_diamond/pass@1#base": "skipped"}
    assert outcome.exit_code == 0


@pytest.mark.multiproc
def test_eval_settings_can_be_overridden_and_the_override_is_recorded(tmp_path, monkeypatch):
    fake, _ = stand_ins(tmp_path, monkeypatch, CODE_RESULTS)
    out = tmp_path / "o"
    reproduce("boba2-8b-code", eval_only=True, allow_unpinned=True, out_dir=out, overrides=["n_samples=2"],
              console=quiet_console())
    assert {c["n"] for c in fake.calls} == {2}
    assert json.loads((out / "manifest.json").read_text())["recipe"]["overrides"] == ["n_samples=2"]


# --- end to end (the CI regression of tiny-arith's expected numbers) -----------------------------------

@pytest.mark.multiproc
@pytest.mark.slow
def test_areal_reproduce_tiny_arith_trains_on_cpu_and_meets_the_expected_numbers(tmp_path):
    out = tmp_path / "rep"
    proc = subprocess.run([sys.executable, "-m", "areal_cli.commands.main", "reproduce", "tiny-arith", "--out", str(out), "--no-live"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "PASS: 2 passed, 0 failed, 0 skipped" in proc.stdout

    result = json.loads((out / "reproduce.json").read_text())
    assert result["passed"] and [c["status"] for c in result["checks"]] == ["pass", "pass"]
    assert result["measured"]["tiny-arith/max_accuracy"]["value"] >= 0.9
    summary = json.loads((out / "train" / "summary.json").read_text())
    assert summary["target_reached"] and result["measured"]["tiny-arith/final_accuracy"]["value"] == summary["final_accuracy"]

    manifest = json.loads((out / "manifest.json").read_text())
    recipe = load_recipe("tiny-arith")
    import hashlib

    assert manifest["recipe"]["sha256"] == hashlib.sha256(recipe.path.read_bytes()).hexdigest()
    assert manifest["model"] == {"repo": None, "revision": None, "builtin": "tiny-qwen3"}
    assert manifest["packages"]["torch"] and manifest["packages"]["megatron-core"] == "0.16.1"
    assert manifest["git"]["commit"] == "unknown" or len(manifest["git"]["commit"]) == 40
    assert manifest["hardware"]["cpu_count"] == os.cpu_count() and manifest["status"] == "passed"
    assert manifest["started_at"] <= manifest["finished_at"] and manifest["runs"] == {"train": "train"}


@pytest.mark.multiproc
def test_importing_the_command_is_light():
    code = ("import sys, areal_cli.commands.reproduce; "
            "print(sorted(m for m in ('torch', 'rich', 'huggingface_hub', 'transformers', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.multiproc
def test_a_failed_training_start_leaves_no_trace_and_a_failed_run_is_recorded(tmp_path, monkeypatch):
    import areal_cli.train_loop as tl

    def refuses(cfg, out, **kw):
        raise UserError("trainer_cpus '7': not available here")

    monkeypatch.setattr(tl, "run_training", refuses)
    with pytest.raises(UserError):
        reproduce("tiny-arith", out_dir=tmp_path / "o", console=quiet_console())
    assert not (tmp_path / "o").exists()

    def crashes(cfg, out, **kw):
        (out / "metrics.jsonl").parent.mkdir(parents=True)
        (out / "metrics.jsonl").write_text("")
        raise RuntimeError("reward pool died")

    monkeypatch.setattr(tl, "run_training", crashes)
    with pytest.raises(RuntimeError):
        reproduce("tiny-arith", out_dir=tmp_path / "o", console=quiet_console())
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["status"] == "error: reward pool died" and manifest["exit_code"] is None
    assert not (tmp_path / "o" / "reproduce.json").exists()


# --- what the evaluation needs (dry run) ---------------------------------------------------------------


def test_eval_only_dry_run_shows_gpus_memory_token_budget_time_cf_data_and_pin_commands():
    from areal_cli.eval.protocols import get_protocol
    from areal_cli.reproduce.eval_needs import (BF16_BYTES, EVAL_CONCURRENCY, GPU_MEMORY_GB, KNOWN_SHAPES,
                                                problem_count)
    from areal_cli.eval.benchmarks import load_benchmark_specs

    recipe = load_recipe("boba2-14b-code")
    console = quiet_console()
    plan = reproduce("boba2-14b-code", dry_run=True, eval_only=True, console=console, gpus_here=0).plan
    flat = " ".join(text_of(console).split())
    needs, ev = plan.eval_needs, recipe.file.eval
    shape = KNOWN_SHAPES[recipe.file.model.repo]
    assert abs(shape.params / 1e9 - 14.8) < 0.1  # the model card's count, from the published shape
    completions = ev.n_samples + int(get_protocol(ev.protocol).greedy_pass)
    specs = load_benchmark_specs()
    total = 0
    for g, b in zip(plan.eval_groups, needs.budgets):
        n, _, _ = problem_count(g.benchmark, g.date_window, plan.expected, specs)
        assert b.tokens == n * completions * ev.max_new_tokens
        total += b.tokens
        assert f"{g.name}: " in flat and f"x {ev.max_new_tokens:,} tokens = {b.tokens / 1e6:,.1f} M" in flat
    assert needs.total_tokens == total and f"{total / 1e6:,.1f} M new tokens" in flat
    weights = shape.params * BF16_BYTES / 1e9
    kv = EVAL_CONCURRENCY * (recipe.train.max_prompt_len + ev.max_new_tokens) * shape.kv_bytes_per_token / 1e9
    assert (round(needs.weights_gb, 1), round(needs.kv_gb, 1)) == (round(weights, 1), round(kv, 1))
    usable = GPU_MEMORY_GB * recipe.train.sglang_mem_fraction_static
    assert needs.gpus >= (weights + kv) / usable > needs.gpus / 2  # the smallest power of two that holds it
    assert f"{needs.gpus} x 80 GB" in flat and f"weights {weights:.1f} GB at bf16" in flat
    assert needs.hours == pytest.approx(total / needs.tokens_per_s / 3600)
    assert f"{needs.hours:.1f} h on {needs.gpus} GPUs" in flat and "TFLOP/s" in flat and "TB/s" in flat
    assert "codeforces/rating" in needs.cf_data and "--cf-data DIR" in flat
    published = recipe.file.published_model.repo
    assert f"areal download {published} --revision SHA --local-dir" in flat
    assert f"areal reproduce boba2-14b-code --eval-only --model checkpoints/{published.split('/')[1]}" in flat
    assert "huggingface-cli" not in flat
    # without --eval-only: the training plan stays, the evaluation section is there too
    console = quiet_console()
    plan = reproduce("boba2-14b-code", dry_run=True, console=console, gpus_here=0).plan
    flat = " ".join(text_of(console).split())
    assert "training time" in flat and "placement" in flat and plan.eval_needs is not None
    assert "eval tokens" in flat and "eval GPUs" in flat
    assert "areal download datasets/inclusionAI/AReaL-boba-2-RL-Code --revision SHA" in flat

"""A published locked recipe copied into a folder of one's own under another name runs with no bookkeeping edit:
its name is its file's, its expected-metrics file is found (the original's, or its own beside it), its relative
data paths are the original's; a GPU recipe this machine cannot run says every edit it needs in its first error,
one line; the shipped folder itself stays strict."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from areal_cli.commands.main import main
from areal_cli.config import apply_overrides
from areal_cli.foundations.errors import UserError
from areal_cli.recipes import (check_runs_here, gpu_recipe_edits, load_recipe, load_train_config, recipe_names,
                               train_config_from_recipe)
from helpers.one_line import assert_one_line, one_line_error

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
SHRINK = ["rollout.n_servers=1", "rollout.sglang_tp_size=1", "parallel.data=1", "parallel.tensor=1", "parallel.pipeline=1"]


def copy_as(dst_dir: Path, name: str, new: str, *, expected: str | None = None) -> Path:
    """``recipes/NAME.yaml`` copied byte for byte to ``dst_dir/NEW.yaml`` (and its expected file as ``expected``,
    when given)."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / f"{new}.yaml"
    shutil.copy(RECIPES / f"{name}.yaml", dst)
    if expected is not None:
        shutil.copy(RECIPES / f"{name}.expected.yaml", dst_dir / expected)
    return dst


@pytest.mark.parametrize("name", sorted(recipe_names()))
def test_every_locked_recipe_copied_under_another_name_loads_with_no_edit(tmp_path, name):
    path = copy_as(tmp_path / "mine", name, f"my-{name}")
    r = load_recipe(path)
    assert (r.name, r.copied_from, r.path) == (f"my-{name}", name, path)
    assert r.expected_path == RECIPES / f"{name}.expected.yaml"  # the original's, found in the shipped folder
    assert r.expected.recipe == name and r.expected.metrics
    if r.kind == "sft":
        with pytest.raises(UserError, match=f"`areal reproduce {path}` runs it"):
            train_config_from_recipe(r)
        return
    cfg = train_config_from_recipe(r)
    assert cfg.recipe == f"my-{name}"  # runs/my-NAME-<date>-<time>
    for variant in r.file.variants:
        assert train_config_from_recipe(r, variant).recipe == f"my-{name}"
    if r.trainer == "cpu":
        assert load_train_config(str(path))[0].to_dict() == cfg.to_dict()
        if cfg.task.dataset:
            assert Path(cfg.task.dataset).is_file()  # mini-math's data/boba-106k-mini.jsonl: the shipped file
        assert cfg.task.code_dir == str(path.parent.resolve())  # the user's own modules sit beside the copy


def test_a_copy_uses_its_own_expected_file_and_data_beside_it_before_the_originals(tmp_path):
    mine = tmp_path / "mine"
    path = copy_as(mine, "mini-math", "my-math", expected="my-math.expected.yaml")
    exp = mine / "my-math.expected.yaml"
    exp.write_text(exp.read_text().replace("recipe: mini-math", "recipe: my-math", 1))
    (mine / "data").mkdir()
    shutil.copy(RECIPES / "data" / "boba-106k-mini.jsonl", mine / "data" / "boba-106k-mini.jsonl")
    r = load_recipe(path)
    assert r.expected_path == exp and r.expected.recipe == "my-math"
    assert r.train.task.dataset == str((mine / "data" / "boba-106k-mini.jsonl").resolve())
    # the original's expected file copied beside it under its own name is found there too
    other = tmp_path / "other"
    copy_as(other, "mini-math", "my-math", expected="mini-math.expected.yaml")
    assert load_recipe(other / "my-math.yaml").expected_path == other / "mini-math.expected.yaml"


def test_an_expected_file_of_another_recipe_is_refused_with_what_to_do(tmp_path):
    path = copy_as(tmp_path, "tiny-arith", "my-arith")
    path.write_text(path.read_text().replace("\nrecipe: tiny-arith\n", "\nrecipe: my-arith\n"))  # renamed by hand
    with pytest.raises(UserError) as e:
        load_recipe(path)
    assert_one_line(str(e.value), "tiny-arith.expected.yaml:", "field 'recipe': must be 'my-arith' (got 'tiny-arith')",
                    "my-arith.expected.yaml with recipe: my-arith")


def test_the_shipped_folder_still_requires_recipe_to_equal_the_file_name(tmp_path, monkeypatch):
    import areal_cli.recipes.loader as loader

    shipped = tmp_path / "shipped"
    path = copy_as(shipped, "tiny-arith", "tiny-arith2", expected="tiny-arith.expected.yaml")
    monkeypatch.setattr(loader, "shipped_dir", lambda name: shipped)
    with pytest.raises(UserError, match=r"tiny-arith2.yaml:4: field 'recipe': must equal the file name "
                                        r"'tiny-arith2' \(got 'tiny-arith'\)"):
        load_recipe(path)


def test_a_copy_in_a_recipes_dir_is_listed_and_validated_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("AREAL_RECIPES_DIR", "")  # --recipes-dir sets it for the process: restored after the test
    mine = tmp_path / "mine"
    copy_as(mine, "tiny-arith", "my-arith")
    copy_as(mine, "boba2-8b-code", "my-code")
    res = CliRunner().invoke(main, ["--recipes-dir", str(mine), "train", "my-arith", "--list-settings",
                                    "-o", "rollout.group_size=3"])
    assert res.exit_code == 0, res.output
    assert "  recipe = 'my-arith'" in res.output and "  rollout.group_size = 3" in res.output
    res = CliRunner().invoke(main, ["--recipes-dir", str(mine), "reproduce", "my-code", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "areal reproduce my-code (plan)" in res.output and "my-code.yaml" in res.output


# --- GPU recipes: what is truly needed, all at once ------------------------------------------------------


def test_a_gpu_recipe_names_every_edit_it_needs_at_once_and_none_once_made(tmp_path):
    path = copy_as(tmp_path, "boba2-8b-code", "my-code")
    cfg, _ = load_train_config(str(path))
    r = load_recipe(path)
    edits = gpu_recipe_edits(r, cfg, gpus_here=0, sglang_installed=False)
    assert len(edits) == 4
    assert edits[0].startswith("-o model.path=DIR/model (its base model Qwen/Qwen3-8B: `areal download "
                               f"{path} --local-dir DIR`)")
    assert edits[1].startswith("-o task.dataset=DIR/data/train/train.jsonl")
    assert "-o rollout.engine=embedded -o rollout.server_max_running_requests=256 " \
           "-o rollout.server_max_total_tokens=65536" in edits[2]
    assert edits[3].startswith(" ".join(f"-o {o}" for o in SHRINK))
    assert "needs 192 GPUs on 24 node(s); this machine has 0" in edits[3]
    with pytest.raises(UserError) as e:
        check_runs_here(cfg, path, gpus_here=0, sglang_installed=False)
    assert_one_line(str(e.value), f"{path}: recipe 'my-code' (trainer gpu) cannot run here as written; it needs "
                                  "4 edits: (1) -o model.path=DIR/model", "; (4) -o rollout.n_servers=1")
    given = ["model.path=/models/qwen3-8b", "task.dataset=/data/train.jsonl"]
    # every edit made (the CPU engine, one server, one trainer rank): nothing more is asked
    small = apply_overrides(cfg, given + ["rollout.engine=embedded", "rollout.server_max_running_requests=256",
                                          "rollout.server_max_total_tokens=65536", *SHRINK])
    assert gpu_recipe_edits(r, small, gpus_here=0, sglang_installed=False) == []
    # a machine with the allocation's GPUs and SGLang needs only the local paths
    assert gpu_recipe_edits(r, cfg, gpus_here=192, sglang_installed=True) == edits[:2]
    assert gpu_recipe_edits(r, apply_overrides(cfg, given), gpus_here=192, sglang_installed=True) == []
    # servers started elsewhere (`areal launch`'s controller): not this machine's business
    assert gpu_recipe_edits(r, apply_overrides(cfg, given + ["rollout.engine=external"]), gpus_here=0,
                            sglang_installed=False) == []
    # an allocation that is not published leaves one server and one rank: no GPU count to meet
    r7 = load_recipe(copy_as(tmp_path, "async-7b-math", "my-7b"))
    assert len(gpu_recipe_edits(r7, train_config_from_recipe(r7), gpus_here=0, sglang_installed=False)) == 3
    cpu_cfg, cpu_path = load_train_config(str(copy_as(tmp_path, "tiny-arith", "my-arith")))
    check_runs_here(cpu_cfg, cpu_path, gpus_here=0, sglang_installed=False)  # CPU recipes: nothing to check


def test_the_cpu_engine_for_a_gpu_recipe_names_both_server_caps_in_one_line(tmp_path):
    cfg, _ = load_train_config(str(copy_as(tmp_path, "boba2-8b-code", "my-code")))
    with pytest.raises(UserError) as e:
        apply_overrides(cfg, ["rollout.engine=embedded"])
    assert_one_line(str(e.value), "-o rollout.engine=embedded: field 'rollout.server_max_running_requests': must be "
                                  "> 0 with rollout.engine embedded", "-o rollout.server_max_running_requests=256 "
                                  "-o rollout.server_max_total_tokens=65536 sets the embedded defaults (got 0)")


def test_areal_train_of_a_copied_gpu_recipe_on_this_machine_is_one_line_naming_every_edit(tmp_path):
    import importlib.util

    from areal_cli.foundations.manifest import gpu_count

    if gpu_count() >= 192 and importlib.util.find_spec("sglang") is not None:
        pytest.skip("this machine has the recipe's 192 GPUs and SGLang")
    path = copy_as(tmp_path / "mine", "boba2-8b-code", "my-code")
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["train", str(path), "--max-steps", "1", "--out", str(out), "--no-live"])
    one_line_error(res, f"{path}: recipe 'my-code' (trainer gpu) cannot run here as written", "-o model.path=DIR/model",
                   "-o task.dataset=DIR/data/train/train.jsonl", "-o parallel.pipeline=1")
    assert not out.exists()


@pytest.mark.multiproc
def test_areal_train_runs_a_copied_cpu_recipe_with_relative_data_from_another_folder(tmp_path):
    """mini-math names its data relative to its own folder; the copy, run from a third folder, reads it."""
    path = copy_as(tmp_path / "mine", "mini-math", "my-math")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "areal_cli", "train", str(path), "--max-steps", "1", "--out", str(out),
                        "--no-live"], capture_output=True, text=True, cwd=elsewhere, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1
    config = json.loads((out / "config.json").read_text())
    assert config["recipe"] == "my-math"
    assert config["task"]["dataset"] == str((RECIPES / "data" / "boba-106k-mini.jsonl").resolve())

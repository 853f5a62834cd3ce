"""``areal ls`` and ``areal download`` as commands: the catalogue table and JSON, one-line errors with exit 2,
and a light import (no huggingface_hub, rich or torch until a command runs)."""

from __future__ import annotations

import json
import subprocess
import sys

import huggingface_hub
import pytest
from click.testing import CliRunner

from areal_cli.commands.catalog import download, ls
from areal_cli.recipes import recipe_names
from helpers.one_line import one_line_error


def test_ls_shows_every_recipe_with_model_data_gpus_and_headline_numbers():
    res = CliRunner().invoke(ls, [])
    assert res.exit_code == 0, res.output
    for name in recipe_names():
        assert name in res.output
    for text in ("Qwen/Qwen3-14B", "inclusionAI/AReaL-RL-Data", "384", "CPU", "lcb_v5 69.1%", "codeforces 2044",
                 "aime24 61.9%", "train time 14.8 h", "train time 41.0 h (sync)", "tiny-arith >= 0.9",
                 "revision not pinned"):
        assert text in res.output, text


def test_ls_json_is_the_catalogue():
    res = CliRunner().invoke(ls, ["--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)}
    assert sorted(rows) == recipe_names()
    code = rows["boba2-8b-code"]
    assert (code["gpus"], code["allocation"], code["model"]["revision"]) == \
        (192, "sglang.d80m2p1+d4m2p4", "b968826d9c46dd6066d109eabc6255188de91218")
    assert [h["key"] for h in code["headline"]] == ["lcb_v5/pass@1", "codeforces/rating", "codecontests/pass@1"]
    assert rows["tiny-arith"]["trainer"] == "cpu" and rows["tiny-arith"]["model"]["builtin"] == "tiny-qwen3"


def test_ls_reports_a_broken_recipe_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "bad.yaml").write_text("recipe: bad\nkind: async-ppo\nflavour: sweet\n")
    monkeypatch.setenv("AREAL_RECIPES_DIR", str(tmp_path))
    one_line_error(CliRunner().invoke(ls, []), f"{tmp_path / 'bad.yaml'}:3: field 'flavour': unknown key")


def test_download_errors_are_one_line_and_exit_2():
    one_line_error(CliRunner().invoke(download, ["boba3"]), "unknown recipe 'boba3'")
    one_line_error(CliRunner().invoke(download, ["boba-sft-32b"]), "has no pinned revision", "--allow-unpinned")


def test_download_prints_where_each_part_went(tmp_path, monkeypatch):
    calls = []

    def fake(repo_id, **kw):
        calls.append(repo_id)
        return kw["local_dir"]

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    res = CliRunner().invoke(download, ["async-7b-math", "--local-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [f"model: {tmp_path / 'model'}", f"data: {tmp_path / 'data'}"]
    assert calls == ["deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "inclusionAI/AReaL-RL-Data"]
    res = CliRunner().invoke(download, ["tiny-arith"])
    assert res.exit_code == 0 and "nothing to download" in res.output


@pytest.mark.multiproc
def test_importing_the_commands_is_light():
    code = ("import sys, areal_cli.commands.catalog; "
            "bad = [m for m in ('huggingface_hub', 'rich', 'torch', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)

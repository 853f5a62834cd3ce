"""The reproduction manifest: recipe hash, revisions, package versions, git commit and dirty flag, hardware
(GPUs from nvidia-smi, honouring CUDA_VISIBLE_DEVICES), times; JSON-serialisable."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from areal_cli.foundations import manifest as mf
from areal_cli.recipes import load_recipe

SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.multiproc
def test_manifest_records_recipe_hash_revisions_versions_git_hardware_and_times(tmp_path):
    recipe = load_recipe("boba2-14b-code")
    snap = tmp_path / "models--inclusionAI--AReaL-boba-2-14B" / "snapshots" / SNAPSHOT
    snap.mkdir(parents=True)
    m = mf.build_manifest(recipe, mode="eval_only", subject="published", variant=None, overrides=["n_samples=2"],
                          command=["areal", "reproduce", "boba2-14b-code", "--eval-only"],
                          started_at="2025-01-01T00:00:00Z", finished_at="2025-01-01T01:00:00Z", elapsed_s=3600.0,
                          status="passed", exit_code=0, downloads={"published": snap, "local": tmp_path})
    m = json.loads(json.dumps(m))  # JSON-serialisable as written
    assert m["recipe"]["sha256"] == hashlib.sha256(recipe.path.read_bytes()).hexdigest()
    assert m["recipe"]["expected_sha256"] == hashlib.sha256(recipe.expected_path.read_bytes()).hexdigest()
    assert m["recipe"]["overrides"] == ["n_samples=2"] and m["mode"] == "eval_only"
    assert m["model"] == {"repo": "Qwen/Qwen3-14B", "revision": "40c069824f4251a91eefaf281ebe4c544efd3e18",
                          "builtin": None}
    assert m["published_model"]["repo"] == "inclusionAI/AReaL-boba-2-14B" and m["published_model"]["revision"] is None
    assert m["data"]["repo"] == "inclusionAI/AReaL-boba-2-RL-Code" and m["data"]["files"][0]["path"] == "train/train.jsonl"
    assert m["downloads"]["published"] == {"path": str(snap), "resolved_revision": SNAPSHOT}
    assert m["downloads"]["local"]["resolved_revision"] is None  # a plain folder names no commit
    for dist in ("torch", "megatron-core", "transformers", "math-verify", "areal-cli"):
        assert m["packages"][dist] == importlib.metadata.version(dist)
    assert m["git"]["commit"] == "unknown" or len(m["git"]["commit"]) == 40
    hw = m["hardware"]
    assert hw["cpu"] and hw["cpu_count"] == os.cpu_count() and 0 < hw["cpus_usable"] <= os.cpu_count()
    assert hw["memory_bytes"] > 2**28 and "gpus" in hw and hw["torch_cuda"]["torch"]
    assert m["python"] and m["platform"] and m["command"][1] == "reproduce"
    assert (m["started_at"], m["finished_at"], m["elapsed_s"], m["status"]) == \
        ("2025-01-01T00:00:00Z", "2025-01-01T01:00:00Z", 3600.0, "passed")


def test_git_info_outside_a_checkout_is_unknown(tmp_path):
    assert mf.git_info(tmp_path) == {"commit": "unknown", "dirty": None, "root": None}


@pytest.mark.multiproc
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_info_reads_the_commit_and_the_dirty_flag(tmp_path):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True,
                              env=env).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("1\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    (tmp_path / "untracked.txt").write_text("x\n")  # untracked files do not make it dirty
    assert mf.git_info(tmp_path) == {"commit": head, "dirty": False, "root": str(tmp_path)}
    (tmp_path / "a.txt").write_text("2\n")
    assert mf.git_info(tmp_path)["dirty"] is True


def fake_nvidia_smi(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-smi"
    exe.write_text("#!/bin/sh\necho '0, NVIDIA H200, 143771, 570.1'\necho '1, NVIDIA H200, 143771, 570.1'\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.multiproc
def test_gpus_come_from_nvidia_smi_and_respect_cuda_visible_devices(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = mf.nvidia_gpus()
    assert gpus == [{"index": 0, "name": "NVIDIA H200", "memory_mib": 143771, "driver": "570.1"},
                    {"index": 1, "name": "NVIDIA H200", "memory_mib": 143771, "driver": "570.1"}]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert mf.gpu_count() == 1 and mf.nvidia_gpus()[0]["index"] == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert mf.gpu_count() == 0


def test_no_nvidia_driver_means_no_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi on it
    assert mf.nvidia_gpus() is None and mf.gpu_count() == 0


def test_snapshot_revision_is_the_cache_folder_commit(tmp_path):
    assert mf.snapshot_revision(tmp_path / "snapshots" / SNAPSHOT) == SNAPSHOT
    assert mf.snapshot_revision(tmp_path / "elsewhere" / SNAPSHOT) is None
    assert mf.snapshot_revision(tmp_path / "snapshots" / "main") is None

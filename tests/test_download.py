"""``areal download``: pinned revisions reach snapshot_download, checksums are verified (a corrupt file is
removed), unpinned repos and offline use fail in one line, and nothing here touches the network."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import huggingface_hub
import pytest
from huggingface_hub import errors as hf_errors

from areal_cli.reproduce.download import download, plan
from areal_cli.foundations.errors import UserError
from areal_cli.recipes import load_recipe
from helpers.one_line import assert_one_line

R1_15B = "ad9f0ae0864d7fbcd1cd905e3c6c5b069cc8b562"
RL_DATA = "07dfc8977909d38366d4e913eb3648a939e5aeb4"
CONTENT = b'{"prompt": "1+1?", "solutions": ["\\\\boxed{2}"]}\n'


class FakeHub:
    """Stands in for huggingface_hub.snapshot_download: records the call, writes the allowed files.

    With ``local_dir`` the files go there; without it, into a fake cache laid out like the real one (the
    snapshot file is a symlink to a blob), so checksum failures can be seen to remove both.
    """

    def __init__(self, root: Path, content: bytes = CONTENT, raises: Exception | None = None):
        self.root, self.content, self.raises, self.calls = root, content, raises, []

    def __call__(self, repo_id, **kw):
        self.calls.append({"repo_id": repo_id, **kw})
        if self.raises is not None:
            raise self.raises
        files = kw.get("allow_patterns") or ["config.json"]
        if kw.get("local_dir"):
            snap = Path(kw["local_dir"])
            for f in files:
                (snap / f).parent.mkdir(parents=True, exist_ok=True)
                (snap / f).write_bytes(self.content)
            return str(snap)
        snap = self.root / "cache" / repo_id.replace("/", "--") / "snapshots" / str(kw.get("revision"))
        for i, f in enumerate(files):
            blob = self.root / "cache" / "blobs" / f"blob{len(self.calls)}-{i}"
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(self.content)
            (snap / f).parent.mkdir(parents=True, exist_ok=True)
            (snap / f).symlink_to(blob)
        return str(snap)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    fake = FakeHub(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return fake


def recipe_with_checksum(tmp_path: Path, monkeypatch, sha: str) -> None:
    """A recipes folder whose async-1.5b-math pins a sha256 for its data file."""
    d = tmp_path / "recipes"
    d.mkdir()
    src = load_recipe("async-1.5b-math")
    text = src.path.read_text().replace("      sha256: null", f"      sha256: {sha}", 1)
    (d / "async-1.5b-math.yaml").write_text(text)
    shutil.copy(src.expected_path, d / src.expected_path.name)
    monkeypatch.setenv("AREAL_RECIPES_DIR", str(d))


def test_a_recipe_downloads_its_model_and_data_at_the_pinned_commits(tmp_path, hub):
    got = download("async-1.5b-math", local_dir=tmp_path / "dl")
    assert got == {"model": tmp_path / "dl" / "model", "data": tmp_path / "dl" / "data"}
    model, data = hub.calls
    assert (model["repo_id"], model["repo_type"], model["revision"]) == \
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "model", R1_15B)
    assert (data["repo_id"], data["repo_type"], data["revision"], data["allow_patterns"]) == \
        ("inclusionAI/AReaL-RL-Data", "dataset", RL_DATA, ["data/boba_106k_0319.jsonl"])
    assert model["local_files_only"] is False and data["local_dir"] == str(tmp_path / "dl" / "data")


def test_the_published_checkpoint_is_fetched_only_when_asked(tmp_path, hub):
    with pytest.raises(UserError, match="'inclusionAI/AReaL-boba-RL-7B' has no pinned revision"):
        download("boba-rl-7b-math", roles=("published",))
    got = download("boba-rl-7b-math", roles=("published",), allow_unpinned=True, local_dir=tmp_path)
    assert list(got) == ["published"] and hub.calls[0]["revision"] is None


def test_an_unpinned_recipe_is_refused_before_anything_is_fetched(hub):
    with pytest.raises(UserError) as e:
        download("boba2-8b-code")
    msg = str(e.value)
    assert "recipes/boba2-8b-code.yaml:" in msg and "dataset 'inclusionAI/AReaL-boba-2-RL-Code' has no pinned" in msg
    assert_one_line(msg, "--allow-unpinned")
    assert hub.calls == []  # the pinned model was not downloaded either


def test_a_repo_id_uses_the_revision_a_recipe_pins_and_a_foreign_one_needs_a_commit(tmp_path, hub):
    download("Qwen/Qwen3-8B", local_dir=tmp_path / "q")
    assert hub.calls[-1]["revision"] == "b968826d9c46dd6066d109eabc6255188de91218"
    with pytest.raises(UserError, match="model 'someone/model' has no pinned revision"):
        download("someone/model")
    download("someone/model", revision="0" * 40, local_dir=tmp_path / "s")
    assert hub.calls[-1]["revision"] == "0" * 40
    with pytest.raises(UserError, match="revision 'main' is not a 40-hex commit"):
        download("someone/model", revision="main")


def test_datasets_are_named_by_prefix_or_flag(hub):
    (a,) = plan("datasets/inclusionAI/AReaL-RL-Data")
    (b,) = plan("inclusionAI/AReaL-RL-Data", dataset=True)
    assert (a.repo_type, a.repo_id, a.revision) == (b.repo_type, b.repo_id, b.revision) == \
        ("dataset", "inclusionAI/AReaL-RL-Data", RL_DATA)


def test_bad_targets_are_one_line_errors():
    with pytest.raises(UserError, match="unknown recipe 'boba3' \\(known: .*tiny-arith, tiny-arith-multiturn, tiny-longtail\\)"):
        plan("boba3")
    with pytest.raises(UserError, match="neither a recipe .* nor a Hub repo id"):
        plan("not a/repo id!")
    with pytest.raises(UserError, match="--revision applies to one repo, not to recipe 'boba2-8b-code'"):
        plan("boba2-8b-code", revision="0" * 40)


def test_a_builtin_recipe_has_nothing_to_download(hub):
    assert download("tiny-arith") == {} and hub.calls == []


def test_a_matching_checksum_passes(tmp_path, monkeypatch, hub):
    recipe_with_checksum(tmp_path, monkeypatch, hashlib.sha256(CONTENT).hexdigest())
    got = download("async-1.5b-math", local_dir=tmp_path / "dl", roles=("data",))
    assert (got["data"] / "data" / "boba_106k_0319.jsonl").read_bytes() == CONTENT


def test_a_checksum_mismatch_removes_the_file_and_fails(tmp_path, monkeypatch, hub):
    recipe_with_checksum(tmp_path, monkeypatch, "a" * 64)
    with pytest.raises(UserError) as e:
        download("async-1.5b-math", local_dir=tmp_path / "dl", roles=("data",))
    assert "sha256 mismatch for 'data/boba_106k_0319.jsonl'" in str(e.value)
    assert f"got {hashlib.sha256(CONTENT).hexdigest()}" in str(e.value) and "was removed" in str(e.value)
    assert not (tmp_path / "dl" / "data" / "data" / "boba_106k_0319.jsonl").exists()


def test_a_checksum_mismatch_in_the_cache_removes_the_link_and_its_blob(tmp_path, monkeypatch, hub):
    recipe_with_checksum(tmp_path, monkeypatch, "b" * 64)
    with pytest.raises(UserError, match="sha256 mismatch"):
        download("async-1.5b-math", roles=("data",))
    assert not list((tmp_path / "cache" / "blobs").iterdir())
    snap = tmp_path / "cache" / "inclusionAI--AReaL-RL-Data" / "snapshots" / RL_DATA / "data"
    assert not list(snap.iterdir())


def test_offline_mode_is_passed_on_and_a_missing_snapshot_is_one_line(tmp_path, monkeypatch):
    fake = FakeHub(tmp_path, raises=hf_errors.LocalEntryNotFoundError("no cached snapshot"))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(UserError) as e:
        download("Qwen/Qwen3-8B")
    assert fake.calls[0]["local_files_only"] is True
    assert str(e.value).startswith("cannot reach the Hugging Face hub (offline? HF_HUB_OFFLINE is set)")
    assert_one_line(str(e.value), str(tmp_path / "hf"))


@pytest.mark.parametrize("exc,needle", [
    (hf_errors.RepositoryNotFoundError("404", response=httpx.Response(404, request=httpx.Request("GET", "https://x"))),
     "repository not found"),
    (hf_errors.GatedRepoError("403", response=httpx.Response(403, request=httpx.Request("GET", "https://x"))),
     "the repo is gated"),
])
def test_hub_errors_are_one_line(tmp_path, monkeypatch, exc, needle):
    monkeypatch.setattr(huggingface_hub, "snapshot_download", FakeHub(tmp_path, raises=exc))
    with pytest.raises(UserError, match=needle):
        download("Qwen/Qwen3-8B")


@pytest.mark.multiproc
def test_the_real_client_offline_fails_in_one_line_without_network(tmp_path):
    """A fresh process with HF_HUB_OFFLINE=1 and an empty HF_HOME: huggingface_hub itself refuses."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code = "from areal_cli.commands.catalog import download; download.main(['Qwen/Qwen3-8B'], prog_name='areal download')"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach the Hugging Face hub (offline?"), res.stderr
    assert not (tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-8B" / "snapshots").exists()


@pytest.fixture(autouse=True)
def _hub_reachable(monkeypatch, request):
    """These tests stand in for the hub with a fake snapshot_download; the machine itself has no network,
    so the reachability probe is told the hub is up (offline behaviour is tested with HF_HUB_OFFLINE and in
    test_an_unreachable_hub_reads_the_cache_only)."""
    if "unreachable" not in request.node.name:
        monkeypatch.setattr("areal_cli.foundations.hub.hub_reachable", lambda *a, **k: True)


def test_an_unreachable_hub_reads_the_cache_only_and_fails_in_one_line_at_once(monkeypatch, tmp_path):
    import areal_cli.reproduce.download as dl
    import areal_cli.foundations.hub as hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "hub_reachable", lambda *a, **k: False)
    assert hub.hub_local_only()
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(UserError, match=r"cannot reach the Hugging Face hub \(offline\? network unreachable\)"):
        dl.download("Qwen/Qwen3-8B")

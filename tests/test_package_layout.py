"""The package's folders show its layers (issue 45): the top-level of ``areal_cli`` holds packages only, every module
imports on its own (the fast subset imports them all here), and the names users write in recipes and code keep
working."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import areal_cli

PKG = Path(areal_cli.__file__).parent


def test_the_top_level_holds_the_layer_packages_and_no_loose_modules():
    loose = sorted(p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert loose == [], f"single-file modules belong inside the package they serve: {loose}"
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    assert {"commands", "foundations", "train_loop", "rollout", "trainer", "sft", "api"} <= packages


def test_every_module_imports_by_itself():
    failed = []
    for info in pkgutil.walk_packages([str(PKG)], prefix="areal_cli."):
        if info.name.endswith("__main__") or ".rollout.sglang_cpu" in info.name:  # sglang_cpu: shims for SGLang's env
            continue
        try:
            importlib.import_module(info.name)
        except Exception as e:  # noqa: BLE001 - every failure is listed
            failed.append(f"{info.name}: {type(e).__name__}: {e}")
    assert failed == []


def test_names_users_write_keep_working():
    import areal_cli.api as api
    from areal_cli.commands.main import main
    from areal_cli.tasks.registry import PRESETS
    from areal_cli.workflows.multi_turn import MultiTurnWorkflow  # noqa: F401
    from areal_cli.workflows.rlvr import RLVRWorkflow  # noqa: F401

    assert callable(main) and "tiny-arith" in PRESETS
    for name in api.__all__:  # every exported name resolves (lazily) to its object
        assert getattr(api, name).__name__ == name
    importlib.import_module("areal_cli.agents.python_tool")

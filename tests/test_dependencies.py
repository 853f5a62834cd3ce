"""pyproject.toml declares what the package imports, and nothing it does not."""

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# modules of the sandbox found through its own folder on sys.path in the child process (not packages)
SANDBOX_LOCAL = {"child", "guard", "namespaces"}
# declared though never imported by name, with the reason
NOT_IMPORTED = {"accelerate": "transformers needs it to dequantise .gguf files (areal_cli.models.gguf)",
                "tensorboard": "torch.utils.tensorboard writes the event files with it (areal_cli.train_loop.tracking)"}


def _imported_top_level_modules() -> set[str]:
    mods: set[str] = set()
    for p in (ROOT / "areal_cli").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                mods |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods.add(node.module.split(".")[0])
    return {m for m in mods if m not in sys.stdlib_module_names and m != "areal_cli" and m not in SANDBOX_LOCAL}


def _declared() -> set[str]:
    """Required dependencies and the optional ones of the product's extras (not the test extra, nor the docs
    toolchain, which mkdocs.yml and docs/hooks use and .ci/docs checks by building the site)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = list(project["dependencies"])
    deps += [d for extra, ds in project["optional-dependencies"].items() if extra not in ("test", "docs") for d in ds]
    return {canonicalize_name(Requirement(d).name) for d in deps}


def test_every_imported_package_is_declared_and_every_declared_one_is_used():
    by_module = packages_distributions()
    imported = {}
    for mod in _imported_top_level_modules():
        dists = by_module.get(mod)
        assert dists, f"areal_cli imports '{mod}', which no installed distribution provides"
        imported[mod] = {canonicalize_name(d) for d in dists}
    declared = _declared()
    undeclared = {m: d for m, d in imported.items() if not d & declared}
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
    used = set().union(*imported.values())
    unused = declared - used - set(NOT_IMPORTED)
    assert not unused, f"declared in pyproject.toml but never imported: {sorted(unused)}"
    assert "pyyaml" in declared and "omegaconf" not in declared

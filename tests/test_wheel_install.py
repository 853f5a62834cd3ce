"""A built wheel works like the checkout: recipes, benchmark declarations, bench scenarios and data cards ship
inside it (setup.py copies them into areal_cli/_shipped/), and the CLI installed from it into a fresh
virtualenv, run from a folder outside the checkout, lists the recipes, plans a reproduction, evaluates and
trains. The virtualenv installs the wheel's dependencies from the package index (the pip cache after
.ci/run's own install)."""

import ast
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from areal_cli.foundations.resources import SHIPPED

pytestmark = pytest.mark.multiproc  # every test here starts processes

ROOT = Path(__file__).resolve().parents[1]


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    try:
        import setuptools  # noqa: F401
        iso = ["--no-build-isolation"]
    except ImportError:
        iso = []
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *iso, "-w", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (w,) = out.glob("areal_cli-*.whl")
    return w


def test_the_wheel_carries_every_shipped_folder(wheel):
    setup_shipped = next(ast.literal_eval(n.value) for n in ast.walk(ast.parse((ROOT / "setup.py").read_text()))
                         if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "SHIPPED")
    assert setup_shipped == SHIPPED
    names = zipfile.ZipFile(wheel).namelist()
    for name, rel in SHIPPED.items():
        prefix = f"areal_cli/_shipped/{name}/"
        inside = {n[len(prefix):] for n in names if n.startswith(prefix)}
        assert inside == _files(ROOT / rel), name
    assert not any(n.startswith(("recipes/", "evaluation/", "tests/", "benchmarks/")) for n in names)


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(d)], check=True, timeout=300)
    r = subprocess.run([str(d / "bin" / "pip"), "install", "-q", str(wheel)], capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    return d


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("AREAL_")}
    return {**env, **extra}


@pytest.mark.slow
def test_the_installed_cli_works_outside_the_checkout(venv, tmp_path, shared_dir):
    areal = str(venv / "bin" / "areal")
    py = str(venv / "bin" / "python")
    work = tmp_path / "elsewhere"
    work.mkdir()

    def run(*args, timeout=600, **env):
        r = subprocess.run(list(args), cwd=work, capture_output=True, text=True, timeout=timeout,
                           env=_clean_env(**env))
        assert r.returncode == 0, f"{args}: {r.stdout[-2000:]}{r.stderr[-3000:]}"
        return r.stdout

    where = json.loads(run(py, "-c", "import json, areal_cli, areal_cli.foundations.resources as r; print(json.dumps("
                                     "[areal_cli.__file__] + [str(r.shipped_dir(n)) for n in r.SHIPPED]))"))
    assert all(str(venv) in w and not w.startswith(str(ROOT)) for w in where), where

    listing = run(areal, "ls")
    for name in ("tiny-arith", "mini-math", "mini-code", "boba2-14b-code", "async-7b-math"):
        assert name in listing
    run(areal, "reproduce", "tiny-arith", "--dry-run")
    assert "published-1.5b-16node" in run(py, "-c", "from areal_cli.bench.sim import known_scenarios; "
                                                    "print(known_scenarios())")

    # a user's own recipe folder, next to the shipped ones
    mine = work / "mine"
    mine.mkdir()
    for suffix in (".yaml", ".expected.yaml"):
        text = (ROOT / "recipes" / f"tiny-arith{suffix}").read_text()
        text = text.replace("\nrecipe: tiny-arith\n", "\nrecipe: my-arith\n")
        text = text.replace("expected: tiny-arith.expected.yaml", "expected: my-arith.expected.yaml")
        (mine / f"my-arith{suffix}").write_text(text)
    assert "my-arith" in run(areal, "--recipes-dir", str(mine), "ls")

    # a 3-step asynchronous run of the shipped CPU recipe, and an evaluation of its weights on real problems
    run(areal, "train", "tiny-arith", "--max-steps", "3", "--no-live", "--out", str(work / "run"),
        "-o", "sft.max_steps=40")
    rows = [json.loads(x) for x in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 3
    summary = json.loads((work / "run" / "summary.json").read_text())
    weights = Path(summary["final_weights"])
    weights = weights if weights.is_absolute() else work / weights
    run(areal, "eval", "--model", str(weights), "--data", "math_500", "--data-dir", str(shared_dir / "data" / "math"),
        "--limit", "3", "--max-new-tokens", "8", "--protocol", "chat-template", "--out", str(work / "eval"))
    res = json.loads((work / "eval" / "results.json").read_text())
    assert json.dumps(res).count("math_500") >= 1
    assert len((work / "eval" / "samples.jsonl").read_text().splitlines()) == 3

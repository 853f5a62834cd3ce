"""Every job that grades code states the sandbox isolation in force, warns in one line when it is below the
full set, and refuses under ``strict`` (``areal eval --isolation strict``, the ``task.sandbox_isolation`` train key,
``AREAL_SANDBOX_ISOLATION``) with one line and nothing written; the reduced mode is that of a container that
refuses namespaces (simulated with ``AREAL_SANDBOX_REFUSE_NAMESPACES=1``, see tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from areal_cli.commands.main import main

pytestmark = pytest.mark.multiproc  # every test here starts processes

BENCH = Path(__file__).resolve().parent / "data" / "benchmarks"
PROGRAMS = {  # the lcb_v5 fixture problems inside the declared window: three right, one wrong
    "abc375_a": "```python\nn = int(input())\ns = input()\nprint(sum(s[i:i+3] == '#.#' for i in range(n)))\n```",
    "3496": "```python\nclass Solution:\n    def sumArray(self, nums):\n        return sum(nums)\n```",
    "2053_B": "```python\nt = int(input())\nfor _ in range(t):\n    print(int(input()))\n```",
    "abc391_b": "```python\na, b = map(int, input().split())\nprint(a + b)\n```",
}


@pytest.fixture(autouse=True)
def _isolation_env_restored(monkeypatch):
    """Jobs export their setting to AREAL_SANDBOX_ISOLATION (for the grader processes they start)."""
    monkeypatch.delenv("AREAL_SANDBOX_ISOLATION", raising=False)


def regrade(tmp_path: Path, *extra: str):
    gens = tmp_path / "gens.jsonl"
    gens.write_text("".join(json.dumps({"dataset": "lcb_v5", "problem_id": k, "text": v}) + "\n"
                            for k, v in PROGRAMS.items()))
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["eval", "--regrade", str(gens), "--data-dir", str(BENCH), "--out", str(out), *extra])
    return res, out


def test_eval_records_the_full_level_and_does_not_warn(tmp_path):
    res, out = regrade(tmp_path)
    assert res.exit_code == 0, res.output
    sandbox = json.loads((out / "results.json").read_text())["config"]["sandbox"]
    assert sandbox["level"] == "full" and sandbox["setting"] == "auto"
    assert sandbox["summary"].startswith("full: pid, net and mount namespaces")
    assert "code sandbox isolation: full: " in (out / "report.md").read_text()
    assert "warning:" not in res.output


def test_eval_in_a_container_that_refuses_namespaces_says_reduced_in_one_warning_and_in_its_outputs(
        tmp_path, reduced_mode):
    res, out = regrade(tmp_path)
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "reduced isolation" in warnings[0] and "strict" in warnings[0], res.output
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["sandbox"]["level"] == "reduced"
    assert "no namespaces" in results["config"]["sandbox"]["summary"]
    assert results["lcb_v5"]["pass@1"] == 0.75  # grading itself is unchanged
    assert "code sandbox isolation: reduced: no namespaces" in (out / "report.md").read_text()


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_strict_refuses_the_reduced_mode_with_one_line_and_writes_nothing(tmp_path, reduced_mode, monkeypatch, how):
    if how == "environment":
        monkeypatch.setenv("AREAL_SANDBOX_ISOLATION", "strict")
    res, out = regrade(tmp_path, *(["--isolation", "strict"] if how == "flag" else []))
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("error: code sandbox: ") and "isolation 'strict' needs namespaces" in lines[0]
    assert not out.exists()


def test_strict_grades_where_every_layer_is_available(tmp_path):
    res, out = regrade(tmp_path, "--isolation", "strict")
    assert res.exit_code == 0, res.output
    assert json.loads((out / "results.json").read_text())["config"]["sandbox"]["setting"] == "strict"


def test_math_only_evaluations_do_not_probe_the_sandbox(tmp_path, shared_dir, monkeypatch):
    from areal_cli.eval.datasets import load_datasets

    monkeypatch.setenv("AREAL_SANDBOX_ISOLATION", "strict")
    monkeypatch.setenv("AREAL_SANDBOX_REFUSE_NAMESPACES", "1")  # would refuse, were the sandbox used
    data = shared_dir / "data" / "math"
    problems = load_datasets(["aime24"], data)["aime24"]
    gens = tmp_path / "gens.jsonl"
    gens.write_text("".join(json.dumps({"dataset": "aime24", "problem_id": p.id, "text": f"\\boxed{{{p.answer}}}"}) + "\n"
                            for p in problems))
    res = CliRunner().invoke(main, ["eval", "--regrade", str(gens), "--data-dir", str(data), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert results["config"]["sandbox"] is None and results["aime24"]["pass@1"] == 1.0


class _Status:
    def __init__(self):
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)


class _Task:
    def __init__(self, kind: str):
        self.kind = kind


def test_train_states_the_level_for_code_tasks_and_refuses_under_strict(reduced_mode):
    from areal_cli.config import TrainConfig
    from areal_cli.foundations.errors import UserError
    from areal_cli.train_loop.setup import sandbox_in_force

    assert sandbox_in_force(TrainConfig(), _Task("math"), _Status()) is None
    status = _Status()
    state = sandbox_in_force(TrainConfig(), _Task("code"), status)
    assert state["level"] == "reduced" and len(status.warnings) == 1 and "reduced isolation" in status.warnings[0]
    with pytest.raises(UserError, match=r"^field 'task.sandbox_isolation': code sandbox: .*isolation 'strict' needs namespaces"):
        sandbox_in_force(TrainConfig().with_values({"task.sandbox_isolation": "strict"}), _Task("code"), status)
    with pytest.raises(UserError, match="field 'task.sandbox_isolation': must be one of auto, strict"):
        TrainConfig().with_values({"task.sandbox_isolation": "paranoid"}).validate("cfg.yaml")

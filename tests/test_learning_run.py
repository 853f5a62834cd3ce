"""A shortened `areal train tiny-arith` run: warm start, then async RL that clearly beats chance."""

import json

import pytest

from areal_cli.config import apply_overrides
from areal_cli.recipes import load_train_config
from areal_cli.tasks import tiny_arith
from areal_cli.train_loop import run_training

pytestmark = pytest.mark.multiproc  # every test here starts processes (areal train: servers, reward pool)

REQUIRED = {"step", "version", "reward_mean", "accuracy", "staleness_max", "elapsed_s"}


@pytest.mark.slow
def test_short_async_run_learns_well_beyond_chance(tmp_path):
    cfg, _ = load_train_config("tiny-arith")
    cfg = apply_overrides(cfg, ["loop.max_steps=25", "loop.target_accuracy=0", "rollout.max_head_offpolicyness=2",
                                "loop.eval_n_prompts=64"])
    out = tmp_path / "run"
    summary = run_training(cfg, out, live=False)

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 26 and all(REQUIRED <= set(r) for r in rows)
    first, last = rows[0], rows[-1]
    assert last["phase"] == "rl" and last["step"] == 25 and last["evaluated"]  # the last policy is measured
    assert first["phase"] == "warm_start_end" and first["step"] == 0 and first["version"] == 0
    assert first["accuracy"] <= 0.5  # the warm start stops at or below 0.5
    assert [r["version"] for r in rows] == list(range(26))
    assert max(r["staleness_max"] for r in rows) >= 1  # it really ran asynchronously
    assert all(r["groups_dropped_reward_failure"] == 0 and r["reward_error"] == 0 for r in rows[1:])
    # chance (uniform digits of the right length) is < 0.01, echoing the input ~0.03
    chance = max(tiny_arith.chance_accuracy(), tiny_arith.echo_accuracy())
    best_rl = max(r["accuracy"] for r in rows[1:])
    assert best_rl >= max(0.5, first["accuracy"] + 0.1), (first["accuracy"], best_rl)
    assert best_rl > 10 * chance
    assert (out / "learning_curve.png").stat().st_size > 10_000
    assert summary["final_version"] == 25
    assert (out / "weights" / "v25" / "model.safetensors").exists()


@pytest.mark.slow
def test_a_run_stopped_by_its_time_limit_evaluates_and_keeps_its_last_policy(tmp_path):
    """time_limit_s ends the run between evaluations: the last step is measured (its accuracy is the final one,
    not the previous measurement's) and its weights are kept."""
    cfg, _ = load_train_config("tiny-arith")
    cfg = apply_overrides(cfg, ["loop.max_steps=500", "loop.time_limit_s=10", "loop.eval_every=1000", "sft.max_steps=0",
                                "rollout.success_rate_lb=0", "loop.target_accuracy=0", "loop.eval_n_prompts=16"])
    out = tmp_path / "run"
    summary = run_training(cfg, out, live=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert 1 <= last["step"] < 500 and last["evaluated"] is True
    assert [r["step"] for r in rows if r["evaluated"]] == [0, last["step"]]
    assert summary["final_version"] == last["step"] and summary["final_accuracy"] == last["accuracy"]
    assert (out / "weights" / f"v{last['step']}" / "model.safetensors").exists()


@pytest.mark.slow
def test_deferred_evaluations_run_after_the_loop_on_the_kept_weights(tmp_path):
    """loop.eval_deferred: no evaluation inside the RL clock; the weights of each evaluation step are kept and
    evaluated after the loop, and the accuracies land in metrics.jsonl and the timeline as if measured in the loop."""
    cfg, _ = load_train_config("tiny-arith")
    cfg = apply_overrides(cfg, ["loop.max_steps=5", "loop.eval_every=2", "sft.max_steps=0", "loop.target_accuracy=0",
                                "rollout.success_rate_lb=0", "loop.eval_n_prompts=16", "loop.eval_deferred=true",
                                "rollout.max_head_offpolicyness=2"])
    out = tmp_path / "run"
    summary = run_training(cfg, out, live=False, record_timeline=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]
    evaluated = [r for r in rows[1:] if r["evaluated"]]
    assert [r["step"] for r in evaluated] == [2, 4, 5] and all(r["eval_deferred"] for r in evaluated)
    assert all(isinstance(r["accuracy"], float) and 0 <= r["accuracy"] <= 1 and r["deferred_eval_s"] > 0
               for r in evaluated)
    by_step = {r["step"]: r for r in rows}
    assert by_step[1]["accuracy"] == rows[0]["accuracy"]  # before the first evaluation: the warm start's
    assert by_step[3]["accuracy"] == by_step[2]["accuracy"]  # the latest measured, as lines of the loop carry
    assert summary["final_accuracy"] == by_step[5]["accuracy"]
    tl = json.loads((out / "timeline.json").read_text())
    assert [s["step"] for s in tl["steps"] if s.get("eval_deferred")] == [2, 4, 5]
    assert not [e for e in tl["events"] if e["lane"] == "trainer" and e["kind"] == "eval"]  # none in the RL clock
    # the evaluated versions were kept until their evaluation; then, as without deferral, the last two remain
    assert sorted(p.name for p in (out / "weights").glob("v*")) == ["v4", "v5"]


def test_a_run_without_rl_steps_names_the_weights_its_servers_hold_as_final(tmp_path):
    """loop.max_steps=0 (a warm start only, or not even that): summary.json's final_weights is a model folder that
    exists (the warm start's last checkpoint, else the model the servers started from), not a v0 never written."""
    cfg, _ = load_train_config("tiny-arith")
    cfg = apply_overrides(cfg, ["loop.max_steps=0", "sft.max_steps=0", "loop.eval_n_prompts=8"])
    summary = run_training(cfg, tmp_path / "run", live=False)
    final = tmp_path / "run" / "model" / "base"
    assert summary["final_version"] == 0 and summary["final_weights"] == str(final)
    assert (final / "config.json").is_file() and (final / "model.safetensors").is_file()

"""Samples you can read during training (areal_cli/train_loop/samples.py) and multi-turn metrics while training:

- every ``loop.log_samples_every`` steps, ``loop.log_samples_n`` samples of the batch (one per group first) go to
  ``samples.jsonl`` (whole lines only, appended; a torn tail is cut; a resume drops later steps) and to TensorBoard
  (a Markdown table per step) / W&B (a table);
- a multi-turn conversation is one sample: the conversation before its last answer, the answer, its turns;
- a multi-turn run's metrics lines carry first-try accuracy, accuracy within max_turns and mean turns, of the
  conversations trained on and of the held-out ones (the definitions of ``multi_turn_eval``), and the learning
  curve draws the first-try accuracy;
- two real short runs (single-turn with TensorBoard, multi-turn) check it end to end.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from pathlib import Path

import pytest

from areal_cli.api.types import ConversationOutcome, Group, Item, Trajectory
from areal_cli.config import TrainConfig, apply_overrides
from areal_cli.foundations.errors import UserError
from areal_cli.foundations.jsonl import append_json_lines, cut_torn_tail, iter_json_lines
from areal_cli.train_loop.samples import FIELDS, cut_samples, due, markdown_table, pick_samples
from areal_cli.workflows.multi_turn import MultiTurnWorkflow, conversation_metrics

from helpers.scripted import ScriptedEngine, episode_client, item_of

FINISH = {"stop", "length", "abort"}


class Tok:
    """decode() that shows whether special tokens were skipped."""

    def decode(self, ids, skip_special_tokens=True):
        return ("S:" if skip_special_tokens else "R:") + ",".join(map(str, ids))


def _traj(out, versions, reward=0.0, gid=0, prompt=(1, 2), finish="stop", mask=None):
    return Trajectory(list(prompt), list(out), [-0.1 if v >= 0 else 0.0 for v in versions], list(versions), reward,
                      gid, finish, loss_mask=mask)


def _group(gid, n, **kw):
    item = Item(f"item{gid}", [1, 2], f"prompt {gid}")
    return Group(gid, item, [_traj([10 + i], [gid], reward=float(i % 2), gid=gid, **kw) for i in range(n)])


# ------------------------------------------------------------------------------------------------ picking
def test_samples_come_one_per_group_first_with_every_field():
    groups = [_group(g, 3) for g in range(3)]
    groups[1].samples[0] = _traj([7, 8, 9], [0, 0, 1], reward=1.0, gid=1, finish="abort")  # interrupted: v0 -> v1
    recs = pick_samples(groups, 4, Tok(), step=5)
    assert [(r["group_id"], r["completion"]) for r in recs] == [(0, "S:10"), (1, "S:7,8,9"), (2, "S:10"), (0, "S:11")]
    assert all(list(r) == list(FIELDS) and r["step"] == 5 and r["turns"] == 1 and r["solved_at_turn"] is None
               for r in recs)
    r = recs[1]
    assert (r["prompt"], r["reward"], r["finish_reason"], r["version_first"], r["version_last"], r["item_id"]) == (
        "prompt 1", 1.0, "abort", 0, 1, "item1")
    assert len(pick_samples(groups, 100, Tok(), 1)) == 9 and pick_samples(groups, 0, Tok(), 1) == []


def test_a_concatenated_agent_sample_counts_its_turns_and_keeps_the_template_tokens():
    mask = [1, 1, 0, 0, 1, 0, 1]
    vers = [2, 2, -1, -1, 3, -1, 3]
    g = Group(4, Item("a", [1, 2], "p"), [_traj([5, 6, 90, 91, 7, 92, 8], vers, reward=1.0, gid=4, mask=mask)])
    (r,) = pick_samples([g], 4, Tok(), 2)
    assert (r["turns"], r["version_first"], r["version_last"], r["prompt"]) == (3, 2, 3, "p")
    assert r["completion"] == "R:5,6,90,91,7,92,8"  # feedback / tool tokens shown, not skipped


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from areal_cli.models.tiny import build_tiny_model, load_tokenizer
    from areal_cli.tasks.tiny_arith_multiturn import tokenizer_corpus

    return load_tokenizer(build_tiny_model(tmp_path_factory.mktemp("ls") / "m", corpus=tokenizer_corpus()))


def _answers(tok, *texts):
    return [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]


@pytest.mark.parametrize("layout", ["per_turn", "concat"])
def test_a_multi_turn_group_reports_its_conversations_and_logs_each_as_one_sample(tok, layout):
    """Conversation k answers "111" first (wrong), then "321" (right): 2 turns, solved at turn 2."""
    outs = _answers(tok, "111", "321")
    client, _ = episode_client(ScriptedEngine(outs), tok, lambda text, k, f: float(text == "321"), group_size=3)
    g = asyncio.run(MultiTurnWorkflow(max_turns=2, layout=layout).arun_episode(client.for_episode(7), item_of(tok)))
    per = 2 if layout == "per_turn" else 1
    assert g.conversations == [ConversationOutcome(2, 1, tuple(range(i * per, (i + 1) * per))) for i in range(3)]
    recs = pick_samples([g], 2, tok, 3)
    assert len(recs) == 2 and all(r["turns"] == 2 and r["solved_at_turn"] == 2 for r in recs)
    assert all(r["reward"] == pytest.approx(0.9) and r["version_first"] == 3 and r["version_last"] == 4
               for r in recs)  # ScriptedEngine: turn k is version 3 + k
    if layout == "per_turn":  # the conversation before the last answer, then the answer
        assert "111" in recs[0]["prompt"] and "Wrong. Try again." in recs[0]["prompt"]
        assert recs[0]["completion"] == "321"
    else:  # the first prompt, then everything generated and fed back
        assert recs[0]["prompt"] == item_of(tok).prompt
        assert "111" in recs[0]["completion"] and "Wrong. Try again." in recs[0]["completion"]
    m = conversation_metrics(g.conversations + [ConversationOutcome(1, 0), ConversationOutcome(2, None), None])
    assert m == {"first_try": 1 / 6, "within_max_turns": 4 / 6, "mean_turns": 9 / 5, "n": 6.0,
                 "reward_failures": 1.0}


# ---------------------------------------------------------------------------------------- switch and file
def test_the_switch_and_the_settings_listing():
    from areal_cli.config.listing import describe_settings

    loop = TrainConfig().loop
    assert (loop.log_samples_every, loop.log_samples_n) == (1, 4)  # on by default
    assert [s for s in range(1, 7) if due(loop, s)] == list(range(1, 7))
    for over, steps in ((["loop.log_samples_every=2"], [2, 4, 6]), (["loop.log_samples_every=0"], []),
                        (["loop.log_samples_n=0"], [])):
        cfg = apply_overrides(TrainConfig(), over)
        assert [s for s in range(1, 7) if due(cfg.loop, s)] == steps, over
    with pytest.raises(UserError, match="loop.log_samples_every"):
        apply_overrides(TrainConfig(), ["loop.log_samples_every=-1"])
    text = "\n".join(describe_settings(TrainConfig()))
    assert "loop.log_samples_every = 1" in text and "loop.log_samples_n = 4" in text and "samples.jsonl" in text


def test_lines_are_appended_whole_a_torn_tail_is_cut_and_a_resume_drops_later_steps(tmp_path):
    path = tmp_path / "samples.jsonl"
    assert append_json_lines(path, [{"step": 1, "prompt": "a\nb|ü"}, {"step": 1}]) == 2
    with path.open("a") as fh:  # what a writer killed mid-line leaves
        fh.write('{"step": 2, "prompt": "to')
    append_json_lines(path, [{"step": 2}, {"step": 3}])
    raw = path.read_bytes()
    assert raw.endswith(b"\n") and "ü".encode() in raw
    assert [r["step"] for _, r in iter_json_lines(path)] == [1, 1, 2, 3]
    with path.open("a") as fh:
        fh.write('{"step": 4')
    assert cut_samples(path, 2) == 1 and [r["step"] for _, r in iter_json_lines(path)] == [1, 1, 2]
    assert cut_torn_tail(path) == 0 and cut_torn_tail(tmp_path / "none.jsonl") == 0
    path.write_bytes(b'{"step"')  # no full line at all
    assert cut_torn_tail(path) == 7 and path.read_bytes() == b""


def test_the_table_escapes_markup_and_cuts_long_texts():
    md = markdown_table([{"step": 1, "group_id": 3, "prompt": "<b>x</b> | y\nz", "completion": "w" * 5000,
                          "reward": 0.123456}])
    head, rule, row = md.splitlines()
    assert head.startswith("| group_id |") and "step" not in head and rule.count("---") == len(FIELDS) - 1
    assert "&lt;b&gt;x&lt;/b&gt; \\| y<br>z" in row and "0.1235" in row and "(3500 more characters)" in row


def test_the_samples_table_goes_to_wandb_as_a_table(tmp_path, monkeypatch):
    from areal_cli.train_loop.tracking import Tracker

    logged = []

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(Table=Table))
    tracker = Tracker([], tmp_path, {})
    tracker._wandb = types.SimpleNamespace(log=lambda row, step: logged.append((step, row)))
    recs = pick_samples([_group(0, 2)], 2, Tok(), 3)
    tracker.log_samples(3, recs)
    tracker._wandb_next = 5
    tracker.log_samples(4, recs)  # W&B would drop a step below its current one
    ((step, row),) = logged
    assert step == 3 and row["samples"].columns == list(FIELDS) and len(row["samples"].data) == 2
    assert row["samples"].data[0][FIELDS.index("completion")] == "S:10"


def test_the_learning_curve_draws_first_try_accuracy_when_present(tmp_path, monkeypatch):
    from areal_cli.foundations import plots

    figs = []
    monkeypatch.setattr(plots, "_atomic_savefig", lambda fig, path: figs.append(fig))
    rows = [{"step": 0, "elapsed_s": 1.0, "accuracy": 0.2, "evaluated": True, "eval_first_try": 0.1},
            {"step": 1, "elapsed_s": 2.0, "accuracy": 0.3, "evaluated": True, "eval_first_try": 0.2,
             "train_first_try": 0.25, "phase": "rl", "reward_mean": 0.4}]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plots.plot_learning_curve(metrics, tmp_path / "c.png")
    labels = figs[0].axes[0].get_legend_handles_labels()[1]
    assert any("held-out first-try accuracy" in x for x in labels)
    assert any("first-try accuracy of the conversations trained on" in x for x in labels)


# ------------------------------------------------------------------------------------------- real runs
def _run(recipe: str, out: Path, overrides: list[str]) -> list[dict]:
    from areal_cli.recipes import load_train_config
    from areal_cli.train_loop import run_training

    cfg, _ = load_train_config(recipe)
    common = ["loop.max_steps=2", "loop.target_accuracy=0", "rollout.success_rate_lb=0", "loop.eval_n_prompts=8",
              "rollout.batch_size=8"]
    run_training(apply_overrides(cfg, common + overrides), out, live=False)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _sample_lines(out: Path) -> list[dict]:
    raw = (out / "samples.jsonl").read_text(encoding="utf-8")
    assert raw.endswith("\n")
    return [json.loads(line) for line in raw.splitlines()]


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_single_turn_run_writes_samples_and_a_tensorboard_table(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    _run("tiny-arith", out, ["sft.max_steps=0", "loop.loggers=tensorboard", "loop.log_samples_n=3"])
    recs = _sample_lines(out)
    assert [r["step"] for r in recs] == [1, 1, 1, 2, 2, 2]
    for r in recs:
        assert list(r) == list(FIELDS) and r["finish_reason"] in FINISH and r["turns"] == 1
        assert r["prompt"].count("reverse ") == 1 and r["item_id"] in r["prompt"] and isinstance(r["completion"], str)
        assert 0 <= r["version_first"] <= r["version_last"] <= r["step"] - 1  # behaviour versions, never ahead
        assert r["reward"] in (0.0, 1.0)
    assert len({r["group_id"] for r in recs if r["step"] == 1}) == 3  # one per group
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    events = acc.Tensors("samples/text_summary")
    assert [e.step for e in events] == [1, 2]
    table = events[0].tensor_proto.string_val[0].decode()
    assert table.startswith("| group_id | item_id |") and len(table.splitlines()) == 2 + 3
    assert all(f"| {r['group_id']} | {r['item_id']} |" in table for r in recs[:3])


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_multi_turn_run_logs_conversations_and_its_turn_metrics(tmp_path):
    out = tmp_path / "run"
    rows = _run("tiny-arith-multiturn", out, ["sft.max_steps=40", "sft.eval_every=40", "loop.eval_every=1",
                                              "loop.log_samples_every=2"])
    keys = ("first_try", "within_max_turns", "mean_turns")
    assert all(f"eval_{k}" in rows[0] for k in keys)  # the warm start's evaluation
    for r in rows[1:]:
        for prefix in ("train_", "eval_"):
            m = {k: r[prefix + k] for k in keys}
            assert 0 <= m["first_try"] <= m["within_max_turns"] <= 1 and 1 <= m["mean_turns"] <= 2, (prefix, r)
        assert r["eval_within_max_turns"] == pytest.approx(r["accuracy"])  # held-out accuracy: within max_turns
    recs = _sample_lines(out)
    assert [r["step"] for r in recs] == [2] * 4  # log_samples_every=2: step 1 logs none
    for r in recs:
        assert list(r) == list(FIELDS) and r["finish_reason"] in FINISH and r["turns"] in (1, 2)
        assert (r["solved_at_turn"] is not None) == (r["reward"] > 0)  # reward_mode final: success x 0.9^(T-1)
        assert r["solved_at_turn"] in (None, r["turns"])  # a conversation stops at its first success
        assert ("Wrong. Try again." in r["prompt"]) == (r["turns"] == 2)
    assert (out / "learning_curve.png").stat().st_size > 10_000

"""A success-rate filter that drops every group (a warm start too short to learn anything, or a range no group can
fall in) ends the run by itself: past ``rollout.filter_patience_batches`` batches' worth of groups dropped in a row
the run stops with exit 2 and one line naming the filter's settings, sft.max_steps and the counts, and leaves a
consistent run folder (metrics.jsonl up to then, summary.json with "ok": false, the learning curve)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from areal_cli.config import TrainConfig
from areal_cli.train_loop.loop import FilterStarved, FilterWatch, get_batch_watched
from helpers.one_line import assert_one_line

ROOT = Path(__file__).resolve().parents[1]


def _counters(accepted=0, dropped=0, samples=0, reward=0.0, rejected=0):
    return {"groups_accepted": accepted, "groups_dropped_filter": dropped, "groups_rejected": rejected,
            "groups_dropped_reward_failure": 0, "samples_scored": samples, "reward_sum_scored": reward}


def test_the_watch_counts_drops_since_the_last_accepted_group_and_stops_at_the_limit():
    cfg = TrainConfig().with_values({"rollout.batch_size": 4, "rollout.filter_patience_batches": 3,
                                     "rollout.success_rate_lb": 0.01, "rollout.success_rate_ub": 0.99,
                                     "sft.max_steps": 1, "rollout.group_size": 4})
    watch = FilterWatch(cfg, _counters(accepted=5, dropped=7, samples=48, reward=20.0))
    watch.check(_counters(accepted=5, dropped=18, samples=92, reward=20.0), step=2)  # 11 < 3 x 4: goes on
    watch.check(_counters(accepted=6, dropped=25, samples=120, reward=22.0), step=2)  # accepted: counts again
    watch.check(_counters(accepted=6, dropped=36, samples=164, reward=22.0), step=2)  # 11 since the last accepted
    with pytest.raises(FilterStarved) as e:
        watch.check(_counters(accepted=6, dropped=37, samples=168, reward=22.0), step=2)
    line = assert_one_line(str(e.value), "step 2: ", "rollout.success_rate_lb 0.01", "rollout.success_rate_ub 0.99",
                           "dropped the last 12 groups in a row, none accepted",
                           "rollout.filter_patience_batches 3 x rollout.batch_size 4",
                           "groups generated: 43 (6 accepted, 37 dropped by the filter)",
                           "their samples' mean reward 0.000", "sft.max_steps 1", "rollout.group_size (4)")
    assert "rejected" not in line  # counters that are 0 and not the filter's are left out

    off = FilterWatch(TrainConfig().with_values({"rollout.filter_patience_batches": 0}), _counters())
    off.check(_counters(dropped=10 ** 6), step=1)  # 0: wait forever


def test_a_trainer_waiting_on_a_filter_that_drops_everything_stops_instead_of_waiting_forever():
    """get_batch_watched reads the counters while it waits; the batch never comes, the watch ends the wait."""
    counters = _counters(accepted=1)

    class Starving:
        stats = SimpleNamespace(as_dict=lambda: dict(counters))

        async def get_batch(self, n, consumer_version=None):
            while True:  # every group all wrong: dropped by the filter
                counters["groups_dropped_filter"] += 1
                counters["samples_scored"] += 2
                await asyncio.sleep(0.001)

    cfg = TrainConfig().with_values({"rollout.batch_size": 8, "rollout.filter_patience_batches": 2,
                                     "rollout.success_rate_lb": 0.01, "rollout.success_rate_ub": 0.99})
    ctx = SimpleNamespace(cfg=cfg, status=SimpleNamespace(log=lambda message: None))

    async def go():
        return await asyncio.wait_for(get_batch_watched(ctx, Starving(), 7, poll_s=0.02), timeout=30)

    with pytest.raises(FilterStarved, match=r"^step 7: .* dropped the last \d+ groups in a row"):
        asyncio.run(go())
    assert counters["groups_dropped_filter"] >= 16


@pytest.mark.multiproc
def test_a_run_whose_filter_never_passes_exits_2_with_one_line_and_a_consistent_folder(tmp_path):
    """group_size 1 gives success rates of 0 or 1: the range [0.5, 0.5] can never hold one. The run stops at step 1
    after 2 batches' worth (4 groups) dropped in a row; what it wrote is whole and says why it stopped."""
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "areal_cli.commands.main", "train", "tiny-arith", "--out", str(out), "--no-live",
         "--max-steps", "3", "-o", "sft.max_steps=1", "-o", "sft.n_examples=64", "-o", "sft.batch_size=8",
         "-o", "rollout.batch_size=2", "-o", "rollout.group_size=1", "-o", "rollout.success_rate_lb=0.5",
         "-o", "rollout.success_rate_ub=0.5", "-o", "rollout.filter_patience_batches=2",
         "-o", "loop.eval_n_prompts=4", "-o", "parallel.torch_threads=1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
    (line,) = lines
    assert line.startswith("error: step 1: the success-rate filter (rollout.success_rate_lb 0.5, "
                           "rollout.success_rate_ub 0.5) dropped the last "), line
    for needle in ("groups in a row, none accepted", "rollout.filter_patience_batches 2 x rollout.batch_size 2",
                   "groups generated: ", "0 accepted", "dropped by the filter", "sft.max_steps 1",
                   f"are in {out})"):
        assert needle in line, (needle, line)

    # the folder: complete files up to the stop, nothing half-written, and the stop recorded
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] is False and summary["final_version"] == 0
    assert line.startswith("error: " + summary["stopped"])
    ctl = summary["controller"]
    assert ctl["groups_accepted"] == 0 and ctl["groups_dropped_filter"] >= 4
    assert int(re.search(r"dropped the last (\d+) groups", line).group(1)) >= 4
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["phase"] for x in rows] == ["warm_start_end"] and rows[0]["warm_start_steps"] == 1
    assert (out / "config.json").is_file() and (out / "learning_curve.png").stat().st_size > 0
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]  # atomic writes' temporaries
    for log in (out / "logs").glob("*.log") if (out / "logs").is_dir() else ():
        assert "Traceback" not in log.read_text(errors="replace"), log

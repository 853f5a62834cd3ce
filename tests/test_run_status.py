"""The live status: warm-start progress, RL progress toward max_steps with an ETA, accuracy vs the target."""

import io

from rich.console import Console

from areal_cli.train_loop import run_status
from areal_cli.config import TrainConfig


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _status(monkeypatch, settings: dict):
    clock = Clock()
    monkeypatch.setattr(run_status.time, "monotonic", clock)
    console = Console(file=io.StringIO(), force_terminal=True, width=160, record=True)
    st = run_status.RunStatus(TrainConfig().with_values(settings), run_status.Path("runs/x"), live=False, console=console)
    return st, clock, console


def _text(st) -> str:
    c = Console(file=io.StringIO(), width=200, record=True)
    c.print(st._render())
    return c.export_text()


def test_warm_start_shows_a_progress_bar_toward_sft_max_steps(monkeypatch):
    st, clock, _ = _status(monkeypatch, {"sft.max_steps": 400, "sft.stop_accuracy": 0.4})
    st.phase("warm start", step=120, acc=0.21, loss=1.3)
    text = _text(st)
    assert "warm start 120/400 steps, accuracy 0.210 (stops once it reaches 0.4)" in text
    assert "━" in text  # the bar


def test_rl_progress_has_an_eta_from_the_pace_so_far_capped_by_the_time_limit(monkeypatch):
    st, clock, console = _status(monkeypatch, {"loop.max_steps": 100, "loop.target_accuracy": 0.9})
    st.step({"step": 0, "phase": "warm_start_end", "accuracy": 0.3}, {})
    assert st.eta_s() is None
    clock.t += 50.0
    st.step({"step": 10, "phase": "rl", "accuracy": 0.5}, {})
    assert st.eta_s() == 50.0 / 10 * 90  # 5 s/step, 90 steps left
    text = _text(st)
    assert "RL step 10/100, ETA 7m30s, accuracy 0.500 / target 0.9 (ends the run when reached)" in text
    assert "of=100 eta=7m30s" in console.export_text()  # the plain log line too

    st2, clock2, _ = _status(monkeypatch, {"loop.max_steps": 100, "loop.time_limit_s": 120.0})
    st2.step({"step": 0, "phase": "warm_start_end"}, {})
    clock2.t += 50.0
    st2.step({"step": 10, "phase": "rl"}, {})
    assert st2.eta_s() == 70.0  # the time limit ends the run first


def test_durations_read_like_a_clock():
    assert [run_status._duration(x) for x in (7.4, 125, 3725)] == ["7s", "2m05s", "1h02m"]

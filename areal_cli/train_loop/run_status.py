"""Live terminal status of a training run (rich), or plain log lines when not on a terminal."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


class RunStatus:
    """Shows step, version, reward, accuracy, batch staleness, tokens/s and dropped groups, with a progress bar:
    warm-start steps toward ``sft.max_steps``, then RL steps toward ``loop.max_steps`` with an ETA (mean seconds per
    RL step so far times the steps left, capped by ``loop.time_limit_s``) and the accuracy against
    ``loop.target_accuracy`` (reaching it ends the run early).

    Args:
        cfg: the run's TrainConfig (for the header).
        out: run directory (shown in the header).
        live: use a live-updating panel when stdout is a terminal; otherwise one line per event.
    """

    def __init__(self, cfg, out: Path, *, live: bool = True, console: Console | None = None) -> None:
        self.cfg = cfg
        self.out = out
        self.console = console or Console()
        self.use_live = live and self.console.is_terminal
        self._live: Live | None = None
        self.t0 = time.monotonic()  # the run's clock: log stamps and metrics elapsed_s share it
        self._phase = "starting"
        self._phase_info: dict = {}
        self._last: dict = {}
        self._counters: dict = {}
        self._messages: list[str] = []
        self._rl_first: tuple[int, float] | None = None  # (step, time) of the first metrics line seen

    def __enter__(self) -> "RunStatus":
        if self.use_live:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(*exc)
            self._live = None

    # --- events ---------------------------------------------------------------------------
    def warn(self, message: str) -> None:
        """One ``warning:`` line that stays on the terminal (above the live panel) and on stderr's log."""
        self.console.print(f"warning: {message}", style="yellow", highlight=False, soft_wrap=True)
        self._messages = (self._messages + [f"warning: {message}"])[-4:]

    def log(self, message: str) -> None:
        stamp = f"[{time.monotonic() - self.t0:7.1f}s]"
        self._messages = (self._messages + [f"{stamp} {message}"])[-4:]
        if self._live is not None:
            self._live.update(self._render())
        else:
            self.console.print(f"{stamp} {message}", highlight=False, soft_wrap=True)

    def phase(self, name: str, **info) -> None:
        self._phase, self._phase_info = name, info
        self.log(name + " " + " ".join(f"{k}={_fmt(v)}" for k, v in info.items()))

    def step(self, line: dict, counters: dict) -> None:
        self._phase = "rl" if line.get("phase") == "rl" else "warm start done"
        self._last, self._counters = line, counters
        if self._rl_first is None:
            self._rl_first = (int(line.get("step", 0)), time.monotonic())
        if self._live is not None:
            self._live.update(self._render())
        else:
            keys = ("step", "version", "reward_mean", "accuracy", "staleness_max", "gen_tokens_per_s",
                    "groups_dropped", "elapsed_s")
            eta = self.eta_s()
            self.console.print(
                f"[{time.monotonic() - self.t0:7.1f}s] " + " ".join(f"{k}={_fmt(line.get(k))}" for k in keys)
                + (f" of={self.cfg.loop.max_steps} eta={_duration(eta)}" if eta is not None else ""),
                highlight=False, soft_wrap=True,
            )

    def eta_s(self) -> float | None:
        """Seconds left until ``loop.max_steps`` at the mean pace of the RL steps seen so far (capped by
        ``loop.time_limit_s``); None before the second metrics line."""
        if self._rl_first is None or not self._last:
            return None
        step0, t_first = self._rl_first
        done = int(self._last.get("step", 0)) - step0
        if done <= 0:
            return None
        left = (time.monotonic() - t_first) / done * max(self.cfg.loop.max_steps - int(self._last["step"]), 0)
        limit = self.cfg.loop.time_limit_s
        if limit:
            left = min(left, max(limit - (time.monotonic() - self.t0), 0.0))
        return left

    def summary(self, summary: dict) -> None:
        """Print the end-of-run table (the same numbers are in summary.json), then the run folder and the final
        weights, each path whole on a line of its own (:func:`print_paths`)."""
        t = Table(title=f"areal train {self.cfg.recipe}: summary", show_header=False)
        t.add_column("what", style="cyan")
        t.add_column("value", justify="right")
        warm, ttt, ctl = summary["warm_start"], summary["time_to_target"], summary["controller"]
        t.add_row("warm start", f"{warm['steps']} steps, {warm['seconds']:.1f} s, accuracy {_fmt(warm['accuracy'])}")
        how = "greedy" if self.cfg.loop.eval_temperature == 0 else f"T {self.cfg.loop.eval_temperature:g}"
        t.add_row(f"final accuracy (held-out, {how})", _fmt(summary["final_accuracy"]))
        t.add_row("policy versions (RL steps)", str(summary["final_version"]))
        if self.cfg.loop.target_accuracy:
            t.add_row(f"time to accuracy {self.cfg.loop.target_accuracy}",
                      f"step {ttt['step']}, {ttt['elapsed_s']:.1f} s total ({ttt['rl_elapsed_s']:.1f} s of RL)"
                      if ttt else "not reached")
        t.add_row("max_head_offpolicyness (eta)", str(self.cfg.rollout.max_head_offpolicyness))
        t.add_row("groups accepted / rejected by the workflow / dropped by filter / dropped by reward failure",
                  f"{ctl['groups_accepted']} / {ctl.get('groups_rejected', 0)} / {ctl['groups_dropped_filter']} / "
                  f"{ctl['groups_dropped_reward_failure']}")
        if ctl.get("prompts_dropped_too_long"):
            t.add_row("prompts dropped (longer than max_prompt_len)", str(ctl["prompts_dropped_too_long"]))
        for name, rec in (summary.get("last_eval_benchmarks") or {}).items():
            counts = "".join(f", {label} {rec[k]}" for k, label in (("n_truncated", "truncated"),
                                                                     ("n_no_answer", "no answer")) if rec.get(k) is not None)
            t.add_row(f"{name} pass@1 (in-loop, version {rec['version']})",
                      f"{rec['pass@1']:.3f}" + (f" ({counts[2:]} of {rec['n_problems'] * rec['n_samples']})"
                                                if counts else ""))
        t.add_row("reward calls ok / error / timeout", f"{ctl['reward_ok']} / {ctl['reward_error']} / {ctl['reward_timeout']}")
        t.add_row("samples interrupted and resumed", str(ctl["interruptions"]))
        t.add_row("wall time", f"{summary['elapsed_s']:.1f} s")
        self.console.print(t)
        for example in summary.get("reward_failures", []):
            self.console.print(f"reward failure: {example}", style="yellow", markup=False, highlight=False,
                               soft_wrap=True)
        # the paths under the table, each whole on its own line (a table cell would cut them at 80 columns)
        print_paths(self.console, [("outputs (metrics.jsonl, learning_curve.png, summary.json)", self.out),
                                   ("final weights", summary.get("final_weights"))])
        if summary.get("eval_command"):  # one's own task: evaluate the final weights on its held-out records
            print_paths(self.console, [("evaluate the final weights on the held-out records",
                                        summary["eval_command"])])
        elif summary.get("eval_command_missing"):
            self.console.print(f"no areal eval command for this task: {summary['eval_command_missing']}",
                               markup=False, highlight=False, soft_wrap=True)

    # --- rendering ------------------------------------------------------------------------
    def _render(self):
        cfg, l, c = self.cfg, self._last, self._counters
        head = Text(
            f"areal train {cfg.recipe} | eta={cfg.rollout.max_head_offpolicyness} batch={cfg.rollout.batch_size}x{cfg.rollout.group_size} "
            f"| out={self.out} | {time.monotonic() - self.t0:.0f}s | phase: {self._phase}",
            style="bold",
        )
        t = Table(show_header=True, header_style="cyan", box=None)
        for col in ("step", "version", "reward", "accuracy", "staleness max/mean", "gen tok/s",
                    "train tok/s", "dropped groups", "reward err/timeout", "interrupts"):
            t.add_column(col, justify="right")
        if l:
            t.add_row(
                _fmt(l.get("step")), _fmt(l.get("version")), _fmt(l.get("reward_mean")), _fmt(l.get("accuracy")),
                f"{_fmt(l.get('staleness_max'))}/{_fmt(l.get('staleness_mean'))}",
                _fmt(l.get("gen_tokens_per_s")), _fmt(l.get("train_tokens_per_s")),
                _fmt(l.get("groups_dropped", 0)),
                f"{c.get('reward_error', 0)}/{c.get('reward_timeout', 0)}", _fmt(c.get("interruptions", 0)),
            )
        msgs = Text("\n".join(self._messages), style="dim")
        return Group(head, self._progress(), t, msgs)

    def _progress(self):
        """The progress line: warm-start steps, or RL steps with the ETA and the accuracy vs the target."""
        cfg, info = self.cfg, self._phase_info
        bar = Table.grid(padding=(0, 1))
        bar.add_column(width=30)
        bar.add_column()
        if self._phase == "warm start" and cfg.sft.max_steps:
            k = int(info.get("step", 0))
            bar.add_row(ProgressBar(total=cfg.sft.max_steps, completed=k, width=30),
                        f"warm start {k}/{cfg.sft.max_steps} steps, accuracy {_fmt(info.get('acc'))} "
                        f"(stops once it reaches {cfg.sft.stop_accuracy:g})")
        elif self._last:
            k = int(self._last.get("step", 0))
            eta = self.eta_s()
            target = (f", accuracy {_fmt(self._last.get('accuracy'))} / target {cfg.loop.target_accuracy:g} "
                      f"(ends the run when reached)" if cfg.loop.target_accuracy else "")
            bar.add_row(ProgressBar(total=max(cfg.loop.max_steps, 1), completed=k, width=30),
                        f"RL step {k}/{cfg.loop.max_steps}, ETA {_duration(eta) if eta is not None else '-'}{target}")
        return bar


def print_paths(console: Console, rows: list[tuple[str, object]]) -> None:
    """Print ``label: path`` lines under a summary, each path whole: one line per path, never cut or folded by rich
    (``soft_wrap``: a path wider than the terminal is wrapped by the terminal itself, so it copies as one line);
    ``None`` paths are skipped. Markup and highlighting are off (brackets in a path stay as they are)."""
    for label, path in rows:
        if path is not None:
            console.print(f"{label}: {path}", markup=False, highlight=False, soft_wrap=True)


def _duration(seconds: float) -> str:
    """``3725`` -> ``"1h02m"``, ``125`` -> ``"2m05s"``, ``7.4`` -> ``"7s"``."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)

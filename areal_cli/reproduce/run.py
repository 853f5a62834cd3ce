"""The run of a reproduction (:func:`reproduce`): plan, refuse what cannot run here, train or evaluate into the
run folder, compare with the expected metrics, and record ``manifest.json`` and ``reproduce.json`` (a failure
after work started is recorded too; one before leaves no trace).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_cli.foundations.errors import UserError
from areal_cli.recipes import Check, Measured, compare, load_recipe
from areal_cli.reproduce.checkpoints import check_checkpoint
from areal_cli.reproduce.eval_needs import EVAL_CONCURRENCY
from areal_cli.reproduce.measure import explain_skips, measured_from_eval, measured_from_training
from areal_cli.reproduce.plan import Plan, make_plan
from areal_cli.reproduce.render import count_checks, exit_code_for, render_checks, render_plan


#: Files that mark an output folder as holding a reproduction (refused: nothing is overwritten).
RUN_MARKERS = ("manifest.json", "reproduce.json", "train", "eval")


@dataclass
class Outcome:
    """What :func:`reproduce` did: ``exit_code`` (0 pass, 1 fail / nothing checked), the checks, the folder."""

    exit_code: int
    checks: list[Check]
    out_dir: Path | None
    plan: Plan


def default_out_dir(name: str) -> Path:
    return Path("runs") / f"reproduce-{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_out_dir(out: Path) -> None:
    """Refuse a path that is a file or already holds a reproduction (:data:`RUN_MARKERS`).

    Raises:
        UserError: one line with the path and what is there.
    """
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: --out exists and is not a directory")
    for marker in RUN_MARKERS:
        if (out / marker).exists():
            raise UserError(f"{out}: already holds a reproduction ({marker}); choose another --out")


def reproduce(name: str, *, out_dir: Path | None = None, dry_run: bool = False, eval_only: bool = False,
              subject: str | None = None, variant: str | None = None, overrides: list[str] | tuple[str, ...] = (),
              allow_unpinned: bool = False, data_dir: Path | None = None, cf_data: Path | None = None,
              model_dir: Path | None = None, live: bool = False, console: Any = None,
              command: list[str] | None = None, gpus_here: int | None = None, nodes: int | None = None,
              gpus_per_node: int | None = None) -> Outcome:
    """Plan, run, compare and record a reproduction of recipe ``name`` (see the module docstring).

    Args:
        out_dir: run folder (default ``runs/reproduce-<name>-<timestamp>``); must not hold a reproduction.
        dry_run: print the plan only; nothing is downloaded or written.
        eval_only / subject / model_dir / data_dir / cf_data: evaluate a checkpoint (``published`` or ``base``;
            ``model_dir``: a local copy instead of the download, a HF directory or a ``.gguf`` file) on benchmark files in ``data_dir``
            (``areal eval --data-dir``), Codeforces rating data in ``cf_data``.
        overrides: ``-o KEY=VALUE`` (recorded in the manifest: the run is no longer the locked recipe).
        allow_unpinned: download unpinned checkpoints as they are today.
        live: the training run's live panel (on a terminal).
        command: argv recorded in the manifest (default ``sys.argv``).
        gpus_here: GPUs of this machine (default: ``nvidia-smi``).
        nodes, gpus_per_node: place the recipe's allocation on this hardware instead of its published one
            (printed by ``dry_run``).
    Raises:
        UserError: bad input, before anything is written (see the module docstring).
    """
    from rich.console import Console

    console = console or (Console() if sys.stdout.isatty() else Console(width=150))
    recipe = load_recipe(name)
    plan = make_plan(recipe, eval_only=eval_only, subject=subject, variant=variant, overrides=overrides,
                     gpus_here=gpus_here, model_dir=model_dir, nodes=nodes, gpus_per_node=gpus_per_node)
    if dry_run:
        render_plan(plan, console)
        return Outcome(0, [], None, plan)
    if plan.blocker:
        raise UserError(plan.blocker)
    out = Path(out_dir) if out_dir is not None else default_out_dir(recipe.name)
    check_out_dir(out)
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UserError(f"{data_dir}: --data-dir not found")
    started, t0 = _utc(), time.monotonic()
    ctx = _RunRecord(plan, out, started, t0, list(command if command is not None else sys.argv), console,
                     live=live)
    if plan.mode == "retrain":
        return ctx.guard(lambda: _retrain(ctx, allow_unpinned=allow_unpinned, data_dir=data_dir, cf_data=cf_data))
    return ctx.guard(lambda: _eval_only(ctx, allow_unpinned=allow_unpinned, data_dir=data_dir, cf_data=cf_data,
                                        model_dir=model_dir))


def _utc() -> str:
    from areal_cli.foundations.manifest import utc_now

    return utc_now()


@dataclass
class _RunRecord:
    """A run in progress: where it writes, when it started, what was downloaded; writes the records."""

    plan: Plan
    out: Path
    started: str
    t0: float
    command: list[str]
    console: Any
    live: bool = False
    created: bool = False
    downloads: dict[str, Path] = field(default_factory=dict)
    runs: dict[str, Any] = field(default_factory=dict)

    def make_dir(self) -> None:
        self.created = not self.out.exists()
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"{self.out}: cannot create the run folder: {e.strerror}") from None

    def manifest(self, status: str, exit_code: int | None) -> dict:
        from areal_cli.foundations.manifest import build_manifest

        p = self.plan
        return build_manifest(p.recipe, mode=p.mode, subject=p.subject, variant=p.variant, overrides=p.overrides,
                              command=self.command, started_at=self.started, finished_at=_utc(),
                              elapsed_s=time.monotonic() - self.t0, status=status, exit_code=exit_code,
                              downloads=self.downloads, extra={"runs": self.runs})

    def finish(self, checks: list[Check], measured: dict[str, Measured]) -> Outcome:
        from areal_cli.foundations.atomic import write_atomic_many

        p = self.plan
        code = exit_code_for(checks)
        result = {"recipe": p.recipe.name, "variant": p.variant, "mode": p.mode, "subject": p.subject,
                  "overrides": p.overrides, "passed": code == 0, "exit_code": code, "counts": count_checks(checks),
                  "checks": [dataclasses.asdict(c) for c in checks],
                  "measured": {k: dataclasses.asdict(v) for k, v in measured.items()}, "runs": self.runs}
        manifest = self.manifest("passed" if code == 0 else "failed", code)
        write_atomic_many({self.out / "manifest.json": json.dumps(manifest, indent=2) + "\n",
                           self.out / "reproduce.json": json.dumps(result, indent=2) + "\n"})
        label = "retrain" if p.mode == "retrain" else f"eval-only, {p.subject} checkpoint"
        render_checks(checks, self.console, f"areal reproduce {p.recipe.name}"
                      f"{'@' + p.variant if p.variant else ''} ({label})"
                      + (f" with overrides {' '.join(p.overrides)}" if p.overrides else ""))
        from areal_cli.train_loop.run_status import print_paths

        print_paths(self.console, [("wrote", self.out / "manifest.json"), ("wrote", self.out / "reproduce.json")])
        return Outcome(code, checks, self.out, p)

    def guard(self, fn) -> Outcome:
        """Run ``fn``; if it fails after work started in the folder, record the failure (``status``) in
        manifest.json; a failure before anything was written there leaves no trace (a folder made here is
        removed)."""
        try:
            return fn()
        except BaseException as e:
            if self.out.is_dir() and not (self.out / "manifest.json").exists():
                if not any(self.out.iterdir()):  # nothing started: leave no trace
                    if self.created:
                        self.out.rmdir()
                else:
                    status = "interrupted" if isinstance(e, KeyboardInterrupt) else \
                        f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                    from areal_cli.foundations.atomic import write_json_atomic

                    write_json_atomic(self.out / "manifest.json", self.manifest(status, None))
            raise


def _retrain(ctx: _RunRecord, *, allow_unpinned: bool = False, data_dir: Path | None = None,
             cf_data: Path | None = None) -> Outcome:
    """Train the recipe into ``OUT/train`` and compare (mode retrain): a CPU recipe's run and its training
    figures; a GPU recipe (:func:`_retrain_gpu`) trained on this machine, then evaluated."""
    from areal_cli.config import apply_overrides
    from areal_cli.recipes import train_config_from_recipe

    p = ctx.plan
    if p.recipe.trainer == "gpu":
        return _retrain_gpu(ctx, allow_unpinned=allow_unpinned, data_dir=data_dir, cf_data=cf_data)
    cfg = apply_overrides(train_config_from_recipe(p.recipe, p.variant), p.overrides)
    render_plan(p, ctx.console)
    ctx.make_dir()
    from areal_cli.train_loop import run_training

    train_dir = ctx.out / "train"
    ctx.runs["train"] = "train"
    summary = run_training(cfg, train_dir, live=ctx.live)
    rows = [json.loads(line) for line in (train_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    measured, why = measured_from_training(p.expected, summary, rows, cfg.loop.eval_n_prompts)
    checks = explain_skips(compare(p.recipe.expected, measured, mode="retrain", variant=p.variant), why)
    return ctx.finish(checks, measured)


def _eval_only(ctx: _RunRecord, *, allow_unpinned: bool, data_dir: Path | None, cf_data: Path | None,
               model_dir: Path | None) -> Outcome:
    """Download (or take ``model_dir``), check the checkpoint and the data, evaluate each group, compare."""
    import areal_cli.reproduce.download as dl

    p = ctx.plan
    if model_dir is None:
        role = "published" if p.subject == "published" else "model"
        got = dl.download(str(p.recipe.path), roles=(role,), allow_unpinned=allow_unpinned)
        if role not in got:
            raise UserError(f"{p.recipe.path}: the download returned no {role} checkpoint")
        model_dir = got[role]
        ctx.downloads[role] = Path(model_dir)
    else:
        from areal_cli.models.gguf import provenance_of, resolve_model

        model_dir = resolve_model(model_dir, log=lambda m: ctx.console.print(m, markup=False, highlight=False))
        if provenance_of(model_dir) is not None:  # a .gguf file, dequantised: record what it was
            ctx.runs["model_provenance"] = {"gguf": provenance_of(model_dir), "model_dir": str(model_dir)}
    check_checkpoint(Path(model_dir))
    _check_eval_data(p, data_dir)
    render_plan(p, ctx.console)  # bad input and failed downloads above end in one line, without the plan
    ctx.make_dir()
    measured, why = _evaluate_groups(ctx, Path(model_dir), data_dir, cf_data)
    checks = explain_skips(compare(p.recipe.expected, measured, mode="eval_only", subject=p.subject), why)
    return ctx.finish(checks, measured)


def _check_eval_data(p: Plan, data_dir: Path | None) -> None:
    """Every benchmark's data is checked before the first evaluation (or training) starts."""
    from areal_cli.eval import runner

    for g in p.eval_groups:
        runner.load_selected([g.benchmark], data_dir, date_from=g.date_window[0] if g.date_window else None,
                             date_to=g.date_window[1] if g.date_window else None)


def _evaluate_groups(ctx: _RunRecord, model_dir: Path, data_dir: Path | None, cf_data: Path | None
                     ) -> tuple[dict[str, Measured], dict[str, str]]:
    """Evaluate ``model_dir`` on every eval group of the plan into ``OUT/eval/<group>``."""
    from areal_cli.eval import runner

    p = ctx.plan
    measured: dict[str, Measured] = {}
    why: dict[str, str] = {}
    ctx.runs["eval"] = {}
    for g in p.eval_groups:
        s = g.settings
        rel = f"eval/{g.name}"
        ctx.runs["eval"][g.name] = rel
        results = runner.run_eval(
            [g.benchmark], data_dir, model_dir=model_dir, n=s["n_samples"], temperature=s["temperature"],
            top_p=s["top_p"], max_new_tokens=s["max_new_tokens"], out_dir=ctx.out / rel, protocol=s["protocol"],
            cf_data=cf_data, date_from=g.date_window[0] if g.date_window else None,
            date_to=g.date_window[1] if g.date_window else None, console=ctx.console,
            max_concurrency=EVAL_CONCURRENCY)  # what the plan's memory and time figures assume
        entries = [m for m in p.expected if m.key in g.keys]
        got, reasons = measured_from_eval(entries, g.benchmark, results.get(g.benchmark) or {})
        measured.update(got)
        why.update(reasons)
    return measured, why


def _download_inputs(ctx: _RunRecord, allow_unpinned: bool) -> tuple[Path, Path]:
    """The recipe's base model and training data file, downloaded at their pinned revisions (recorded).

    Raises:
        UserError: unpinned without ``allow_unpinned``, offline, not found, checksum mismatch; a data
            snapshot without the recipe's file.
    """
    import areal_cli.reproduce.download as dl

    r = ctx.plan.recipe
    got = dl.download(str(r.path), roles=("model", "data"), allow_unpinned=allow_unpinned)
    ctx.downloads.update({k: Path(v) for k, v in got.items()})
    data = Path(got["data"]) / r.file.data.files[0].path
    if not data.is_file():
        raise UserError(f"{r.path}: field 'data.files[0].path': {r.file.data.files[0].path} is not in the "
                        f"downloaded snapshot {got['data']}")
    return Path(got["model"]), data


def _retrain_gpu(ctx: _RunRecord, *, allow_unpinned: bool, data_dir: Path | None, cf_data: Path | None) -> Outcome:
    """Train a published recipe on this machine (SGLang servers + torchrun trainer on its GPUs, as its
    allocation places them; :mod:`areal_cli.recipes.gpu_train`), evaluate the trained weights with the recipe's
    protocol, compare with the published numbers (mode retrain). SFT recipes: :mod:`areal_cli.sft.job`."""
    from areal_cli.config import apply_overrides
    from areal_cli.recipes.placement import parse_allocation, place

    p = ctx.plan
    r = p.recipe
    _check_eval_data(p, data_dir)
    placement = place(parse_allocation(r.file.resources.allocation), nodes=1, gpus_per_node=p.gpus_here)
    model_dir, data_file = _download_inputs(ctx, allow_unpinned)
    render_plan(p, ctx.console)
    ctx.make_dir()
    if r.kind == "sft":
        from areal_cli.sft.job import run_sft_job

        ctx.runs["train"] = "train"
        summary = run_sft_job(r.file.sft, model_dir, data_file, ctx.out / "train", placement=placement,
                              log=lambda m: ctx.console.print(m, markup=False, highlight=False))
        trained = Path(summary["weights"])
    else:
        from areal_cli.recipes import gpu_train_config
        from areal_cli.train_loop import run_training

        cfg, notes = gpu_train_config(r, p.variant, placement=placement)
        cfg.model.path, cfg.task.dataset, cfg.task.code_dir = str(model_dir), str(data_file), str(r.path.parent)
        cfg = apply_overrides(cfg, p.overrides)
        ctx.runs["train"] = "train"
        ctx.runs["deviations"] = notes
        summary = run_training(cfg, ctx.out / "train", live=ctx.live)
        trained = Path(summary["final_weights"])
    measured, why = _evaluate_groups(ctx, trained, data_dir, cf_data)
    checks = explain_skips(compare(r.expected, measured, mode="retrain", variant=p.variant), why)
    return ctx.finish(checks, measured)

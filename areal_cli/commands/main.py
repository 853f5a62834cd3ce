"""The ``areal`` command line. Thin commands: parse options, call one function each.

Nothing heavy (torch, transformers, megatron) is imported here; each command imports its job lazily so
``areal --help`` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from areal_cli import __version__
from areal_cli.foundations.errors import UserError
from areal_cli.commands.error_contract import one_line_errors


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="areal")
@click.option("--recipes-dir", type=click.Path(file_okay=False, path_type=Path), multiple=True, metavar="DIR",
              help="A folder of your own recipes (NAME.yaml + NAME.expected.yaml), looked up before the shipped "
                   "ones; repeatable. Same as $AREAL_RECIPES_DIR (os.pathsep-separated).")
@one_line_errors
def main(recipes_dir: tuple[Path, ...]) -> None:
    """areal: fully asynchronous RL for reasoning LLMs, reproducible from the command line."""
    import faulthandler
    import signal

    # `kill -USR1 <pid>` prints every thread's stack to stderr: how to see where a run that seems stuck waits
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (ValueError, OSError, RuntimeError):  # stderr without a file descriptor (embedded use, tests)
        pass
    if recipes_dir:
        import os

        for d in recipes_dir:
            if not d.is_dir():
                raise UserError(f"--recipes-dir {d}: not a folder")
        prev = os.environ.get("AREAL_RECIPES_DIR", "")
        os.environ["AREAL_RECIPES_DIR"] = os.pathsep.join([*(str(d.resolve()) for d in recipes_dir),
                                                           *([prev] if prev else [])])


@main.command()
@click.argument("recipe", required=False, default=None)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Run directory (metrics.jsonl, learning_curve.png, weights). "
                   "Default: runs/<recipe>-<date>-<time>.")
@click.option("--max-steps", type=int, default=None, help="Number of RL steps (overrides the recipe).")
@click.option("-o", "--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe field, e.g. -o rollout.max_head_offpolicyness=0. Repeatable.")
@click.option("--resume", "resume_dir", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Continue the run in DIR (or from DIR/checkpoints/step-N) from its newest checkpoint, with "
                   "the run's own settings (written with -o loop.checkpoint_every=N).")
@click.option("--model", "model_path", type=click.Path(path_type=Path), default=None,
              help="Start from this model: a Hugging Face dir or a .gguf file (same as -o model.path=...).")
@click.option("--no-live", is_flag=True, help="Plain log lines instead of the live status panel.")
@click.option("--list-settings", is_flag=True,
              help="Print every setting (section.key = value, type, meaning) of RECIPE with the overrides, and exit.")
@one_line_errors
def train(recipe: str | None, out_dir: Path | None, max_steps: int | None, overrides: tuple[str, ...],
          resume_dir: Path | None, model_path: Path | None, no_live: bool, list_settings: bool) -> None:
    """Train RECIPE (default: tiny-arith, runs on CPU) with asynchronous RL.

    Settings are written section.key (rollout.group_size, ppo.lr, ...): `--list-settings` shows them all."""
    if resume_dir is not None:
        given = [name for name, v in (("RECIPE", recipe), ("--out", out_dir), ("--max-steps", max_steps),
                                      ("-o", overrides or None), ("--model", model_path),
                                      ("--list-settings", list_settings or None)) if v is not None]
        if given:
            raise UserError(f"option '--resume' continues a run with its own settings; it does not take "
                            f"{', '.join(given)}")
        from areal_cli.train_loop import resume_training

        with _resume_hint(resume_dir):
            summary = resume_training(resume_dir, live=not no_live)
        sys.exit(0 if summary.get("ok", True) else 1)

    from areal_cli.config import apply_overrides
    from areal_cli.recipes import load_train_config

    cfg, recipe_file = load_train_config(recipe or "tiny-arith")
    items = list(overrides) + ([f"loop.max_steps={max_steps}"] if max_steps is not None else []) + \
        ([f"model.path={model_path}"] if model_path is not None else [])
    cfg = apply_overrides(cfg, items)
    from areal_cli.config import flush_notes

    flush_notes()  # the settings are good: say now (not after the run) which flat names to rename
    if list_settings:
        from areal_cli.config.listing import describe_settings

        click.echo("\n".join(describe_settings(cfg)))
        return
    from areal_cli.recipes import check_runs_here

    check_runs_here(cfg, recipe_file)  # a GPU recipe this machine cannot run: every edit it needs, in one line
    if out_dir is None:
        import time

        out_dir = Path("runs") / f"{cfg.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"

    from areal_cli.train_loop import run_training

    with _resume_hint(out_dir):
        summary = run_training(cfg, out_dir, live=not no_live)
    sys.exit(0 if summary.get("ok", True) else 1)


class _resume_hint:
    """Context: a run that fails (:class:`~areal_cli.foundations.errors.RunFailure`, e.g. a trainer rank died) says how to
    continue it: ``areal train --resume DIR`` when DIR holds a checkpoint."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        from areal_cli.foundations.errors import RunFailure

        if isinstance(e, RunFailure):
            ckpt = self.run_dir / "checkpoints"
            if ckpt.is_dir() and any(p.name.startswith("step-") for p in ckpt.iterdir()):
                e.headline += f"; continue with: areal train --resume {self.run_dir}"
            else:
                e.headline += " (no checkpoint to resume from: -o loop.checkpoint_every=N makes a run resumable)"
        return False


@main.command("eval")
@click.option("--data", "datasets", default=None,
              help="Comma-separated benchmarks, e.g. aime24,aime25, or your own tasks: a task YAML, a records file "
                   "(.jsonl/.parquet: id, problem|question|prompt, answer; math grader), or NAME with "
                   "--data-dir DIR/NAME.yaml (docs/guides/evaluation.md). With --regrade: default = those in the file; "
                   "one name also supplies the benchmark of records that carry none.")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Folder holding the benchmark files (<benchmark>.jsonl) and task files (<task>.yaml).")
@click.option("--revision", default=None,
              help="Hugging Face revision of hub-sourced code benchmarks (default: the pinned one).")
@click.option("--date-from", default=None, metavar="YYYY-MM-DD",
              help="Start of the problem date window of dated benchmarks (LiveCodeBench, Codeforces); "
                   "'none' = unbounded. Default: the declared window.")
@click.option("--date-to", default=None, metavar="YYYY-MM-DD", help="End of the date window (inclusive).")
@click.option("--protocol", default=None,
              help="Evaluation protocol: prompt template + sampling preset (qwen3-think, qwen3-think-pure, "
                   "r1-distill, greedy, chat-template). Explicit sampling options override the preset. "
                   "Default: chat-template for the tiny model, else the benchmarks' declared default.")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), default=None,
              help="Hugging Face model dir or a .gguf file (default: the embedded tiny model).")
@click.option("--limit", type=int, default=None,
              help="Only the first N problems of each benchmark (with --regrade: the limit of the run that wrote the "
                   "file; default: the one its results.json records).")
@click.option("-n", "--n-samples", "n_samples", type=int, default=None, help="Samples per problem [protocol].")
@click.option("--temperature", type=float, default=None, help="Sampling temperature, 0 = greedy [protocol].")
@click.option("--top-p", type=float, default=None, help="Nucleus mass in (0, 1] [protocol].")
@click.option("--top-k", type=int, default=None, help="Top-k, -1 = off [protocol].")
@click.option("--max-new-tokens", type=int, default=None, help="Generation budget per sample [protocol].")
@click.option("--greedy-pass/--no-greedy-pass", "greedy_pass", default=None,
              help="Also generate one greedy completion per problem (greedy accuracy) [protocol].")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--server-url", default=None, help="Use an already running SGLang-protocol server.")
@click.option("--regrade", "regrade", type=click.Path(path_type=Path), default=None, metavar="GENERATIONS.jsonl",
              help="Grade saved completions (JSONL: [dataset,] problem_id, text or completion[, sample_index]) "
                   "again; no generation.")
@click.option("--cf-data", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Codeforces contest data (all_contest_data.json, sorted_rating.json; evaluation/codeforces/README.md) "
                   "for the codeforces rating.")
@click.option("--grader-timeout", type=float, default=10.0, show_default=True,
              help="Hard timeout per graded math answer, seconds (a timeout is counted, never a crash).")
@click.option("--isolation", type=click.Choice(["auto", "strict"]), default=None,
              help="Code sandbox: auto = every layer this machine allows (a reduced set is stated and warned "
                   "about); strict = refuse to grade without namespaces. Default: $AREAL_SANDBOX_ISOLATION or auto.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True,
              help="Output dir: results.json, report.md, samples.jsonl. Rerun into it to resume an "
                   "interrupted run.")
@one_line_errors
def eval_cmd(datasets: str | None, data_dir: Path | None, revision: str | None, date_from: str | None,
             date_to: str | None, protocol: str | None, model_dir: Path | None, limit: int | None,
             n_samples: int | None, temperature: float | None, top_p: float | None, top_k: int | None,
             max_new_tokens: int | None, greedy_pass: bool | None, seed: int, server_url: str | None, regrade: Path | None,
             cf_data: Path | None, grader_timeout: float, isolation: str | None, out_dir: Path) -> None:
    """Evaluate a model on math and code benchmarks (pass@1 ± stderr, pass@k, maj@k, greedy accuracy)."""
    from areal_cli.eval.regrade import run_regrade
    from areal_cli.eval.runner import run_eval

    names = [d.strip() for d in datasets.split(",") if d.strip()] if datasets is not None else None
    if regrade is not None:
        generation_flags = {"--model": model_dir, "-n": n_samples, "--temperature": temperature, "--top-p": top_p,
                            "--top-k": top_k, "--max-new-tokens": max_new_tokens, "--server-url": server_url,
                            "--greedy-pass": greedy_pass}
        given = [flag for flag, value in generation_flags.items() if value is not None]
        if given:
            raise UserError(f"option '--regrade' grades saved completions; it does not take {', '.join(given)}")
        run_regrade(regrade, out_dir, datasets=names, data_dir=data_dir, protocol=protocol,
                    grader_timeout_s=grader_timeout, cf_data=cf_data, revision=revision, date_from=date_from,
                    date_to=date_to, isolation=isolation, limit=limit)
        return
    if names is None:
        raise UserError("option '--data' is required (comma-separated benchmarks, e.g. aime24,aime25, or a task "
                        "file: my-task.yaml, records.jsonl)")
    try:
        run_eval(names, data_dir=data_dir, model_dir=model_dir, n=n_samples, temperature=temperature, top_p=top_p,
                 max_new_tokens=max_new_tokens, out_dir=out_dir, seed=seed, server_url=server_url,
                 protocol=protocol, top_k=top_k, greedy_pass=greedy_pass, grader_timeout_s=grader_timeout, cf_data=cf_data,
                 revision=revision, date_from=date_from, date_to=date_to, limit=limit, isolation=isolation)
    except KeyboardInterrupt:
        from areal_cli.eval.resume import PARTIAL_NAME

        partial = out_dir / PARTIAL_NAME
        if partial.exists():
            click.echo(f"interrupted; finished samples are kept in {partial}; run the same command again to resume",
                       err=True)
        raise


@main.group()
def bench() -> None:
    """Benchmarks: measured async-vs-sync throughput here, simulated throughput at cluster scale."""


def _register() -> None:
    """Commands defined in their own modules (each imports only click at load time)."""
    from areal_cli.commands.bench_algorithms import algorithms
    from areal_cli.commands.bench_simulate import simulate
    from areal_cli.commands.bench_staleness import staleness
    from areal_cli.commands.bench_throughput import throughput
    from areal_cli.commands.catalog import download, ls
    from areal_cli.commands.engine import engine
    from areal_cli.commands.launch import launch
    from areal_cli.commands.reproduce import reproduce

    main.add_command(ls)
    main.add_command(reproduce)
    main.add_command(download)
    main.add_command(launch)
    main.add_command(engine)
    bench.add_command(throughput)
    bench.add_command(simulate)
    bench.add_command(staleness)
    bench.add_command(algorithms)


_register()


if __name__ == "__main__":  # pragma: no cover
    main()

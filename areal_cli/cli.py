"""The ``areal`` command line. Thin commands: parse options, call one function each.

Nothing heavy (torch, transformers, megatron) is imported here; each command imports its job lazily so
``areal --help`` stays fast.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from areal_cli import __version__
from areal_cli.errors import UserError
from areal_cli.rollout.protocol import ServerError  # pure module: no torch, no HTTP client


def _user_errors(fn):
    """Turn :class:`UserError` into one line on stderr and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        except ServerError as e:
            # A rollout server that cannot be reached or answers an error: one line, not a traceback.
            click.echo(f"error: rollout server: {e}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="areal")
def main() -> None:
    """areal: fully asynchronous RL for reasoning LLMs, reproducible from the command line."""


@main.command()
@click.argument("recipe", required=False, default="tiny-arith")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Run directory (metrics.jsonl, learning_curve.png, weights). "
                   "Default: runs/<recipe>-<date>-<time>.")
@click.option("--max-steps", type=int, default=None, help="Number of RL steps (overrides the recipe).")
@click.option("-o", "--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe field, e.g. -o max_head_offpolicyness=0. Repeatable.")
@click.option("--no-live", is_flag=True, help="Plain log lines instead of the live status panel.")
@_user_errors
def train(recipe: str, out_dir: Path | None, max_steps: int | None, overrides: tuple[str, ...], no_live: bool) -> None:
    """Train RECIPE (default: tiny-arith, runs on CPU) with asynchronous RL."""
    from areal_cli.config import apply_overrides, load_recipe

    cfg, _ = load_recipe(recipe)
    items = list(overrides) + ([f"max_steps={max_steps}"] if max_steps is not None else [])
    cfg = apply_overrides(cfg, items)
    if out_dir is None:
        import time

        out_dir = Path("runs") / f"{cfg.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"

    from areal_cli.train_loop import run_training

    summary = run_training(cfg, out_dir, live=not no_live)
    sys.exit(0 if summary.get("ok", True) else 1)


@main.command("eval")
@click.option("--data", "datasets", required=True, help="Comma-separated benchmarks, e.g. aime24,aime25.")
@click.option("--data-dir", type=click.Path(path_type=Path), required=True,
              help="Folder holding <benchmark>.jsonl files.")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), default=None,
              help="Hugging Face model dir (default: the embedded tiny model).")
@click.option("-n", "--n-samples", "n_samples", type=int, default=1, show_default=True, help="Samples per problem.")
@click.option("--temperature", type=float, default=0.6, show_default=True)
@click.option("--top-p", type=float, default=0.95, show_default=True)
@click.option("--max-new-tokens", type=int, default=512, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--server-url", default=None, help="Use an already running SGLang-protocol server.")
@click.option("--grader-timeout", type=float, default=10.0, show_default=True,
              help="Hard timeout per graded answer, seconds (a timeout is counted, never a crash).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True,
              help="Output dir for results.json and samples.jsonl.")
@_user_errors
def eval_cmd(datasets: str, data_dir: Path, model_dir: Path | None, n_samples: int, temperature: float,
             top_p: float, max_new_tokens: int, seed: int, server_url: str | None, grader_timeout: float,
             out_dir: Path) -> None:
    """Evaluate a model on math benchmarks (pass@1, pass@k, maj@n)."""
    from areal_cli.eval.runner import run_eval

    names = [d.strip() for d in datasets.split(",") if d.strip()]
    run_eval(names, data_dir=data_dir, model_dir=model_dir, n=n_samples, temperature=temperature,
             top_p=top_p, max_new_tokens=max_new_tokens, out_dir=out_dir, seed=seed, server_url=server_url,
             grader_timeout_s=grader_timeout)


if __name__ == "__main__":  # pragma: no cover
    main()

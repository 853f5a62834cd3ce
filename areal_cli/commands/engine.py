"""``areal engine``: real rollout engines in environments of their own (today: SGLang's CPU mode).

``areal engine setup sglang [--env DIR]`` builds SGLang 0.5.23's CPU environment from the pinned files shipped with
the kit (:mod:`areal_cli.rollout.sglang_env`), or checks one that is already built; ``areal engine check sglang``
checks the environment a run would use (``rollout.sglang_python``) without building anything. Imports click only
at load time.
"""

from __future__ import annotations

from pathlib import Path

import click

from areal_cli.commands.error_contract import one_line_errors

ENGINES = ("sglang",)


@click.group()
def engine() -> None:
    """Real rollout engines (SGLang) in environments of their own: build and check them."""


@engine.command()
@click.argument("name", type=click.Choice(ENGINES))
@click.option("--env", "env_dir", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Where to build the environment (default $AREAL_HOME/engines/sglang-<version>-cpu, AREAL_HOME "
                   "defaulting to ~/.cache/areal). `rollout.engine=sglang` finds the default one by itself; for "
                   "another DIR pass -o rollout.sglang_python=DIR/bin/python.")
@click.option("--force", is_flag=True, help="Rebuild even when a finished environment matches the pinned files.")
@one_line_errors
def setup(name: str, env_dir: Path | None, force: bool) -> None:
    """Build NAME's environment (SGLang 0.5.23, CPU mode: pinned packages, about 3.2 GB, 2-3 minutes with a warm
    pip cache), or check an existing one. Prints the Python that runs its servers."""
    from areal_cli.rollout.sglang_env import build_env

    py = build_env(env_dir, force=force, log=lambda m: click.echo(m, err=True))
    click.echo(str(py))


@engine.command()
@click.argument("name", type=click.Choice(ENGINES))
@click.option("--python", "python", default="", metavar="PY",
              help="The interpreter to check (default: what rollout.sglang_python '' finds: $AREAL_SGLANG_PYTHON, "
                   "this Python if it imports sglang, or the default environment).")
@one_line_errors
def check(name: str, python: str) -> None:
    """Check that NAME's servers can start: the Python a run would use imports SGLang's server."""
    from areal_cli.rollout.sglang_env import check_python, resolve_sglang_python

    py = resolve_sglang_python(python, what="--python")
    info = check_python(py)
    click.echo(f"{py}: sglang {info['sglang']}, torch {info['torch']}: its server imports")

"""One error contract for every ``areal`` command: a problem the user can fix is one line, never a traceback.

:func:`one_line_errors` wraps a click command callback: :class:`~areal_cli.foundations.errors.UserError` -> ``error:
<message>`` on stderr and its exit code (2); a rollout server that cannot be reached or answers an error
(:class:`~areal_cli.rollout.protocol.ServerError`) -> ``error: rollout server: <message>``, exit 2; a run that
failed for another reason (:class:`~areal_cli.foundations.errors.RunFailure`, e.g. a trainer rank died) -> ``error:
<headline>``, exit 1; Ctrl-C ->
``interrupted``, exit 130. Imports click and pure modules only (``areal --help`` stays fast).
"""

from __future__ import annotations

import functools
import sys

import click

from areal_cli.foundations.errors import RunFailure, UserError
from areal_cli.rollout.protocol import ServerError  # pure module: no torch, no HTTP client


def one_line_errors(fn):
    """Decorator for command callbacks: user errors, server errors and Ctrl-C as one line (see module doc)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from areal_cli.config.keys import defer_notes, drop_notes, flush_notes

        defer_notes()  # deprecation notes wait until the settings are known good (or an error replaces them)
        try:
            out = fn(*args, **kwargs)
            flush_notes()
            return out
        except BaseException:  # an error replaces them; a command that exits on its own said them already
            drop_notes()
            raise
    return _one_line(wrapper)


def _one_line(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        except ServerError as e:
            click.echo(f"error: rollout server: {e}", err=True)
            sys.exit(2)
        except RunFailure as e:
            click.echo(f"error: {e.headline}", err=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper

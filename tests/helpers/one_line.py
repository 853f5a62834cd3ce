"""One-line errors: what a user sees when the kit refuses input is one line naming the problem, never a
traceback. The assertions every test of an error message shares."""

from __future__ import annotations


def assert_one_line(message: str, *needles: str) -> str:
    """Assert ``message`` (an exception's text) is one line without a traceback and holds every needle;
    returns it."""
    assert "\n" not in message and "Traceback" not in message, message
    for n in needles:
        assert n in message, (n, message)
    return message


def cli_error_line(exit_code: int, output: str, *needles: str, code: int = 2) -> str:
    """Assert a CLI run failed with exit ``code`` and printed exactly one non-blank line, ``error: ...``, with no
    traceback and every needle in it; returns that line."""
    assert exit_code == code, output
    lines = [x for x in output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in output, output
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def one_line_error(res, *needles: str, code: int = 2) -> str:
    """``cli_error_line`` of a click ``CliRunner`` result."""
    return cli_error_line(res.exit_code, res.output, *needles, code=code)


def last_error_line(res, code: int, *needles: str) -> str:
    """Like ``one_line_error`` for a command that may print its plan first: a click ``CliRunner`` result that
    exited with ``code`` and whose last non-blank line is ``error: ...`` with every needle in it, with no
    traceback anywhere in the output; returns that line."""
    assert res.exit_code == code, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert lines and lines[-1].startswith("error: ") and "Traceback" not in res.output, res.output
    for n in needles:
        assert n in lines[-1], (n, lines[-1])
    return lines[-1]

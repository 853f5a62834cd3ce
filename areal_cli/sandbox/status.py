"""The isolation in force for a job that grades code: checked once at its start, stated in its outputs.

``areal eval`` (results.json, report.md) and ``areal train`` with a code task (metrics.jsonl, summary.json)
call :func:`isolation_in_force` before the first program runs: it applies the job's setting (``auto`` or
``strict``) to this process and the grader processes it starts, runs the sandbox once, and returns what
every later run will get. A level below ``"full"`` is said in one warning line (:func:`reduced_warning`);
``strict`` refuses to start instead.
"""

from __future__ import annotations

import os

import areal_cli.sandbox.host as host
from areal_cli.sandbox.results import SandboxError
from areal_cli.sandbox.runner import network_isolation

SETTINGS = ("auto", "strict")


def isolation_in_force(setting: str | None = None) -> dict:
    """Apply ``setting`` and probe the sandbox once.

    Args:
        setting: ``"auto"`` or ``"strict"``; None keeps ``AREAL_SANDBOX_ISOLATION`` (default ``auto``). It is
            exported to ``AREAL_SANDBOX_ISOLATION`` so that grader processes started later follow it.
    Returns:
        ``{"setting", "level" ("full" | "reduced"), "summary" (one line, see describe_isolation),
        "network"}``.
    Raises:
        SandboxError: ``strict`` and the full set is not available; or the sandbox cannot run at all (as
            root without namespaces, when no unprivileged uid can reach the interpreter); or a malformed
            ``AREAL_SANDBOX_*`` variable. One line each.
        ValueError: ``setting`` is not one of :data:`SETTINGS`.
    """
    if setting is not None:
        if setting not in SETTINGS:
            raise ValueError(f"sandbox isolation must be 'auto' or 'strict', got {setting!r}")
        os.environ["AREAL_SANDBOX_ISOLATION"] = setting
    try:
        chosen = host.isolation_setting()
    except host.HostConfigError as exc:
        raise SandboxError(str(exc)) from None
    info = network_isolation()
    return {"setting": chosen, "level": info["level"], "summary": info["summary"], "network": info["network"]}


def reduced_warning(state: dict) -> str | None:
    """The warning line for a level below full, or None."""
    if state["level"] == "full":
        return None
    return (f"the code sandbox runs with reduced isolation ({state['summary']}); "
            "isolation 'strict' refuses to grade without every layer")

"""Sandbox for untrusted programs (model-written code): limits, isolation, and a per-test harness.

Public API: :class:`Limits`, :func:`run_python`, :func:`run_tests`, :class:`RunResult`,
:class:`SandboxRun`, :class:`SandboxError`, :func:`network_isolation`, :func:`describe_isolation`. See :mod:`.runner` for the
isolation levels, :mod:`.results` for what a run reports and ``harness.py`` for the process layout.
"""

from areal_cli.sandbox.limits import Limits
from areal_cli.sandbox.results import RunResult, SandboxError, SandboxRun, describe_isolation
from areal_cli.sandbox.runner import LCB_PRELUDE, network_isolation, read_roots, run_python, run_tests

__all__ = [
    "LCB_PRELUDE",
    "Limits",
    "RunResult",
    "SandboxError",
    "SandboxRun",
    "describe_isolation",
    "network_isolation",
    "read_roots",
    "run_python",
    "run_tests",
]

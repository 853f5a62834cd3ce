"""A stand-in ``sglang`` package for tests (not SGLang): ``python -m sglang.launch_server`` parses SGLang's
flags and runs the embedded server (``areal_cli.rollout.server``), which speaks SGLang's native HTTP protocol.

Put ``tests/fake_sglang`` on ``PYTHONPATH`` to exercise the real SGLang launch path on CPU.
"""

__version__ = "0.0.0+areal-fake"

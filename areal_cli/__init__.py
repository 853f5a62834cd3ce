"""areal: a reproducibility kit for fully asynchronous RL of reasoning LLMs.

Importing this package is cheap: no torch, no megatron. Heavy modules are imported lazily by the
commands that need them.
"""

__version__ = "0.1.0"

"""Embedded inference server: SGLang's native HTTP protocol on top of :class:`InferenceEngine`, one child process
per server (``python -m areal_cli.rollout.server --model-path DIR --port N``) on 127.0.0.1.

Modules:

- :mod:`~areal_cli.rollout.server.app`: the FastAPI application, its status routes and the endpoint list, with the
  routes of :mod:`~.generate_routes` (``/generate``, ``/v1/chat/completions``), :mod:`~.control_routes` (pause,
  continue, abort, weight version) and :mod:`~.weight_routes` (weights from disk, the weight-update group);
  :mod:`~.http_bodies` reads request bodies and writes error replies.
- :mod:`~areal_cli.rollout.server.worker`: the engine thread and the state the handlers share with it.
- :mod:`~areal_cli.rollout.server.__main__`: the child process (command line, model load, uvicorn).
- :mod:`~areal_cli.rollout.server.launcher`: :class:`EmbeddedServer`, the parent's handle that starts the
  child, waits until it is ready and kills its process group on ``stop()``, on context exit, at interpreter
  exit, and (watchdog in the child) when the parent dies.
"""

from areal_cli.rollout.server.app import FLUSH_FAILED, FLUSH_OK
from areal_cli.rollout.server.launcher import EmbeddedServer

__all__ = ["FLUSH_FAILED", "FLUSH_OK", "EmbeddedServer"]

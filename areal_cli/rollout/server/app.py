"""The HTTP application of an embedded server: SGLang's native protocol on top of :class:`InferenceEngine`.

:func:`build_app` returns the FastAPI application serving one :class:`~areal_cli.rollout.server.worker.ServerState`;
request and reply bodies are the dataclasses of :mod:`areal_cli.rollout.protocol`. Shapes as recorded from SGLang
0.5.23 (``shared/fixtures/sglang`` of the workspace); bad input -> 400 ``{"error": {"message"}}``
(:mod:`~areal_cli.rollout.server.http_bodies`). The routes, one module per family:

- :mod:`~areal_cli.rollout.server.generate_routes`: ``POST /generate`` (single or batch ``input_ids``) and
  ``POST /v1/chat/completions`` (OpenAI Chat Completions, for agents; training uses /generate).
- :mod:`~areal_cli.rollout.server.control_routes`: ``POST /pause_generation`` ``{mode}`` (abort, retract,
  in_place), ``/continue_generation``, ``/abort_request``, ``/update_weight_version`` (label only).
- :mod:`~areal_cli.rollout.server.weight_routes`: ``POST /update_weights_from_disk`` and the weight-update group
  (``/init_weights_update_group``, ``/update_weights_from_distributed``, ``/destroy_weights_update_group``);
  every output token records the version that produced it (``meta_info.weight_versions`` spans).

Here, the state of the server:

- ``GET /health``, ``/health_generate``: 200 at once, also while paused (unlike SGLang 0.5.23, whose
  /health blocks while paused). ``GET /ready``: 503 while paused.
- ``GET /model_info`` (alias ``/get_model_info``), ``GET /server_info`` (alias ``/get_server_info``; its
  ``internal_states`` add ``num_held_reqs``, requests held by a pause, and ``health_requests``, ``/health`` calls
  received, so tests can observe both on the server side, and ``step_costs``, the engine's per-step cost sums of
  :mod:`areal_cli.rollout.engine.step_costs`).
- ``POST|GET /flush_cache``: 200 text when idle, 400 ``"Flush cache failed.\\n"`` while requests run.
- Any unhandled error: 500 with the error body (never a bare traceback page).
"""

import asyncio
import contextlib
import logging
from pathlib import Path

from areal_cli.rollout.server.worker import ServerState

log = logging.getLogger("areal.rollout.server")

FLUSH_OK = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            "requests, the operation will not be performed.)\n")
FLUSH_FAILED = "Flush cache failed.\n"


def build_app(state: ServerState):
    """The FastAPI application serving ``state`` (see module docstring for the endpoints)."""
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse, Response

    from areal_cli.rollout.server.control_routes import add_control_routes
    from areal_cli.rollout.server.generate_routes import add_generate_routes
    from areal_cli.rollout.server.http_bodies import error_response
    from areal_cli.rollout.server.weight_routes import add_weight_routes

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.loop = asyncio.get_running_loop()
        state.unheld = asyncio.Event()
        state.unheld.set()
        state.update_lock = asyncio.Lock()
        state.worker.start()
        yield
        state.worker.stop()

    app = FastAPI(title="areal embedded server (SGLang native protocol)", lifespan=lifespan)
    eng = state.engine

    add_generate_routes(app, state)
    add_control_routes(app, state)
    add_weight_routes(app, state)

    @app.get("/health")
    @app.get("/health_generate")
    async def health():
        state.health_requests += 1
        if state.worker.error is not None:
            return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/ready")
    async def ready():
        return Response(status_code=503 if (state.paused or state.worker.error is not None) else 200)

    def model_info() -> dict:
        s = eng.spec
        return {
            "model_path": eng.model_path, "served_model_name": state.args.model_path,
            "tokenizer_path": state.args.model_path if state.tokenizer is not None else None,
            "is_generation": True, "preferred_sampling_params": None, "weight_version": eng.weight_version,
            "load_format": "auto", "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
            "vocab_size": s.vocab_size, "context_length": eng.context_length,
            "eos_token_ids": list(s.eos_token_ids), "max_total_tokens": eng.max_total_tokens,
            "max_running_requests": eng.max_running_requests, "engine": "areal-embedded",
        }

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def get_model_info():
        return model_info()

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info():
        a = state.args
        return {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
            "model_path": a.model_path, "weight_version": a.weight_version, "version": "areal-embedded",
            "status": "ready", "startup_time": state.started, "paused": state.paused,
            "internal_states": [{
                "num_running_reqs": state.worker.n_running, "num_waiting_reqs": state.worker.n_waiting,
                "num_http_waiting": len(state.waiters), "num_held_reqs": state.held_requests,
                "health_requests": state.health_requests, "free_kv_tokens": eng.free_tokens,
                "last_step_s": state.worker.last_step_s, **eng.stats, "step_costs": eng.step_costs.to_dict(),
            }],
        }

    @app.post("/flush_cache")
    @app.get("/flush_cache")
    async def flush_cache():
        if state.worker.busy():
            return PlainTextResponse(FLUSH_FAILED, status_code=400)
        return PlainTextResponse(FLUSH_OK, status_code=200)

    @app.exception_handler(Exception)
    async def on_error(request, exc):  # never a bare 500 traceback page
        log.exception("unhandled error on %s", request.url.path)
        return error_response(500, f"{type(exc).__name__}: {exc}")

    return app

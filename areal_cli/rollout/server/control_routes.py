"""Control routes of the embedded server: pause, continue, abort, and relabelling the loaded weights.

- ``POST /pause_generation`` ``{mode}``: "abort" (default) aborts every in-flight request (they return
  finish_reason abort with partial tokens + logprobs), "retract" drops their KV and keeps them queued,
  "in_place" just stops stepping. New ``/generate`` requests wait until ``/continue_generation``.
- ``POST /continue_generation``.
- ``POST /abort_request`` ``{rid}`` or ``{abort_all: true}``: 200, empty body.
- ``POST /update_weight_version`` ``{new_version}``: label only.
"""

import asyncio
import json

from areal_cli.rollout.protocol.control import AbortRequest, PauseGenerationRequest, UpdateWeightVersionRequest
from areal_cli.rollout.protocol.errors import ProtocolError
from areal_cli.rollout.server.http_bodies import error_response, read_json
from areal_cli.rollout.server.worker import ServerState


async def abort_all_and_wait(state: ServerState) -> int:
    """Abort every request in the engine and deliver their partial results -> how many were aborted."""
    results = await asyncio.wrap_future(state.worker.call(lambda e: e.abort_all()))
    for res in results:
        state.on_result(res)
    await asyncio.sleep(0)  # let the deliveries run before answering
    return len(results)


def add_control_routes(app, state: ServerState) -> None:
    """Add ``/pause_generation``, ``/continue_generation``, ``/abort_request`` and ``/update_weight_version``
    (serving ``state``) to the FastAPI ``app``."""
    from fastapi import Request
    from fastapi.responses import Response

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        try:
            raw = await request.body()
            mode = PauseGenerationRequest.from_json(json.loads(raw) if raw else {}).mode
        except json.JSONDecodeError:
            return error_response(400, "pause_generation body must be a JSON object")
        except ProtocolError as e:
            return error_response(400, str(e))
        state.paused = True
        state.refresh_hold()
        if mode == "abort":
            await abort_all_and_wait(state)
        else:
            def stop_stepping(e, mode=mode):
                state.worker.stepping_paused = True
                return e.retract_all() if mode == "retract" else 0
            await asyncio.wrap_future(state.worker.call(stop_stepping))
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation():
        def resume(e):
            state.worker.stepping_paused = False
        await asyncio.wrap_future(state.worker.call(resume))
        state.paused = False
        state.refresh_hold()
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request):
        try:
            req = UpdateWeightVersionRequest.from_json(await read_json(request))
        except ProtocolError as e:
            return error_response(400, f"new_version is required ({e})")
        if req.abort_all_requests:
            await abort_all_and_wait(state)

        def setv(e, v=req.new_version):
            e.weight_version = v
        await asyncio.wrap_future(state.worker.call(setv))
        return {"success": True, "message": f"Weight version updated to {req.new_version}",
                "new_version": req.new_version}

    @app.post("/abort_request")
    async def abort_request(request: Request):
        try:
            req = AbortRequest.from_json(await read_json(request))
        except ProtocolError as e:
            return error_response(400, str(e))
        if req.abort_all:
            await abort_all_and_wait(state)
        elif req.rid is not None:
            res = await asyncio.wrap_future(state.worker.call(lambda e, rid=req.rid: e.abort(rid)))
            if res is not None:
                state.on_result(res)
        return Response(status_code=200)

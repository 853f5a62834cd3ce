"""Weight-update routes of the embedded server: from disk, and over a weight-update group (a collective).

- ``POST /update_weights_from_disk`` ``{model_path, weight_version?, abort_all_requests?, flush_cache?}``: without
  abort and while not paused it waits for in-flight requests to finish (new ones wait), like SGLang. With
  ``flush_cache`` (default true, as SGLang's) and requests still running (paused in place) it is refused with 400
  and the old weights stay: SGLang asserts that its post-load flush succeeds, which it cannot then.
  Every output token records the version that produced it (``meta_info.weight_versions`` spans).
- ``POST /init_weights_update_group`` ``{master_address, master_port, rank_offset, world_size, group_name,
  backend}`` (SGLang ``InitWeightsUpdateGroupReqInput``; backend "gloo" only on this CPU server): joins a
  new process group as rank ``rank_offset`` (in a thread; answers once the group formed). A group of the
  same name is replaced.
- ``POST /begin_weight_update`` ``{selector?}`` / ``POST /end_weight_update`` ``{}``: open and close a weight-update
  session, as SGLang 0.5.23 does (a second begin, or an end without a begin, is refused with SGLang's message;
  unless paused, a begin first waits for in-flight requests, like SGLang's writer lock).
- ``POST /update_weights_from_distributed`` ``{names, dtypes, shapes, group_name, weight_version?,
  abort_all_requests?, flush_cache?}``: refused outside a session (SGLang's message, HTTP 400); receives one broadcast tensor per entry from rank 0 (allocated by
  the payload's shapes/dtypes, so the group stays in step even when the load is then refused), then loads
  them like ``/update_weights_from_disk`` (same abort/drain/hold rules, same reply shapes). A failed
  receive drops the group.
- ``POST /destroy_weights_update_group`` ``{group_name}``. See :mod:`areal_cli.rollout.weight_sync`.
"""

import asyncio
import json
import logging
import time

from areal_cli.rollout.protocol.errors import ProtocolError
from areal_cli.rollout.protocol.weight_update import (
    NO_SESSION, NO_SESSION_TO_END, SESSION_OPEN, BeginWeightUpdateRequest, DestroyWeightsUpdateGroupRequest, InitWeightsUpdateGroupRequest, UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest, WeightUpdateReply,
)
from areal_cli.rollout.server.control_routes import abort_all_and_wait
from areal_cli.rollout.server.http_bodies import read_json
from areal_cli.rollout.server.worker import ServerState

log = logging.getLogger("areal.rollout.server")

#: A weight load that asks for SGLang's post-load prefix-cache flush (its default) while requests are running
#: (paused in place) is refused before loading: SGLang asserts the flush succeeds, and it cannot with requests
#: running, so a real server would die there.
FLUSH_WITH_REQUESTS = ("Cache flush failed after updating weights: requests are running (paused in place); "
                       "send flush_cache: false with an in-place update")


def add_weight_routes(app, state: ServerState) -> None:
    """Add ``/update_weights_from_disk``, ``/init_weights_update_group``, ``/destroy_weights_update_group`` and
    ``/update_weights_from_distributed`` (serving ``state``) to the FastAPI ``app``."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    async def running_in_engine() -> int:
        """Requests running in the engine now (asked on the engine thread, after any abort queued before)."""
        return await asyncio.wrap_future(state.worker.call(lambda e: len(e.running)))

    async def in_engine() -> int:
        """Requests running or waiting in the engine now (asked on the engine thread)."""
        return await asyncio.wrap_future(state.worker.call(lambda e: len(e.running) + len(e.waiting)))

    async def quiesce(abort_all: bool) -> None:
        """Before a weight update: abort every request (``abort_all_requests``), or, unless paused, wait for the
        in-flight requests to finish, as SGLang's weight-update lock does. The worker's own counts are refreshed
        by its steps only, so the wait ends when the engine thread itself reports no request (a request queued
        right after a step that emptied the engine would otherwise be found running by the load)."""
        if abort_all:
            await abort_all_and_wait(state)
        elif not state.paused:
            while state.worker.busy() or await in_engine():
                await asyncio.sleep(0.005)

    def weight_reply(success: bool, message: str, status: int = 200, num_paused_requests: int | None = None):
        return JSONResponse(WeightUpdateReply(success, message, num_paused_requests).to_json(), status_code=status)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        try:
            req = UpdateWeightsFromDiskRequest.from_json(await read_json(request))
        except ProtocolError as e:
            return weight_reply(False, str(e), 400, num_paused_requests=0)
        version = req.weight_version
        async with state.update_lock:
            state.updating += 1
            state.refresh_hold()
            try:
                await quiesce(req.abort_all_requests)
                if req.flush_cache is not False and await running_in_engine():
                    return weight_reply(False, FLUSH_WITH_REQUESTS, 400, num_paused_requests=0)

                def load(e, path=req.model_path, v=version):
                    e.load_weights(path, v)

                try:
                    await asyncio.wrap_future(state.worker.call(load))
                except Exception as e:  # noqa: BLE001 - reported to the client, old weights stay
                    return weight_reply(False, f"Failed to update weights: {e}", 400, num_paused_requests=0)
            finally:
                state.updating -= 1
                state.refresh_hold()
        msg = "Succeeded to update model weights."
        if version is not None:
            msg += f" Weight version updated to {version}."
        return WeightUpdateReply(True, msg, num_paused_requests=0).to_json()

    def drop_group(name: str) -> None:
        from areal_cli.rollout.process_group import destroy_process_group

        pg = state.weight_groups.pop(name, None)
        if pg is not None and name not in state.receiving:
            destroy_process_group(pg)

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request):
        from areal_cli.rollout.process_group import init_custom_process_group

        try:
            req = InitWeightsUpdateGroupRequest.from_json(await read_json(request))
        except ProtocolError as e:
            return weight_reply(False, str(e), 400)
        if req.backend != "gloo":
            return weight_reply(False, f"backend {req.backend!r} is not supported by the embedded (CPU) "
                                       f"server: use gloo", 400)
        t_end = time.monotonic() + state.args.weight_sync_timeout_s
        while req.group_name in state.receiving and time.monotonic() < t_end:
            await asyncio.sleep(0.05)  # an old group of this name still receives: torch needs it gone first
        await asyncio.to_thread(drop_group, req.group_name)
        try:
            pg = await asyncio.to_thread(
                init_custom_process_group, "gloo", f"tcp://{req.master_address}:{req.master_port}",
                req.world_size, req.rank_offset, req.group_name, state.args.weight_sync_timeout_s)
        except Exception as e:  # noqa: BLE001 - reported to the trainer
            return weight_reply(False, f"Failed to init custom process group {req.group_name!r}: {e}", 400)
        state.weight_groups[req.group_name] = pg
        log.info("joined weight-update group %s as rank %d of %d", req.group_name, req.rank_offset,
                 req.world_size)
        return weight_reply(True, "Succeeded to initialize custom process group.")

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(request: Request):
        try:
            raw = await request.body()
            name = DestroyWeightsUpdateGroupRequest.from_json(json.loads(raw) if raw else {}).group_name
        except (ProtocolError, json.JSONDecodeError) as e:
            return weight_reply(False, str(e), 400)
        if name not in state.weight_groups:
            return weight_reply(False, f"Weight update group {name!r} does not exist.", 400)
        await asyncio.to_thread(drop_group, name)
        return weight_reply(True, "Succeeded to destroy custom process group.")

    @app.post("/begin_weight_update")
    async def begin_weight_update(request: Request):
        try:
            BeginWeightUpdateRequest.from_json(await read_json(request, empty_ok=True))
        except ProtocolError as e:
            return weight_reply(False, str(e), 400)
        async with state.update_lock:
            if state.weight_session:
                return weight_reply(False, SESSION_OPEN, 400)
            await quiesce(False)
            state.weight_session = True
        return weight_reply(True, "Success")

    @app.post("/end_weight_update")
    async def end_weight_update(request: Request):
        async with state.update_lock:
            if not state.weight_session:
                return weight_reply(False, NO_SESSION_TO_END, 400)
            state.weight_session = False
        return weight_reply(True, "Success")

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request):
        try:
            req = UpdateWeightsFromDistributedRequest.from_json(await read_json(request))
        except ProtocolError as e:
            return weight_reply(False, str(e), 400)
        if not state.weight_session:
            return weight_reply(False, NO_SESSION.format(op="update_weights_from_distributed"), 400)
        name = req.group_name
        if name not in state.weight_groups:
            return weight_reply(False, f"Weight update group {name!r} is not initialized: call "
                                       f"/init_weights_update_group first.", 400)
        async with state.update_lock:
            state.updating += 1
            state.refresh_hold()
            try:
                await quiesce(req.abort_all_requests)
                pg = state.weight_groups.get(name)
                if pg is None:
                    return weight_reply(False, f"Weight update group {name!r} was destroyed.", 400)
                from areal_cli.rollout.process_group import destroy_process_group, receive_broadcast

                state.receiving.add(name)
                try:
                    named = await asyncio.to_thread(receive_broadcast, pg, req.specs)
                except Exception as e:  # noqa: BLE001 - the group is out of step: drop it
                    named, error = None, e
                    if state.weight_groups.get(name) is pg:
                        state.weight_groups.pop(name)
                state.receiving.discard(name)
                if state.weight_groups.get(name) is not pg:  # dropped (here or by a destroy) meanwhile
                    await asyncio.to_thread(destroy_process_group, pg)
                if named is None:
                    return weight_reply(False, f"Failed to receive weights over group {name!r}: {error}", 400)
                if req.flush_cache and await running_in_engine():
                    return weight_reply(False, FLUSH_WITH_REQUESTS, 400)

                def load(e, named=named, v=req.weight_version):
                    e.load_tensors(named, v, source="update_weights_from_distributed")

                try:
                    await asyncio.wrap_future(state.worker.call(load))
                except Exception as e:  # noqa: BLE001 - reported to the trainer, old weights stay
                    return weight_reply(False, f"Failed to update weights: {e}", 400)
            finally:
                state.updating -= 1
                state.refresh_hold()
        msg = "Succeeded to update parameter online."
        if req.weight_version is not None:
            msg += f" Weight version updated to {req.weight_version}."
        return weight_reply(True, msg)

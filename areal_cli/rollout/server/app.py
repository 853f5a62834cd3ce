"""The HTTP routes of an embedded server: SGLang's native protocol on top of :class:`InferenceEngine`.

:func:`build_app` returns the FastAPI application serving one :class:`~areal_cli.rollout.server.worker.ServerState`;
request and reply bodies are the dataclasses of :mod:`areal_cli.rollout.protocol`.

Endpoints (shapes as recorded from SGLang 0.5.23, ``shared/fixtures/sglang`` of the workspace):

- ``POST /generate`` single or batch ``input_ids``; SGLang response shape (protocol.build_generate_response).
  Out-of-range ids, bad sampling values and requests that can never fit -> 400 ``{"error": {"message"}}``
  (a real SGLang server crashes on out-of-range ids).
- ``POST /pause_generation`` ``{mode}``: "abort" (default) aborts every in-flight request (they return
  finish_reason abort with partial tokens + logprobs), "retract" drops their KV and keeps them queued,
  "in_place" just stops stepping. New ``/generate`` requests wait until ``/continue_generation``.
- ``POST /continue_generation``.
- ``POST /update_weights_from_disk`` ``{model_path, weight_version?, abort_all_requests?, flush_cache?}``: without
  abort and while not paused it waits for in-flight requests to finish (new ones wait), like SGLang. With
  ``flush_cache`` (default true, as SGLang's) and requests still running (paused in place) it is refused with 400
  and the old weights stay: SGLang asserts that its post-load flush succeeds, which it cannot then.
  Every output token records the version that produced it (``meta_info.weight_versions`` spans).
- ``POST /update_weight_version`` ``{new_version}``: label only.
- ``POST /init_weights_update_group`` ``{master_address, master_port, rank_offset, world_size, group_name,
  backend}`` (SGLang ``InitWeightsUpdateGroupReqInput``; backend "gloo" only on this CPU server): joins a
  new process group as rank ``rank_offset`` (in a thread; answers once the group formed). A group of the
  same name is replaced.
- ``POST /update_weights_from_distributed`` ``{names, dtypes, shapes, group_name, weight_version?,
  abort_all_requests?, flush_cache?}``: receives one broadcast tensor per entry from rank 0 (allocated by
  the payload's shapes/dtypes, so the group stays in step even when the load is then refused), then loads
  them like ``/update_weights_from_disk`` (same abort/drain/hold rules, same reply shapes). A failed
  receive drops the group.
- ``POST /destroy_weights_update_group`` ``{group_name}``. See :mod:`areal_cli.rollout.weight_sync`.
- ``POST /v1/chat/completions``: OpenAI Chat Completions (messages, tools, temperature, top_p,
  max_tokens / max_completion_tokens, single-token stop strings, n=1, logprobs; :mod:`areal_cli.agents.openai_schema`),
  rendered with the model's chat template, Qwen/Hermes ``<tool_call>`` blocks parsed into ``tool_calls``; bad
  input -> 400 with an OpenAI error body. Training does not use it (it returns no token ids): the agent proxy
  (:mod:`areal_cli.agents.proxy`) records token ids by talking /generate.
- ``GET /health``, ``/health_generate``: 200 at once, also while paused (unlike SGLang 0.5.23, whose
  /health blocks while paused). ``GET /ready``: 503 while paused.
- ``GET /model_info`` (alias ``/get_model_info``), ``GET /server_info`` (alias ``/get_server_info``; its
  ``internal_states`` add ``num_held_reqs``, requests held by a pause, and ``health_requests``, ``/health`` calls
  received, so tests can observe both on the server side, and ``step_costs``, the engine's per-step cost sums of
  :mod:`areal_cli.rollout.engine.step_costs`).
- ``POST|GET /flush_cache``: 200 text when idle, 400 ``"Flush cache failed.\\n"`` while requests run.
- ``POST /abort_request`` ``{rid}`` or ``{abort_all: true}``: 200, empty body.
"""

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from areal_cli.rollout.server.worker import ServerState

log = logging.getLogger("areal.rollout.server")

FLUSH_OK = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            "requests, the operation will not be performed.)\n")
FLUSH_FAILED = "Flush cache failed.\n"
#: A weight load that asks for SGLang's post-load prefix-cache flush (its default) while requests are running
#: (paused in place) is refused before loading: SGLang asserts the flush succeeds, and it cannot with requests
#: running, so a real server would die there.
FLUSH_WITH_REQUESTS = ("Cache flush failed after updating weights: requests are running (paused in place); "
                       "send flush_cache: false with an in-place update")


def _error(status: int, message: str):
    from fastapi.responses import JSONResponse

    from areal_cli.rollout.protocol import error_body

    return JSONResponse(error_body(message), status_code=status)


def build_app(state: ServerState):
    """The FastAPI application serving ``state`` (see module docstring for the endpoints)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, Response

    from areal_cli.rollout.protocol import (
        AbortRequest, DestroyWeightsUpdateGroupRequest, InitWeightsUpdateGroupRequest, PauseGenerationRequest,
        ProtocolError, UpdateWeightsFromDiskRequest, UpdateWeightsFromDistributedRequest, UpdateWeightVersionRequest,
        WeightUpdateReply, build_generate_response, finish_reason_json, parse_generate_request,
    )
    from areal_cli.rollout.engine import EngineError

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

    async def read_json(request: Request) -> Any:
        raw = await request.body()
        if not raw:
            raise ProtocolError("The request body is empty (expected a JSON object).")
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:
            raise ProtocolError(f"JSON decode error: {e}") from e

    def to_json(res, req, t_recv: float) -> dict:
        fr = finish_reason_json(res.finish_reason, matched=res.matched_stop, length=res.max_new_tokens,
                                message=res.abort_message or "Aborted")
        text_ids = res.output_ids
        if res.finish_reason == "stop" and text_ids:
            text_ids = text_ids[:-1]  # the matched stop token is left out of text (as SGLang)
        itl = res.input_logprobs if (req.return_logprob and res.input_logprobs is not None) else None
        texts = [state.token_text(t) for t in res.output_ids] if req.return_text_in_logprobs else None
        itexts = [state.token_text(t) for _, t in itl] if (itl and req.return_text_in_logprobs) else None
        return build_generate_response(
            rid=res.rid, text=state.decode(text_ids), output_ids=res.output_ids,
            output_logprobs=res.output_logprobs, finish_reason=fr, prompt_tokens=len(res.prompt_ids),
            weight_version=res.weight_version, token_versions=res.output_versions,
            return_logprob=req.return_logprob, input_token_logprobs=itl, token_texts=texts,
            input_token_texts=itexts, e2e_latency=time.monotonic() - t_recv,
            num_retractions=res.num_retractions, sent_ts=time.time(),
        )

    async def submit(reqs, t_recv: float):
        """Run validated requests on the engine (held while paused) -> their EngineResults, or an error
        response (shared by /generate and /v1/chat/completions)."""
        for r in reqs:
            if r.rid is None:
                r.rid = uuid.uuid4().hex
        rids = [r.rid for r in reqs]
        # Like SGLang: while paused (or while a weight update waits for a drain) new requests wait here.
        if state.held():
            state.held_requests += 1
            try:
                while state.held():
                    await state.unheld.wait()
            finally:
                state.held_requests -= 1
        # From here to the enqueue there is no await: the checks and the registration are atomic.
        if state.worker.error is not None:
            return _error(500, f"The engine failed and is not serving: {state.worker.error!r}")
        if len(set(rids)) != len(rids) or any(rid in state.waiters for rid in rids):
            return _error(400, "Duplicate request id: a request with this rid is still running.")
        futs = []
        for r in reqs:
            fut = state.loop.create_future()
            state.waiters[r.rid] = (fut, t_recv)
            futs.append(fut)

        def add_all(engine, reqs=reqs):
            errors = []
            for r in reqs:
                try:
                    engine.add_request(r.rid, r.input_ids, r.sampling_params,
                                       logprob_start_len=r.logprob_start_len if r.return_logprob else -1)
                except EngineError as e:
                    errors.append((r.rid, str(e)))
            return errors

        errors = await asyncio.wrap_future(state.worker.call(add_all))
        if errors:
            abort_rids = [r.rid for r in reqs if r.rid not in {e[0] for e in errors}]
            for rid in abort_rids:
                state.worker.call(lambda e, rid=rid: e.abort(rid))
            for r in reqs:
                state.waiters.pop(r.rid, None)
            return _error(400, errors[0][1])
        return list(await asyncio.gather(*futs))

    @app.post("/generate")
    async def generate(request: Request):
        t_recv = time.monotonic()
        try:
            body = await read_json(request)
            reqs, is_batch = parse_generate_request(body, vocab_size=eng.vocab_size,
                                                    context_length=eng.context_length)
            for r in reqs:
                eng.validate(r.input_ids, r.sampling_params)  # pure checks; safe off the engine thread
        except (ProtocolError, EngineError) as e:
            return _error(400, str(e))
        results = await submit(reqs, t_recv)
        if not isinstance(results, list):
            return results  # an error response
        out = [to_json(res, r, t_recv) for res, r in zip(results, reqs)]
        return JSONResponse(out if is_batch else out[0])

    async def chat_tokenizer():
        """The Hugging Face tokenizer (with its chat template) of the served model, loaded on first use."""
        if state.chat_tokenizer is None:
            from transformers import AutoTokenizer

            state.chat_tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, state.args.model_path)
        return state.chat_tokenizer

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        """OpenAI Chat Completions (:mod:`areal_cli.agents.openai_schema`): the messages are rendered with the
        model's chat template and generated like one /generate request; a request aborted by a pause or a weight
        update is resumed here with its prefix (the answer then mixes policy versions, as /generate's do). Bad
        input: 400 with an OpenAI error body."""
        from areal_cli.agents.openai_schema import (
            OpenAIError, assistant_message, chat_completion_body, logprobs_content, parse_chat_request, parse_json_body,
            render_prompt_ids, stop_token_ids,
        )
        from areal_cli.rollout.protocol import GenerateRequest, SamplingParams

        def oai_error(e: OpenAIError):
            return JSONResponse(e.body(), status_code=e.status)

        t_recv = time.monotonic()
        try:
            req = parse_chat_request(parse_json_body(await request.body()))
            try:
                tok = await chat_tokenizer()
            except Exception as e:  # noqa: BLE001 - no usable tokenizer in the model directory
                raise OpenAIError(f"the model has no usable tokenizer for chat: {type(e).__name__}: {e}") from None
            prompt = render_prompt_ids(tok, req.messages, req.tools)
            stops = sorted(set(stop_token_ids(tok, req.stop)) | set(eng.spec.eos_token_ids))
            room = min(eng.context_length, eng.max_total_tokens) - len(prompt)
            if room < 1:
                raise OpenAIError(f"the prompt is {len(prompt)} tokens: no room left in the context of "
                                  f"{eng.context_length} tokens", param="messages", code="context_length_exceeded")
            budget = min(req.max_tokens, room) if req.max_tokens is not None else room
            sp = SamplingParams(max_new_tokens=budget, temperature=req.temperature, top_p=req.top_p,
                                top_k=req.top_k, stop_token_ids=stops, seed=req.seed)
            try:
                eng.validate(prompt, sp)
            except EngineError as e:
                raise OpenAIError(str(e), param="messages") from None
        except OpenAIError as e:
            return oai_error(e)
        rid = f"chat-{uuid.uuid4().hex}"
        out_ids, out_lps, attempt = [], [], 0
        while True:
            sp_now = dataclasses.replace(sp, max_new_tokens=budget - len(out_ids))
            gen = GenerateRequest(prompt + out_ids, sp_now, return_logprob=True,
                                  rid=rid if attempt == 0 else f"{rid}.r{attempt}")
            results = await submit([gen], t_recv)
            if not isinstance(results, list):
                return results
            res = results[0]
            out_ids += list(res.output_ids)
            out_lps += list(res.output_logprobs)
            if res.finish_reason != "abort":
                finish = res.finish_reason
                break
            if len(out_ids) >= budget:
                finish = "length"
                break
            if not (state.held() or res.output_ids):  # aborted for good (abort_request), not by a pause
                return oai_error(OpenAIError("the request was aborted", status=503))
            attempt += 1
        text_ids = out_ids[:-1] if (finish == "stop" and out_ids and out_ids[-1] in stops) else out_ids
        text = tok.decode(text_ids, skip_special_tokens=True)
        message, finish = assistant_message(text, bool(req.tools), finish)
        return chat_completion_body(
            message=message, finish_reason=finish, prompt_tokens=len(prompt), completion_tokens=len(out_ids),
            model=req.model, logprobs=logprobs_content(tok, out_ids, out_lps) if req.logprobs else None,
            fingerprint=f"areal-weights-{eng.weight_version}")

    async def abort_all_and_wait() -> int:
        results = await asyncio.wrap_future(state.worker.call(lambda e: e.abort_all()))
        for res in results:
            state.on_result(res)
        await asyncio.sleep(0)  # let the deliveries run before answering
        return len(results)

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
            await abort_all_and_wait()
        elif not state.paused:
            while state.worker.busy() or await in_engine():
                await asyncio.sleep(0.005)

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        try:
            raw = await request.body()
            mode = PauseGenerationRequest.from_json(json.loads(raw) if raw else {}).mode
        except json.JSONDecodeError:
            return _error(400, "pause_generation body must be a JSON object")
        except ProtocolError as e:
            return _error(400, str(e))
        state.paused = True
        state.refresh_hold()
        if mode == "abort":
            await abort_all_and_wait()
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

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request):
        try:
            req = UpdateWeightsFromDistributedRequest.from_json(await read_json(request))
        except ProtocolError as e:
            return weight_reply(False, str(e), 400)
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

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request):
        try:
            req = UpdateWeightVersionRequest.from_json(await read_json(request))
        except ProtocolError as e:
            return _error(400, f"new_version is required ({e})")
        if req.abort_all_requests:
            await abort_all_and_wait()

        def setv(e, v=req.new_version):
            e.weight_version = v
        await asyncio.wrap_future(state.worker.call(setv))
        return {"success": True, "message": f"Weight version updated to {req.new_version}",
                "new_version": req.new_version}

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

    @app.post("/abort_request")
    async def abort_request(request: Request):
        try:
            req = AbortRequest.from_json(await read_json(request))
        except ProtocolError as e:
            return _error(400, str(e))
        if req.abort_all:
            await abort_all_and_wait()
        elif req.rid is not None:
            res = await asyncio.wrap_future(state.worker.call(lambda e, rid=req.rid: e.abort(rid)))
            if res is not None:
                state.on_result(res)
        return Response(status_code=200)

    @app.exception_handler(Exception)
    async def on_error(request, exc):  # never a bare 500 traceback page
        log.exception("unhandled error on %s", request.url.path)
        return _error(500, f"{type(exc).__name__}: {exc}")

    return app

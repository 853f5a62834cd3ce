"""Embedded inference server: SGLang's native HTTP protocol on top of :class:`InferenceEngine`.

One child process per server (``python -m areal_cli.rollout.server --model-path DIR --port N``) on
127.0.0.1: FastAPI + uvicorn answer HTTP on the main thread's event loop while one background thread owns
the engine and steps the running batch. The two talk through a command queue (engine thread) and
``loop.call_soon_threadsafe`` (results back to the waiting HTTP handlers); torch releases the GIL in its
kernels, so ``/health`` answers at once even while the engine computes.

Endpoints (shapes as recorded from SGLang 0.5.23, ``shared/fixtures/sglang`` of the workspace):

- ``POST /generate`` single or batch ``input_ids``; SGLang response shape (protocol.build_generate_response).
  Out-of-range ids, bad sampling values and requests that can never fit -> 400 ``{"error": {"message"}}``
  (a real SGLang server crashes on out-of-range ids).
- ``POST /pause_generation`` ``{mode}``: "abort" (default) aborts every in-flight request (they return
  finish_reason abort with partial tokens + logprobs), "retract" drops their KV and keeps them queued,
  "in_place" just stops stepping. New ``/generate`` requests wait until ``/continue_generation``.
- ``POST /continue_generation``.
- ``POST /update_weights_from_disk`` ``{model_path, weight_version?, abort_all_requests?}``: without
  abort and while not paused it waits for in-flight requests to finish (new ones wait), like SGLang.
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
  received, so tests can observe both on the server side).
- ``POST|GET /flush_cache``: 200 text when idle, 400 ``"Flush cache failed.\\n"`` while requests run.
- ``POST /abort_request`` ``{rid}`` or ``{abort_all: true}``: 200, empty body.

:class:`EmbeddedServer` launches such a child, waits until it is ready, and kills its process group on
``stop()``, on context exit, at interpreter exit, and (watchdog in the child) when the parent dies.
"""

import argparse
import asyncio
import atexit
import contextlib
import dataclasses
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

from areal_cli.log_tail import log_tail
from areal_cli.ports import free_port

log = logging.getLogger("areal.rollout.server")

FLUSH_OK = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            "requests, the operation will not be performed.)\n")
FLUSH_FAILED = "Flush cache failed.\n"


# ----------------------------------------------------------------------------------------------------------
# Engine thread
# ----------------------------------------------------------------------------------------------------------


class EngineWorker:
    """Owns an :class:`InferenceEngine` in a background thread; everything else talks to it via commands.

    Results of finished requests are delivered to ``on_result(EngineResult)`` from the engine thread.

    Args:
        engine: the engine (only this thread touches it after :meth:`start`).
        on_result: callback for every finished/aborted request.
        step_delay_s: sleep after every step (tests use it to make generation slow enough to interrupt).
    """

    def __init__(self, engine, on_result: Callable[[Any], None], step_delay_s: float = 0.0):
        self.engine = engine
        self.on_result = on_result
        self.step_delay_s = float(step_delay_s)
        self.stepping_paused = False
        self._cmds: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.n_running = 0
        self.n_waiting = 0
        self.last_step_s = 0.0
        self.error: BaseException | None = None

    def start(self) -> None:
        """Start the engine thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the engine thread after the current step (waits up to 5 s)."""
        self._stop.set()
        self._cmds.put(None)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def call(self, fn: Callable[[Any], Any]) -> Future:
        """Run ``fn(engine)`` on the engine thread between steps; returns a concurrent Future."""
        fut: Future = Future()
        self._cmds.put((fn, fut))
        return fut

    def busy(self) -> bool:
        """True while requests are running or queued inside the engine (read without locking)."""
        return self.n_running + self.n_waiting > 0 or not self._cmds.empty()

    def _run_cmd(self, item) -> None:
        fn, fut = item
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn(self.engine))
        except BaseException as e:  # delivered to the awaiting handler
            fut.set_exception(e)

    def _loop(self) -> None:
        eng = self.engine
        while not self._stop.is_set():
            stepping = eng.has_work() and not self.stepping_paused
            try:  # idle: block on the queue; stepping: only pick up what is already there
                item = self._cmds.get_nowait() if stepping else self._cmds.get(timeout=0.5)
            except queue.Empty:
                item = _NOTHING
            while item is not _NOTHING:  # run every pending command before the next step
                if item is None:
                    self._stop.set()
                    break
                self._run_cmd(item)
                try:
                    item = self._cmds.get_nowait()
                except queue.Empty:
                    item = _NOTHING
            if self._stop.is_set():
                break
            if eng.has_work() and not self.stepping_paused:
                t0 = time.perf_counter()
                try:
                    results = eng.step()
                except Exception as e:  # a bug: fail every request instead of hanging them
                    log.exception("engine step failed")
                    self.error = e
                    results = eng.abort_all(message=f"engine error: {e!r}")
                self.last_step_s = time.perf_counter() - t0
                for r in results:
                    self.on_result(r)
                if self.step_delay_s:
                    time.sleep(self.step_delay_s)
            self.n_running, self.n_waiting = len(eng.running), len(eng.waiting)


_NOTHING = object()


# ----------------------------------------------------------------------------------------------------------
# HTTP app
# ----------------------------------------------------------------------------------------------------------


class ServerState:
    """Everything the HTTP handlers share (lives on the event loop thread, except ``worker``)."""

    def __init__(self, engine, tokenizer, args: argparse.Namespace):
        self.engine = engine
        self.tokenizer = tokenizer
        self.args = args
        self.loop: asyncio.AbstractEventLoop | None = None
        self.waiters: dict[str, tuple[asyncio.Future, float]] = {}
        self.paused = False
        self.updating = 0
        self.unheld: asyncio.Event | None = None
        self.update_lock: asyncio.Lock | None = None
        self.worker = EngineWorker(engine, self._on_result, step_delay_s=args.step_delay_s)
        self.weight_groups: dict[str, Any] = {}  # group_name -> torch process group (weight sync)
        self.receiving: set[str] = set()  # groups a receive is blocked on
        self.started = time.time()
        self.held_requests = 0  # /generate requests waiting for a pause (or a draining update) to end
        self.health_requests = 0  # GET /health calls received (the kit's own clients never make any)
        self.chat_tokenizer = None  # Hugging Face tokenizer with the chat template (/v1/chat/completions)

    # results arrive on the engine thread
    def _on_result(self, res) -> None:
        loop = self.loop
        if loop is None:
            return

        def deliver():
            item = self.waiters.pop(res.rid, None)
            if item is not None and not item[0].done():
                item[0].set_result(res)

        loop.call_soon_threadsafe(deliver)

    def held(self) -> bool:
        """True while new /generate requests must wait (paused, or an update waits for a drain)."""
        return self.paused or self.updating > 0

    def refresh_hold(self) -> None:
        """Set/clear the ``unheld`` event to match :meth:`held` (event-loop thread only)."""
        if self.held():
            self.unheld.clear()
        else:
            self.unheld.set()

    def decode(self, ids: list[int]) -> str:
        """Response ``text``: ids decoded without special tokens ("" without a tokenizer)."""
        if self.tokenizer is None or not ids:
            return ""
        try:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        except Exception:  # a tokenizer that cannot decode some id: text is informational only
            return ""

    def token_text(self, t: int) -> str:
        """Text of one token (third element of a logprob triple with return_text_in_logprobs)."""
        if self.tokenizer is None:
            return ""
        try:
            return self.tokenizer.decode([t], skip_special_tokens=False)
        except Exception:
            return ""


def _error(status: int, message: str):
    from fastapi.responses import JSONResponse

    from areal_cli.rollout.protocol import error_body

    return JSONResponse(error_body(message), status_code=status)


def build_app(state: ServerState):
    """The FastAPI application serving ``state`` (see module docstring for the endpoints)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, Response

    from areal_cli.rollout.protocol import (
        ProtocolError, build_generate_response, finish_reason_json, parse_generate_request,
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
            state._on_result(res)
        await asyncio.sleep(0)  # let the deliveries run before answering
        return len(results)

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        try:
            raw = await request.body()
            body = json.loads(raw) if raw else {}
            mode = (body or {}).get("mode", "abort") or "abort"
        except (json.JSONDecodeError, AttributeError):
            return _error(400, "pause_generation body must be a JSON object")
        if mode not in ("abort", "retract", "in_place"):
            return _error(400, f"Invalid mode {mode!r}: expected abort, retract or in_place.")
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

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        try:
            body = await read_json(request)
            if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
                raise ProtocolError("model_path (a string) is required.")
        except ProtocolError as e:
            return JSONResponse({"success": False, "message": str(e), "num_paused_requests": 0},
                                status_code=400)
        version = body.get("weight_version")
        async with state.update_lock:
            state.updating += 1
            state.refresh_hold()
            try:
                if body.get("abort_all_requests"):
                    await abort_all_and_wait()
                elif not state.paused:
                    while state.worker.busy():  # like SGLang: wait for in-flight requests to finish
                        await asyncio.sleep(0.005)

                def load(e, path=body["model_path"], v=version):
                    e.load_weights(path, None if v is None else str(v))

                try:
                    await asyncio.wrap_future(state.worker.call(load))
                except Exception as e:  # noqa: BLE001 - reported to the client, old weights stay
                    return JSONResponse({"success": False, "message": f"Failed to update weights: {e}",
                                         "num_paused_requests": 0}, status_code=400)
            finally:
                state.updating -= 1
                state.refresh_hold()
        msg = "Succeeded to update model weights."
        if version is not None:
            msg += f" Weight version updated to {version}."
        return {"success": True, "message": msg, "num_paused_requests": 0}

    def weight_reply(success: bool, message: str, status: int = 200, **extra):
        return JSONResponse({"success": success, "message": message, **extra}, status_code=status)

    def drop_group(name: str) -> None:
        from areal_cli.rollout.process_group import destroy_process_group

        pg = state.weight_groups.pop(name, None)
        if pg is not None and name not in state.receiving:
            destroy_process_group(pg)

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request):
        from areal_cli.rollout.process_group import init_custom_process_group
        from areal_cli.rollout.protocol import parse_init_weights_update_group_request

        try:
            req = parse_init_weights_update_group_request(await read_json(request))
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
        from areal_cli.rollout.protocol import parse_destroy_weights_update_group_request

        try:
            raw = await request.body()
            name = parse_destroy_weights_update_group_request(json.loads(raw) if raw else {})
        except (ProtocolError, json.JSONDecodeError) as e:
            return weight_reply(False, str(e), 400)
        if name not in state.weight_groups:
            return weight_reply(False, f"Weight update group {name!r} does not exist.", 400)
        await asyncio.to_thread(drop_group, name)
        return weight_reply(True, "Succeeded to destroy custom process group.")

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request):
        from areal_cli.rollout.protocol import parse_update_weights_from_distributed_request

        try:
            req = parse_update_weights_from_distributed_request(await read_json(request))
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
                if req.abort_all_requests:
                    await abort_all_and_wait()
                elif not state.paused:
                    while state.worker.busy():  # like SGLang: wait for in-flight requests to finish
                        await asyncio.sleep(0.005)
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
            body = await read_json(request)
            new = body["new_version"]
        except (ProtocolError, KeyError, TypeError) as e:
            return _error(400, f"new_version is required ({e})")
        if body.get("abort_all_requests"):
            await abort_all_and_wait()

        def setv(e, v=str(new)):
            e.weight_version = v
        await asyncio.wrap_future(state.worker.call(setv))
        return {"success": True, "message": f"Weight version updated to {new}", "new_version": str(new)}

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
                "last_step_s": state.worker.last_step_s, **eng.stats,
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
            body = await read_json(request)
            if not isinstance(body, dict):
                raise ProtocolError("body must be an object")
        except ProtocolError as e:
            return _error(400, str(e))
        if body.get("abort_all"):
            await abort_all_and_wait()
        elif body.get("rid") is not None:
            res = await asyncio.wrap_future(state.worker.call(lambda e, rid=str(body["rid"]): e.abort(rid)))
            if res is not None:
                state._on_result(res)
        return Response(status_code=200)

    @app.exception_handler(Exception)
    async def on_error(request, exc):  # never a bare 500 traceback page
        log.exception("unhandled error on %s", request.url.path)
        return _error(500, f"{type(exc).__name__}: {exc}")

    return app


# ----------------------------------------------------------------------------------------------------------
# Child process entry point
# ----------------------------------------------------------------------------------------------------------


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m areal_cli.rollout.server",
                                description="Embedded inference server (SGLang native protocol).")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--max-total-tokens", type=int, default=65536, help="KV-cache cap in tokens")
    p.add_argument("--max-prefill-tokens", type=int, default=8192)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weight-version", default="0")
    p.add_argument("--num-threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--step-delay-s", type=float, default=0.0,
                   help="sleep after each engine step (testing: makes generation interruptible)")
    p.add_argument("--weight-sync-timeout-s", type=float, default=300.0,
                   help="weight-update group: join and receive timeout (seconds)")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def _watch_parent(pid: int) -> None:
    def run():
        while True:
            time.sleep(0.5)
            if os.getppid() != pid:
                log.warning("parent %d is gone: exiting", pid)
                os._exit(0)

    threading.Thread(target=run, name="parent-watchdog", daemon=True).start()


def _precheck_model_dir(d: Path) -> str | None:
    """A one-line problem with model directory ``d`` (no config.json / no safetensors), or None."""
    if not (d / "config.json").is_file():
        return f"{d}: not a model directory (no config.json)"
    if not ((d / "model.safetensors").is_file() or (d / "model.safetensors.index.json").is_file()):
        return f"{d}: no model.safetensors (or index) found"
    return None


def main(argv: list[str] | None = None) -> None:
    """Run one embedded server until SIGTERM/SIGINT (the child process of :class:`EmbeddedServer`)."""
    args = _parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.parent_pid:
        _watch_parent(args.parent_pid)
    problem = _precheck_model_dir(Path(args.model_path))
    if problem:  # fail fast, before the slow imports
        log.error("%s", problem)
        sys.exit(2)
    import torch

    torch.set_num_threads(max(1, args.num_threads))
    import uvicorn

    from areal_cli.rollout.engine import InferenceEngine

    t0 = time.time()
    engine = InferenceEngine(args.model_path, max_running_requests=args.max_running_requests,
                             max_total_tokens=args.max_total_tokens, context_length=args.context_length,
                             seed=args.seed, weight_version=args.weight_version,
                             max_prefill_tokens=args.max_prefill_tokens)
    tokenizer = None
    tok_path = Path(args.model_path) / "tokenizer.json"
    if tok_path.is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tok_path))
    s = engine.spec
    log.info("loaded %s in %.2fs: %d layers, hidden %d, vocab %d, KV cap %d tokens (%.1f MiB), version %s",
             args.model_path, time.time() - t0, s.num_layers, s.hidden_size, s.vocab_size,
             engine.max_total_tokens, engine.k_pool.numel() * 2 * engine.k_pool.element_size() / 2**20,
             engine.weight_version)
    state = ServerState(engine, tokenizer, args)
    app = build_app(state)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=2, lifespan="on",
                            timeout_keep_alive=75)
    server = uvicorn.Server(config)
    server.run()


# ----------------------------------------------------------------------------------------------------------
# Launcher (parent side)
# ----------------------------------------------------------------------------------------------------------

_LIVE: "weakref.WeakSet[EmbeddedServer]" = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    for s in list(_LIVE):
        try:
            s.stop()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


class EmbeddedServer:
    """Handle on one embedded server child process (create with :meth:`launch`).

    Attributes:
        url: ``"http://HOST:PORT"``. host, port, model_path, log_path, proc (``subprocess.Popen``).
    Usable as a context manager (``with EmbeddedServer.launch(...) as srv:``); :meth:`stop` is idempotent.
    """

    def __init__(self, proc: subprocess.Popen, host: str, port: int, model_path: str, log_path: Path,
                 log_file, auto_log: bool = False):
        self.proc = proc
        self.host = host
        self.port = port
        self.url = f"http://{host}:{port}"
        self.model_path = model_path
        self.log_path = log_path
        self._log_file = log_file
        self._auto_log = auto_log  # log_path is a temporary file we created (removed after a clean stop)
        self._t_spawn = time.monotonic()
        self._startup_timeout_s = 120.0
        _LIVE.add(self)

    @classmethod
    def launch(cls, model_path: str | Path, *, host: str = "127.0.0.1", port: int | None = None,
               max_running_requests: int = 64, max_total_tokens: int = 65536, seed: int = 0,
               log_path: Path | None = None, weight_version: str = "0", startup_timeout_s: float = 120,
               num_threads: int = 1, context_length: int | None = None, step_delay_s: float = 0.0,
               extra_args: list[str] | None = None, wait: bool = True) -> "EmbeddedServer":
        """Start ``python -m areal_cli.rollout.server`` and return once ``GET /health`` answers 200.

        Args:
            model_path: Hugging Face Qwen3 model directory.
            port: None picks a free port (retried up to 3 times if another process takes it first).
            max_running_requests, max_total_tokens, seed, weight_version, context_length: engine settings.
            log_path: child stdout+stderr; default a temporary file (path in ``.log_path``).
            startup_timeout_s: give up (kill the child, raise) after this many seconds.
            num_threads: torch threads in the child (default 1: machines are shared).
            step_delay_s: testing knob, sleep after each engine step.
            wait: (added) False returns right after spawning; call :meth:`wait_until_ready` later (lets a
                caller overlap the child's start-up with its own work).
        Raises:
            UserError: ``model_path`` is not a directory with config.json.
            RuntimeError: the child exited or did not become ready in time; the message ends with the last
                lines of its log.
        """
        from areal_cli.errors import UserError

        mp = Path(model_path)
        if not (mp / "config.json").is_file():
            raise UserError(f"{mp}: not a model directory (no config.json)")
        attempts = 3 if port is None else 1
        last_err: Exception | None = None
        for _ in range(attempts):
            p = free_port(host) if port is None else port
            try:
                srv = cls._spawn(mp, host, p, max_running_requests, max_total_tokens, seed, log_path,
                                 weight_version, num_threads, context_length, step_delay_s, extra_args or [])
                srv._startup_timeout_s = startup_timeout_s
                srv._t_spawn = time.monotonic()
                if wait:
                    srv.wait_until_ready()
                return srv
            except RuntimeError as e:
                last_err = e
                if "address already in use" not in str(e).lower():
                    raise
        raise last_err  # type: ignore[misc]

    @classmethod
    def _spawn(cls, mp, host, port, max_running_requests, max_total_tokens, seed, log_path, weight_version,
               num_threads, context_length, step_delay_s, extra_args) -> "EmbeddedServer":
        import tempfile

        auto_log = log_path is None
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"areal-server-{port}-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "areal_cli.rollout.server", "--model-path", str(mp), "--host", host,
               "--port", str(port), "--max-running-requests", str(max_running_requests),
               "--max-total-tokens", str(max_total_tokens), "--seed", str(seed),
               "--weight-version", str(weight_version), "--num-threads", str(num_threads),
               "--parent-pid", str(os.getpid())]
        if context_length is not None:
            cmd += ["--context-length", str(context_length)]
        if step_delay_s:
            cmd += ["--step-delay-s", str(step_delay_s)]
        cmd += extra_args
        env = dict(os.environ)
        pkg_root = str(Path(__file__).resolve().parents[2])  # so the child imports this areal_cli
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("OMP_NUM_THREADS", str(num_threads))
        log_file = open(log_path, "ab")
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        return cls(proc, host, port, str(mp), log_path, log_file, auto_log)

    def wait_until_ready(self, timeout_s: float | None = None) -> "EmbeddedServer":
        """Poll ``GET /health`` until 200 (every 0.1 s).

        Args:
            timeout_s: default the ``startup_timeout_s`` given to :meth:`launch`, counted from the spawn.
        Raises:
            RuntimeError: the child exited, or was not ready in time (it is then killed); the message ends
                with the last lines of its log.
        """
        import httpx

        if timeout_s is None:
            deadline = self._t_spawn + self._startup_timeout_s
        else:
            deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as c:
            while True:
                rc = self.proc.poll()
                if rc is not None:
                    self.stop()
                    raise RuntimeError(f"embedded server exited with code {rc} during startup "
                                       f"(log {self.log_path}); last lines:\n{log_tail(self.log_path, 40, empty='')}")
                try:
                    if c.get(self.url + "/health").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"embedded server not ready after {deadline - self._t_spawn:.0f} s "
                                       f"(log {self.log_path}); last lines:\n{log_tail(self.log_path, 40, empty='')}")
                time.sleep(0.1)

    def alive(self) -> bool:
        """True while the child process runs."""
        return self.proc.poll() is None

    def stop(self) -> None:
        """Terminate the child's process group (SIGTERM, then SIGKILL after 5 s). Idempotent."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=5)
        if self._log_file is not None and not self._log_file.closed:
            self._log_file.close()
        if self._auto_log and self.proc.returncode in (0, -signal.SIGTERM):
            # a temporary log of a server that stopped cleanly holds nothing worth keeping
            self.log_path.unlink(missing_ok=True)
        _LIVE.discard(self)

    def __enter__(self) -> "EmbeddedServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive() else f"exited({self.proc.returncode})"
        return f"EmbeddedServer({self.url}, {self.model_path}, {state})"


if __name__ == "__main__":
    main()

"""Generation routes of the embedded server: SGLang's ``/generate`` and OpenAI's ``/v1/chat/completions``.

- ``POST /generate`` single or batch ``input_ids``; SGLang response shape (protocol.build_generate_response).
  Out-of-range ids, bad sampling values and requests that can never fit -> 400 ``{"error": {"message"}}``
  (a real SGLang server crashes on out-of-range ids). While generation is paused (or a weight update waits
  for a drain) new requests are held, like SGLang's.
- ``POST /v1/chat/completions``: OpenAI Chat Completions (messages, tools, temperature, top_p,
  max_tokens / max_completion_tokens, single-token stop strings, n=1, logprobs; :mod:`areal_cli.agents.openai_schema`),
  rendered with the model's chat template, Qwen/Hermes ``<tool_call>`` blocks parsed into ``tool_calls``; bad
  input -> 400 with an OpenAI error body. Training does not use it (it returns no token ids): the agent proxy
  (:mod:`areal_cli.agents.proxy`) records token ids by talking /generate.
"""

import asyncio
import dataclasses
import time
import uuid

from areal_cli.rollout.protocol.errors import ProtocolError
from areal_cli.rollout.protocol.generate_request import parse_generate_request
from areal_cli.rollout.protocol.generate_response import build_generate_response, finish_reason_json
from areal_cli.rollout.server.http_bodies import error_response, read_json
from areal_cli.rollout.server.worker import ServerState

#: SGLang 0.5.23's refusal (``sampling_params.raise_if_tokenizer_required``), answered when started with
#: ``--skip-tokenizer-init`` as SGLang answers it.
MIN_NEW_TOKENS_NEEDS_TOKENIZER = ("min_new_tokens={} is unavailable when skip_tokenizer_init=True (requires tokenizer "
                                  "for eos_token_id).")


def add_generate_routes(app, state: ServerState) -> None:
    """Add ``/generate`` and ``/v1/chat/completions`` (serving ``state``) to the FastAPI ``app``."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    from areal_cli.rollout.engine import EngineError

    eng = state.engine

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
            return error_response(500, f"The engine failed and is not serving: {state.worker.error!r}")
        if len(set(rids)) != len(rids) or any(rid in state.waiters for rid in rids):
            return error_response(400, "Duplicate request id: a request with this rid is still running.")
        futs = []
        for r in reqs:
            fut = state.loop.create_future()
            state.waiters[r.rid] = (fut, t_recv)
            futs.append(fut)

        def add_all(engine, reqs=reqs):
            errors = []
            for r in reqs:
                try:
                    engine.add_request(r.rid, r.input_ids, honoured_seed(r.sampling_params),
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
            return error_response(400, errors[0][1])
        return list(await asyncio.gather(*futs))

    def honoured_seed(sp):
        """``sp`` with its ``sampling_seed`` kept only under ``--enable-deterministic-inference``: SGLang 0.5.23
        accepts the field and ignores it otherwise (each request then draws its seed from the server's stream)."""
        return sp if state.args.enable_deterministic_inference or sp.seed is None else dataclasses.replace(sp, seed=None)

    @app.post("/generate")
    async def generate(request: Request):
        t_recv = time.monotonic()
        try:
            body = await read_json(request)
            reqs, is_batch = parse_generate_request(body, vocab_size=eng.vocab_size,
                                                    context_length=eng.context_length)
            for r in reqs:
                eng.validate(r.input_ids, r.sampling_params)  # pure checks; safe off the engine thread
                if state.args.skip_tokenizer_init and r.sampling_params.min_new_tokens > 0:
                    raise ProtocolError(MIN_NEW_TOKENS_NEEDS_TOKENIZER.format(r.sampling_params.min_new_tokens))
        except (ProtocolError, EngineError) as e:
            return error_response(400, str(e))
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
        from areal_cli.rollout.protocol.generate_request import GenerateRequest, SamplingParams

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
            sp = SamplingParams(max_new_tokens=budget, temperature=1.0 if req.temperature is None else req.temperature,
                                top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k, stop_token_ids=stops, seed=req.seed)
            sp = honoured_seed(sp)
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

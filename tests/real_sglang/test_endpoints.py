"""Every endpoint and field the kit uses, against a real SGLang 0.5.23 server (CPU mode), through the kit's own
payload builders, parsers and client: generate (single, batched, prompt logprobs, stop ids, budgets), pause and
continue in every mode, abort, weight updates from disk and over a gloo group (init, begin, buckets, end, destroy),
``weight_version`` labels and per-token version spans, model and server info. Logprobs are checked against a Hugging
Face recompute on the same weights."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import torch

from areal_cli.rollout.client import RolloutClient
from areal_cli.rollout.protocol import (
    NO_SESSION, BatchGenerateRequest, GenerateRequest, PauseGenerationRequest, SamplingParams,
    UpdateWeightsFromDiskRequest, build_abort_payload, build_continue_payload, parse_generate_response,
    versions_from_spans,
)
from helpers.hf_reference import hf_logprobs
from helpers.real_sglang import reset, run, wait_decoding

pytestmark = [pytest.mark.multiproc, pytest.mark.real_sglang]

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
LP_TOL = 1e-5  # float32 on both sides (measured: 4.8e-7 against HF)


@pytest.fixture(scope="module")
def hf(models):
    """The two policy versions as Hugging Face models (float32): the reference."""
    from transformers import AutoModelForCausalLM

    return [AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval() for d in models]


@pytest.fixture
def srv(real_server, models):
    reset(real_server, models[0])
    yield real_server
    reset(real_server, models[0])


def post(url: str, path: str, body) -> tuple[int, object]:
    r = httpx.post(url + path, json=body, timeout=300)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def gen(url: str, req) -> object:
    status, body = post(url, "/generate", req.to_json())
    assert status == 200, body
    return parse_generate_response(body)


def test_model_and_server_info(srv):
    with httpx.Client(timeout=30) as h:
        info = h.get(srv + "/model_info").json()
        assert info["weight_version"] == "0" and info["model_path"]
        si = h.get(srv + "/server_info").json()
        assert si["version"] == "0.5.23" and si["device"] == "cpu" and si["attention_backend"] == "torch_native"
        assert si["sleep_on_idle"] is True and si["max_total_tokens"] == 65536 and si["dtype"] == "float32"
        assert si["enable_deterministic_inference"] is False  # CPU: torch_native has no deterministic mode
        t0 = time.monotonic()  # 503 until SGLang's own warm-up request is done (readiness is /model_info)
        while h.get(srv + "/health").status_code != 200:
            assert time.monotonic() - t0 < 120
            time.sleep(0.5)
        h.post(srv + "/pause_generation", json=PauseGenerationRequest("in_place").to_json())
        try:  # the kit's liveness probe while a weight update pauses the server
            assert h.get(srv + "/model_info", timeout=5).status_code == 200
        finally:
            h.post(srv + "/continue_generation", json=build_continue_payload())
    info = run(_client_info(srv))
    assert info["weight_version"] == "0"


async def _client_info(url):
    c = RolloutClient([url], vocab_size=272)
    try:
        await c.server_info(url)
        return await c.model_info(url)
    finally:
        await c.aclose()


def test_generate_single_batched_prompt_logprobs_stops_and_budgets(srv, hf):
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    one = gen(srv, GenerateRequest(PROMPT, greedy, rid="single-1"))
    assert one.rid == "single-1" and one.finish_reason == "length" and len(one.output_ids) == 12
    ref = hf_logprobs(hf[0], PROMPT, one.output_ids, 0.0)
    assert max(abs(a - b) for a, b in zip(one.output_logprobs, ref)) < LP_TOL
    with torch.no_grad():  # greedy = HF's argmax at every step
        ids = list(PROMPT)
        for _ in range(12):
            ids.append(int(hf[0](torch.tensor([ids])).logits[0, -1].argmax()))
    assert one.output_ids == ids[len(PROMPT):]
    assert one.weight_version_spans == [("0", 0, 12)] and one.prompt_tokens == len(PROMPT)
    # batched: a list in input order, one rid each
    batch = gen(srv, BatchGenerateRequest([PROMPT, PROMPT[:5]], greedy, rids=["b-0", "b-1"]))
    assert [r.rid for r in batch] == ["b-0", "b-1"] and batch[0].output_ids == one.output_ids
    assert batch[1].output_ids == gen(srv, GenerateRequest(PROMPT[:5], greedy)).output_ids
    # prompt logprobs from position 0: the first entry is None
    pl = gen(srv, GenerateRequest(PROMPT, SamplingParams(max_new_tokens=1, temperature=0.0), logprob_start_len=0))
    assert pl.input_token_logprobs[0] is None and len(pl.input_token_logprobs) == len(PROMPT)
    with torch.no_grad():
        lp = torch.log_softmax(hf[0](torch.tensor([PROMPT])).logits[0].float(), -1)
    ref_prompt = [float(lp[i - 1, PROMPT[i]]) for i in range(1, len(PROMPT))]
    assert max(abs(a - b) for a, b in zip(pl.input_token_logprobs[1:], ref_prompt)) < LP_TOL
    # a stop id ends the output and is its last token; min_new_tokens masks it before
    stop_id = one.output_ids[3]
    first = one.output_ids.index(stop_id)
    st = gen(srv, GenerateRequest(PROMPT, SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=[stop_id])))
    assert st.finish_reason == "stop" and st.matched_stop == stop_id and st.output_ids == one.output_ids[:first + 1]
    # min_new_tokens needs SGLang's tokenizer (the EOS id): refused by a server started with --skip-tokenizer-init,
    # which is why the kit starts its servers without that flag when rollout.min_new_tokens > 0 (test_train_runs)
    st_, body = post(srv, "/generate", GenerateRequest(PROMPT, SamplingParams(
        max_new_tokens=12, temperature=0.0, stop_token_ids=[stop_id], min_new_tokens=first + 2)).to_json())
    from areal_cli.rollout.server.generate_routes import MIN_NEW_TOKENS_NEEDS_TOKENIZER

    assert st_ == 400 and body["error"]["message"] == MIN_NEW_TOKENS_NEEDS_TOKENIZER.format(first + 2)
    # max_new_tokens 0: no output, finish length
    zero = gen(srv, GenerateRequest(PROMPT, SamplingParams(max_new_tokens=0)))
    assert zero.output_ids == [] and zero.finish_reason == "length"


def test_sampling_seed_is_accepted_and_ignored_without_deterministic_inference(srv):
    sp = SamplingParams(max_new_tokens=16, temperature=1.0, ignore_eos=True, seed=1234)
    outs = {tuple(gen(srv, GenerateRequest(PROMPT, sp)).output_ids) for _ in range(3)}
    assert len(outs) > 1  # the same seed thrice, different samples: SGLang ignores it on CPU


def test_pause_abort_returns_partial_and_new_requests_wait_for_continue(srv):
    long = GenerateRequest(PROMPT, SamplingParams(max_new_tokens=1500, temperature=0.0, ignore_eos=True), rid="long")
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("r", gen(srv, long)))
    t.start()
    wait_decoding(srv)
    assert post(srv, "/pause_generation", PauseGenerationRequest("abort").to_json())[0] == 200
    t.join(60)
    r = box["r"]
    assert r.finish_reason == "abort" and 0 < len(r.output_ids) < 1500 and len(r.output_logprobs) == len(r.output_ids)
    # while paused a new request waits; continue lets it run
    later = GenerateRequest(PROMPT, SamplingParams(max_new_tokens=4, temperature=0.0))
    t2 = threading.Thread(target=lambda: box.setdefault("r2", gen(srv, later)))
    t2.start()
    time.sleep(2.0)
    assert "r2" not in box and t2.is_alive()
    assert post(srv, "/continue_generation", build_continue_payload())[0] == 200
    t2.join(60)
    assert box["r2"].finish_reason == "length"


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_pause_retract_and_in_place_keep_the_request_which_finishes_after_continue(srv, mode):
    req = GenerateRequest(PROMPT, SamplingParams(max_new_tokens=400, temperature=0.0, ignore_eos=True))
    ref = gen(srv, req)
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("r", gen(srv, req)))
    t.start()
    wait_decoding(srv)
    assert post(srv, "/pause_generation", PauseGenerationRequest(mode).to_json())[0] == 200
    time.sleep(1.0)
    assert t.is_alive()  # kept: not returned while paused
    post(srv, "/continue_generation", build_continue_payload())
    t.join(120)
    r = box["r"]
    assert r.finish_reason == "length" and r.output_ids == ref.output_ids  # same weights: the same greedy tokens
    assert max(abs(a - b) for a, b in zip(r.output_logprobs, ref.output_logprobs)) < LP_TOL


def test_abort_request_by_rid_and_all(srv):
    long = SamplingParams(max_new_tokens=1500, temperature=0.0, ignore_eos=True)
    box: dict = {}
    threads = [threading.Thread(target=lambda i=i: box.setdefault(i, gen(srv, GenerateRequest(PROMPT, long, rid=f"ab-{i}"))))
               for i in range(3)]
    for t in threads:
        t.start()
    wait_decoding(srv)
    assert post(srv, "/abort_request", build_abort_payload("ab-0"))[0] == 200
    threads[0].join(60)
    assert box[0].finish_reason == "abort" and threads[1].is_alive() and threads[2].is_alive()
    assert post(srv, "/abort_request", build_abort_payload(abort_all=True))[0] == 200
    for t in threads[1:]:
        t.join(60)
    assert box[1].finish_reason == box[2].finish_reason == "abort"


def test_update_weights_from_disk_labels_and_loads_exactly_and_switches_back(srv, models, hf):
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)
    before = gen(srv, GenerateRequest(PROMPT, greedy))
    st, body = post(srv, "/update_weights_from_disk", UpdateWeightsFromDiskRequest(str(models[1]), "1").to_json())
    assert st == 200 and body["success"] is True, body
    after = gen(srv, GenerateRequest(PROMPT, greedy))
    assert after.weight_version == "1" and after.weight_version_spans == [("1", 0, 10)]
    ref = hf_logprobs(hf[1], PROMPT, after.output_ids, 0.0)
    assert max(abs(a - b) for a, b in zip(after.output_logprobs, ref)) < LP_TOL
    assert post(srv, "/update_weights_from_disk", UpdateWeightsFromDiskRequest(str(models[0]), "2").to_json())[0] == 200
    back = gen(srv, GenerateRequest(PROMPT, greedy))
    assert back.output_ids == before.output_ids and back.weight_version == "2"
    assert max(abs(a - b) for a, b in zip(back.output_logprobs, before.output_logprobs)) < LP_TOL
    # a path that is not a model: refused (HTTP 400, success false), the weights stay
    st, body = post(srv, "/update_weights_from_disk", UpdateWeightsFromDiskRequest("/no/such/model", "3").to_json())
    assert st == 400 and body["success"] is False and "Failed" in body["message"]
    assert gen(srv, GenerateRequest(PROMPT, greedy)).weight_version == "2"


def test_in_place_update_gives_version_spans_over_one_request(srv, models):
    """pause in place, load new weights keeping the request (no abort, no flush), continue: one response whose spans
    say which weights produced which tokens."""
    box: dict = {}
    req = GenerateRequest(PROMPT, SamplingParams(max_new_tokens=600, temperature=0.0, ignore_eos=True))
    t = threading.Thread(target=lambda: box.setdefault("r", gen(srv, req)))
    t.start()
    wait_decoding(srv)
    post(srv, "/pause_generation", PauseGenerationRequest("in_place").to_json())
    st, body = post(srv, "/update_weights_from_disk", UpdateWeightsFromDiskRequest(
        str(models[1]), "1", abort_all_requests=False, flush_cache=False).to_json())
    assert st == 200 and body["success"], body
    post(srv, "/continue_generation", build_continue_payload())
    t.join(120)
    r = box["r"]
    (v0, a0, b0), (v1, a1, b1) = r.weight_version_spans
    assert (v0, a0, v1, b1) == ("0", 0, "1", 600) and b0 == a1 and 0 < b0 < 600
    assert versions_from_spans(r.weight_version_spans, 600, r.weight_version) == ["0"] * b0 + ["1"] * (600 - b0)


def test_flush_cache_is_refused_while_requests_run(srv):
    box: dict = {}
    req = GenerateRequest(PROMPT, SamplingParams(max_new_tokens=800, temperature=0.0, ignore_eos=True))
    t = threading.Thread(target=lambda: box.setdefault("r", gen(srv, req)))
    t.start()
    wait_decoding(srv)
    st, _ = post(srv, "/flush_cache", {})
    post(srv, "/abort_request", build_abort_payload(abort_all=True))
    t.join(60)
    assert st == 400  # SGLang: "Flush cache failed" while requests run
    assert post(srv, "/flush_cache", {})[0] == 200


def test_distributed_update_needs_a_session_and_loads_the_trainers_weights(srv, models, hf):
    """The gloo weight-update group as the trainer's head rank drives it (WeightSender): init, begin, one
    update per bucket, end, destroy; the server then computes with exactly the sent weights."""
    from safetensors.torch import load_file

    from areal_cli.rollout.weight_sender import WeightSender

    greedy = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)
    sd = load_file(str(models[1] / "model.safetensors"))
    sender = WeightSender([srv], backend="gloo", timeout_s=120)
    try:
        sender.init()
        # outside a session real SGLang refuses a bucket (what broke rollout.weight_update_mode=xccl)
        from areal_cli.rollout.protocol import ParamSpec, build_update_weights_from_distributed_payload

        name, t0 = next(iter(sd.items()))
        st, body = post(srv, "/update_weights_from_distributed", build_update_weights_from_distributed_payload(
            [ParamSpec(name, tuple(t0.shape), "float32")]))
        assert st == 400 and NO_SESSION.format(op="update_weights_from_distributed") in body["message"]
        sender.close()  # that refused bucket left nothing to receive: start a fresh group
        stats = sender.send(sorted(sd.items()), 7, chunk_mb=0.25)  # several buckets
        assert stats["buckets"] > 1 and stats["tensors"] == len(sd)
        r = gen(srv, GenerateRequest(PROMPT, greedy))
        assert r.weight_version == "7"
        ref = hf_logprobs(hf[1], PROMPT, r.output_ids, 0.0)
        assert max(abs(a - b) for a, b in zip(r.output_logprobs, ref)) < LP_TOL
        # a session left open by a sender that died is ended and a new one begun
        assert post(srv, "/begin_weight_update", {})[0] == 200
        sd0 = load_file(str(models[0] / "model.safetensors"))
        sender.send(sorted(sd0.items()), 8)
        r = gen(srv, GenerateRequest(PROMPT, greedy))
        assert r.weight_version == "8"
        assert max(abs(a - b) for a, b in zip(r.output_logprobs, hf_logprobs(hf[0], PROMPT, r.output_ids, 0.0))) < LP_TOL
    finally:
        assert sender.close() == []  # /destroy_weights_update_group answered success


def test_the_kit_client_pauses_updates_and_resumes_interrupted_samples(srv, models, hf):
    """RolloutClient over a real server: an update from disk while samples are in flight (abort mode) resumes
    them with prompt + tokens so far; every token's version is the weights that produced it, every logprob
    the behaviour policy's (the HF recompute of its own version on the full prefix)."""
    async def go():
        c = RolloutClient([srv], vocab_size=272)
        c.set_weight_version(0)
        try:
            task = asyncio.ensure_future(c.generate_group(PROMPT, 2, SamplingParams(
                max_new_tokens=300, temperature=0.0, ignore_eos=True)))
            await asyncio.to_thread(wait_decoding, srv)
            await c.update_weights_from_disk(str(models[1]), 1)
            return await task
        finally:
            await c.aclose()

    comps = run(go())
    for comp in comps:
        assert len(comp.output_ids) == 300 and comp.n_interruptions >= 1
        vers = comp.output_versions
        cut = vers.index(1)
        assert set(vers[:cut]) == {0} and set(vers[cut:]) == {1}
        ids = comp.output_ids
        ref = hf_logprobs(hf[0], PROMPT, ids[:cut], 0.0) + [
            lp for lp in hf_logprobs(hf[1], PROMPT + ids[:cut], ids[cut:], 0.0)]
        assert max(abs(a - b) for a, b in zip(comp.output_logprobs, ref)) < LP_TOL

"""SGLang's radix cache after an in-place weight update, on a real server: what goes wrong for RL, and that the kit
corrects it. No token the kit labels with version v is computed from KV that weights older than v computed; where
the server cannot avoid it (a request queued across the update), the kit labels the tokens with the older version.

In-place updates (``rollout.pause_mode: in_place``) load new weights without flushing the prefix cache (a flush is
refused while requests run). A request admitted afterwards may then reuse cached prefix KV from the old weights while
SGLang labels every token it generates with the new version."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from areal_cli.rollout.client import RolloutClient
from areal_cli.rollout.protocol import (GenerateRequest, PauseGenerationRequest, SamplingParams,
                                        UpdateWeightsFromDiskRequest, build_continue_payload, cache_key,
                                        parse_generate_response)
from helpers.hf_reference import hf_logprobs
from helpers.real_sglang import reset, run

pytestmark = [pytest.mark.multiproc, pytest.mark.real_sglang]

PROMPT = [(7 * i + 3) % 250 + 5 for i in range(48)]  # 48 tokens: a prefix worth caching
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
LP_TOL = 1e-5


@pytest.fixture(scope="module")
def hf(models):
    from transformers import AutoModelForCausalLM

    return [AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval() for d in models]


@pytest.fixture
def srv(real_in_place_server, models):
    reset(real_in_place_server, models[0])
    yield real_in_place_server
    reset(real_in_place_server, models[0])


def _gen(url: str, req: GenerateRequest):
    r = httpx.post(url + "/generate", json=req.to_json(), timeout=120)
    assert r.status_code == 200, r.text
    return parse_generate_response(r.json())


def _in_place_update(url: str, model_dir, version: str) -> None:
    """What an in-place weight update does to a server: pause in place, load without abort or flush, continue."""
    with httpx.Client(timeout=120) as h:
        h.post(url + "/pause_generation", json=PauseGenerationRequest("in_place").to_json())
        r = h.post(url + "/update_weights_from_disk", json=UpdateWeightsFromDiskRequest(
            str(model_dir), version, abort_all_requests=False, flush_cache=False).to_json())
        assert r.status_code == 200 and r.json()["success"], r.text
        h.post(url + "/continue_generation", json=build_continue_payload())


def _err(lps, ref) -> float:
    return max(abs(a - b) for a, b in zip(lps, ref))


def test_without_a_cache_namespace_a_request_after_an_in_place_update_reuses_the_old_weights_kv(srv, models, hf):
    _gen(srv, GenerateRequest(PROMPT, GREEDY))  # the prompt's KV, from version 0, now in the radix cache
    _in_place_update(srv, models[1], "1")
    stale = _gen(srv, GenerateRequest(PROMPT, GREEDY))
    assert stale.cached_tokens > 0 and stale.weight_version_spans == [("1", 0, 6)]  # labelled version 1 ...
    assert _err(stale.output_logprobs, hf_logprobs(hf[1], PROMPT, stale.output_ids, 0.0)) > 1e-3  # ... but it is not


def test_the_kits_cache_namespace_keeps_versions_apart(srv, models, hf):
    """The kit's requests carry their policy version as SGLang's ``extra_key``: after the update nothing cached by
    version 0 is reused, and the logprobs are exactly version 1's."""
    first = _gen(srv, GenerateRequest(PROMPT, GREEDY, extra_key=cache_key(0)))
    again = _gen(srv, GenerateRequest(PROMPT, GREEDY, extra_key=cache_key(0)))
    assert first.cached_tokens == 0 and again.cached_tokens > 0  # the namespace still shares within a version
    _in_place_update(srv, models[1], "1")

    async def via_client():
        c = RolloutClient([srv], vocab_size=272, pause_mode="in_place")
        c.set_weight_version(1)  # what the kit's own update sets
        try:
            return await c.generate(PROMPT, GREEDY)
        finally:
            await c.aclose()

    comp = run(via_client())
    assert comp.output_versions == [1] * 6
    assert _err(comp.output_logprobs, hf_logprobs(hf[1], PROMPT, comp.output_ids, 0.0)) < LP_TOL
    raw = _gen(srv, GenerateRequest(PROMPT, GREEDY, extra_key=cache_key(1)))
    assert raw.cached_tokens > 0 and _err(raw.output_logprobs, comp.output_logprobs) < LP_TOL  # version 1's own cache


def test_a_request_queued_across_an_in_place_update_is_labelled_with_its_older_version(srv, models, hf):
    """A client that does not know of the pause (a second process, or a request sent just before it) sends under
    version 0's namespace; SGLang holds it, loads version 1 in place, then runs it on version 0's cached prefix KV and
    labels every token 1. The kit labels the chunk 0: the oldest weights whose KV it used."""
    _gen(srv, GenerateRequest(PROMPT, GREEDY, extra_key=cache_key(0)))  # version 0's KV of the prompt, cached

    async def go():
        c = RolloutClient([srv], vocab_size=272, pause_mode="in_place")
        c.set_weight_version(0)
        try:
            async with httpx.AsyncClient(timeout=120) as h:
                await h.post(srv + "/pause_generation", json=PauseGenerationRequest("in_place").to_json())
                task = asyncio.ensure_future(c.generate(PROMPT, GREEDY))
                await asyncio.sleep(1.0)  # sent, and held by the paused server
                assert not task.done()
                r = await h.post(srv + "/update_weights_from_disk", json=UpdateWeightsFromDiskRequest(
                    str(models[1]), "1", abort_all_requests=False, flush_cache=False).to_json())
                assert r.json()["success"], r.text
                await h.post(srv + "/continue_generation", json=build_continue_payload())
            return await task
        finally:
            await c.aclose()

    comp = run(go())
    assert comp.output_versions == [0] * 6  # SGLang said 1 for every token
    # the KV really was version 0's: the logprobs are not version 1's own
    assert _err(comp.output_logprobs, hf_logprobs(hf[1], PROMPT, comp.output_ids, 0.0)) > 1e-3

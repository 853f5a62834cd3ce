"""Claims about areal_cli.rollout.client: against replayed real SGLang responses and against the embedded
server, an interrupted sample resumes to exactly the uninterrupted result, every token carries the version
of the weights that produced it, and bad ids never reach a server."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import httpx
import pytest
import torch

from areal_cli.rollout.client import Completion, RolloutClient
from areal_cli.rollout.protocol import SamplingParams, ServerError

from helpers.hf_reference import hf_logits, hf_logprobs
from helpers.servers import spawn_server, wait_generating

torch.set_num_threads(1)
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "sglang"


def _fixture(name: str, role: str | None = None) -> dict:
    d = json.loads((FIXTURES / name).read_text())
    if role is None:
        return d
    for ex in d.get("related_exchanges", []) + d.get("exchanges", []) + d.get("cases", []):
        if ex.get("role") == role or ex.get("name") == role:
            return ex
    raise KeyError(role)


class Replay:
    """A fake SGLang server (httpx.MockTransport) answering /generate from a list of recorded bodies."""

    def __init__(self, generate_bodies: list[tuple[int, object]]):
        self.bodies = list(generate_bodies)
        self.calls: list[tuple[str, str, dict | None]] = []  # (host, path, json body)
        self.pause_seen = asyncio.Event()

    async def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.url.host, request.url.path, body))
        path = request.url.path
        if path == "/generate":
            status, resp = self.bodies.pop(0)
            if callable(resp):
                resp = await resp()
            return httpx.Response(status, json=resp)
        if path == "/pause_generation":
            self.pause_seen.set()
            return httpx.Response(200, json={"message": "Generation paused successfully.", "status": "ok"})
        if path == "/continue_generation":
            return httpx.Response(200, json={"message": "Generation continued successfully.", "status": "ok"})
        if path == "/update_weights_from_disk":
            if body["model_path"] == "/nonexistent/model":
                return httpx.Response(400, json=_fixture("errors.json", "update_weights_bad_path")["response"])
            return httpx.Response(200, json={"success": True, "message": "Succeeded to update model weights.",
                                             "num_paused_requests": 0})
        return httpx.Response(404, text="not found")

    def client(self, urls=("http://a:1",), vocab_size=1024) -> RolloutClient:
        return RolloutClient(list(urls), vocab_size=vocab_size, transport=httpx.MockTransport(self.handler))


def test_client_resumes_recorded_abort_with_prefix_and_remaining_budget():
    aborted = _fixture("pause_abort.json", "aborted_generate")  # real SGLang: 80 partial tokens, abort
    final = _fixture("generate_single.json")["response"]  # real SGLang: 16 tokens, length
    prompt = aborted["request"]["input_ids"]
    part = aborted["response"]["output_ids"]
    replay = Replay([(200, aborted["response"]), (200, final)])

    async def run() -> Completion:
        c = replay.client()
        try:
            return await c.generate(prompt, SamplingParams(max_new_tokens=96, temperature=1.0), rid="s1")
        finally:
            await c.aclose()

    comp = asyncio.run(run())
    (_, _, first), (_, _, second) = replay.calls
    assert first["input_ids"] == prompt and first["sampling_params"]["max_new_tokens"] == 96
    assert second["input_ids"] == prompt + part and second["sampling_params"]["max_new_tokens"] == 16
    assert comp.output_ids == part + final["output_ids"]
    lps = [t[0] for t in aborted["response"]["meta_info"]["output_token_logprobs"]]
    assert comp.output_logprobs == lps + [t[0] for t in final["meta_info"]["output_token_logprobs"]]
    assert comp.output_versions == [0] * 96  # SGLang's "default" -> 0
    assert (comp.finish_reason, comp.n_interruptions, comp.server_url) == ("length", 1, "http://a:1")


def test_budget_is_counted_from_the_original_max_new_tokens():
    # AReaL v1 bug (PR #858): the loop compared against the decremented budget. Two aborts that together
    # use the whole budget must end as "length" without a third request.
    ab = _fixture("pause_abort.json", "aborted_generate")["response"]  # 80 tokens
    ab2 = copy.deepcopy(ab)
    ab2["output_ids"] = ab2["output_ids"][:20]
    ab2["meta_info"]["output_token_logprobs"] = ab2["meta_info"]["output_token_logprobs"][:20]
    ab2["meta_info"]["weight_versions"] = [{"version": "default", "start": 0, "end": 20}]
    replay = Replay([(200, ab), (200, ab2)])

    async def run():
        c = replay.client()
        return await c.generate([1, 2, 3], SamplingParams(max_new_tokens=100))

    comp = asyncio.run(run())
    assert len(replay.calls) == 2 and replay.calls[1][2]["sampling_params"]["max_new_tokens"] == 20
    assert (len(comp.output_ids), comp.finish_reason, comp.n_interruptions) == (100, "length", 1)


def test_per_token_versions_come_from_server_spans_with_fallback():
    r1 = copy.deepcopy(_fixture("generate_single.json")["response"])
    r1["meta_info"]["weight_versions"] = [{"version": "3", "start": 0, "end": 10},
                                          {"version": "4", "start": 10, "end": 16}]
    r1["meta_info"]["weight_version"] = "4"
    r2 = copy.deepcopy(_fixture("generate_stop.json")["response"])  # stop, matched 179
    del r2["meta_info"]["weight_versions"]  # an older server: only weight_version
    r2["meta_info"]["weight_version"] = "v7"
    replay = Replay([(200, r1), (200, r2)])

    async def run():
        c = replay.client()
        return await c.generate([1], SamplingParams(16)), await c.generate([1], SamplingParams(16))

    a, b = asyncio.run(run())
    assert a.output_versions == [3] * 10 + [4] * 6
    assert b.output_versions == [7] * 7 and (b.finish_reason, b.matched_stop) == ("stop", 179)


def test_out_of_range_ids_raise_value_error_before_any_request():
    replay = Replay([])
    c = replay.client(vocab_size=1024)
    for bad in ([1, 2, 10_000_000], [1024], [-5, 1], [], [1, "2"], [True]):
        with pytest.raises(ValueError):
            asyncio.run(c.generate(bad, SamplingParams(4)))
    with pytest.raises(ValueError):
        asyncio.run(c.generate([1], SamplingParams(4, top_p=0.0)))
    assert replay.calls == []  # nothing reached the (crash-prone) server


def test_http_errors_raise_server_error_with_the_parsed_message():
    case = _fixture("errors.json", "temperature_negative")
    replay = Replay([(400, case["response"])])
    with pytest.raises(ServerError) as ei:
        asyncio.run(replay.client().generate([1, 2], SamplingParams(4)))
    assert ei.value.status == 400
    assert ei.value.message == "temperature must be a non-negative finite number, got -1."


def test_aclose_releases_pending_requests_with_abort():
    async def never():
        await asyncio.Event().wait()

    ab = _fixture("pause_abort.json", "aborted_generate")["response"]
    replay = Replay([(200, ab), (200, never)])

    async def run():
        c = replay.client()
        task = asyncio.create_task(c.generate([1, 2], SamplingParams(500), rid="z"))
        while len(replay.calls) < 2:
            await asyncio.sleep(0.01)
        await c.aclose()
        return await asyncio.wait_for(task, 5)

    comp = asyncio.run(run())
    assert comp.finish_reason == "abort" and len(comp.output_ids) == 80 and comp.n_interruptions == 1


def test_round_robin_routing_and_sticky_rids():
    c = RolloutClient(["http://a:1", "http://b:1", "http://c:1"], vocab_size=10)
    assert [c.choose_server(None) for _ in range(4)] == ["http://a:1", "http://b:1", "http://c:1", "http://a:1"]
    first = c.choose_server("x")
    assert [c.choose_server("x") for _ in range(5)] == [first] * 5
    assert c.choose_server("y") != first


def test_weight_update_fans_out_pause_update_continue_and_resubmits_after_continue():
    aborted = _fixture("pause_abort.json", "aborted_generate")["response"]
    final = _fixture("generate_single.json")["response"]
    replay = Replay([])

    async def abort_when_paused():  # the in-flight request returns "abort" once the pause arrives
        await replay.pause_seen.wait()
        return aborted

    replay.bodies = [(200, abort_when_paused), (200, final)]

    async def run():
        c = replay.client(urls=("http://a:1", "http://b:1"))
        task = asyncio.create_task(c.generate([1, 2], SamplingParams(96), rid="r"))
        await asyncio.sleep(0.05)
        await c.update_weights_from_disk("/ckpt/v5", 5)
        comp = await task
        with pytest.raises(ServerError, match="Failed to get weights iterator"):
            await c.update_weights_from_disk("/nonexistent/model", 6)
        assert not c.paused  # servers are continued even when the load failed
        await c.aclose()
        return comp

    comp = asyncio.run(run())
    seq = [(h, p) for h, p, _ in replay.calls]
    gen = [i for i, (_, p) in enumerate(seq) if p == "/generate"]
    cont = [i for i, (_, p) in enumerate(seq) if p == "/continue_generation"]
    assert [p for _, p in seq[1:7]] == ["/pause_generation"] * 2 + ["/update_weights_from_disk"] * 2 + \
        ["/continue_generation"] * 2
    assert {h for h, p in seq[1:7]} == {"a", "b"}
    updates = [b for _, p, b in replay.calls if p == "/update_weights_from_disk"]
    assert updates[0] == {"model_path": "/ckpt/v5", "weight_version": "5", "abort_all_requests": True}
    assert gen[1] > cont[0]  # the resubmission waited for continue
    assert comp.n_interruptions == 1 and len(comp.output_ids) == 96
    assert seq[gen[0]][0] == seq[gen[1]][0]  # sticky: resubmitted to the same server


def test_resumed_samples_and_groups_go_back_to_their_own_server_among_three():
    # Three servers: round robin would send a resubmission to the next server, stickiness to the same one.
    aborted = _fixture("pause_abort.json", "aborted_generate")["response"]  # 80 partial tokens
    final = _fixture("generate_single.json")["response"]  # 16 tokens
    calls: list[tuple[str, object]] = []  # (host, wire rid) of every /generate
    paused = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/pause_generation":
            paused.set()
            return httpx.Response(200, json={"message": "Generation paused successfully.", "status": "ok"})
        if path in ("/continue_generation", "/update_weights_from_disk"):
            return httpx.Response(200, json={"success": True, "message": "ok", "num_paused_requests": 0})
        body = json.loads(request.content)
        calls.append((request.url.host, body["rid"]))
        first = not paused.is_set()
        if first:
            await paused.wait()  # in flight until the update pauses the servers
        one = aborted if first else final
        return httpx.Response(200, json=[one] * len(body["rid"]) if isinstance(body["rid"], list) else one)

    async def run():
        c = RolloutClient(["http://a:1", "http://b:1", "http://c:1"], vocab_size=1024,
                          transport=httpx.MockTransport(handler))
        single = asyncio.create_task(c.generate([1, 2], SamplingParams(96), rid="s"))
        group = asyncio.create_task(c.generate_group([3, 4], 2, SamplingParams(96), rid="g"))
        while len(calls) < 2:
            await asyncio.sleep(0.01)
        await c.update_weights_from_disk("/ckpt/v1", 1)
        out = await single, await group
        await c.aclose()
        return out

    single, group = asyncio.run(run())
    host = {str(rid): h for h, rid in calls}
    assert host["s"] != host["['g.0', 'g.1']"]
    assert host["s.r1"] == host["s"] and host["['g.0.r1', 'g.1.r1']"] == host["['g.0', 'g.1']"]
    assert len(calls) == 4 and single.n_interruptions == 1 and [g.n_interruptions for g in group] == [1, 1]
    assert {single.server_url} == {f"http://{host['s']}:1"} and len(single.output_ids) == 96


def test_health_is_not_probed_while_the_client_has_the_servers_paused():
    # SGLang's /health blocks while paused and marks the server unhealthy after 20 s: never probe then.
    probes: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            probes.append(request.url.host)
            return httpx.Response(200)
        return httpx.Response(200, json={"message": "ok", "status": "ok"})

    async def run():
        c = RolloutClient(["http://a:1", "http://b:1"], vocab_size=10, transport=httpx.MockTransport(handler))
        before = await c.health()
        await c.pause()
        during = await c.health()
        n_during = len(probes)
        await c.resume()
        after = await c.health()
        await c.aclose()
        return before, during, n_during, after

    before, during, n_during, after = asyncio.run(run())
    assert before == during == after == {"http://a:1": True, "http://b:1": True}
    assert n_during == 2 and len(probes) == 4  # nothing was probed between pause and resume


def test_group_with_out_of_range_ids_sends_nothing():
    replay = Replay([])
    c = replay.client(vocab_size=1024)
    for bad in ([1, 1024], [-1], [10**7]):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            asyncio.run(c.generate_group(bad, 4, SamplingParams(4)))
    assert replay.calls == []


# ---------------------------------------------------------------- against the embedded server (real HTTP)


@pytest.fixture(scope="module")
def _spawned(dirs, tmp_path_factory):
    srv = spawn_server(dirs[0], tmp_path_factory, max_total_tokens=4096, step_delay_s=0.01, wait=False)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def hf_models(dirs, _spawned):  # loaded while the server starts
    from transformers import AutoModelForCausalLM

    return [AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval() for d in dirs]


@pytest.fixture(scope="module")
def server(_spawned, hf_models):
    return _spawned.wait_until_ready()


PROMPT = [40, 41, 42, 43, 44, 45, 46, 47]


def _reference_then_interrupted(server, vocab_size, call):
    """Run ``call(client, tag)`` once undisturbed, then again with a pause/resume while it generates."""

    async def run():
        c = RolloutClient([server.url], vocab_size=vocab_size)
        ref = await call(c, "ref")
        task = asyncio.create_task(call(c, "int"))
        await wait_generating(server.url)  # >= 5 tokens in, far from the budget
        await c.pause()
        await asyncio.sleep(0.2)
        await c.resume()
        got = await task
        await c.aclose()
        return ref, got

    return asyncio.run(run())


@pytest.mark.multiproc
def test_resumed_sample_matches_uninterrupted_greedy(server, hf_models):
    V = hf_models[0].config.vocab_size
    sp = SamplingParams(max_new_tokens=120, temperature=0.0, ignore_eos=True)
    ref, got = _reference_then_interrupted(server, V, lambda c, tag: c.generate(PROMPT, sp))
    assert ref.n_interruptions == 0 and got.n_interruptions == 1
    assert got.output_ids == ref.output_ids
    assert max(abs(a - b) for a, b in zip(got.output_logprobs, ref.output_logprobs)) <= 1e-4
    hf = hf_logprobs(hf_models[0], PROMPT, got.output_ids, 0.0)
    assert max(abs(a - b) for a, b in zip(got.output_logprobs, hf)) <= 1e-4
    assert got.finish_reason == "length" and got.output_versions == [0] * 120


@pytest.mark.multiproc
def test_resumed_group_matches_uninterrupted_greedy_group(server, hf_models):
    """A GRPO group sent as one batched /generate, interrupted mid-way, resumes sample by sample."""
    V = hf_models[0].config.vocab_size
    sp = SamplingParams(max_new_tokens=120, temperature=0.0, ignore_eos=True)
    ref, got = _reference_then_interrupted(server, V, lambda c, tag: c.generate_group(PROMPT, 3, sp, rid=tag))
    assert [r.rid for r in got] == ["int.0", "int.1", "int.2"]
    assert all(r.n_interruptions == 0 for r in ref) and all(g.n_interruptions == 1 for g in got)
    for r, g in zip(ref, got):
        assert g.output_ids == r.output_ids == ref[0].output_ids
        assert max(abs(a - b) for a, b in zip(g.output_logprobs, r.output_logprobs)) <= 1e-4
        assert g.finish_reason == "length" and len(g.output_ids) == 120


@pytest.mark.multiproc
def test_weight_update_mid_generation_labels_versions_and_matches_hf_with_new_weights(server, dirs,
                                                                                       hf_models):
    old, new = hf_models
    V = old.config.vocab_size
    sp = SamplingParams(max_new_tokens=100, temperature=0.0, ignore_eos=True)

    async def run():
        c = RolloutClient([server.url], vocab_size=V)
        try:
            task = asyncio.create_task(c.generate(PROMPT, sp))
            await wait_generating(server.url)
            await c.update_weights_from_disk(str(dirs[1]), 1)
            comp = await task
            info = await c.model_info()
            after = await c.generate(PROMPT, SamplingParams(max_new_tokens=10, temperature=0.0))
            return comp, info, after
        finally:
            await c.update_weights_from_disk(str(dirs[0]), 0)  # leave the module server as it was
            await c.aclose()

    comp, info, after = asyncio.run(run())
    assert info["weight_version"] == "1" and info["model_path"] == str(dirs[1])
    k = comp.output_versions.index(1)
    assert 0 < k < 100 and comp.output_versions == [0] * k + [1] * (100 - k)
    assert comp.n_interruptions == 1 and len(comp.output_ids) == 100
    seq = PROMPT + comp.output_ids
    lp_old = hf_logprobs(old, PROMPT, comp.output_ids, 0.0)
    lp_new = hf_logprobs(new, PROMPT, comp.output_ids, 0.0)
    assert max(abs(a - b) for a, b in zip(comp.output_logprobs[:k], lp_old[:k])) <= 1e-4
    assert max(abs(a - b) for a, b in zip(comp.output_logprobs[k:], lp_new[k:])) <= 1e-4
    # greedy: before the update the old model's argmax, after it the new model's
    lo, ln = hf_logits(old, seq), hf_logits(new, seq)
    P = len(PROMPT)
    for i, t in enumerate(comp.output_ids):
        assert int((lo if i < k else ln)[P - 1 + i].argmax()) == t
    assert after.output_versions == [1] * 10
    assert max(abs(a - b) for a, b in zip(after.output_logprobs,
                                          hf_logprobs(new, PROMPT, after.output_ids, 0.0))) <= 1e-4


@pytest.mark.multiproc
def test_embedded_server_rejects_what_the_client_would_not_send(server, hf_models):
    V = hf_models[0].config.vocab_size

    async def run():
        c = RolloutClient([server.url], vocab_size=V + 10)  # a client with a wrong (too large) vocab
        try:
            with pytest.raises(ServerError) as ei:
                await c.generate([1, V + 5], SamplingParams(4))
            return ei.value
        finally:
            await c.aclose()

    err = asyncio.run(run())
    assert err.status == 400 and "out of the vocabulary" in err.message


@pytest.mark.multiproc
def test_a_dead_server_is_marked_down_and_its_samples_are_reissued_on_a_live_one(server, hf_models):
    """A server that refuses connections: the first group sent to it is re-issued on the live server (prefix
    empty, full budget), the dead one leaves the rotation (callback once), and control calls skip it."""
    from areal_cli.foundations.ports import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    V = hf_models[0].config.vocab_size
    downs = []

    async def run():
        c = RolloutClient([dead, server.url], vocab_size=V, max_retries=0,
                          on_server_down=lambda url, why: downs.append((url, why)))
        try:
            groups = await asyncio.gather(*(c.generate_group([1, 2, 3], 3, SamplingParams(6, temperature=1.0,
                                                                                          ignore_eos=True))
                                            for _ in range(4)))
            await c.pause()  # control calls go to the live server only
            await c.resume()
            return c, groups
        finally:
            await c.aclose()

    c, groups = asyncio.run(run())
    assert all(len(comp.output_ids) == 6 and comp.server_url == server.url for g in groups for comp in g)
    assert list(c.down) == [dead] and len(downs) == 1 and dead in downs[0][1]
    assert c.reissued_samples >= 3 and c.live_urls() == [server.url]


def _with_version(body: dict, label: str) -> dict:
    """A recorded response relabelled as if produced by weights ``label`` (one span over its output)."""
    b = copy.deepcopy(body)
    n = len(b["output_ids"])
    b["meta_info"]["weight_version"] = label
    b["meta_info"]["weight_versions"] = [{"version": label, "start": 0, "end": n}]
    return b


def test_requests_carry_the_policy_version_as_their_prefix_cache_namespace():
    """Each request is sent with ``extra_key`` = the version the servers hold (set by the client's updates, raised
    by the versions responses carry), so SGLang never shares prefix-cache entries across policy versions."""
    final = _fixture("generate_single.json")["response"]
    prompt = _fixture("generate_single.json")["request"]["input_ids"]
    replay = Replay([(200, _with_version(final, "0")), (200, _with_version(final, "3")), (200, final), (200, final)])

    async def run():
        c = replay.client()
        try:
            sp = SamplingParams(max_new_tokens=16, temperature=1.0)
            await c.generate(prompt, sp)  # version unknown: no key
            c.set_weight_version(2)
            await c.generate(prompt, sp)  # sent under 2, answered by 3: the client learns 3
            await c.generate(prompt, sp)
            await c.update_weights_from_disk("/some/weights", 4)
            await c.generate(prompt, sp)
        finally:
            await c.aclose()

    asyncio.run(run())
    keys = [b.get("extra_key") for _, path, b in replay.calls if path == "/generate"]
    assert keys == [None, "areal-v2", "areal-v3", "areal-v4"]


@pytest.mark.parametrize("pause_mode, expected", [("in_place", [5] * 16), ("abort", [6] * 16)])
def test_a_chunk_newer_than_its_namespace_is_labelled_with_the_older_version_in_place(pause_mode, expected):
    """In place, a request queued across a weight update runs on the new weights over cached KV of the version it
    was sent under, while SGLang labels it new: the kit labels it with the version it was sent under. Aborting
    updates flush the cache, so the labels stay as served."""
    final = _fixture("generate_single.json")["response"]
    prompt = _fixture("generate_single.json")["request"]["input_ids"]
    replay = Replay([(200, _with_version(final, "6"))])

    async def run():
        c = RolloutClient(["http://a:1"], vocab_size=1024, transport=httpx.MockTransport(replay.handler),
                          pause_mode=pause_mode)
        c.set_weight_version(5)
        try:
            return await c.generate(prompt, SamplingParams(max_new_tokens=16, temperature=1.0))
        finally:
            await c.aclose()

    assert asyncio.run(run()).output_versions == expected


def test_accumulate_relabels_only_a_chunk_that_starts_newer_than_its_floor():
    from areal_cli.rollout.completion import accumulate
    from areal_cli.rollout.protocol import GenerateResponse

    def resp(spans):
        n = spans[-1][2]
        return GenerateResponse(rid="r", text="", output_ids=list(range(n)), output_logprobs=[-1.0] * n,
                                finish_reason="length", matched_stop=None, prompt_tokens=3, completion_tokens=n,
                                weight_version=spans[-1][0], weight_version_spans=spans)

    for spans, floor, want in [
        ([("3", 0, 2), ("4", 2, 4)], 3, [3, 3, 4, 4]),  # in flight across an update: SGLang's spans kept
        ([("4", 0, 4)], 3, [3, 3, 3, 3]),  # queued across it: the version it was sent under
        ([("4", 0, 2), ("5", 2, 4)], 3, [3, 3, 3, 3]),
        ([("4", 0, 4)], None, [4, 4, 4, 4]),  # no floor: as served
    ]:
        ids, lps, vers = [], [], []
        accumulate(resp(spans), ids, lps, vers, kv_floor=floor)
        assert vers == want, (spans, floor)

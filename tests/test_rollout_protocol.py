"""Claims about areal_cli.rollout.protocol: it parses every recorded SGLang 0.5.23 response shape, builds
SGLang-valid payloads, and turns every recorded error body into one message string."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_cli.rollout.protocol import (
    SGLANG_SAMPLING_KEYS, GenerateRequest, GenerateResponse, ProtocolError, SamplingParams, ServerError,
    build_abort_payload, build_batch_generate_payload, build_generate_payload, build_generate_response,
    build_pause_payload, build_update_weights_from_disk_payload, finish_reason_json, parse_error_message,
    parse_generate_request, parse_generate_response, spans_from_versions, version_to_int,
    versions_from_spans,
)

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "sglang"
MARKER = "...truncated by recorder..."  # inserted by the recorder into long lists; never sent by SGLang


def _strip_marker(obj):
    """Remove the recorder's truncation markers from lists (and from text), recursively."""
    if isinstance(obj, list):
        return [_strip_marker(x) for x in obj if x != MARKER]
    if isinstance(obj, dict):
        return {k: _strip_marker(v) for k, v in obj.items()}
    if isinstance(obj, str):
        return obj.replace(MARKER, "")
    return obj


def _load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _exchanges(name: str) -> list[dict]:
    d = _load(name)
    out = []
    if "endpoint" in d and "response" in d:
        out.append(d)
    out += d.get("related_exchanges", []) + d.get("exchanges", []) + d.get("cases", [])
    return out


def _find(name: str, role: str) -> dict:
    for ex in _exchanges(name):
        if ex.get("role") == role or ex.get("name") == role:
            return ex
    raise KeyError(role)


def _all_generate_200() -> list[tuple[str, dict]]:
    found = []
    for f in sorted(FIXTURES.glob("*.json")):
        for ex in _exchanges(f.name):
            if ex.get("endpoint") == "/generate" and ex.get("status") == 200:
                resp = ex["response"]
                if isinstance(resp, dict) and resp.get("note") == "reduced by recorder":
                    continue  # flush_cache.json keeps only finish_reason of the running request
                found.append((f"{f.name}:{ex.get('role') or ex.get('name') or 'primary'}", ex))
    return found


def test_every_recorded_generate_response_parses():
    cases = _all_generate_200()
    assert len(cases) >= 25, len(cases)
    for label, ex in cases:
        raw = _strip_marker(ex["response"])
        parsed = parse_generate_response(raw)
        items = parsed if isinstance(parsed, list) else [parsed]
        raws = raw if isinstance(raw, list) else [raw]
        for p, r in zip(items, raws, strict=True):
            meta = r["meta_info"]
            assert p.rid == meta["id"], label
            assert p.finish_reason == meta["finish_reason"]["type"], label
            assert p.output_ids == r["output_ids"], label
            if "output_token_logprobs" in meta:
                assert p.output_logprobs == [t[0] for t in meta["output_token_logprobs"]], label
            else:
                assert p.output_logprobs == [], label
            assert p.prompt_tokens == meta["prompt_tokens"], label
            assert p.completion_tokens == meta["completion_tokens"], label
            assert p.weight_version == meta["weight_version"], label
            assert [s[0] for s in p.weight_version_spans] == [s["version"] for s in meta["weight_versions"]]
            truncated = MARKER in json.dumps(ex["response"])
            if not truncated:  # complete lists: the spans tile the output exactly
                assert len(p.output_ids) == p.completion_tokens, label
                assert len(p.token_versions()) == len(p.output_ids), label


def test_single_generate_fixture_fields():
    p = parse_generate_response(_load("generate_single.json")["response"])
    assert isinstance(p, GenerateResponse)
    assert p.rid == "c5db6e6d283544a3aa204ce3d3f3701a"
    assert len(p.output_ids) == len(p.output_logprobs) == 16
    assert p.output_ids[0] == 317 and p.output_logprobs[0] == pytest.approx(-6.859050750732422)
    assert (p.finish_reason, p.matched_stop, p.prompt_tokens) == ("length", None, 7)
    assert p.weight_version_spans == [("default", 0, 16)]
    assert [version_to_int(v) for v in p.token_versions()] == [0] * 16
    assert p.input_token_logprobs == []


def test_batch_fixture_parses_to_a_list_in_input_order():
    ex = _load("generate_batch.json")
    ps = parse_generate_response(ex["response"])
    assert isinstance(ps, list) and len(ps) == 3
    assert [p.prompt_tokens for p in ps] == [len(x) for x in ex["request"]["input_ids"]] == [5, 7, 18]
    assert all(len(p.output_ids) == 8 and p.finish_reason == "length" for p in ps)
    assert len({p.rid for p in ps}) == 3


def test_stop_token_match_is_an_int_and_the_last_output_token():
    p = parse_generate_response(_load("generate_stop.json")["response"])
    assert (p.finish_reason, p.matched_stop) == ("stop", 179)
    assert p.output_ids[-1] == 179 and len(p.output_logprobs) == p.completion_tokens == 7
    q = parse_generate_response(_find("generate_stop.json", "greedy_stop_token")["response"])
    assert (q.finish_reason, q.matched_stop, q.output_ids, q.text) == ("stop", 270, [270], "")


def test_stop_string_match_is_a_string():
    p = parse_generate_response(_find("generate_stop.json", "stop_string")["response"])
    assert (p.finish_reason, p.matched_stop) == ("stop", "is ")
    assert p.output_ids == [270, 270]


def test_eos_finish_shape_with_truncated_lists():
    p = parse_generate_response(_strip_marker(_load("generate_eos.json")["response"]))
    assert (p.finish_reason, p.matched_stop) == ("stop", 2)
    assert p.output_ids[-1] == 2 and p.completion_tokens == 1121
    assert p.weight_version_spans == [("default", 0, 1121)]


def test_abort_returns_partial_output_with_logprobs():
    p = parse_generate_response(_find("pause_abort.json", "aborted_generate")["response"])
    assert p.finish_reason == "abort" and p.finish_message == "Aborted"
    assert p.rid == "long-req-1"
    assert len(p.output_ids) == len(p.output_logprobs) == 80
    assert p.matched_stop is None


def test_response_without_logprobs_parses_ids_only():
    p = parse_generate_response(_find("pause_abort.json", "generate_after_continue")["response"])
    assert p.output_ids == [83, 83, 83, 83] and p.output_logprobs == []


def test_weight_version_spans_expand_to_per_token_versions():
    ex = _find("update_weights_from_disk.json", "generate_spanning_update")
    p = parse_generate_response(_strip_marker(ex["response"]))
    assert p.weight_version_spans == [("v4", 0, 89), ("v5", 89, 600)]
    assert p.weight_version == "v5" and p.num_retractions == 1
    vers = [version_to_int(v) for v in versions_from_spans(p.weight_version_spans, 600)]
    assert vers == [4] * 89 + [5] * 511


def test_prompt_logprobs_have_a_leading_null_and_text_triples_parse():
    p = parse_generate_response(_load("generate_logprob_options.json")["response"])
    assert p.input_token_logprobs[0] is None
    assert len(p.input_token_logprobs) == 5 and all(isinstance(x, float) for x in p.input_token_logprobs[1:])
    assert p.output_ids == [370, 944, 802, 966] and len(p.output_logprobs) == 4


def test_max_new_tokens_zero_has_an_empty_span():
    ex = _find("errors.json", "max_new_tokens_zero")
    p = parse_generate_response(ex["response"])
    assert p.output_ids == [] and p.token_versions() == []
    assert p.weight_version_spans == [("default", 0, 0)]


def test_inconsistent_responses_are_rejected():
    good = _load("generate_single.json")["response"]
    bad = json.loads(json.dumps(good))
    bad["output_ids"] = bad["output_ids"][:-1]
    with pytest.raises(ProtocolError):
        GenerateResponse.from_json(bad)
    bad2 = json.loads(json.dumps(good))
    bad2["meta_info"]["finish_reason"] = {"type": "exploded"}
    with pytest.raises(ProtocolError):
        GenerateResponse.from_json(bad2)
    with pytest.raises(ProtocolError):
        versions_from_spans([("0", 0, 3), ("1", 4, 6)], 6)
    with pytest.raises(ProtocolError):
        versions_from_spans([("0", 0, 3)], 5)


def test_error_bodies_of_every_shape_become_one_message():
    cases = {c["name"]: c for c in _load("errors.json")["cases"]}
    assert parse_error_message(cases["no_input_ids_no_text"]["response"]) == \
        "Either text, input_ids or input_embeds should be provided."  # {"error": {"message"}}
    assert parse_error_message(cases["unknown_sampling_param"]["response"]).startswith(
        "unknown field `no_such_param`")  # {"error": str}
    assert parse_error_message(cases["malformed_json"]["response"]).startswith(
        "1 validation error:")  # {"object": "error", "message"}
    assert parse_error_message(cases["update_weights_bad_path"]["response"]).startswith(
        "Failed to get weights iterator")  # {"success": false, "message"}
    flush = _find("flush_cache.json", "flush_while_running")
    assert parse_error_message(flush["response"]) == "Flush cache failed."  # plain text
    assert parse_error_message("") == "" and parse_error_message(None) == ""
    for name, c in cases.items():
        if c["status"] == 400:
            msg = parse_error_message(c["response"])
            assert msg, name
            with pytest.raises(ServerError):
                parse_generate_response(c["response"])


def test_version_labels_map_to_ints():
    assert version_to_int("default") == 0
    assert version_to_int("0") == 0 and version_to_int("3") == 3 and version_to_int("v12") == 12
    assert version_to_int(7) == 7
    for bad in ("abc", "-1", "", "1.5"):
        with pytest.raises(ValueError):
            version_to_int(bad)


def test_spans_round_trip_per_token_versions():
    vers = ["0", "0", "0", "1", "1", "2"]
    spans = spans_from_versions(vers, "2")
    assert spans == [{"version": "0", "start": 0, "end": 3}, {"version": "1", "start": 3, "end": 5},
                     {"version": "2", "start": 5, "end": 6}]
    assert versions_from_spans([(s["version"], s["start"], s["end"]) for s in spans], 6) == vers
    assert spans_from_versions([], "4") == [{"version": "4", "start": 0, "end": 0}]


def test_payload_builders_produce_sglang_bodies():
    rec = _load("generate_single.json")["request"]
    body = build_generate_payload(rec["input_ids"], SamplingParams(max_new_tokens=16, temperature=1.0,
                                                                   top_p=1.0))
    assert body["input_ids"] == rec["input_ids"] and body["return_logprob"] is True
    for k, v in rec["sampling_params"].items():
        assert body["sampling_params"][k] == v
    sp = SamplingParams(max_new_tokens=5, temperature=0.0, top_k=3, stop_token_ids=[2], ignore_eos=True,
                        min_new_tokens=2, seed=11)
    js = sp.to_json()
    assert set(js) <= SGLANG_SAMPLING_KEYS
    assert js["sampling_seed"] == 11 and js["stop_token_ids"] == [2] and js["min_new_tokens"] == 2
    assert "sampling_seed" not in SamplingParams(max_new_tokens=1).to_json()
    assert SamplingParams.from_json(js) == sp
    req = GenerateRequest([1, 2], sp, rid="r1").to_json()
    assert req["rid"] == "r1" and "logprob_start_len" not in req
    batch = build_batch_generate_payload([[1], [2, 3]], sp, rids=["a", "b"])
    assert batch["input_ids"] == [[1], [2, 3]] and batch["rid"] == ["a", "b"]
    assert build_pause_payload() == {"mode": "abort"}
    assert build_update_weights_from_disk_payload("/m", weight_version="3", abort_all_requests=True) == \
        {"model_path": "/m", "weight_version": "3", "abort_all_requests": True}
    assert build_abort_payload("x") == {"rid": "x"} and build_abort_payload(abort_all=True) == {"abort_all": True}


def test_server_side_request_parser_accepts_recorded_requests_and_rejects_bad_ones():
    kw = dict(vocab_size=1024, context_length=2048)
    n_ok = 0
    for _, ex in _all_generate_200():
        body = ex["request"]
        if "stop" in body.get("sampling_params", {}) or body.get("top_logprobs_num"):
            with pytest.raises(ProtocolError, match="not supported"):  # rejected loudly, never ignored
                parse_generate_request(body, **kw)
            continue
        if "text" in body:
            body = {k: v for k, v in body.items() if k != "text"}
        reqs, is_batch = parse_generate_request(body, **kw)
        assert is_batch == isinstance(body["input_ids"][0], list)
        n_ok += 1
    assert n_ok >= 20
    cases = {c["name"]: c for c in _load("errors.json")["cases"]}
    for name in ("no_input_ids_no_text", "max_new_tokens_negative", "temperature_negative", "top_p_zero",
                 "empty_input_ids", "prompt_too_long", "prompt_plus_max_new_tokens_too_long",
                 "unknown_sampling_param", "input_ids_not_ints"):
        body = _strip_marker(cases[name]["request"])
        if name.startswith("prompt"):  # the recorder shortened these lists; rebuild the real lengths
            n = 2100 if name == "prompt_too_long" else 100
            body = {**body, "input_ids": [5] * n}
        with pytest.raises(ProtocolError) as ei:
            parse_generate_request(body, **kw)
        expected = parse_error_message(cases[name]["response"])
        if name != "input_ids_not_ints":
            assert str(ei.value).split(",")[0] == expected.split(",")[0], name
    # what crashes a real SGLang server is a clean error here
    for bad in ([1, 2, 10_000_000], [-5, 1]):
        with pytest.raises(ProtocolError, match="out of the vocabulary"):
            parse_generate_request({"input_ids": bad, "sampling_params": {"max_new_tokens": 4}}, **kw)


def test_embedded_response_builder_round_trips_through_the_parser():
    obj = build_generate_response(
        rid="r", text="hi", output_ids=[5, 6, 2], output_logprobs=[-1.0, -2.0, -0.5],
        finish_reason=finish_reason_json("stop", matched=2), prompt_tokens=4, weight_version="1",
        token_versions=["0", "1", "1"], input_token_logprobs=[(None, 9), (-3.0, 8)])
    p = GenerateResponse.from_json(obj)
    assert (p.output_ids, p.output_logprobs, p.finish_reason, p.matched_stop) == \
        ([5, 6, 2], [-1.0, -2.0, -0.5], "stop", 2)
    assert p.weight_version_spans == [("0", 0, 1), ("1", 1, 3)]
    assert p.input_token_logprobs == [None, -3.0]
    assert obj["meta_info"]["output_token_logprobs"][0] == [-1.0, 5, None]
    assert finish_reason_json("abort")["message"] == "Aborted"
    assert finish_reason_json("length", length=16) == {"type": "length", "length": 16}

"""Claims about areal_cli.rollout.server: the embedded server speaks SGLang's native protocol, its logprobs
equal an HF recompute, it answers 400 where real SGLang crashes, /health never blocks (also while paused),
pause/abort/retract/update behave like SGLang, and its child process never outlives its launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import httpx
import pytest
import torch

from areal_cli.rollout.protocol import GenerateResponse, parse_generate_response
from areal_cli.rollout.server import FLUSH_FAILED, FLUSH_OK, EmbeddedServer

from helpers.hf_reference import hf_logprobs
from helpers.servers import spawn_server

pytestmark = pytest.mark.multiproc  # every test here starts processes

torch.set_num_threads(1)
PROMPTS = [[5, 17, 33], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [7, 8, 9, 10, 11, 12]]


@pytest.fixture(scope="module")
def _spawned(dirs, tmp_path_factory):
    srv = spawn_server(dirs[0], tmp_path_factory, max_total_tokens=4096, step_delay_s=0.005, wait=False)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def hf_models(dirs, _spawned):  # loaded while the server child starts up
    from transformers import AutoModelForCausalLM

    return [AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval() for d in dirs]


@pytest.fixture(scope="module")
def server(_spawned, hf_models):
    return _spawned.wait_until_ready()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _gen(http, input_ids, max_new_tokens=8, temperature=0.0, **extra) -> httpx.Response:
    sp = {"max_new_tokens": max_new_tokens, "temperature": temperature, **extra.pop("sp", {})}
    return http.post("/generate", json={"input_ids": input_ids, "sampling_params": sp, "return_logprob": True,
                                        **extra})


def _decode_tokens(http) -> int:
    return http.get("/server_info").json()["internal_states"][0]["decode_tokens"]


def _wait_generating(http, at_least: int = 5, timeout: float = 20) -> None:
    """Block until the engine decoded `at_least` more tokens (a request is mid-generation)."""
    base = _decode_tokens(http)
    t0 = time.monotonic()
    while _decode_tokens(http) < base + at_least:
        assert time.monotonic() - t0 < timeout, "server did not start generating"
        time.sleep(0.01)


def _wait_running(http, n: int, timeout: float = 20) -> None:
    """Block until `n` requests are in the engine's running batch."""
    t0 = time.monotonic()
    while http.get("/server_info").json()["internal_states"][0]["num_running_reqs"] < n:
        assert time.monotonic() - t0 < timeout, f"{n} requests did not start"
        time.sleep(0.01)


def _long(http, rid, n=1500, temperature=1.0, prompt=PROMPTS[0]) -> httpx.Response:
    return _gen(http, prompt, n, temperature, rid=rid, sp={"ignore_eos": True})


def test_server_logprobs_match_hf_recompute(server, http, hf_models, dirs):
    hf = hf_models[0]
    r = _gen(http, PROMPTS, max_new_tokens=20)  # a batch: the response is a list in input order
    assert r.status_code == 200 and isinstance(r.json(), list)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(dirs[0] / "tokenizer.json"))
    for p, obj in zip(PROMPTS, r.json(), strict=True):
        g = GenerateResponse.from_json(obj)
        assert g.prompt_tokens == len(p) and g.finish_reason == "length" and len(g.output_ids) == 20
        ref = hf_logprobs(hf, p, g.output_ids, 0.0)
        assert max(abs(a - b) for a, b in zip(ref, g.output_logprobs)) <= 1e-4
        assert g.weight_version_spans == [("0", 0, 20)]
        assert g.text == tok.decode(g.output_ids, skip_special_tokens=True)
    with ThreadPoolExecutor(3) as ex:  # concurrent sampled requests share the running batch
        futs = [ex.submit(_gen, http, p, 25, 0.8, sp={"top_p": 0.95, "top_k": 50}) for p in PROMPTS]
        for p, f in zip(PROMPTS, futs):
            g = parse_generate_response(f.result().json())
            ref = hf_logprobs(hf, p, g.output_ids, 0.8)
            assert max(abs(a - b) for a, b in zip(ref, g.output_logprobs)) <= 1e-4


def test_out_of_range_ids_get_400_and_the_server_keeps_serving(server, http):
    V = http.get("/model_info").json()["vocab_size"]
    for bad in ([1, 2, 10_000_000], [1, V], [-5, 1], [[1, 2], [3, V]]):
        r = _gen(http, bad, 4)
        assert r.status_code == 400, bad
        assert "out of the vocabulary" in r.json()["error"]["message"]
    r = _gen(http, [], 4)
    assert r.status_code == 400 and r.json() == {"error": {"message": "input_ids cannot be empty."}}
    r = http.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "top_p": 0}})
    assert r.json() == {"error": {"message": "top_p must be in (0, 1], got 0."}}
    r = http.post("/generate", json={"input_ids": [1], "sampling_params": {"no_such_param": 1}})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("unknown field `no_such_param`")
    r = http.post("/generate", content=b'{"input_ids": [1, 2, 3], "sampling_params": {')
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert http.get("/health").status_code == 200
    assert _gen(http, [1, 2, 3], 3).status_code == 200


def test_health_answers_while_paused_and_new_generate_waits_for_continue(server, http):
    assert http.post("/pause_generation", json={}).json() == {"message": "Generation paused successfully.",
                                                               "status": "ok"}
    try:
        t0 = time.monotonic()
        assert http.get("/health").status_code == 200
        assert time.monotonic() - t0 < 1.0  # SGLang 0.5.23 blocks here for 20 s and then says 503
        assert http.get("/ready").status_code == 503
        with ThreadPoolExecutor(1) as ex:
            fut = ex.submit(_gen, http, PROMPTS[0], 4)
            with pytest.raises(FutureTimeout):  # held (no error, no answer) until continue, like SGLang
                fut.result(timeout=0.7)
            assert http.post("/continue_generation", json={}).json()["status"] == "ok"
            r = fut.result(timeout=30)
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 4
    finally:
        http.post("/continue_generation", json={})
    assert http.get("/ready").status_code == 200


def test_pause_abort_returns_partial_output_with_logprobs(server, http):
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(_long, http, "long-1")
        _wait_generating(http)
        t0 = time.monotonic()
        assert http.post("/pause_generation", json={"mode": "abort"}).status_code == 200
        assert time.monotonic() - t0 < 1.0
        r = fut.result(timeout=30)
    try:
        assert r.status_code == 200  # an abort is a normal 200 answer
        g = GenerateResponse.from_json(r.json())
        assert g.rid == "long-1" and g.finish_reason == "abort"
        assert r.json()["meta_info"]["finish_reason"] == {"type": "abort", "message": "Aborted",
                                                          "status_code": None, "err_type": None}
        assert 0 < len(g.output_ids) < 1500 and len(g.output_logprobs) == len(g.output_ids)
        assert len(g.token_versions()) == len(g.output_ids)
    finally:
        http.post("/continue_generation", json={})


def test_flush_cache_and_abort_request_behave_like_sglang(server, http):
    r = http.post("/flush_cache")
    assert (r.status_code, r.text) == (200, FLUSH_OK)
    assert http.get("/flush_cache").status_code == 200
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(_long, http, "abort-me")
        _wait_generating(http)
        r = http.post("/flush_cache")
        assert (r.status_code, r.text) == (400, FLUSH_FAILED)
        r = http.post("/abort_request", json={"rid": "abort-me"})
        assert (r.status_code, r.content) == (200, b"")
        g = parse_generate_response(fut.result(timeout=30).json())
    assert g.finish_reason == "abort" and 0 < len(g.output_ids) < 1500
    assert http.post("/abort_request", json={"rid": "no-such-request"}).status_code == 200
    with ThreadPoolExecutor(2) as ex:
        futs = [ex.submit(_long, http, f"all-{i}") for i in range(2)]
        _wait_running(http, 2)
        assert http.post("/abort_request", json={"abort_all": True}).status_code == 200
        assert {parse_generate_response(f.result(timeout=30).json()).finish_reason for f in futs} == {"abort"}


def test_update_weights_from_disk_sets_version_and_new_logprobs_match_hf(server, http, dirs, hf_models):
    r = http.post("/update_weights_from_disk", json={"model_path": "/nonexistent/model"})
    assert r.status_code == 400 and r.json()["success"] is False and r.json()["message"]
    assert http.get("/model_info").json()["weight_version"] == "0"
    try:
        r = http.post("/update_weights_from_disk", json={"model_path": str(dirs[1]), "weight_version": "1"})
        assert r.json() == {"success": True, "num_paused_requests": 0,
                            "message": "Succeeded to update model weights. Weight version updated to 1."}
        info = http.get("/model_info").json()
        assert (info["weight_version"], info["model_path"]) == ("1", str(dirs[1]))
        g = parse_generate_response(_gen(http, PROMPTS[1], 16).json())
        assert g.weight_version == "1" and g.weight_version_spans == [("1", 0, 16)]
        ref = hf_logprobs(hf_models[1], PROMPTS[1], g.output_ids, 0.0)
        assert max(abs(a - b) for a, b in zip(ref, g.output_logprobs)) <= 1e-4
        old = hf_logprobs(hf_models[0], PROMPTS[1], g.output_ids, 0.0)
        assert max(abs(a - b) for a, b in zip(old, g.output_logprobs)) > 1e-2  # the weights really changed
    finally:
        r = http.post("/update_weights_from_disk", json={"model_path": str(dirs[0]), "weight_version": "0"})
        assert r.json()["success"] is True


def test_pause_retract_update_continue_splits_versions_like_sglang(server, http, dirs, hf_models):
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(_long, http, "across-update", 300, 0.0, PROMPTS[2])
        _wait_generating(http)
        assert http.post("/pause_generation", json={"mode": "retract"}).status_code == 200
        try:  # while paused the update does not wait for the (retracted) request
            r = http.post("/update_weights_from_disk", json={"model_path": str(dirs[1]), "weight_version": "1"})
            assert r.json()["success"] is True
        finally:
            http.post("/continue_generation", json={})
        g = parse_generate_response(fut.result(timeout=60).json())
    try:
        assert g.finish_reason == "length" and len(g.output_ids) == 300 and g.num_retractions == 1
        (v0, s0, k), (v1, k2, end) = g.weight_version_spans
        assert (v0, s0, v1, k2, end) == ("0", 0, "1", k, 300) and 0 < k < 300
        # retract drops the KV: the tokens after the update are exactly the new model's given the prefix
        old = hf_logprobs(hf_models[0], PROMPTS[2], g.output_ids, 0.0)
        new = hf_logprobs(hf_models[1], PROMPTS[2], g.output_ids, 0.0)
        assert max(abs(a - b) for a, b in zip(old[:k], g.output_logprobs[:k])) <= 1e-4
        assert max(abs(a - b) for a, b in zip(new[k:], g.output_logprobs[k:])) <= 1e-4
    finally:
        http.post("/update_weights_from_disk", json={"model_path": str(dirs[0]), "weight_version": "0"})


def test_launch_failure_raises_with_the_log_tail(tmp_path, dirs):
    bad = tmp_path / "noweights"
    bad.mkdir()
    (bad / "config.json").write_text((dirs[0] / "config.json").read_text())
    with pytest.raises(RuntimeError, match="no model.safetensors") as ei:
        EmbeddedServer.launch(bad, startup_timeout_s=60)
    assert "exited with code" in str(ei.value)


def test_bad_sizes_or_weights_exit_with_one_line_and_no_traceback(dirs, tmp_path):
    bad = tmp_path / "corrupt"
    bad.mkdir()
    (bad / "config.json").write_text((dirs[0] / "config.json").read_text())
    (bad / "model.safetensors").write_bytes(b"\x01" * 1000)
    for model, args, says in [(dirs[0], ["--max-total-tokens", "0"], "must be >= 1"),
                              (dirs[0], ["--context-length", "-5"], "context_length must be >= 1"),
                              (bad, [], "cannot start the engine")]:
        proc = subprocess.run([sys.executable, "-m", "areal_cli.rollout.server", "--model-path", str(model),
                               "--port", "1", *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, args
        assert says in proc.stderr.strip().splitlines()[-1], args


def test_server_child_exits_when_its_launcher_is_killed(dirs, tmp_path):
    # The launcher is SIGKILLed right after spawning (no atexit, no stop()): the child's parent watchdog,
    # started before its slow imports, must take it down.
    script = textwrap.dedent(f"""
        import sys, time
        from areal_cli.rollout.server import EmbeddedServer
        s = EmbeddedServer.launch({str(dirs[0])!r}, wait=False)
        print(s.proc.pid, flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True)
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        t0 = time.monotonic()
        while _alive(child):
            assert time.monotonic() - t0 < 10, "orphaned embedded server"
            time.sleep(0.1)
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] not in "ZX"
    except FileNotFoundError:
        return False


def test_sampling_seed_extra_key_and_min_new_tokens_follow_sglangs_flags(server, http, dirs, tmp_path_factory):
    """As SGLang 0.5.23 (tests/real_sglang checks it there): ``sampling_seed`` is honoured only with
    ``--enable-deterministic-inference`` (the kit starts its servers with it), ``min_new_tokens > 0`` is refused
    under ``--skip-tokenizer-init``, and ``extra_key`` (the prefix-cache namespace) is accepted (the embedded engine
    keeps no prefix cache across requests, so it changes nothing) but must be a string."""
    from areal_cli.rollout.server.generate_routes import MIN_NEW_TOKENS_NEEDS_TOKENIZER

    sp = {"sampling_seed": 1234, "ignore_eos": True}
    seeded = [_gen(http, PROMPTS[0], 16, 1.0, sp=sp).json()["output_ids"] for _ in range(2)]
    assert seeded[0] == seeded[1]  # the kit's launches: --enable-deterministic-inference
    assert http.get("/server_info").json()["enable_deterministic_inference"] is True
    assert _gen(http, PROMPTS[0], 4, extra_key="areal-v0").status_code == 200
    bad = _gen(http, PROMPTS[0], 4, extra_key=5)
    assert bad.status_code == 400 and "extra_key" in bad.json()["error"]["message"]
    plain = spawn_server(dirs[0], tmp_path_factory, log_folder="plain",
                         extra_args=["--no-deterministic-inference", "--skip-tokenizer-init"])
    try:
        with httpx.Client(base_url=plain.url, timeout=60) as h:
            outs = {tuple(_gen(h, PROMPTS[0], 16, 1.0, sp=sp).json()["output_ids"]) for _ in range(3)}
            assert len(outs) > 1  # the same seed, other samples: ignored, as SGLang does
            assert h.get("/server_info").json()["enable_deterministic_inference"] is False
            r = _gen(h, PROMPTS[0], 8, sp={"min_new_tokens": 2})
            assert r.status_code == 400 and r.json()["error"]["message"] == MIN_NEW_TOKENS_NEEDS_TOKENIZER.format(2)
    finally:
        plain.stop()


def test_stop_is_idempotent_and_frees_the_port(server):
    server.stop()
    server.stop()
    assert not server.alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health", timeout=2)


"""Claims about areal_cli.rollout.weight_sync: the collective weight-update payloads carry SGLang's field
names and types, buckets keep order and respect the size cap, ranks are laid out as AReaL does, and a
gloo broadcast from a trainer process loads exactly the weights a disk update loads into an embedded
server (same greedy tokens and logprobs), with clear errors and no hanging group when a server refuses.

No recording of /init_weights_update_group or /update_weights_from_distributed exists in
shared/fixtures/sglang; the field names below are those of SGLang's io_struct.py
(InitWeightsUpdateGroupReqInput, UpdateWeightsFromDistributedReqInput, DestroyWeightsUpdateGroupReqInput).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
import torch

from areal_cli.rollout.protocol import (
    ParamSpec, ProtocolError, build_destroy_weights_update_group_payload, build_init_weights_update_group_payload,
    build_update_weights_from_distributed_payload, parse_destroy_weights_update_group_request,
    parse_init_weights_update_group_request, parse_update_weights_from_distributed_request,
)
from areal_cli.rollout.weight_sender import (
    WeightSender, WeightSyncError, param_specs, plan_buckets, rank_offsets, weight_update_world_size,
)
from areal_cli.rollout.weight_sync import WeightSyncSpec, close_senders, sync_weights_from_engine, update_weights_distributed

from helpers.servers import spawn_server

# Field names of SGLang's request dataclasses (sgl-project/sglang python/sglang/srt/managers/io_struct.py).
SGLANG_INIT_FIELDS = {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}
SGLANG_UPDATE_FIELDS = {"names", "dtypes", "shapes", "group_name", "flush_cache", "abort_all_requests",
                        "weight_version", "load_format", "torch_empty_cache"}
PROMPTS = [[5, 17, 33], [40, 41, 42, 43, 44, 45, 46]]


# ---------------------------------------------------------------------------------------------- pure parts


def test_init_payload_has_sglang_fields_and_port_as_string_like_areal():
    p = build_init_weights_update_group_payload("10.0.0.1", 29500, rank_offset=3, world_size=5,
                                                group_name="g", backend="gloo")
    assert p == {"master_address": "10.0.0.1", "master_port": "29500", "rank_offset": 3, "world_size": 5,
                 "group_name": "g", "backend": "gloo"}
    assert set(p) <= SGLANG_INIT_FIELDS
    assert build_init_weights_update_group_payload("h", 1, 1, 2)["group_name"] == "weight_update_group"
    assert build_init_weights_update_group_payload("h", 1, 1, 2)["backend"] == "nccl"
    parsed = parse_init_weights_update_group_request(p)
    assert (parsed.master_port, parsed.rank_offset, parsed.world_size) == (29500, 3, 5)
    assert parse_init_weights_update_group_request({**p, "master_port": 29500}).master_port == 29500
    for bad in ({**p, "rank_offset": 0}, {**p, "rank_offset": 5}, {**p, "master_port": "x"},
                {k: v for k, v in p.items() if k != "world_size"}, [p]):
        with pytest.raises(ProtocolError):
            parse_init_weights_update_group_request(bad)
    with pytest.raises(ValueError):
        build_init_weights_update_group_payload("h", 29500, rank_offset=0, world_size=2)


def test_update_payload_has_sglang_fields_and_dtype_strings():
    named = [("a.weight", torch.zeros(4, 3, dtype=torch.bfloat16)), ("b.bias", torch.zeros(7))]
    specs = param_specs(named)
    assert specs == [ParamSpec("a.weight", (4, 3), "bfloat16"), ParamSpec("b.bias", (7,), "float32")]
    p = build_update_weights_from_distributed_payload(specs, "g", weight_version=3)
    assert p == {"names": ["a.weight", "b.bias"], "dtypes": ["bfloat16", "float32"], "shapes": [[4, 3], [7]],
                 "group_name": "g", "flush_cache": True, "abort_all_requests": True, "weight_version": "3"}
    assert set(p) <= SGLANG_UPDATE_FIELDS
    assert "weight_version" not in build_update_weights_from_distributed_payload(specs)
    back = parse_update_weights_from_distributed_request(p)
    assert back.specs == specs and back.weight_version == "3" and back.abort_all_requests
    assert not parse_update_weights_from_distributed_request({**p, "abort_all_requests": None}).abort_all_requests
    for bad in ({**p, "dtypes": ["bfloat16"]}, {**p, "dtypes": ["complex32", "float32"]},
                {**p, "shapes": [[4, -3], [7]]}, {**p, "names": ["a", "a"]}, {**p, "names": []}):
        with pytest.raises(ProtocolError):
            parse_update_weights_from_distributed_request(bad)
    assert build_destroy_weights_update_group_payload() == {"group_name": "weight_update_group"}
    assert parse_destroy_weights_update_group_request({}) == "weight_update_group"


def test_buckets_keep_order_respect_the_cap_and_isolate_oversized_tensors():
    mib = 2**20 // 4  # float32 elements per MiB
    specs = [ParamSpec(f"p{i}", (n * mib,), "float32") for i, n in enumerate([1, 1, 3, 1, 1, 1])]
    buckets = plan_buckets(specs, chunk_mb=2)
    assert [[s.name for s in b] for b in buckets] == [["p0", "p1"], ["p2"], ["p3", "p4"], ["p5"]]
    assert [s for b in buckets for s in b] == specs
    assert all(sum(s.nbytes for s in b) <= 2 * 2**20 for b in buckets if len(b) > 1)
    assert plan_buckets(specs, chunk_mb=100) == [specs]
    with pytest.raises(ValueError):
        plan_buckets(specs, 0)


def test_rank_offsets_follow_areal_layout():
    assert rank_offsets(3) == [1, 2, 3] and weight_update_world_size(3) == 4
    assert rank_offsets(2, tp=2, pp=2) == [1, 5] and weight_update_world_size(2, tp=2, pp=2) == 9
    with pytest.raises(ValueError):
        rank_offsets(0)


# ---------------------------------------------------------------------------------------------- end to end


def _perturbed(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(seed)
    state = load_file(str(model_dir / "model.safetensors"))
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in sorted(state.items())}


def _save(state: dict[str, torch.Tensor], src: Path, dst: Path) -> Path:
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(src, dst)
    save_file({k: v.contiguous() for k, v in state.items()}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    return dst


def _greedy(http: httpx.Client) -> list[tuple[list[int], list[float], str]]:
    r = http.post("/generate", json={"input_ids": PROMPTS, "return_logprob": True,
                                     "sampling_params": {"max_new_tokens": 6, "temperature": 0.0}})
    assert r.status_code == 200, r.text
    return [(o["output_ids"], [t[0] for t in o["meta_info"]["output_token_logprobs"]],
             o["meta_info"]["weight_version"]) for o in r.json()]


@pytest.fixture(scope="module")
def server(dirs, tmp_path_factory):
    srv = spawn_server(dirs[0], tmp_path_factory, log_folder="wsrv", max_total_tokens=2048,
                       extra_args=["--weight-sync-timeout-s", "20"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.mark.multiproc
@pytest.mark.slow
def test_gloo_broadcast_in_buckets_loads_what_a_disk_update_loads(server, http, dirs, tmp_path):
    before = _greedy(http)
    new = _perturbed(dirs[0], seed=1)
    with WeightSender([server.url], backend="gloo", group_name="wsync-test", timeout_s=20) as sender:
        stats = sender.send(list(new.items()), version=7, chunk_mb=0.25)  # tiny model ~1.3 MiB -> buckets
        assert stats["buckets"] >= 2 and stats["tensors"] == len(new)
        assert http.get("/model_info").json()["weight_version"] == "7"
        via_broadcast = _greedy(http)
        # the group stays formed: a second send reuses it
        sender.send(list(_perturbed(dirs[0], seed=2).items()), version=8, chunk_mb=0.25)
        assert http.get("/model_info").json()["weight_version"] == "8"
    assert [v for *_, v in via_broadcast] == ["7", "7"]
    assert [o[0] for o in via_broadcast] != [o[0] for o in before] or \
        [o[1] for o in via_broadcast] != [o[1] for o in before]
    path = _save(new, dirs[0], tmp_path / "perturbed1")
    r = http.post("/update_weights_from_disk", json={"model_path": str(path), "weight_version": "9"})
    assert r.status_code == 200 and r.json()["success"], r.text
    via_disk = _greedy(http)
    assert [o[:2] for o in via_disk] == [o[:2] for o in via_broadcast]  # exact: same weights, same numbers
    # destroyed on close: an update on that group is refused at once
    assert http.post("/begin_weight_update", json={}).status_code == 200
    r = http.post("/update_weights_from_distributed",
                  json=build_update_weights_from_distributed_payload(param_specs(list(new.items())[:1]),
                                                                     "wsync-test"))
    assert http.post("/end_weight_update", json={}).status_code == 200
    assert r.status_code == 400 and not r.json()["success"] and "not initialized" in r.json()["message"]


@pytest.mark.multiproc
@pytest.mark.slow
def test_refused_bucket_names_the_server_and_the_next_send_works(server, http, dirs):
    new = _perturbed(dirs[0], seed=3)
    bad = dict(new)
    bad["model.norm.weight"] = torch.zeros(5)  # wrong shape: received (shapes come from the payload), refused
    version_before = http.get("/model_info").json()["weight_version"]
    with WeightSender([server.url], backend="gloo", group_name="wsync-bad", timeout_s=15) as sender:
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError) as ei:
            sender.send(list(bad.items()), version=11, chunk_mb=0.25)
        assert time.monotonic() - t0 < 15  # an answer, not a timeout
        msg = str(ei.value)
        assert server.url in msg and "model.norm.weight" in msg and "(5,)" in msg
        assert sender.pg is None  # torn down on both sides
        assert http.get("/model_info").json()["weight_version"] == version_before
        sender.send(list(new.items()), version=12, chunk_mb=0.25)  # a new group forms
        assert http.get("/model_info").json()["weight_version"] == "12"
    assert http.get("/health").status_code == 200


@pytest.mark.multiproc
@pytest.mark.slow
def test_server_that_never_receives_gives_an_error_not_a_hang(server, http, dirs):
    """The server lost the group (destroyed behind the sender's back): it refuses at once, the sender stops
    waiting for the broadcast, reports the server, and the next send forms a fresh group."""
    new = _perturbed(dirs[0], seed=4)
    with WeightSender([server.url], backend="gloo", group_name="wsync-lost", timeout_s=10) as sender:
        sender.init()
        r = http.post("/destroy_weights_update_group", json={"group_name": "wsync-lost"})
        assert r.json()["success"]
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match="not initialized"):
            sender.send(list(new.items()), version=21, chunk_mb=0.25)
        assert time.monotonic() - t0 < 10
        sender.send(list(new.items()), version=22, chunk_mb=0.25)
        assert http.get("/model_info").json()["weight_version"] == "22"


class _FakeEngine:
    def __init__(self, state):
        self.state = state

    def hf_state_dict(self):
        return dict(self.state)


@pytest.mark.multiproc
@pytest.mark.slow
def test_sync_weights_from_engine_caches_its_sender_and_the_async_helper_pauses(server, http, dirs):
    from areal_cli.rollout.client import RolloutClient

    spec = WeightSyncSpec(urls=(server.url,), backend="gloo", group_name="wsync-engine", chunk_mb=0.5,
                          timeout_s=20)
    eng = _FakeEngine(_perturbed(dirs[0], seed=5))
    client = RolloutClient([server.url], vocab_size=512)
    seen = []
    client.on_activity = lambda u, kind, a, b: seen.append(kind)

    async def run():
        async def one(v):
            return await asyncio.to_thread(sync_weights_from_engine, eng, spec, v)
        try:
            s1 = await update_weights_distributed(client, lambda: one(31), 31)
            assert not client.paused
            s2 = await update_weights_distributed(client, lambda: one(32), 32)
            return s1, s2
        finally:
            await client.aclose()

    import torch.distributed as dist

    from areal_cli.foundations.ports import free_port

    # the trainer's own default group (world of 1 here) exists before and is untouched by the sync
    # (earlier tests in this pytest process may have created it already: then it is used and kept)
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        s1, s2 = asyncio.run(run())
        assert s1["buckets"] >= 2 and s2["tensors"] == s1["tensors"]
        assert http.get("/model_info").json()["weight_version"] == "32"
        assert seen == ["update", "update"]
        assert http.get("/ready").status_code == 200  # resumed
        assert dist.get_world_size() == 1 and dist.get_rank() == 0
        x = torch.ones(3)
        dist.all_reduce(x)
        assert x.tolist() == [1.0, 1.0, 1.0]
    finally:
        close_senders()
        if created:
            dist.destroy_process_group()


def test_only_global_rank_zero_sends_but_every_rank_gathers(monkeypatch):
    import areal_cli.rollout.weight_sync as ws

    class Counting(_FakeEngine):
        calls = 0

        def hf_state_dict(self):
            Counting.calls += 1
            return super().hf_state_dict()

    monkeypatch.setattr(ws, "_global_rank", lambda: 1)
    spec = WeightSyncSpec(urls=("http://127.0.0.1:9",), backend="gloo")  # never contacted on rank 1
    assert sync_weights_from_engine(Counting({"w": torch.zeros(2)}), spec, 3) is None
    assert Counting.calls == 1 and not ws._SENDERS


@pytest.mark.multiproc
@pytest.mark.slow
def test_server_refuses_bad_group_requests_with_sglang_reply_shape(server, http):
    ok = build_init_weights_update_group_payload("127.0.0.1", 29999, 1, 2, group_name="g", backend="nccl")
    r = http.post("/init_weights_update_group", json=ok)  # the CPU server has no NCCL
    assert r.status_code == 400 and r.json()["success"] is False and "gloo" in r.json()["message"]
    r = http.post("/init_weights_update_group", json={**ok, "backend": "gloo", "rank_offset": 0})
    assert r.status_code == 400 and set(r.json()) == {"success", "message"}
    r = http.post("/update_weights_from_distributed", json={"names": ["a"], "dtypes": ["float32"]})
    assert r.status_code == 400 and r.json()["success"] is False and "shapes" in r.json()["message"]
    r = http.post("/destroy_weights_update_group", json={"group_name": "never-made"})
    assert r.status_code == 400 and r.json()["success"] is False


@pytest.mark.multiproc
@pytest.mark.slow
def test_unreachable_server_fails_group_init_at_once_and_the_live_server_keeps_serving(server, http):
    from areal_cli.foundations.ports import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: this server never joins the group
    sender = WeightSender([server.url, dead], backend="gloo", group_name="wsync-dead", timeout_s=10)
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError) as ei:
        sender.init()
    assert time.monotonic() - t0 < 8  # the refusal, not the 10 s group timeout
    assert dead in str(ei.value) and sender.pg is None
    # the live server is blocked in its join only in a side thread (until its own timeout): it serves
    assert http.get("/health").status_code == 200
    assert _greedy(http)[0][0]


def test_engine_loads_a_subset_in_place_and_a_refused_load_changes_nothing(dirs):
    from areal_cli.foundations.errors import UserError
    from areal_cli.rollout.engine import InferenceEngine

    eng = InferenceEngine(dirs[0], max_total_tokens=256)
    ref = InferenceEngine(dirs[1], max_total_tokens=256)  # the perturbed checkpoint, loaded from disk
    before = eng.model.full_logits(PROMPTS[1])
    new = _perturbed(dirs[0], seed=6)
    bad = {"model.layers.0.mlp.up_proj.weight": new["model.layers.0.mlp.up_proj.weight"],
           "model.norm.weight": torch.zeros(3)}
    with pytest.raises(UserError, match="model.norm.weight"):
        eng.load_tensors(bad, weight_version="x")
    assert torch.equal(eng.model.full_logits(PROMPTS[1]), before) and eng.weight_version == "0"
    from safetensors.torch import load_file

    target = load_file(str(dirs[1] / "model.safetensors"))
    names = sorted(target)
    eng.load_tensors({n: target[n] for n in names[:5]})  # two buckets, like a bucketed broadcast
    eng.load_tensors({n: target[n] for n in names[5:]},
                     weight_version="2")
    assert eng.weight_version == "2"
    assert torch.equal(eng.model.full_logits(PROMPTS[1]), ref.model.full_logits(PROMPTS[1]))


def test_routable_address_is_the_interface_that_reaches_the_server():
    from areal_cli.rollout.weight_sync import routable_address

    assert routable_address("http://127.0.0.1:30000") == "127.0.0.1"
    assert routable_address("localhost:30000") == "127.0.0.1"


@pytest.mark.multiproc
def test_distributed_updates_need_a_weight_update_session_like_sglang(server, http, dirs):
    """SGLang 0.5.23 refuses /update_weights_from_distributed outside /begin_weight_update ... /end_weight_update
    (checked against a real server, tests/real_sglang); the embedded server answers the same, and the sender opens
    and closes a session around every update, ending one that a dead sender left open."""
    from areal_cli.rollout.protocol import NO_SESSION, NO_SESSION_TO_END, SESSION_OPEN

    new = _perturbed(dirs[0], seed=5)
    r = http.post("/update_weights_from_distributed",
                  json=build_update_weights_from_distributed_payload(param_specs(list(new.items())[:1]), "x"))
    assert r.status_code == 400 and r.json() == {"success": False,
                                                 "message": NO_SESSION.format(op="update_weights_from_distributed")}
    r = http.post("/end_weight_update", json={})
    assert r.status_code == 400 and r.json()["message"] == NO_SESSION_TO_END
    assert http.post("/begin_weight_update", json={}).json() == {"success": True, "message": "Success"}
    r = http.post("/begin_weight_update", json={"selector": "all"})
    assert r.status_code == 400 and r.json()["message"] == SESSION_OPEN
    assert http.post("/begin_weight_update", json={"selector": "nope"}).status_code == 400
    # the session is still open (a sender died in it): the next update ends it and begins its own
    with WeightSender([server.url], backend="gloo", group_name="wsync-session", timeout_s=20) as sender:
        sender.send(list(new.items()), version=21, chunk_mb=0.25)
    assert http.get("/model_info").json()["weight_version"] == "21"
    assert http.post("/end_weight_update", json={}).status_code == 400  # the sender closed its session

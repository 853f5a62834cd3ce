"""Claims about areal_cli.rollout.engine: our Qwen3 forward equals Hugging Face's, generation logprobs equal
an HF recompute, continuous batching and the KV memory cap do not change results, aborts/retractions keep
partial output, and weights can be swapped."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from areal_cli.foundations.errors import UserError
from areal_cli.rollout.engine import EngineError, InferenceEngine
from areal_cli.rollout.protocol import SamplingParams
from helpers.hf_reference import hf_logits, hf_logprobs

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def hf(dirs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(dirs[0]), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_new(dirs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(dirs[1]), dtype=torch.float32).eval()


PROMPTS = [[5, 17, 33], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [7, 8, 9, 10, 11, 12], [3],
           [60 + i for i in range(17)]]
BUDGETS = [5, 40, 12, 25, 8]
GREEDY = SamplingParams(max_new_tokens=1, temperature=0.0)


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, **kw)


def _alone(model_dir, prompts=PROMPTS, budgets=BUDGETS, **kw):
    eng = InferenceEngine(model_dir, max_total_tokens=1024, **kw)
    return [eng.generate([p], greedy(m))[0] for p, m in zip(prompts, budgets)]


def test_engine_logits_match_hf_float32(dirs, hf):
    eng = InferenceEngine(dirs[0], max_total_tokens=256)
    m, s = eng.model, eng.spec
    seq = [int(x) for x in torch.randint(0, s.vocab_size, (24,), generator=torch.Generator().manual_seed(3))]
    ref = hf_logits(hf, seq)
    assert (m.full_logits(seq) - ref).abs().max().item() <= 1e-5
    # KV-cache path: prefill 10 tokens, then feed the rest one at a time through the pool.
    kp = torch.zeros(s.num_layers, 64, s.num_kv_heads, s.head_dim)
    vp = torch.zeros_like(kp)
    slots = torch.arange(1, len(seq) + 1)
    ids = torch.tensor([seq])
    got = [m.logits(m.forward(ids[:, :10], torch.arange(10)[None], kp, vp, slots[None, :10],
                              slots[None, :10])[0])]
    for t in range(10, len(seq)):
        h = m.forward(ids[:, t:t + 1], torch.tensor([[t]]), kp, vp, slots[None, t:t + 1], slots[None, :t + 1])
        got.append(m.logits(h[0]))
    assert (torch.cat(got) - ref).abs().max().item() <= 1e-5
    # Right-padded batch of different lengths: every sequence gets positions 0..L-1.
    a, b = seq[:7], seq[3:20]
    kp.zero_(), vp.zero_()
    ids2 = torch.zeros(2, 17, dtype=torch.long)
    ids2[0, :7], ids2[1] = torch.tensor(a), torch.tensor(b)
    w = torch.zeros(2, 17, dtype=torch.long)
    w[0, :7], w[1] = torch.arange(1, 8), torch.arange(20, 37)
    h = m.forward(ids2, torch.arange(17).expand(2, 17), kp, vp, w, w)
    assert (m.logits(h[0, :7]) - hf_logits(hf, a)).abs().max().item() <= 1e-5
    assert (m.logits(h[1]) - hf_logits(hf, b)).abs().max().item() <= 1e-5


def test_greedy_tokens_equal_hf_generate_and_logprobs_match_recompute(dirs, hf):
    eng = InferenceEngine(dirs[0], max_total_tokens=1024)
    res = eng.generate(PROMPTS[:3], [greedy(m) for m in BUDGETS[:3]])
    for r, m in zip(res, BUDGETS):
        with torch.no_grad():
            g = hf.generate(torch.tensor([r.prompt_ids]), max_new_tokens=m, do_sample=False)
        assert r.output_ids == g[0, len(r.prompt_ids):].tolist()
        ref = hf_logprobs(hf, r.prompt_ids, r.output_ids, 0.0)
        assert max(abs(a - b) for a, b in zip(ref, r.output_logprobs)) <= 1e-4
        assert r.output_versions == ["0"] * len(r.output_ids)


def test_sampled_logprobs_match_hf_recompute_and_respect_top_k_top_p(dirs, hf):
    eng = InferenceEngine(dirs[0], max_total_tokens=2048, seed=5)
    sp = SamplingParams(max_new_tokens=30, temperature=0.7, top_p=0.9, top_k=20)
    res = eng.generate(PROMPTS, sp)
    for r in res:
        ref = hf_logprobs(hf, r.prompt_ids, r.output_ids, 0.7)
        assert max(abs(a - b) for a, b in zip(ref, r.output_logprobs)) <= 1e-4
        logits = hf_logits(hf, r.prompt_ids + r.output_ids)
        P = len(r.prompt_ids)
        for i, t in enumerate(r.output_ids):
            probs = torch.softmax(logits[P - 1 + i] / 0.7, -1)
            order = probs.argsort(descending=True).tolist()
            rank = order.index(t)
            assert rank < 20
            assert float(probs[order[:rank]].sum()) <= 0.9 + 1e-6  # inside the nucleus


def test_continuous_batching_gives_the_same_greedy_tokens_as_each_request_alone(dirs):
    alone = _alone(dirs[0])
    eng = InferenceEngine(dirs[0], max_total_tokens=1024)
    sizes, results = [], []
    eng.add_request("r0", PROMPTS[0], greedy(BUDGETS[0]))
    eng.add_request("r1", PROMPTS[1], greedy(BUDGETS[1]))
    for _ in range(3):
        results += eng.step()
        sizes.append(len(eng.running))
    eng.add_request("r2", PROMPTS[2], greedy(BUDGETS[2]))  # joins while r0/r1 are mid-decode
    for _ in range(4):
        results += eng.step()
        sizes.append(len(eng.running))
    eng.add_request("r3", PROMPTS[3], greedy(BUDGETS[3]))
    eng.add_request("r4", PROMPTS[4], greedy(BUDGETS[4]))
    while eng.has_work():
        results += eng.step()
        sizes.append(len(eng.running))
    by = {r.rid: r for r in results}
    assert sizes[2] == 2 and 3 in sizes  # requests joined a running batch ...
    assert sizes.index(3) > 0 and any(a > b > 0 for a, b in zip(sizes, sizes[1:]))  # ... and left it
    for i, ref in enumerate(alone):
        got = by[f"r{i}"]
        assert got.output_ids == ref.output_ids, i
        assert max(abs(a - b) for a, b in zip(got.output_logprobs, ref.output_logprobs)) <= 1e-5
        assert got.finish_reason == ref.finish_reason == "length"
    assert eng.free_tokens == eng.max_total_tokens  # every KV slot was returned


def test_decode_groups_split_where_the_most_padding_goes_by_hand():
    from areal_cli.rollout.decode_groups import decode_groups, padded_slots

    lens = [5, 5, 5, 100, 100]  # one block reads 5 x 100 = 500 slots; split after the third: 3 x 5 + 2 x 100
    assert decode_groups(lens, min_saving=0) == [(0, 3), (3, 5)]
    assert padded_slots(lens, [(0, 3), (3, 5)]) == 215 and padded_slots(lens, [(0, 5)]) == 500
    assert decode_groups(lens, min_saving=285) == [(0, 5)]  # the split saves exactly 285: not more
    assert decode_groups(lens, min_saving=0, max_groups=1) == [(0, 5)]
    # the greedy order: the largest saving first (after 2: 2 x 98 = 196 vs after 4: 4 x 70 = 280 -> 4 first)
    assert decode_groups([2, 2, 30, 30, 100], min_saving=0, max_groups=2) == [(0, 4), (4, 5)]
    assert decode_groups([2, 2, 30, 30, 100], min_saving=0) == [(0, 2), (2, 4), (4, 5)]
    assert decode_groups([], min_saving=0) == [] and decode_groups([7], min_saving=0) == [(0, 1)]
    with pytest.raises(ValueError, match="ascending"):
        decode_groups([3, 2])
    with pytest.raises(ValueError, match="max_groups"):
        decode_groups([1], max_groups=0)


def test_decode_split_into_length_groups_gives_the_tokens_and_logprobs_of_one_padded_call(dirs):
    # a long request decoding beside short ones that join later: the batch mixes contexts of 4-60 tokens
    def run(**kw):
        eng = InferenceEngine(dirs[0], max_total_tokens=1024, **kw)
        eng.add_request("long", PROMPTS[4], greedy(45))
        for _ in range(20):
            eng.step()
        for i in range(4):
            eng.add_request(f"s{i}", PROMPTS[i], greedy(BUDGETS[i]))
        results = eng.run_until_done()
        return {r.rid: r for r in results}, eng.step_costs.to_dict()["xtx"][0][2]

    one, slots_one = run(decode_max_groups=1)
    split, slots_split = run(decode_max_groups=4, decode_group_min_saving=0)
    assert set(one) == set(split) == {"long", "s0", "s1", "s2", "s3"}
    for rid, ref in one.items():
        assert split[rid].output_ids == ref.output_ids, rid
        assert max(abs(a - b) for a, b in zip(split[rid].output_logprobs, ref.output_logprobs)) <= 1e-5, rid
    assert slots_split < 0.7 * slots_one  # the step costs count the key slots read, fewer when split


def _assert_each_as_if_alone(model_dir, prompts, params, by) -> None:
    """Each request ``r{i}`` of ``by`` (rid -> result) has the tokens of request i run alone, and its output logprobs
    and (where it asked for them) prompt logprobs within 1e-5."""
    alone = InferenceEngine(model_dir, max_total_tokens=1024)
    for i, (p, q) in enumerate(zip(prompts, params)):
        alone.add_request(f"a{i}", p, q, logprob_start_len=0)
        ref = alone.run_until_done()[0]
        got = by[f"r{i}"]
        assert got.output_ids == ref.output_ids, i
        assert max(abs(a - b) for a, b in zip(got.output_logprobs, ref.output_logprobs)) <= 1e-5, i
        if got.input_logprobs is not None:
            assert max(abs((a or 0.0) - (b or 0.0))
                       for (a, _), (b, _) in zip(got.input_logprobs, ref.input_logprobs)) <= 1e-5, i


def test_a_groups_samples_share_one_prefill_and_sample_as_if_alone(dirs, hf):
    """Requests with the same prompt admitted together (a GRPO group) run one prefill forward; the others get a copy of
    its K/V and logits: each sample's tokens, logprobs and prompt logprobs equal those of the request run alone."""
    sp = [SamplingParams(max_new_tokens=20, temperature=1.0, seed=s, ignore_eos=True) for s in (11, 12, 13, 14)]
    prompts = [PROMPTS[1]] * 4 + [PROMPTS[2]] * 2 + [PROMPTS[1][:-1]]  # two groups and a prefix of the first
    params = sp + [SamplingParams(max_new_tokens=20, temperature=1.0, seed=s, ignore_eos=True) for s in (21, 22, 23)]
    eng = InferenceEngine(dirs[0], max_total_tokens=1024)
    for i, (p, q) in enumerate(zip(prompts, params)):
        eng.add_request(f"r{i}", p, q, logprob_start_len=0)
    by = {r.rid: r for r in eng.run_until_done()}
    assert eng.stats["prefill_tokens"] == 11 + 6 + 10  # each distinct prompt once
    _assert_each_as_if_alone(dirs[0], prompts, params, by)
    for i, p in enumerate(prompts):
        assert [t for _, t in by[f"r{i}"].input_logprobs] == p  # every request asked for its prompt logprobs
    outs = {tuple(by[f"r{i}"].output_ids) for i in range(len(prompts))}
    assert len(outs) == len(prompts)  # the seeds drew different samples from the shared prefill
    ref = hf_logprobs(hf, prompts[3], by["r3"].output_ids, 1.0)  # a copied K/V decodes like the computed one
    assert max(abs(a - b) for a, b in zip(ref, by["r3"].output_logprobs)) <= 1e-4
    assert eng.free_tokens == eng.max_total_tokens


def test_a_groups_samples_do_not_split_a_prefill_forward(dirs):
    """The max_prefill_tokens budget counts each distinct sequence once: 6 samples of an 11-token prompt and 3 of a
    6-token prompt fit one forward of 2 x 11 padded tokens (<= 25), instead of three forwards that each recompute
    the 11-token prompt."""
    prompts = [PROMPTS[1]] * 6 + [PROMPTS[2]] * 3
    params = [SamplingParams(max_new_tokens=4, temperature=1.0, seed=s, ignore_eos=True) for s in range(9)]
    eng = InferenceEngine(dirs[0], max_total_tokens=1024, max_prefill_tokens=25)
    for i, (p, q) in enumerate(zip(prompts, params)):
        eng.add_request(f"r{i}", p, q)
    by = {r.rid: r for r in eng.run_until_done()}
    assert eng.stats["prefill_tokens"] == 11 + 6
    alone = InferenceEngine(dirs[0], max_total_tokens=1024)
    for i, (p, q) in enumerate(zip(prompts, params)):
        assert by[f"r{i}"].output_ids == alone.generate([p], q)[0].output_ids, i


def test_a_step_prefills_new_requests_and_decodes_the_running_ones_in_one_forward(dirs, hf):
    """Requests admitted while others decode (an asynchronous rollout's steady state) share the step's forward: one
    forward per step, with a prefill split by max_prefill_tokens the decode rides in the last one; every request's
    tokens, logprobs and prompt logprobs equal those of the request run alone, and HF's."""
    params = [SamplingParams(max_new_tokens=12, temperature=1.0, seed=30 + i, ignore_eos=True) for i in range(6)]
    eng = InferenceEngine(dirs[0], max_total_tokens=1024, max_prefill_tokens=12)
    calls = []
    forward = eng.model.forward_packed
    eng.model.forward_packed = lambda *a, **k: calls.append(a[3]) or forward(*a, **k)
    eng.add_request("r0", PROMPTS[1], params[0], logprob_start_len=0)
    eng.add_request("r1", PROMPTS[2], params[1])
    eng.step()  # budget 12: r0's 11 tokens, then r1's 6 in a second forward
    eng.step()  # r0 and r1 decode alone
    assert len(calls) == 3
    for i, p in ((2, PROMPTS[0]), (3, PROMPTS[0]), (4, PROMPTS[2][:-1]), (5, PROMPTS[1])):
        eng.add_request(f"r{i}", p, params[i], logprob_start_len=0)
    n_steps = eng.stats["steps"]
    eng.step()  # prefill budget 12: [PROMPTS[0] (shared by r2, r3), r4's prompt] in one forward, r5's in a second,
    # which also carries the decode of r0 and r1
    assert len(calls) == 5 and eng.stats["steps"] == n_steps + 1
    first = calls[-1][0]  # the second prefill forward ...
    assert (first.read_idx.shape[0], first.q_len) == (1, len(PROMPTS[1]))
    assert [p.q_len for p in calls[-1][1:]] == [1] * (len(calls[-1]) - 1)  # ... with the two decoding rows after it
    assert sum(p.read_idx.shape[0] for p in calls[-1][1:]) == 2
    by = {r.rid: r for r in eng.run_until_done()}
    prompts = [PROMPTS[1], PROMPTS[2], PROMPTS[0], PROMPTS[0], PROMPTS[2][:-1], PROMPTS[1]]
    _assert_each_as_if_alone(dirs[0], prompts, params, by)
    ref = hf_logprobs(hf, prompts[5], by["r5"].output_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(ref, by["r5"].output_logprobs)) <= 1e-4
    assert eng.free_tokens == eng.max_total_tokens


def test_engine_sizes_are_checked(dirs):
    with pytest.raises(ValueError, match="context_length must be >= 1"):
        InferenceEngine(dirs[0], context_length=0)
    with pytest.raises(ValueError, match="more than this machine's"):
        InferenceEngine(dirs[0], max_total_tokens=10**12)
    assert InferenceEngine(dirs[0], max_total_tokens=64, max_running_requests=10**9).max_running_requests == 64


def test_memory_cap_queues_requests_and_all_complete(dirs):
    alone = _alone(dirs[0])
    cap = 64  # the largest request needs 45 tokens: at most one or two fit at a time
    eng = InferenceEngine(dirs[0], max_total_tokens=cap)
    for i, (p, m) in enumerate(zip(PROMPTS, BUDGETS)):
        eng.add_request(f"r{i}", p, greedy(m))
    results, queued_while_running, max_reserved = [], False, 0
    while eng.has_work():
        results += eng.step()
        queued_while_running |= bool(eng.running and eng.waiting)
        max_reserved = max(max_reserved, cap - eng.free_tokens)
        assert sum(len(r.prompt) + r.params.max_new_tokens for r in eng.running) <= cap
    assert queued_while_running and max_reserved <= cap
    by = {r.rid: r for r in results}
    assert len(by) == len(PROMPTS)
    for i, ref in enumerate(alone):
        assert by[f"r{i}"].output_ids == ref.output_ids
    assert eng.k_pool.shape[1] == cap + 1  # the pool itself is capped (one scratch slot)
    # the decode step's slot table holds what requests reserved (<= 2x the largest), not rows x context length
    largest = max(len(p) + m for p, m in zip(PROMPTS, BUDGETS))
    assert largest <= eng._table.shape[1] <= 2 * largest and not eng._table.any()  # every row cleared at release


def test_requests_that_can_never_fit_or_bad_ids_are_rejected(dirs):
    eng = InferenceEngine(dirs[0], max_total_tokens=32, context_length=64)
    with pytest.raises(EngineError, match="max_total_tokens is 32"):
        eng.add_request("big", [1] * 20, greedy(13))
    with pytest.raises(EngineError, match="context length of 64"):
        eng.add_request("long", [1] * 60, greedy(10))
    with pytest.raises(EngineError, match="out of the vocabulary"):
        eng.add_request("oov", [1, eng.vocab_size], greedy(2))
    with pytest.raises(EngineError, match="out of the vocabulary"):
        eng.add_request("neg", [-5, 1], greedy(2))
    with pytest.raises(EngineError, match="empty"):
        eng.add_request("empty", [], greedy(2))
    eng.add_request("dup", [1, 2], greedy(2))
    with pytest.raises(EngineError, match="Duplicate"):
        eng.add_request("dup", [1, 2], greedy(2))
    assert [r.rid for r in eng.run_until_done()] == ["dup"]
    assert not eng.has_work()


def test_abort_returns_partial_tokens_and_logprobs_and_frees_kv(dirs):
    eng = InferenceEngine(dirs[0], max_total_tokens=256)
    eng.add_request("a", PROMPTS[1], greedy(100))
    eng.add_request("b", PROMPTS[0], greedy(100))
    for _ in range(6):
        eng.step()
    eng.add_request("c", PROMPTS[2], greedy(10))  # still waiting: aborted with no tokens
    res = {r.rid: r for r in eng.abort_all()}
    assert res["a"].finish_reason == "abort" and res["a"].abort_message == "Aborted"
    assert len(res["a"].output_ids) == len(res["a"].output_logprobs) == 6
    assert res["c"].output_ids == []
    assert eng.free_tokens == 256 and not eng.has_work()
    full = _alone(dirs[0], [PROMPTS[1]], [100])[0]
    assert res["a"].output_ids == full.output_ids[:6]


def test_retracted_request_resumes_with_identical_greedy_tokens(dirs):
    full = _alone(dirs[0], [PROMPTS[4]], [30])[0]
    eng = InferenceEngine(dirs[0], max_total_tokens=256)
    eng.add_request("x", PROMPTS[4], greedy(30))
    for _ in range(9):
        eng.step()
    assert eng.retract_all() == 1 and eng.free_tokens == 256
    (r,) = eng.run_until_done()
    assert r.output_ids == full.output_ids and r.num_retractions == 1
    assert max(abs(a - b) for a, b in zip(r.output_logprobs, full.output_logprobs)) <= 1e-5


def _first_new_token(ids: list[int]) -> tuple[int, int]:
    for k in range(1, len(ids)):
        if ids[k] not in ids[:k]:
            return k, ids[k]
    return 0, ids[0]


def test_stop_token_and_eos_end_generation_with_the_matched_token_last(dirs, tmp_path):
    full = _alone(dirs[0], [PROMPTS[1]], [40])[0].output_ids
    k, stop = _first_new_token(full)
    eng = InferenceEngine(dirs[0], max_total_tokens=256)
    (r,) = eng.generate([PROMPTS[1]], greedy(40, stop_token_ids=[stop]))
    assert (r.finish_reason, r.matched_stop, r.output_ids) == ("stop", stop, full[:k + 1])
    # the same token as the model's EOS: stops, unless ignore_eos
    eos_dir = tmp_path / "eos"
    shutil.copytree(dirs[0], eos_dir)
    for name in ("config.json", "generation_config.json"):
        cfg = json.loads((eos_dir / name).read_text())
        cfg["eos_token_id"] = stop
        (eos_dir / name).write_text(json.dumps(cfg))
    eng2 = InferenceEngine(eos_dir, max_total_tokens=256)
    (e,) = eng2.generate([PROMPTS[1]], greedy(40))
    assert (e.finish_reason, e.matched_stop, e.output_ids) == ("stop", stop, full[:k + 1])
    (f,) = eng2.generate([PROMPTS[1]], greedy(40, ignore_eos=True))
    assert (f.finish_reason, f.output_ids) == ("length", full)
    # min_new_tokens masks the stop token for the first tokens
    (g,) = eng.generate([PROMPTS[1]], greedy(40, stop_token_ids=[full[0]], min_new_tokens=3))
    assert full[0] not in g.output_ids[:3] and len(g.output_ids) >= 3
    # max_new_tokens = 0: an immediate empty "length" result
    (z,) = eng.generate([PROMPTS[0]], greedy(0))
    assert (z.finish_reason, z.output_ids) == ("length", [])


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(dirs):
    sp = SamplingParams(max_new_tokens=20, temperature=1.0, seed=123)
    a = InferenceEngine(dirs[0], max_total_tokens=1024).generate([PROMPTS[2]], sp)[0]
    other = SamplingParams(max_new_tokens=15, temperature=1.0)
    b = InferenceEngine(dirs[0], max_total_tokens=1024).generate(
        [PROMPTS[0], PROMPTS[2], PROMPTS[4]], [other, sp, other])[1]
    assert a.output_ids == b.output_ids
    unseeded = SamplingParams(max_new_tokens=20, temperature=1.0)
    c1 = InferenceEngine(dirs[0], max_total_tokens=1024, seed=7).generate(PROMPTS, unseeded)
    c2 = InferenceEngine(dirs[0], max_total_tokens=1024, seed=7).generate(PROMPTS, unseeded)
    assert [r.output_ids for r in c1] == [r.output_ids for r in c2]
    top1 = InferenceEngine(dirs[0], max_total_tokens=1024).generate(
        PROMPTS, SamplingParams(max_new_tokens=10, temperature=1.0, top_k=1))
    ref = _alone(dirs[0], PROMPTS, [10] * len(PROMPTS))
    assert [r.output_ids for r in top1] == [r.output_ids for r in ref]


def test_load_weights_swaps_weights_and_versions_and_rejects_other_architectures(dirs, hf_new, tmp_path):
    eng = InferenceEngine(dirs[0], max_total_tokens=256)
    eng.add_request("x", PROMPTS[1], greedy(12))
    for _ in range(4):
        eng.step()
    eng.load_weights(dirs[1], weight_version="1")  # the in-flight request continues with new weights
    (r,) = eng.run_until_done()
    assert r.output_versions == ["0"] * 4 + ["1"] * 8 and r.weight_version == "1"
    seq = PROMPTS[2] + [9, 9, 1]
    assert (eng.model.full_logits(seq) - hf_logits(hf_new, seq)).abs().max().item() <= 1e-5
    bad = tmp_path / "bad"
    shutil.copytree(dirs[0], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] += 8
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="intermediate_size"):
        eng.load_weights(bad)
    with pytest.raises(UserError, match="config.json"):
        eng.load_weights(tmp_path / "missing")
    assert eng.model_path == str(dirs[1])  # the failed loads changed nothing
    assert (eng.model.full_logits(seq) - hf_logits(hf_new, seq)).abs().max().item() <= 1e-5


def test_prompt_logprobs_have_a_leading_none_and_match_hf(dirs, hf):
    eng = InferenceEngine(dirs[0], max_total_tokens=256)
    eng.add_request("p", PROMPTS[1], greedy(3), logprob_start_len=0)
    (r,) = eng.run_until_done()
    assert r.input_logprobs[0] == (None, PROMPTS[1][0])
    lp = torch.log_softmax(hf_logits(hf, PROMPTS[1]), -1)
    for t in range(1, len(PROMPTS[1])):
        assert abs(r.input_logprobs[t][0] - float(lp[t - 1, PROMPTS[1][t]])) <= 1e-5


def test_every_step_records_its_shape_and_seconds_for_the_cost_fit(dirs):
    """The engine's step-cost sums (rollout.engine.step_costs) count each step with work once, with the decode
    batch, decode batch x longest context and padded prefill tokens of that step."""
    eng = InferenceEngine(dirs[0], max_total_tokens=1024)
    prompts, budgets = PROMPTS[:3], BUDGETS[:3]  # prompt lengths 3, 11, 6; budgets 5, 40, 12
    for i, (p, m) in enumerate(zip(prompts, budgets)):
        eng.add_request(f"r{i}", p, SamplingParams(max_new_tokens=m, temperature=0.0, ignore_eos=True))
    eng.run_until_done()
    d = eng.step_costs.to_dict()
    assert d["features"] == ["step", "decode_seqs", "decode_ctx_tokens", "prefill_tokens"]
    steps = max(budgets)  # step 1 prefills all three (and samples their first token), then one token per step
    assert d["n"] == steps == eng.stats["steps"]
    xtx = d["xtx"]
    assert xtx[0][0] == steps
    assert xtx[0][1] == eng.stats["decode_tokens"] == sum(budgets) - len(budgets)
    # padded prefill: the three prompts in one forward, padded to the longest (11)
    assert xtx[0][3] == 3 * 11 and eng.stats["prefill_tokens"] == 3 + 11 + 6
    # decode contexts: the batch is padded to its longest KV (+1 for the new token); the contexts differ by less
    # than decode_groups' MIN_SAVING slots, so it is not split into length groups
    exp_ctx = 0
    for k in range(1, steps):  # decode step k: requests with more than k tokens still to generate
        live = [(len(p), m) for p, m in zip(prompts, budgets) if m > k]
        exp_ctx += len(live) * (max(pl + k - 1 for pl, _ in live) + 1)
    assert xtx[0][2] == exp_ctx
    assert d["xty"][0] > 0 and d["yy"] > 0
    assert xtx[1][1] == sum(len([m for m in budgets if m > k]) ** 2 for k in range(1, steps))


def test_the_decode_groups_benchmark_runs_and_writes_its_figures(tmp_path, monkeypatch):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "decode_groups.py"
    spec = importlib.util.spec_from_file_location("decode_groups_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "MIXES", [[(3, 5), (1, 40)]])
    assert bench.main(["--repeats", "1", "--steps", "2", "--out", str(tmp_path / "r.json")]) == 0
    res = json.loads((tmp_path / "r.json").read_text())
    row = res["rows"][0]
    assert set(row["ms_per_step"]) == {"groups1_min0", "groups4_min256", "groups4_min1024", "groups4_min4096"}
    assert all(v > 0 for v in row["ms_per_step"].values()) and row["one_call_over_grouped_1024"] > 0


def test_the_engine_churn_benchmark_runs_and_writes_its_figures(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "engine_decode_churn.py"
    spec = importlib.util.spec_from_file_location("engine_decode_churn", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "r.json"
    assert bench.main(["--running", "4", "--warm-steps", "2", "--steps", "3", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["running"] == 4 and res["decoded_tokens"] > 0 and res["us_per_decoded_token"] > 0

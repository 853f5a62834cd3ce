"""The SFT stage (areal_cli.sft.stage): AReaL's first-fit-decreasing micro-batches, packing without attention across
sequences, loss on response tokens only, its own recipe keys (boba-sft-32b and the tiny warm start)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from areal_cli.foundations.errors import UserError
from areal_cli.sft.stage import (
    SftConfig,
    SftStage,
    ffd_allocate,
    load_prompt_answer_jsonl,
    lr_at,
    pack_sequences,
    packed_logprobs,
    padded_tokens,
    response_nll_sum,
)
from areal_cli.trainer.batch import build_train_batch

CORPUS = ["12+34=46", "the answer is 7", "reverse the digits 1234", "hello world"] * 4


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from areal_cli.models.tiny import build_tiny_model
    from areal_cli.trainer.megatron_engine import MegatronEngine

    d = build_tiny_model(tmp_path_factory.mktemp("sft_model"), seed=3, corpus=CORPUS, hidden_size=64,
                         intermediate_size=128)
    return MegatronEngine(d, lr=1e-2, seed=3)


def _examples(vocab: int, shapes, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for p_len, a_len in shapes:
        ids = torch.randint(3, vocab, (p_len + a_len,), generator=g).tolist()
        out.append((ids[:p_len], ids[p_len:]))
    return out


def _cfg(**kw) -> SftConfig:
    base = dict(lr=1e-2, batch_size=4, max_tokens_per_mb=64, max_steps=10)
    return SftConfig(**{**base, **kw})


# ----------------------------------------------------------------------------- micro-batches and packing


def test_ffd_allocate_follows_arealss_rule_fewest_items_among_groups_with_room():
    # sorted: 5, 4, 3, 3, 2 (capacity 8). 5 opens g0; 4 does not fit g0 -> g1; the first 3 fits both
    # (one item each) -> the smaller sum, g1 (4+3); the second 3 fits only g0 (5+3); 2 fits none -> g2.
    assert ffd_allocate([5, 4, 3, 3, 2], 8) == [[0, 3], [1, 2], [4]]
    # min_groups: the first items open groups, then the group with the fewest items takes the next one
    assert ffd_allocate([1, 1, 1, 1], 10, min_groups=2) == [[0, 2], [1, 3]]
    with pytest.raises(ValueError, match="capacity"):
        ffd_allocate([3, 9], 8)


def test_packing_lays_sequences_end_to_end_with_loss_on_answer_tokens_only():
    a, b, c = ([1, 2, 3], [4, 5, 6]), ([7], [8, 9]), ([10, 11], [12])
    pb = pack_sequences([a, b, c], row_tokens=0, pad_id=0)  # rows as wide as the longest sequence (6)
    assert pb.input_ids.tolist() == [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]
    assert pb.example_index == [[0], [1, 2]]
    # position t predicts t+1: row 1 predicts 8, 9 (answer of b), then 10 (next sequence: never a target),
    # 11 (prompt of c), 12 (answer of c)
    assert pb.loss_mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 0, 0, 1]]
    assert pb.position_ids.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 1, 2]]
    assert pb.segment_ids.tolist() == [[0] * 6, [0, 0, 0, 1, 1, 1]]
    assert [cu.tolist() for cu in pb.cu_seqlens] == [[0, 6], [0, 3, 6]]
    assert pb.n_pad == 0 and padded_tokens([a, b, c]) == 6
    mask = pb.attention_mask()  # True = masked (megatron)
    assert mask.shape == (2, 1, 6, 6)
    assert not mask[1, 0, 4, 3] and mask[1, 0, 4, 2] and mask[1, 0, 3, 4]  # own sequence, causal only


def test_packed_logprobs_equal_those_of_right_padded_rows(engine):
    exs = _examples(engine.vocab_size, [(5, 9), (3, 2), (2, 4), (7, 3), (1, 5), (4, 1)])
    pb = pack_sequences(exs, row_tokens=0)
    padded = build_train_batch([(p, a, [0.0] * len(a), [0] * len(a)) for p, a in exs])
    with torch.no_grad():
        lp_packed = packed_logprobs(engine, pb)
    lp_padded = engine.logprobs(padded)
    for row, members in enumerate(pb.example_index):
        for k, j in enumerate(members):
            start, end = (int(x) for x in pb.cu_seqlens[row][k: k + 2])
            n = end - start
            torch.testing.assert_close(lp_packed[row, start: end - 1], lp_padded[j, : n - 1], atol=2e-5, rtol=0)
    assert pb.n_pad < padded_tokens(exs)


def test_stage_loss_equals_a_hand_computed_response_nll_and_packing_changes_nothing(engine):
    exs = _examples(engine.vocab_size, [(4, 6), (2, 2), (3, 3), (6, 1)], seed=1)
    # by hand: every sequence alone, log-softmax of the logits, answer tokens only, mean over answer tokens
    total, n = 0.0, 0
    with torch.no_grad():
        for p, a in exs:
            ids = torch.tensor([p + a])
            logp = torch.log_softmax(engine.forward_logits(ids)[0].float(), dim=-1)
            for t in range(len(p), len(p) + len(a)):
                total -= float(logp[t - 1, ids[0, t]])
                n += 1
    hand = total / n
    packed = SftStage(engine, exs, _cfg(pack_row_tokens=16)).loss(range(4))
    one_per_row = SftStage(engine, exs, _cfg(max_tokens_per_mb=10)).loss(range(4))  # 4 micro-batches
    assert packed == pytest.approx(hand, rel=1e-5)
    assert one_per_row == pytest.approx(hand, rel=1e-5)
    pb = pack_sequences(exs, row_tokens=16)
    assert pb.n_pad < padded_tokens(exs)


def test_prompt_token_targets_get_no_gradient_and_do_not_change_the_loss(engine):
    exs = _examples(engine.vocab_size, [(5, 3), (2, 4)], seed=2)
    pb = pack_sequences(exs, row_tokens=0)
    lp = packed_logprobs(engine, pb)
    lp.retain_grad()
    loss = response_nll_sum(lp, pb.loss_mask) / pb.n_loss_tokens
    loss.backward()
    engine.optimizer.zero_grad(set_to_none=True)
    prompt_or_pad = pb.loss_mask == 0
    assert bool((lp.grad[prompt_or_pad] == 0).all())
    assert torch.allclose(lp.grad[~prompt_or_pad], torch.full_like(lp.grad[~prompt_or_pad], -1 / pb.n_loss_tokens))
    shifted = lp.detach() + 5.0 * prompt_or_pad  # any change of the prompt-target logprobs
    assert float(response_nll_sum(shifted, pb.loss_mask)) == float(response_nll_sum(lp.detach(), pb.loss_mask))


def test_stage_steps_lower_the_loss_and_its_data_position_restores_the_same_batches(engine):
    exs = _examples(engine.vocab_size, [(3, 3), (2, 4), (4, 2), (3, 1), (2, 2), (5, 3), (1, 4), (3, 3), (2, 5)])
    state0 = {k: v.clone() for k, v in engine.model.state_dict().items() if "_extra_state" not in k}
    stage = SftStage(engine, exs, _cfg(batch_size=4, lr=3e-3, max_steps=8))
    assert stage.steps_per_epoch == 2  # 9 examples, batches of 4: the tail of an epoch is skipped
    before = stage.loss(range(len(exs)))
    stats = [stage.step() for _ in range(8)]
    assert stage.loss(range(len(exs))) < 0.9 * before
    assert all(s["n_pad"] < s["n_tokens"] and s["skipped"] == 0.0 for s in stats)
    # the data position: a stage restored from state_dict() issues the same next batches
    saved = stage.state_dict()
    nxt = [stage.next_batch() for _ in range(3)]
    other = SftStage(engine, exs, _cfg(batch_size=4, max_steps=8))
    other.load_state_dict(saved)
    assert [other.next_batch() for _ in range(3)] == nxt
    assert saved == {"step": 8, "epoch": 3, "cursor": 2}
    engine.model.load_state_dict(state0, strict=False)
    engine.optimizer.state.clear()


# ----------------------------------------------------------------------------- recipe keys


def test_boba_sft_recipe_keys_become_the_stage_settings():
    from areal_cli.recipes import load_recipe

    cfg = SftConfig.from_spec(load_recipe("boba-sft-32b").file.sft)
    assert (cfg.lr, cfg.batch_size, cfg.max_tokens_per_mb, cfg.pack_row_tokens) == (1e-5, 64, 32768, 32768)
    assert (cfg.weight_decay, cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps) == (0.1, 0.9, 0.95, 1e-5)
    assert (cfg.epochs, cfg.max_seqlen, cfg.lr_scheduler, cfg.warmup_proportion) == (200, 32768, "constant", 0.03)
    assert cfg.engine_kwargs()["betas"] == (0.9, 0.95)
    total = cfg.total_steps(200)  # 200 epochs x (200 examples // 64) steps
    assert total == 600
    warm = math.ceil(0.03 * 600)  # 18 warmup steps, then constant
    assert lr_at(0, total, cfg) == pytest.approx(1e-5 / warm)
    assert lr_at(warm - 1, total, cfg) == pytest.approx(1e-5) and lr_at(599, total, cfg) == pytest.approx(1e-5)


def test_lr_schedules_decay_from_the_peak_to_zero():
    lin = _cfg(lr=1.0, lr_scheduler="linear", warmup_proportion=0.1)
    cos = _cfg(lr=1.0, lr_scheduler="cosine", warmup_proportion=0.0)
    # one warmup step (ceil(0.1 * 10)), then linear decay over the 9 others
    assert lr_at(0, 10, lin) == 1.0 and lr_at(1, 10, lin) == 1.0
    assert lr_at(2, 10, lin) == pytest.approx(1 - 1 / 9) and lr_at(10, 10, lin) == 0.0
    assert lr_at(5, 10, cos) == pytest.approx(0.5) and lr_at(10, 10, cos) == pytest.approx(0.0)


def test_the_tiny_warm_start_is_an_instance_of_the_stage_with_its_sft_keys():
    from areal_cli.config import apply_overrides
    from areal_cli.recipes import load_train_config

    tc, _ = load_train_config("tiny-arith")
    cfg = SftConfig.from_train_config(tc)
    assert (cfg.lr, cfg.batch_size, cfg.max_steps) == (tc.sft.lr, tc.sft.batch_size, tc.sft.max_steps)
    assert (cfg.max_tokens_per_mb, cfg.pack_row_tokens) == (tc.sft.max_tokens_per_mb, tc.sft.pack_row_tokens)
    with pytest.raises(UserError, match="field 'sft.pack_row_tokens'"):
        apply_overrides(tc, ["sft.pack_row_tokens=100", "sft.max_tokens_per_mb=50"])
    with pytest.raises(UserError, match="field 'sft.max_tokens_per_mb'"):
        apply_overrides(tc, ["sft.max_tokens_per_mb=0"])


def test_prompt_answer_jsonl_is_read_with_eos_and_bad_lines_are_named(tmp_path):
    from areal_cli.models.tiny import build_tiny_model, load_tokenizer

    tok = load_tokenizer(build_tiny_model(tmp_path / "m", corpus=CORPUS, hidden_size=32, intermediate_size=64,
                                          head_dim=8))
    good = tmp_path / "sft.jsonl"
    good.write_text(json.dumps({"prompt": "12+34=", "answer": "46"}) + "\n\n" +
                    json.dumps({"prompt": "hello", "answer": " world"}) + "\n")
    pairs = load_prompt_answer_jsonl(good, tok, eos_token="<|im_end|>")
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert len(pairs) == 2 and all(a[-1] == eos for _, a in pairs)
    assert tok.decode(pairs[0][0]) == "12+34=" and tok.decode(pairs[0][1][:-1]) == "46"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "a", "answer": "b"}) + "\n" + json.dumps({"prompt": "a"}) + "\n")
    with pytest.raises(UserError, match=rf"^{bad}:2: field 'answer'"):
        load_prompt_answer_jsonl(bad, tok)
    with pytest.raises(UserError, match="invalid JSON"):
        (tmp_path / "x.jsonl").write_text("{\n")
        load_prompt_answer_jsonl(tmp_path / "x.jsonl", tok)


def test_stage_refuses_examples_longer_than_a_micro_batch(engine):
    exs = _examples(engine.vocab_size, [(30, 40)] * 4)
    with pytest.raises(ValueError, match="max_tokens_per_mb"):
        SftStage(engine, exs, _cfg(max_tokens_per_mb=64))
    assert len(SftStage(engine, exs, _cfg(max_tokens_per_mb=64, max_seqlen=60)).examples[0][1]) == 30


def test_boba_sft_settings_run_as_a_whole_stage_on_the_tiny_model(tmp_path):
    """The boba-sft-32b stage, shrunk to the tiny model (lr, batch and sizes scaled; optimiser, schedule and
    warmup as locked), trains on a prompt/answer JSONL and writes its per-step metrics and final weights."""
    import dataclasses

    from areal_cli.models.tiny import build_tiny_model, load_tokenizer
    from areal_cli.recipes import load_recipe
    from areal_cli.sft.stage import run_sft

    model = build_tiny_model(tmp_path / "m", seed=5, corpus=CORPUS, hidden_size=64, intermediate_size=128)
    tok = load_tokenizer(model)
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a, b in ((12, 34), (5, 7), (40, 2), (9, 9), (3, 30), (21, 21))))
    boba = SftConfig.from_spec(load_recipe("boba-sft-32b").file.sft)
    cfg = dataclasses.replace(boba, lr=3e-3, batch_size=3, epochs=None, max_steps=12, max_tokens_per_mb=64,
                              pack_row_tokens=32, max_seqlen=32)
    out = run_sft(cfg, model, load_prompt_answer_jsonl(data, tok, eos_token="<|im_end|>"), tmp_path / "out",
                  pad_id=tok.pad_token_id)
    rows = [json.loads(line) for line in (tmp_path / "out" / "sft_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 13)) and out["steps"] == 12
    assert rows[0]["lr"] == pytest.approx(3e-3 / 1) and rows[-1]["lr"] == pytest.approx(3e-3)  # 1 warmup step
    assert sum(r["loss"] for r in rows[-3:]) < 0.7 * sum(r["loss"] for r in rows[:3])
    assert (tmp_path / "out" / "weights" / "final" / "model.safetensors").is_file()

"""MegatronEngine (logprobs, training step, HF save/load) and TrainBatch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from areal_cli.trainer.batch import TrainBatch, build_train_batch
from areal_cli.trainer.hf_mcore import ConversionError
from areal_cli.trainer.megatron_engine import MegatronEngine
from helpers.perturbed_models import make_model_dir

@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("engine_model"))


def _batch(vocab: int, seed: int = 0) -> TrainBatch:
    """Four sequences of different prompt/response lengths (right padded)."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for p_len, r_len in ((3, 6), (5, 2), (2, 9), (7, 4)):
        ids = torch.randint(3, vocab, (p_len + r_len,), generator=g).tolist()
        samples.append((ids[:p_len], ids[p_len:], [-1.5] * r_len, [1] * r_len))
    return build_train_batch(samples, pad_id=0)


def sft_loss(n_tokens: int):
    def fn(lp: torch.Tensor, mb: TrainBatch) -> torch.Tensor:
        return -(lp * mb.loss_mask).sum() / n_tokens

    return fn


def _hf_logits(d: Path, b: TrainBatch) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(input_ids=b.input_ids, attention_mask=b.attention_mask.long()).logits


# ----------------------------------------------------------------------------- TrainBatch


def test_build_train_batch_right_pads_and_aligns_per_token_fields_with_targets():
    b = build_train_batch([([5, 6], [7, 8, 9], [-0.1, -0.2, -0.3], [2, 2, 3]), ([4], [3], [-1.0], [7])],
                          pad_id=0, advantages=[1.5, [0.25]])
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [4, 3, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[True] * 5, [True, True, False, False, False]]
    # position t predicts input_ids[:, t+1]
    assert b.loss_mask.tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]]
    assert b.behaviour_logprobs.flatten().tolist() == pytest.approx([0, -0.1, -0.2, -0.3, -1.0, 0, 0, 0])
    assert b.versions.tolist() == [[-1, 2, 2, 3], [7, -1, -1, -1]]
    assert b.advantages.tolist() == [[0, 1.5, 1.5, 1.5], [0.25, 0, 0, 0]]
    assert b.lengths.tolist() == [5, 2] and b.n_loss_tokens == 4


def test_train_batch_rejects_wrong_shapes_left_padding_and_loss_on_padding():
    good = build_train_batch([([1, 2], [3], [-1.0], [0]), ([1], [2, 3], [-1.0, -1.0], [0, 0])])
    with pytest.raises(ValueError, match="loss_mask"):
        TrainBatch(good.input_ids, good.attention_mask, good.loss_mask[:, :1], good.behaviour_logprobs,
                   good.versions)
    left = torch.tensor([[False, True, True], [True, True, True]])
    with pytest.raises(ValueError, match="attention_mask"):
        TrainBatch(good.input_ids, left, good.loss_mask, good.behaviour_logprobs, good.versions)
    lm = good.loss_mask.clone()
    am = good.attention_mask.clone()
    am[1, 2] = False  # target of position 1 becomes padding while loss_mask[1, 1] == 1
    with pytest.raises(ValueError, match="padding"):
        TrainBatch(good.input_ids, am, lm, good.behaviour_logprobs, good.versions)
    with pytest.raises(ValueError, match="versions"):
        TrainBatch(good.input_ids, good.attention_mask, good.loss_mask, good.behaviour_logprobs,
                   good.versions.float())
    with pytest.raises(ValueError):
        build_train_batch([([1], [2, 3], [-1.0], [0, 0])])


def test_split_keeps_row_order_sizes_and_trim_only_drops_padding():
    b = _batch(100)
    parts = b.split(3)
    assert [p.batch_size for p in parts] == [2, 1, 1]
    assert torch.equal(torch.cat([p.input_ids for p in parts]), b.input_ids)
    assert torch.equal(torch.cat([p.loss_mask for p in parts]), b.loss_mask)
    trimmed = b.split(4, trim=True)
    assert [p.seq_len for p in trimmed] == [9, 7, 11, 11]
    assert torch.equal(trimmed[1].input_ids, b.input_ids[1:2, :7])
    with pytest.raises(ValueError):
        b.split(5)


# ----------------------------------------------------------------------------- engine


def test_engine_logprobs_match_hf_log_softmax_gather_within_1e_5(hf_dir):
    eng = MegatronEngine(hf_dir, lr=1e-3)
    assert eng.num_parameters() == sum(t.numel() for t in load_file(str(hf_dir / "model.safetensors")).values())
    b = _batch(eng.vocab_size)
    logits = _hf_logits(hf_dir, b)
    real = b.attention_mask[:, 1:]
    for temp in (1.0, 0.7):
        ref = torch.log_softmax(logits[:, :-1] / temp, dim=-1).gather(-1, b.input_ids[:, 1:, None]).squeeze(-1)
        got = eng.logprobs(b, temperature=temp)
        assert got.shape == (4, b.seq_len - 1) and got.dtype == torch.float32
        assert (got - ref)[real].abs().max().item() <= 1e-5
        assert torch.all(got[~real] == 0)
    assert torch.equal(eng.logprobs(b, n_micro=2), eng.logprobs(b))
    with pytest.raises(ValueError, match="temperature"):
        eng.logprobs(b, temperature=-1.0)


def test_train_step_reduces_sft_loss_on_a_fixed_batch(hf_dir):
    eng = MegatronEngine(hf_dir, lr=3e-3)
    b = _batch(eng.vocab_size)
    fn = sft_loss(b.n_loss_tokens)
    losses = [eng.train_step(b.split(2), fn)["loss"] for _ in range(4)]
    assert all(x > y for x, y in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.8 * losses[0]
    after = -(eng.logprobs(b) * b.loss_mask).sum().item() / b.n_loss_tokens
    assert after < losses[-1]
    assert eng.steps == 4


def _grads(eng: MegatronEngine, b: TrainBatch, n_micro: int = 1) -> dict[str, torch.Tensor]:
    eng.forward_backward(b.split(n_micro), sft_loss(b.n_loss_tokens))
    return {n: p.grad.clone() for n, p in eng.model.named_parameters()}


def test_tokens_with_loss_mask_zero_receive_no_gradient(hf_dir):
    eng = MegatronEngine(hf_dir, lr=1e-3)
    b = _batch(eng.vocab_size)
    lm = b.loss_mask.clone()
    last = b.lengths - 1  # index of the last real token of each row
    for i in range(b.batch_size):
        lm[i, last[i] - 1] = 0.0  # the last response token is masked out of the loss
    b = TrainBatch(b.input_ids, b.attention_mask, lm, b.behaviour_logprobs, b.versions)
    changed = b.input_ids.clone()
    for i in range(b.batch_size):
        changed[i, last[i]] = (changed[i, last[i]] + 1) % eng.vocab_size  # masked target token
        changed[i, last[i] + 1 :] = 7  # padding targets (loss_mask 0 as well)
    b2 = TrainBatch(changed, b.attention_mask, lm, b.behaviour_logprobs, b.versions)
    g1, g2 = _grads(eng, b), _grads(eng, b2)
    assert all(torch.equal(g1[n], g2[n]) for n in g1)
    assert sum(g.abs().sum() for g in g1.values()) > 0
    # control: changing a token that IS in the loss changes the gradient
    b3 = TrainBatch(b.input_ids.clone(), b.attention_mask, lm, b.behaviour_logprobs, b.versions)
    b3.input_ids[0, last[0] - 1] = (b3.input_ids[0, last[0] - 1] + 1) % eng.vocab_size
    g3 = _grads(eng, b3)
    assert not all(torch.equal(g1[n], g3[n]) for n in g1)


def test_gradient_accumulation_over_micro_batches_equals_full_batch_gradient(hf_dir):
    eng = MegatronEngine(hf_dir, lr=1e-3)
    b = _batch(eng.vocab_size)
    full, acc = _grads(eng, b, 1), _grads(eng, b, 3)
    for n in full:  # same sum, different float summation order
        torch.testing.assert_close(acc[n], full[n], rtol=1e-4, atol=1e-6 * full[n].abs().max().item())


def test_grad_clip_bounds_the_global_norm_the_optimizer_sees(hf_dir):
    eng = MegatronEngine(hf_dir, lr=1e-3, grad_clip=0.01)
    b = _batch(eng.vocab_size)
    seen = []
    orig_step = eng.optimizer.step

    def spy(*a, **k):
        seen.append(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in eng.model.parameters())).item())
        return orig_step(*a, **k)

    eng.optimizer.step = spy
    out = eng.train_step([b], sft_loss(b.n_loss_tokens))
    assert out["grad_norm"] > 0.01 and out["skipped"] == 0.0
    assert seen and seen[0] == pytest.approx(0.01, rel=1e-4)
    assert all(p.grad is None for p in eng.model.parameters())


def test_save_hf_then_transformers_reload_gives_the_engine_logits(hf_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    eng = MegatronEngine(hf_dir, lr=3e-3)
    b = _batch(eng.vocab_size)
    eng.train_step([b], sft_loss(b.n_loss_tokens))  # weights now differ from the source dir
    out = tmp_path / "weights" / "v1"
    out.parent.mkdir()
    (out).mkdir()
    (out / "stale.txt").write_text("replaced")  # an existing dir is replaced as a whole
    assert eng.save_hf(out) == out
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                            "special_tokens_map.json", "generation_config.json"])
    assert sorted(p.name for p in out.parent.iterdir()) == ["v1"]  # no tmp/old dirs left
    assert (out / "config.json").read_bytes() == (hf_dir / "config.json").read_bytes()
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(input_ids=b.input_ids, attention_mask=b.attention_mask.long()).logits
        got = eng.forward_logits(b.input_ids)
    assert (got - ref)[b.attention_mask].abs().max().item() <= 1e-5
    saved = load_file(str(out / "model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in eng.hf_state_dict().items())


def test_load_hf_restores_saved_weights_and_rejects_another_architecture(hf_dir, tmp_path):
    eng = MegatronEngine(hf_dir, lr=3e-3)
    b = _batch(eng.vocab_size)
    eng.train_step([b], sft_loss(b.n_loss_tokens))
    eng.save_hf(tmp_path / "ckpt")
    other = MegatronEngine(hf_dir, lr=3e-3)
    assert not torch.equal(other.logprobs(b), eng.logprobs(b))
    other.load_hf(tmp_path / "ckpt")
    assert torch.equal(other.logprobs(b), eng.logprobs(b))
    small = make_model_dir(tmp_path / "small", num_layers=1)
    with pytest.raises(ConversionError, match="num_hidden_layers"):
        other.load_hf(small)


def test_training_is_deterministic_by_seed(hf_dir):
    def run() -> dict[str, torch.Tensor]:
        eng = MegatronEngine(hf_dir, lr=3e-3, weight_decay=0.1, seed=7)
        b = _batch(eng.vocab_size)
        for _ in range(2):
            eng.train_step(b.split(2), sft_loss(b.n_loss_tokens))
        return eng.hf_state_dict()

    first, second = run(), run()
    assert all(torch.equal(first[k], second[k]) for k in first)

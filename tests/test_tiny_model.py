"""Claims about areal_cli.models.tiny: a deterministic, reloadable tiny Qwen3 with a byte-level tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from areal_cli.models.tiny import (
    CHAT_TEMPLATE,
    IM_END,
    IM_START,
    PAD_TOKEN,
    build_tiny_model,
    chat_prompt_ids,
    load_tokenizer,
)

AIME24 = Path(__file__).resolve().parents[2] / "shared" / "data" / "math" / "aime24.jsonl"  # ../shared
REPO_AIME24 = Path(__file__).resolve().parents[1] / "data" / "math" / "aime24.jsonl"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


def _load(d):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(str(d)).eval()


def test_model_dir_has_hf_files_and_contract_config(model_dir):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert (model_dir / name).is_file(), name
    cfg = json.loads((model_dir / "config.json").read_text())
    tok = load_tokenizer(model_dir)
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["tie_word_embeddings"] is False
    assert cfg["eos_token_id"] == tok.convert_tokens_to_ids(IM_END)
    assert cfg["pad_token_id"] == tok.convert_tokens_to_ids(PAD_TOKEN)
    assert cfg["vocab_size"] == len(tok) <= 512
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == cfg["eos_token_id"] and gen["pad_token_id"] == cfg["pad_token_id"]
    assert json.loads((model_dir / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE


def test_default_model_is_small(model_dir):
    n = sum(p.numel() for p in _load(model_dir).parameters())
    assert 100_000 < n < 3_000_000


def test_special_token_ids_are_pad0_imstart1_imend2(model_dir):
    tok = load_tokenizer(model_dir)
    assert [tok.convert_tokens_to_ids(t) for t in (PAD_TOKEN, IM_START, IM_END)] == [0, 1, 2]
    assert tok.pad_token_id == 0 and tok.eos_token_id == 2
    assert tok("<|im_start|>x<|im_end|>")["input_ids"][0] == 1
    assert tok("<|im_start|>x<|im_end|>")["input_ids"][-1] == 2
    assert set(tok.all_special_ids) == {0, 1, 2}


def test_numbers_are_one_token_per_digit(model_dir):
    tok = load_tokenizer(model_dir)
    for text in ("1234567890", "37+85=", "x 2024 y"):
        toks = tok.convert_ids_to_tokens(tok(text)["input_ids"])
        digits = [t for t in toks if any(c.isdigit() for c in t)]
        assert digits == [c for c in text if c.isdigit()], toks


def test_chat_template_round_trips(model_dir):
    tok = load_tokenizer(model_dir)
    ids = chat_prompt_ids(tok, "12+345=")
    assert tok.decode(ids) == "<|im_start|>user\n12+345=<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] == 1 and ids.count(2) == 1 and ids[-1] != 2
    assert tok(tok.decode(ids))["input_ids"] == ids
    assert all(isinstance(i, int) for i in ids)


def test_same_seed_gives_byte_identical_weights_and_tokenizer(model_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert (again / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    assert (again / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (model_dir / "model.safetensors").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()


def test_build_leaves_global_rng_untouched(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_logits_identical_after_save_and_reload(model_dir, tmp_path):
    tok = load_tokenizer(model_dir)
    ids = torch.tensor([chat_prompt_ids(tok, "12+345=")])
    m1 = _load(model_dir)
    with torch.no_grad():
        l1 = m1(ids).logits
    m1.save_pretrained(tmp_path / "resaved")
    m2 = _load(tmp_path / "resaved")
    with torch.no_grad():
        l2 = m2(ids).logits
    assert l1.shape == (1, ids.shape[1], len(tok))
    assert torch.equal(l1, l2)
    assert torch.equal(l1, _load(model_dir)(ids).logits.detach())


def test_every_aime24_problem_tokenizes_without_unknown_tokens(model_dir):
    path = REPO_AIME24 if REPO_AIME24.is_file() else AIME24
    if not path.is_file():
        pytest.fail(f"{path} not found")
    tok = load_tokenizer(model_dir)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(rows) == 30
    for row in rows:
        text = row["problem"] + "\nPlease reason step by step, and put your final answer within \\boxed{}."
        ids = tok(text)["input_ids"]
        assert ids and all(isinstance(i, int) and 0 <= i < len(tok) for i in ids)
        assert tok.unk_token_id is None or tok.unk_token_id not in ids
        assert tok.decode(ids) == text  # byte-level: lossless, so nothing was mapped to an unknown

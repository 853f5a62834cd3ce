"""Model families (Qwen3, Qwen2, Llama) end to end on tiny configs: HF vs Megatron logits, HF <-> Megatron round
trip, the embedded engine vs HF, tensor-parallel parity, and unsupported families refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from areal_cli.foundations.errors import UserError
from areal_cli.trainer import hf_mcore
from helpers.one_line import assert_one_line
from helpers.perturbed_models import make_model_dir

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16, "rope_theta": 10000.0}
CASES = {
    "qwen3": dict(family="qwen3"),
    "qwen2": dict(family="qwen2"),
    "qwen2-tied": dict(family="qwen2", tie_word_embeddings=True),
    "llama3-tied": dict(family="llama", tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE),
    "llama": dict(family="llama"),
}


def make_family_model(path: Path, seed: int = 0, **kw) -> Path:
    """Tiny model of a family with every weight perturbed (biases and norms far from their init)."""
    return make_model_dir(path, seed=seed, vocab_size=301, **kw)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: make_family_model(root / name, **kw) for name, kw in CASES.items()}


def vocab_of(d: Path) -> int:
    return json.loads((d / "config.json").read_text())["vocab_size"]


def ids(vocab: int, length: int = 40, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab, (2, length), generator=torch.Generator().manual_seed(seed))


def hf_logits(d: Path, x: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(input_ids=x).logits


@pytest.mark.parametrize("name", list(CASES))
def test_megatron_and_the_embedded_engine_give_the_hf_logits(models, name):
    from areal_cli.rollout.engine import CausalLM
    from areal_cli.trainer.megatron_engine import MegatronEngine

    d = models[name]
    v = vocab_of(d)
    x = ids(v)
    ref = hf_logits(d, x)
    eng = MegatronEngine(d, lr=1e-3, seed=0)
    with torch.no_grad():
        meg = eng.forward_logits(x)[..., :v].float()
    assert (meg - ref).abs().max().item() <= 1e-5, name
    lm = CausalLM(d)
    for row in range(2):
        assert (lm.full_logits(x[row].tolist()) - ref[row]).abs().max().item() <= 1e-5, name
    assert eng.num_parameters() == sum(t.numel() for t in load_file(str(d / "model.safetensors")).values())


@pytest.mark.parametrize("name", list(CASES))
def test_hf_to_megatron_and_back_is_bit_exact(models, name, tmp_path):
    from transformers import AutoConfig

    d = models[name]
    cfg = AutoConfig.from_pretrained(str(d))
    hf = load_file(str(d / "model.safetensors"))
    back = hf_mcore.mcore_to_hf(hf_mcore.hf_to_mcore(hf, cfg), cfg)
    assert back.keys() == hf.keys() and all(torch.equal(back[k], hf[k]) for k in hf)
    fam = hf_mcore.family_of(cfg)
    names = set(hf_mcore.hf_to_mcore(hf, cfg))
    assert any(n.endswith("linear_qkv.bias") for n in names) == fam.qkv_bias
    assert any(n.endswith("q_layernorm.weight") for n in names) == fam.qk_norm
    assert ("output_layer.weight" in names) == (not cfg.tie_word_embeddings)


def test_the_embedded_engine_decodes_greedily_like_hf_generate(models):
    from transformers import AutoModelForCausalLM

    from areal_cli.rollout.engine import InferenceEngine
    from areal_cli.rollout.protocol import SamplingParams

    for name in ("qwen2-tied", "llama3-tied"):
        d = models[name]
        hf = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
        prompts = [ids(vocab_of(d), length=n, seed=n)[0].tolist() for n in (5, 9, 17)]
        eng = InferenceEngine(d, max_running_requests=8, max_total_tokens=4096)
        res = eng.generate(prompts, SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True))
        for p, r in zip(prompts, res):
            with torch.no_grad():
                out = hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, min_new_tokens=24,
                                  pad_token_id=0)
            assert r.output_ids == out[0, len(p):].tolist(), name


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2", "llama3-tied"])
def test_tensor_parallel_2_matches_single_process_per_family(models, name, tmp_path):
    from helpers.torchrun_parity import check_parity, load_parity_script, torchrun_parity

    ref = load_parity_script().run_parity(models[name])
    ranks = torchrun_parity(models[name], tmp_path / "tp2", tp=2)
    assert [(r["tp"], r["dp"]) for r in ranks] == [(2, 1)] * 2
    check_parity(ranks, ref, tmp_path / "tp2", models[name])


def test_an_unsupported_family_or_feature_is_one_line_naming_what_is_supported(models, tmp_path):
    from areal_cli.rollout.engine import ModelSpec

    cfg = json.loads((models["qwen2"] / "config.json").read_text())
    cases = [({"model_type": "mistral", "architectures": ["MistralForCausalLM"]},
              "field 'model_type': model_type 'mistral' is not supported (supported: qwen3 (Qwen3ForCausalLM), "
              "qwen2 (Qwen2ForCausalLM), llama (LlamaForCausalLM))"),
             ({"use_sliding_window": True}, "field 'use_sliding_window': sliding-window attention"),
             ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
              "rope_type 'yarn' is not supported for qwen2 (supported: default)"),
             ({"model_type": None, "architectures": None}, "field 'model_type': no model_type is not supported")]
    for i, (change, message) in enumerate(cases):
        d = tmp_path / f"m{i}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(UserError) as e:
            ModelSpec.from_model_dir(d)
        assert_one_line(str(e.value), message)
    from transformers import LlamaConfig

    with pytest.raises(hf_mcore.ConversionError, match="attention_bias"):
        hf_mcore.check_supported(LlamaConfig(attention_bias=True))


@pytest.mark.multiproc
def test_areal_eval_on_an_unsupported_family_is_one_line_exit_2(models, tmp_path, shared_dir):
    import os
    import shutil
    import subprocess
    import sys

    d = tmp_path / "mistral"
    shutil.copytree(models["llama"], d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral", "architectures": ["MistralForCausalLM"]}))
    repo = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "areal_cli.commands.main", "eval", "--model", str(d), "--data", "aime24",
                        "--data-dir", str(shared_dir / "data" / "math"), "--protocol", "chat-template",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(repo)})
    assert r.returncode == 2 and "model_type 'mistral' is not supported (supported: qwen3" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and not (tmp_path / "o").exists()

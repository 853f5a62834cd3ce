"""HF Qwen3 <-> megatron-core GPTModel conversion, and the CPU adaptation of megatron-core it runs on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from areal_cli.foundations.ports import free_port
from areal_cli.trainer import cpu_compat, hf_mcore
from helpers.perturbed_models import make_model_dir as make_untied_model_dir
from helpers.perturbed_models import perturb_weights


def make_model_dir(path: Path, *, seed: int = 0, tied: bool = False) -> Path:
    """A tiny Qwen3 HF directory whose weights are all perturbed (norm weights != 1, so a swapped q/k norm
    or a wrong QKV packing changes the logits)."""
    if not tied:
        return make_untied_model_dir(path, seed=seed)
    else:  # tiny.py writes untied models only; real small Qwen3 checkpoints are tied
        from transformers import Qwen3Config, Qwen3ForCausalLM

        cfg = Qwen3Config(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=32, intermediate_size=256,
                          tie_word_embeddings=True, rope_theta=10000.0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            Qwen3ForCausalLM(cfg).save_pretrained(path)
    return perturb_weights(path, seed + 1)


@pytest.fixture(scope="module")
def megatron_ready():
    cpu_compat.setup_megatron(seed=0)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("hf_untied"))


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("hf_tied"), tied=True)


def _hf_model(d: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()


def _mcore_model(d: Path):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(d))
    m = hf_mcore.build_gpt_model(cfg)
    hf_mcore.load_hf_into_model(m, load_file(str(d / "model.safetensors")), cfg)
    return m.eval(), cfg


def _padded_batch(vocab: int, lengths=(11, 5, 8, 2), seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    L = max(lengths)
    ids = torch.randint(0, vocab, (len(lengths), L), generator=g)
    mask = torch.zeros(len(lengths), L, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    ids[~mask] = 0
    return ids, mask


def _mcore_logits(m, ids):
    b, L = ids.shape
    pos = torch.arange(L).expand(b, L)
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)[None, None]
    return m(ids, pos, causal)


@pytest.mark.parametrize("variant", ["untied", "tied"])
def test_megatron_logits_match_hf_within_1e_5_on_padded_batch(megatron_ready, hf_dir, tied_dir, variant):
    d = hf_dir if variant == "untied" else tied_dir
    hf = _hf_model(d)
    m, cfg = _mcore_model(d)
    ids, mask = _padded_batch(cfg.vocab_size)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask.long()).logits
        got = _mcore_logits(m, ids)
    assert got.shape == ref.shape == (*ids.shape, cfg.vocab_size)
    assert ref[mask].abs().max() > 1.0  # non-trivial logits
    assert (got - ref)[mask].abs().max().item() <= 1e-5


def test_megatron_logits_match_hf_with_attention_mask_none(megatron_ready, hf_dir):
    # attention_mask=None makes megatron build its own causal mask (device="cuda" upstream; cpu_compat)
    hf = _hf_model(hf_dir)
    m, cfg = _mcore_model(hf_dir)
    ids, _ = _padded_batch(cfg.vocab_size, lengths=(9, 9))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        got = m(ids, torch.arange(9).expand(2, 9), None)
    assert (got - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("variant", ["untied", "tied"])
def test_conversion_round_trip_hf_to_mcore_to_hf_is_bit_exact(megatron_ready, hf_dir, tied_dir, variant):
    d = hf_dir if variant == "untied" else tied_dir
    hf_sd = load_file(str(d / "model.safetensors"))
    m, cfg = _mcore_model(d)
    back = hf_mcore.mcore_to_hf(hf_mcore.mcore_param_state_dict(m), cfg)
    expected = {k for k in hf_sd if not (variant == "tied" and k == "lm_head.weight")}
    assert set(back) == expected
    for k in expected:
        assert back[k].dtype == hf_sd[k].dtype and torch.equal(back[k], hf_sd[k]), k


@pytest.mark.parametrize("variant", ["untied", "tied"])
def test_parameter_count_equals_hf(megatron_ready, hf_dir, tied_dir, variant):
    d = hf_dir if variant == "untied" else tied_dir
    hf = _hf_model(d)
    m, _ = _mcore_model(d)
    assert sum(p.numel() for p in m.parameters()) == sum(p.numel() for p in hf.parameters())


def test_name_table_maps_every_mcore_parameter_exactly_once(megatron_ready, hf_dir):
    m, cfg = _mcore_model(hf_dir)
    mapped = [mname for _, mname, _ in hf_mcore._expanded_rules(cfg)]
    assert len(mapped) == len(set(mapped))
    assert set(mapped) == {n for n, _ in m.named_parameters()}
    assert all(k.endswith("._extra_state") for k in set(m.state_dict()) - set(mapped))


def test_fused_qkv_is_packed_per_query_group_q_then_k_then_v():
    # 4 query heads, 2 groups, head_dim 2, hidden 1: rows identify their origin
    cfg = type("C", (), {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 2, "hidden_size": 8,
                         "num_hidden_layers": 1, "tie_word_embeddings": False})()
    d = hf_mcore._dims(cfg)
    q = torch.arange(0, 8.0).reshape(8, 1)  # heads 0..3 x 2 rows
    k = torch.arange(100, 104.0).reshape(4, 1)  # groups 0..1 x 2 rows
    v = torch.arange(200, 204.0).reshape(4, 1)
    fused = hf_mcore.TRANSFORMS["qkv"][0]([q, k, v], d).flatten().tolist()
    assert fused == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    back = hf_mcore.TRANSFORMS["qkv"][1](torch.tensor(fused).reshape(16, 1), d)
    assert all(torch.equal(a, b) for a, b in zip(back, (q, k, v)))
    gate, up = torch.zeros(3, 2), torch.ones(3, 2)
    fc1 = hf_mcore.TRANSFORMS["gate_up"][0]([gate, up], d)
    assert torch.equal(fc1[:3], gate) and torch.equal(fc1[3:], up)


def test_transformer_config_follows_hf_config(hf_dir):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(hf_dir))
    tc = hf_mcore.transformer_config_from_hf(cfg)
    assert (tc.num_layers, tc.hidden_size, tc.ffn_hidden_size) == (2, 128, 256)
    assert (tc.num_attention_heads, tc.num_query_groups, tc.kv_channels) == (4, 2, 32)
    assert tc.layernorm_epsilon == cfg.rms_norm_eps and tc.normalization == "RMSNorm"
    assert tc.gated_linear_unit and tc.qk_layernorm and not tc.add_bias_linear and tc.use_cpu_initialization
    assert tc.activation_func is torch.nn.functional.silu
    assert not (tc.bias_activation_fusion or tc.masked_softmax_fusion or tc.apply_rope_fusion
                or tc.gradient_accumulation_fusion or tc.persist_layer_norm or tc.bias_dropout_fusion)
    assert hf_mcore.rope_theta_of(cfg) == 10000.0


def test_unsupported_configs_and_wrong_names_raise(hf_dir):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(hf_dir))
    bad = AutoConfig.from_pretrained(str(hf_dir))
    bad.attention_bias = True
    with pytest.raises(hf_mcore.ConversionError, match="attention_bias"):
        hf_mcore.transformer_config_from_hf(bad)
    sd = load_file(str(hf_dir / "model.safetensors"))
    sd["model.layers.0.mlp.extra.weight"] = torch.zeros(1)
    with pytest.raises(hf_mcore.ConversionError, match="unexpected"):
        hf_mcore.hf_to_mcore(sd, cfg)
    del sd["model.layers.0.mlp.extra.weight"], sd["model.norm.weight"]
    with pytest.raises(hf_mcore.ConversionError, match="missing"):
        hf_mcore.hf_to_mcore(sd, cfg)


# ----------------------------------------------------------------------------- cpu_compat


def test_cpu_compat_applies_each_documented_patch_idempotently(megatron_ready):
    from megatron.core.tensor_parallel import random as mrandom

    first = cpu_compat.apply_cpu_compat()
    second = cpu_compat.apply_cpu_compat()
    assert first == second
    if torch.cuda.is_available():
        assert first == []
        return
    assert first == [p.name for p in cpu_compat.PATCHES]
    assert torch.cuda.current_device() == torch.device("cpu")
    assert isinstance(mrandom.get_cuda_rng_tracker(), cpu_compat.CpuRNGStatesTracker)
    from megatron.core.transformer.utils import get_default_causal_mask

    assert get_default_causal_mask(3).device.type == "cpu"
    assert get_default_causal_mask(3).tolist() == [[False, True, True], [False, False, True], [False] * 3]


def test_cpu_rng_tracker_forks_a_named_seeded_stream_and_restores_the_caller_stream(megatron_ready):
    if torch.cuda.is_available():
        pytest.skip("CPU tracker is only installed without CUDA")
    from megatron.core.tensor_parallel import random as mrandom

    cpu_compat.seed_model_parallel(5)
    tracker = mrandom.get_cuda_rng_tracker()
    caller = torch.get_rng_state()
    with tracker.fork():  # model-parallel stream, seed 5 + 2718 + tp_rank 0
        a = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), caller)
    assert torch.equal(a, torch.rand(4, generator=torch.Generator().manual_seed(5 + 2718)))
    with tracker.fork():
        b = torch.rand(4)
    assert not torch.equal(a, b)  # the named stream advanced
    cpu_compat.seed_model_parallel(5)
    with mrandom.get_cuda_rng_tracker().fork():
        assert torch.equal(torch.rand(4), a)
    with pytest.raises(Exception, match="not added"):
        with tracker.fork("no-such-stream"):
            pass


def test_distributed_and_model_parallel_init_are_idempotent(megatron_ready):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    assert cpu_compat.init_single_process_gloo() == (0, 1)
    assert cpu_compat.init_distributed() == (0, 1)
    assert dist.get_backend() == ("nccl" if torch.cuda.is_available() else "gloo")
    cpu_compat.init_model_parallel(1, 1)
    assert ps.get_tensor_model_parallel_world_size() == 1 and ps.get_data_parallel_world_size() == 1
    with pytest.raises(RuntimeError, match="already initialised"):
        cpu_compat.init_model_parallel(2, 1)
    assert 0 < free_port() < 65536


"""Decoder families the kit trains and serves, as data: Qwen3, Qwen2 and Llama.

All three are the same decoder -- RMSNorm, grouped-query attention with rotary positions, SwiGLU MLP -- and
differ in a few switches, which every consumer reads from :class:`Family` instead of branching on names
(the HF <-> Megatron converter :mod:`areal_cli.trainer.hf_mcore`, the embedded engine
:mod:`areal_cli.rollout.engine`, the tiny-model builder):

=========  =====================  ==========================  ===========================================
family     ``model_type``         per-head q/k RMSNorm        biases
=========  =====================  ==========================  ===========================================
qwen3      ``qwen3``              yes                         none (``attention_bias`` must be false)
qwen2      ``qwen2``              no                          q, k, v projections (always; not o_proj)
llama      ``llama``              no                          none (``attention_bias``/``mlp_bias`` false)
=========  =====================  ==========================  ===========================================

Sources: transformers 5 ``models/{qwen3,qwen2,llama}/modeling_*.py`` (``Qwen2Attention`` builds q/k/v with
``bias=True`` and o_proj without). Rotary embeddings: ``default`` (``inv_freq_i = theta^(-2i/d)``) or
``llama3`` (Llama 3.1+ frequency scaling, transformers ``_compute_llama3_parameters``), both computed by
:func:`rope_inv_freq`. Sliding-window attention (Qwen2 ``use_sliding_window``) and other rope types are
refused, in one line naming what is supported (:class:`UnsupportedModel`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping


class UnsupportedModel(ValueError):
    """A model config this kit cannot train or serve (one line: the field and what is supported)."""


@dataclass(frozen=True)
class Family:
    """One decoder family's switches.

    Attributes:
        name: family name (also the HF ``model_type``).
        architecture: the HF ``architectures`` entry (``Qwen2ForCausalLM``, ...).
        qk_norm: per-head RMSNorm on queries and keys before RoPE (``self_attn.q_norm`` / ``k_norm``).
        qkv_bias: q/k/v projections carry biases whatever the config says (Qwen2).
        rope_types: rotary variants supported for this family.
    """

    name: str
    architecture: str
    qk_norm: bool
    qkv_bias: bool
    rope_types: tuple[str, ...] = ("default",)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("qwen3", "Qwen3ForCausalLM", qk_norm=True, qkv_bias=False),
    Family("qwen2", "Qwen2ForCausalLM", qk_norm=False, qkv_bias=True),
    Family("llama", "LlamaForCausalLM", qk_norm=False, qkv_bias=False, rope_types=("default", "llama3")),
)}
SUPPORTED = ", ".join(f"{f.name} ({f.architecture})" for f in FAMILIES.values())


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def rope_parameters(cfg: Any) -> dict:
    """The rotary settings of an HF config (dict or ``PretrainedConfig``), transformers 5 and 4 layouts:
    ``{"rope_type", "rope_theta", ...scaling keys}``."""
    rp = _get(cfg, "rope_parameters") or _get(cfg, "rope_scaling") or {}
    rp = dict(rp) if isinstance(rp, Mapping) else {}
    rp.setdefault("rope_type", rp.pop("type", "default") or "default")
    if rp.get("rope_theta") is None:
        rp["rope_theta"] = _get(cfg, "rope_theta", 10000.0) or 10000.0
    return rp


def family_of(cfg: Any, where: str = "config.json") -> Family:
    """The :class:`Family` of an HF config, after checking every feature the kit relies on.

    Checks: a known ``model_type`` (or architecture), ``hidden_act`` silu, no sliding window, no attention or
    MLP bias beyond the family's own, KV heads dividing the query heads, a supported rope type.

    Raises:
        UnsupportedModel: ``<where>: field 'x': ... (supported: qwen3 (Qwen3ForCausalLM), ...)``.
    """
    mt = _get(cfg, "model_type")
    archs = list(_get(cfg, "architectures") or [])
    fam = FAMILIES.get(mt) or next((f for f in FAMILIES.values() if f.architecture in archs), None)
    if fam is None:
        what = f"model_type {mt!r}" if mt else "no model_type"
        raise UnsupportedModel(f"{where}: field 'model_type': {what} is not supported (supported: {SUPPORTED})")
    if _get(cfg, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"{where}: field 'hidden_act': {_get(cfg, 'hidden_act')!r} is not supported (silu)")
    if _get(cfg, "use_sliding_window", False):
        raise UnsupportedModel(f"{where}: field 'use_sliding_window': sliding-window attention is not supported")
    if _get(cfg, "attention_bias", False) and not fam.qkv_bias:
        raise UnsupportedModel(f"{where}: field 'attention_bias': true is not supported for {fam.name}")
    if _get(cfg, "mlp_bias", False):
        raise UnsupportedModel(f"{where}: field 'mlp_bias': true is not supported")
    heads = int(_get(cfg, "num_attention_heads"))
    kv = int(_get(cfg, "num_key_value_heads") or heads)
    if heads % kv:
        raise UnsupportedModel(f"{where}: field 'num_key_value_heads': {kv} does not divide {heads} heads")
    rope = rope_parameters(cfg)
    if rope["rope_type"] not in fam.rope_types:
        raise UnsupportedModel(f"{where}: field 'rope_parameters': rope_type {rope['rope_type']!r} is not supported "
                               f"for {fam.name} (supported: {', '.join(fam.rope_types)})")
    return fam


def head_dim_of(cfg: Any) -> int:
    """Per-head dimension: ``head_dim`` when set, else ``hidden_size // num_attention_heads``."""
    hd = _get(cfg, "head_dim")
    return int(hd) if hd else int(_get(cfg, "hidden_size")) // int(_get(cfg, "num_attention_heads"))


def rope_inv_freq(cfg: Any):
    """Rotary inverse frequencies, FloatTensor [head_dim / 2] (float32), exactly as transformers computes
    them: ``default`` ``1 / theta^(2i/d)``; ``llama3`` the Llama 3.1 scaling of long wavelengths (``factor``,
    ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``; transformers
    ``modeling_rope_utils._compute_llama3_parameters``)."""
    import torch

    rp = rope_parameters(cfg)
    d = head_dim_of(cfg)
    inv = 1.0 / (float(rp["rope_theta"]) ** (torch.arange(0, d, 2, dtype=torch.int64).to(torch.float) / d))
    if rp["rope_type"] != "llama3":
        return inv
    factor, low, high = float(rp["factor"]), float(rp["low_freq_factor"]), float(rp["high_freq_factor"])
    old = float(rp["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def weight_shapes(cfg: Any) -> dict[str, tuple[int, ...]]:
    """Every HF tensor of a model of this config and its shape (what a checkpoint must hold).

    Raises:
        UnsupportedModel: see :func:`family_of`.
    """
    fam = family_of(cfg)
    H, D = int(_get(cfg, "hidden_size")), head_dim_of(cfg)
    nh = int(_get(cfg, "num_attention_heads"))
    nkv = int(_get(cfg, "num_key_value_heads") or nh)
    inter, vocab = int(_get(cfg, "intermediate_size")), int(_get(cfg, "vocab_size"))
    out = {"model.embed_tokens.weight": (vocab, H), "model.norm.weight": (H,)}
    if not _get(cfg, "tie_word_embeddings", False):
        out["lm_head.weight"] = (vocab, H)
    for i in range(int(_get(cfg, "num_hidden_layers"))):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (nh * D, H), p + "self_attn.k_proj.weight": (nkv * D, H),
            p + "self_attn.v_proj.weight": (nkv * D, H), p + "self_attn.o_proj.weight": (H, nh * D),
            p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
            p + "mlp.down_proj.weight": (H, inter),
        })
        if fam.qk_norm:
            out.update({p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
        if fam.qkv_bias:
            out.update({p + "self_attn.q_proj.bias": (nh * D,), p + "self_attn.k_proj.bias": (nkv * D,),
                        p + "self_attn.v_proj.bias": (nkv * D,)})
    return out

"""Hugging Face Qwen3 / Qwen2 / Llama <-> megatron-core GPTModel: config translation and weight conversion.

The name mapping is DATA: :data:`RULES` is a table of :class:`Rule` (HF name patterns -> one mcore name
pattern + a transform name, and the family switch it needs, :mod:`areal_cli.models.families`). ``{i}`` in a
pattern stands for the decoder layer index. Transforms
(:data:`TRANSFORMS`) are pairs of pure functions (HF tensors -> mcore tensor, mcore tensor -> HF tensors):

- ``copy``     identity (same layout in both libraries);
- ``qkv``      megatron's fused ``linear_qkv`` weight packs rows per query group ``g``:
               ``[q_g (heads/groups x head_dim rows), k_g (head_dim rows), v_g (head_dim rows)]`` for
               ``g = 0..groups-1`` (megatron/core/transformer/attention.py ``get_query_key_value_tensors``
               views the output as ``[s, b, groups, (heads/groups + 2) * head_dim]`` and splits it as
               ``[q, k, v]``); HF keeps ``q_proj``/``k_proj``/``v_proj`` separate;
- ``qkv_bias`` the same grouping for the q/k/v biases (Qwen2) into ``linear_qkv.bias``;
- ``gate_up``  ``linear_fc1 = cat(gate_proj, up_proj)`` on rows (megatron's gated MLP computes
               ``silu(x1) * x2`` with ``x1, x2 = chunk(fc1(x), 2)``; HF: ``silu(gate(x)) * up(x)``).

``_extra_state`` entries (Transformer Engine FP8 metadata, ``None`` here) are ignored. Conversion is exact
(pure reshapes/concatenations): HF -> mcore -> HF reproduces every tensor bit for bit.

Supported: the families of :mod:`areal_cli.models.families` -- Qwen3 (q/k RMSNorm), Qwen2 (q/k/v biases),
Llama (RoPE with Llama-3 scaling) -- GQA, SwiGLU, tied or untied output layer. Megatron gets
``qk_layernorm`` / ``add_qkv_bias`` from the family, and its rotary ``inv_freq`` is set to the HF model's
(:func:`areal_cli.models.families.rope_inv_freq`, so scaled variants agree exactly). Tensor parallel: :func:`load_hf_into_model` shards the
converted tensors for the model's TP rank (:mod:`areal_cli.trainer.parallel_shard`); pipeline parallel:
a stage's parameters are matched by whole-model name (:func:`global_param_names`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "Rule",
    "RULES",
    "TRANSFORMS",
    "ConversionError",
    "check_supported",
    "architecture_signature",
    "rope_theta_of",
    "transformer_config_from_hf",
    "build_gpt_model",
    "hf_to_mcore",
    "mcore_to_hf",
    "mcore_param_state_dict",
    "load_hf_into_model",
]


class ConversionError(ValueError):
    """A state dict or config that does not match the conversion table (missing/extra names, bad shapes)."""


@dataclass(frozen=True)
class Rule:
    """One row of the name table.

    Attributes:
        hf: HF parameter name patterns (several when the transform fuses tensors, in fusion order).
        mcore: the megatron-core parameter name pattern.
        transform: key of :data:`TRANSFORMS`.
        per_layer: the patterns contain ``{i}`` and expand over ``range(num_hidden_layers)``.
        tied: ``None`` = always present; ``False`` = only when the output layer is NOT tied to the
            embedding (the ``lm_head`` row).
        when: ``None`` = every family; else the :class:`~areal_cli.models.families.Family` switch that must be
            on (``"qk_norm"``: Qwen3's q/k norms; ``"qkv_bias"``: Qwen2's q/k/v biases).
    """

    hf: tuple[str, ...]
    mcore: str
    transform: str = "copy"
    per_layer: bool = False
    tied: bool | None = None
    when: str | None = None


_L = "model.layers.{i}."
_D = "decoder.layers.{i}."

RULES: tuple[Rule, ...] = (
    Rule(("model.embed_tokens.weight",), "embedding.word_embeddings.weight"),
    Rule((_L + "input_layernorm.weight",), _D + "input_layernorm.weight", per_layer=True),
    Rule(
        (_L + "self_attn.q_proj.weight", _L + "self_attn.k_proj.weight", _L + "self_attn.v_proj.weight"),
        _D + "self_attention.linear_qkv.weight",
        "qkv",
        per_layer=True,
    ),
    Rule(
        (_L + "self_attn.q_proj.bias", _L + "self_attn.k_proj.bias", _L + "self_attn.v_proj.bias"),
        _D + "self_attention.linear_qkv.bias",
        "qkv_bias",
        per_layer=True,
        when="qkv_bias",
    ),
    Rule((_L + "self_attn.q_norm.weight",), _D + "self_attention.q_layernorm.weight", per_layer=True,
         when="qk_norm"),
    Rule((_L + "self_attn.k_norm.weight",), _D + "self_attention.k_layernorm.weight", per_layer=True,
         when="qk_norm"),
    Rule((_L + "self_attn.o_proj.weight",), _D + "self_attention.linear_proj.weight", per_layer=True),
    Rule((_L + "post_attention_layernorm.weight",), _D + "pre_mlp_layernorm.weight", per_layer=True),
    Rule(
        (_L + "mlp.gate_proj.weight", _L + "mlp.up_proj.weight"),
        _D + "mlp.linear_fc1.weight",
        "gate_up",
        per_layer=True,
    ),
    Rule((_L + "mlp.down_proj.weight",), _D + "mlp.linear_fc2.weight", per_layer=True),
    Rule(("model.norm.weight",), "decoder.final_layernorm.weight"),
    Rule(("lm_head.weight",), "output_layer.weight", tied=False),
)


@dataclass(frozen=True)
class _Dims:
    heads: int
    groups: int
    head_dim: int


def _qkv_to_mcore(ts: list[Tensor], d: _Dims) -> Tensor:
    q, k, v = ts
    hidden = q.shape[-1]
    per = d.heads // d.groups
    q = q.reshape(d.groups, per * d.head_dim, hidden)
    k = k.reshape(d.groups, d.head_dim, hidden)
    v = v.reshape(d.groups, d.head_dim, hidden)
    return torch.cat([q, k, v], dim=1).reshape(d.groups * (per + 2) * d.head_dim, hidden)


def _qkv_to_hf(t: Tensor, d: _Dims) -> list[Tensor]:
    hidden = t.shape[-1]
    per = d.heads // d.groups
    t = t.reshape(d.groups, (per + 2) * d.head_dim, hidden)
    q, k, v = torch.split(t, [per * d.head_dim, d.head_dim, d.head_dim], dim=1)
    return [
        q.reshape(d.heads * d.head_dim, hidden).contiguous(),
        k.reshape(d.groups * d.head_dim, hidden).contiguous(),
        v.reshape(d.groups * d.head_dim, hidden).contiguous(),
    ]


def _qkv_bias_to_mcore(ts: list[Tensor], d: _Dims) -> Tensor:
    return _qkv_to_mcore([t.unsqueeze(-1) for t in ts], d).squeeze(-1)


def _qkv_bias_to_hf(t: Tensor, d: _Dims) -> list[Tensor]:
    return [x.squeeze(-1).contiguous() for x in _qkv_to_hf(t.unsqueeze(-1), d)]


def _gate_up_to_mcore(ts: list[Tensor], d: _Dims) -> Tensor:
    return torch.cat(ts, dim=0)


def _gate_up_to_hf(t: Tensor, d: _Dims) -> list[Tensor]:
    return [c.contiguous() for c in torch.chunk(t, 2, dim=0)]


TRANSFORMS: dict[str, tuple[Callable[[list[Tensor], _Dims], Tensor], Callable[[Tensor, _Dims], list[Tensor]]]] = {
    "copy": (lambda ts, d: ts[0], lambda t, d: [t]),
    "qkv": (_qkv_to_mcore, _qkv_to_hf),
    "qkv_bias": (_qkv_bias_to_mcore, _qkv_bias_to_hf),
    "gate_up": (_gate_up_to_mcore, _gate_up_to_hf),
}


# ---------------------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------------------


def rope_theta_of(hf_config) -> float:
    """RoPE base of an HF config: ``rope_parameters["rope_theta"]`` (transformers 5) or ``rope_theta``."""
    from areal_cli.models.families import rope_parameters

    return float(rope_parameters(hf_config)["rope_theta"])


def family_of(hf_config):
    """The :class:`~areal_cli.models.families.Family` of ``hf_config``.

    Raises:
        ConversionError: an unsupported family or feature (one line naming what is supported).
    """
    from areal_cli.models.families import UnsupportedModel
    from areal_cli.models.families import family_of as _family_of

    try:
        return _family_of(hf_config, "HF config")
    except UnsupportedModel as e:
        raise ConversionError(str(e)) from None


def check_supported(hf_config) -> None:
    """Raise :class:`ConversionError` unless ``hf_config`` is a config of a supported family
    (:func:`areal_cli.models.families.family_of`: model type, silu, no sliding window, biases, rope type)."""
    family_of(hf_config)


def architecture_signature(hf_config) -> dict:
    """The config fields that determine tensor shapes and the forward function (for compatibility checks)."""
    return {
        "vocab_size": int(hf_config.vocab_size),
        "hidden_size": int(hf_config.hidden_size),
        "intermediate_size": int(hf_config.intermediate_size),
        "num_hidden_layers": int(hf_config.num_hidden_layers),
        "num_attention_heads": int(hf_config.num_attention_heads),
        "num_key_value_heads": int(hf_config.num_key_value_heads),
        "head_dim": _head_dim(hf_config),
        "rms_norm_eps": float(hf_config.rms_norm_eps),
        "rope_theta": rope_theta_of(hf_config),
        "tie_word_embeddings": tied_embeddings(hf_config),
        "family": family_of(hf_config).name,
    }


def _head_dim(hf_config) -> int:
    hd = getattr(hf_config, "head_dim", None)
    return int(hd) if hd else hf_config.hidden_size // hf_config.num_attention_heads


def _dims(hf_config) -> _Dims:
    return _Dims(hf_config.num_attention_heads, hf_config.num_key_value_heads, _head_dim(hf_config))


def tied_embeddings(hf_config) -> bool:
    return bool(getattr(hf_config, "tie_word_embeddings", False))


def transformer_config_from_hf(hf_config, *, params_dtype: torch.dtype = torch.float32, **overrides):
    """megatron ``TransformerConfig`` equivalent to an HF config of a supported family.

    Fixed choices: ``use_cpu_initialization=True``, ``normalization="RMSNorm"`` (eps = ``rms_norm_eps``),
    ``gated_linear_unit=True`` + ``activation_func=F.silu`` (SwiGLU), ``qk_layernorm`` and ``add_qkv_bias``
    from the family, ``add_bias_linear=False``, ``kv_channels=head_dim``, ``num_query_groups=num_key_value_heads``,
    hidden dropout 0, attention dropout from the config, all fusions off (plain PyTorch kernels).
    ``overrides`` are passed on to ``TransformerConfig`` (e.g. ``recompute_granularity``).

    Raises:
        ConversionError: unsupported config (see :func:`check_supported`).
    """
    from megatron.core.transformer import TransformerConfig

    fam = family_of(hf_config)
    kw = dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=_head_dim(hf_config),
        layernorm_epsilon=float(hf_config.rms_norm_eps),
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        qk_layernorm=fam.qk_norm,
        add_bias_linear=False,
        add_qkv_bias=fam.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=float(getattr(hf_config, "attention_dropout", 0.0) or 0.0),
        init_method_std=float(getattr(hf_config, "initializer_range", 0.02)),
        use_cpu_initialization=True,
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        cross_entropy_loss_fusion=False,
    )
    kw.update(overrides)
    return TransformerConfig(**kw)


def build_gpt_model(hf_config, *, params_dtype: torch.dtype = torch.float32, vocab_size: int | None = None,
                    pre_process: bool = True, post_process: bool = True, **config_overrides):
    """A randomly initialised megatron ``GPTModel`` with the architecture of ``hf_config``.

    ``vocab_size`` (default ``hf_config.vocab_size``) is the model's (padded) vocabulary; under tensor
    parallel it must be a multiple of the TP size (:func:`areal_cli.trainer.parallel_shard.padded_vocab_size`).
    With TP > 1 the parameters are this rank's shards (megatron's column/row-parallel linears and
    vocab-parallel embedding/output layer). Under pipeline parallel, ``pre_process`` (first stage: the
    embedding) / ``post_process`` (last stage: final norm + output layer) select the stage's parts and
    megatron builds only this stage's decoder layers (named ``decoder.layers.<local index>``, see
    :func:`global_param_names`).

    Layer spec: ``get_gpt_layer_local_spec(qk_layernorm=<family>, normalization="RMSNorm")`` with its core
    attention computed by PyTorch's fused kernel (:class:`~areal_cli.trainer.sdpa_attention.SdpaDotProductAttention`,
    the same function as megatron's ``DotProductAttention``; a PPO step on long packed rows 1.5-1.7x faster,
    ``benchmarks/trainer_attention.py``); RoPE with the
    HF model's inverse frequencies (default or Llama-3 scaled); output layer shared with the embedding iff
    ``tie_word_embeddings``. Requires
    megatron ``parallel_state`` to be initialised (see ``cpu_compat.setup_megatron``). Parameter count
    equals the HF model's.
    """
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from areal_cli.models.families import rope_inv_freq

    from areal_cli.trainer.sdpa_attention import SdpaDotProductAttention

    cfg = transformer_config_from_hf(hf_config, params_dtype=params_dtype, **config_overrides)
    spec = get_gpt_layer_local_spec(qk_layernorm=family_of(hf_config).qk_norm, normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = SdpaDotProductAttention
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=spec,
        vocab_size=int(vocab_size or hf_config.vocab_size),
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=tied_embeddings(hf_config),
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=rope_theta_of(hf_config),
        parallel_output=True,
    )
    rotary = getattr(model, "rotary_pos_emb", None)
    if rotary is not None:  # the HF model's exact frequencies (Llama-3 scaling is not megatron's fixed variant)
        rotary.inv_freq = rope_inv_freq(hf_config).to(rotary.inv_freq.device)
    return model


# ---------------------------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------------------------


def _expanded_rules(hf_config):
    """Yield ``(hf_names, mcore_name, transform)`` for every concrete tensor of the model (the rules whose
    family switch is on)."""
    tied = tied_embeddings(hf_config)
    fam = family_of(hf_config)
    for r in RULES:
        if r.tied is not None and r.tied != tied:
            continue
        if r.when is not None and not getattr(fam, r.when):
            continue
        layers = range(hf_config.num_hidden_layers) if r.per_layer else [None]
        for i in layers:
            fmt = (lambda p: p.format(i=i)) if r.per_layer else (lambda p: p)
            yield tuple(fmt(p) for p in r.hf), fmt(r.mcore), r.transform


def _check_names(given: set[str], expected: set[str], side: str) -> None:
    missing = sorted(expected - given)
    extra = sorted(given - expected)
    if missing or extra:
        raise ConversionError(f"{side} state dict mismatch: missing {missing[:5]}, unexpected {extra[:5]}")


_IGNORED_HF = re.compile(r".*rotary_emb\.inv_freq$")


def hf_to_mcore(hf_state: Mapping[str, Tensor], hf_config) -> dict[str, Tensor]:
    """Convert an HF state dict (a supported family) to megatron-core GPTModel parameter names/layouts.

    Args:
        hf_state: ``{hf_name: tensor}`` as in ``model.safetensors`` (``lm_head.weight`` may be absent or
            present-and-equal when embeddings are tied; it is then ignored).
    Returns:
        ``{mcore_name: tensor}`` without ``_extra_state`` entries (new tensors for fused rules; copies
        share storage with the input for ``copy`` rules).
    Raises:
        ConversionError: missing or unexpected names.
    """
    d = _dims(hf_config)
    names = {k for k in hf_state if not _IGNORED_HF.match(k)}
    if tied_embeddings(hf_config):
        names.discard("lm_head.weight")
    expected: set[str] = set()
    out: dict[str, Tensor] = {}
    for hf_names, mname, tr in _expanded_rules(hf_config):
        expected.update(hf_names)
        if all(n in hf_state for n in hf_names):
            out[mname] = TRANSFORMS[tr][0]([hf_state[n] for n in hf_names], d)
    _check_names(names, expected, "HF")
    return out


def mcore_to_hf(mcore_state: Mapping[str, Tensor], hf_config) -> dict[str, Tensor]:
    """Convert megatron-core GPTModel parameters to HF names/layouts (inverse of :func:`hf_to_mcore`).

    ``_extra_state`` keys are ignored. With tied embeddings no ``lm_head.weight`` is emitted (HF ties it).
    Returns ``{hf_name: tensor}`` (contiguous). Raises :class:`ConversionError` on missing/extra names.
    """
    d = _dims(hf_config)
    names = {k for k in mcore_state if not k.endswith("._extra_state")}
    expected: set[str] = set()
    out: dict[str, Tensor] = {}
    for hf_names, mname, tr in _expanded_rules(hf_config):
        expected.add(mname)
        if mname in mcore_state:
            for n, t in zip(hf_names, TRANSFORMS[tr][1](mcore_state[mname], d)):
                out[n] = t
    _check_names(names, expected, "mcore")
    return out


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")


def global_param_names(model: torch.nn.Module) -> dict[str, str]:
    """``{local parameter name: whole-model name}`` of a (pipeline stage of a) GPTModel: a stage's
    ``decoder.layers.<j>.`` is global layer ``layers[j].layer_number - 1`` (megatron numbers layers from 1
    over the whole model); other names are unchanged. Identity without pipeline parallel."""
    layers = model.decoder.layers
    out = {}
    for n, _ in model.named_parameters():
        m = _LAYER.match(n)
        out[n] = f"decoder.layers.{layers[int(m.group(1))].layer_number - 1}.{m.group(2)}" if m else n
    return out


def mcore_param_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """``{name: detached parameter}`` of a GPTModel (no ``_extra_state``, no buffers)."""
    return {n: p.detach() for n, p in model.named_parameters()}


def load_hf_into_model(model: torch.nn.Module, hf_state: Mapping[str, Tensor], hf_config, *,
                       tp_rank: int = 0, tp_size: int = 1, stage: bool = False) -> None:
    """Copy HF weights into an existing GPTModel in place (parameters keep their identity, so an optimizer
    holding them stays valid).

    With ``tp_size > 1`` the model holds TP rank ``tp_rank``'s shards: each converted tensor is padded on
    the vocabulary (embedding / output layer, zero rows up to the model's vocabulary) and cut with
    :func:`areal_cli.trainer.parallel_shard.shard` according to the parameter's megatron attributes.
    ``stage=True``: the model is one pipeline stage; its parameters are matched by whole-model name
    (:func:`global_param_names`) and the rest of the converted tensors is ignored.
    Raises:
        ConversionError: name mismatch, or a shape that differs from the model's parameter.
    """
    from areal_cli.trainer import parallel_shard as psh

    conv = hf_to_mcore(hf_state, hf_config)
    gname = global_param_names(model)
    params = {gname[n]: p for n, p in model.named_parameters()}
    if stage:
        _check_names(set(conv) & set(params), set(params), "converted")
    else:
        _check_names(set(conv), set(params), "converted")
    with torch.no_grad():
        for n, p in params.items():
            src = conv[n]
            full_rows = p.shape[0] * (tp_size if psh.is_tp_sharded(p) else 1)
            if n in psh.VOCAB_PARAMS and src.shape[0] < full_rows:
                src = psh.pad_vocab(src, full_rows)
            if psh.is_tp_sharded(p) and tp_size > 1:
                try:
                    src = psh.shard(src, dim=p.partition_dim, stride=p.partition_stride, tp=tp_size, rank=tp_rank)
                except ValueError as e:
                    raise ConversionError(f"{n}: {e}") from None
            if tuple(src.shape) != tuple(p.shape):
                raise ConversionError(f"{n}: shape {tuple(src.shape)} != model {tuple(p.shape)}")
            p.copy_(src.to(dtype=p.dtype, device=p.device))

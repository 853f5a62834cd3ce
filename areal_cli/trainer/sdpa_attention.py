"""Core attention of the trainer's GPTModel through ``torch.nn.functional.scaled_dot_product_attention``.

Megatron-core's local spec computes attention with :class:`megatron.core.transformer.dot_product_attention.
DotProductAttention`: ``baddbmm`` into a [b*np, sq, sk] buffer, an **in-place** ``masked_fill_`` on a view of it
(megatron's ``attention_mask_func``), softmax, ``bmm``. On the CPU that path dominates a training step on
long packed rows: the in-place fill on a view makes autograd copy and re-stride the whole score tensor in
the backward pass (``CopySlices`` / ``AsStridedBackward``). Measured on a tiny-longtail batch (64 samples,
3.8k tokens packed into rows of 306, hidden 128, 2 layers, one core): a PPO step took 0.35 s, about three
quarters of it attention; ``benchmarks/results/trainer_attention.md`` has the figures with this module.

:class:`SdpaDotProductAttention` is a drop-in subclass (same constructor, parameters and state dict) whose
forward hands the same computation to PyTorch's fused kernel (flash attention on the CPU; on CUDA a
memory-efficient kernel, as its flash kernel takes no mask): ``softmax(q k^T * scale + mask) v`` with the boolean mask megatron gets (True = masked out), grouped-query
heads via ``enable_gqa``. It computes the same function as megatron's (logits agree to float rounding,
``tests/test_sdpa_attention.py``); megatron fills masked scores with -10000 rather than -inf, which differs
only for a query that may see no key at all -- such masks are handed to megatron's own forward, as are the
features the fused call does not cover (softmax offsets, sliding windows, query-key layer scaling, attention
dropout while training).

Tried and measured (``benchmarks/trainer_attention.py``, a real tiny-longtail block and a block with 250-token
answers): running packed rows run by run (the runs of one length gathered into one causal fused call, sum of run
length^2 / 2 instead of rows x width^2) was no faster than the masked fused call on this CPU (per PPO step: 2%
faster, 5% and 5% slower in three side-by-side runs); the gathers and the extra calls cost what the skipped scores
saved.
"""

from __future__ import annotations

import weakref

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from torch import Tensor
from torch.nn import functional as F

__all__ = ["SdpaDotProductAttention"]

# the last mask checked (object and in-place version counter) and its verdict: every layer of one forward gets
# the same mask object, so the reduction (a host sync on CUDA) runs once per forward, not once per layer
_LAST_MASK: tuple[weakref.ref, int, bool] | None = None


def _every_query_sees_a_key(attention_mask: Tensor) -> bool:
    """Whether every query row of ``attention_mask`` (bool, True = masked out, [..., sq, sk]) keeps a key."""
    global _LAST_MASK
    if _LAST_MASK is not None and _LAST_MASK[0]() is attention_mask and _LAST_MASK[1] == attention_mask._version:
        return _LAST_MASK[2]
    ok = bool((~attention_mask).any(dim=-1).all())
    _LAST_MASK = (weakref.ref(attention_mask), attention_mask._version, ok)
    return ok


class SdpaDotProductAttention(DotProductAttention):
    """megatron ``DotProductAttention`` computed by ``scaled_dot_product_attention`` (module docstring).

    forward(query [sq, b, np, hn], key / value [sk, b, ng, hn], attention_mask: bool broadcastable to
    [b, 1, sq, sk] with True = masked out, or None) -> context [sq, b, np * hn] in the input dtype, where np
    / ng are this tensor-parallel rank's query heads / key-value groups. Falls back to megatron's forward for
    what the fused call does not express (module docstring); raises what megatron's forward raises.
    """

    def _fused_ok(self, query: Tensor, key: Tensor, attention_mask: Tensor | None, attention_bias,
                  packed_seq_params) -> bool:
        if attention_bias is not None or packed_seq_params is not None or self.softmax_offset is not None:
            return False
        if self.config.apply_query_key_layer_scaling or self.scale_mask_softmax.window_size is not None:
            return False
        if self.training and self.attention_dropout.p > 0:  # megatron forks its RNG tracker for dropout
            return False
        if attention_mask is None:  # megatron asserts self-attention for its own causal mask
            if self.attn_mask_type == AttnMaskType.causal and query.shape[0] != key.shape[0]:
                return False
            return self.attn_mask_type in (AttnMaskType.causal, AttnMaskType.no_mask, AttnMaskType.padding)
        # a query that sees no key: megatron's -10000 fill gives it uniform weights, the fused call NaN
        return attention_mask.dtype == torch.bool and _every_query_sees_a_key(attention_mask)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                attn_mask_type: AttnMaskType | None = None, attention_bias=None, packed_seq_params=None):
        """Attention context [sq, b, np * hn] (class docstring)."""
        if not self._fused_ok(query, key, attention_mask, attention_bias, packed_seq_params):
            return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                                   attention_bias=attention_bias, packed_seq_params=packed_seq_params)
        q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
        k = key.permute(1, 2, 0, 3)    # [b, ng, sk, hn]
        v = value.permute(1, 2, 0, 3)
        mask = None if attention_mask is None else ~attention_mask
        # as megatron: the module's own mask type decides (its forward ignores the per-call attn_mask_type)
        causal = attention_mask is None and self.attn_mask_type == AttnMaskType.causal and q.shape[2] > 1
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.softmax_scale,
                                                 enable_gqa=q.shape[1] != k.shape[1])
        sq, b = query.shape[0], query.shape[1]
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)


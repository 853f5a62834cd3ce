"""Core attention of the trainer's GPTModel through ``torch.nn.functional.scaled_dot_product_attention``.

Megatron-core's local spec computes attention with :class:`megatron.core.transformer.dot_product_attention.
DotProductAttention`: ``baddbmm`` into a [b*np, sq, sk] buffer, an **in-place** ``masked_fill_`` on a view of it
(megatron's ``attention_mask_func``), softmax, ``bmm``. On the CPU that path dominates a training step on
long packed rows: the in-place fill on a view makes autograd copy and re-stride the whole score tensor in
the backward pass (``CopySlices`` / ``AsStridedBackward``). Measured on a tiny-longtail batch (64 samples,
3.8k tokens packed into rows of 306, hidden 128, 2 layers, one core): a PPO step took 0.35 s, about three
quarters of it attention; ``benchmarks/README.md`` has the figures with this module.

:class:`SdpaDotProductAttention` is a drop-in subclass (same constructor, parameters and state dict) whose
forward hands the same computation to PyTorch's fused kernel (flash attention on the CPU; on CUDA a
memory-efficient kernel, as its flash kernel takes no mask): ``softmax(q k^T * scale + mask) v`` with the boolean mask megatron gets (True = masked out), grouped-query
heads via ``enable_gqa``. It computes the same function as megatron's (logits agree to float rounding,
``tests/test_sdpa_attention.py``); megatron fills masked scores with -10000 rather than -inf, which differs
only for a query that may see no key at all -- such masks are handed to megatron's own forward, as are the
features the fused call does not cover (softmax offsets, sliding windows, query-key layer scaling, attention
dropout while training).

Packed rows (:func:`areal_cli.trainer.micro_batches.pack_rows`) carry a block-diagonal causal mask: each run of
one sequence attends causally within itself. With the mask the fused call still computes every row's whole
width x width score matrix; such a mask is recognised (once per forward: every layer gets the same mask object)
and run run by run instead: the runs of one length (from every row) are gathered into one causal fused call, so
the work is sum(run length^2) / 2 rather than rows x width^2 (the plain causal mask of unpacked rows is one run
per row). ``benchmarks/trainer_attention.py`` measures the three (megatron, masked fused, run by run).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from torch import Tensor
from torch.nn import functional as F

__all__ = ["SdpaDotProductAttention"]


@dataclass(frozen=True)
class _Plan:
    """How to run one mask: ``ok`` (every query sees a key, else megatron's forward), and for a block-diagonal
    causal mask (packed rows: runs of one sequence each, attending causally within the run) the runs grouped by
    length: ``groups`` = ((n, length), ...) in the order of ``perm`` (LongTensor[sum n*length]: flat token index
    b*sq + t of every run's tokens, group by group), ``inv`` its inverse permutation; ``perm`` None for any other
    mask (the masked fused call)."""

    ok: bool
    perm: Tensor | None = None
    inv: Tensor | None = None
    groups: tuple[tuple[int, int], ...] = ()


def _runs_plan(mask: Tensor, b: int) -> _Plan:
    """:class:`_Plan` of a bool mask [b or 1, sq, sq] (True = masked out)."""
    if not bool((~mask).any(dim=-1).all()):
        return _Plan(ok=False)
    sq = mask.shape[-1]
    # a new run starts where a query may not see the key just before it
    starts = torch.ones(mask.shape[0], sq, dtype=torch.bool, device=mask.device)
    starts[:, 1:] = mask[:, torch.arange(1, sq), torch.arange(sq - 1)]
    run_id = starts.cumsum(-1)  # [rows, sq]
    causal = torch.ones(sq, sq, dtype=torch.bool, device=mask.device).tril()
    expected = ~((run_id[:, :, None] == run_id[:, None, :]) & causal)
    if not torch.equal(expected, mask):
        return _Plan(ok=True)
    rows = []  # (length, flat start) of every run
    for r, row_starts in enumerate(starts.cpu()):
        s = torch.nonzero(row_starts).flatten().tolist() + [sq]
        for i in range(len(s) - 1):
            rows.append((s[i + 1] - s[i], r * sq + s[i]))
    if mask.shape[0] == 1 and b > 1:  # one mask for every row
        rows = [(n, r * sq + st) for r in range(b) for n, st in rows]
    by_len: dict[int, list[int]] = {}
    for n, st in rows:
        by_len.setdefault(n, []).append(st)
    idx, groups = [], []
    for n, sts in sorted(by_len.items()):
        idx.append((torch.tensor(sts)[:, None] + torch.arange(n)[None, :]).flatten())
        groups.append((len(sts), n))
    perm = torch.cat(idx).to(mask.device)
    return _Plan(ok=True, perm=perm, inv=torch.argsort(perm), groups=tuple(groups))


# the last mask planned (object, in-place version counter, rows) and its plan: every layer of one forward gets the
# same mask object, so the analysis (host syncs on CUDA) runs once per forward, not once per layer
_LAST: tuple[weakref.ref, int, int, _Plan] | None = None


def _plan(attention_mask: Tensor, b: int) -> _Plan:
    global _LAST
    if _LAST is not None and _LAST[0]() is attention_mask and _LAST[1] == attention_mask._version and _LAST[2] == b:
        return _LAST[3]
    m = attention_mask
    if m.dim() == 4 and m.shape[1] == 1 and m.shape[0] in (1, b) and m.shape[-1] == m.shape[-2]:
        plan = _runs_plan(m[:, 0], b)
    elif m.dim() == 2 and m.shape[0] == m.shape[1]:
        plan = _runs_plan(m[None], b)
    else:
        plan = _Plan(ok=bool((~m).any(dim=-1).all()))
    _LAST = (weakref.ref(attention_mask), attention_mask._version, b, plan)
    return plan


class SdpaDotProductAttention(DotProductAttention):
    """megatron ``DotProductAttention`` computed by ``scaled_dot_product_attention`` (module docstring).

    forward(query [sq, b, np, hn], key / value [sk, b, ng, hn], attention_mask: bool broadcastable to
    [b, 1, sq, sk] with True = masked out, or None) -> context [sq, b, np * hn] in the input dtype, where np
    / ng are this tensor-parallel rank's query heads / key-value groups. Falls back to megatron's forward for
    what the fused call does not express (module docstring); raises what megatron's forward raises.
    """

    def _fused_plan(self, query: Tensor, key: Tensor, attention_mask: Tensor | None, attention_bias,
                    packed_seq_params) -> _Plan:
        no = _Plan(ok=False)
        if attention_bias is not None or packed_seq_params is not None or self.softmax_offset is not None:
            return no
        if self.config.apply_query_key_layer_scaling or self.scale_mask_softmax.window_size is not None:
            return no
        if self.training and self.attention_dropout.p > 0:  # megatron forks its RNG tracker for dropout
            return no
        if attention_mask is None:  # megatron asserts self-attention for its own causal mask
            if self.attn_mask_type == AttnMaskType.causal and query.shape[0] != key.shape[0]:
                return no
            return _Plan(ok=self.attn_mask_type in (AttnMaskType.causal, AttnMaskType.no_mask, AttnMaskType.padding))
        if attention_mask.dtype != torch.bool:
            return no
        plan = _plan(attention_mask, query.shape[1])
        # a query that sees no key (plan.ok False): megatron's -10000 fill gives it uniform weights, the fused call NaN
        if plan.perm is not None and query.shape[0] != key.shape[0]:
            return _Plan(ok=plan.ok)
        return plan

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                attn_mask_type: AttnMaskType | None = None, attention_bias=None, packed_seq_params=None):
        """Attention context [sq, b, np * hn] (class docstring)."""
        plan = self._fused_plan(query, key, attention_mask, attention_bias, packed_seq_params)
        if not plan.ok:
            return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                                   attention_bias=attention_bias, packed_seq_params=packed_seq_params)
        sq, b = query.shape[0], query.shape[1]
        gqa = query.shape[2] != key.shape[2]
        if plan.perm is not None:
            return self._runs_forward(query, key, value, plan, gqa)
        q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
        k = key.permute(1, 2, 0, 3)    # [b, ng, sk, hn]
        v = value.permute(1, 2, 0, 3)
        mask = None if attention_mask is None else ~attention_mask
        # as megatron: the module's own mask type decides (its forward ignores the per-call attn_mask_type)
        causal = attention_mask is None and self.attn_mask_type == AttnMaskType.causal and q.shape[2] > 1
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.softmax_scale,
                                                 enable_gqa=gqa)
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)

    def _runs_forward(self, query: Tensor, key: Tensor, value: Tensor, plan: _Plan, gqa: bool) -> Tensor:
        """Block-diagonal causal attention run by run: the runs of one length are stacked into one causal fused
        call, so the cost is sum(run length^2) / 2, not rows x row width^2 as with the mask."""
        sq, b = query.shape[0], query.shape[1]

        def tokens(t: Tensor) -> Tensor:  # [sq, b, heads, hn] -> [b * sq, heads, hn] in run order
            return t.transpose(0, 1).reshape(b * sq, t.shape[2], t.shape[3]).index_select(0, plan.perm)

        q, k, v = tokens(query), tokens(key), tokens(value)
        outs, off = [], 0
        for n, length in plan.groups:
            sl = slice(off, off + n * length)
            qg, kg, vg = (t[sl].view(n, length, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=length > 1, scale=self.softmax_scale,
                                               enable_gqa=gqa)  # [n, np, length, hn]
            outs.append(o.transpose(1, 2).reshape(n * length, self.hidden_size_per_partition))
            off += n * length
        context = torch.cat(outs).index_select(0, plan.inv)  # [b * sq, np * hn], token order b * sq + t
        return context.view(b, sq, -1).transpose(0, 1).contiguous()

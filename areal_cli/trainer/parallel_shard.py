"""Tensor-parallel sharding of full megatron-core weights, and its exact inverse (pure tensor functions).

megatron-core marks every tensor-parallel parameter with three attributes
(megatron/core/tensor_parallel/layers.py ``set_tensor_model_parallel_attributes``):
``tensor_model_parallel`` (True), ``partition_dim`` and ``partition_stride``. A full tensor ``W`` with
stride ``s`` is cut into ``s`` equal blocks along ``partition_dim``; each block is cut into ``tp`` equal
parts, and TP rank ``r`` holds ``cat(block_0[r], ..., block_{s-1}[r])``. For the Qwen3 GPTModel this gives:

- ``linear_qkv`` (column parallel, dim 0, stride 1): the fused weight is packed per query group
  (:mod:`areal_cli.trainer.hf_mcore`), so rank ``r`` holds the contiguous rows of query groups
  ``r*G/tp .. (r+1)*G/tp - 1`` -- its q heads with their k and v heads (``G`` = KV heads, ``G % tp == 0``);
- ``linear_fc1`` (column parallel, dim 0, stride 2): ``cat(gate, up)``, so rank ``r`` holds
  ``cat(gate[r], up[r])`` (what the gated MLP's ``chunk(fc1(x), 2)`` expects on each rank);
- ``linear_proj`` / ``linear_fc2`` (row parallel): dim 1 (the input dimension), stride 1;
- ``embedding.word_embeddings`` / ``output_layer``: dim 0 (vocabulary), stride 1, after padding the
  vocabulary to a multiple of ``tp`` with zero rows (:func:`pad_vocab`, :func:`padded_vocab_size`);
- norms (no attribute): replicated, every rank holds the full tensor.

:func:`shard` and :func:`unshard` are exact inverses (slices and concatenations only, bit for bit).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["VOCAB_PARAMS", "is_tp_sharded", "padded_vocab_size", "pad_vocab", "shard", "unshard"]

# megatron parameter names whose dim 0 is the (padded) vocabulary
VOCAB_PARAMS: tuple[str, ...] = ("embedding.word_embeddings.weight", "output_layer.weight")


def is_tp_sharded(param: Tensor) -> bool:
    """True when megatron marked ``param`` as split over tensor-parallel ranks."""
    return bool(getattr(param, "tensor_model_parallel", False))


def padded_vocab_size(vocab: int, tp: int) -> int:
    """Smallest multiple of ``tp`` >= ``vocab`` (megatron's VocabParallelEmbedding needs equal parts)."""
    return -(-int(vocab) // int(tp)) * int(tp)


def pad_vocab(t: Tensor, padded: int) -> Tensor:
    """``t`` [V, H] with ``padded - V`` zero rows appended (``t`` itself when no padding is needed).

    Raises:
        ValueError: ``padded < V``.
    """
    v = t.shape[0]
    if padded < v:
        raise ValueError(f"padded vocabulary {padded} < {v}")
    if padded == v:
        return t
    return torch.cat([t, t.new_zeros((padded - v, *t.shape[1:]))], dim=0)


def shard(full: Tensor, *, dim: int, stride: int, tp: int, rank: int) -> Tensor:
    """The part of ``full`` that TP rank ``rank`` of ``tp`` holds (see the module docstring); contiguous.

    Raises:
        ValueError: the size along ``dim`` is not divisible by ``stride * tp``, or ``rank`` out of range.
    """
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} not in [0, {tp})")
    n = full.shape[dim]
    if n % (stride * tp) != 0:
        raise ValueError(f"size {n} along dim {dim} not divisible by stride {stride} x tp {tp}")
    blocks = torch.chunk(full, stride, dim=dim)
    return torch.cat([torch.chunk(b, tp, dim=dim)[rank] for b in blocks], dim=dim).contiguous()


def unshard(parts: Sequence[Tensor], *, dim: int, stride: int) -> Tensor:
    """Inverse of :func:`shard`: ``parts[r]`` = rank r's tensor -> the full tensor (contiguous)."""
    per_rank = [torch.chunk(p, stride, dim=dim) for p in parts]
    return torch.cat([torch.cat([pr[s] for pr in per_rank], dim=dim) for s in range(stride)], dim=dim).contiguous()

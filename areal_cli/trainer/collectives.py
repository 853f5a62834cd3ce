"""The trainer engine's collectives over megatron's parallel groups (``parallel_state``): the data-parallel split
of rows and their all-gather, gradient all-reduces (DP; q/k norms over TP), the model-parallel gradient norm, and
the full weights gathered from TP shards and PP stages (semantics: :mod:`areal_cli.trainer.megatron_engine`)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from areal_cli.trainer import hf_mcore
from areal_cli.trainer import parallel_shard as psh


def dp_row_ranges(n_rows: int, dp: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` row ranges of ``dp`` data-parallel ranks over ``n_rows`` rows: near-equal
    sizes, the first ``n_rows % dp`` ranks one row more (``TrainBatch.split`` order; sizes may be 0)."""
    base, extra = divmod(int(n_rows), int(dp))
    out, start = [], 0
    for r in range(dp):
        size = base + (1 if r < extra else 0)
        out.append((start, start + size))
        start += size
    return out


def dp_size() -> int:
    """Size of megatron's data-parallel group."""
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_world_size()


def dp_group():
    """Megatron's data-parallel process group."""
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_group()


def allreduce_coalesced(tensors: list[Tensor], group) -> None:
    """Sum ``tensors`` over ``group`` in place with one all-reduce of their flattened concatenation."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    if not tensors:
        return
    flat = _flatten_dense_tensors(tensors)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    for t, synced in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
        t.copy_(synced)


def allreduce_dp_grads(params: list[Tensor]) -> None:
    """Sum gradients over the data-parallel group in one coalesced all-reduce (no-op for DP = 1)."""
    if dp_size() <= 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    allreduce_coalesced([p.grad for p in params], dp_group())


def allreduce_qk_norm_grads(model) -> None:
    """Sum the q/k RMSNorm gradients over the TP group: the norm weight is shared by all heads but each
    TP rank only back-propagates through its own heads (megatron finalize_model_grads.py,
    ``_allreduce_non_tensor_model_parallel_grads`` with ``qk_layernorm``)."""
    from megatron.core import parallel_state as ps

    grads = []
    for name, p in model.named_parameters():
        if "q_layernorm" in name or "k_layernorm" in name:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
    allreduce_coalesced(grads, ps.get_tensor_model_parallel_group())


def clip_grad_norm_model_parallel(model, max_norm: float, *, tp_rank: int, device: torch.device) -> float:
    """Global L2 norm under TP / PP: squares of TP-sharded gradients summed over the model-parallel group
    (TP x PP: every stage's own parameters), replicated ones (identical on every TP rank) counted once
    (TP rank 0's, megatron's ``param_is_not_tensor_parallel_duplicate``); float64 accumulation. Scales the
    gradients by ``max_norm / (norm + 1e-6)`` when that is < 1 (``clip_grad_norm_``'s rule). Returns the
    norm."""
    from megatron.core import parallel_state as ps

    sq = torch.zeros(1, dtype=torch.float64, device=device)
    grads = []
    for p in model.parameters():
        if p.grad is None:
            continue
        grads.append(p.grad)
        if psh.is_tp_sharded(p) or tp_rank == 0:
            sq += p.grad.detach().double().pow(2).sum()
    dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=ps.get_model_parallel_group())
    norm = float(sq.sqrt().item())
    coef = max_norm / (norm + 1e-6)
    if math.isfinite(norm) and coef < 1.0:
        for g in grads:
            g.mul_(torch.tensor(coef, dtype=g.dtype))
    return norm


def all_gather_dp_rows(local: Tensor, n_rows: int, dp: int) -> Tensor:
    """All-gather each DP rank's rows (sizes from :func:`dp_row_ranges`) into the full [n_rows, ...]."""
    ranges = dp_row_ranges(n_rows, dp)
    width = max(e - s for s, e in ranges)
    padded = local.new_zeros((width, *local.shape[1:]))
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(dp)]
    dist.all_gather(parts, padded.contiguous(), group=dp_group())
    return torch.cat([p[: e - s] for p, (s, e) in zip(parts, ranges)], dim=0)


def gather_tp_state(model, state: dict[str, Tensor], tp: int, vocab_size: int) -> dict[str, Tensor]:
    """Full tensors from this TP rank's ``state`` (mcore names): TP-sharded ones all-gathered and reassembled
    (:func:`parallel_shard.unshard`, vocabulary padding cut to ``vocab_size``), replicated ones broadcast from
    the TP source rank. Collective over the TP group."""
    from megatron.core import parallel_state as ps

    group = ps.get_tensor_model_parallel_group()
    params = dict(model.named_parameters())
    out: dict[str, Tensor] = {}
    for name, t in state.items():
        p = params[name]
        t = t.contiguous()
        if psh.is_tp_sharded(p):
            parts = [torch.empty_like(t) for _ in range(tp)]
            dist.all_gather(parts, t, group=group)
            full = psh.unshard(parts, dim=p.partition_dim, stride=p.partition_stride)
            if name in psh.VOCAB_PARAMS:
                full = full[: vocab_size]
        else:
            full = t.clone()
            dist.broadcast(full, src=ps.get_tensor_model_parallel_src_rank(), group=group)
        out[name] = full
    return out


def gather_pp_state(model, state: dict[str, Tensor], pp: int) -> dict[str, Tensor]:
    """Every stage's (TP-gathered) tensors under whole-model names, on every rank (object all-gather of
    CPU tensors over the PP group: pickled copies, bit exact)."""
    from megatron.core import parallel_state as ps

    gname = hf_mcore.global_param_names(model)
    mine = {gname[n]: t.detach().cpu() for n, t in state.items()}
    parts: list = [None] * pp
    dist.all_gather_object(parts, mine, group=ps.get_pipeline_model_parallel_group())
    out: dict[str, Tensor] = {}
    for p in parts:
        if out.keys() & p.keys():
            raise RuntimeError(f"pipeline stages share parameters {sorted(out.keys() & p.keys())[:3]}")
        out.update(p)
    return out


def sum_over_data_parallel(totals: dict[str, float]) -> None:
    """Sum the loss-function counters over data-parallel ranks, in place (no-op in one process).

    Each rank counts the rows its ``loss_fn`` saw: its share when the engine splits the batch, all of it when
    it does not; fractions ``n_x / n_tokens`` are the global ones either way."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    from megatron.core import parallel_state as ps

    if ps.get_data_parallel_world_size() == 1:
        return
    keys = sorted(totals)
    t = torch.tensor([totals[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t, group=ps.get_data_parallel_group())
    for k, v in zip(keys, t.tolist()):
        totals[k] = v

"""Micro-batches by token budget, with packing (AReaL ``MicroBatchSpec.max_tokens_per_mb``,
``split_padded_tensor_dict_into_mb_list``; realhf ``datapack.ffd_allocate``).

A training batch of real-length reasoning traces does not fit one forward pass. :func:`split_by_tokens`
assigns whole sequences to micro-batches of at most ``max_tokens`` real tokens with first-fit-decreasing
(:func:`ffd_allocate`), then **packs** each micro-batch (:func:`pack_rows`): its sequences are laid end to end
into rows as wide as its longest sequence (again first fit decreasing), so padding exists only at the end
of a row. A packed row carries ``segment_ids`` (k for its k-th sequence, -1 on padding) and per-sequence
``position_ids``; the engine attends with a block-diagonal causal mask (no attention across sequences) and
RoPE positions restart per sequence, so each token's logprob is the one it has alone (up to float rounding of
the larger rotation angles, ~1e-6; tests/test_micro_batches.py). A single sequence longer than the budget
is an error (AReaL raises too).

Width classes (:func:`width_classes`, ``ppo.pack_width_classes``): a packed row attends over its whole width (the
mask is dense), so a budget group holding one long trace and many short ones computes rows x width^2 scores where
the short ones need a fraction of that. With ``attention_cost`` > 0 each budget group is split, longest sequences
first, into classes packed at their own widths when the estimated cost (tokens + attention_cost x rows x width^2 +
``class_overhead`` per class, in units of one token's dense forward; :func:`attention_cost`) falls by at least
``min_gain`` of it. ``class_overhead`` stands for the fixed cost of one more forward and backward pass: without it
small budgets split to their loss (a fresh-clone review measured budget 64, lengths 50 x 20 + 7 x 44: 21 -> 41
micro-batches, a step 1.33x slower). On a tiny-longtail batch (the benchmark's block: 64 samples, 15-token prompts,
answers 6-210 tokens; the 13 longest go apart at width 225, the other 51 pack at width 75), one core,
``benchmarks/trainer_attention.py --repeats 20``: a PPO step's median 0.378 -> 0.313 s (1.21x; median of the
paired ratios 1.17x, 19 of 20 pairs faster; 1.02x and 1.11x in shorter runs: this machine's noise is of that order).

Losses are unchanged by the split: the decoupled PPO loss of a micro-batch is its token sum divided by the
number of loss tokens of the whole minibatch, and gradients accumulate over micro-batches before one
optimiser step (:meth:`areal_cli.trainer.megatron_engine.MegatronEngine.train_step`).
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING, Any, Sequence

from areal_cli.foundations.errors import UserError

if TYPE_CHECKING:  # pragma: no cover - torch is imported where tensors are built (ffd_allocate is pure)
    from areal_cli.trainer.batch import TrainBatch

_PER_TOKEN = ("loss_mask", "behaviour_logprobs", "versions", "advantages", "proximal_logprobs", "ref_logprobs",
              "values", "returns")


def ffd_allocate(values: Sequence[int], capacity: int, min_groups: int = 1) -> list[list[int]]:
    """Partition item indices into groups whose value sums are <= ``capacity`` (AReaL ``datapack.ffd_allocate``).

    Items in decreasing value (ties: lower index first); an item opens a new group while there are fewer
    than ``min_groups`` groups or when no group has room; otherwise it joins, among the groups with room, the
    one with the fewest items (ties: the smaller sum). Returns groups of indices in placement order.
    Raises:
        ValueError: a value > capacity, or fewer values than ``min_groups``.
    """
    if any(v > capacity for v in values):
        raise ValueError(f"a value exceeds the capacity {capacity}: max {max(values)}")
    if len(values) < min_groups:
        raise ValueError(f"{len(values)} values cannot fill min_groups={min_groups} groups")
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    groups: list[list[int]] = []
    by_sum: list[tuple[int, int]] = []  # (sum, group index), ascending
    for i in order:
        v = values[i]
        if len(groups) < min_groups or by_sum[0][0] + v > capacity:
            groups.append([i])
            bisect.insort(by_sum, (v, len(groups) - 1))
            continue
        n_fit = bisect.bisect_right(by_sum, (capacity - v, len(values)))
        j = min(range(n_fit), key=lambda k: len(groups[by_sum[k][1]]))
        s, g = by_sum.pop(j)
        groups[g].append(i)
        bisect.insort(by_sum, (s + v, g))
    return groups


def pack_rows(batch: "TrainBatch", rows: Sequence[int]) -> "TrainBatch":
    """The sequences ``rows`` of a right-padded ``batch`` packed end to end into rows of width W = their
    longest length (first fit decreasing), as a :class:`TrainBatch` with ``segment_ids`` and ``position_ids``.

    Per-token tensors (length W-1; position t is about token t+1) keep each sequence's values at its columns;
    the position where one sequence's last token would predict the next sequence's first token has loss mask
    0, logprobs 0 and version -1.
    """
    import torch

    from areal_cli.trainer.batch import TrainBatch

    lengths = [int(batch.lengths[r]) for r in rows]
    width = max(max(lengths), 2)
    placement = ffd_allocate(lengths, width)
    n_rows = len(placement)
    ids = torch.zeros((n_rows, width), dtype=torch.long)  # padding id: never attended to, never a target
    am = torch.zeros((n_rows, width), dtype=torch.bool)
    pos = torch.zeros((n_rows, width), dtype=torch.long)
    seg = torch.full((n_rows, width), -1, dtype=torch.long)
    per_token = {}
    for name in _PER_TOKEN:
        t = getattr(batch, name)
        if t is not None:
            per_token[name] = torch.full((n_rows, width - 1), -1 if name == "versions" else 0, dtype=t.dtype)
    for out_row, members in enumerate(placement):
        col = 0
        for k, j in enumerate(members):
            src, n = rows[j], lengths[j]
            ids[out_row, col: col + n] = batch.input_ids[src, :n]
            am[out_row, col: col + n] = True
            pos[out_row, col: col + n] = torch.arange(n)
            seg[out_row, col: col + n] = k
            for name, t in per_token.items():
                t[out_row, col: col + n - 1] = getattr(batch, name)[src, : n - 1]
            col += n
    return TrainBatch(input_ids=ids, attention_mask=am, position_ids=pos, segment_ids=seg, **per_token)


def attention_cost(hf_config: Any) -> float:
    """Forward cost of one attention score (all layers: q.k and the weighted sum of v, 4 x heads x head_dim FLOPs
    each) in units of one token's dense forward (2 FLOPs per weight of every matrix but the embedding lookup; the
    output layer counts): ``2 * heads * head_dim * layers / dense weights``, all read from the model's weight shapes
    (:func:`areal_cli.models.families.weight_shapes`; with tied embeddings the embedding matrix is the output layer).
    Backward passes scale both alike.

    Raises:
        UnsupportedModel: a config :func:`areal_cli.models.families.weight_shapes` does not know.
    """
    from areal_cli.models.families import weight_shapes

    shapes = weight_shapes(hf_config)
    tied = "lm_head.weight" not in shapes
    dense = sum(math.prod(v) for k, v in shapes.items()
                if len(v) == 2 and (tied or k != "model.embed_tokens.weight"))
    q_rows = [v[0] for k, v in shapes.items() if k.endswith("self_attn.q_proj.weight")]  # heads x head_dim per layer
    return 2.0 * sum(q_rows) / max(dense, 1)


#: Fixed cost of one more micro-batch (a forward and a backward pass) in token-equivalents (module docstring).
CLASS_OVERHEAD = 64.0


def _packed_cost(total: int, width: int, cost: float) -> float:
    # tokens + attention over rows of this width (rows estimated as total / width: FFD packs short sequences tightly)
    width = max(width, 1)
    return total + cost * math.ceil(total / width) * width * width


def width_classes(lengths: Sequence[int], cost: float, min_gain: float = 0.03, max_parts: int = 4,
                  class_overhead: float = CLASS_OVERHEAD) -> list[list[int]]:
    """Indices of ``lengths`` in classes of similar length, each to be packed at its own width (module docstring).

    Starting from one class, the split of a class (longest-first order, at the point that minimises its cost
    ``tokens + cost * rows * width^2``) that saves the most is taken while the saving, less ``class_overhead``, is
    >= ``min_gain`` of the whole estimated cost and there are fewer than ``max_parts`` classes. ``cost`` <= 0: one
    class. Classes come longest first, each in decreasing length; no lengths: no class.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if not order:
        return []
    parts = [order]
    if cost <= 0 or len(order) < 2:
        return parts

    def best_split(part: list[int]) -> tuple[float, int]:
        ls = [lengths[i] for i in part]
        total, run, best = sum(ls), 0, (0.0, 0)
        whole = _packed_cost(total, ls[0], cost)
        for k in range(1, len(ls)):
            run += ls[k - 1]
            saving = whole - _packed_cost(run, ls[0], cost) - _packed_cost(total - run, ls[k], cost)
            if saving > best[0]:
                best = (saving, k)
        return best

    overall = _packed_cost(sum(lengths), max(lengths), cost)
    while len(parts) < max_parts:
        (saving, k), j = max((best_split(p), j) for j, p in enumerate(parts))
        if k == 0 or saving - class_overhead < min_gain * overall:
            break
        parts[j:j + 1] = [parts[j][:k], parts[j][k:]]
    return parts


def split_by_tokens(batch: "TrainBatch", max_tokens: int, *, pack: bool = True,
                    attention_cost: float = 0.0) -> list["TrainBatch"]:
    """Micro-batches of ``batch`` with at most ``max_tokens`` real tokens each (first fit decreasing over the
    sequence lengths), packed (:func:`pack_rows`) or right-padded and trimmed (``pack=False``). Packed, a budget group
    is further split into :func:`width_classes` when ``attention_cost`` (:func:`attention_cost`) is > 0.

    Raises:
        UserError: a sequence longer than ``max_tokens`` (field ``ppo.max_tokens_per_mb``).
    """
    lengths = [int(x) for x in batch.lengths]
    if max(lengths) > max_tokens:
        raise UserError(f"field 'ppo.max_tokens_per_mb': a sequence of {max(lengths)} tokens (prompt + response) does "
                        f"not fit a micro-batch of {max_tokens} tokens; set ppo.max_tokens_per_mb >= task.max_prompt_len + "
                        f"rollout.max_new_tokens")
    out = []
    for group in ffd_allocate(lengths, max_tokens):
        if not pack:
            out.append(batch.select(sorted(group)).trim())
            continue
        for cls in width_classes([lengths[i] for i in group], attention_cost):
            out.append(pack_rows(batch, sorted(group[i] for i in cls)))
    return out

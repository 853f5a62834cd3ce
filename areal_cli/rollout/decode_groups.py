"""Which running sequences share one attention call in a decode step.

The embedded engine (:mod:`areal_cli.rollout.engine`) gathers the keys and values of each decoding sequence into
a right-padded ``[n, L]`` block and runs one attention call on it, so a batch costs ``n x L_max`` key slots
however short most of its contexts are. Asynchronous rollout mixes fresh samples (a prompt and a few tokens)
with long-running ones (hundreds of tokens): there a single block reads mostly padding. Splitting the batch,
sorted by context length, into contiguous groups costs ``sum_g n_g x L_g`` slots plus one more call per group
and layer. :func:`decode_groups` chooses the splits greedily: it keeps making the split that saves most slots
while that saving exceeds ``min_saving`` (one extra call's cost, in key slots) and there are fewer than
``max_groups`` groups. (SGLang and vLLM avoid the padding altogether with paged attention kernels.)

Pure Python: the cluster simulator (:mod:`areal_cli.bench.sim`) models the engine's decode cost with the same
function (``decode_attention: grouped``).
"""

from __future__ import annotations

from typing import Sequence

#: Default ``min_saving``: a split must save more key slots than this (a guard against splits whose extra gather
#: and attention call per layer cost more than the padding they save; with the tiny Qwen3 of the CPU recipes the
#: decode step times on mixed batches were the same within noise for thresholds of 256-4,096: benchmarks/results/decode_groups.md).
MIN_SAVING = 1024
#: Default ``max_groups``.
MAX_GROUPS = 4


def decode_groups(lengths: Sequence[int], min_saving: int = MIN_SAVING,
                  max_groups: int = MAX_GROUPS) -> list[tuple[int, int]]:
    """Split a decode batch whose context lengths ``lengths`` are sorted ascending into contiguous groups.

    Args:
        lengths: key positions each sequence attends to (context + the new token), ascending.
        min_saving: a split is made only when it saves more than this many padded key slots.
        max_groups: at most this many groups (>= 1).
    Returns:
        ``[(start, end), ...]`` half-open index ranges covering ``0..len(lengths)`` in order; ``[]`` for an empty
        batch. Group ``(a, b)`` attends over ``lengths[b - 1]`` key slots per sequence.
    Raises:
        ValueError: ``lengths`` not ascending, or ``max_groups < 1``.
    """
    if max_groups < 1:
        raise ValueError(f"max_groups must be >= 1, got {max_groups}")
    n = len(lengths)
    if any(lengths[i] > lengths[i + 1] for i in range(n - 1)):
        raise ValueError("lengths must be sorted ascending")
    if n == 0:
        return []
    groups = [(0, n)]
    while len(groups) < max_groups:
        best_saving, best_group, best_split = min_saving, -1, -1
        for gi, (a, b) in enumerate(groups):
            top = lengths[b - 1]
            for i in range(a + 1, b):  # split into [a, i) and [i, b): the first part stops paying for `top`
                saving = (i - a) * (top - lengths[i - 1])
                if saving > best_saving:
                    best_saving, best_group, best_split = saving, gi, i
        if best_group < 0:
            break
        a, b = groups[best_group]
        groups[best_group:best_group + 1] = [(a, best_split), (best_split, b)]
    return groups


def padded_slots(lengths: Sequence[int], groups: Sequence[tuple[int, int]]) -> int:
    """Key slots the groups read: ``sum over groups of (end - start) x lengths[end - 1]``."""
    return sum((b - a) * lengths[b - 1] for a, b in groups)

"""TrainBatch: B right-padded sequences (prompt + response) with per-token training data.

Alignment convention (next-token prediction): a per-token tensor of length ``L-1`` at position ``t`` is
about the prediction of ``input_ids[:, t+1]`` from the prefix ``input_ids[:, :t+1]``. So for a sequence
with prompt length ``P`` and ``R`` response tokens (real length ``n = P + R``), positions
``t = P-1 .. n-2`` carry ``loss_mask = 1``, the behaviour logprob of response token ``t+1-P`` and its
policy version; every other position (prompt, padding) carries ``loss_mask = 0``,
``behaviour_logprobs = 0`` and ``versions = -1``.

Concatenated layout (a multi-turn / agent conversation as ONE sequence, AReaL's
``export_interactions(style="concat")``): a sample may carry a per-output-token loss mask; its zeros (tool
output, feedback and chat-template tokens between two assistant turns, which have logprob 0 and version -1)
are written as ``loss_mask = 0`` at their positions, so those tokens are read (attended to) but never trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

__all__ = ["TrainBatch", "build_train_batch"]

_PER_TOKEN = ("loss_mask", "behaviour_logprobs", "versions", "advantages", "proximal_logprobs", "ref_logprobs",
              "values", "returns")
_OPTIONAL = ("advantages", "proximal_logprobs", "ref_logprobs", "values", "returns")


@dataclass
class TrainBatch:
    """B sequences right-padded to length L (all tensors on the same device, batch-first).

    Attributes:
        input_ids: LongTensor[B, L], prompt + response, pad (any id) after the real tokens.
        attention_mask: BoolTensor[B, L], True on real tokens; each row is a prefix of Trues (right padding)
            with at least one True.
        loss_mask: FloatTensor[B, L-1], 1.0 where position t predicts a response token ``input_ids[:, t+1]``;
            0 elsewhere (prompt, padding). Must be 0 wherever ``attention_mask[:, t+1]`` is False.
        behaviour_logprobs: FloatTensor[B, L-1], logprob (nats) of token t+1 under the behaviour policy that
            generated it (0 where masked).
        versions: LongTensor[B, L-1], policy version that produced token t+1 (-1 for prompt/pad; -2 where an
            in-place weight update left the prefix's KV from older weights, :func:`~areal_cli.trainer.steps.kv_versions`).
        advantages: optional FloatTensor[B, L-1].
        proximal_logprobs: optional FloatTensor[B, L-1] (nats).
        position_ids, segment_ids: optional LongTensor[B, L], set together for **packed** rows (several
            sequences end to end, :mod:`areal_cli.trainer.micro_batches`): ``segment_ids`` is k on the k-th
            sequence of a row and -1 on padding, ``position_ids`` restarts at 0 for each sequence. None: one
            sequence per row at positions 0..L-1.
        ref_logprobs: optional FloatTensor[B, L-1] (nats), log pi_ref of the frozen reference
            (``ppo.kl_ctl > 0``, :mod:`areal_cli.trainer.kl`).
        values, returns: optional FloatTensor[B, L-1], the critic's values before the update and the GAE returns
            (its regression target) at the loss positions (``critic.enabled``, :mod:`areal_cli.trainer.critic`).
    Raises (from ``__post_init__``/:meth:`validate`):
        ValueError: wrong dtype, shape, padding layout, or a loss mask on padding.
    """

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    behaviour_logprobs: Tensor
    versions: Tensor
    advantages: Tensor | None = None
    proximal_logprobs: Tensor | None = None
    position_ids: Tensor | None = None
    segment_ids: Tensor | None = None
    ref_logprobs: Tensor | None = None
    values: Tensor | None = None
    returns: Tensor | None = None

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ properties
    @property
    def batch_size(self) -> int:
        """B."""
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        """L (padded length)."""
        return int(self.input_ids.shape[1])

    @property
    def lengths(self) -> Tensor:
        """LongTensor[B]: real length of each sequence (number of True in ``attention_mask``)."""
        return self.attention_mask.sum(dim=1)

    @property
    def n_loss_tokens(self) -> int:
        """Number of positions with ``loss_mask > 0``."""
        return int((self.loss_mask > 0).sum().item())

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Check dtypes, shapes and the right-padding layout; raise ``ValueError`` naming the field."""
        ids, am = self.input_ids, self.attention_mask
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(f"input_ids must be a LongTensor[B, L], got {_desc(ids)}")
        b, length = ids.shape
        if b < 1 or length < 2:
            raise ValueError(f"input_ids must have B >= 1 and L >= 2, got shape {tuple(ids.shape)}")
        if not isinstance(am, Tensor) or am.dtype != torch.bool or tuple(am.shape) != (b, length):
            raise ValueError(f"attention_mask must be a BoolTensor[{b}, {length}], got {_desc(am)}")
        if not bool(am[:, 0].all()):
            raise ValueError("attention_mask: every sequence needs at least one real token at position 0")
        if length > 1 and bool((am[:, 1:] & ~am[:, :-1]).any()):
            raise ValueError("attention_mask: not right-padded (a real token follows a pad)")
        want = (b, length - 1)
        for name, dtypes in (
            ("loss_mask", (torch.float32, torch.float64, torch.float16, torch.bfloat16)),
            ("behaviour_logprobs", (torch.float32, torch.float64, torch.float16, torch.bfloat16)),
            ("versions", (torch.long,)),
            ("advantages", (torch.float32, torch.float64, torch.float16, torch.bfloat16)),
            ("proximal_logprobs", (torch.float32, torch.float64, torch.float16, torch.bfloat16)),
            ("ref_logprobs", (torch.float32, torch.float64, torch.float16, torch.bfloat16)),
            ("values", (torch.float32, torch.float64, torch.float16, torch.bfloat16)),
            ("returns", (torch.float32, torch.float64, torch.float16, torch.bfloat16)),
        ):
            t = getattr(self, name)
            if t is None and name in _OPTIONAL:
                continue
            if not isinstance(t, Tensor) or tuple(t.shape) != want or t.dtype not in dtypes:
                raise ValueError(f"{name} must be a {_kind(dtypes)}{list(want)}, got {_desc(t)}")
            if t.device != ids.device:
                raise ValueError(f"{name} is on {t.device}, input_ids on {ids.device}")
        if am.device != ids.device:
            raise ValueError(f"attention_mask is on {am.device}, input_ids on {ids.device}")
        if bool(((self.loss_mask != 0) & ~am[:, 1:]).any()):
            raise ValueError("loss_mask is non-zero on a position whose target token is padding")
        if (self.position_ids is None) != (self.segment_ids is None):
            raise ValueError("position_ids and segment_ids go together (packed rows)")
        if self.segment_ids is not None:
            for name in ("position_ids", "segment_ids"):
                t = getattr(self, name)
                if not isinstance(t, Tensor) or t.dtype != torch.long or tuple(t.shape) != (b, length):
                    raise ValueError(f"{name} must be a LongTensor[{b}, {length}], got {_desc(t)}")
            if bool(((self.segment_ids >= 0) != am).any()):
                raise ValueError("segment_ids must be >= 0 exactly on real tokens")
            same = self.segment_ids[:, 1:] == self.segment_ids[:, :-1]
            if bool(((self.loss_mask != 0) & ~same).any()):
                raise ValueError("loss_mask is non-zero on a position that predicts another sequence's token")

    @property
    def packed(self) -> bool:
        """True when rows hold several sequences (``segment_ids`` set)."""
        return self.segment_ids is not None

    def attention_bias_mask(self) -> Tensor:
        """Megatron's attention mask (True = masked): BoolTensor[B, 1, L, L] for packed rows (query i sees key j
        iff same sequence and j <= i); for unpacked rows the causal [1, 1, L, L]."""
        length = self.seq_len
        causal = torch.ones(length, length, dtype=torch.bool, device=self.input_ids.device).tril()
        if self.segment_ids is None:
            return ~causal[None, None]
        seg = self.segment_ids
        allowed = (seg[:, :, None] == seg[:, None, :]) & causal
        return ~allowed[:, None]

    def positions(self) -> Tensor:
        """LongTensor[B, L]: ``position_ids`` of packed rows, else 0..L-1 in every row."""
        if self.position_ids is not None:
            return self.position_ids
        b, length = self.input_ids.shape
        return torch.arange(length, device=self.input_ids.device).unsqueeze(0).expand(b, length)

    # ------------------------------------------------------------------ transforms
    def split(self, n_micro: int, *, trim: bool = False) -> list[TrainBatch]:
        """Split along the batch into ``n_micro`` contiguous micro-batches of near-equal size.

        The first ``B % n_micro`` micro-batches get one extra sequence (rows keep their order, so
        ``torch.cat`` of per-micro-batch results along dim 0 gives the full-batch layout). With ``trim``,
        each micro-batch is cut to its own longest sequence (:meth:`trim`) to save compute; this only
        drops padding, so logprobs at kept positions are unchanged (but shapes then differ per micro-batch).
        Raises:
            ValueError: ``n_micro < 1`` or ``n_micro > B``.
        """
        b = self.batch_size
        if not isinstance(n_micro, int) or n_micro < 1 or n_micro > b:
            raise ValueError(f"n_micro must be in [1, {b}], got {n_micro!r}")
        base, extra = divmod(b, n_micro)
        out, start = [], 0
        for i in range(n_micro):
            size = base + (1 if i < extra else 0)
            mb = self.select(slice(start, start + size))
            out.append(mb.trim() if trim else mb)
            start += size
        return out

    def select(self, index: slice | Tensor | Sequence[int]) -> TrainBatch:
        """Rows ``index`` of every tensor (a new TrainBatch, same L)."""
        kw = {f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[index])
              for f in fields(self)}
        return TrainBatch(**kw)

    def trim(self) -> TrainBatch:
        """Drop trailing all-padding columns (keeps L >= 2). Returns self when nothing to drop."""
        new_len = max(2, int(self.lengths.max().item()))
        if new_len == self.seq_len:
            return self
        kw = {}
        for f in fields(self):
            t = getattr(self, f.name)
            if t is None:
                kw[f.name] = None
            elif f.name in _PER_TOKEN:
                kw[f.name] = t[:, : new_len - 1]
            else:
                kw[f.name] = t[:, :new_len]
        return TrainBatch(**kw)

    def to(self, device: torch.device | str) -> TrainBatch:
        """All tensors moved to ``device``."""
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if getattr(self, f.name) is not None})


def _kind(dtypes) -> str:
    return "LongTensor" if dtypes == (torch.long,) else "FloatTensor"


def _desc(t) -> str:
    if isinstance(t, Tensor):
        return f"{t.dtype} tensor of shape {list(t.shape)}"
    return type(t).__name__


def build_train_batch(
    samples: Sequence[tuple],
    *,
    pad_id: int = 0,
    pad_to: int | None = None,
    advantages: Sequence[float | Sequence[float]] | None = None,
) -> TrainBatch:
    """Build a right-padded :class:`TrainBatch` from ``(prompt_ids, output_ids, behaviour_logprobs, versions)``
    or ``(prompt_ids, output_ids, behaviour_logprobs, versions, loss_mask)`` tuples.

    Args:
        samples: per sequence: prompt token ids (>= 1 token), output token ids, the behaviour logprob of each
            output token (nats, same length as output_ids) and the policy version of each output token;
            optionally a per-output-token loss mask (list of 0/1, same length, or None = all 1): 0 marks an
            environment/template token inside the response (concatenated layout), which must have logprob 0.0
            and version -1 (:func:`areal_cli.api.types.loss_mask_problem`).
        pad_id: token id written on padding positions (ignored by the model thanks to causal attention).
        pad_to: pad to this length L instead of the longest sequence (must be >= the longest).
        advantages: optional, per sequence either one scalar (broadcast over its response tokens) or one
            value per output token; placed like the behaviour logprobs (0 elsewhere).
    Returns:
        TrainBatch with L = max(prompt + output length) (or ``pad_to``), float32 per-token tensors.
    Raises:
        ValueError: empty batch, empty prompt, length mismatches (also of a loss mask), a masked token with a
            version other than -1 or a non-zero logprob, ``pad_to`` too small.
    """
    from areal_cli.api.types import loss_mask_problem

    if len(samples) == 0:
        raise ValueError("samples is empty")
    if advantages is not None and len(advantages) != len(samples):
        raise ValueError(f"advantages has {len(advantages)} entries for {len(samples)} samples")
    lens = []
    masks = []
    for j, sample in enumerate(samples):
        if len(sample) not in (4, 5):
            raise ValueError(f"sample {j}: expected (prompt_ids, output_ids, logprobs, versions[, loss_mask]), "
                             f"got {len(sample)} fields")
        p, o, lp, v = sample[:4]
        mask = sample[4] if len(sample) == 5 else None
        if len(p) < 1:
            raise ValueError(f"sample {j}: empty prompt")
        if len(lp) != len(o) or len(v) != len(o):
            raise ValueError(
                f"sample {j}: {len(o)} output ids but {len(lp)} logprobs and {len(v)} versions"
            )
        if mask is not None:
            why = loss_mask_problem(mask, lp, v)
            if why:
                raise ValueError(f"sample {j}: {why}")
        masks.append(mask)
        lens.append(len(p) + len(o))
    length = max(max(lens), 2)
    if pad_to is not None:
        if pad_to < length:
            raise ValueError(f"pad_to={pad_to} < longest sequence {length}")
        length = pad_to
    b = len(samples)
    ids = torch.full((b, length), int(pad_id), dtype=torch.long)
    am = torch.zeros((b, length), dtype=torch.bool)
    lm = torch.zeros((b, length - 1), dtype=torch.float32)
    blp = torch.zeros((b, length - 1), dtype=torch.float32)
    ver = torch.full((b, length - 1), -1, dtype=torch.long)
    adv = torch.zeros((b, length - 1), dtype=torch.float32) if advantages is not None else None
    for j, sample in enumerate(samples):
        p, o, lp, v = sample[:4]
        n_p, n = len(p), len(p) + len(o)
        ids[j, :n] = torch.tensor(list(p) + list(o), dtype=torch.long)
        am[j, :n] = True
        if len(o):
            if masks[j] is None:
                lm[j, n_p - 1 : n - 1] = 1.0
            else:
                lm[j, n_p - 1 : n - 1] = torch.tensor([float(m) for m in masks[j]], dtype=torch.float32)
            blp[j, n_p - 1 : n - 1] = torch.tensor([float(x) for x in lp], dtype=torch.float32)
            ver[j, n_p - 1 : n - 1] = torch.tensor([int(x) for x in v], dtype=torch.long)
            if adv is not None:
                a = advantages[j]
                if not hasattr(a, "__len__"):
                    adv[j, n_p - 1 : n - 1] = float(a) * lm[j, n_p - 1 : n - 1]  # 0 on masked tokens
                else:
                    if len(a) != len(o):
                        raise ValueError(f"sample {j}: {len(a)} advantages for {len(o)} output tokens")
                    adv[j, n_p - 1 : n - 1] = torch.tensor([float(x) for x in a], dtype=torch.float32) \
                        * lm[j, n_p - 1 : n - 1]
    return TrainBatch(input_ids=ids, attention_mask=am, loss_mask=lm, behaviour_logprobs=blp,
                      versions=ver, advantages=adv)

"""Supervised fine-tuning (SFT) with the Megatron-core trainer: one full stage, used by ``kind: sft`` recipes
(``boba-sft-32b``, via :meth:`SftConfig.from_spec`) and by the tiny recipe's warm start (via
:meth:`SftConfig.from_train_config`; the warm start adds its own stop rule on held-out accuracy).

What one step does (AReaL v0.2 ``sft`` experiment, ``realhf/impl/model/interface/sft_interface.py``):

1. take the next ``batch_size`` examples ``(prompt_ids, answer_ids)`` of a seeded epoch order (every epoch a
   new shuffle by ``random.Random(seed)``; the incomplete tail of an epoch is skipped);
2. split them into micro-batches of at most ``max_tokens_per_mb`` tokens with AReaL's first-fit-decreasing
   allocation (:func:`ffd_allocate`, ``realhf/base/datapack.py``);
3. **pack** each micro-batch (:func:`pack_sequences`): sequences are laid end to end into rows of
   ``pack_row_tokens`` tokens (again first fit decreasing), so padding exists only at the end of a row;
4. loss = mean negative log-likelihood over **response tokens only** (a position counts iff the token it
   predicts is an answer token; prompt tokens are never targets), normalised by the number of response
   tokens of the whole batch (AReaL's global token normalisation), gradients accumulated over micro-batches;
5. one AdamW step (global L2 clipping) with the learning rate of the schedule (:func:`lr_at`).

No attention across packed sequences. AReaL feeds 1-D packed tensors plus ``cu_seqlens`` to flash-attention
(varlen). Megatron-core's CPU path here is the "local" layer spec, whose ``DotProductAttention`` refuses
``packed_seq_params`` (it asserts ``packed_seq_params is None``) but takes any boolean attention mask. So a
packed row gets a **block-diagonal causal mask** ``[R, 1, W, W]`` (True = masked, megatron's convention):
query ``i`` may see key ``j`` iff both belong to the same sequence and ``j <= i``. Positions: the model uses
RoPE (no absolute position embedding), and RoPE scores depend only on the offset ``i - j`` inside a
sequence, so a sequence starting at column ``o`` of a row gets the same attention scores as at column 0
(float rounding of the larger rotation angles aside: ~1e-6 on logprobs, see tests/test_sft.py). The
per-sequence ``position_ids`` are still passed (and :attr:`PackedBatch.cu_seqlens` kept) so that an engine
with a THD / flash-attention path can use them unchanged. The cost of the dense mask is quadratic in the
row width, hence ``pack_row_tokens``: ``0`` (default) = rows as wide as the micro-batch's longest
sequence, which never costs more attention than right padding and packs short sequences into the gaps.

This module imports torch lazily (only the functions that build tensors need it).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from areal_cli.foundations.errors import UserError
from areal_cli.trainer.micro_batches import ffd_allocate

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

__all__ = ["SftConfig", "ffd_allocate", "pack_sequences", "PackedBatch", "packed_logprobs", "response_nll_sum",
           "lr_at", "SftStage", "run_sft", "load_prompt_answer_jsonl", "padded_tokens"]

LR_SCHEDULERS = ("constant", "linear", "cosine")


@dataclass
class SftConfig:
    """The SFT stage's own settings (names as AReaL's ``sft`` experiment).

    Attributes:
        lr: peak learning rate.
        batch_size: sequences per optimiser step (AReaL ``dataset.train_bs_n_seqs``).
        max_tokens_per_mb: token budget of one micro-batch (AReaL ``mb_spec.max_tokens_per_mb``).
        pack_row_tokens: width of a packed row; 0 = the longest sequence of the micro-batch.
        max_steps / epochs: length of the stage; ``max_steps`` wins when both are set.
        lr_scheduler, warmup_proportion: see :func:`lr_at`.
        weight_decay, adam_beta1, adam_beta2, adam_eps, grad_clip: AdamW and clipping (engine settings).
        max_seqlen: longer examples are truncated to this many tokens (prompt kept first), as AReaL does.
        seed: epoch shuffles.
    """

    lr: float
    batch_size: int
    max_tokens_per_mb: int
    pack_row_tokens: int = 0
    max_steps: int | None = None
    epochs: int | None = None
    lr_scheduler: str = "constant"
    warmup_proportion: float = 0.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    max_seqlen: int | None = None
    seed: int = 1

    def validate(self, source: str = "sft") -> None:
        """Raises: UserError ``source: field 'x': why (got v)``."""
        def bad(name: str, why: str) -> UserError:
            return UserError(f"{source}: field '{name}': {why} (got {getattr(self, name)!r})")

        for name in ("batch_size", "max_tokens_per_mb"):
            if getattr(self, name) <= 0:
                raise bad(name, "must be > 0")
        for name in ("lr", "adam_eps"):
            if not getattr(self, name) > 0:
                raise bad(name, "must be > 0")
        if self.pack_row_tokens < 0:
            raise bad("pack_row_tokens", "must be >= 0 (0: the longest sequence of the micro-batch)")
        if self.pack_row_tokens > self.max_tokens_per_mb:
            raise bad("pack_row_tokens", f"must be <= max_tokens_per_mb={self.max_tokens_per_mb}")
        if self.max_steps is None and self.epochs is None:
            raise bad("max_steps", "set max_steps or epochs")
        for name in ("max_steps", "epochs"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        if self.lr_scheduler not in LR_SCHEDULERS:
            raise bad("lr_scheduler", f"must be one of {', '.join(LR_SCHEDULERS)}")
        for name in ("warmup_proportion", "adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise bad(name, "must be in [0, 1]")
        if self.weight_decay < 0:
            raise bad("weight_decay", "must be >= 0")
        if self.max_seqlen is not None and self.max_seqlen < 2:
            raise bad("max_seqlen", "must be >= 2")

    @classmethod
    def from_spec(cls, spec: Any) -> "SftConfig":
        """From a locked recipe's ``sft`` section (:class:`areal_cli.recipes.SftSpec`, e.g. boba-sft-32b).

        ``pack_row_tokens`` = ``max_tokens_per_mb``: one packed row per micro-batch, AReaL's 1-D layout.
        dtype / loss-scale keys describe the GPU run and have no CPU counterpart (the engine trains in the
        dtype it was built with).
        """
        cfg = cls(lr=spec.lr, batch_size=spec.batch_size, max_tokens_per_mb=spec.max_tokens_per_mb,
                  pack_row_tokens=spec.max_tokens_per_mb, epochs=spec.epochs, lr_scheduler=spec.lr_scheduler,
                  warmup_proportion=spec.warmup_proportion, weight_decay=spec.weight_decay,
                  adam_beta1=spec.adam_beta1, adam_beta2=spec.adam_beta2, adam_eps=spec.adam_eps,
                  grad_clip=spec.grad_clip, max_seqlen=spec.max_seqlen, seed=spec.seed)
        cfg.validate("sft")
        return cfg

    @classmethod
    def from_train_config(cls, tc: Any) -> "SftConfig":
        """The warm start of an ``areal train`` recipe (:class:`areal_cli.config.TrainConfig` ``sft_*`` keys;
        AdamW betas, weight decay and clipping are the run's)."""
        cfg = cls(lr=tc.sft.lr, batch_size=tc.sft.batch_size, max_tokens_per_mb=tc.sft.max_tokens_per_mb,
                  pack_row_tokens=tc.sft.pack_row_tokens, max_steps=tc.sft.max_steps, weight_decay=tc.ppo.weight_decay,
                  adam_beta1=tc.ppo.adam_beta1, adam_beta2=tc.ppo.adam_beta2, grad_clip=tc.ppo.grad_clip, seed=tc.seed)
        cfg.validate("config")
        return cfg

    def engine_kwargs(self) -> dict:
        """Keyword arguments of :class:`areal_cli.trainer.megatron_engine.MegatronEngine` for this stage."""
        return {"lr": self.lr, "weight_decay": self.weight_decay, "betas": (self.adam_beta1, self.adam_beta2),
                "eps": self.adam_eps, "grad_clip": self.grad_clip, "seed": self.seed}

    def total_steps(self, n_examples: int) -> int:
        """Optimiser steps of the stage: ``max_steps``, else ``epochs * (n_examples // batch_size)``."""
        if self.max_steps is not None:
            return self.max_steps
        return int(self.epochs or 0) * (n_examples // self.batch_size)


# ---------------------------------------------------------------------------------------------------------
# micro-batches and packing
# ---------------------------------------------------------------------------------------------------------
@dataclass
class PackedBatch:
    """Sequences packed end to end into R rows of W tokens (padding only at the end of a row).

    Attributes:
        input_ids: LongTensor[R, W] (pad id after the last sequence of a row).
        position_ids: LongTensor[R, W], 0..n-1 inside each sequence, 0 on padding.
        segment_ids: LongTensor[R, W], k for the k-th sequence of the row, -1 on padding.
        loss_mask: FloatTensor[R, W-1], 1 where position t predicts a response token of its own sequence.
        cu_seqlens: per row, LongTensor[k+1] of cumulative sequence lengths (flash-attention varlen / THD).
        example_index: per row, the indices (into the packed list) of its sequences, in column order.
    """

    input_ids: "Tensor"
    position_ids: "Tensor"
    segment_ids: "Tensor"
    loss_mask: "Tensor"
    cu_seqlens: list = field(default_factory=list)
    example_index: list = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        """Real (non-padding) tokens."""
        return int((self.segment_ids >= 0).sum())

    @property
    def n_pad(self) -> int:
        """Padding tokens: R * W - real tokens."""
        return int(self.segment_ids.numel()) - self.n_tokens

    @property
    def n_loss_tokens(self) -> int:
        return int((self.loss_mask > 0).sum())

    def attention_mask(self) -> "Tensor":
        """BoolTensor[R, 1, W, W], True = masked: query i sees key j iff same segment and j <= i."""
        import torch

        seg = self.segment_ids
        w = seg.shape[1]
        causal = torch.ones(w, w, dtype=torch.bool, device=seg.device).tril()
        allowed = (seg[:, :, None] == seg[:, None, :]) & causal
        return ~allowed[:, None]


def pack_sequences(examples: Sequence[tuple[Sequence[int], Sequence[int]]], *, row_tokens: int = 0,
                   pad_id: int = 0) -> PackedBatch:
    """Pack ``(prompt_ids, answer_ids)`` pairs into rows (first fit decreasing by length, :func:`ffd_allocate`).

    Args:
        examples: each a prompt (>= 1 token) and its answer tokens.
        row_tokens: row width W; 0 = the longest sequence (so no row is wider than right padding would be).
    Raises:
        ValueError: empty input, an empty prompt, or a sequence longer than ``row_tokens``.
    """
    import torch

    if not examples:
        raise ValueError("no examples to pack")
    lengths = []
    for j, (p, a) in enumerate(examples):
        if len(p) < 1:
            raise ValueError(f"example {j}: empty prompt")
        lengths.append(len(p) + len(a))
    width = max(max(lengths), 2) if row_tokens == 0 else row_tokens
    if max(lengths) > width:
        raise ValueError(f"a sequence of {max(lengths)} tokens does not fit a row of {width}")
    rows = ffd_allocate(lengths, width)
    r = len(rows)
    ids = torch.full((r, width), int(pad_id), dtype=torch.long)
    pos = torch.zeros((r, width), dtype=torch.long)
    seg = torch.full((r, width), -1, dtype=torch.long)
    lm = torch.zeros((r, width - 1), dtype=torch.float32)
    cu = []
    for row, members in enumerate(rows):
        col, bounds = 0, [0]
        for k, j in enumerate(members):
            p, a = examples[j]
            n = len(p) + len(a)
            ids[row, col: col + n] = torch.tensor(list(p) + list(a), dtype=torch.long)
            pos[row, col: col + n] = torch.arange(n)
            seg[row, col: col + n] = k
            if len(a):  # position t predicts t+1: answer tokens are columns col+len(p) .. col+n-1
                lm[row, col + len(p) - 1: col + n - 1] = 1.0
            col += n
            bounds.append(col)
        cu.append(torch.tensor(bounds, dtype=torch.long))
    return PackedBatch(ids, pos, seg, lm, cu, rows)


def padded_tokens(examples: Sequence[tuple[Sequence[int], Sequence[int]]]) -> int:
    """Padding tokens if ``examples`` were right-padded into one row each (for comparison with packing)."""
    lengths = [len(p) + len(a) for p, a in examples]
    return len(lengths) * max(lengths) - sum(lengths)


def packed_logprobs(engine, pb: PackedBatch) -> "Tensor":
    """``lp[r, t] = log_softmax(logits[r, t])[input_ids[r, t+1]]`` (float32, nats) of a packed batch, with
    gradient when grad mode is on; FloatTensor[R, W-1] on the engine's device. Logits come from the engine's
    megatron GPTModel with the block-diagonal causal mask (no attention across sequences), through
    ``engine.token_logprobs`` (vocab parallel under tensor parallelism).
    """
    return engine.token_logprobs(pb.input_ids, pb.position_ids, pb.attention_mask())


def response_nll_sum(lp: "Tensor", loss_mask: "Tensor") -> "Tensor":
    """``-sum(lp * loss_mask)``: summed negative log-likelihood of the response tokens (a scalar)."""
    return -(lp * loss_mask.to(lp.device)).sum()


def lr_at(step: int, total: int, cfg: Any) -> float:
    """Learning rate of optimiser step ``step`` (0-based) of ``total`` (Megatron ``OptimizerParamScheduler``
    shape with min lr 0, as AReaL configures it): linear warmup over ``ceil(warmup_proportion * total)``
    steps from ``lr / W`` to ``lr``, then ``constant`` (lr), ``linear`` (to 0 at ``total``) or ``cosine``
    (``lr * (1 + cos(pi * progress)) / 2``). ``cfg``: an :class:`SftConfig` or the RL run's
    :class:`~areal_cli.config.sections.PPOSection` (``lr``, ``lr_scheduler``, ``warmup_proportion``)."""
    warm = math.ceil(cfg.warmup_proportion * total)
    if step < warm:
        return cfg.lr * (step + 1) / warm
    if cfg.lr_scheduler == "constant" or total <= warm:
        return cfg.lr
    progress = min(1.0, (step - warm) / (total - warm))
    if cfg.lr_scheduler == "linear":
        return cfg.lr * (1.0 - progress)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------------------------------------------------
# the stage
# ---------------------------------------------------------------------------------------------------------
class SftStage:
    """SFT of ``engine`` on ``examples``: one :meth:`step` = one optimiser step (see the module docstring).

    Args:
        engine: a :class:`~areal_cli.trainer.megatron_engine.MegatronEngine` (its ``model``, ``device``,
            ``optimizer``, ``optimizer_step`` and ``set_lr`` are used).
        examples: ``(prompt_ids, answer_ids)`` pairs (answer includes the eos token when it should be learnt).
        cfg: the stage's settings.
        pad_id: token id on padding.
    Raises:
        ValueError: fewer examples than ``batch_size``, or an example longer than ``max_tokens_per_mb``.
    """

    def __init__(self, engine, examples: Sequence[tuple[Sequence[int], Sequence[int]]], cfg: SftConfig,
                 *, pad_id: int = 0) -> None:
        if len(examples) < cfg.batch_size:
            raise ValueError(f"{len(examples)} examples, fewer than one batch of {cfg.batch_size}")
        if cfg.max_seqlen is not None:
            examples = [_truncate(p, a, cfg.max_seqlen) for p, a in examples]
        if any(len(p) < 1 for p, _ in examples):
            raise ValueError("an example has an empty prompt")
        longest = max(len(p) + len(a) for p, a in examples)
        if longest > cfg.max_tokens_per_mb:
            raise ValueError(f"an example of {longest} tokens exceeds max_tokens_per_mb={cfg.max_tokens_per_mb}")
        if cfg.pack_row_tokens and longest > cfg.pack_row_tokens:
            raise ValueError(f"an example of {longest} tokens exceeds pack_row_tokens={cfg.pack_row_tokens}")
        self.engine, self.examples, self.cfg, self.pad_id = engine, list(examples), cfg, pad_id
        self.total_steps = cfg.total_steps(len(self.examples))
        self.steps_per_epoch = len(self.examples) // cfg.batch_size
        self.step_count = 0
        self.epoch = 0
        self.cursor = 0  # next batch of the current epoch's order
        self._order = self._epoch_order(0)

    # --- data position ----------------------------------------------------------------------------
    def _epoch_order(self, epoch: int) -> list[int]:
        """The shuffled example order of ``epoch`` (replays the seeded shuffles 0..epoch)."""
        rng = random.Random(self.cfg.seed)
        order = list(range(len(self.examples)))
        for _ in range(epoch + 1):
            rng.shuffle(order)
        return order

    def next_batch(self) -> list[int]:
        """Indices of the next ``batch_size`` examples (advances the data position)."""
        if self.cursor >= self.steps_per_epoch:
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._epoch_order(self.epoch)
        b = self.cfg.batch_size
        idx = self._order[self.cursor * b: (self.cursor + 1) * b]
        self.cursor += 1
        return idx

    def state_dict(self) -> dict:
        """``{"step", "epoch", "cursor"}``: enough to continue with the same batches."""
        return {"step": self.step_count, "epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.step_count, self.epoch, self.cursor = int(state["step"]), int(state["epoch"]), int(state["cursor"])
        self._order = self._epoch_order(self.epoch)

    # --- one step ---------------------------------------------------------------------------------
    def micro_batches(self, indices: Sequence[int], min_groups: int = 1) -> list[PackedBatch]:
        """The packed micro-batches of a batch (:func:`ffd_allocate` on token counts, at least ``min_groups``
        of them when there are that many examples, then packing)."""
        exs = [self.examples[i] for i in indices]
        groups = ffd_allocate([len(p) + len(a) for p, a in exs], self.cfg.max_tokens_per_mb,
                              min(min_groups, len(exs)))
        return [pack_sequences([exs[i] for i in g], row_tokens=self.cfg.pack_row_tokens, pad_id=self.pad_id)
                for g in groups]

    def step(self) -> dict[str, float]:
        """One optimiser step on the next batch. Returns ``{"loss" (mean NLL per response token, nats),
        "grad_norm", "skipped", "lr", "n_micro", "n_tokens", "n_pad", "n_loss_tokens"}``.

        Data parallel (every rank calls it, the same batch everywhere): the micro-batches (at least one per
        rank) are dealt round-robin over the data-parallel ranks; ``optimizer_step`` sums the gradients, the
        loss is summed here -- the same step as in one process."""
        eng = self.engine
        dp_rank, dp_size, dp_group = _data_parallel()
        mbs = self.micro_batches(self.next_batch(), min_groups=dp_size)
        n_loss = max(sum(mb.n_loss_tokens for mb in mbs), 1)
        eng.set_lr(lr_at(self.step_count, max(self.total_steps, 1), self.cfg))
        eng.model.train()
        eng.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for mb in mbs[dp_rank::dp_size]:
            loss = response_nll_sum(packed_logprobs(eng, mb), mb.loss_mask) / n_loss
            loss.backward()
            total += float(loss.detach())
        if dp_size > 1:
            import torch
            import torch.distributed as dist

            t = torch.tensor([total], dtype=torch.float64)
            dist.all_reduce(t, group=dp_group)
            total = float(t.item())
        out = eng.optimizer_step()
        self.step_count += 1
        return {"loss": total, **out, "n_micro": float(len(mbs)), "n_tokens": float(sum(m.n_tokens for m in mbs)),
                "n_pad": float(sum(m.n_pad for m in mbs)), "n_loss_tokens": float(n_loss)}

    def run(self, on_step=None) -> list[dict]:
        """Steps until :attr:`total_steps`; ``on_step(step, stats)`` after each. Returns every step's stats."""
        out = []
        while self.step_count < self.total_steps:
            stats = self.step()
            out.append(stats)
            if on_step is not None:
                on_step(self.step_count, stats)
        return out

    def loss(self, indices: Sequence[int]) -> float:
        """Mean NLL per response token of ``examples[indices]`` under the current weights (no update)."""
        import torch

        mbs = self.micro_batches(indices)
        was = self.engine.model.training
        self.engine.model.eval()
        try:
            with torch.no_grad():
                s = sum(float(response_nll_sum(packed_logprobs(self.engine, mb), mb.loss_mask)) for mb in mbs)
        finally:
            self.engine.model.train(was)
        return s / max(sum(mb.n_loss_tokens for mb in mbs), 1)


def _data_parallel() -> tuple[int, int, object]:
    """``(rank, size, group)`` of this process's data-parallel group; ``(0, 1, None)`` in one process."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return 0, 1, None
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(), ps.get_data_parallel_group()


def run_sft(cfg: SftConfig, model_dir: str | Path, examples: Sequence[tuple[Sequence[int], Sequence[int]]],
            out_dir: str | Path, *, pad_id: int = 0, log=None) -> dict:
    """A whole SFT stage: a Megatron engine on ``model_dir`` with the stage's optimiser settings, every step of
    :class:`SftStage`, ``out_dir/sft_metrics.jsonl`` (one line per step) and the final weights in HF format
    at ``out_dir/weights/final``. Returns ``{"steps", "final_loss", "weights"}``.

    Raises:
        ValueError: see :class:`SftStage`. FileNotFoundError: no model in ``model_dir``.
    """
    from areal_cli.trainer.megatron_engine import MegatronEngine

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    engine = MegatronEngine(model_dir, **cfg.engine_kwargs())
    stage = SftStage(engine, examples, cfg, pad_id=pad_id)
    with open(out / "sft_metrics.jsonl", "w") as fh:
        def on_step(step: int, stats: dict) -> None:
            fh.write(json.dumps({"step": step, **{k: round(v, 6) for k, v in stats.items()}}) + "\n")
            fh.flush()
            if log is not None:
                log(f"sft step {step}/{stage.total_steps} loss {stats['loss']:.4f}")

        stats = stage.run(on_step)
    weights = engine.save_hf(out / "weights" / "final")
    return {"steps": stage.step_count, "final_loss": stats[-1]["loss"] if stats else None, "weights": str(weights)}


def _truncate(p: Sequence[int], a: Sequence[int], max_seqlen: int) -> tuple[list[int], list[int]]:
    """Cut ``prompt + answer`` to ``max_seqlen`` tokens from the end of the answer (prompt kept, >= 1 token)."""
    p, a = list(p)[: max_seqlen - 1], list(a)
    return p, a[: max(0, max_seqlen - len(p))]


def load_prompt_answer_jsonl(path: str | Path, tokenizer, *,
                             eos_token: str | None = None) -> list[tuple[list[int], list[int]]]:
    """Read AReaL's SFT format (one JSON object per line with string fields ``prompt`` and ``answer``, as in
    AReaL-boba-SFT-200.jsonl) into ``(prompt_ids, answer_ids + [eos])`` pairs.

    Raises:
        UserError: ``path:line: ...`` for an unreadable file, invalid JSON, or a missing / non-string field.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{p}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    eos = tokenizer.convert_tokens_to_ids(eos_token) if eos_token else tokenizer.eos_token_id
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{p}:{n}: invalid JSON: {e.msg}") from None
        if not isinstance(rec, dict):
            raise UserError(f"{p}:{n}: expected a JSON object")
        for key in ("prompt", "answer"):
            if not isinstance(rec.get(key), str) or (key == "prompt" and not rec[key]):
                raise UserError(f"{p}:{n}: field '{key}': missing or not a non-empty string")
        out.append((tokenizer.encode(rec["prompt"], add_special_tokens=False),
                    tokenizer.encode(rec["answer"], add_special_tokens=False) + [int(eos)]))
    if not out:
        raise UserError(f"{p}: no records")
    return out

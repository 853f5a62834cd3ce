"""MegatronEngine: a megatron-core GPTModel trained from / saved to a Hugging Face Qwen3 / Qwen2 / Llama directory.

One process (world size 1, gloo) on CPU, the same code on a GPU. The model is megatron-core's GPTModel with
the "local" layer spec (:mod:`areal_cli.trainer.hf_mcore`); CUDA assumptions of megatron-core are routed to
the CPU by :mod:`areal_cli.trainer.cpu_compat` when no GPU is present. Optimiser: ``torch.optim.AdamW``;
gradient clipping: ``torch.nn.utils.clip_grad_norm_`` (global L2 norm over all parameters).

Log-probabilities (the quantity every RL loss consumes)::

    logits = GPTModel(input_ids, position_ids = 0..L-1, causal mask)      # [B, L, V]
    lp[b, t] = log_softmax(logits[b, t] / T)[input_ids[b, t+1]]           # [B, L-1], nats

Sequences are right-padded, so with causal attention padding never influences a real position; positions
whose target ``input_ids[:, t+1]`` is padding are returned as 0 (and the loss masks them out anyway).

Parallelism (SPMD; launched by ``torchrun``, gloo on CPU / nccl on GPU): ``tensor_parallel`` (TP) and
``pipeline_parallel`` (PP) give a data-parallel size ``DP = world / (TP * PP)``. EVERY rank calls each
method with the SAME arguments (the full batch):

- weights are sharded for TP by megatron's column/row-parallel linears and vocab-parallel embedding /
  output layer (layouts in :mod:`areal_cli.trainer.parallel_shard`); the vocabulary is padded with zero
  rows to a multiple of TP, and padded entries get logit ``-inf`` (probability 0, no gradient);
- rows are split over DP ranks in contiguous near-equal chunks (``TrainBatch.split`` order; the first
  ``B % DP`` ranks get one extra row; a rank with 0 rows still joins every collective);
- under TP the log-softmax is vocab parallel: full logits are never gathered. Each TP rank holds
  ``logits[..., r*V/TP:(r+1)*V/TP]``; megatron's ``vocab_parallel_cross_entropy``
  (megatron/core/tensor_parallel/cross_entropy.py) all-reduces the row max (MAX) and the sum of
  ``exp(logit - max)`` (SUM) over the TP group, and the target logit (only the rank owning the target id
  contributes, SUM). ``lp = -cross_entropy`` with its exact softmax gradient;
- PP: each stage holds ``num_layers / PP`` decoder layers (first: + embedding, last: + final norm and
  output layer). Every micro-batch runs through megatron's ``get_forward_backward_func()``
  (``forward_backward_pipelining_without_interleaving``, one micro-batch per call since micro-batches
  may differ in shape: correct, but stages do not overlap -- padding micro-batches to one shape and
  passing ``num_microbatches > 1`` would be the next step for speed); logprobs / the loss are computed on
  the last stage and broadcast over the PP group. Tied embeddings are refused under PP (they would need
  megatron's embedding group all-reduce);
- ``logprobs`` all-gathers the rows over DP: every rank returns the full ``[B, L-1]`` tensor;
- ``train_step``: gradients summed over DP (one coalesced all-reduce), q/k-norm gradients summed over TP
  (each TP rank only sees its own heads, as megatron's finalize_model_grads does for ``qk_layernorm``),
  the global L2 norm counts TP-sharded parameters once per shard and replicated parameters once;
  the returned loss is summed over DP ranks.
- optimiser state (``self.optimizer``, torch AdamW over this rank's parameters) is per (TP rank, PP
  stage) and identical across DP replicas; a world-1 engine's ``optimizer.state_dict()`` is the whole.

Weights in HF format (``num_parameters``, ``hf_state_dict``, ``load_hf``, ``save_hf``) come from the base class
:class:`~areal_cli.trainer.hf_weights.HFWeights`.

``torch.set_num_threads`` is left to the caller. The constructor seeds torch's global RNG with ``seed``
(``torch.manual_seed`` + Megatron's RNG tracker): construction and training are deterministic per seed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

# megatron-core warns at import that the optional CUDA fusions (Transformer Engine, Apex) are absent, and
# about config defaults (cuda graph scope) the local CPU path never uses: keep the user's terminal clean.
warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron(\..*)?$")
from torch import Tensor

from areal_cli.foundations.errors import UserError
from areal_cli.trainer import cpu_compat, hf_mcore
from areal_cli.trainer import parallel_shard as psh
from areal_cli.trainer.batch import TrainBatch
from areal_cli.trainer.collectives import (all_gather_dp_rows, allreduce_dp_grads, allreduce_qk_norm_grads,
                                           clip_grad_norm_model_parallel, dp_group, dp_row_ranges, dp_size)
from areal_cli.trainer.hf_dir import load_hf_config
from areal_cli.trainer.hf_weights import HFWeights

__all__ = ["MegatronEngine"]


def _check_parallel_sizes(hf_config, tp: int, pp: int) -> None:
    if not (isinstance(tp, int) and tp >= 1 and isinstance(pp, int) and pp >= 1):
        raise UserError(f"MegatronEngine: tensor_parallel and pipeline_parallel must be integers >= 1, got {tp}, {pp}")
    if pp > 1 and int(hf_config.num_hidden_layers) % pp != 0:
        raise UserError(f"MegatronEngine: pipeline_parallel={pp} does not divide num_hidden_layers="
                        f"{hf_config.num_hidden_layers}")
    if pp > 1 and hf_mcore.tied_embeddings(hf_config):
        raise UserError("MegatronEngine: pipeline_parallel > 1 with tied embeddings (tie_word_embeddings) is not "
                        "supported")
    for field in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        if int(getattr(hf_config, field)) % tp != 0:
            raise UserError(f"MegatronEngine: tensor_parallel={tp} does not divide {field}="
                            f"{getattr(hf_config, field)}")


class MegatronEngine(HFWeights):
    """Trainer engine over a megatron-core GPTModel built from an HF model directory of a supported family
    (:mod:`areal_cli.models.families`).

    Args:
        hf_model_dir: HF directory (config.json + safetensors [+ tokenizer files]).
        lr: AdamW learning rate.
        weight_decay: AdamW decoupled weight decay, applied to matrices only (parameters with ``dim >= 2``);
            norm weights are not decayed (Megatron's default grouping).
        betas, eps: AdamW moments / epsilon.
        grad_clip: max global L2 norm of the gradient; ``<= 0`` or ``inf`` disables clipping (the norm is
            still reported).
        seed: seeds torch + Megatron's RNG tracker.
        params_dtype: parameter dtype (float32 default; logprobs are always computed in float32).
        device: default ``cuda`` when available, else ``cpu``.
        tensor_parallel: TP size (divides the heads, KV heads and MLP size).
        pipeline_parallel: PP size (divides the layer count; untied embeddings only).
    Raises:
        FileNotFoundError: missing config/weights. hf_mcore.ConversionError: unsupported architecture or
        weight names. UserError: TP / PP not dividing the model, PP with tied embeddings. RuntimeError: world
        size not a multiple of TP * PP, or megatron parallel_state already initialised with other sizes in
        this process.

    Distributed: initialises ``torch.distributed`` (gloo world of size 1 unless under torchrun) and
    megatron ``parallel_state`` if not done yet; DP = world / (TP * PP). SPMD: every rank calls every
    method with the same arguments (see the module docstring); results are identical on every rank.
    """

    def __init__(
        self,
        hf_model_dir: str | Path,
        *,
        lr: float,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        grad_clip: float = 1.0,
        seed: int = 0,
        params_dtype: torch.dtype = torch.float32,
        device: str | torch.device | None = None,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
    ) -> None:
        from megatron.core import parallel_state as ps

        self.model_dir = Path(hf_model_dir)
        self.hf_config = load_hf_config(self.model_dir)
        hf_mcore.check_supported(self.hf_config)
        self.seed = int(seed)
        self.grad_clip = float(grad_clip)
        _check_parallel_sizes(self.hf_config, tensor_parallel, pipeline_parallel)
        self.rank, self.world_size = cpu_compat.setup_megatron(
            tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel, seed=self.seed)
        self.tp, self.pp = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.dp, self.dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        self.is_first_stage = ps.is_pipeline_first_stage()
        self.is_last_stage = ps.is_pipeline_last_stage()
        self.padded_vocab_size = psh.padded_vocab_size(self.hf_config.vocab_size, self.tp)
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        )
        pp_kw = dict(tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=self.pp)
        if self.pp > 1:  # batch_p2p_sync would call torch.cuda.synchronize() (p2p_communication.py:398)
            pp_kw.update(pipeline_dtype=params_dtype, batch_p2p_sync=torch.cuda.is_available())
        self.model = hf_mcore.build_gpt_model(self.hf_config, params_dtype=params_dtype,
                                              vocab_size=self.padded_vocab_size, pre_process=self.is_first_stage,
                                              post_process=self.is_last_stage, **pp_kw).to(self.device)
        self.load_hf(self.model_dir)
        self.optimizer = self.build_optimizer(lr, weight_decay, betas, eps)
        self.steps = 0
        self._mask_cache: dict[tuple[int, torch.device], Tensor] = {}

    def build_optimizer(self, lr: float, weight_decay: float, betas: tuple[float, float],
                        eps: float) -> torch.optim.AdamW:
        """AdamW over ``self.model``'s parameters now: weight decay on matrices (``dim >= 2``) only, none on norm
        weights and biases (Megatron's default grouping)."""
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": float(weight_decay)},
                                  {"params": no_decay, "weight_decay": 0.0}],
                                 lr=float(lr), betas=tuple(betas), eps=float(eps))

    # ------------------------------------------------------------------ properties
    @property
    def vocab_size(self) -> int:
        """Vocabulary size V of the model."""
        return int(self.hf_config.vocab_size)

    @property
    def lr(self) -> float:
        """Current learning rate (of the first parameter group)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        """Set the learning rate of every parameter group (for schedules)."""
        for g in self.optimizer.param_groups:
            g["lr"] = float(lr)

    # ------------------------------------------------------------------ forward
    def _causal_mask(self, length: int) -> Tensor:
        key = (length, self.device)
        m = self._mask_cache.get(key)
        if m is None:
            # megatron convention: True = masked out; [1, 1, L, L] broadcasts over batch and heads
            m = torch.triu(torch.ones(length, length, dtype=torch.bool, device=self.device), diagonal=1)
            m = m[None, None]
            self._mask_cache = {key: m}
        return m

    def forward_logits(self, input_ids: Tensor) -> Tensor:
        """Raw logits of the GPTModel for right-padded ``input_ids`` [B, L] -> [B, L, V/TP] (model dtype).

        Positions are 0..L-1 for every row; attention is causal (padding after the real tokens never
        affects them). Under TP this is the rank's vocabulary slice ``[r*Vp/TP, (r+1)*Vp/TP)`` of the padded
        vocabulary ``Vp`` (full logits are never gathered); with TP = 1 it is the full ``[B, L, V]``.
        """
        if self.pp > 1:
            raise NotImplementedError("forward_logits is not available with pipeline_parallel > 1 (use logprobs)")
        ids = input_ids.to(self.device)
        b, length = ids.shape
        pos = torch.arange(length, device=self.device).unsqueeze(0).expand(b, length)
        return self.model(ids, pos, self._causal_mask(length))

    def token_logprobs(self, input_ids: Tensor, position_ids: Tensor, attention_mask: Tensor,
                       temperature: float = 1.0) -> Tensor:
        """``lp[b, t] = log_softmax(logits[b, t] / T)[input_ids[b, t+1]]`` for the given rows (no DP split),
        with gradient when grad mode is on; vocab parallel under TP (module docstring).

        Args:
            input_ids: LongTensor[B, L]; position_ids: LongTensor[B, L]; attention_mask: megatron bool mask
            (True = masked out) broadcastable to [B, 1, L, L]; temperature: T >= 0 (0 = no scaling).
        Returns:
            FloatTensor[B, L-1] (float32, nats) on the engine's device (padding targets NOT zeroed here).
        Raises:
            NotImplementedError: pipeline_parallel > 1 (the logits exist on the last stage only).
        """
        if self.pp > 1:
            raise NotImplementedError("token_logprobs is not available with pipeline_parallel > 1")
        ids = input_ids.to(self.device)
        logits = self.model(ids, position_ids.to(self.device), attention_mask.to(self.device))
        return self._lp_from_logits(logits, ids, temperature)

    def _lp_from_logits(self, logits: Tensor, ids: Tensor, temperature: float) -> Tensor:
        logits = logits[:, :-1].float()
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        targets = ids[:, 1:]
        if self.tp == 1:
            return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        part = logits.shape[-1]
        pad_from = self.vocab_size - self.tp_rank * part  # local index of the first padded vocabulary entry
        if pad_from < part:
            keep = torch.arange(part, device=logits.device) < pad_from
            logits = logits.masked_fill(~keep, float("-inf"))
        # megatron's function works in place on its input: hand it a contiguous copy/own tensor
        return -vocab_parallel_cross_entropy(logits.contiguous(), targets.contiguous())

    def _entropy_from_logits(self, logits: Tensor, temperature: float) -> Tensor:
        """Entropy (nats) of ``softmax(logits[:, t] / T)`` over the whole vocabulary: [B, L, V] -> [B, L-1]
        float32, with gradient (needs the full vocabulary on this rank: TP = 1)."""
        if self.tp > 1:
            raise NotImplementedError("the entropy needs tensor_parallel 1 (the vocabulary split over ranks)")
        z = logits[:, :-1].float()
        if temperature > 0 and temperature != 1.0:
            z = z / temperature
        logp = torch.log_softmax(z, dim=-1)
        return -(logp.exp() * logp).sum(dim=-1)

    def _logprobs(self, batch: TrainBatch, temperature: float, entropy: bool = False):
        """Masked logprobs [B, L-1] of ``batch`` (with grad when grad mode is on); with ``entropy`` also the
        per-position entropy [B, L-1] (0 where the target is padding)."""
        if not temperature >= 0 or math.isinf(temperature):
            raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
        if self.pp > 1:
            return self._pp_run(batch, temperature, None)
        ids = batch.input_ids.to(self.device)
        pos, mask = self._positions_and_mask(batch)
        real_target = batch.attention_mask[:, 1:].to(self.device)
        if not entropy:
            lp = self.token_logprobs(ids, pos, mask, temperature)
            return torch.where(real_target, lp, torch.zeros_like(lp))
        logits = self.model(ids, pos.to(self.device), mask.to(self.device))
        lp = self._lp_from_logits(logits, ids, temperature)
        ent = self._entropy_from_logits(logits, temperature)
        zero = torch.zeros_like(lp)
        return torch.where(real_target, lp, zero), torch.where(real_target, ent, zero)

    def _positions_and_mask(self, batch: TrainBatch) -> tuple[Tensor, Tensor]:
        """Position ids [B, L] and megatron attention mask of ``batch`` on the engine's device: 0..L-1 and the
        cached causal [1, 1, L, L], or for packed rows their per-sequence positions and block-diagonal causal
        mask [B, 1, L, L] (:meth:`TrainBatch.attention_bias_mask`)."""
        ids = batch.input_ids
        b, length = ids.shape
        if not batch.packed:
            pos = torch.arange(length, device=self.device).unsqueeze(0).expand(b, length)
            return pos, self._causal_mask(length)
        return batch.position_ids.to(self.device), batch.attention_bias_mask().to(self.device)

    def _pp_run(self, batch: TrainBatch, temperature: float, loss_fn, entropy: bool = False) -> Tensor:
        """One micro-batch through megatron's pipeline schedule. ``loss_fn is None``: forward only, returns
        the masked logprobs [B, L-1] on every stage (broadcast from the last). Otherwise forward + backward of
        ``loss_fn(lp, batch)`` (``loss_fn(lp, batch, entropy=...)`` with ``entropy``; computed on the last stage);
        returns the loss (scalar, float64) on every stage.
        """
        from megatron.core import parallel_state as ps
        from megatron.core.pipeline_parallel import get_forward_backward_func

        ids = batch.input_ids.to(self.device)
        b, length = ids.shape
        pos, mask = self._positions_and_mask(batch)
        real_target = batch.attention_mask[:, 1:].to(self.device)
        dev_batch = batch.to(self.device) if loss_fn is not None else batch

        def step(data_iterator, model):
            next(data_iterator)
            out = model(ids, pos, mask)
            if not self.is_last_stage:  # p2p sends raw memory: hidden states [s, b, h] must be contiguous
                out = out.contiguous()

            def post(logits):
                lp = self._lp_from_logits(logits, ids, temperature)
                lp = torch.where(real_target, lp, torch.zeros_like(lp))
                if loss_fn is None:
                    return lp.new_zeros(()), {"lp": lp.detach()}
                if entropy:
                    ent = self._entropy_from_logits(logits, temperature)
                    loss = loss_fn(lp, dev_batch, entropy=torch.where(real_target, ent, torch.zeros_like(ent)))
                else:
                    loss = loss_fn(lp, dev_batch)
                if not isinstance(loss, Tensor) or loss.dim() != 0:
                    raise ValueError("loss_fn must return a scalar tensor")
                return loss, {"loss": loss.detach().double()}

            return out, post

        store = get_forward_backward_func()(
            forward_step_func=step, data_iterator=iter([None]), model=[self.model], num_microbatches=1,
            seq_length=length, micro_batch_size=b, forward_only=loss_fn is None)
        key = "lp" if loss_fn is None else "loss"
        if self.is_last_stage:
            res = store[0][key].contiguous()
        else:
            res = (torch.zeros(b, length - 1, device=self.device) if loss_fn is None
                   else torch.zeros((), dtype=torch.float64, device=self.device))
        dist.broadcast(res, src=ps.get_pipeline_model_parallel_last_rank(),
                       group=ps.get_pipeline_model_parallel_group())
        return res

    def _dp_local(self, batch: TrainBatch) -> TrainBatch | None:
        """This data-parallel rank's contiguous rows of ``batch`` (the batch itself when DP = 1; None when
        the rank gets no rows, as a TrainBatch cannot be empty)."""
        if self.dp == 1:
            return batch
        start, end = dp_row_ranges(batch.batch_size, self.dp)[self.dp_rank]
        return batch.select(slice(start, end)) if end > start else None

    def logprobs(self, batch: TrainBatch, temperature: float = 1.0, *, n_micro: int = 1) -> Tensor:
        """Log-probabilities of the next tokens under the current weights, without gradient.

        ``lp[b, t] = log_softmax(logits[b, t] / T)[input_ids[b, t+1]]`` (T = 0 means no scaling, the greedy
        convention of the rollout servers). Collective when world > 1: each DP rank evaluates its rows
        (vocab parallel under TP) and the rows are all-gathered, so every rank returns the full result.
        Args:
            batch: the sequences (only ``input_ids`` and ``attention_mask`` are used); the same on all ranks.
            temperature: T >= 0.
            n_micro: evaluate (each rank's rows) in this many row chunks (bounds memory; result identical).
        Returns:
            FloatTensor[B, L-1] (float32, nats) on the CPU; 0 where the target token is padding.
        Raises:
            ValueError: negative/non-finite temperature.
        """
        if not temperature >= 0 or math.isinf(temperature):
            raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
        local = self._dp_local(batch)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                if local is None:
                    parts = [torch.zeros(0, batch.seq_len - 1, device=self.device)]
                else:
                    parts = [self._logprobs(mb, temperature)
                             for mb in local.split(min(max(int(n_micro), 1), local.batch_size))]
        finally:
            self.model.train(was_training)
        out = torch.cat(parts, dim=0)
        if self.dp > 1:
            out = all_gather_dp_rows(out, batch.batch_size, self.dp)
        return out.cpu()

    # ------------------------------------------------------------------ training
    def train_step(
        self,
        micro_batches: Sequence[TrainBatch],
        loss_fn: Callable[..., Tensor],
        *,
        temperature: float = 1.0,
        entropy: bool = False,
    ) -> dict[str, float]:
        """One optimiser step accumulated over ``micro_batches``: :meth:`forward_backward` then
        :meth:`optimizer_step`.

        For each micro-batch: ``lp = logprobs with grad`` [B_i, L_i-1] (on the engine's device, T-scaled as
        in :meth:`logprobs`), ``loss = loss_fn(lp, mb)`` (a scalar; it must already divide by the number of
        valid tokens of the whole global batch and apply ``mb.loss_mask``), ``loss.backward()``. Gradients
        are therefore summed over micro-batches (and over data-parallel ranks). With ``entropy`` the call is
        ``loss_fn(lp, mb, entropy=H)``, H [B_i, L_i-1] the entropy of the whole-vocabulary distribution at each
        position, with gradient (TP = 1 only). Then the global L2 norm is
        clipped to ``grad_clip``, AdamW steps and gradients are cleared. A non-finite gradient norm skips
        the update (``skipped = 1``), as Megatron does.

        Under DP each micro-batch's rows are split over the DP ranks (:func:`dp_row_ranges`); ``loss_fn`` sees
        this rank's rows only (a rank with 0 rows skips the forward but joins the reductions). All ranks
        pass the same ``micro_batches``; the results equal a single process's up to float summation order.

        Returns:
            ``{"loss": sum of the micro-batch losses (summed over data-parallel ranks), "grad_norm": global
            norm before clipping, "skipped": 0.0 or 1.0, "lr": learning rate used}`` (same on every rank).
        Raises:
            ValueError: no micro-batches, or ``loss_fn`` returned a non-scalar tensor.
        """
        loss = self.forward_backward(micro_batches, loss_fn, temperature=temperature, entropy=entropy)
        return {"loss": loss, **self.optimizer_step()}

    def forward_backward(
        self,
        micro_batches: Sequence[TrainBatch],
        loss_fn: Callable[..., Tensor],
        *,
        temperature: float = 1.0,
        entropy: bool = False,
    ) -> float:
        """Clear gradients, then accumulate ``d loss_fn(lp, mb) / d params`` over ``micro_batches`` into
        ``param.grad`` (see :meth:`train_step`; rows split over DP ranks). Returns the summed loss (over
        micro-batches and data-parallel ranks). Gradients stay in ``param.grad`` (not yet reduced over
        data-parallel ranks; :meth:`optimizer_step` does it).
        """
        if len(micro_batches) == 0:
            raise ValueError("train_step needs at least one micro-batch")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for mb in micro_batches:
            mb = self._dp_local(mb)
            if mb is None:
                continue
            if self.pp > 1:
                total += float(self._pp_run(mb, temperature, loss_fn, entropy).item())
                continue
            if entropy:
                lp, ent = self._logprobs(mb, temperature, entropy=True)
                loss = loss_fn(lp, mb.to(self.device), entropy=ent)
            else:
                lp = self._logprobs(mb, temperature)
                loss = loss_fn(lp, mb.to(self.device))
            if not isinstance(loss, Tensor) or loss.dim() != 0:
                raise ValueError("loss_fn must return a scalar tensor")
            loss.backward()
            total += float(loss.detach().item())
        loss_t = torch.tensor([total], dtype=torch.float64)
        if dp_size() > 1:
            dist.all_reduce(loss_t, group=dp_group())
        return float(loss_t.item())

    def optimizer_step(self) -> dict[str, float]:
        """Sum gradients over data-parallel ranks (and q/k-norm gradients over TP ranks), clip the global L2
        norm to ``grad_clip``, AdamW step (unless the norm is not finite), clear gradients.
        Returns ``{"grad_norm", "skipped", "lr"}``."""
        params = [p for p in self.model.parameters()]
        allreduce_dp_grads(params)
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf
        if self.tp == 1 and self.pp == 1:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        else:
            if self.tp > 1:
                allreduce_qk_norm_grads(self.model)
            grad_norm = clip_grad_norm_model_parallel(self.model, max_norm, tp_rank=self.tp_rank, device=self.device)
        skipped = not math.isfinite(grad_norm)
        lr = self.lr
        if not skipped:
            self.optimizer.step()
            self.steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, "skipped": float(skipped), "lr": lr}

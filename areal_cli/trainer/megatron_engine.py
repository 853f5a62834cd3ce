"""MegatronEngine: a megatron-core GPTModel trained from / saved to a Hugging Face Qwen3 directory.

One process (world size 1, gloo) on CPU, the same code on a GPU. The model is megatron-core's GPTModel with
the "local" layer spec (:mod:`areal_cli.trainer.hf_mcore`); CUDA assumptions of megatron-core are routed to
the CPU by :mod:`areal_cli.trainer.cpu_compat` when no GPU is present. Optimiser: ``torch.optim.AdamW``;
gradient clipping: ``torch.nn.utils.clip_grad_norm_`` (global L2 norm over all parameters).

Log-probabilities (the quantity every RL loss consumes)::

    logits = GPTModel(input_ids, position_ids = 0..L-1, causal mask)      # [B, L, V]
    lp[b, t] = log_softmax(logits[b, t] / T)[input_ids[b, t+1]]           # [B, L-1], nats

Sequences are right-padded, so with causal attention padding never influences a real position; positions
whose target ``input_ids[:, t+1]`` is padding are returned as 0 (and the loss masks them out anyway).

``torch.set_num_threads`` is left to the caller. The constructor seeds torch's global RNG with ``seed``
(``torch.manual_seed`` + Megatron's RNG tracker): construction and training are deterministic per seed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

# megatron-core warns at import that the optional CUDA fusions (Transformer Engine, Apex) are absent, and
# about config defaults (cuda graph scope) the local CPU path never uses: keep the user's terminal clean.
warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron(\..*)?$")
from safetensors.torch import load_file, save_file
from torch import Tensor

from areal_cli.trainer import cpu_compat, hf_mcore
from areal_cli.trainer.batch import TrainBatch

__all__ = ["MegatronEngine", "HF_AUX_FILES", "read_hf_state_dict"]

# Files copied verbatim from the source model directory by save_hf (when present).
HF_AUX_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "generation_config.json",
)


def read_hf_state_dict(model_dir: str | Path) -> dict[str, Tensor]:
    """Read the weights of an HF model directory (``model.safetensors`` or a sharded
    ``model.safetensors.index.json``) onto the CPU.

    Raises:
        FileNotFoundError: neither file exists.
    """
    d = Path(model_dir)
    single = d / "model.safetensors"
    index = d / "model.safetensors.index.json"
    if single.is_file():
        return load_file(str(single), device="cpu")
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        out: dict[str, Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            out.update(load_file(str(d / shard), device="cpu"))
        return out
    raise FileNotFoundError(f"{d}: no model.safetensors or model.safetensors.index.json")


def _load_hf_config(model_dir: Path):
    from transformers import AutoConfig

    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json")
    return AutoConfig.from_pretrained(str(model_dir))


class MegatronEngine:
    """Trainer engine over a megatron-core GPTModel built from an HF Qwen3 model directory.

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
    Raises:
        FileNotFoundError: missing config/weights. hf_mcore.ConversionError: unsupported architecture or
        weight names. NotImplementedError: megatron tensor/pipeline parallel size > 1 (not yet supported).

    Distributed: initialises ``torch.distributed`` (gloo world of size 1 unless under torchrun) and
    megatron ``parallel_state`` (TP = PP = 1) if not done yet. With a data-parallel world > 1 each rank
    trains on its own micro-batches and gradients are summed over the data-parallel group before clipping
    (so ``loss_fn`` must divide by the token count of the GLOBAL batch, as for gradient accumulation).
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
    ) -> None:
        from megatron.core import parallel_state as ps

        self.model_dir = Path(hf_model_dir)
        self.hf_config = _load_hf_config(self.model_dir)
        hf_mcore.check_supported(self.hf_config)
        self.seed = int(seed)
        self.grad_clip = float(grad_clip)
        self.rank, self.world_size = cpu_compat.setup_megatron(seed=self.seed)
        if ps.get_tensor_model_parallel_world_size() != 1 or ps.get_pipeline_model_parallel_world_size() != 1:
            raise RuntimeError("MegatronEngine runs with tensor and pipeline parallel size 1; "
                               f"got TP={ps.get_tensor_model_parallel_world_size()}, "
                               f"PP={ps.get_pipeline_model_parallel_world_size()}")
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        )
        self.model = hf_mcore.build_gpt_model(self.hf_config, params_dtype=params_dtype).to(self.device)
        self.load_hf(self.model_dir)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": float(weight_decay)},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=float(lr),
            betas=tuple(betas),
            eps=float(eps),
        )
        self.steps = 0
        self._mask_cache: dict[tuple[int, torch.device], Tensor] = {}

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

    def num_parameters(self) -> int:
        """Number of trainable parameters (equals the HF model's)."""
        return sum(p.numel() for p in self.model.parameters())

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
        """Raw logits of the GPTModel for right-padded ``input_ids`` [B, L] -> [B, L, V] (model dtype).

        Positions are 0..L-1 for every row; attention is causal (padding after the real tokens never
        affects them).
        """
        ids = input_ids.to(self.device)
        b, length = ids.shape
        pos = torch.arange(length, device=self.device).unsqueeze(0).expand(b, length)
        return self.model(ids, pos, self._causal_mask(length))

    def _logprobs(self, batch: TrainBatch, temperature: float) -> Tensor:
        if not temperature >= 0 or math.isinf(temperature):
            raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
        ids = batch.input_ids.to(self.device)
        logits = self.forward_logits(ids)[:, :-1].float()
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        real_target = batch.attention_mask[:, 1:].to(self.device)
        return torch.where(real_target, lp, torch.zeros_like(lp))

    def logprobs(self, batch: TrainBatch, temperature: float = 1.0, *, n_micro: int = 1) -> Tensor:
        """Log-probabilities of the next tokens under the current weights, without gradient.

        ``lp[b, t] = log_softmax(logits[b, t] / T)[input_ids[b, t+1]]`` (T = 0 means no scaling, the greedy
        convention of the rollout servers).
        Args:
            batch: the sequences (only ``input_ids`` and ``attention_mask`` are used).
            temperature: T >= 0.
            n_micro: evaluate in this many row chunks (bounds memory; result identical).
        Returns:
            FloatTensor[B, L-1] (float32, nats) on the CPU; 0 where the target token is padding.
        Raises:
            ValueError: negative/non-finite temperature.
        """
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                parts = [self._logprobs(mb, temperature) for mb in batch.split(n_micro)]
        finally:
            self.model.train(was_training)
        return torch.cat(parts, dim=0).cpu()

    # ------------------------------------------------------------------ training
    def train_step(
        self,
        micro_batches: Sequence[TrainBatch],
        loss_fn: Callable[[Tensor, TrainBatch], Tensor],
        *,
        temperature: float = 1.0,
    ) -> dict[str, float]:
        """One optimiser step accumulated over ``micro_batches``: :meth:`forward_backward` then
        :meth:`optimizer_step`.

        For each micro-batch: ``lp = logprobs with grad`` [B_i, L_i-1] (on the engine's device, T-scaled as
        in :meth:`logprobs`), ``loss = loss_fn(lp, mb)`` (a scalar; it must already divide by the number of
        valid tokens of the whole global batch and apply ``mb.loss_mask``), ``loss.backward()``. Gradients
        are therefore summed over micro-batches (and over data-parallel ranks). Then the global L2 norm is
        clipped to ``grad_clip``, AdamW steps and gradients are cleared. A non-finite gradient norm skips
        the update (``skipped = 1``), as Megatron does.

        Returns:
            ``{"loss": sum of the micro-batch losses (summed over data-parallel ranks), "grad_norm": global
            norm before clipping, "skipped": 0.0 or 1.0, "lr": learning rate used}``.
        Raises:
            ValueError: no micro-batches, or ``loss_fn`` returned a non-scalar tensor.
        """
        loss = self.forward_backward(micro_batches, loss_fn, temperature=temperature)
        return {"loss": loss, **self.optimizer_step()}

    def forward_backward(
        self,
        micro_batches: Sequence[TrainBatch],
        loss_fn: Callable[[Tensor, TrainBatch], Tensor],
        *,
        temperature: float = 1.0,
    ) -> float:
        """Clear gradients, then accumulate ``d loss_fn(lp, mb) / d params`` over ``micro_batches`` into
        ``param.grad`` (see :meth:`train_step`). Returns the summed loss (over micro-batches and data-parallel
        ranks). Gradients stay in ``param.grad`` (not yet reduced over data-parallel ranks).
        """
        if len(micro_batches) == 0:
            raise ValueError("train_step needs at least one micro-batch")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for mb in micro_batches:
            lp = self._logprobs(mb, temperature)
            loss = loss_fn(lp, mb.to(self.device))
            if not isinstance(loss, Tensor) or loss.dim() != 0:
                raise ValueError("loss_fn must return a scalar tensor")
            loss.backward()
            total += float(loss.detach().item())
        loss_t = torch.tensor([total], dtype=torch.float64)
        if self._dp_size() > 1:
            dist.all_reduce(loss_t, group=self._dp_group())
        return float(loss_t.item())

    def optimizer_step(self) -> dict[str, float]:
        """Sum gradients over data-parallel ranks, clip the global L2 norm to ``grad_clip``, AdamW step (unless
        the norm is not finite), clear gradients. Returns ``{"grad_norm", "skipped", "lr"}``."""
        params = [p for p in self.model.parameters()]
        self._allreduce_grads(params)
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        skipped = not math.isfinite(grad_norm)
        lr = self.lr
        if not skipped:
            self.optimizer.step()
            self.steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, "skipped": float(skipped), "lr": lr}

    def _dp_size(self) -> int:
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_world_size()

    def _dp_group(self):
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_group()

    def _allreduce_grads(self, params: list[Tensor]) -> None:
        """Sum gradients over the data-parallel group (no-op for a single rank)."""
        if self._dp_size() <= 1:
            return
        group = self._dp_group()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)

    # ------------------------------------------------------------------ weights in HF format
    def hf_state_dict(self) -> dict[str, Tensor]:
        """Current weights with HF names and layouts: ``{name: CPU contiguous tensor}`` (copies)."""
        conv = hf_mcore.mcore_to_hf(hf_mcore.mcore_param_state_dict(self.model), self.hf_config)
        return {k: v.detach().to("cpu").contiguous().clone() for k, v in conv.items()}

    def load_hf(self, model_dir: str | Path) -> None:
        """Load the weights of an HF directory with the same architecture into the model, in place
        (the optimiser state is kept).

        Raises:
            FileNotFoundError: no weights. hf_mcore.ConversionError: different architecture / names / shapes.
        """
        d = Path(model_dir)
        cfg = _load_hf_config(d) if d != self.model_dir else self.hf_config
        hf_mcore.check_supported(cfg)
        want, got = hf_mcore.architecture_signature(self.hf_config), hf_mcore.architecture_signature(cfg)
        if want != got:
            diff = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
            raise hf_mcore.ConversionError(f"{d}: architecture differs from the engine's (engine, dir): {diff}")
        hf_mcore.load_hf_into_model(self.model, read_hf_state_dict(d), self.hf_config)

    def save_hf(self, out_dir: str | Path) -> Path:
        """Write the current weights as an HF model directory; returns ``Path(out_dir)``.

        Contents: ``config.json`` (copied from the source directory), ``model.safetensors`` (HF names,
        sorted, contiguous, metadata ``{"format": "pt"}``) and the tokenizer / generation files of
        :data:`HF_AUX_FILES` present in the source directory. Everything is written into a temporary
        sibling directory ``.<name>.tmp-<hex>`` and renamed into place: readers never see a partial
        directory. An existing ``out_dir`` is replaced (moved aside, then deleted).

        Only rank 0 writes when ``torch.distributed`` has several ranks (others return at once after a
        barrier).
        """
        out = Path(out_dir)
        state = self.hf_state_dict()
        multi = dist.is_initialized() and dist.get_world_size() > 1
        if not multi or dist.get_rank() == 0:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:12]}"
            tmp.mkdir()
            try:
                shutil.copyfile(self.model_dir / "config.json", tmp / "config.json")
                for name in HF_AUX_FILES:
                    src = self.model_dir / name
                    if src.is_file():
                        shutil.copyfile(src, tmp / name)
                save_file(dict(sorted(state.items())), str(tmp / "model.safetensors"), metadata={"format": "pt"})
                for f in tmp.iterdir():
                    with open(f, "rb") as fh:
                        os.fsync(fh.fileno())
                if out.exists():
                    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:12]}"
                    os.replace(out, old)
                    os.replace(tmp, out)
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    os.replace(tmp, out)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        if multi:
            dist.barrier()
        return out

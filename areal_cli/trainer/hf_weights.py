"""MegatronEngine's weights in Hugging Face terms: the parameter count, the full HF state dict gathered from
TP shards and PP stages, loading an HF directory in place, and saving one.

:class:`HFWeights` is the part of :class:`~areal_cli.trainer.megatron_engine.MegatronEngine` (its base class)
that crosses the HF <-> megatron-core boundary (:mod:`areal_cli.trainer.hf_mcore` for names and layouts,
:mod:`areal_cli.trainer.parallel_shard` for TP shards, :mod:`areal_cli.trainer.hf_dir` for the files). It reads
the engine's attributes listed on the class. Under TP / PP every method is collective: every rank calls it.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from areal_cli.trainer import hf_mcore
from areal_cli.trainer import parallel_shard as psh
from areal_cli.trainer.collectives import gather_pp_state, gather_tp_state
from areal_cli.trainer.hf_dir import load_hf_config, read_hf_state_dict, write_hf_dir

__all__ = ["HFWeights"]


class HFWeights:
    """HF-format weights of an engine (a base class of :class:`~areal_cli.trainer.megatron_engine.MegatronEngine`).

    Attributes read (set by the engine): ``model`` (megatron-core GPTModel: this rank's TP shard and PP stage),
    ``hf_config`` and ``model_dir`` (the HF directory the engine was built from), ``vocab_size`` (V, without
    TP padding), ``tp`` / ``tp_rank`` / ``pp`` (tensor and pipeline parallel sizes, this rank's TP rank) and
    ``device``.
    """

    model: torch.nn.Module
    hf_config: object
    model_dir: Path
    vocab_size: int
    tp: int
    tp_rank: int
    pp: int
    device: torch.device

    def num_parameters(self) -> int:
        """Number of trainable parameters of the whole model (equals the HF model's; under TP the shards of
        all ranks are counted, the vocabulary padding is not)."""
        n = 0
        for name, p in self.model.named_parameters():
            rows = p.shape[0] * (self.tp if psh.is_tp_sharded(p) else 1)
            full = p.numel() * (self.tp if psh.is_tp_sharded(p) else 1)
            if name in psh.VOCAB_PARAMS:
                full = full // rows * self.vocab_size
            n += full
        if self.pp > 1:  # collective: the other stages' layers
            from megatron.core import parallel_state as ps

            t = torch.tensor([n], dtype=torch.int64, device=self.device)
            dist.all_reduce(t, group=ps.get_pipeline_model_parallel_group())
            n = int(t.item())
        return n

    def hf_state_dict(self) -> dict[str, Tensor]:
        """Current weights with HF names and layouts: ``{name: CPU contiguous tensor}`` (copies).

        Collective under TP (every rank must call it): TP shards are all-gathered and reassembled
        (:func:`parallel_shard.unshard`, vocabulary padding dropped), replicated tensors are taken from TP
        rank 0 (broadcast), so every rank returns the same full state dict, bit for bit equal to a
        single-process engine holding the same weights. DP replicas hold identical weights by construction
        (identical all-reduced gradients, deterministic AdamW), so nothing is exchanged over DP.
        """
        state = hf_mcore.mcore_param_state_dict(self.model)
        if self.tp > 1:
            state = gather_tp_state(self.model, state, self.tp, self.vocab_size)
        if self.pp > 1:
            state = gather_pp_state(self.model, state, self.pp)
        conv = hf_mcore.mcore_to_hf(state, self.hf_config)
        return {k: v.detach().to("cpu").contiguous().clone() for k, v in conv.items()}

    def load_hf(self, model_dir: str | Path) -> None:
        """Load the weights of an HF directory with the same architecture into the model, in place
        (the optimiser state is kept). Every rank reads the directory and keeps its TP shard.

        Raises:
            FileNotFoundError: no weights. hf_mcore.ConversionError: different architecture / names / shapes.
        """
        d = Path(model_dir)
        cfg = load_hf_config(d) if d != self.model_dir else self.hf_config
        hf_mcore.check_supported(cfg)
        want, got = hf_mcore.architecture_signature(self.hf_config), hf_mcore.architecture_signature(cfg)
        if want != got:
            diff = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
            raise hf_mcore.ConversionError(f"{d}: architecture differs from the engine's (engine, dir): {diff}")
        hf_mcore.load_hf_into_model(self.model, read_hf_state_dict(d), self.hf_config,
                                    tp_rank=self.tp_rank, tp_size=self.tp, stage=self.pp > 1)

    def save_hf(self, out_dir: str | Path) -> Path:
        """Write the current weights as an HF model directory; returns ``Path(out_dir)``.

        Contents: ``config.json`` (copied from the source directory), ``model.safetensors`` (HF names,
        sorted, contiguous, metadata ``{"format": "pt"}``) and the tokenizer / generation files of
        :data:`~areal_cli.trainer.hf_dir.HF_AUX_FILES` present in the source directory. Everything is
        written into a temporary sibling directory ``.<name>.tmp-<hex>`` and renamed into place: readers
        never see a partial directory. An existing ``out_dir`` is replaced (moved aside, then deleted)
        (:func:`~areal_cli.trainer.hf_dir.write_hf_dir`).

        Only rank 0 writes when ``torch.distributed`` has several ranks (others return at once after a
        barrier).
        """
        out = Path(out_dir)
        state = self.hf_state_dict()
        multi = dist.is_initialized() and dist.get_world_size() > 1
        if not multi or dist.get_rank() == 0:
            write_hf_dir(state, self.model_dir, out)
        if multi:
            dist.barrier()
        return out

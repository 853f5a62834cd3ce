"""Tiny model folders with every weight perturbed (norm weights != 1, biases far from their init), for the
trainer and conversion tests: a layer that ignored a weight, a swapped q/k norm or a wrong QKV packing would go
unnoticed with the initial values."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

CORPUS = ["12+34=46", "the answer is 7", "compute the sum of the digits", "hello world"] * 4


def perturb_weights(path: Path, seed: int) -> Path:
    """Add 0.05 * N(0, 1) noise (generator seeded with ``seed``, tensors in name order) to every weight of
    ``path/model.safetensors``, in place; returns ``path``."""
    sd = load_file(str(path / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    sd = {k: (v + 0.05 * torch.randn(v.shape, generator=g)).contiguous() for k, v in sorted(sd.items())}
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def make_model_dir(path: Path, *, seed: int = 0, **sizes) -> Path:
    """Tiny HF dir (areal_cli.models.tiny: Qwen3 unless ``family=`` says otherwise; MLP 256 unless given) with
    every weight perturbed (noise seed ``seed + 1``)."""
    from areal_cli.models.tiny import build_tiny_model

    build_tiny_model(path, seed=seed, corpus=CORPUS, **{"intermediate_size": 256, **sizes})
    return perturb_weights(path, seed + 1)

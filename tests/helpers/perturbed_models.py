"""Tiny Qwen3 model folders with every weight perturbed (norm weights != 1), for the trainer tests: a
layer that ignored a weight would go unnoticed with the initial values."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

CORPUS = ["12+34=46", "the answer is 7", "compute the sum of the digits", "hello world"] * 4


def make_model_dir(path: Path, *, seed: int = 0, **sizes) -> Path:
    """Tiny Qwen3 HF dir (areal_cli.models.tiny) with every weight perturbed (norm weights != 1)."""
    from areal_cli.models.tiny import build_tiny_model

    build_tiny_model(path, seed=seed, corpus=CORPUS, intermediate_size=256, **sizes)
    sd = load_file(str(path / "model.safetensors"))
    g = torch.Generator().manual_seed(seed + 1)
    sd = {k: (v + 0.05 * torch.randn(v.shape, generator=g)).contiguous() for k, v in sorted(sd.items())}
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path

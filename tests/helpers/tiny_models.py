"""The tiny model pair of the rollout tests: a tiny Qwen3 and the same model with perturbed weights (a
"new policy version" to load), built once per test session under pytest's base temp directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from areal_cli.models.tiny import build_tiny_model

CORPUS = [f"{a}+{b}={a + b}" for a in range(40) for b in range(40)] + [
    "Please reason step by step, and put your final answer within \\boxed{}.", "The answer is 42.",
]


def perturb(src: Path, dst: Path, seed: int = 1, scale: float = 0.05) -> Path:
    """Copy the model folder ``src`` to ``dst`` with every weight plus ``scale`` * N(0, 1) noise (seeded)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, dirs_exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    sd = load_file(str(src / "model.safetensors"))
    sd = {k: (v + scale * torch.randn(v.shape, generator=g)).contiguous() for k, v in sorted(sd.items())}
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def tiny_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """(model, same model with perturbed weights); built once per test session."""
    base = tmp_path_factory.getbasetemp() / "rollout_tiny"
    a, b = base / "seed0", base / "seed0_perturbed"
    if not (a / "model.safetensors").is_file():
        build_tiny_model(a, seed=0, corpus=CORPUS)
    if not (b / "model.safetensors").is_file():
        perturb(a, b)
    return a, b

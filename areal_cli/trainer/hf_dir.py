"""A Hugging Face model directory on disk: its config, its safetensors weights, and writing one atomically.

What :class:`~areal_cli.trainer.megatron_engine.MegatronEngine` reads when it is built and in ``load_hf``, and
writes in ``save_hf``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import Tensor

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


def load_hf_config(model_dir: Path):
    """The ``transformers`` config of an HF model directory. Raises: FileNotFoundError: no config.json."""
    from transformers import AutoConfig

    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json")
    return AutoConfig.from_pretrained(str(model_dir))


def write_hf_dir(state: dict[str, Tensor], src_dir: Path, out: Path) -> None:
    """Write ``state`` (HF names) as the model directory ``out``: ``config.json`` copied from ``src_dir``,
    ``model.safetensors`` (sorted, metadata ``{"format": "pt"}``), and the files of :data:`HF_AUX_FILES` present
    in ``src_dir``. Written into a temporary sibling ``.<name>.tmp-<hex>`` (every file fsynced) and renamed into
    place, so readers never see a partial directory; an existing ``out`` is moved aside, then deleted."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        shutil.copyfile(src_dir / "config.json", tmp / "config.json")
        for name in HF_AUX_FILES:
            src = src_dir / name
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

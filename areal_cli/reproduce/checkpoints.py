"""Refusing a checkpoint folder that cannot be a complete Hugging Face model, before evaluating it: config,
weights, shards named by the index, and safetensors headers whose byte ranges fit their files.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from areal_cli.foundations.errors import UserError


def check_checkpoint(model_dir: Path) -> None:
    """Refuse a checkpoint folder that cannot be a complete Hugging Face model, before evaluating it.

    Checks: the folder and ``config.json`` (valid JSON) exist; weights exist (``*.safetensors`` or
    ``*.bin``); every shard named by ``model.safetensors.index.json`` exists; each safetensors file's header
    (8-byte little-endian length + JSON) is readable and its tensors' byte ranges fit in the file (a
    truncated or overwritten file fails here). Tensor values are not read.

    Raises:
        UserError: ``PATH: what is wrong``.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise UserError(f"{model_dir}: checkpoint folder not found")
    cfg = model_dir / "config.json"
    try:
        json.loads(cfg.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{cfg}: not found (a Hugging Face checkpoint needs config.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{cfg}: corrupted checkpoint: config.json is not valid JSON ({e})") from None
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise UserError(f"{index}: corrupted checkpoint: not a safetensors index (weight_map)") from None
        missing = sorted(s for s in shards if not (model_dir / s).is_file())
        if missing:
            raise UserError(f"{model_dir}: corrupted checkpoint: shard {missing[0]} named by {index.name} is missing "
                            f"({len(missing)} missing)")
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights and not list(model_dir.glob("*.bin")):
        raise UserError(f"{model_dir}: checkpoint has no weights (*.safetensors or *.bin)")
    for w in weights:
        _check_safetensors(w)


def _check_safetensors(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise UserError(f"{path}: corrupted checkpoint: {size} bytes, shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100 * 1024 * 1024:
            raise UserError(f"{path}: corrupted checkpoint: header length {n} does not fit the file ({size} bytes)")
        try:
            header = json.loads(fh.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise UserError(f"{path}: corrupted checkpoint: unreadable safetensors header") from None
    if not isinstance(header, dict):
        raise UserError(f"{path}: corrupted checkpoint: safetensors header is not a JSON object")
    data = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise UserError(f"{path}: corrupted checkpoint: tensor '{name}' has no data_offsets")
        if not 0 <= offsets[0] <= offsets[1] <= data:
            raise UserError(f"{path}: corrupted checkpoint: tensor '{name}' ends at byte {offsets[1]} of a "
                            f"{data}-byte data section (truncated file?)")

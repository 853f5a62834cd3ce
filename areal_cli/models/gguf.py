"""GGUF checkpoints as model inputs: a ``.gguf`` file is dequantised once into an ordinary Hugging Face model
directory in a cache, which every part of the kit (trainer, embedded engine, evaluation) then loads.

``transformers`` reads GGUF (``from_pretrained(dir, gguf_file=name)``, with the ``gguf`` package) and
dequantises the weights to float; its model refuses ``save_pretrained`` (quantizer flag), so the weights are
copied into a fresh model of the same config and saved as safetensors, without ``quantization_config``; the
tokenizer (with its chat template) is saved beside them.

Cache: ``$AREAL_GGUF_CACHE``, else ``$HF_HOME/areal-gguf`` (``HF_HOME`` defaults to ``~/.cache/huggingface``),
one folder per file content: ``<stem>-<sha256[:16]>``. It is written in a temporary folder and renamed, so a
killed conversion leaves nothing that looks complete. ``areal_gguf.json`` in it records the provenance
(source path, size, sha256, architecture, tensor types), which runs copy into their records.

Bad input (one line, :class:`~areal_cli.foundations.errors.UserError`): a missing or truncated file, a file that is not
GGUF, an architecture the kit does not train or serve (:mod:`areal_cli.models.families`), a quantisation
``transformers`` cannot dequantise.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from areal_cli.foundations.errors import UserError

PROVENANCE = "areal_gguf.json"


def is_gguf(path: str | Path) -> bool:
    """True for a path ending in ``.gguf``."""
    return str(path).lower().endswith(".gguf")


def cache_root() -> Path:
    """Where converted GGUF files go (module docstring)."""
    env = os.environ.get("AREAL_GGUF_CACHE")
    if env:
        return Path(env)
    hf_home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(hf_home) / "areal-gguf"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def inspect(path: Path) -> dict[str, Any]:
    """Architecture and tensor types of a GGUF file, read from its header (no weights loaded).

    Raises:
        UserError: not a readable GGUF file (missing, truncated, another format).
    """
    return _read(path)[1]


def _read(path: Path) -> tuple[Any, dict[str, Any]]:
    """The file's ``GGUFReader`` (header parsed, tensors memory-mapped) and :func:`inspect`'s summary of it."""
    try:
        from gguf import GGUFReader
    except ImportError:  # pragma: no cover - a declared dependency
        raise UserError(f"{path}: reading GGUF needs the 'gguf' package (pip install gguf)") from None
    try:
        reader = GGUFReader(str(path))
        field = reader.fields.get("general.architecture")
        arch = bytes(field.parts[field.data[0]]).decode() if field is not None else None
        types = sorted({t.tensor_type.name for t in reader.tensors})
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except Exception as e:  # noqa: BLE001 - gguf raises ValueError / IndexError / struct errors on bad files
        raise UserError(f"{path}: not a readable GGUF file (truncated or another format): "
                        f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
    return reader, {"architecture": arch, "tensor_types": types, "n_tensors": len(reader.tensors)}


def _read_supported(path: Path) -> tuple[Any, dict[str, Any]]:
    """:func:`_read` of a GGUF file that exists and whose architecture the kit serves (one parse of the header).

    Raises:
        UserError: ``FILE: GGUF file not found``; as :func:`inspect`; as :func:`check_supported`.
    """
    if not Path(path).is_file():
        raise UserError(f"{path}: GGUF file not found")
    reader, info = _read(path)
    check_supported(path, info)
    return reader, info


def check_supported(path: Path, info: dict[str, Any]) -> None:
    """Refuse a GGUF file whose architecture (from :func:`inspect`) the kit does not train or serve.

    Raises:
        UserError: ``FILE: GGUF architecture 'gemma' is not supported (supported: ...)``.
    """
    from areal_cli.models.families import FAMILIES, SUPPORTED

    if info["architecture"] not in FAMILIES:
        raise UserError(f"{path}: GGUF architecture {info['architecture']!r} is not supported (supported: {SUPPORTED})")


def tokens(path: Path) -> set[str]:
    """The token strings of a GGUF file's tokenizer (``tokenizer.ggml.tokens``), read from its header without
    converting it (a few seconds for a 49k vocabulary).

    Raises:
        UserError: as :func:`_read_supported`; a file without a tokenizer.
    """
    reader, _ = _read_supported(path)  # a missing or unreadable file, an architecture not served: one line
    field = reader.fields.get("tokenizer.ggml.tokens")
    if field is None:
        raise UserError(f"{path}: the GGUF file holds no tokenizer (tokenizer.ggml.tokens)")
    return {bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data}


def resolve_model(path: str | Path, log=None) -> Path:
    """The Hugging Face model directory to load for ``path``: ``path`` itself when it is a directory, else
    the cached conversion of a ``.gguf`` file (made now if missing; a few seconds for a 135M model); a packaged
    model's name (``smollm2-135m-instruct``, :mod:`areal_cli.models.packaged`) stands for its file.

    Raises:
        UserError: see the module docstring; also a path that is neither a directory nor a ``.gguf`` file.
    """
    from areal_cli.models.packaged import locate_model

    p = locate_model(path)  # a packaged model's name: its file
    if not is_gguf(p):
        return p
    _, info = _read_supported(p)
    digest = sha256_file(p)
    final = cache_root() / f"{p.stem}-{digest[:16]}"
    if (final / PROVENANCE).is_file() and (final / "config.json").is_file():
        return final
    if log is not None:
        log(f"dequantising {p.name} into {final} (once)")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{p.stem}.", dir=final.parent))
    try:
        _convert(p, tmp)
        provenance = {"source": str(p.resolve()), "bytes": p.stat().st_size, "sha256": digest, **info}
        (tmp / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / PROVENANCE).is_file():  # a concurrent conversion won the race otherwise
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _convert(path: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src, name = str(path.parent), path.name
    try:
        config = AutoConfig.from_pretrained(src, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    except Exception as e:  # noqa: BLE001 - an unsupported quantisation or layout: one line
        raise UserError(f"{path}: transformers cannot dequantise this GGUF file: {type(e).__name__}: "
                        f"{' '.join(str(e).split())[:240]}") from None
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config).to(torch.float32)
    state = {k: v for k, v in model.state_dict().items()}
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    if [k for k in missing if not k.endswith("lm_head.weight")] or unexpected:
        raise UserError(f"{path}: the dequantised weights do not match a {config.model_type} model "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    fresh.config.architectures = [type(fresh).__name__]
    fresh.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


def provenance_of(model_dir: str | Path) -> dict | None:
    """The GGUF provenance of a converted model directory, or None (not converted from GGUF)."""
    f = Path(model_dir) / PROVENANCE
    try:
        return json.loads(f.read_text()) if f.is_file() else None
    except (OSError, ValueError):
        return None

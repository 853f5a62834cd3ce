"""Dataset records for training: local JSONL / Parquet files, a Hugging Face dataset at a pinned revision, or
a user function -- each record a dict whose fields reach the reward function as keyword arguments.

Sources (the recipe's ``task.dataset`` / ``task.eval_dataset``):

- a path: a ``.jsonl`` (or ``.json`` lines) or ``.parquet`` file, or a folder of them (sorted by name);
  relative to the recipe's folder. Locations in messages: ``file:line`` (JSONL) / ``file: row N`` (Parquet).
- ``hf:OWNER/NAME`` or ``hf:OWNER/NAME/path/in/repo.jsonl``: loaded with ``datasets.load_dataset`` at
  ``task.dataset_revision`` (a 40-hex commit, required: data must not change under a run), split
  ``task.dataset_split``. Offline, the revision must already be in the Hugging Face cache (``HF_HOME``);
  otherwise one line says so.
- ``package.module:attr`` or ``file.py:attr``: a function ``fn(split, seed) -> Iterable[dict]`` with split
  ``"train"`` or ``"heldout"``; the train iterable may be endless (generated tasks such as tiny-arith).

:func:`read_records` returns :class:`Record` objects (fields + location + id) and checks the required fields;
:func:`heldout_by_hash` splits a finite list into train and held-out parts by a hash of each record's id,
independent of order and seed (AReaL loads a separate valid file; a fraction of one file is the default
here so that any file gives an in-loop evaluation).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from areal_cli.api.loading import check_spec, is_file_spec, load_object
from areal_cli.foundations.errors import UserError

SUFFIXES = (".jsonl", ".json", ".parquet")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_HF = re.compile(r"^hf:(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:/(?P<path>.+))?$")


@dataclass(frozen=True)
class Record:
    """One dataset record. ``fields``: the record as read; ``where``: ``file:line`` (or similar) for
    messages; ``id``: the ``task.id_field`` value as a string, else ``where``."""

    fields: dict
    where: str
    id: str


@dataclass(frozen=True)
class Source:
    """A parsed dataset source (see the module docstring). ``kind``: ``"files"``, ``"hf"`` or ``"function"``."""

    kind: str
    text: str
    paths: tuple[Path, ...] = ()
    repo: str = ""
    repo_path: str = ""
    revision: str = ""
    split: str = "train"


def parse_source(text: str, *, what: str, revision: str = "", split: str = "train",
                 base_dir: Path | str | None = None) -> Source:
    """Parse a ``task.dataset`` value; paths are resolved against ``base_dir`` (default: the current directory).

    Raises:
        UserError: an hf source without a 40-hex revision, a path that does not exist or holds no data file,
            a malformed function name.
    """
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"{what}: empty (a data file, hf:OWNER/NAME or module:function)")
    text = text.strip()
    m = _HF.match(text)
    if m:
        if not _SHA1.match(revision or ""):
            raise UserError(f"{what}: {text} needs 'task.dataset_revision': a 40-hex commit of the dataset repo "
                            f"(got {revision!r}); pin it so the data cannot change under the run")
        return Source("hf", text, repo=m["repo"], repo_path=m["path"] or "", revision=revision, split=split)
    head = text.rpartition(":")[0]
    if ":" in text and Path(text).suffix.lower() not in SUFFIXES and (is_file_spec(text) or "/" not in head):
        check_spec(text, what)
        return Source("function", text)
    p = Path(text).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    if p.is_dir():
        files = tuple(sorted(f for f in p.iterdir() if f.suffix.lower() in SUFFIXES and f.is_file()))
        if not files:
            raise UserError(f"{what}: folder {p} holds no {'/'.join(SUFFIXES)} file")
        return Source("files", text, paths=files)
    if not p.is_file():
        raise UserError(f"{what}: {p} not found")
    if p.suffix.lower() not in SUFFIXES:
        raise UserError(f"{what}: {p}: expected a {'/'.join(SUFFIXES)} file")
    return Source("files", text, paths=(p,))


def _json_lines(path: Path) -> Iterator[tuple[str, dict]]:
    from areal_cli.foundations.jsonl import iter_json_lines

    for lineno, rec in iter_json_lines(path):
        yield f"{path}:{lineno}", rec


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict]]:
    import pyarrow.parquet as pq

    row = 0
    try:
        pfile = pq.ParquetFile(path)
        for batch in pfile.iter_batches(batch_size=256):
            for rec in batch.to_pylist():
                row += 1
                yield f"{path}: row {row}", rec
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid subclasses ValueError
        raise UserError(f"{path}: not a readable parquet file (after row {row}): {' '.join(str(exc).split())[:200]}"
                        ) from None


def _hf_rows(src: Source, what: str) -> Iterator[tuple[str, dict]]:
    from areal_cli.foundations.hub import hub_local_only

    # offline or unreachable: read the cache only, at once (no ~25 s of retry backoff). The libraries read
    # their offline flags when imported, so set the environment first and patch the flags too.
    local = hub_local_only()
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    if local:
        os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    try:
        import datasets
        import huggingface_hub.constants as hub_constants
    except ImportError:  # pragma: no cover - declared dependencies
        raise UserError(f"{what}: the 'datasets' package is not installed") from None
    flags = [(mod, name, getattr(mod, name)) for mod in (datasets.config, hub_constants)
             for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if hasattr(mod, name)]
    kwargs: dict[str, Any] = {"revision": src.revision}
    if src.repo_path:
        kwargs.update(data_files=src.repo_path, split="train")
    else:
        kwargs["split"] = src.split
    try:
        if local:
            for mod, name, _ in flags:
                setattr(mod, name, True)
        ds = datasets.load_dataset(src.repo, **kwargs)
    except Exception as exc:  # noqa: BLE001 - offline, unknown revision, bad path: all one line
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        where = "offline or hub unreachable: it must already be in the Hugging Face cache (HF_HOME)" if local else \
            "check the name, the revision and the network"
        raise UserError(f"{what}: cannot load {src.text} at revision {src.revision} ({where}): {reason}") from None
    finally:
        for mod, name, value in flags:
            setattr(mod, name, value)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    label = f"{src.text}@{src.revision[:12]}"
    for i, rec in enumerate(ds):
        yield f"{label} row {i + 1}", dict(rec)


def _function_rows(src: Source, split: str, seed: int, what: str) -> Iterator[tuple[str, dict]]:
    fn = load_object(src.text, what)
    if not callable(fn):
        raise UserError(f"{what}: {src.text} is not callable (expected fn(split, seed) -> records)")
    try:
        rows = fn(split, seed)
        it = iter(rows)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise UserError(f"{what}: {src.text}({split!r}, {seed}) raised {type(exc).__name__}: {exc}") from None
    i = 0
    for rec in it:
        i += 1
        loc = f"{src.text}({split}) item {i}"
        if not isinstance(rec, dict):
            raise UserError(f"{loc}: expected a dict record, got {type(rec).__name__}")
        yield loc, rec


def iter_records(src: Source, *, what: str, split: str = "train", seed: int = 0, required: Sequence[str] = (),
                 id_field: str = "") -> Iterator[Record]:
    """The records of ``src`` in file order (function sources: ``fn(split, seed)``), checked.

    Raises:
        UserError: unreadable data, a record that is not an object, a required field missing or null, an id
            field missing (``file:line: field 'x': missing``).
    """
    if src.kind == "files":
        rows: Iterable[tuple[str, dict]] = (r for p in src.paths
                                            for r in (_parquet_rows(p) if p.suffix.lower() == ".parquet" else _json_lines(p)))
    elif src.kind == "hf":
        rows = _hf_rows(src, what)
    else:
        rows = _function_rows(src, split, seed, what)
    for loc, rec in rows:
        for name in required:
            if rec.get(name) is None:
                raise UserError(f"{loc}: field '{name}': missing (required by the task)")
        if id_field:
            if rec.get(id_field) is None:
                raise UserError(f"{loc}: field '{id_field}': missing (the task's id field)")
            rid = str(rec[id_field])
        else:
            rid = str(rec["id"]) if rec.get("id") is not None else loc
        yield Record(rec, loc, rid)


def read_records(src: Source, **kwargs: Any) -> list[Record]:
    """All records of a finite source (:func:`iter_records`); at least one.

    Raises:
        UserError: as :func:`iter_records`, or no record at all.
    """
    out = list(iter_records(src, **kwargs))
    if not out:
        raise UserError(f"{kwargs.get('what', 'dataset')}: {src.text} holds no record")
    return out


def heldout_by_hash(records: Sequence[Record], fraction: float) -> tuple[list[Record], list[Record]]:
    """``(train, heldout)``: a record is held out iff ``sha256("areal-heldout:" + id)`` mod 10^6 falls below
    ``fraction * 10^6`` -- stable under reordering, appending and seeds; records sharing an id share a split.
    With at least two distinct ids, each part keeps at least one record (the smallest / largest hash moves).
    """
    def h(r: Record) -> int:
        return int.from_bytes(hashlib.sha256(("areal-heldout:" + r.id).encode()).digest()[:8], "big") % 1_000_000

    cut = fraction * 1_000_000
    held = [r for r in records if h(r) < cut]
    train = [r for r in records if h(r) >= cut]
    if fraction > 0 and not held and len({r.id for r in records}) > 1:
        low = min(h(r) for r in records)
        held, train = [r for r in records if h(r) == low], [r for r in records if h(r) != low]
    if not train and len({r.id for r in records}) > 1:
        high = max(h(r) for r in records)
        train, held = [r for r in records if h(r) == high], [r for r in records if h(r) != high]
    return train, held

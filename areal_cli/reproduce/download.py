"""``areal download``: fetch a recipe's model and data, or one Hub repo, at pinned revisions.

Uses ``huggingface_hub.snapshot_download``, which resumes interrupted files (``.incomplete`` parts are
continued), shows tqdm progress bars, and honours ``HF_HOME`` (cache location), ``HF_TOKEN`` and
``HF_HUB_OFFLINE`` (we also pass ``local_files_only`` when ``HF_HUB_OFFLINE`` is set, so a cached snapshot
is still returned offline). ``huggingface_hub`` is imported only when a download runs.

Pinning: a revision must be a 40-hex commit. A recipe's unpinned reference (``revision: null`` +
``revision_note``), a bare repo id no recipe pins, or ``--revision main`` is refused unless
``allow_unpinned`` (``--allow-unpinned``), in one line naming the recipe file and line.

Checksums: files with a ``sha256`` in the recipe are hashed after download. On a mismatch the file is
removed (in the cache: the snapshot link and the blob it points to), so a corrupt file is never left in
place looking valid and the next run downloads it again; then :class:`UserError` is raised.

Every problem the user can fix (unknown recipe, unpinned revision, offline, repo not found or gated,
checksum mismatch) is a one-line :class:`~areal_cli.foundations.errors.UserError`; all targets are checked before
anything is downloaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from areal_cli.foundations.errors import UserError
from areal_cli.foundations.hub import REPO_ID, SHA1, hub_local_only, offline
from areal_cli.recipes import HubRef, load_recipe, recipe_names, recipe_path, where

#: Recipe parts ``download`` can fetch: role -> recipe section.
ROLES = {"model": "model", "data": "data", "published": "published_model"}


@dataclass
class DownloadItem:
    """One snapshot to fetch. ``origin`` is where it was asked for (``file:line`` or ``command line``)."""

    role: str  # "model" | "data" | "published" | "repo"
    repo_id: str
    repo_type: str  # "model" | "dataset"
    revision: str | None
    revision_note: str | None
    origin: str
    allow_patterns: list[str] | None = None
    checksums: dict[str, str] = field(default_factory=dict)

    @property
    def pinned(self) -> bool:
        return self.revision is not None and bool(SHA1.match(self.revision))

    def label(self) -> str:
        return f"{'datasets/' if self.repo_type == 'dataset' else ''}{self.repo_id}@{self.revision or 'main'}"


def _pinned_in_recipes(repo_id: str, repo_type: str) -> tuple[str, str] | None:
    """(revision, file:line) of ``repo_id`` where a shipped recipe pins it, else None."""
    for name in recipe_names():
        try:
            r = load_recipe(name)
        except UserError:
            continue
        refs: list[tuple[HubRef | None, str]] = [(r.file.model, "model"), (r.file.published_model, "model"),
                                                 (r.file.data, "dataset")]
        for ref, rtype in refs:
            if ref is not None and ref.repo == repo_id and rtype == repo_type and ref.revision:
                return ref.revision, where(ref, "revision")
    return None


def plan(target: str, *, dataset: bool = False, revision: str | None = None,
         roles: tuple[str, ...] = ("model", "data")) -> list[DownloadItem]:
    """Resolve ``target`` into snapshots to fetch (nothing is downloaded).

    ``target``: a recipe name or ``.yaml`` path (its ``roles``: model, data, published), a model repo id
    ``owner/name``, or a dataset repo id (``datasets/owner/name`` or ``dataset=True``). A bare repo id uses
    ``revision`` if given, else the revision a shipped recipe pins for it.

    Raises:
        UserError: unknown recipe / malformed repo id; ``revision`` given for a recipe; unknown role.
    """
    for role in roles:
        if role not in ROLES:
            raise UserError(f"unknown download part '{role}' (known: {', '.join(ROLES)})")
    is_path = target.endswith((".yaml", ".yml"))
    if is_path or (not target.startswith("datasets/") and "/" not in target):
        recipe = load_recipe(recipe_path(target))  # unknown name -> UserError listing the recipes
        if revision is not None:
            raise UserError(f"--revision applies to one repo, not to recipe '{recipe.name}' (it pins its own "
                            f"revisions in {recipe.path})")
        items = []
        for role in roles:
            ref = getattr(recipe.file, ROLES[role])
            if ref is None or ref.repo is None:
                continue  # built-in, or no published checkpoint
            files = getattr(ref, "files", None) or []
            items.append(DownloadItem(
                role=role, repo_id=ref.repo, repo_type="dataset" if role == "data" else "model",
                revision=ref.revision, revision_note=ref.revision_note, origin=where(ref, "revision"),
                allow_patterns=[f.path for f in files] or None,
                checksums={f.path: f.sha256 for f in files if f.sha256}))
        return items
    repo_type = "dataset" if dataset or target.startswith("datasets/") else "model"
    repo_id = target.removeprefix("datasets/")
    if not REPO_ID.match(repo_id):
        raise UserError(f"'{target}' is neither a recipe ({', '.join(recipe_names())}) nor a Hub repo id "
                        f"'owner/name'")
    origin, note = "command line", None
    if revision is None:
        found = _pinned_in_recipes(repo_id, repo_type)
        if found:
            revision, origin = found
        else:
            note = "no recipe pins it and no --revision was given"
    return [DownloadItem(role="repo", repo_id=repo_id, repo_type=repo_type, revision=revision,
                         revision_note=note, origin=origin)]


def check_pinned(items: list[DownloadItem], allow_unpinned: bool) -> None:
    """Refuse unpinned snapshots unless ``allow_unpinned``.

    Raises:
        UserError: ``origin: REPO has no pinned revision (why); ...`` for the first unpinned item.
    """
    if allow_unpinned:
        return
    for it in items:
        if not it.pinned:
            why = it.revision_note or f"revision {it.revision!r} is not a 40-hex commit"
            raise UserError(f"{it.origin}: {it.repo_type} '{it.repo_id}' has no pinned revision ({why}); "
                            f"pass --allow-unpinned to download {it.revision or 'main'} as it is today")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify_checksums(root: Path, item: DownloadItem) -> None:
    """Check the pinned sha256 of each file of ``item`` under the snapshot folder ``root``.

    Raises:
        UserError: a file is missing, or its hash differs (the file, and in the cache its blob, is removed).
    """
    for rel, want in item.checksums.items():
        p = root / rel
        if not p.exists():
            raise UserError(f"{item.origin}: '{rel}' is not in {item.label()} (checked {root})")
        got = sha256_file(p)
        if got != want:
            blob = p.resolve() if p.is_symlink() else None
            p.unlink()
            if blob is not None and blob.exists():
                blob.unlink()
            raise UserError(f"{item.origin}: sha256 mismatch for '{rel}' of {item.label()}: expected {want}, got "
                            f"{got}; the file was removed, run the download again")


@contextlib.contextmanager
def _quiet_hub_retries():
    """Silence huggingface_hub's per-retry warnings so a network failure ends in our one line."""
    import logging

    log = logging.getLogger("huggingface_hub")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(old)


def fetch(item: DownloadItem, local_dir: Path | None) -> Path:
    """Download one snapshot (resumable) and verify its checksums; return the snapshot folder.

    Raises:
        UserError: offline / hub unreachable, repo or revision not found, gated repo, checksum mismatch.
    """
    import huggingface_hub
    from huggingface_hub import errors as hf_errors

    local_only = hub_local_only()
    kwargs = dict(repo_type=item.repo_type, revision=item.revision, allow_patterns=item.allow_patterns,
                  local_files_only=local_only)
    if local_dir is not None:
        kwargs["local_dir"] = str(local_dir)
    what = f"{item.label()} (asked for at {item.origin})"
    try:
        with _quiet_hub_retries():
            path = Path(huggingface_hub.snapshot_download(item.repo_id, **kwargs))
    except hf_errors.GatedRepoError:
        raise UserError(f"{what}: the repo is gated: accept its terms on huggingface.co and log in "
                        f"(`hf auth login` or HF_TOKEN)") from None
    except hf_errors.RepositoryNotFoundError:
        raise UserError(f"{what}: repository not found on the Hugging Face hub (or private)") from None
    except hf_errors.RevisionNotFoundError:
        raise UserError(f"{what}: revision not found in the repository") from None
    except hf_errors.LocalEntryNotFoundError:
        cache = os.environ.get("HF_HOME") or "~/.cache/huggingface"
        why = "HF_HUB_OFFLINE is set" if offline() else ("network unreachable" if local_only else "not found")
        raise UserError(f"cannot reach the Hugging Face hub (offline? {why}) and {item.label()} is not in the "
                        f"local cache ({cache}); run `areal download` where the hub is reachable") from None
    except hf_errors.HfHubHTTPError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{what}: Hugging Face hub error: {first}") from None
    except OSError as e:
        raise UserError(f"{what}: cannot write the download: {e.strerror or e}") from None
    verify_checksums(path, item)
    return path


def download(target: str, *, local_dir: Path | None = None, revision: str | None = None,
             allow_unpinned: bool = False, dataset: bool = False,
             roles: tuple[str, ...] = ("model", "data")) -> dict[str, Path]:
    """Download ``target`` (recipe name/path, model repo id, or dataset repo id) at pinned revisions.

    Args:
        local_dir: for a recipe, each part goes to ``local_dir/<role>`` (model, data, published); for one
            repo, to ``local_dir`` itself. None: the Hugging Face cache (``HF_HOME``).
        revision: for a single repo id only (a 40-hex commit, or anything with ``allow_unpinned``).
        roles: recipe parts to fetch (``model``, ``data``, ``published``).
    Returns:
        role -> snapshot folder (empty when the recipe uses only built-ins).
    Raises:
        UserError: see :func:`plan`, :func:`check_pinned`, :func:`fetch`; nothing is fetched when a
            target is invalid or unpinned.
    """
    items = plan(target, dataset=dataset, revision=revision, roles=roles)
    check_pinned(items, allow_unpinned)
    out: dict[str, Path] = {}
    for it in items:
        dest = None if local_dir is None else (Path(local_dir) / it.role if it.role != "repo" else Path(local_dir))
        out[it.role] = fetch(it, dest)
    return out

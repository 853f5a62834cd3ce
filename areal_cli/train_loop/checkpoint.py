"""Checkpoints of an ``areal train`` run, and what resuming one means.

Layout: ``RUN/checkpoints/step-000012/`` (written every ``loop.checkpoint_every`` RL steps; the newest
``loop.keep_checkpoints`` are kept)::

    hf/               weights of policy version 12 in HF format (config, model.safetensors, tokenizer files):
                      the trainer reloads them (HF -> megatron conversion is exact) and the servers restart
                      from them
    optimizer.pt      torch.save(AdamW state_dict): moments, step counts, lr of every parameter group
    rng.pt            RNG states: python ``random``, numpy, torch CPU (+ CUDA, + Megatron's RNG tracker)
    critic.pt         only with critic.enabled: the critic's weights and AdamW state (areal_cli.trainer.critic)
    state.json        the loop's state: step, policy version, held-out accuracy, staleness counters,
                      controller counters, data position, warm-start summary, elapsed seconds
    manifest.json     {"format", "step", "files": {relative path: {"sha256", "bytes"}}}: written last

A checkpoint is written into ``checkpoints/.step-000012.tmp-<hex>``, every file fsync'ed, then renamed into
place, so a ``step-*`` directory is always complete; a ``kill -9`` during the write leaves only a ``.tmp``
directory, which is ignored (and removed by the next save). Loading verifies every file against the
manifest first; a missing, truncated or altered file is a :class:`UserError` naming it
(``RUN/checkpoints/step-000012/optimizer.pt: checksum mismatch``) and nothing is touched.

What "no lost or duplicated step" means for an asynchronous run (DESIGN §3):

* A checkpoint is taken at the end of RL step ``k``: after its metrics line is written and after the
  servers finished loading the weights it published (policy version ``k``; the staleness manager has
  ``version = k``). It holds the trainer (weights, optimizer, RNG) and the controller's accounting.
* Work in flight at that moment is not part of it: groups still generating or being scored, and groups
  already accepted but not yet taken by the trainer. A kill loses them; after a resume their prompts are
  issued again (first, in stream order) and regenerated with the checkpointed weights. No trained step is
  lost or repeated: ``metrics.jsonl`` is cut back to the line of step ``k`` (lines written after the
  checkpoint are redone) and continues at ``k + 1``; that line carries ``"resumed_from"``.
* Data position: the training prompts are one seeded stream (``task.train_stream()``), so a position is
  ``next_index`` (how many prompts were drawn) plus ``pending`` (stream indices of the groups in flight at
  the checkpoint). Prompts of trained groups are never drawn again; prompts of dropped groups (success-rate
  filter, reward failure) are not either, as in an uninterrupted run; pending ones are re-issued.
* Staleness: with ``trained = k * batch_size`` groups consumed, the checkpointed counters satisfy
  ``accepted = trained + queued``. The resumed manager gets ``version = k``, ``accepted = trained``,
  ``running = 0`` (``rejected`` kept), so its capacity ``(eta + k + 1) * B - (accepted + running)`` is the
  checkpoint's plus the ``pending = queued + running`` groups it re-admits first: once they are running
  again the capacity is exactly what it was at the checkpoint.
* Controller counters (samples, tokens generated, interruptions, ...) continue from the checkpoint; work on
  pending groups done before the kill is not subtracted, so they count real work, repeated work included.
* Determinism: the trainer side is deterministic given its inputs; the servers restart with fresh RNGs, and
  which samples form a batch depends on completion order. So a resumed run equals an uninterrupted one
  exactly (up to float rounding) only when sampling is greedy and batches are synchronous (eta 0): see
  tests/test_checkpoint.py.

Torch is imported lazily (only by the functions that save or load tensors).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from areal_cli.foundations.atomic import write_atomic_many
from areal_cli.foundations.errors import UserError
from areal_cli.foundations.jsonl import lines_up_to_step

__all__ = ["FORMAT", "Checkpoint", "PromptStream", "checkpoint_name", "save_checkpoint", "list_checkpoints",
           "latest_checkpoint", "verify_checkpoint", "load_checkpoint", "restore_trainer", "capture_rng",
           "restore_rng", "truncate_metrics", "staleness_capacity"]

FORMAT = 1
#: The critic's file in a checkpoint (``critic.enabled``).
CRITIC_FILE = "critic.pt"
CHECKPOINTS = "checkpoints"
_CHUNK = 1 << 20


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def staleness_capacity(eta: int, batch_size: int, counters: dict) -> int:
    """The staleness term of AReaL's admission rule: ``(eta + version + 1) * B - (accepted + running)``."""
    return (eta + counters["version"] + 1) * batch_size - (counters["accepted"] + counters["running"])


# ---------------------------------------------------------------------------------------------------------
# data position
# ---------------------------------------------------------------------------------------------------------
class PromptStream:
    """The training prompts of a run, with a position that a checkpoint can store.

    Iterates ``to_item(problem)`` over ``problems`` (an endless seeded stream), after first re-issuing the
    stream indices in ``pending``. ``issued[j]`` is the stream index of the j-th item handed out: the
    controller numbers its groups in the same order, so group id ``j`` has prompt ``issued[j]``.

    Args:
        problems: the task's stream (a fresh one: its first item has index 0).
        to_item: problem -> :class:`~areal_cli.rollout.controller.PromptItem`.
        next_index: stream items already drawn before (skipped now, without ``to_item``).
        pending: stream indices (< ``next_index``) to issue again first, in ascending order.
    """

    def __init__(self, problems: Iterator[Any], to_item: Callable[[Any], Any], *, next_index: int = 0,
                 pending: list[int] | None = None) -> None:
        self._problems = problems
        self._to_item = to_item
        self.next_index = 0
        self.issued: list[int] = []
        self._cache: dict[int, Any] = {}
        want = set(pending or ())
        if any(i >= next_index or i < 0 for i in want):
            raise ValueError(f"pending indices must lie in [0, {next_index}), got {sorted(want)}")
        while self.next_index < next_index:  # fast-forward, keeping only the problems to re-issue
            p = next(self._problems)
            if self.next_index in want:
                self._cache[self.next_index] = p
            self.next_index += 1
        self._reissue = sorted(want)

    def __iter__(self) -> "PromptStream":
        return self

    def __next__(self) -> Any:
        if self._reissue:
            idx = self._reissue.pop(0)
            problem = self._cache.pop(idx)
        else:
            idx, problem = self.next_index, next(self._problems)
            self.next_index += 1
        self.issued.append(idx)
        return self._to_item(problem)

    def position(self, pending_group_ids: list[int]) -> dict:
        """``{"next_index", "pending"}`` given the controller's pending group ids (see the module docstring)."""
        pending = {self.issued[g] for g in pending_group_ids} | set(self._reissue)
        return {"next_index": self.next_index, "pending": sorted(pending)}


# ---------------------------------------------------------------------------------------------------------
# RNG
# ---------------------------------------------------------------------------------------------------------
def capture_rng() -> dict:
    """RNG states of this process: python, numpy (if imported), torch CPU, CUDA (if any), Megatron tracker."""
    import sys

    import torch

    out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if "numpy" in sys.modules:
        out["numpy"] = sys.modules["numpy"].random.get_state()
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    try:
        from megatron.core import tensor_parallel

        out["megatron"] = tensor_parallel.get_cuda_rng_tracker().get_states()
    except Exception:  # noqa: BLE001 - tracker not initialised: nothing to save
        pass
    return out


def restore_rng(state: dict) -> None:
    """Set the RNG states captured by :func:`capture_rng`."""
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "megatron" in state:
        try:
            from megatron.core import tensor_parallel

            tensor_parallel.get_cuda_rng_tracker().set_states(state["megatron"])
        except Exception:  # noqa: BLE001 - tracker not initialised
            pass


# ---------------------------------------------------------------------------------------------------------
# save
# ---------------------------------------------------------------------------------------------------------
def save_checkpoint(run_dir: Path, step: int, *, hf_dir: Path, optimizer_state: dict, rng: dict, state: dict,
                    keep: int, extra: dict[str, object] | None = None) -> Path:
    """Write ``run_dir/checkpoints/step-NNNNNN`` atomically; keep the newest ``keep``; return its path.

    Args:
        hf_dir: the HF weights directory of the checkpointed policy version (copied into ``hf/``).
        optimizer_state: ``optimizer.state_dict()``.
        rng: :func:`capture_rng`.
        state: JSON-able loop state (``state.json``).
        extra: more files, name -> object for ``torch.save`` (the critic: :data:`CRITIC_FILE`).
    """
    import torch

    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".step-*.tmp-*"):  # left by a process killed while saving
        shutil.rmtree(stale, ignore_errors=True)
    final = root / checkpoint_name(step)
    tmp = root / f".{final.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        shutil.copytree(hf_dir, tmp / "hf")
        torch.save(optimizer_state, tmp / "optimizer.pt")
        torch.save(rng, tmp / "rng.pt")
        for name, obj in (extra or {}).items():
            torch.save(obj, tmp / name)
        (tmp / "state.json").write_text(json.dumps(state, indent=2) + "\n")
        files = {}
        for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
            files[f.relative_to(tmp).as_posix()] = {"sha256": _sha256(f), "bytes": f.stat().st_size}
        manifest = {"format": FORMAT, "step": step, "files": files}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        with open(tmp / "manifest.json", "rb") as fh:
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if final.exists():  # the same step written again (a resumed run): replace it
            old = root / f".{final.name}.old-{uuid.uuid4().hex[:12]}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else ():
        shutil.rmtree(old, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------------------------------------
# find, verify, load
# ---------------------------------------------------------------------------------------------------------
def list_checkpoints(run_dir: Path) -> list[Path]:
    """``step-*`` directories of a run, oldest first (``.tmp`` directories of interrupted saves excluded)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")
                  and p.name[5:].isdigit())


def latest_checkpoint(path: Path) -> Path:
    """The checkpoint to resume from: ``path`` itself if it is one (has ``manifest.json`` or is a ``step-*``
    directory), else the newest ``step-*`` of the run directory ``path``.

    Raises:
        UserError: ``path`` missing, or a run directory without checkpoints.
    """
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"{p}: --resume needs a run directory (or one of its checkpoints); not found")
    if (p / "manifest.json").exists() or (p.name.startswith("step-") and p.parent.name == CHECKPOINTS):
        return p
    found = list_checkpoints(p)
    if not found:
        raise UserError(f"{p}: no checkpoint to resume from ({p / CHECKPOINTS}/step-* missing; "
                        f"checkpoints are written with -o loop.checkpoint_every=N)")
    return found[-1]


def verify_checkpoint(ckpt: Path) -> dict:
    """Check every file of ``ckpt`` against its manifest; return the manifest.

    Raises:
        UserError: one line naming the file: manifest missing/unreadable, file missing, size or checksum
            mismatch, or an unexpected file.
    """
    ckpt = Path(ckpt)
    mpath = ckpt / "manifest.json"
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
        if manifest.get("format") != FORMAT or not isinstance(files, dict):
            raise ValueError
    except FileNotFoundError:
        raise UserError(f"{mpath}: missing (not a complete checkpoint)") from None
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise UserError(f"{mpath}: unreadable or not a checkpoint manifest (format {FORMAT})") from None
    for rel, meta in files.items():
        f = ckpt / rel
        if not f.is_file():
            raise UserError(f"{f}: missing (listed in {mpath.name})")
        size = f.stat().st_size
        if size != meta.get("bytes"):
            raise UserError(f"{f}: size {size} bytes, manifest says {meta.get('bytes')} (truncated or altered)")
        if _sha256(f) != meta.get("sha256"):
            raise UserError(f"{f}: checksum mismatch")
    return manifest


@dataclass
class Checkpoint:
    """A verified checkpoint: its directory, manifest and loop state (``state.json``)."""

    path: Path
    manifest: dict
    state: dict

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def hf_dir(self) -> Path:
        return self.path / "hf"

    def load_optimizer_state(self) -> dict:
        import torch

        return torch.load(self.path / "optimizer.pt", map_location="cpu", weights_only=True)

    def load_rng(self) -> dict:
        import torch

        # python's random state holds a tuple of ints and numpy's an ndarray: not weights-only material.
        # The file's checksum was verified against the manifest first.
        return torch.load(self.path / "rng.pt", map_location="cpu", weights_only=False)


def load_checkpoint(path: Path) -> Checkpoint:
    """Find (:func:`latest_checkpoint`) and verify (:func:`verify_checkpoint`) a checkpoint.

    Raises:
        UserError: no checkpoint, or a corrupted one (one line naming the file).
    """
    ckpt = latest_checkpoint(path)
    manifest = verify_checkpoint(ckpt)
    try:
        state = json.loads((ckpt / "state.json").read_text())
        int(state["step"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{ckpt / 'state.json'}: missing or not a checkpoint state") from None
    return Checkpoint(ckpt, manifest, state)


def restore_trainer(engine, ckpt: Checkpoint) -> None:
    """Load the checkpoint's weights and AdamW state into ``engine`` (run on the trainer thread)."""
    engine.load_hf(ckpt.hf_dir)
    engine.optimizer.load_state_dict(ckpt.load_optimizer_state())
    engine.steps = int(ckpt.state.get("engine_steps", engine.steps))


def _read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def metrics_up_to(path: Path, step: int) -> list[dict]:
    """The rows of ``metrics.jsonl`` up to RL step ``step``: what a run resumed from that step keeps of it (the
    lines :func:`truncate_metrics` keeps)."""
    return [row for _, row in lines_up_to_step(_read_lines(path), step)]


def truncate_metrics(path: Path, step: int, *, write: bool = True) -> int:
    """Keep the lines of ``metrics.jsonl`` up to RL step ``step`` (drop later lines and a torn last line);
    written atomically (``write=False``: only check). Returns the number of lines dropped.

    Raises:
        UserError: the file lacks the line of ``step`` (it does not belong to this checkpoint).
    """
    lines = _read_lines(path)
    kept, seen = [], False
    for line, row in lines_up_to_step(lines, step):
        kept.append(line)
        seen = seen or row["step"] == step
    if not seen:
        raise UserError(f"{path}: no line for step {step}; it does not match the checkpoint")
    if write:
        write_atomic_many({path: "".join(line + "\n" for line in kept)})
    return len(lines) - len(kept)


def save_trainer_checkpoint(engine, run_dir: Path, step: int, *, hf_dir: Path, rng: dict, state: dict,
                            keep: int) -> Path | None:
    """Trainer-side call (``areal_cli.train_loop.checkpoint:save_trainer_checkpoint`` through the trainer group,
    run on every rank): :func:`save_checkpoint` with the engine's optimizer state, written by global rank 0 only
    (data-parallel replicas hold the same state; config refuses checkpoints with model parallelism); with a
    critic on the engine also :data:`CRITIC_FILE`."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    extra = None
    if getattr(engine, "critic", None) is not None:  # critic.enabled: its weights and AdamW state
        from areal_cli.trainer.critic import critic_state

        extra = {CRITIC_FILE: critic_state(engine)}
    return save_checkpoint(run_dir, step, hf_dir=hf_dir, optimizer_state=engine.optimizer.state_dict(), rng=rng,
                           state=state, keep=keep, extra=extra)

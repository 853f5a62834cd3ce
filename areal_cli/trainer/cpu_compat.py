"""The ONE module holding every CPU/gloo adaptation of megatron-core 0.16.1, plus distributed init helpers.

megatron-core is written for CUDA. Its model code (GPTModel + the "local" layer spec, i.e. modules written
in plain PyTorch, no Transformer Engine / Apex) runs on CPU except for a handful of places that assume a
GPU exists. :func:`apply_cpu_compat` patches exactly those places, and only when
``torch.cuda.is_available()`` is False; on a GPU machine it does nothing, so the same trainer code runs
unpatched there. Each patch is listed in :data:`PATCHES` with what Megatron assumes, where, and why the
replacement is safe. Megatron's own optimizer (``megatron.core.optimizer``) and its
grad-clipping helpers also create ``device="cuda"`` tensors; the trainer does not use them (it uses
``torch.optim.AdamW`` and its own norm), so they are NOT patched here. The pipeline schedules are used
under pipeline parallel (one patch, ``pipeline_schedule_cpu``).

Distributed init (:func:`init_distributed`, :func:`init_model_parallel`, :func:`setup_megatron`) is
idempotent and reusable by many engines/tests in one process. It works single-process (world size 1,
in-process store, no port) and under ``torchrun`` (``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``
in the environment, ``env://`` rendezvous), so tensor/data parallelism can use ``parallel_state`` later.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core.tensor_parallel import random as mrandom

__all__ = [
    "PATCHES",
    "CpuRNGStatesTracker",
    "apply_cpu_compat",
    "cpu_compat_applied",
    "init_distributed",
    "init_single_process_gloo",
    "init_model_parallel",
    "seed_model_parallel",
    "setup_megatron",
]


@dataclass(frozen=True)
class Patch:
    """Documentation record of one CPU adaptation (see :data:`PATCHES`)."""

    name: str
    target: str  # megatron file / function (or torch attribute) patched
    assumes: str  # what Megatron assumes
    why_safe: str  # why the replacement is correct on a CPU-only machine


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="current_device_cpu",
        target="torch.cuda.current_device (called by megatron/core/models/common/embeddings/"
        "rotary_pos_embedding.py RotaryEmbedding.get_emb, tensor_parallel/mappings.py gathers, "
        "tensor_parallel/utils.py, layers.py GPU-init paths)",
        assumes="a current CUDA device exists; RotaryEmbedding.get_emb moves inv_freq 'to the GPU' on the "
        "first forward, TP gathers allocate their output buffers on it",
        why_safe="on a machine without CUDA the original raises AssertionError on every call, so the only "
        "behaviour changed is crash -> tensors stay on the CPU (the device everything else is on); the "
        "replacement returns torch.device('cpu'), which every device= argument and .to() accepts",
    ),
    Patch(
        name="rng_tracker_cpu",
        target="megatron/core/tensor_parallel/random.py: CudaRNGStatesTracker (add/fork), "
        "_get_cuda_rng_state, _set_cuda_rng_state",
        assumes="named CUDA generator states (model_parallel_cuda_manual_seed, tracker.fork() around "
        "attention dropout and GPU weight init, activation-recompute RNG restore)",
        why_safe="the tracker keeps the same named-state semantics (data/model/expert parallel seeds from "
        "model_parallel_cuda_manual_seed, fork = swap in a named state, save it back on exit, restore the "
        "caller's state) but on the CPU default generator, which is where CPU dropout draws from; "
        "forward results do not depend on it when dropout is 0 (Qwen3), and with dropout > 0 the streams "
        "stay reproducible per seed and separated per TP rank exactly as Megatron intends",
    ),
    Patch(
        name="causal_mask_cpu",
        target="megatron/core/transformer/utils.py get_default_causal_mask / get_sliding_window_causal_mask "
        "(also bound by name in megatron/core/fusions/fused_softmax.py)",
        assumes="the causal mask built when attention_mask=None is allocated with device='cuda'",
        why_safe="same triangular boolean mask, built on the CPU (the device of the attention scores); "
        "only reached when the caller passes attention_mask=None",
    ),
    Patch(
        name="pipeline_schedule_cpu",
        target="megatron/core/pipeline_parallel/schedules.py forward_backward_no_pipelining / "
        "forward_backward_pipelining_with(out)_interleaving: "
        "total_num_tokens = torch.zeros([], dtype=torch.int, device=\"cuda\") (line 2138 for the "
        "non-interleaved pipeline schedule)",
        assumes="a token counter can be allocated on a CUDA device (AssertionError 'Torch not compiled with "
        "CUDA enabled' on a CPU-only build)",
        why_safe="the module's ``torch`` name is replaced by a proxy forwarding every attribute to torch "
        "except ``zeros``, which maps device='cuda' to the CPU; the counter is only summed and read back. "
        "The other CUDA call of the pipeline path, torch.cuda.synchronize() after batched p2p "
        "(p2p_communication.py:398), is avoided by the config (batch_p2p_sync=False without CUDA), not "
        "patched",
    ),
)

_LOCK = threading.RLock()
_APPLIED: list[str] = []
_MARK = "__areal_cpu_compat__"


def cpu_compat_applied() -> list[str]:
    """Names of the patches applied in this process (empty on GPU machines or before :func:`apply_cpu_compat`)."""
    return list(_APPLIED)


def _cpu_current_device() -> torch.device:
    return torch.device("cpu")


setattr(_cpu_current_device, _MARK, True)


_ORIG_TRACKER_CLASS = mrandom.CudaRNGStatesTracker
if getattr(_ORIG_TRACKER_CLASS, _MARK, False):  # module re-executed after patching (importlib.reload)
    _ORIG_TRACKER_CLASS = _ORIG_TRACKER_CLASS.__mro__[1]


class CpuRNGStatesTracker(_ORIG_TRACKER_CLASS):  # type: ignore[misc, valid-type]
    """Megatron's RNG states tracker on the CPU default generator (installed by :func:`apply_cpu_compat`).

    ``add(name, seed)`` stores the state of a CPU generator seeded with ``seed``; ``fork(name)`` swaps that
    state into the CPU default generator for the ``with`` body, saves the advanced state back under
    ``name`` and restores the caller's state (nesting like the CUDA original). Raises the same exceptions
    as the original (megatron/core/tensor_parallel/random.py) for a duplicate seed/name or an unknown name.
    """

    def add(self, name, seed):
        self._is_initialized = True
        if seed in self.seeds_:
            raise Exception("seed {} already exists".format(seed))
        self.seeds_.add(seed)
        if name in self.states_:
            raise Exception("cuda rng state {} already exists".format(name))
        gen = torch.Generator(device="cpu")
        gen.manual_seed(seed)
        self.states_[name] = gen.get_state()

    @contextlib.contextmanager
    def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
        if name not in self.states_:
            raise Exception("cuda rng state {} is not added".format(name))
        orig_state = torch.get_rng_state()
        orig_name = self._current_state_name
        if orig_name != "default-rng":
            self.states_[orig_name] = orig_state
        torch.set_rng_state(self.states_[name])
        self._current_state_name = name
        try:
            yield
        finally:
            if self._current_state_name != name:
                raise Exception(
                    f"current state name {self._current_state_name} is not the same as the desired "
                    f"state name {name}."
                )
            self.states_[name] = torch.get_rng_state()
            if orig_name != "default-rng":
                orig_state = self.states_[orig_name]
            torch.set_rng_state(orig_state)
            self._current_state_name = orig_name


setattr(CpuRNGStatesTracker, _MARK, True)


def _get_cpu_rng_state(device=None, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    state = torch.get_rng_state()
    return state.clone() if clone else state


def _set_cpu_rng_state(new_state: torch.Tensor, device=None, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


def _cpu_default_causal_mask(sq: int) -> torch.Tensor:
    return torch.triu(torch.ones(sq, sq, device="cpu"), diagonal=1).bool()


def _cpu_sliding_window_causal_mask(sq, skv, window_size):
    m = torch.ones(sq, skv, dtype=torch.bool, device="cpu")
    mu = torch.triu(m, diagonal=skv - sq - window_size[0])
    ml = torch.tril(mu, diagonal=skv - sq + window_size[1])
    return ~ml


for _f in (_get_cpu_rng_state, _set_cpu_rng_state, _cpu_default_causal_mask, _cpu_sliding_window_causal_mask):
    setattr(_f, _MARK, True)


class _TorchCpuZeros:
    """Stand-in for the ``torch`` module inside megatron's pipeline schedules (:data:`PATCHES`)."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, **kwargs):
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return torch.zeros(*args, **kwargs)


setattr(_TorchCpuZeros, _MARK, True)


def apply_cpu_compat() -> list[str]:
    """Apply every patch in :data:`PATCHES` if this process has no CUDA device; idempotent, thread-safe.

    Returns:
        The names of the patches in effect, in :data:`PATCHES` order (an empty list when CUDA is available:
        nothing is patched then).
    """
    if torch.cuda.is_available():
        return []
    with _LOCK:
        # 1. torch.cuda.current_device -> cpu
        if not getattr(torch.cuda.current_device, _MARK, False):
            torch.cuda.current_device = _cpu_current_device
        if "current_device_cpu" not in _APPLIED:
            _APPLIED.append("current_device_cpu")

        # 2. RNG tracker / state getters on the CPU generator
        mrandom.CudaRNGStatesTracker = CpuRNGStatesTracker
        mrandom._get_cuda_rng_state = _get_cpu_rng_state
        mrandom._set_cuda_rng_state = _set_cpu_rng_state
        tracker = mrandom._CUDA_RNG_STATE_TRACKER
        if tracker is not None and not getattr(type(tracker), _MARK, False):
            # created before the patch with the CUDA class: rebuild it (states are re-added by seeding)
            mrandom.initialize_rng_tracker(force_reset=True)
        if "rng_tracker_cpu" not in _APPLIED:
            _APPLIED.append("rng_tracker_cpu")

        # 3. causal masks on the CPU
        from megatron.core.fusions import fused_softmax
        from megatron.core.transformer import utils as tutils

        for mod in (tutils, fused_softmax):
            mod.get_default_causal_mask = _cpu_default_causal_mask
            mod.get_sliding_window_causal_mask = _cpu_sliding_window_causal_mask
        if "causal_mask_cpu" not in _APPLIED:
            _APPLIED.append("causal_mask_cpu")

        # 4. pipeline schedules' CUDA token counter
        from megatron.core.pipeline_parallel import schedules

        if not getattr(type(schedules.torch), _MARK, False):
            schedules.torch = _TorchCpuZeros()
        if "pipeline_schedule_cpu" not in _APPLIED:
            _APPLIED.append("pipeline_schedule_cpu")
        return list(_APPLIED)


# ---------------------------------------------------------------------------------------------------------
# distributed / model-parallel initialisation
# ---------------------------------------------------------------------------------------------------------


def _under_launcher() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def init_distributed(backend: str | None = None, *, timeout_s: float = 1800.0) -> tuple[int, int]:
    """Initialise ``torch.distributed`` once per process; later calls return the existing (rank, world).

    Under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set) it joins the group
    with ``env://``; otherwise it creates a world of size 1 on an in-process ``HashStore`` (no port, no
    rendezvous). ``backend`` defaults to ``"gloo"`` without CUDA and ``"nccl"`` with it.

    Returns:
        ``(rank, world_size)``.
    Raises:
        RuntimeError: from ``init_process_group`` (e.g. rendezvous timeout).
    """
    with _LOCK:
        if dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s)
        if _under_launcher():
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
        else:
            store = dist.HashStore()
            dist.init_process_group(backend=backend, store=store, rank=0, world_size=1, timeout=timeout)
        return dist.get_rank(), dist.get_world_size()


def init_single_process_gloo() -> tuple[int, int]:
    """Make sure a gloo process group exists: world size 1 unless already launched by ``torchrun``.

    Equivalent to ``init_distributed("gloo")``. Returns ``(rank, world_size)``; idempotent.
    """
    return init_distributed("gloo")


def init_model_parallel(tensor_parallel: int = 1, pipeline_parallel: int = 1) -> None:
    """Initialise megatron ``parallel_state`` once (after :func:`init_distributed`); idempotent.

    The data-parallel size is ``world_size / (tensor_parallel * pipeline_parallel)``.
    Raises:
        RuntimeError: already initialised with different TP/PP sizes, or sizes not dividing the world.
    """
    from megatron.core import parallel_state as ps

    with _LOCK:
        if ps.model_parallel_is_initialized():
            tp = ps.get_tensor_model_parallel_world_size()
            pp = ps.get_pipeline_model_parallel_world_size()
            if (tp, pp) != (tensor_parallel, pipeline_parallel):
                raise RuntimeError(
                    f"megatron parallel_state already initialised with TP={tp} PP={pp}, "
                    f"requested TP={tensor_parallel} PP={pipeline_parallel}"
                )
            return
        world = dist.get_world_size()
        if world % (tensor_parallel * pipeline_parallel) != 0:
            raise RuntimeError(f"world size {world} not divisible by TP*PP={tensor_parallel * pipeline_parallel}")
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tensor_parallel,
            pipeline_model_parallel_size=pipeline_parallel,
        )


def seed_model_parallel(seed: int) -> None:
    """Seed torch's CPU generator and Megatron's RNG tracker (data/model/expert parallel states).

    ``torch.manual_seed(seed)`` then ``model_parallel_cuda_manual_seed(seed)`` (which gives TP rank r the
    model-parallel seed ``seed + 2718 + r``; megatron/core/tensor_parallel/random.py). Re-callable.
    """
    torch.manual_seed(seed)
    mrandom.model_parallel_cuda_manual_seed(seed)


def setup_megatron(*, tensor_parallel: int = 1, pipeline_parallel: int = 1, seed: int = 0) -> tuple[int, int]:
    """Everything a Megatron model needs before construction, in order; idempotent except for reseeding.

    1. :func:`apply_cpu_compat` (no-op with CUDA); 2. :func:`init_distributed`; 3. :func:`init_model_parallel`;
    4. :func:`seed_model_parallel` with ``seed``.

    Returns:
        ``(rank, world_size)`` of ``torch.distributed``.
    """
    apply_cpu_compat()
    rank, world = init_distributed()
    init_model_parallel(tensor_parallel, pipeline_parallel)
    seed_model_parallel(seed)
    return rank, world

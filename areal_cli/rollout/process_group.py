"""A weight-update process group beside the default ``torch.distributed`` group, and the receive side of its
broadcast (SGLang's ``init_custom_process_group``; torch is imported lazily).

Both ends use it: the trainer's head rank joins as rank 0 (:class:`~areal_cli.rollout.weight_sender.WeightSender`),
each embedded server joins as ``rank_offset`` (``/init_weights_update_group``) and receives one tensor per
:class:`~areal_cli.rollout.protocol.ParamSpec` (``/update_weights_from_distributed``).
"""

from __future__ import annotations

import logging
from typing import Sequence

from areal_cli.rollout.protocol import ParamSpec

log = logging.getLogger("areal.rollout.weight_sync")


def init_custom_process_group(backend: str, init_method: str, world_size: int, rank: int, group_name: str,
                              timeout_s: float):
    """A new process group that leaves the default ``torch.distributed`` group alone.

    The recipe of SGLang's ``sglang.srt.utils.init_custom_process_group`` (also used by AReaL and OpenRLHF):
    a TCPStore at ``init_method`` (rank 0 hosts it; SGLang goes through ``rendezvous``, which under torchrun joins the agent's store instead), ``PrefixStore(group_name, store)``,
    ``_new_process_group_helper(world_size, rank, [], backend, store, group_name=...)`` and an identity
    rank map so ``dist.broadcast(..., group=pg)`` works without a default group. Blocks until all
    ``world_size`` ranks joined or ``timeout_s`` passed.

    Raises:
        RuntimeError / DistStoreError: the others did not join in time.
    """
    from datetime import timedelta

    import torch
    from torch.distributed.distributed_c10d import (
        Backend, PrefixStore, _new_process_group_helper, _world,
    )

    timeout = timedelta(seconds=timeout_s)
    # A TCPStore built directly, not through rendezvous(): under torchrun (TORCHELASTIC_USE_AGENT_STORE set)
    # rendezvous() connects to the agent's store instead of serving one, and the servers then wait forever.
    from urllib.parse import urlsplit

    u = urlsplit(init_method)
    if u.scheme != "tcp" or not u.hostname or not u.port:
        raise ValueError(f"init_method must be tcp://host:port, got {init_method!r}")
    store = torch.distributed.TCPStore(u.hostname, u.port, world_size, is_master=(rank == 0), timeout=timeout,
                                       wait_for_workers=False)
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    release = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    opt_name = "backend_options" if release >= (2, 6) else "pg_options"  # renamed in torch 2.6
    pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), store, group_name=group_name,
                                      timeout=timeout, **{opt_name: None})
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def destroy_process_group(pg) -> None:
    """Destroy a group made by :func:`init_custom_process_group` (errors are logged, not raised)."""
    if pg is None:
        return
    try:
        import torch.distributed as dist

        dist.destroy_process_group(pg)
    except Exception as e:  # noqa: BLE001 - teardown is best effort
        log.warning("destroying weight-update group failed: %r", e)



def receive_broadcast(pg, specs: Sequence[ParamSpec]) -> dict:
    """Receive one tensor per ParamSpec from rank 0 of ``pg``, in order (``{name: tensor}``): each is allocated
    as ``torch.empty(spec.shape, dtype=spec.dtype)`` and filled by ``dist.broadcast(..., src=0)``."""
    import torch
    import torch.distributed as dist

    out = {}
    for s in specs:
        t = torch.empty(s.shape, dtype=getattr(torch, s.dtype))
        dist.broadcast(t, src=0, group=pg)
        out[s.name] = t
    return out

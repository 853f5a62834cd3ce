"""Weight sync from the trainer to the rollout servers over a collective (NCCL on GPU, gloo on CPU).

The other way, from disk, is ``POST /update_weights_from_disk`` (:mod:`areal_cli.rollout.protocol`,
``RolloutClient.update_weights_from_disk``). This module is the collective way, SGLang's
``/init_weights_update_group`` + ``/update_weights_from_distributed`` + ``/destroy_weights_update_group``, as
AReaL v1 drives it (``weight_update_mode: xccl``; reference ``areal_v1_architecture.md`` §2.1, §2.5):

1. Once: the trainer's head rank picks ``master_address:master_port``, POSTs ``/init_weights_update_group``
   to every server (server i gets ``rank_offset = 1 + i*tp*pp``, ``world_size = 1 + sum(tp*pp)``) and
   joins the new group itself as rank 0. Each server's TP/PP rank r joins as ``rank_offset + r``.
2. Each update: the head rank splits the HF-named tensors into buckets of at most ``chunk_mb``; per bucket
   it POSTs ``/update_weights_from_distributed {names, dtypes, shapes, group_name, ...}`` to every server
   (in a thread: the server answers only once it has received and loaded the bucket) and broadcasts each
   tensor from rank 0 in the same order; the servers allocate ``torch.empty(shape, dtype)`` per entry and
   receive into it.

This module is the orchestration: which trainer rank sends (:func:`sync_weights_from_engine`, every rank
calls it, global rank 0 keeps one sender per fleet) and how the controller wraps the sync in a pause of the
servers (:func:`update_weights_distributed`). The pieces it drives live in their own modules:

- the wire messages (``InitWeightsUpdateGroupRequest``, ``UpdateWeightsFromDistributedRequest``,
  ``DestroyWeightsUpdateGroupRequest``, ``ParamSpec``): :mod:`areal_cli.rollout.protocol`;
- the process group (a NEW group made like SGLang's ``init_custom_process_group``, so the trainer's default
  ``torch.distributed`` group is never touched) and the servers' receive: :mod:`areal_cli.rollout.process_group`;
- the head rank's sender (buckets, rank layout, one group per fleet, teardown after a failure):
  :mod:`areal_cli.rollout.weight_sender`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from areal_cli.rollout.protocol import DEFAULT_GROUP_NAME
from areal_cli.rollout.weight_sender import DEFAULT_CHUNK_MB, WeightSender


# ----------------------------------------------------------------------------------------------------------
# Trainer side: every rank calls sync_weights_from_engine; the controller wraps it in pause/resume
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightSyncSpec:
    """What :func:`sync_weights_from_engine` needs (small and picklable: it travels to every rank).

    Attributes:
        urls: server base URLs. backend: "nccl" | "gloo". master_address ("auto": :func:`routable_address`
        of the first server, computed on the head rank itself): this head rank's address as the
        servers see it. group_name, chunk_mb, server_tp, server_pp, timeout_s: see :class:`WeightSender`.
        abort_all_requests: interruptible mode with pause_mode abort (servers abort in-flight requests) vs
            not (in-place pauses keep them; non-interruptible servers wait for them).
        flush_cache: False for in-place updates (SGLang asserts its post-load prefix-cache flush succeeds, and
            it fails while requests run).
    """

    urls: tuple[str, ...]
    backend: str = "gloo"
    master_address: str = "127.0.0.1"
    group_name: str = DEFAULT_GROUP_NAME
    chunk_mb: float = DEFAULT_CHUNK_MB
    server_tp: int = 1
    server_pp: int = 1
    timeout_s: float = 600.0
    abort_all_requests: bool = True
    flush_cache: bool = True


_SENDERS: dict[tuple, WeightSender] = {}
_SENDERS_LOCK = threading.Lock()


def _global_rank() -> int:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return 0
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def sync_weights_from_engine(engine, spec: WeightSyncSpec, version: int) -> dict | None:
    """Send ``engine.hf_state_dict()`` to the servers of ``spec`` as weight version ``version``.

    Run on EVERY trainer rank (``hf_state_dict`` is collective under tensor/pipeline parallelism); only
    global rank 0 (``torch.distributed`` rank, or 0 without a default group) sends. Rank 0 keeps one
    :class:`WeightSender` per ``(urls, group_name)`` between calls (the group is formed once).

    Returns:
        rank 0: the sender's stats (``seconds``, ``bytes``, ``buckets``, ``tensors``); other ranks: None.
    Raises:
        WeightSyncError: see :meth:`WeightSender.send`.
    """
    state = engine.hf_state_dict()
    if _global_rank() != 0:
        return None
    key = (tuple(spec.urls), spec.group_name)
    with _SENDERS_LOCK:
        sender = _SENDERS.get(key)
        if sender is None:
            master = spec.master_address if spec.master_address != "auto" else routable_address(spec.urls[0])
            sender = WeightSender(list(spec.urls), backend=spec.backend, master_address=master,
                                  group_name=spec.group_name, server_tp=spec.server_tp,
                                  server_pp=spec.server_pp, timeout_s=spec.timeout_s)
            _SENDERS[key] = sender
    return sender.send(list(state.items()), version, chunk_mb=spec.chunk_mb,
                       abort_all_requests=spec.abort_all_requests, flush_cache=spec.flush_cache)


def routable_address(url: str) -> str:
    """This host's IP address on the interface that routes to ``url``'s host (what a server on another node
    must use to reach the group's TCPStore here): a UDP ``connect`` sends nothing, it only picks the route.

    Raises:
        OSError: no route to that host.
    """
    import socket
    from urllib.parse import urlsplit

    host = urlsplit(url if "://" in url else f"http://{url}").hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), 9))
        return s.getsockname()[0]


def close_senders() -> None:
    """Close every cached sender of this process (destroys the groups on both sides)."""
    with _SENDERS_LOCK:
        senders = list(_SENDERS.values())
        _SENDERS.clear()
    for s in senders:
        s.close()


async def update_weights_distributed(client, run_sync: Callable[[], Awaitable[Any]], version: int) -> Any:
    """Controller side of a collective update, with the semantics of ``RolloutClient.update_weights_from_disk``.

    Interruptible client (default): ``client.pause()`` (servers abort in-flight requests, or with the client's
    ``pause_mode`` in_place keep them with their KV; the client holds resubmissions), ``await run_sync()`` (e.g. the trainer group calling :func:`sync_weights_from_engine`
    on every rank), then ``client.resume()`` even when the sync failed; the failure is raised afterwards.
    Non-interruptible: the servers are not paused; the client holds new submissions (``client.hold()``, so
    no request starts between two buckets) and ``run_sync`` must use ``abort_all_requests=False`` (the
    servers let in-flight requests finish before loading each bucket).

    Args:
        client: a ``RolloutClient`` (only ``interruptible``, ``pause``, ``resume``, ``hold``, ``release``,
            ``urls``, ``on_activity`` are used).
        run_sync: coroutine function that performs the sync.
        version: the new version (the label travels in the payload; the client is told once it is loaded, and
            ``on_activity`` hears of it).
    Returns:
        whatever ``run_sync`` returned.
    """
    t0 = time.monotonic()
    paused = bool(getattr(client, "interruptible", True))
    if paused:
        await client.pause()
    else:  # no new request starts on half-updated weights between two buckets
        client.hold()
    try:
        out = await run_sync()
        if hasattr(client, "set_weight_version"):  # before the servers go on (the prefix-cache namespace)
            client.set_weight_version(version)
        return out
    finally:
        if paused:
            await client.resume()
        else:
            client.release()
        cb = getattr(client, "on_activity", None)
        if cb is not None:
            t1 = time.monotonic()
            for u in client.urls:
                cb(u, "update", t0, t1)


def close_engine_senders(engine) -> None:
    """:func:`close_senders` in the form a trainer group calls (``fn(engine)``; every rank, no-op off rank 0)."""
    del engine
    close_senders()

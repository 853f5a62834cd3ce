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

Wire shapes (no recording of these endpoints exists in ``shared/fixtures/sglang``; the field names and
types are those of SGLang's ``python/sglang/srt/managers/io_struct.py``, sgl-project/sglang main):

- ``InitWeightsUpdateGroupReqInput``: ``master_address: str, master_port: int, rank_offset: int,
  world_size: int, group_name: str = "weight_update_group", backend: str = "nccl"``. AReaL sends
  ``master_port`` as a string (pydantic coerces it); we do too, and parse both.
- ``UpdateWeightsFromDistributedReqInput``: ``names: List[str], dtypes: List[str], shapes: List[List[int]],
  group_name = "weight_update_group", flush_cache = True, abort_all_requests = False,
  weight_version: Optional[str] = None, load_format: Optional[str] = None, torch_empty_cache = False``.
  ``dtypes`` are torch dtype names without the ``torch.`` prefix (``"bfloat16"``, ``"float32"``).
- ``DestroyWeightsUpdateGroupReqInput``: ``group_name = "weight_update_group"``.
- Replies (``*ReqOutput``): ``{"success": bool, "message": str}``, HTTP 200 or 400.

The group is a NEW process group made like SGLang's ``init_custom_process_group`` (rendezvous on
``tcp://master_address:master_port``, rank 0 hosts the TCPStore, ``PrefixStore(group_name)``,
``_new_process_group_helper`` with no global ranks), so the default ``torch.distributed`` group of the
trainer is never touched, and the key layout matches a real SGLang server's side of the group.

Everything above the "process groups" section is pure (no I/O, no torch import): it is imported by the
server and by the CLI.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Sequence

from areal_cli.ports import free_port
from areal_cli.rollout.protocol import ProtocolError, parse_error_message

log = logging.getLogger("areal.rollout.weight_sync")

DEFAULT_GROUP_NAME = "weight_update_group"  # SGLang's default group_name
DEFAULT_CHUNK_MB = 1024  # AReaL's weight_chunked_mem_mb default (1 GiB)

# torch dtype name (str(torch.dtype) without "torch.") -> bytes per element
DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}


class WeightSyncError(RuntimeError):
    """A collective weight update failed; the message names the server(s) and what they said."""


# ----------------------------------------------------------------------------------------------------------
# Pure: specs, buckets, ranks, payloads
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamSpec:
    """One tensor of a weight update, as it travels in the payload.

    Attributes:
        name: Hugging Face parameter name (``model.layers.0.mlp.up_proj.weight``).
        shape: tensor shape.
        dtype: torch dtype name without ``torch.`` (``"bfloat16"``, ``"float32"``), a key of DTYPE_BYTES.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """Size in bytes (numel * element size)."""
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the string SGLang expects; AReaL: ``str(dtype).split("torch.")[1]``).

    Raises:
        ValueError: a dtype that cannot travel (not in DTYPE_BYTES).
    """
    s = str(dtype)
    s = s[len("torch."):] if s.startswith("torch.") else s
    if s not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} cannot be sent (supported: {', '.join(sorted(DTYPE_BYTES))})")
    return s


def param_specs(named_tensors: Iterable[tuple[str, Any]] | dict[str, Any]) -> list[ParamSpec]:
    """ParamSpec of each ``(name, tensor)`` in order (any object with ``.shape`` and ``.dtype``).

    Raises:
        ValueError: duplicate name, or a dtype that cannot travel.
    """
    items = named_tensors.items() if isinstance(named_tensors, dict) else named_tensors
    out: list[ParamSpec] = []
    seen: set[str] = set()
    for name, t in items:
        if name in seen:
            raise ValueError(f"weight {name!r} appears twice")
        seen.add(name)
        out.append(ParamSpec(str(name), tuple(int(d) for d in t.shape), dtype_name(t.dtype)))
    return out


def plan_buckets(specs: Sequence[ParamSpec], chunk_mb: float) -> list[list[ParamSpec]]:
    """Split ``specs`` into consecutive buckets of at most ``chunk_mb`` MiB each, order kept.

    A tensor larger than the chunk gets a bucket of its own (AReaL's ``weight_chunked_mem_mb`` rule).

    Raises:
        ValueError: ``chunk_mb`` <= 0.
    """
    if not chunk_mb > 0:
        raise ValueError(f"chunk_mb must be > 0, got {chunk_mb}")
    cap = chunk_mb * 2**20
    buckets: list[list[ParamSpec]] = []
    cur: list[ParamSpec] = []
    used = 0
    for s in specs:
        if cur and used + s.nbytes > cap:
            buckets.append(cur)
            cur, used = [], 0
        cur.append(s)
        used += s.nbytes
    if cur:
        buckets.append(cur)
    return buckets


def rank_offsets(n_servers: int, tp: int = 1, pp: int = 1) -> list[int]:
    """Rank of the first process of each server in the weight-update group: ``[1 + i*tp*pp]``.

    Rank 0 is the trainer's head rank (AReaL ``connect_engine``).

    Raises:
        ValueError: n_servers < 1, tp < 1 or pp < 1.
    """
    if n_servers < 1 or tp < 1 or pp < 1:
        raise ValueError(f"need n_servers, tp, pp >= 1, got {n_servers}, {tp}, {pp}")
    return [1 + i * tp * pp for i in range(n_servers)]


def weight_update_world_size(n_servers: int, tp: int = 1, pp: int = 1) -> int:
    """World size of the weight-update group: the trainer head rank + every server process (``1 + n*tp*pp``)."""
    return 1 + len(rank_offsets(n_servers, tp, pp)) * tp * pp


def build_init_weights_update_group_payload(master_address: str, master_port: int | str, rank_offset: int,
                                            world_size: int, group_name: str = DEFAULT_GROUP_NAME,
                                            backend: str = "nccl") -> dict:
    """``POST /init_weights_update_group`` body (SGLang ``InitWeightsUpdateGroupReqInput``).

    ``master_port`` is sent as a string, as AReaL does.

    Raises:
        ValueError: rank_offset outside ``[1, world_size)``, port outside 1..65535, empty address/name.
    """
    port = int(master_port)
    if not 0 < port < 65536:
        raise ValueError(f"master_port must be in 1..65535, got {master_port!r}")
    if not 1 <= int(rank_offset) < int(world_size):
        raise ValueError(f"rank_offset {rank_offset} must be in [1, world_size={world_size})")
    if not master_address or not group_name:
        raise ValueError("master_address and group_name must be non-empty")
    return {"master_address": str(master_address), "master_port": str(port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": str(group_name), "backend": str(backend)}


def build_update_weights_from_distributed_payload(specs: Sequence[ParamSpec],
                                                  group_name: str = DEFAULT_GROUP_NAME,
                                                  weight_version: str | int | None = None,
                                                  abort_all_requests: bool = True,
                                                  flush_cache: bool = True) -> dict:
    """``POST /update_weights_from_distributed`` body (SGLang ``UpdateWeightsFromDistributedReqInput``):
    ``{names, dtypes, shapes, group_name, flush_cache, abort_all_requests, weight_version?}``.

    Raises:
        ValueError: no specs.
    """
    if not specs:
        raise ValueError("a weight update needs at least one tensor")
    out: dict[str, Any] = {
        "names": [s.name for s in specs],
        "dtypes": [s.dtype for s in specs],
        "shapes": [list(s.shape) for s in specs],
        "group_name": str(group_name),
        "flush_cache": bool(flush_cache),
        "abort_all_requests": bool(abort_all_requests),
    }
    if weight_version is not None:
        out["weight_version"] = str(weight_version)
    return out


def build_destroy_weights_update_group_payload(group_name: str = DEFAULT_GROUP_NAME) -> dict:
    """``POST /destroy_weights_update_group`` body (SGLang ``DestroyWeightsUpdateGroupReqInput``)."""
    return {"group_name": str(group_name)}


@dataclass(frozen=True)
class InitGroupRequest:
    """A parsed ``/init_weights_update_group`` body (fields as SGLang's ``InitWeightsUpdateGroupReqInput``)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = DEFAULT_GROUP_NAME
    backend: str = "nccl"


@dataclass(frozen=True)
class DistributedUpdateRequest:
    """A parsed ``/update_weights_from_distributed`` body."""

    specs: list[ParamSpec]
    group_name: str = DEFAULT_GROUP_NAME
    weight_version: str | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True
    extra: dict = field(default_factory=dict)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int_field(body: dict, key: str, *, lo: int | None = None) -> int:
    v = body.get(key)
    if isinstance(v, str) and v.strip().isdigit():  # pydantic's lax mode takes "29500" for an int
        v = int(v)
    if not _is_int(v):
        raise ProtocolError(f"{key} must be an int, got {v!r}")
    if lo is not None and v < lo:
        raise ProtocolError(f"{key} must be >= {lo}, got {v}")
    return int(v)


def _str_field(body: dict, key: str, default: str | None = None) -> str:
    v = body.get(key, default)
    if not isinstance(v, str) or not v:
        raise ProtocolError(f"{key} must be a non-empty string, got {v!r}")
    return v


def _bool_field(body: dict, key: str, default: bool) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ProtocolError(f"{key} must be a bool, got {v!r}")
    return v


def parse_init_weights_update_group_request(body: Any) -> InitGroupRequest:
    """Parse and check an ``/init_weights_update_group`` body (server side).

    Raises:
        ProtocolError: missing/ill-typed field, port outside 1..65535, rank_offset outside [1, world_size).
    """
    if not isinstance(body, dict):
        raise ProtocolError("The request body must be a JSON object.")
    req = InitGroupRequest(
        master_address=_str_field(body, "master_address"),
        master_port=_int_field(body, "master_port", lo=1),
        rank_offset=_int_field(body, "rank_offset", lo=0),
        world_size=_int_field(body, "world_size", lo=2),
        group_name=_str_field(body, "group_name", DEFAULT_GROUP_NAME),
        backend=_str_field(body, "backend", "nccl"),
    )
    if req.master_port > 65535:
        raise ProtocolError(f"master_port must be in 1..65535, got {req.master_port}")
    if not 1 <= req.rank_offset < req.world_size:
        raise ProtocolError(f"rank_offset {req.rank_offset} must be in [1, world_size={req.world_size}) "
                            f"(rank 0 is the trainer)")
    return req


def parse_update_weights_from_distributed_request(body: Any) -> DistributedUpdateRequest:
    """Parse and check an ``/update_weights_from_distributed`` body (server side).

    Raises:
        ProtocolError: names/dtypes/shapes missing, of different lengths, an unknown dtype, a negative
            dimension, a duplicate name; ill-typed optional fields.
    """
    if not isinstance(body, dict):
        raise ProtocolError("The request body must be a JSON object.")
    names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
    for key, v in (("names", names), ("dtypes", dtypes), ("shapes", shapes)):
        if not isinstance(v, list) or not v:
            raise ProtocolError(f"{key} must be a non-empty list, got {v!r}")
    if not len(names) == len(dtypes) == len(shapes):
        raise ProtocolError(f"names, dtypes and shapes must have the same length "
                            f"({len(names)}, {len(dtypes)}, {len(shapes)})")
    specs: list[ParamSpec] = []
    seen: set[str] = set()
    for i, (n, d, s) in enumerate(zip(names, dtypes, shapes)):
        if not isinstance(n, str) or not n:
            raise ProtocolError(f"names[{i}] must be a non-empty string, got {n!r}")
        if n in seen:
            raise ProtocolError(f"names[{i}] = {n!r} appears twice")
        seen.add(n)
        if not isinstance(d, str) or d.removeprefix("torch.") not in DTYPE_BYTES:
            raise ProtocolError(f"dtypes[{i}] = {d!r} is not a supported dtype "
                                f"({', '.join(sorted(DTYPE_BYTES))})")
        if not isinstance(s, list) or not all(_is_int(x) and x >= 0 for x in s):
            raise ProtocolError(f"shapes[{i}] = {s!r} must be a list of non-negative ints")
        specs.append(ParamSpec(n, tuple(s), d.removeprefix("torch.")))
    wv = body.get("weight_version")
    if wv is not None and not isinstance(wv, (str, int)) or isinstance(wv, bool):
        raise ProtocolError(f"weight_version must be a string, got {wv!r}")
    if body.get("load_format") not in (None, "", "auto"):
        raise ProtocolError(f"load_format {body.get('load_format')!r} is not supported by this server")
    known = {"names", "dtypes", "shapes", "group_name", "weight_version", "abort_all_requests", "flush_cache",
             "load_format"}
    return DistributedUpdateRequest(
        specs=specs,
        group_name=_str_field(body, "group_name", DEFAULT_GROUP_NAME),
        weight_version=None if wv is None else str(wv),
        abort_all_requests=_bool_field(body, "abort_all_requests", False),
        flush_cache=_bool_field(body, "flush_cache", True),
        extra={k: v for k, v in body.items() if k not in known},
    )


def parse_destroy_weights_update_group_request(body: Any) -> str:
    """Group name of a ``/destroy_weights_update_group`` body (``{}`` -> the default name).

    Raises:
        ProtocolError: not an object or a bad group_name.
    """
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise ProtocolError("The request body must be a JSON object.")
    return _str_field(body, "group_name", DEFAULT_GROUP_NAME)


# ----------------------------------------------------------------------------------------------------------
# Process groups (torch imported lazily)
# ----------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------
# Sender (trainer head rank)
# ----------------------------------------------------------------------------------------------------------


def _post(http, url: str, path: str, payload: dict, timeout_s: float) -> str | None:
    """POST ``payload`` with the ``httpx.Client`` ``http``; None on success, else the error message (HTTP
    error or ``success: false``)."""
    import httpx

    try:
        r = http.post(url + path, json=payload, timeout=timeout_s)
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e}"
    try:
        body = r.json()
    except ValueError:
        body = r.text
    if r.status_code >= 400 or (isinstance(body, dict) and body.get("success") is False):
        return f"HTTP {r.status_code}: {parse_error_message(body)}"
    return None


def _in_thread(fn: Callable[[], Any], name: str) -> cf.Future:
    """Run ``fn()`` in a new daemon thread; its result or exception lands in the returned Future."""
    fut: cf.Future = cf.Future()

    def run():
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - delivered to the waiter
            fut.set_exception(e)

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut


class WeightSender:
    """The trainer head rank's side of a collective weight update (rank 0 of a new process group).

    Args:
        urls: server base URLs (``http://host:port``), in rank order.
        backend: "nccl" (GPU tensors) or "gloo" (CPU tensors).
        master_address: address the servers reach this process at (hosts the group's TCPStore).
        master_port: None picks a free port at each group init.
        group_name: SGLang group name.
        server_tp, server_pp: processes per server (``rank_offset = 1 + i*tp*pp``).
        timeout_s: group formation and every collective / HTTP call give up after this long.
    The group is created lazily by the first :meth:`send` (or :meth:`init`). After any failure it is torn
    down on both sides and the next :meth:`send` forms a new one.
    """

    def __init__(self, urls: Sequence[str], *, backend: str = "nccl", master_address: str = "127.0.0.1",
                 master_port: int | None = None, group_name: str = DEFAULT_GROUP_NAME, server_tp: int = 1,
                 server_pp: int = 1, timeout_s: float = 600.0):
        if not urls:
            raise ValueError("WeightSender needs at least one server url")
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend must be nccl or gloo, got {backend!r}")
        self.urls = [u.rstrip("/") for u in urls]
        self.backend = backend
        self.master_address = master_address
        self.master_port = master_port
        self.group_name = group_name
        self.offsets = rank_offsets(len(self.urls), server_tp, server_pp)
        self.world_size = weight_update_world_size(len(self.urls), server_tp, server_pp)
        self.timeout_s = float(timeout_s)
        self.pg = None
        self._stuck: tuple[cf.Future, Any] | None = None
        self._pool = cf.ThreadPoolExecutor(max_workers=min(64, 2 * len(self.urls)), thread_name_prefix="weight-sync")
        import httpx

        # one client for all calls: a new httpx client costs ~0.1 s (SSL context), more than a tiny update
        self._http = httpx.Client(timeout=self.timeout_s,
                                  limits=httpx.Limits(max_connections=2 * len(self.urls)))

    # -- helpers --------------------------------------------------------------------------------------------

    def _run(self, what: str, collective: Callable[[], Any], path: str, payloads: list[dict]) -> None:
        """POST ``payloads[i]`` to server i (threads) while ``collective()`` runs (a thread); wait for all.

        Returns as soon as any server reports a failure (the collective may then never finish: the group is
        abandoned and left to its timeout).

        Raises:
            WeightSyncError: every server failure (``url: message``) and the collective's error.
        """
        posts = {self._pool.submit(_post, self._http, u, path, p, self.timeout_s): u
                 for u, p in zip(self.urls, payloads)}
        coll = _in_thread(collective, f"weight-sync-{what.split()[0]}")  # own thread: it may block to timeout
        pending = set(posts) | {coll}
        errors: list[str] = []
        deadline = time.monotonic() + self.timeout_s + 30
        while pending and not errors:
            done, pending = cf.wait(pending, timeout=max(0.0, deadline - time.monotonic()),
                                    return_when=cf.FIRST_COMPLETED)
            if not done:
                errors.append(f"no answer after {self.timeout_s:.0f} s")
            for f in done:
                if f is coll:
                    if f.exception() is not None:
                        errors.append(f"{self.backend} collective: {f.exception()!r}")
                elif f.result() is not None:
                    errors.append(f"{posts[f]}: {f.result()}")
        if errors:
            # a broken collective usually means a server gave up: give the servers' answers a moment
            cf.wait([f for f in posts if not f.done()], timeout=2.0)
            for f in posts:  # collect what the servers said
                if f.done() and f.result() is not None and f"{posts[f]}: {f.result()}" not in errors:
                    errors.append(f"{posts[f]}: {f.result()}")
            self._abandon(coll)
            server_first = sorted(errors, key=lambda e: not e.startswith(tuple(self.urls)))
            raise WeightSyncError(f"{what} failed: " + "; ".join(server_first))

    def _abandon(self, coll: cf.Future) -> None:
        """Tear the group down after a failure: servers drop theirs, we drop ours (next send re-inits).

        A collective still blocked on the group (it ends at the group timeout at the latest, usually at once
        since the servers dropped their side) is waited for by the next :meth:`init`, which then destroys
        the group: torch refuses a second group of the same name while the first is registered."""
        payload = build_destroy_weights_update_group_payload(self.group_name)
        # waited for, so that a late destroy can never hit the group the next init forms
        cf.wait([self._pool.submit(_post, self._http, u, "/destroy_weights_update_group", payload, 10.0)
                 for u in self.urls], timeout=15.0)
        pg, self.pg = self.pg, None
        if coll.done():
            destroy_process_group(pg)
        elif pg is not None:
            self._stuck = (coll, pg)

    # -- API ------------------------------------------------------------------------------------------------

    def init(self) -> None:
        """Form the group: POST ``/init_weights_update_group`` to all servers while joining as rank 0.

        Raises:
            WeightSyncError: a server refused or the group did not form within ``timeout_s``.
        """
        if self.pg is not None:
            return
        if self._stuck is not None:  # a collective of the abandoned group: let it end, then destroy it
            coll, pg = self._stuck
            cf.wait([coll], timeout=self.timeout_s + 5)
            destroy_process_group(pg)
            self._stuck = None
        port = self.master_port or free_port(self.master_address)
        payloads = [build_init_weights_update_group_payload(self.master_address, port, off, self.world_size,
                                                            self.group_name, self.backend)
                    for off in self.offsets]
        holder: dict[str, Any] = {}

        def join():
            holder["pg"] = init_custom_process_group(self.backend, f"tcp://{self.master_address}:{port}",
                                                     self.world_size, 0, self.group_name, self.timeout_s)

        try:
            self._run("init_weights_update_group", join, "/init_weights_update_group", payloads)
        except WeightSyncError:
            destroy_process_group(holder.pop("pg", None))  # formed, but a server refused
            raise
        self.pg = holder["pg"]
        log.info("weight-update group %s formed: %d ranks, %s, tcp://%s:%d", self.group_name, self.world_size,
                 self.backend, self.master_address, port)

    def send(self, named_tensors: Sequence[tuple[str, Any]] | dict[str, Any], version: int | str,
             chunk_mb: float = DEFAULT_CHUNK_MB, abort_all_requests: bool = True) -> dict:
        """Send HF-named tensors to every server; the last bucket sets ``weight_version = str(version)``.

        Per bucket: POST ``/update_weights_from_distributed`` to every server (threads) and broadcast each
        tensor from rank 0 in payload order; wait for both.

        Args:
            named_tensors: ``[(hf_name, tensor)]`` (or a dict); CPU tensors for gloo, any device for nccl
                (moved to the current CUDA device).
            version: the new weight version label.
            chunk_mb: bucket size cap (MiB).
            abort_all_requests: servers abort in-flight requests first (interruptible mode); False makes
                them wait for in-flight requests to finish (SGLang semantics).
        Returns:
            ``{"seconds", "bytes", "buckets", "tensors"}``.
        Raises:
            WeightSyncError: a server refused a bucket (its url and message), the broadcast failed or timed
                out. The group is torn down; the next call forms a new one.
            ValueError: no tensors, or a dtype that cannot travel.
        """
        import torch
        import torch.distributed as dist

        t0 = time.perf_counter()
        items = list(named_tensors.items()) if isinstance(named_tensors, dict) else list(named_tensors)
        specs = param_specs(items)
        if not specs:
            raise ValueError("nothing to send")
        self.init()
        tensors = {n: t for n, t in items}
        buckets = plan_buckets(specs, chunk_mb)
        device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else None
        for i, bucket in enumerate(buckets):
            last = i == len(buckets) - 1
            payload = build_update_weights_from_distributed_payload(
                bucket, self.group_name, weight_version=version if last else None,
                abort_all_requests=abort_all_requests)
            pg = self.pg

            def bcast(bucket=bucket, pg=pg):
                for s in bucket:
                    t = tensors[s.name].detach()
                    t = t.to(device) if device is not None else t.to("cpu")
                    dist.broadcast(t.contiguous(), src=0, group=pg)
                if device is not None:
                    torch.cuda.synchronize()

            self._run(f"update_weights_from_distributed (bucket {i + 1}/{len(buckets)})", bcast,
                      "/update_weights_from_distributed", [payload] * len(self.urls))
        return {"seconds": time.perf_counter() - t0, "bytes": sum(s.nbytes for s in specs),
                "buckets": len(buckets), "tensors": len(specs)}

    def close(self) -> list[str]:
        """POST ``/destroy_weights_update_group`` to every server and destroy the group. Idempotent.

        Returns:
            the servers' error messages (``url: message``), empty when all agreed.
        """
        errors: list[str] = []
        if self.pg is not None:
            payload = build_destroy_weights_update_group_payload(self.group_name)
            futs = {self._pool.submit(_post, self._http, u, "/destroy_weights_update_group", payload, 30.0): u
                    for u in self.urls}
            errors = [f"{futs[f]}: {f.result()}" for f in futs if f.result() is not None]
            pg, self.pg = self.pg, None
            destroy_process_group(pg)
        return errors

    def __enter__(self) -> "WeightSender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
        abort_all_requests: interruptible mode (servers abort in-flight requests) vs wait for them.
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
                       abort_all_requests=spec.abort_all_requests)


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

    Interruptible client (default): ``client.pause()`` (servers abort in-flight requests, the client holds
    resubmissions), ``await run_sync()`` (e.g. the trainer group calling :func:`sync_weights_from_engine`
    on every rank), then ``client.resume()`` even when the sync failed; the failure is raised afterwards.
    Non-interruptible: the servers are not paused; the client holds new submissions (``client.hold()``, so
    no request starts between two buckets) and ``run_sync`` must use ``abort_all_requests=False`` (the
    servers let in-flight requests finish before loading each bucket).

    Args:
        client: a ``RolloutClient`` (only ``interruptible``, ``pause``, ``resume``, ``hold``, ``release``,
            ``urls``, ``on_activity`` are used).
        run_sync: coroutine function that performs the sync.
        version: the new version (reported to ``on_activity`` only; the label travels in the payload).
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
        return await run_sync()
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

"""The trainer head rank's side of a collective weight update: plan buckets, form the group, send.

:class:`WeightSender` is rank 0 of a new process group (:mod:`areal_cli.rollout.process_group`) with every
server process. Each update splits the HF-named tensors into buckets of at most ``chunk_mb`` MiB (AReaL's
``weight_chunked_mem_mb`` rule); per bucket it POSTs ``/update_weights_from_distributed``
(:class:`~areal_cli.rollout.protocol.UpdateWeightsFromDistributedRequest`) to every server (in a thread: the
server answers only once it has received and loaded the bucket) and broadcasts each tensor from rank 0 in
the same order. Server i's first process is rank ``1 + i*tp*pp`` of a group of ``1 + sum(tp*pp)`` ranks
(AReaL ``connect_engine``). The buckets of one update are sent inside a weight-update session (``POST
/begin_weight_update`` before the first, ``POST /end_weight_update`` after the last, also after a failure):
SGLang 0.5.23 refuses ``/update_weights_from_distributed`` outside one.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from typing import Any, Callable, Iterable, Sequence

from areal_cli.foundations.ports import free_port
from areal_cli.rollout.process_group import destroy_process_group, init_custom_process_group
from areal_cli.rollout.protocol import (
    DEFAULT_GROUP_NAME, DTYPE_BYTES, SESSION_OPEN, BeginWeightUpdateRequest, ParamSpec,
    build_destroy_weights_update_group_payload,
    build_init_weights_update_group_payload, build_update_weights_from_distributed_payload, parse_error_message,
)

log = logging.getLogger("areal.rollout.weight_sync")

DEFAULT_CHUNK_MB = 1024  # AReaL's weight_chunked_mem_mb default (1 GiB)


class WeightSyncError(RuntimeError):
    """A collective weight update failed; the message names the server(s) and what they said."""



# ----------------------------------------------------------------------------------------------------------
# Pure: specs, buckets, ranks
# ----------------------------------------------------------------------------------------------------------


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

    def _post_all(self, path: str, payload: dict, timeout_s: float) -> dict[str, str]:
        """POST ``payload`` to every server at once; ``{url: error message}`` of those that failed."""
        futs = {self._pool.submit(_post, self._http, u, path, payload, timeout_s): u for u in self.urls}
        return {futs[f]: f.result() for f in futs if f.result() is not None}

    def _begin_session(self) -> None:
        """``POST /begin_weight_update`` to every server. A server that still has a session open (an update of a
        process that died mid-way) gets ``/end_weight_update`` and a new begin.

        Raises:
            WeightSyncError: a server refused (its url and message).
        """
        body = BeginWeightUpdateRequest().to_json()
        errors = self._post_all("/begin_weight_update", body, self.timeout_s)
        stale = [u for u, e in errors.items() if SESSION_OPEN in e]
        for u in stale:
            log.warning("%s had a weight-update session open (an earlier update did not end): ending it", u)
            _post(self._http, u, "/end_weight_update", {}, self.timeout_s)
            errors[u] = _post(self._http, u, "/begin_weight_update", body, self.timeout_s)
        errors = {u: e for u, e in errors.items() if e is not None}
        if errors:
            self._post_all("/end_weight_update", {}, 30.0)  # those that began
            raise WeightSyncError("begin_weight_update failed: " + "; ".join(f"{u}: {e}" for u, e in errors.items()))

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
             chunk_mb: float = DEFAULT_CHUNK_MB, abort_all_requests: bool = True, flush_cache: bool = True) -> dict:
        """Send HF-named tensors to every server; the last bucket sets ``weight_version = str(version)``.

        ``/begin_weight_update`` on every server; per bucket: POST ``/update_weights_from_distributed`` to every
        server (threads) and broadcast each tensor from rank 0 in payload order, wait for both;
        ``/end_weight_update`` (also after a failure, best effort).

        Args:
            named_tensors: ``[(hf_name, tensor)]`` (or a dict); CPU tensors for gloo, any device for nccl
                (moved to the current CUDA device).
            version: the new weight version label.
            chunk_mb: bucket size cap (MiB).
            abort_all_requests: servers abort in-flight requests first (interruptible mode); False makes
                them wait for in-flight requests to finish (SGLang semantics).
            flush_cache: SGLang flushes its prefix cache after each bucket's load; False for in-place updates
                (the flush fails, and SGLang asserts, while requests run).
        Returns:
            ``{"seconds", "bytes", "buckets", "tensors"}``.
        Raises:
            WeightSyncError: a server refused the session or a bucket (its url and message), the broadcast failed
                or timed out. After a failed bucket the group is torn down; the next call forms a new one.
            ValueError: no tensors, or a dtype that cannot travel.
        """
        import torch

        t0 = time.perf_counter()
        items = list(named_tensors.items()) if isinstance(named_tensors, dict) else list(named_tensors)
        specs = param_specs(items)
        if not specs:
            raise ValueError("nothing to send")
        self.init()
        tensors = {n: t for n, t in items}
        buckets = plan_buckets(specs, chunk_mb)
        device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else None
        self._begin_session()
        try:
            self._send_buckets(buckets, tensors, version, abort_all_requests, flush_cache, device)
        except BaseException:
            self._post_all("/end_weight_update", {}, 30.0)  # best effort: the servers stay usable
            raise
        errors = self._post_all("/end_weight_update", {}, self.timeout_s)
        if errors:
            raise WeightSyncError("end_weight_update failed: " + "; ".join(f"{u}: {e}" for u, e in errors.items()))
        return {"seconds": time.perf_counter() - t0, "bytes": sum(s.nbytes for s in specs),
                "buckets": len(buckets), "tensors": len(specs)}

    def _send_buckets(self, buckets: list[list[ParamSpec]], tensors: dict, version, abort_all_requests: bool,
                      flush_cache: bool, device) -> None:
        """Each bucket: POST ``/update_weights_from_distributed`` to every server while broadcasting its tensors."""
        import torch
        import torch.distributed as dist

        for i, bucket in enumerate(buckets):
            last = i == len(buckets) - 1
            payload = build_update_weights_from_distributed_payload(
                bucket, self.group_name, weight_version=version if last else None,
                abort_all_requests=abort_all_requests, flush_cache=flush_cache)
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



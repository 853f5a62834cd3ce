"""Asyncio client for SGLang-protocol servers (real SGLang or the embedded server).

- Servers (:mod:`areal_cli.rollout.server_pool`, the base class): round robin, a request id (``rid``) sticking to
  the server it first went to, so the resubmissions of one sample go back to the same server; HTTP on aiohttp;
  servers that die taken out of the rotation; activity intervals for throughput timelines (``on_activity``).
- Interruptible generation (AReaL v1 ``RemoteInfEngine.agenerate``, reference §2.3, without its bugs): when a
  server answers ``finish_reason: abort`` (a pause or a weight update aborted the request), the client waits
  until it is not paused, then resubmits ``prompt + tokens so far`` with the *remaining* budget
  (``original max_new_tokens - generated``; AReaL's PR #858 bug was comparing against the decremented
  budget) and accumulates tokens, logprobs and versions (:mod:`areal_cli.rollout.completion`).
- Per-token policy versions come from the server's ``meta_info.weight_versions`` spans (the weights that
  actually produced each token), see :func:`~areal_cli.rollout.completion.accumulate`.
- Token ids are range-checked against ``vocab_size`` before sending: a real SGLang 0.5.23 server crashes on
  an out-of-range id (fixtures/sglang/errors.json).
- A request that hangs while a server is paused is expected (SGLang holds new requests until continue),
  so the per-request timeout is long (``request_timeout_s``, default 1 h).
- ``health()`` never probes ``/health`` while this client has the servers paused (SGLang's ``/health``
  blocks while paused and then marks the server unhealthy); it returns the last known states instead.
- (added) ``interruptible=False``: a weight update does not abort anything; new submissions wait while the
  servers finish their in-flight requests (``abort_all_requests: false``, SGLang waits for them), then load.
  This is AReaL's non-interruptible baseline (blog v0.3, Fig. 5).
- (added) ``pause_mode="in_place"``: an interruptible weight update pauses the servers in place (SGLang's
  ``/pause_generation {"mode": "in_place"}``): in-flight requests keep their KV cache, computed with the old
  weights, and decode on with the new ones after the load (PipelineRL's in-flight weight update); nothing is
  aborted or re-prefilled, and the tokens after the update carry the new version in their spans.
- (added) Prefix-cache namespaces: every request carries the policy version the servers hold as this client knows
  it (:attr:`RolloutClient.weight_version`: set by its weight updates, raised by the versions responses carry) as
  SGLang's ``extra_key``, so no request reuses KV that older weights computed; in in-place mode a chunk whose first
  token is newer than the version it was sent under is relabelled with that version
  (:func:`~areal_cli.rollout.completion.accumulate`, ``kv_floor``).
- (added) Servers that die: the in-flight samples of a server marked down are re-issued on a live server with
  ``prompt + tokens so far`` and the remaining budget, exactly like a resumption after an abort (counted in
  :attr:`RolloutClient.reissued_samples`).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
import time
from typing import Callable

import httpx

from areal_cli.rollout.completion import Completion, PartialSample, accumulate
from areal_cli.rollout.http_exchange import ConnectFailed, Dropped
from areal_cli.rollout.protocol.control import ContinueGenerationRequest, PauseGenerationRequest
from areal_cli.rollout.protocol.errors import ProtocolError, ServerError, parse_error_message
from areal_cli.rollout.protocol.generate_request import (BatchGenerateRequest, GenerateRequest, SamplingParams,
                                                         cache_key)
from areal_cli.rollout.protocol.generate_response import parse_generate_response, version_to_int
from areal_cli.rollout.protocol.weight_update import UpdateWeightsFromDiskRequest
from areal_cli.rollout.server_pool import CLOSED, ServerPool

__all__ = ["Completion", "RolloutClient"]


class RolloutClient(ServerPool):
    """Client for one or more SGLang-protocol servers (see module docstring).

    Args:
        urls: server base URLs, e.g. ``["http://127.0.0.1:30000"]``.
        vocab_size: ids must lie in ``[0, vocab_size)``.
        request_timeout_s: per HTTP request (a request held by a paused server waits this long).
        max_retries: (added) retries of a request that failed to connect / lost its connection.
        transport: (added) an ``httpx.AsyncBaseTransport`` (tests use ``httpx.MockTransport``).
        interruptible: (added) False: weight updates wait for in-flight requests instead of aborting them.
        pause_mode: (added) how an interruptible update pauses the servers: "abort" (in-flight requests
            return partial and are resubmitted) or "in_place" (they keep their KV and continue).
        on_activity: (added) callback ``(url, kind, start_s, end_s)``, see :mod:`areal_cli.rollout.server_pool`.
        on_server_down: (added) callback ``(url, reason)`` when a server is marked down (once per outage).
        server_down_timeout_s: (added) how long generation waits for a live server when all are down.
    Raises:
        ValueError: no urls, vocab_size < 1, an unknown pause_mode.
    """

    def __init__(self, urls: list[str], *, vocab_size: int, request_timeout_s: float = 3600,
                 max_retries: int = 3, transport: httpx.AsyncBaseTransport | None = None,
                 interruptible: bool = True, pause_mode: str = "abort",
                 on_activity: Callable[[str, str, float, float], None] | None = None,
                 on_server_down: Callable[[str, str], None] | None = None,
                 server_down_timeout_s: float = 600.0):
        super().__init__(urls, request_timeout_s=request_timeout_s, max_retries=max_retries, transport=transport,
                         on_activity=on_activity, on_server_down=on_server_down,
                         server_down_timeout_s=server_down_timeout_s)
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        if pause_mode not in ("abort", "in_place"):
            raise ValueError(f"pause_mode must be abort or in_place, got {pause_mode!r}")
        self.vocab_size = int(vocab_size)
        self._paused = False
        self._health: dict[str, bool] = {}  # url -> last /health result (returned while paused)
        self.interruptible = bool(interruptible)
        self.pause_mode = pause_mode
        self.reissued_samples = 0  # samples re-issued on another server after theirs went down
        self.weight_version: int | None = None  # the policy version the servers hold, as far as this client knows

    def set_weight_version(self, version: int | None) -> None:
        """The servers hold policy ``version`` now (None: unknown): new requests are sent under its cache
        namespace. Called by this client's own weight updates and by whoever started or reset the servers."""
        self.weight_version = None if version is None else int(version)

    def _sent_under(self) -> tuple[str | None, int | None]:
        """``(extra_key, kv_floor)`` of a request sent now (module docstring: prefix-cache namespaces)."""
        v = self.weight_version
        return cache_key(v), (v if self.keeps_requests_on_update else None)

    def _learn(self, resp) -> None:
        """A response says the server holds at least the version it finished with: raise ours to it (a client
        whose weight updates are made by another process learns them this way)."""
        try:
            v = version_to_int(resp.weight_version)
        except ValueError:
            return
        if self.weight_version is None or v > self.weight_version:
            self.weight_version = v

    # -- plumbing -------------------------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume` (resubmissions wait)."""
        return self._paused

    async def _wait_not_paused(self) -> None:
        while self._paused and not self._closed:
            await asyncio.sleep(0.02)
        await self._wait_any_live()

    def _check_ids(self, ids: list[int]) -> None:
        if not isinstance(ids, (list, tuple)) or len(ids) == 0:
            raise ValueError("prompt_ids must be a non-empty list of int")
        V = self.vocab_size
        for j, t in enumerate(ids):
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < V:
                raise ValueError(f"prompt_ids[{j}] = {t!r} is outside the vocabulary [0, {V}) "
                                 f"(a real SGLang server crashes on such ids)")

    # -- generation -----------------------------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], params: SamplingParams, rid: str | None = None
                       ) -> Completion:
        """Generate one sample, resubmitting after aborts until it stops or the budget is used.

        Args:
            prompt_ids: prompt token ids in ``[0, vocab_size)``.
            params: sampling parameters; ``max_new_tokens`` is the total budget over all resubmissions.
            rid: request id (sticky routing key, also sent to the server); default a fresh uuid.
        Returns:
            :class:`Completion` with per-token logprobs and versions.
        Raises:
            ValueError: ids out of range or invalid sampling parameters.
            ServerError: the server answered an HTTP error, or could not be reached after retries.
            ProtocolError: a malformed response.
        """
        self._check_ids(prompt_ids)
        params.validate()
        return await self._finish(list(map(int, prompt_ids)), [], [], [], 0, params, rid or uuid.uuid4().hex)

    async def generate_group(self, prompt_ids: list[int], n: int, params: SamplingParams,
                             rid: str | None = None) -> list[Completion]:
        """Generate ``n`` independent samples of one prompt (a GRPO group) in one batched ``/generate``.

        The first attempt is one SGLang batch request (``input_ids`` = n copies, one rid each) to one server,
        which costs the server and the client far less than n separate requests; samples that come back
        aborted are resumed as in :meth:`generate` (prefix, remaining budget), all of them in one batched
        request per round (per-sample ``sampling_params`` list), so that a weight update, which interrupts
        every running group, costs one request per group and not one per sample. Sample i has rid
        ``{rid}.{i}``; its k-th resubmission ``{rid}.{i}.r{k}``.

        Raises:
            Same as :meth:`generate`.
        """
        self._check_ids(prompt_ids)
        params.validate()
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        prompt = [int(t) for t in prompt_ids]
        rid = rid or uuid.uuid4().hex
        rids = [f"{rid}.{i}" for i in range(n)]
        url = self.choose_server(rid)
        for r in rids:  # the resumed samples stick to the same server
            self._routing.stick(r, url)
        await self._wait_not_paused()
        url = self.choose_server(rid)
        if self._closed:
            return [Completion(prompt, [], [], [], "abort", 0, url, None, r) for r in rids]
        key, floor = self._sent_under()
        try:
            body = await self._post_or_closed(url, "/generate", BatchGenerateRequest(
                [prompt] * n, params, return_logprob=True, rids=rids, extra_key=key).to_json())
        except Exception as e:
            if not self._recoverable(e):
                raise
            await self._server_failed(url, e)
            self.reissued_samples += n
            parts = {i: PartialSample(r) for i, r in enumerate(rids)}
            done = await self._resume_group(prompt, parts, params)
            return [done[i] for i in range(n)]
        if body is CLOSED:
            return [Completion(prompt, [], [], [], "abort", 0, url, None, r) for r in rids]
        resps = parse_generate_response(body)
        if not isinstance(resps, list) or len(resps) != n:
            raise ProtocolError(f"batched /generate of {n} prompts did not return a list of {n} responses")
        out: list[Completion | None] = [None] * n
        aborted: dict[int, PartialSample] = {}
        for i, (r, resp) in enumerate(zip(rids, resps)):
            part = PartialSample(r)
            accumulate(resp, part.ids, part.lps, part.vers, kv_floor=floor)
            self._learn(resp)
            if resp.finish_reason == "abort":
                aborted[i] = part
            elif len(part.ids) > params.max_new_tokens:
                raise ProtocolError(f"server returned {len(part.ids)} tokens for a budget of {params.max_new_tokens}")
            else:
                out[i] = Completion(prompt, part.ids, part.lps, part.vers, resp.finish_reason, 0, url,
                                    resp.matched_stop, r)
        if aborted:
            for i, comp in (await self._resume_group(prompt, aborted, params)).items():
                out[i] = comp
        return out

    async def _resume_group(self, prompt: list[int], parts: dict[int, PartialSample], params: SamplingParams
                            ) -> dict[int, Completion]:
        """Resume aborted samples of one prompt together: each round is one batched ``/generate`` of
        ``prompt + tokens so far`` with each sample's remaining budget, until every sample stops, reaches
        ``params.max_new_tokens`` in total, or the client is closed (then finish_reason "abort")."""
        budget = int(params.max_new_tokens)
        done: dict[int, Completion] = {}
        url = self.choose_server(next(iter(parts.values())).rid)
        for p in parts.values():
            p.n_int = 1

        def finish(i: int, reason: str, matched=None) -> None:
            p = parts.pop(i)
            done[i] = Completion(prompt, p.ids, p.lps, p.vers, reason, p.n_int, url, matched, p.rid)

        for i in [i for i, p in parts.items() if len(p.ids) >= budget]:  # aborted exactly at the budget
            finish(i, "length")
        idle_backoff = 0.0
        while parts:
            await self._wait_not_paused()
            order = list(parts)
            if not self._closed:
                url = self.choose_server(parts[order[0]].rid)
                key, floor = self._sent_under()
                payload = BatchGenerateRequest(
                    [prompt + parts[i].ids for i in order],
                    [replace(params, max_new_tokens=budget - len(parts[i].ids),
                             min_new_tokens=max(0, params.min_new_tokens - len(parts[i].ids))) for i in order],
                    return_logprob=True,
                    # each attempt has its own wire id (a server may still be releasing the aborted one)
                    rids=[f"{parts[i].rid}.r{parts[i].n_int}" for i in order], extra_key=key,
                ).to_json()
                try:
                    body = await self._post_or_closed(url, "/generate", payload)
                except Exception as e:
                    if self._recoverable(e):  # the server went down: re-issue the group elsewhere
                        await self._server_failed(url, e)
                        self.reissued_samples += len(order)
                        for i in order:
                            parts[i].n_int += 1
                        continue
                    if not self._closed:
                        raise
                    body = CLOSED
            if self._closed or body is CLOSED:
                for i in order:
                    finish(i, "abort")
                break
            resps = parse_generate_response(body)
            if not isinstance(resps, list) or len(resps) != len(order):
                raise ProtocolError(f"batched /generate of {len(order)} prompts did not return "
                                    f"a list of {len(order)} responses")
            progressed = False
            for i, resp in zip(order, resps):
                p = parts[i]
                accumulate(resp, p.ids, p.lps, p.vers, kv_floor=floor)
                self._learn(resp)
                progressed = progressed or bool(resp.output_ids)
                if resp.finish_reason != "abort":
                    if len(p.ids) > budget:
                        raise ProtocolError(f"server returned {len(p.ids)} tokens for a budget of {budget}")
                    finish(i, resp.finish_reason, resp.matched_stop)
                elif len(p.ids) >= budget:  # aborted exactly at the end of the budget
                    finish(i, "length")
                else:
                    p.n_int += 1
            # aborts that produced nothing while we are not paused: back off a little so we never spin
            if parts and not progressed and not self._paused:
                idle_backoff = min(1.0, idle_backoff * 2 or 0.05)
                await asyncio.sleep(idle_backoff)
            else:
                idle_backoff = 0.0
        return done

    async def _finish(self, prompt: list[int], out_ids: list[int], out_lps: list[float], out_vers: list[int],
                      n_int: int, params: SamplingParams, rid: str) -> Completion:
        """The interruptible loop: (re)submit ``prompt + out_ids`` with the remaining budget until the
        sample stops, reaches ``params.max_new_tokens`` in total, or the client is closed."""
        budget = int(params.max_new_tokens)
        if n_int and len(out_ids) >= budget:
            return Completion(prompt, out_ids, out_lps, out_vers, "length", n_int, self.choose_server(rid), None, rid)
        url = self.choose_server(rid)
        idle_backoff = 0.0
        while True:
            await self._wait_not_paused()
            if self._closed:
                return Completion(prompt, out_ids, out_lps, out_vers, "abort", n_int, url, None, rid)
            remaining = budget - len(out_ids)
            sp = replace(params, max_new_tokens=remaining,
                         min_new_tokens=max(0, params.min_new_tokens - len(out_ids)))
            # Each attempt has its own wire id (a server may still be releasing the aborted one).
            wire_rid = rid if n_int == 0 else f"{rid}.r{n_int}"
            key, floor = self._sent_under()
            req = GenerateRequest(prompt + out_ids, sp, return_logprob=True, rid=wire_rid, extra_key=key)
            url = self.choose_server(rid)
            try:
                body = await self._post_or_closed(url, "/generate", req.to_json())
            except Exception as e:
                if self._recoverable(e):  # the server went down: re-issue the sample elsewhere
                    await self._server_failed(url, e)
                    self.reissued_samples += 1
                    n_int += 1
                    continue
                if self._closed:
                    return Completion(prompt, out_ids, out_lps, out_vers, "abort", n_int, url, None, rid)
                raise
            if body is CLOSED:
                return Completion(prompt, out_ids, out_lps, out_vers, "abort", n_int, url, None, rid)
            resp = parse_generate_response(body)
            if isinstance(resp, list):
                raise ProtocolError("single /generate returned a list")
            accumulate(resp, out_ids, out_lps, out_vers, kv_floor=floor)
            self._learn(resp)
            if resp.finish_reason != "abort":
                if len(out_ids) > budget:
                    raise ProtocolError(f"server returned {len(out_ids)} tokens for a budget of {budget}")
                return Completion(prompt, out_ids, out_lps, out_vers, resp.finish_reason, n_int, url,
                                  resp.matched_stop, rid)
            if len(out_ids) >= budget:  # aborted exactly at the end of the budget
                return Completion(prompt, out_ids, out_lps, out_vers, "length", n_int, url, None, rid)
            n_int += 1
            # An abort that produced nothing while we are not paused (e.g. someone's abort_all, or a
            # request aborted before prefill): back off a little so we never spin.
            if not resp.output_ids and not self._paused:
                idle_backoff = min(1.0, idle_backoff * 2 or 0.05)
                await asyncio.sleep(idle_backoff)
            else:
                idle_backoff = 0.0

    # -- control --------------------------------------------------------------------------------------------

    @property
    def aborts_on_update(self) -> bool:
        """True when a weight update aborts in-flight requests (interruptible, pause_mode abort): the
        ``abort_all_requests`` of the load calls."""
        return self.interruptible and self.pause_mode == "abort"

    @property
    def keeps_requests_on_update(self) -> bool:
        """True when in-flight requests stay on the servers across a weight update (interruptible, pause_mode
        in_place): the loads then ask for no prefix-cache flush (SGLang asserts a flush succeeds, and it fails
        while requests run)."""
        return self.interruptible and self.pause_mode == "in_place"

    async def pause(self) -> None:
        """Stop resubmissions and pause every server in :attr:`pause_mode` (abort: in-flight requests return
        partial; in_place: they stay on the servers with their KV, not stepped until :meth:`resume`)."""
        self._paused = True
        await self._all("/pause_generation", PauseGenerationRequest(self.pause_mode).to_json())

    async def resume(self) -> None:
        """Continue every server, then let resubmissions go."""
        try:
            await self._all("/continue_generation", ContinueGenerationRequest().to_json())
        finally:
            self._paused = False

    def hold(self) -> None:
        """Hold new submissions and resubmissions here (servers untouched) until :meth:`release`: the
        non-interruptible side of a weight update, whose servers finish in-flight requests first."""
        self._paused = True

    def release(self) -> None:
        """Let held submissions go (see :meth:`hold`)."""
        self._paused = False

    async def update_weights_from_disk(self, model_path: str, version: int) -> None:
        """Load ``model_path`` with ``weight_version = str(version)`` on every server.

        Interruptible (default): pause all servers (in-flight samples are aborted, resumed afterwards; with
        pause_mode in_place they wait on the servers, KV kept), load, continue; servers are always continued,
        even when a load fails. Non-interruptible: hold new
        submissions here, let every server finish its in-flight requests, then load (no abort).
        The first failure is raised after the servers are serving again.

        Raises:
            ServerError: a server refused the update (e.g. bad path) or could not be reached.
        """
        t0 = time.monotonic()
        if self.interruptible:
            await self.pause()
        else:
            self._paused = True  # new submissions wait; in-flight ones run to completion on the servers
        err: BaseException | None = None
        try:
            res = await self._all("/update_weights_from_disk", UpdateWeightsFromDiskRequest(
                model_path, weight_version=str(int(version)), abort_all_requests=self.aborts_on_update,
                flush_cache=False if self.keeps_requests_on_update else None).to_json())
            for url, r in res.items():
                if isinstance(r, dict) and r.get("success") is False:
                    raise ServerError(200, parse_error_message(r), url)
            self.set_weight_version(version)  # before the servers go on: new requests use its cache namespace
        except BaseException as e:  # noqa: BLE001 - re-raised after the servers are continued
            err = e
        if self.interruptible:
            await self.resume()
        else:
            self._paused = False
        if self.on_activity is not None:
            t1 = time.monotonic()
            for u in self.urls:
                self.on_activity(u, "update", t0, t1)
        if err is not None:
            raise err

    async def load_weights_on(self, url: str, model_path: str, version: int) -> None:
        """Load ``model_path`` as ``version`` on one server (a server returning to the rotation); it is not
        paused first (it has nothing in flight).

        Raises:
            ServerError: it refused the update or could not be reached.
        """
        r = await self._post(url, "/update_weights_from_disk", UpdateWeightsFromDiskRequest(
            model_path, weight_version=str(int(version)), abort_all_requests=True).to_json())
        if isinstance(r, dict) and r.get("success") is False:
            raise ServerError(200, parse_error_message(r), url)

    async def health(self) -> dict[str, bool]:
        """(added) ``GET /health`` on every server -> {url: healthy}. Never raises.

        While this client has the servers paused (:attr:`paused`, e.g. during a weight update) nothing is
        probed and the last known states are returned (servers never probed are left out): SGLang 0.5.23's
        ``/health`` runs a generation, so it blocks while paused and after 20 s marks the server unhealthy
        until a later probe succeeds (fixtures/sglang/README.md). For a cheap liveness check use
        :meth:`model_info` (``GET /model_info``), which answers while paused.
        """
        if self._paused:
            return dict(self._health)

        async def one(u: str) -> bool:
            try:
                status, _ = await self._exchange.request("GET", u + "/health", timeout_s=5.0)
                return status == 200
            except (ConnectFailed, Dropped):
                return False
        res = dict(zip(self.urls, await asyncio.gather(*(one(u) for u in self.urls))))
        self._health.update(res)
        return res

    async def model_info(self, url: str | None = None) -> dict:
        """(added) ``GET /model_info`` of one server (default the first).

        Raises:
            ServerError: the server is unreachable or answered an error.
        """
        return await self._get(url or self.urls[0], "/model_info")

    async def server_info(self, url: str | None = None) -> dict:
        """(added) ``GET /server_info`` of one server (default the first): its arguments and ``internal_states``.

        Raises:
            ServerError: the server is unreachable or answered an error.
        """
        return await self._get(url or self.urls[0], "/server_info")

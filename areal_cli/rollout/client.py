"""Asyncio client for SGLang-protocol servers (real SGLang or the embedded server).

- Routing: round robin over ``urls``; a request id (``rid``) sticks to the server it first went to (LRU of
  4096 ids), so the resubmissions of one sample go back to the same server.
- Interruptible generation (AReaL v1 ``RemoteInfEngine.agenerate``, reference §2.3, without its bugs): when a
  server answers ``finish_reason: abort`` (a pause or a weight update aborted the request), the client waits
  until it is not paused, then resubmits ``prompt + tokens so far`` with the *remaining* budget
  (``original max_new_tokens - generated``; AReaL's PR #858 bug was comparing against the decremented
  budget) and accumulates tokens, logprobs and versions.
- Per-token policy versions come from the server's ``meta_info.weight_versions`` spans (the weights that
  actually produced each token), falling back to ``meta_info.weight_version``; ``"default"`` -> 0. AReaL
  instead stamped each chunk with the client's version when the chunk returned (its §2.7 label race).
- Token ids are range-checked against ``vocab_size`` before sending: a real SGLang 0.5.23 server crashes on
  an out-of-range id (fixtures/sglang/errors.json).
- A request that hangs while a server is paused is expected (SGLang holds new requests until continue),
  so the per-request timeout is long (``request_timeout_s``, default 1 h).
- ``health()`` never probes ``/health`` while this client has the servers paused (SGLang's ``/health``
  blocks while paused and then marks the server unhealthy); it returns the last known states instead.
- HTTP runs on aiohttp (an injected ``transport``, tests: ``httpx.MockTransport``, uses httpx); the exchange
  itself, its keep-alive and its failure classes are :mod:`areal_cli.rollout.http_exchange`.
- (added) ``interruptible=False``: a weight update does not abort anything; new submissions wait while the
  servers finish their in-flight requests (``abort_all_requests: false``, SGLang waits for them), then load.
  This is AReaL's non-interruptible baseline (blog v0.3, Fig. 5).
- (added) ``pause_mode="in_place"``: an interruptible weight update pauses the servers in place (SGLang's
  ``/pause_generation {"mode": "in_place"}``): in-flight requests keep their KV cache, computed with the old
  weights, and decode on with the new ones after the load (PipelineRL's in-flight weight update); nothing is
  aborted or re-prefilled, and the tokens after the update carry the new version in their spans.
- (added) Servers that die: a ``/generate`` whose connection fails or breaks is followed by a ``GET /model_info``
  probe (it answers while generation is paused, unlike ``/health``); a server that does not answer is marked
  down (:meth:`mark_down`, also called by a supervisor that saw the process exit or hang) and its in-flight
  samples are re-issued on a live server with ``prompt + tokens so far`` and the remaining budget, exactly like
  a resumption after an abort (counted in :attr:`reissued_samples`). Routing skips down servers; control
  calls (pause, continue, weight loads) go to live servers only. :meth:`mark_up` returns a server (restarted
  with the current weights) to the rotation. With every server down, generation waits up to
  ``server_down_timeout_s`` for one to come back, then raises :class:`ServerError`.
- (added) ``on_activity(url, kind, start, end)`` receives, on ``time.monotonic()`` seconds, each interval in
  which a server had at least one ``/generate`` in flight (kind ``"generate"``), each weight-update
  window (kind ``"update"``) and each ``/generate`` request on its own, from submission to answer (kind
  ``"request"``: one group, or the resumed part of one, per request; the servers' occupancy over time), for
  throughput timelines. It is called on the event loop; keep it cheap.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field, replace
import time
from typing import Any, Callable

import httpx

from areal_cli.rollout.http_exchange import ConnectFailed, Dropped, HttpExchange
from areal_cli.rollout.protocol import (
    BatchGenerateRequest, ContinueGenerationRequest, GenerateRequest, GenerateResponse, PauseGenerationRequest,
    ProtocolError, SamplingParams, ServerError, UpdateWeightsFromDiskRequest, parse_error_message,
    parse_generate_response, version_to_int, versions_from_spans,
)


_CLOSED = object()


class _ServerDown(Exception):
    """The server of a request was marked down while the request was in flight (it is re-issued)."""


@dataclass
class Completion:
    """One finished sample.

    Attributes:
        prompt_ids: the prompt as given.
        output_ids: generated ids (a matched stop/EOS token is the last one), across all resubmissions.
        output_logprobs: behaviour logprob of each output token (as reported by the server that sampled it).
        output_versions: policy version that produced each output token.
        finish_reason: "stop" | "length" ("abort" only when the client was closed mid-request).
        n_interruptions: how many times the request was aborted and resubmitted.
        server_url: the server that produced the last chunk.
        matched_stop: (added) the matched stop id/string when finish_reason is "stop".
        rid: (added) the request id used on the wire.
    """

    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    finish_reason: str
    n_interruptions: int
    server_url: str
    matched_stop: int | str | None = None
    rid: str = ""


@dataclass
class _Partial:
    """An aborted sample of a group being resumed: its tokens so far and interruption count."""

    rid: str
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    vers: list[int] = field(default_factory=list)
    n_int: int = 0


class RolloutClient:
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
        on_activity: (added) callback ``(url, kind, start_s, end_s)``, see the module docstring.
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
        if not urls:
            raise ValueError("RolloutClient needs at least one server url")
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        if pause_mode not in ("abort", "in_place"):
            raise ValueError(f"pause_mode must be abort or in_place, got {pause_mode!r}")
        self.urls = [u.rstrip("/") for u in urls]
        self.vocab_size = int(vocab_size)
        self.request_timeout_s = float(request_timeout_s)
        self.max_retries = int(max_retries)
        self._exchange = HttpExchange(self.request_timeout_s, transport)  # closing: set by aclose()
        self._rr = 0
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._paused = False
        self._closed = False
        self._sticky_max = 4096
        self._health: dict[str, bool] = {}  # url -> last /health result (returned while paused)
        self.interruptible = bool(interruptible)
        self.pause_mode = pause_mode
        self.on_activity = on_activity
        self._in_flight: dict[str, int] = {}  # url -> /generate requests in flight
        self._busy_since: dict[str, float] = {}
        self.on_server_down = on_server_down
        self.server_down_timeout_s = float(server_down_timeout_s)
        self.down: dict[str, str] = {}  # url -> why it is out of the rotation
        self._down_events: dict[str, asyncio.Event] = {}
        self._events_loop: asyncio.AbstractEventLoop | None = None
        self.reissued_samples = 0  # samples re-issued on another server after theirs went down
        self.last_answer: dict[str, float] = {}  # url -> monotonic time of its last /generate answer
        self._control_started: dict[str, list[float]] = {}  # url -> start times of control calls in flight

    # -- plumbing -------------------------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume` (resubmissions wait)."""
        return self._paused

    def in_flight(self, url: str) -> int:
        """``/generate`` requests to ``url`` in flight now."""
        return self._in_flight.get(url, 0)

    def stalled_for(self, url: str) -> float:
        """Seconds ``url`` has owed an answer: since its last ``/generate`` answer while generations are in
        flight, or since the oldest control call (pause, continue, weight load) still waiting on it; 0 when it
        owes nothing. A supervisor probes a server whose debt grows too old (a frozen server holds a pause
        forever, with no generation in flight)."""
        now = time.monotonic()
        waits = [now - min(self._control_started[url])] if self._control_started.get(url) else []
        if self.in_flight(url):
            waits.append(now - self.last_answer.get(url, now))
        return max(waits, default=0.0)

    def live_urls(self) -> list[str]:
        """Servers in the rotation (not marked down)."""
        return [u for u in self.urls if u not in self.down]

    def choose_server(self, rid: str | None) -> str:
        """Server URL for ``rid``: the sticky one if known and live, else the next live one in round-robin
        order (the first server when none is live; callers wait for one with :meth:`_wait_any_live`)."""
        if rid is not None and rid in self._sticky and self._sticky[rid] not in self.down:
            self._sticky.move_to_end(rid)
            return self._sticky[rid]
        live = self.live_urls() or self.urls
        url = live[self._rr % len(live)]
        self._rr += 1
        if rid is not None:
            self._sticky[rid] = url
            while len(self._sticky) > self._sticky_max:
                self._sticky.popitem(last=False)
        return url

    async def _post(self, url: str, path: str, body: Any, *, retries: int | None = None) -> Any:
        """POST JSON, return the decoded JSON (or text) body; raise :class:`ServerError` on HTTP >= 400.

        Connection failures are retried ``max_retries`` times with exponential backoff (0.5 s, 1 s, 2 s).
        A ``/generate`` is retried only when it could not connect (it was never sent): after a dropped
        connection the server may still be running it (a real SGLang server drops the connection when it
        crashes, and a resubmission would only hit the dead server again).
        """
        retries = self.max_retries if retries is None else retries
        retryable: tuple[type[Exception], ...] = (ConnectFailed,) if path == "/generate" else \
            (ConnectFailed, Dropped)
        attempt = 0
        while True:
            try:
                status, data = await self._exchange.request("POST", url + path, body)
                break
            except (ConnectFailed, Dropped) as e:
                if self._closed or attempt >= retries or not isinstance(e, retryable):
                    raise ServerError(None, str(e), url) from e
                await asyncio.sleep(0.5 * 2 ** attempt)
                attempt += 1
        if status >= 400:
            raise ServerError(status, parse_error_message(data), url)
        return data

    async def _post_or_closed(self, url: str, path: str, body: Any) -> Any:
        """:meth:`_post`, or ``_CLOSED`` as soon as :meth:`aclose` is called (the request is cancelled)."""
        self._exchange.ensure_open()
        closing = self._exchange.closing
        post = asyncio.ensure_future(self._post(url, path, body))
        stop = asyncio.ensure_future(closing.wait())
        down = asyncio.ensure_future(self._down_event(url).wait())
        self._activity_enter(url)
        t_request = time.monotonic()
        try:
            await asyncio.wait({post, stop, down}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            post.cancel()
            raise
        finally:
            stop.cancel()
            down.cancel()
            t_answer = time.monotonic()
            self._activity_exit(url)
            if self.on_activity is not None:  # each /generate on its own: the servers' occupancy over time
                self.on_activity(url, "request", t_request, t_answer)
        if post.done():
            if path == "/generate" and post.exception() is None:
                self.last_answer[url] = time.monotonic()
            return post.result()
        post.cancel()
        if not closing.is_set() and url in self.down:
            raise _ServerDown(url)
        return _CLOSED

    def _activity_enter(self, url: str) -> None:
        n = self._in_flight.get(url, 0)
        if n == 0:
            self._busy_since[url] = time.monotonic()
        self._in_flight[url] = n + 1

    def _activity_exit(self, url: str) -> None:
        n = self._in_flight[url] - 1
        self._in_flight[url] = n
        if n == 0 and self.on_activity is not None:
            self.on_activity(url, "generate", self._busy_since.pop(url), time.monotonic())

    async def _wait_not_paused(self) -> None:
        while self._paused and not self._closed:
            await asyncio.sleep(0.02)
        await self._wait_any_live()

    # -- servers that die -----------------------------------------------------------------------------------

    def _down_event(self, url: str) -> asyncio.Event:
        """The event set when ``url`` goes down (asyncio events bind to one loop: a new set per loop)."""
        loop = asyncio.get_running_loop()
        if self._events_loop is not loop:
            self._down_events, self._events_loop = {}, loop
        ev = self._down_events.get(url)
        if ev is None:
            ev = self._down_events[url] = asyncio.Event()
            if url in self.down:
                ev.set()
        return ev

    def mark_down(self, url: str, reason: str) -> None:
        """Take ``url`` out of the rotation: its in-flight ``/generate`` requests are abandoned and their samples
        re-issued elsewhere; ``on_server_down(url, reason)`` is called once per outage."""
        if url in self.down or url not in self.urls:
            return
        self.down[url] = reason
        ev = self._down_events.get(url)
        if ev is not None:
            ev.set()
        if self.on_server_down is not None:
            self.on_server_down(url, reason)

    def mark_up(self, url: str) -> None:
        """Return ``url`` to the rotation (a restarted server serving the current weights)."""
        self.down.pop(url, None)
        self._down_events.pop(url, None)
        self.last_answer[url] = time.monotonic()

    async def probe(self, url: str, timeout_s: float = 5.0) -> bool:
        """Whether ``url`` answers ``GET /model_info`` within ``timeout_s`` (never ``/health``, which blocks while
        generation is paused)."""
        try:
            status, _ = await self._exchange.request("GET", url + "/model_info", timeout_s=timeout_s)
            return status == 200
        except (ConnectFailed, Dropped):
            return False

    async def _server_failed(self, url: str, error: BaseException) -> None:
        """A request to ``url`` failed without an HTTP answer: mark the server down unless it still answers."""
        if url in self.down:
            return
        if not await self.probe(url, timeout_s=3.0):
            self.mark_down(url, f"{type(error).__name__}: {error}")
        else:
            await asyncio.sleep(0.2)  # alive: a transient failure; the sample is re-issued on it

    async def _wait_any_live(self) -> None:
        """Wait while every server is down (a supervisor restarts them), at most ``server_down_timeout_s``.

        Raises:
            ServerError: no server came back in time.
        """
        if self._closed or self.live_urls():
            return
        deadline = time.monotonic() + self.server_down_timeout_s
        while not self._closed and not self.live_urls():
            if time.monotonic() > deadline:
                why = "; ".join(f"{u}: {r}" for u, r in self.down.items())
                raise ServerError(None, f"every rollout server is down and none came back within "
                                        f"{self.server_down_timeout_s:.0f} s ({why})")
            await asyncio.sleep(0.1)

    def _recoverable(self, e: BaseException) -> bool:
        """A ``/generate`` failure that re-issuing on another server can heal (no HTTP answer came back)."""
        return not self._closed and (isinstance(e, _ServerDown) or (isinstance(e, ServerError) and e.status is None))

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
            self._sticky[r] = url
        await self._wait_not_paused()
        url = self.choose_server(rid)
        if self._closed:
            return [Completion(prompt, [], [], [], "abort", 0, url, None, r) for r in rids]
        try:
            body = await self._post_or_closed(url, "/generate", BatchGenerateRequest(
                [prompt] * n, params, return_logprob=True, rids=rids).to_json())
        except Exception as e:
            if not self._recoverable(e):
                raise
            await self._server_failed(url, e)
            self.reissued_samples += n
            parts = {i: _Partial(r) for i, r in enumerate(rids)}
            done = await self._resume_group(prompt, parts, params)
            return [done[i] for i in range(n)]
        if body is _CLOSED:
            return [Completion(prompt, [], [], [], "abort", 0, url, None, r) for r in rids]
        resps = parse_generate_response(body)
        if not isinstance(resps, list) or len(resps) != n:
            raise ProtocolError(f"batched /generate of {n} prompts did not return a list of {n} responses")
        out: list[Completion | None] = [None] * n
        aborted: dict[int, _Partial] = {}
        for i, (r, resp) in enumerate(zip(rids, resps)):
            part = _Partial(r)
            self._accumulate(resp, part.ids, part.lps, part.vers)
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

    async def _resume_group(self, prompt: list[int], parts: dict[int, "_Partial"], params: SamplingParams
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
                payload = BatchGenerateRequest(
                    [prompt + parts[i].ids for i in order],
                    [replace(params, max_new_tokens=budget - len(parts[i].ids),
                             min_new_tokens=max(0, params.min_new_tokens - len(parts[i].ids))) for i in order],
                    return_logprob=True,
                    # each attempt has its own wire id (a server may still be releasing the aborted one)
                    rids=[f"{parts[i].rid}.r{parts[i].n_int}" for i in order],
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
                    body = _CLOSED
            if self._closed or body is _CLOSED:
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
                self._accumulate(resp, p.ids, p.lps, p.vers)
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
            req = GenerateRequest(prompt + out_ids, sp, return_logprob=True, rid=wire_rid)
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
            if body is _CLOSED:
                return Completion(prompt, out_ids, out_lps, out_vers, "abort", n_int, url, None, rid)
            resp = parse_generate_response(body)
            if isinstance(resp, list):
                raise ProtocolError("single /generate returned a list")
            self._accumulate(resp, out_ids, out_lps, out_vers)
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

    @staticmethod
    def _accumulate(resp: GenerateResponse, ids: list[int], lps: list[float], vers: list[int]) -> None:
        n = len(resp.output_ids)
        if len(resp.output_logprobs) != n:
            raise ProtocolError(f"response has {n} output ids but {len(resp.output_logprobs)} logprobs")
        labels = versions_from_spans(resp.weight_version_spans, n, resp.weight_version)
        ids.extend(resp.output_ids)
        lps.extend(resp.output_logprobs)
        as_int = {v: version_to_int(v) for v in set(labels)}  # a few distinct labels, one per token
        vers.extend(as_int[v] for v in labels)

    # -- control --------------------------------------------------------------------------------------------

    async def _all(self, path: str, body: Any) -> dict[str, Any]:
        """POST to every live server -> {url: answer}; a server that gives no HTTP answer is marked down
        (unless it still answers a probe) and left out; the first HTTP error is raised."""
        urls = self.live_urls()
        results = await asyncio.gather(*(self._post_unless_down(u, path, body) for u in urls),
                                       return_exceptions=True)
        out: dict[str, Any] = {}
        for u, r in zip(urls, results):
            if isinstance(r, _ServerDown):
                continue
            if isinstance(r, ServerError) and r.status is None and not self._closed:
                await self._server_failed(u, r)
                if u in self.down:
                    continue
            if isinstance(r, BaseException):
                raise r
            out[u] = r
        return out

    async def _post_unless_down(self, url: str, path: str, body: Any) -> Any:
        """:meth:`_post`, abandoned with :class:`_ServerDown` when ``url`` is marked down meanwhile (a control
        call to a server that froze must not hold a weight update, and the restart waiting for it, forever)."""
        self._exchange.ensure_open()
        post = asyncio.ensure_future(self._post(url, path, body))
        down = asyncio.ensure_future(self._down_event(url).wait())
        started = self._control_started.setdefault(url, [])
        t0 = time.monotonic()
        started.append(t0)
        try:
            await asyncio.wait({post, down}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            post.cancel()
            raise
        finally:
            down.cancel()
            started.remove(t0)
        if post.done():
            return post.result()
        post.cancel()
        raise _ServerDown(url)

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

    async def _get(self, u: str, path: str) -> dict:
        try:
            status, data = await self._exchange.request("GET", u + path)
        except (ConnectFailed, Dropped) as e:
            raise ServerError(None, str(e), u) from e
        if status >= 400:
            raise ServerError(status, parse_error_message(data), u)
        return data

    async def aclose(self) -> None:
        """Close the HTTP client; pending :meth:`generate` calls return with finish_reason "abort"."""
        self._closed = True
        if self._exchange.closing is not None:
            self._exchange.closing.set()
            await asyncio.sleep(0)  # let pending generate() calls see it before the pool closes
        await self._exchange.aclose()

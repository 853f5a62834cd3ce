"""The servers behind one rollout client: the HTTP calls to them, which of them are down, and their activity.

- HTTP runs on aiohttp (an injected ``transport``, tests: ``httpx.MockTransport``, uses httpx); the exchange
  itself, its keep-alive and its failure classes are :mod:`areal_cli.rollout.http_exchange`. A call that could
  not connect is retried with backoff; a ``/generate`` whose connection broke is not (the server may still run it).
- Routing: round robin with sticky request ids (:mod:`areal_cli.rollout.server_routing`), over the live servers.
- Servers that die: a ``/generate`` whose connection fails or breaks is followed by a ``GET /model_info``
  probe (it answers while generation is paused, unlike ``/health``); a server that does not answer is marked
  down (:meth:`ServerPool.mark_down`, also called by a supervisor that saw the process exit or hang) and the
  requests in flight to it are abandoned at once (:class:`ServerDown`), so that the client re-issues their samples
  on a live server. Routing skips down servers; control calls (pause, continue, weight loads) go to live servers
  only. :meth:`ServerPool.mark_up` returns a server (restarted with the current weights) to the rotation. With
  every server down, generation waits up to ``server_down_timeout_s`` for one to come back, then raises
  :class:`ServerError`.
- ``on_activity(url, kind, start, end)`` receives, on ``time.monotonic()`` seconds, each interval in
  which a server had at least one ``/generate`` in flight (kind ``"generate"``), each weight-update
  window (kind ``"update"``, reported by the client) and each ``/generate`` request on its own, from submission
  to answer (kind ``"request"``: one group, or the resumed part of one, per request; the servers' occupancy over
  time), for throughput timelines. It is called on the event loop; keep it cheap.
- :meth:`ServerPool.stalled_for`: how long a server has owed an answer (generations in flight, or a control call
  waiting on it), for the supervisor's stall check.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import httpx

from areal_cli.rollout.http_exchange import ConnectFailed, Dropped, HttpExchange
from areal_cli.rollout.protocol.errors import ServerError, parse_error_message
from areal_cli.rollout.server_routing import StickyRouting

#: What a call to a server returns when the client was closed while it was in flight.
CLOSED = object()


class ServerDown(Exception):
    """The server of a request was marked down while the request was in flight (it is re-issued)."""


class ServerPool:
    """The servers of a :class:`~areal_cli.rollout.client.RolloutClient` (its base class; see module docstring).

    Args:
        urls: server base URLs, e.g. ``["http://127.0.0.1:30000"]``.
        request_timeout_s: per HTTP request (a request held by a paused server waits this long).
        max_retries: retries of a request that failed to connect / lost its connection.
        transport: an ``httpx.AsyncBaseTransport`` (tests use ``httpx.MockTransport``).
        on_activity: callback ``(url, kind, start_s, end_s)``, see the module docstring.
        on_server_down: callback ``(url, reason)`` when a server is marked down (once per outage).
        server_down_timeout_s: how long generation waits for a live server when all are down.
    Raises:
        ValueError: no urls.
    """

    def __init__(self, urls: list[str], *, request_timeout_s: float = 3600, max_retries: int = 3,
                 transport: httpx.AsyncBaseTransport | None = None,
                 on_activity: Callable[[str, str, float, float], None] | None = None,
                 on_server_down: Callable[[str, str], None] | None = None,
                 server_down_timeout_s: float = 600.0):
        if not urls:
            raise ValueError("RolloutClient needs at least one server url")
        self.urls = [u.rstrip("/") for u in urls]
        self.request_timeout_s = float(request_timeout_s)
        self.max_retries = int(max_retries)
        self._exchange = HttpExchange(self.request_timeout_s, transport)  # closing: set by aclose()
        self._routing = StickyRouting(self.urls)
        self._closed = False
        self.on_activity = on_activity
        self._in_flight: dict[str, int] = {}  # url -> /generate requests in flight
        self._busy_since: dict[str, float] = {}
        self.on_server_down = on_server_down
        self.server_down_timeout_s = float(server_down_timeout_s)
        self.down: dict[str, str] = {}  # url -> why it is out of the rotation
        self._down_events: dict[str, asyncio.Event] = {}
        self._events_loop: asyncio.AbstractEventLoop | None = None
        self.last_answer: dict[str, float] = {}  # url -> monotonic time of its last /generate answer
        self._control_started: dict[str, list[float]] = {}  # url -> start times of control calls in flight

    # -- routing and activity -------------------------------------------------------------------------------

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
        return self._routing.choose(rid, self.down)

    # -- HTTP calls -----------------------------------------------------------------------------------------

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
        """:meth:`_post`, or ``CLOSED`` as soon as :meth:`aclose` is called (the request is cancelled)."""
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
            raise ServerDown(url)
        return CLOSED

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

    async def _all(self, path: str, body: Any) -> dict[str, Any]:
        """POST to every live server -> {url: answer}; a server that gives no HTTP answer is marked down
        (unless it still answers a probe) and left out; the first HTTP error is raised."""
        urls = self.live_urls()
        results = await asyncio.gather(*(self._post_unless_down(u, path, body) for u in urls),
                                       return_exceptions=True)
        out: dict[str, Any] = {}
        for u, r in zip(urls, results):
            if isinstance(r, ServerDown):
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
        """:meth:`_post`, abandoned with :class:`ServerDown` when ``url`` is marked down meanwhile (a control
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
        raise ServerDown(url)

    async def _get(self, u: str, path: str) -> dict:
        try:
            status, data = await self._exchange.request("GET", u + path)
        except (ConnectFailed, Dropped) as e:
            raise ServerError(None, str(e), u) from e
        if status >= 400:
            raise ServerError(status, parse_error_message(data), u)
        return data

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
        return not self._closed and (isinstance(e, ServerDown) or (isinstance(e, ServerError) and e.status is None))

    async def aclose(self) -> None:
        """Close the HTTP client; pending ``generate()`` calls return with finish_reason "abort"."""
        self._closed = True
        if self._exchange.closing is not None:
            self._exchange.closing.set()
            await asyncio.sleep(0)  # let pending generate() calls see it before the pool closes
        await self._exchange.aclose()

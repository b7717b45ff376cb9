"""Fetching over HTTP, politely: the request slots, the clients, robots.txt, one page.

Nothing here touches Redis; :mod:`local_host.crawler.crawl` wires these to the store.

* :class:`Politeness` — a global bound on concurrent requests plus, per site (host),
  at most ``per_site`` concurrent requests and a minimum delay between the *starts* of
  two requests to it. A request holds its slots only while it is on the wire.
* :class:`RobotsCache` — robots.txt rules per origin (``protego``), with a TTL and an
  LRU bound, for every crawler of a host; :class:`RobotsCheck` fetches an origin's once
  (single-flight) through :func:`fetch_robots`, the same politeness gate and clients as
  the pages.
* :class:`ClientPool` — a few small ``httpx.AsyncClient`` objects per site, the least
  recently used idle ones closed beyond a bound (why not one client: its docstring);
  :func:`client_factory` makes them.
* :func:`get_page` — one GET, its body read only when it is wanted, its failures
  sorted into the ones worth a retry and the others (:class:`FetchError`).

What a page links to is :mod:`local_host.crawler.links`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import trio
from protego import Protego

from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.codec.urls import site_of

from .transport import CrawlTransport

__all__ = [
    "ClientPool",
    "FetchError",
    "Politeness",
    "Response",
    "RobotsCache",
    "RobotsCheck",
    "RobotsUnavailable",
    "ROBOTS_MAX",
    "client_factory",
    "fetch_robots",
    "get_page",
    "robots_text",
    "origin_of",
    "retry_after",
]

#: Requests (so connections) one httpx client carries at once; a site with more on the
#: wire gets more clients (see :class:`ClientPool`).
CONNECTIONS_PER_CLIENT = 4
#: Clients unused this long (seconds) are closed, with their keep-alive connections.
CLIENT_IDLE = 30.0
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
ACCEPT = "text/html,application/xhtml+xml;q=0.9,*/*;q=0.1"
#: An unwanted body (404, redirect, 503, a PDF) declared at most this long is read and
#: dropped, so the connection goes back to the pool: far cheaper than a new connection.
DRAIN_MAX = 64 * 1024


# -- politeness ----------------------------------------------------------------------
class _Site:
    __slots__ = ("slots", "last_start", "delay", "users")

    def __init__(self, per_site: int, delay: float):
        self.users = 0  # requests holding or waiting for this site
        self.slots = trio.Semaphore(per_site) if per_site > 0 else None
        self.last_start = -math.inf
        self.delay = delay


class _Slot:
    """One request's hold on :meth:`Politeness.slot`: a class, not a generator, as it is
    entered for every request."""

    __slots__ = ("_gate", "_site")

    def __init__(self, gate: "Politeness", site: _Site):
        self._gate, self._site = gate, site

    async def __aenter__(self) -> Callable[[], None]:
        s = self._site
        s.users += 1
        try:
            if s.slots is not None:
                await s.slots.acquire()
            try:
                await self._gate._start(s)
            except BaseException:
                if s.slots is not None:
                    s.slots.release()
                raise
        except BaseException:
            s.users -= 1
            raise
        return self.sent

    def sent(self) -> None:
        s = self._site
        s.last_start = max(s.last_start, trio.current_time())

    async def __aexit__(self, *exc: object) -> None:
        s = self._site
        self._gate.limiter.release()
        if s.slots is not None:
            s.slots.release()
        s.users -= 1


class Politeness:
    """Global and per-site request slots.

    ``concurrency``: requests on the wire at once, all sites (>= 1).
    ``per_site``: requests on the wire at once to one site; 0 = no per-site bound.
    ``delay``: minimum seconds between the starts of two requests to one site; 0 = none.
    A site's delay can be raised (robots.txt ``Crawl-delay``) with :meth:`set_delay`.

    The order is: the site's slot, then wait for the site's delay, then a global slot;
    if another request to the site started meanwhile, the global slot is given back and
    the wait starts again. So a request that waits for its site never holds a global
    slot, and the delay is measured between actual request starts.
    """

    def __init__(self, concurrency: int, per_site: int = 2, delay: float = 0.25):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.limiter = trio.CapacityLimiter(concurrency)
        self.per_site = max(0, per_site)
        self.delay = max(0.0, delay)
        self._sites: dict[str, _Site] = {}

    def _site(self, site: str) -> _Site:
        s = self._sites.get(site)
        if s is None:
            s = self._sites[site] = _Site(self.per_site, self.delay)
        return s

    def set_delay(self, site: str, delay: float) -> None:
        """Raise (never lower below the configured delay) the delay of one site."""
        self._site(site).delay = max(self.delay, delay)

    @property
    def active(self) -> int:
        """Requests holding a global slot now."""
        return self.limiter.borrowed_tokens

    def slot(self, site: str) -> "_Slot":
        """Hold a request slot for ``site`` (``async with``). The value is a callable to
        call when the request actually goes on the wire (after connecting): the site's
        delay then counts from that moment, so a slow connect does not shorten the gap
        the server sees. The next request re-checks the delay after every wait."""
        return _Slot(self, self._site(site))

    async def _start(self, s: _Site) -> None:
        """Wait for the site's delay and a global slot (held on return)."""
        while True:
            wait = s.last_start + s.delay - trio.current_time()
            if wait > 0:
                await trio.sleep(wait)
                continue
            try:  # a free slot without a turn of the scheduler (the request checkpoints soon)
                self.limiter.acquire_nowait()
            except trio.WouldBlock:  # taken, or others queued first
                await self.limiter.acquire()
            if s.last_start + s.delay > trio.current_time():
                self.limiter.release()  # another request to the site started meanwhile
                continue
            s.last_start = trio.current_time()
            return

    def forget_idle(self) -> int:
        """Drop the state of sites with nothing on the wire or waiting whose delay has
        passed (their next request may start at once anyway). Returns how many."""
        now = trio.current_time()
        # A site with a Crawl-delay is kept: its delay would be lost with its state.
        drop = [
            name for name, s in self._sites.items()
            if s.users == 0 and s.last_start + s.delay <= now and s.delay == self.delay
        ]
        for name in drop:
            del self._sites[name]
        return len(drop)


# -- robots.txt ----------------------------------------------------------------------
class RobotsUnavailable(Exception):
    """robots.txt could not be fetched (5xx, timeout, connection error): try later."""


ROBOTS_MAX = 512 * 1024  # RFC 9309: parse at least 500 KiB


def robots_text(url: str, status: int, body: bytes = b"") -> str | None:
    """What an answer to a robots.txt request says (RFC 9309), for every crawler in front
    of a host: its text (the first ``ROBOTS_MAX`` bytes) for a 2xx; None for a 4xx (there
    is none: everything is allowed); anything else is :class:`RobotsUnavailable` (try
    later: a site that cannot say what it forbids is not crawled meanwhile)."""
    if 400 <= status < 500:
        return None
    if not 200 <= status < 300:
        raise RobotsUnavailable(f"{url}: HTTP {status}")
    return body[:ROBOTS_MAX].decode("utf-8", errors="replace")


_URL_ORIGIN = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*)")


def origin_of(url: str) -> str:
    """``scheme://authority`` of an absolute URL (robots.txt is per origin)."""
    m = _URL_ORIGIN.match(url)
    if m is None:
        raise ValueError(f"not an absolute URL: {url[:200]!r}")
    return m.group(1)


#: How long a fetched robots.txt is trusted (RFC 9309: at most 24 h), and how many origins'
#: rules are kept (the least recently used dropped first), for every crawler of a host.
ROBOTS_TTL = 86400.0
ROBOTS_ORIGINS = 10_000


@dataclass
class _RobotsEntry:
    rules: Protego | None  # None: allow everything (robots.txt missing, 4xx)
    expires: float


class RobotsCache:
    """robots.txt rules per origin, as every crawler in front of a host keeps them: ours
    (:class:`RobotsCheck`) and the Scrapy scheduler's gate (dedupnet/scrapy/robots.py).
    Sans-I/O: told what an origin's robots.txt says, asked whether a URL may be
    fetched; the clock is the caller's (trio's in our crawler, so tests run on a
    virtual one)."""

    def __init__(self, agent: str, *, clock: Callable[[], float], ttl: float = ROBOTS_TTL,
                 max_entries: int = ROBOTS_ORIGINS):
        self.agent = agent
        self.clock = clock
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[str, _RobotsEntry] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def allowed(self, url: str) -> bool | None:
        """Whether ``url`` may be fetched by its origin's rules; None when they are not
        known (never fetched, or older than ``ttl``): fetch them first."""
        origin = origin_of(url)
        entry = self._entries.get(origin)
        if entry is None or entry.expires <= self.clock():
            return None
        self._entries.move_to_end(origin)
        return entry.rules is None or entry.rules.can_fetch(url, self.agent)

    def learn(self, origin: str, text: str | None) -> Protego | None:
        """``origin``'s robots.txt says ``text`` (None: there is none, everything is
        allowed); its parsed rules."""
        rules = Protego.parse(text) if text is not None else None
        self._entries[origin] = _RobotsEntry(rules, self.clock() + self.ttl)
        self._entries.move_to_end(origin)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return rules


class RobotsCheck:
    """Our crawler's robots.txt check: the :class:`RobotsCache`, and one fetch per origin
    whose rules it does not know (concurrent askers wait for that one fetch).

    ``fetch(origin)`` returns the robots.txt text, or None when every URL is allowed
    (4xx: no robots.txt), or raises :class:`RobotsUnavailable` (nothing cached: the
    next check fetches again). ``on_rules`` hears each origin's new rules (Crawl-delay).
    """

    def __init__(self, fetch: Callable[[str], Awaitable[str | None]], *, agent: str,
                 on_rules: Callable[[str, Protego], None] | None = None):
        self._fetch = fetch
        self.cache = RobotsCache(agent, clock=trio.current_time)
        self._on_rules = on_rules
        self._inflight: dict[str, tuple[trio.Event, list]] = {}

    async def allowed(self, url: str) -> bool:
        while (verdict := self.cache.allowed(url)) is None:
            origin = origin_of(url)
            pending = self._inflight.get(origin)
            if pending is not None:
                event, box = pending
                await event.wait()
                if box and isinstance(box[0], BaseException):
                    raise RobotsUnavailable(str(box[0]))
                continue  # the fetch cached its result
            event, box = trio.Event(), []
            self._inflight[origin] = (event, box)
            try:
                rules = self.cache.learn(origin, await self._fetch(origin))
                if rules is not None and self._on_rules is not None:
                    self._on_rules(origin, rules)
                return rules is None or rules.can_fetch(url, self.cache.agent)
            except BaseException as e:
                box.append(e if isinstance(e, Exception) else RobotsUnavailable("fetch cancelled"))
                raise
            finally:
                del self._inflight[origin]
                event.set()
        return verdict


async def fetch_robots(origin: str, politeness: Politeness, clients: ClientPool, counters: Counters,
                       timeout: float) -> str | None:
    """robots.txt of an origin, for :class:`RobotsCheck`: through the politeness gate
    and the site's clients like any request, redirects followed, within ``timeout``."""
    url = origin + "/robots.txt"
    site = site_of(url)
    try:
        async with politeness.slot(site) as sent, clients.client(site) as client:
            with trio.move_on_after(timeout):
                return await _get_robots(client, url, sent, counters)
            raise RobotsUnavailable(f"{url}: timeout")
    except httpx.TooManyRedirects:
        return None  # RFC 9309: more than 5 redirects = unavailable (4xx-like): allow
    except httpx.HTTPError as e:
        raise RobotsUnavailable(f"{url}: {type(e).__name__}") from None


async def _get_robots(client: httpx.AsyncClient, url: str, sent: Callable[[], None], counters: Counters) -> str | None:
    async with client.stream("GET", url, follow_redirects=True, extensions={"trace": on_send(sent)}) as r:
        counters.inc("robots_fetched", status=r.status_code)
        if not 200 <= r.status_code < 300:
            return robots_text(url, r.status_code)
        chunks, _ = await _read_body(r, ROBOTS_MAX - 1)  # the first ROBOTS_MAX bytes are enough
        counters.inc("fetched_bytes", r.num_bytes_downloaded)
        return robots_text(url, r.status_code, b"".join(chunks))


# -- HTTP clients --------------------------------------------------------------------
class _Client:
    __slots__ = ("client", "users", "peak", "last_used")

    def __init__(self, client: httpx.AsyncClient):
        self.client = client
        self.users = 0  # requests on it now
        self.peak = 0  # most requests it carried at once: about the connections it has open
        self.last_used = trio.current_time()


class _Use:
    """One request's use of a client of :meth:`ClientPool.client`: a class, not a
    generator, as it is entered for every request."""

    __slots__ = ("_pool", "_site", "_entry")

    def __init__(self, pool: "ClientPool", site: str):
        self._pool, self._site = pool, site

    async def __aenter__(self) -> httpx.AsyncClient:
        pool = self._pool
        entry = self._entry = pool._take(self._site)
        if pool._count > pool.max_clients:
            try:
                await pool._close_where(lambda e: True, pool._count - pool.max_clients)
            except BaseException:
                self._done()
                raise
        return entry.client

    async def __aexit__(self, *exc: object) -> None:
        self._done()

    def _done(self) -> None:
        self._entry.users -= 1
        self._entry.last_used = trio.current_time()


class ClientPool:
    """HTTP clients (``httpx.AsyncClient``) per site (host), each carrying at most
    ``per_client`` requests at once; made by ``make()`` (which should bound the
    client's connections to ``per_client``) when a site has none with room.

    Why clients per site, not one for everything: a site's connections are kept, reused
    and closed together (the least recently used sites' first, when the bound below is
    reached), and a site with more requests on the wire simply has more clients. (The
    pool of httpcore, the transport before :class:`~local_host.crawler.transport.CrawlTransport`,
    also walked all its connections for each of them on every request: one shared pool
    cost most of the crawler's CPU.) A request goes to a client of its site that has an
    idle keep-alive connection, else to one with room for a new connection, else to a
    new client.

    Bounds: beyond ``max_clients`` the least recently used site's clients with no
    request on them are closed (with their keep-alive connections); a client in use is
    never closed. :meth:`close_idle` closes the ones unused for a while.
    """

    def __init__(self, make: Callable[[], httpx.AsyncClient], *, per_client: int = 4, max_clients: int = 256):
        self._make = make
        self.per_client = max(1, per_client)
        self.max_clients = max(1, max_clients)
        self._sites: collections.OrderedDict[str, list[_Client]] = collections.OrderedDict()
        self._count = 0

    def __len__(self) -> int:
        """Clients open now."""
        return self._count

    def client(self, site: str) -> "_Use":
        """A client of ``site`` with room for one more request, for one request (``async with``)."""
        return _Use(self, site)

    def _take(self, site: str) -> _Client:
        entries = self._sites.get(site)
        if entries is None:
            entries = self._sites[site] = []
        else:
            self._sites.move_to_end(site)
        # A client with an idle keep-alive connection first (users < peak: it has had
        # more connections than are in use now), else one with room for a new one.
        entry = next((e for e in entries if e.users < e.peak), None)
        if entry is None:
            entry = next((e for e in entries if e.users < self.per_client), None)
        if entry is None:
            entry = _Client(self._make())
            entries.append(entry)
            self._count += 1
        entry.users += 1  # before any wait: in use, so never closed under us
        entry.peak = max(entry.peak, entry.users)
        return entry

    async def close_idle(self, idle_for: float) -> int:
        """Close the clients with no request for ``idle_for`` seconds; returns how many."""
        since = trio.current_time() - idle_for
        return await self._close_where(lambda e: e.last_used <= since, self._count)

    async def _close_where(self, pick: Callable[[_Client], bool], at_most: int) -> int:
        """Close up to ``at_most`` unused clients ``pick`` selects, least recently used
        sites first. Each is dropped before it is closed, so no request can take it."""
        closing: list[_Client] = []
        for site in list(self._sites):
            if len(closing) >= at_most:
                break
            entries = self._sites[site]
            for entry in [e for e in entries if e.users == 0 and pick(e)][: at_most - len(closing)]:
                entries.remove(entry)
                closing.append(entry)
            if not entries:
                del self._sites[site]
        self._count -= len(closing)
        with trio.CancelScope(shield=True):  # a dropped client is always closed
            for entry in closing:
                with trio.move_on_after(2):
                    await entry.client.aclose()
        return len(closing)

    async def aclose(self) -> None:
        """Close every client (shielded: also on the way out of a cancelled crawler)."""
        await self._close_where(lambda e: True, self._count)
        with trio.CancelScope(shield=True):
            for entries in self._sites.values():  # still in use: the crawler is stopping anyway
                for entry in entries:
                    with trio.move_on_after(2):
                        await entry.client.aclose()
            self._sites.clear()
            self._count = 0


@functools.lru_cache(maxsize=2)
def _tls_context(trust_env: bool):
    """One TLS context for every client of every crawler in the process: making one loads
    the CA bundle, and a one-process simulation starts dozens of crawlers."""
    return httpx.create_ssl_context(trust_env=trust_env)


class _Cookies(httpx.Cookies):
    """httpx's cookie jar, which reads a response only when it sets a cookie: httpx
    wraps every response and its request in ``urllib`` look-alikes for the standard
    library's jar even when there is nothing to read, which cost more than anything
    else httpx does per response. Without ``Set-Cookie`` the jar would not change."""

    def extract_cookies(self, response: httpx.Response) -> None:
        headers = response.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            super().extract_cookies(response)


class _CrawlClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` whose cookie jar is :class:`_Cookies`."""

    def __init__(self, *, cookies: httpx.Cookies | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._jar = _Cookies(cookies)

    @property
    def cookies(self) -> httpx.Cookies:
        return self._jar

    @cookies.setter
    def cookies(self, cookies: httpx.Cookies) -> None:
        self._jar = _Cookies(cookies)


def client_factory(connections: int, *, user_agent: str, timeout: float, local_address: str | None,
                   trust_env: bool) -> Callable[[], httpx.AsyncClient]:
    """Makes the clients of :class:`ClientPool`, ``connections`` each (the pool never
    puts more requests on one), all with the process's one TLS context. An idle
    connection is kept as long as its client (httpx's default, 5 s, made a crawler
    that comes back to a site every few seconds connect again each time; a
    connection the server closed meanwhile is seen before it is used)."""
    tls = _tls_context(trust_env)
    timeouts = httpx.Timeout(timeout)
    headers = {"User-Agent": user_agent}

    def make() -> httpx.AsyncClient:
        transport = CrawlTransport(ssl_context=tls, max_connections=connections, keepalive_expiry=CLIENT_IDLE,
                                   local_address=local_address)
        return _CrawlClient(transport=transport, verify=tls, timeout=timeouts, follow_redirects=False,
                            trust_env=trust_env, headers=headers)

    return make


# -- one page ------------------------------------------------------------------------
@dataclass
class Response:
    status: int
    headers: httpx.Headers
    body: bytes | None = None
    too_large: bool = False
    html: bool = True
    charset: str | None = None


class FetchError(Exception):
    """A request that got no answer: ``kind`` as counted; ``transient``: worth a retry."""

    def __init__(self, kind: str, transient: bool):
        super().__init__(kind)
        self.kind = kind
        self.transient = transient


async def get_page(client: httpx.AsyncClient, url: str, sent: Callable[[], None], counters: Counters, *,
                   timeout: float, max_body: int, any_body: bool) -> Response:
    """One GET of ``url`` within ``timeout`` (``sent`` called when it goes on the wire);
    the body is read (up to ``max_body``) only for a 2xx HTML page, or any 2xx with
    ``any_body``. Raises :class:`FetchError`."""
    with trio.move_on_after(timeout):
        try:
            async with client.stream("GET", url, headers={"Accept": ACCEPT},
                                     extensions={"trace": on_send(sent)}) as r:
                try:
                    return await _read_response(r, max_body, any_body)
                finally:
                    counters.inc("fetched_bytes", r.num_bytes_downloaded)
        except httpx.TimeoutException:
            raise FetchError("timeout", True) from None
        except httpx.ConnectError:
            raise FetchError("connect", True) from None
        except (httpx.UnsupportedProtocol, httpx.InvalidURL):
            raise FetchError("bad_url", False) from None
        except httpx.TransportError:
            raise FetchError("network", True) from None
        except (httpx.DecodingError, httpx.StreamError):
            raise FetchError("decoding", False) from None
    raise FetchError("timeout", True)


async def _read_response(r: httpx.Response, max_body: int, any_body: bool) -> Response:
    resp = Response(r.status_code, r.headers)
    if not 200 <= r.status_code < 300:
        await _drain(r)
        return resp
    mime, _, params = r.headers.get("content-type", "").partition(";")
    mime = mime.strip().lower()
    resp.html = not mime or mime in HTML_TYPES  # no type: try it as HTML
    if not resp.html and not any_body:
        await _drain(r)
        return resp
    length = r.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_body:
        resp.too_large = True
        return resp
    resp.charset = charset_of(params)
    chunks, whole = await _read_body(r, max_body)
    if not whole:
        resp.too_large = True
        return resp
    resp.body = b"".join(chunks)
    return resp


def charset_of(params: str) -> str | None:
    """The ``charset`` of a Content-Type's parameters (what follows its first ``;``),
    lower-cased, as httpx's ``charset_encoding`` gives it, without the ``email.message``
    httpx builds for it on every page kept. RFC 2231's encoded parameters are not
    read: a page's header does not use them."""
    for param in params.split(";"):
        name, eq, value = param.partition("=")
        if eq and name.strip().lower() == "charset":
            value = value.strip()
            if len(value) > 1 and value[0] == value[-1] == '"':
                value = value[1:-1]
            return value.lower()
    return None


async def _read_body(r: httpx.Response, limit: int) -> tuple[list[bytes], bool]:
    """The body's chunks, read until more than ``limit`` bytes came (then the second
    item is False: the rest is not read)."""
    chunks, total = [], 0
    async with contextlib.aclosing(r.aiter_bytes()) as body:  # we may stop early
        async for chunk in body:
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                return chunks, False
    return chunks, True


def on_send(sent: Callable[[], None]):
    """A ``trace`` callback (the request extension httpx hands to its transport) calling
    ``sent()`` when the request goes out."""

    async def trace(name: str, info: dict) -> None:
        if name.endswith("send_request_headers.started"):
            sent()

    return trace


async def _drain(r: httpx.Response) -> None:
    """Read and drop a small body (see ``DRAIN_MAX``); an error only costs the connection."""
    length = r.headers.get("content-length", "")
    if length.isdigit() and int(length) <= DRAIN_MAX:
        try:
            async for _ in r.aiter_raw():
                pass
        except httpx.HTTPError:
            pass


def retry_after(headers: httpx.Headers) -> float | None:
    """A ``Retry-After`` in seconds (the date form is not honoured: the back-off applies)."""
    value = headers.get("retry-after", "").strip()
    if value.isdigit():
        return float(value)
    return None

"""The crawler's small focused pieces: politeness, robots.txt, link extraction, scope.

Nothing here touches Redis; :mod:`local_host.crawler` wires these to the store and to
httpx.

* :class:`Politeness` — a global bound on concurrent requests plus, per site (host),
  at most ``per_site`` concurrent requests and a minimum delay between the *starts* of
  two requests to it. A request holds its slots only while it is on the wire.
* :class:`RobotsCache` — one robots.txt fetch per origin (single-flight), parsed with
  ``protego``, cached with a TTL and an LRU bound.
* :func:`extract_links` — ``<a href>`` links of an HTML page with ``selectolax``
  (lexbor), resolved against ``<base href>`` or the page URL, fragments stripped,
  non-http(s) schemes dropped.
* :func:`in_scope` — the allowed-domains scope.
* :class:`ClientPool` — a few small ``httpx.AsyncClient`` objects per site, the least
  recently used idle ones closed beyond a bound (why not one client: its docstring).
"""

from __future__ import annotations

import collections
import math
import re
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import trio
from protego import Protego
from selectolax.lexbor import LexborHTMLParser

__all__ = [
    "ClientPool",
    "Politeness",
    "RobotsCache",
    "RobotsUnavailable",
    "ROBOTS_MAX",
    "robots_text",
    "extract_links",
    "decode_html",
    "in_scope",
    "origin_of",
]


# -- politeness ----------------------------------------------------------------------
class _Site:
    __slots__ = ("slots", "last_start", "delay", "users")

    def __init__(self, per_site: int, delay: float):
        self.users = 0  # requests holding or waiting for this site
        self.slots = trio.Semaphore(per_site) if per_site > 0 else None
        self.last_start = -math.inf
        self.delay = delay


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

    @asynccontextmanager
    async def slot(self, site: str) -> AsyncIterator[Callable[[], None]]:
        """Hold a request slot for ``site``. The value is a callable to call when the
        request actually goes on the wire (after connecting): the site's delay then
        counts from that moment, so a slow connect does not shorten the gap the server
        sees. The next request re-checks the delay after every wait."""
        s = self._site(site)
        s.users += 1
        try:
            if s.slots is not None:
                await s.slots.acquire()
            try:
                await self._start(s)

                def sent() -> None:
                    s.last_start = max(s.last_start, trio.current_time())

                try:
                    yield sent
                finally:
                    self.limiter.release()
            finally:
                if s.slots is not None:
                    s.slots.release()
        finally:
            s.users -= 1

    async def _start(self, s: _Site) -> None:
        """Wait for the site's delay and a global slot (held on return)."""
        while True:
            wait = s.last_start + s.delay - trio.current_time()
            if wait > 0:
                await trio.sleep(wait)
                continue
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


@dataclass
class _RobotsEntry:
    rules: Protego | None  # None: allow everything (robots.txt missing, 4xx)
    expires: float


class RobotsCache:
    """robots.txt per origin, fetched once (concurrent askers wait for the one fetch).

    ``fetch(origin)`` returns the robots.txt text (parsed with protego), or None when
    every URL is allowed (4xx: no robots.txt), or raises :class:`RobotsUnavailable`
    (not cached: the next check fetches again). Cached entries live ``ttl`` seconds;
    at most ``max_entries`` origins are kept (least recently used dropped first).
    """

    def __init__(
        self,
        fetch: Callable[[str], Awaitable[str | None]],
        *,
        agent: str,
        ttl: float = 86400.0,
        max_entries: int = 10_000,
        on_rules: Callable[[str, Protego], None] | None = None,
    ):
        self._fetch = fetch
        self.agent = agent
        self.ttl = ttl
        self.max_entries = max_entries
        self._on_rules = on_rules
        self._cache: collections.OrderedDict[str, _RobotsEntry] = collections.OrderedDict()
        self._inflight: dict[str, tuple[trio.Event, list]] = {}

    def __len__(self) -> int:
        return len(self._cache)

    async def rules(self, origin: str) -> Protego | None:
        while True:
            entry = self._cache.get(origin)
            if entry is not None and entry.expires > trio.current_time():
                self._cache.move_to_end(origin)
                return entry.rules
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
                text = await self._fetch(origin)
                rules = Protego.parse(text) if text is not None else None
                self._cache[origin] = _RobotsEntry(rules, trio.current_time() + self.ttl)
                self._cache.move_to_end(origin)
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
                if rules is not None and self._on_rules is not None:
                    self._on_rules(origin, rules)
                return rules
            except BaseException as e:
                box.append(e if isinstance(e, Exception) else RobotsUnavailable("fetch cancelled"))
                raise
            finally:
                del self._inflight[origin]
                event.set()

    async def allowed(self, url: str) -> bool:
        rules = await self.rules(origin_of(url))
        return rules is None or rules.can_fetch(url, self.agent)


# -- HTML and links -----------------------------------------------------------------
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_.:-]+)""", re.IGNORECASE)


def decode_html(body: bytes, charset: str | None) -> str:
    """The page as text: the header's charset, else a ``<meta charset>`` in the first
    KiB, else UTF-8; undecodable bytes are replaced (links are mostly ASCII)."""
    for candidate in (charset, _sniff_charset(body), "utf-8"):
        if not candidate:
            continue
        try:
            return body.decode(candidate, errors="replace")
        except LookupError:
            continue
    return body.decode("utf-8", errors="replace")  # pragma: no cover


def _sniff_charset(body: bytes) -> str | None:
    m = _META_CHARSET.search(body[:1024])
    return m.group(1).decode("ascii") if m else None


# Removed anywhere in a URL by the WHATWG URL parser (and by browsers).
_TAB_NEWLINE = re.compile(r"[\t\n\r]")
_STRIP = " \t\n\r\f"


@dataclass
class Links:
    """What :func:`extract_links` found: absolute http(s) URLs (fragment-free, in page
    order, duplicates removed), how many ``<a href>`` there were, and why the others
    were dropped."""

    urls: list[str]
    found: int
    dropped: collections.Counter


def extract_links(html: str, page_url: str) -> Links:
    """``<a href>`` links of a page, resolved against ``<base href>`` (itself resolved
    against the page URL) if the page has one, else against ``page_url``.

    Dropped (reason in ``dropped``): empty and fragment-only hrefs that name the page
    itself (``fragment``; with a ``<base href>`` elsewhere they name the base document),
    schemes other than http/https (``scheme``: javascript:, mailto:, data:, tel: …),
    unparsable hrefs (``unparsable``). Fragments are stripped from the rest.
    """
    tree = LexborHTMLParser(html)
    base = page_url
    base_node = tree.css_first("base[href]")
    if base_node is not None:
        href = _TAB_NEWLINE.sub("", (base_node.attributes.get("href") or "").strip(_STRIP))
        if href:
            try:
                base = urllib.parse.urljoin(page_url, href)
            except ValueError:
                pass
    dropped: collections.Counter = collections.Counter()
    seen: dict[str, None] = {}
    found = 0
    for node in tree.css("a[href]"):
        found += 1
        href = _TAB_NEWLINE.sub("", (node.attributes.get("href") or "").strip(_STRIP))
        if (not href or href.startswith("#")) and base == page_url:
            # The page itself (RFC 3986: "" and "#x" resolve to the base); under a
            # <base href> elsewhere they name that other document, and are kept.
            dropped["fragment"] += 1
            continue
        try:
            url = urllib.parse.urljoin(base, href)
        except ValueError:
            dropped["unparsable"] += 1
            continue
        scheme = url.split(":", 1)[0].lower()
        if scheme not in ("http", "https"):
            dropped["scheme"] += 1
            continue
        url = url.split("#", 1)[0]
        seen.setdefault(url, None)
    return Links(list(seen), found, dropped)


_IPV4 = re.compile(r"[0-9.]+")


def in_scope(host: str, allowed: Collection[str]) -> bool:
    """Whether ``host`` is one of ``allowed`` or a subdomain of one (empty: all are).
    Entries are lowercase hosts; a leading dot is ignored (``.example.org`` and
    ``example.org`` both admit ``example.org`` and ``www.example.org``)."""
    if not allowed:
        return True
    host = host.lower()
    if host.startswith("[") or _IPV4.fullmatch(host):
        return host in allowed  # an address has no subdomains
    while True:
        if host in allowed:
            return True
        dot = host.find(".")
        if dot < 0:
            return False
        host = host[dot + 1 :]


# -- HTTP clients --------------------------------------------------------------------
class _Client:
    __slots__ = ("client", "users", "peak", "last_used")

    def __init__(self, client: httpx.AsyncClient):
        self.client = client
        self.users = 0  # requests on it now
        self.peak = 0  # most requests it carried at once: about the connections it has open
        self.last_used = trio.current_time()


class ClientPool:
    """HTTP clients (``httpx.AsyncClient``) per site (host), each carrying at most
    ``per_client`` requests at once; made by ``make()`` (which should bound the
    client's connections to ``per_client``) when a site has none with room.

    Why not one client for everything: httpcore's connection pool, on every request
    and on every response closed, walks all its connections, asks each whether it is
    idle or expired (a socket poll per idle one) and, for every connection, counts the
    connections again: O(connections^2) per event. One pool holding the connections of
    every site therefore cost most of the crawler's CPU (measured: 2.9 ms per request
    one at a time over 50 sites, 6.5 ms at 32 on the wire, against ~1 ms), and closed
    one site's connections to open another's when full. Small pools keep that work
    constant. A request goes to a client of its site that has an idle keep-alive
    connection, else to one with room for a new connection, else to a new client; so
    connections are reused, and a busy site (no per-site bound) gets more clients.

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

    @asynccontextmanager
    async def client(self, site: str) -> AsyncIterator[httpx.AsyncClient]:
        """A client of ``site`` with room for one more request, for one request."""
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
        try:
            if self._count > self.max_clients:
                await self._close_where(lambda e: True, self._count - self.max_clients)
            yield entry.client
        finally:
            entry.users -= 1
            entry.last_used = trio.current_time()

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

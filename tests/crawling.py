"""The crawler tests' web and crawler, for every test file that runs the crawler: a
tiny HTTP server (trio + h11) that serves a few sites on different 127.88.0.x addresses
and records every request with its (server-side) time, and a crawler on a store with
short timeouts. The ``web`` fixture (tests/conftest.py) serves :data:`HOSTS`."""

from __future__ import annotations

from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field

import h11
import trio

from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.storage.store import FINISH_URL
from dedupnet.codec.urls import fingerprint_many, normalize
from local_host.crawler.crawl import Crawler, CrawlerSettings
from local_host.frontier.sites import task_count

from .helpers import until

HOSTS = {"a": "127.88.0.1", "b": "127.88.0.2", "c": "127.88.0.3"}


# -- a tiny web --------------------------------------------------------------------------
@dataclass
class Reply:
    status: int = 200
    body: bytes | object = b""  # bytes, or an async iterator of bytes (sent chunked)
    content_type: str | None = "text/html; charset=utf-8"
    headers: list = field(default_factory=list)


@dataclass
class Hit:
    site: str
    path: str
    t: float


class Site:
    def __init__(self, web: "Web", name: str, host: str):
        self.web, self.name, self.host = web, name, host
        self.port = 0
        self.routes: dict = {}
        self.active = 0
        self.max_active = 0

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    def page(self, path: str, html: str = "<html><body>hello</body></html>", **kw) -> None:
        self.routes[path] = Reply(body=html.encode(), **kw)

    def route(self, path: str, handler) -> None:
        """``handler(n)`` (n = how many times the path was asked before) -> Reply, may await."""
        self.routes[path] = handler

    def hits(self, path: str | None = None) -> list[Hit]:
        return [h for h in self.web.hits if h.site == self.name and (path is None or h.path == path)]


class Web:
    def __init__(self):
        self.sites: dict[str, Site] = {}
        self.hits: list[Hit] = []
        self.active = 0
        self.max_active = 0

    async def add(self, nursery: trio.Nursery, name: str, host: str) -> Site:
        site = Site(self, name, host)
        listeners = await trio.open_tcp_listeners(0, host=host)
        site.port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, lambda s: self._serve(site, s), listeners)
        self.sites[name] = site
        return site

    async def _serve(self, site: Site, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            request = None
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    return
            path = request.target.decode()
            before = len(site.hits(path))
            self.hits.append(Hit(site.name, path, trio.current_time()))
            site.active += 1
            self.active += 1
            site.max_active = max(site.max_active, site.active)
            self.max_active = max(self.max_active, self.active)
            try:
                handler = site.routes.get(path)
                if handler is None:
                    reply = Reply(404, b"not found", "text/plain")
                elif isinstance(handler, Reply):
                    reply = handler
                else:
                    reply = handler(before)
                    if not isinstance(reply, Reply):
                        reply = await reply
                headers = [("connection", "close")] + list(reply.headers)
                if reply.content_type:
                    headers.append(("content-type", reply.content_type))
                if isinstance(reply.body, bytes):
                    headers.append(("content-length", str(len(reply.body))))
                await stream.send_all(conn.send(h11.Response(status_code=reply.status, headers=headers)))
                if isinstance(reply.body, bytes):
                    if reply.body:
                        await stream.send_all(conn.send(h11.Data(data=reply.body)))
                else:
                    async with aclosing(reply.body) as chunks:
                        async for chunk in chunks:
                            await stream.send_all(conn.send(h11.Data(data=chunk)))
                await stream.send_all(conn.send(h11.EndOfMessage()))
            finally:
                site.active -= 1
                self.active -= 1
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError, h11.LocalProtocolError):
            pass
        finally:
            await trio.aclose_forcefully(stream)


# -- helpers -----------------------------------------------------------------------------
FAST = dict(block_timeout=0.05, retry_base=0.01, per_site_delay=0.0, timeout=5.0, page_timeout=5.0,
            progress_interval=0.5)


@asynccontextmanager
async def crawling(store, *, consumer="c1", counters=None, **overrides):
    settings = CrawlerSettings(**{**FAST, **overrides})
    crawler = Crawler(store, settings, counters if counters is not None else Counters(), consumer=consumer)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(5):
            await nursery.start(crawler.run)
        yield crawler
        nursery.cancel_scope.cancel()


async def settle(store, crawler, timeout=10.0):
    """Until every task is done: task entries leave task_pool only in the transaction
    that records the page, so an empty task_pool and nothing in progress is the end."""
    await until(lambda: crawler.in_progress == 0 and task_count(store) == 0, timeout)


def finished(store, urls) -> list[bool]:
    return store.fp_contains(FINISH_URL, fingerprint_many([normalize(u) for u in urls])).tolist()


def page(*links: str, head: str = "") -> str:
    anchors = "".join(f'<a href="{href}">link</a>\n' for href in links)
    return f"<!doctype html><html><head>{head}</head><body>{anchors}</body></html>"


def slow_pages(site, n: int, delay: float = 0.2) -> list[str]:
    """``n`` pages of ``site`` (``/w0``...) that each answer after ``delay`` seconds: a
    crawl of them is on the wire long enough for something to happen meanwhile."""
    async def slow(_):
        await trio.sleep(delay)
        return Reply(body=page().encode())

    for i in range(n):
        site.route(f"/w{i}", slow)
    return [site.url(f"/w{i}") for i in range(n)]


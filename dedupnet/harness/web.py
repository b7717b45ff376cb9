"""A synthetic web: a seeded, deterministic link graph served over real HTTP on loopback.

The simulation harness (and the tests) need a web whose answer is known in advance:
which URLs a correct crawler fetches, exactly once each. :class:`SyntheticWeb` builds
one from a :class:`WebSpec` and a seed (same spec -> same graph and the same response
bytes), serves it with ``h11`` over trio, counts every request per URL and computes
the ground truth (:meth:`SyntheticWeb.reachable_detail`). The graph and the ground truth
are :mod:`dedupnet.harness.webgraph`, what the pages say :mod:`dedupnet.harness.webpages`;
this module serves them and counts the requests.

Addresses
    Site ``k`` (0-based) is ``http://127.77.{k // 250}.{k % 250 + 1}:{port}/``; every
    site listens on its own loopback address and all share one port (default 8077,
    ``port=0`` picks a free one). So a URL's host *is* its site, and per-site
    politeness and site-hash task splitting behave as on the real web. All of
    127.0.0.0/8 is local on Linux; nothing is ever sent off the machine.

    ``bind`` (``dedupnet web --bind CIDR``) moves the sites into another network, same
    layout: site ``k`` at address ``(k // 250) * 256 + k % 250 + 1`` of the network
    (``10.77.0.0/16`` gives ``10.77.0.1``, ``10.77.0.2``, ...), for crawlers that cannot
    reach this machine's loopback, e.g. in other network namespaces. The addresses
    must be local where the web runs (``ip route add local 10.77.0.0/16 dev lo``).

What the graph holds
    ``pages`` pages over ``sites`` sites (site sizes are skewed). Page ``k < sites`` is
    site ``k``'s home page ``/``. Out-degree is power-law (Lomax, alpha 2, mean about
    ``mean_out_degree``, capped); ``dup_share`` of the links go to pages chosen by
    preferential attachment (so the same popular URLs are discovered again and again,
    as on the real web), the rest to uniformly chosen pages; ``cross_site_share`` of
    the links leave the site. ``share_404`` of the links point to URLs that do not
    exist; ``share_redirect`` of the pages answer 301/302 (plus one redirect loop pair
    and one chain of three redirects); ``share_flaky`` of the pages answer 503 for their
    first ``flaky_failures`` requests, then 200; ``private_share`` of the pages live
    under ``/private/``, which every site's ``robots.txt`` disallows (``Crawl-delay``
    is absent). Special pages, all linked from site 0's home page: a huge page
    (> 3 MB, no links), a PDF (``application/pdf``; it contains a trap link that only a
    crawler parsing non-HTML would follow), a page of broken HTML, and a page of absurd
    links under a ``<base href>`` pointing into another site.

    Links are written as absolute, root-relative and relative hrefs (some with
    fragments, some spelled un-normalised, some pages with ``<base href>``).

What counts as reachable (ground truth: :meth:`SyntheticWeb.reachable_detail`)
    A breadth-first crawl from the seeds, as a crawler sees the web:

    * every href is resolved against the page's base (``<base href>`` if present, else
      the page URL) and put through :func:`dedupnet.codec.urls.normalize` (default limits);
      hrefs that fail (``javascript:``, ``mailto:``, ``http://[bad``, over-long URLs)
      are dropped; the fragment is dropped, so ``#x`` is the base URL itself;
    * each normalised URL is considered once, at its smallest depth (seeds: depth 0);
    * with ``obey_robots`` a URL under ``/private/`` is *disallowed*: not fetched, its
      links not followed;
    * a URL the web does not serve is *missing* (answers 404);
    * a redirecting URL is fetched (it is in ``.redirects``, not in ``.pages``); its
      ``Location`` is a newly discovered URL one level deeper (depth + 1, like a link);
    * every other URL answers 200 (after the flaky 503s): it is in ``.pages``; links are
      followed from HTML pages only (not the PDF), and only if the page's depth is
      below ``max_depth``. The huge page has no links, so a crawler that caps bodies
      misses nothing.

    A correct de-duplicating crawler fetches each URL in ``.fetched`` (pages, missing,
    redirects) and nothing else; it fetches flaky pages ``flaky_failures + 1`` times.
"""

from __future__ import annotations

import argparse
import collections
import sys

import h11
import trio

from dedupnet.codec.errors import BadURL
from dedupnet.codec.urls import normalize
from dedupnet.harness.webgraph import DEFAULT_BIND, DEFAULT_PORT, SHAPES, Reach, WebSpec, site_host
from dedupnet.harness.webpages import WebPages

__all__ = ["Reach", "SyntheticWeb", "WebSpec", "main", "site_host"]

SERVER_NAME = b"dedupnet-synthweb"


class SyntheticWeb(WebPages):
    """A deterministic web graph (built from ``spec``) and its HTTP server.

    Counters (reset with :meth:`reset_counts`):

    * ``fetch_counts[url]``: every request for a page URL (normalised ``http://host:port/path``),
      whatever the answer (503, 404, 301/302 and 200 alike);
    * ``answer_counts[url]``: the requests not answered 503 (what :meth:`duplicate_fetches` uses),
      ``answered_at[url]`` when each arrived (the politeness figures of dedupnet/harness/pacing.py);
    * ``in_flight``: requests being answered now, ``busy_seconds`` their time summed (slots in use);
    * ``robots_fetches[url]``: requests for ``http://host:port/robots.txt``;
    * ``request_log``: ``(trio.current_time(), host, target, client)`` per request
      (robots.txt included; ``client`` is the client's address, ``"?"`` if unknown), when
      it arrived, for politeness checks; a deque keeping the last ``spec.request_log_size``.

    ``latency``: seconds every answer waits before it is sent, as a real site's would, so
    that crawlers are bound by how many requests they keep in flight, not by how fast this
    machine serves them. Each connection waits on its own: any number wait at once.
    """

    def __init__(self, spec: WebSpec | None = None, *, port: int = DEFAULT_PORT, idle_timeout: float = 30.0,
                 bind: str = DEFAULT_BIND, latency: float = 0.0):
        if not 0 <= latency < float("inf"):  # NaN too
            raise ValueError(f"latency must be a number of seconds >= 0, not {latency!r}")
        super().__init__(spec, port=port, bind=bind)
        self.idle_timeout = idle_timeout
        self.latency = latency
        self.fetch_counts: collections.Counter[str] = collections.Counter()
        self.answer_counts: collections.Counter[str] = collections.Counter()
        #: Per URL, the client address of every answered request (not 503), in order: which
        #: crawler fetched it (a crawler that binds its host's IP, as the daemons do).
        self.answered_by: dict[str, list[str]] = collections.defaultdict(list)
        #: Per URL, when (``trio.current_time()``) each answered request arrived, in order.
        self.answered_at: dict[str, list[float]] = collections.defaultdict(list)
        #: Requests read and not yet answered (robots.txt included), now; and the seconds
        #: they spent so, summed: a crawler's fetch slots in use, as the sites see them.
        self.in_flight = 0
        self.busy_seconds = 0.0
        self.robots_fetches: collections.Counter[str] = collections.Counter()
        self.request_log: collections.deque[tuple[float, str, str, str]] = collections.deque(
            maxlen=self.spec.request_log_size)

    # ---------------------------------------------------------------- counters

    def reset_counts(self) -> None:
        """Forget all requests (flaky pages fail again)."""
        self.fetch_counts.clear()
        self.answer_counts.clear()
        self.answered_by.clear()
        self.answered_at.clear()
        self.busy_seconds = 0.0
        self.robots_fetches.clear()
        self.request_log.clear()

    def duplicate_fetches(self) -> int:
        """Requests beyond the first for each URL, not counting 503 answers."""
        return sum(c - 1 for c in self.answer_counts.values() if c > 1)

    # ----------------------------------------------------------------- serving

    def _answer(self, site: int, method: bytes, target: bytes,
                peer: str | None = None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        path = target.decode("latin-1")
        self.request_log.append((trio.current_time(), self.hosts[site], path, peer or "?"))
        if method not in (b"GET", b"HEAD"):
            return 405, [(b"allow", b"GET, HEAD")], b""
        origin = self.origins[site]
        if not path.startswith("/"):
            return 400, [], b""
        if path == "/robots.txt":
            self.robots_fetches[origin + path] += 1
            return 200, [(b"content-type", b"text/plain")], self.robots_txt(site)
        try:
            url = normalize(origin + path)
        except BadURL:
            url = origin + path
        self.fetch_counts[url] += 1
        i = self.lookup(url)
        if i is not None and self.flaky[i] and self.fetch_counts[url] <= self.spec.flaky_failures:
            return 503, [(b"content-type", b"text/plain")], b"Service Unavailable\n"
        self.answer_counts[url] += 1
        self.answered_by[url].append(peer or "?")
        self.answered_at[url].append(trio.current_time())
        return self.expected_response(url)

    async def _handle(self, stream: trio.SocketStream) -> None:
        """One TCP connection: its site is the address it reached, its client the peer's."""
        site = self._site_index.get(stream.socket.getsockname()[0], 0)
        try:
            peer = stream.socket.getpeername()[0]
        except OSError:
            peer = None
        await self.serve_connection(stream, site, peer)

    async def serve_connection(self, stream: trio.abc.Stream, site: int, peer: str | None = None) -> None:
        """One connection to ``site``: HTTP/1.1 keep-alive loop; every read and write is
        under ``idle_timeout``; each answer waits ``latency`` first; protocol errors get
        a 400 and close the connection. Closes ``stream``."""
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = None
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        with trio.move_on_after(self.idle_timeout):
                            conn.receive_data(await stream.receive_some(65536))
                            continue
                        return
                    if isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                cs = await self._respond(conn, stream, site, request, peer)
                if cs.cancelled_caught or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except h11.RemoteProtocolError:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                try:
                    out = conn.send(h11.Response(status_code=400, headers=[
                        (b"content-length", b"0"), (b"connection", b"close"), (b"server", SERVER_NAME)]))
                    out += conn.send(h11.EndOfMessage())
                    with trio.move_on_after(1):
                        await stream.send_all(out)
                except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async def _respond(self, conn: h11.Connection, stream: trio.abc.Stream, site: int, request: h11.Request,
                       peer: str | None) -> trio.CancelScope:
        """Answer one request (after ``latency``), counted in flight until it is sent;
        returns the send's cancel scope (cancelled: the client did not take it in time)."""
        self.in_flight += 1
        start = trio.current_time()
        try:
            status, headers, body = self._answer(site, request.method, request.target, peer)
            if self.latency:
                await trio.sleep(self.latency)
            headers = [*headers, (b"content-length", str(len(body)).encode()), (b"server", SERVER_NAME)]
            out = conn.send(h11.Response(status_code=status, headers=headers))
            if request.method != b"HEAD":
                out += conn.send(h11.Data(data=body))
            out += conn.send(h11.EndOfMessage())
            with trio.move_on_after(self.idle_timeout) as cs:
                await stream.send_all(out)
            return cs
        finally:
            self.in_flight -= 1
            self.busy_seconds += trio.current_time() - start

    async def _open_listeners(self, port: int) -> list[trio.SocketListener]:
        """One listener per site address, all on ``port``; ``port=0``: a port free on every address."""
        for _attempt in range(20):
            listeners: list[trio.SocketListener] = []
            try:
                first = await trio.open_tcp_listeners(port, host=self.hosts[0])
                listeners += first
                chosen = first[0].socket.getsockname()[1]
                for h in self.hosts[1:]:
                    listeners += await trio.open_tcp_listeners(chosen, host=h)
                if chosen != self.port:
                    self.port = chosen
                return listeners
            except OSError:
                for lst in listeners:
                    await lst.aclose()
                if port != 0:
                    raise
        raise OSError("no port free on every site address")

    async def serve(self, *, host_port: int | None = None,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve every site until cancelled. ``host_port``: None -> ``self.port``; 0 -> a
        free port (``self.port`` and all URLs follow it). ``nursery.start`` returns the port."""
        listeners = await self._open_listeners(self.port if host_port is None else host_port)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(trio.serve_listeners, self._handle, listeners)
                task_status.started(self.port)
        finally:
            for lst in listeners:
                await trio.aclose_forcefully(lst)


def build_parser(parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of ``dedupnet web``."""
    p = parser_class(prog="dedupnet web", description="Serve a seeded synthetic web on loopback "
                     "(site k at 127.77.{k//250}.{k%250+1}, one port for all sites), or in another network (--bind).")
    p.add_argument("--pages", type=int, default=WebSpec.pages, help="pages of the web (default %(default)s)")
    p.add_argument("--sites", type=int, default=WebSpec.sites, help="sites the pages are spread over (default %(default)s)")
    p.add_argument("--shape", choices=tuple(SHAPES), default="classic",
                   help="classic (default): 30%% of links leave their site; real: 85%% stay, site sizes by Zipf's "
                        "law (as dedupnet sim's default web)")
    p.add_argument("--seed", type=int, default=WebSpec.seed,
                   help="seed of the link graph: the same seed gives the same web (default %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port of every site (0: any free one; default %(default)s)")
    p.add_argument("--seeds", type=int, default=5, metavar="N", help="seed URLs to print (default %(default)s)")
    p.add_argument("--latency", type=float, default=0.0, metavar="S",
                   help="seconds every answer waits before it is sent, as on the real web (default 0)")
    p.add_argument("--bind", default=DEFAULT_BIND, metavar="CIDR",
                   help=f"network the sites listen in, site k at its ((k//250)*256 + k%%250 + 1)-th address "
                        f"(default {DEFAULT_BIND}); the addresses must be local, e.g. "
                        f"`ip route add local 10.77.0.0/16 dev lo`")
    return p


def main(argv: list[str] | None = None, parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> int:
    """Serve a synthetic web until Ctrl-C (``dedupnet web``)."""
    p = build_parser(parser_class)
    args = p.parse_args(argv)
    try:
        spec = WebSpec.shaped(args.shape, pages=args.pages, sites=args.sites, seed=args.seed)
        web = SyntheticWeb(spec, port=args.port, bind=args.bind, latency=args.latency)
    except ValueError as e:
        p.error(str(e))

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(web.serve)
            st = web.stats()
            print(f"synthetic web: {st['pages']} pages, {st['sites']} sites at "
                  f"{web.hosts[0]} .. {web.hosts[-1]} port {port}; {st['links']} links, "
                  f"{st['distinct_link_targets']} distinct targets", flush=True)
            reach = web.reachable_detail(web.seeds(args.seeds))
            print(f"reachable from the seeds: {len(reach.pages)} pages, {len(reach.missing)} missing, "
                  f"{len(reach.redirects)} redirects, {len(reach.disallowed)} disallowed", flush=True)
            for s in web.seeds(args.seeds):
                print(s, flush=True)

    rc = 0
    try:
        trio.run(run)
    except* KeyboardInterrupt:  # Ctrl-C: the normal way to stop
        pass
    except* OSError as eg:  # e.g. the port is taken
        print(f"dedupnet web: {eg.exceptions[0]}", file=sys.stderr)
        rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())

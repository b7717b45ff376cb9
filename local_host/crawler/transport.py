"""HTTP/1.1 for the crawler's httpx clients: trio sockets, responses parsed by httptools.

httpx stays the crawler's client (requests, headers, content decoding, errors); this
is the transport under it, in place of httpcore. httpcore parses with h11, pure Python,
and re-checks every pooled connection on every request: together the biggest part of a
crawler's CPU per page (docs/BENCHMARKS.md "CPU per page"). httptools is llhttp, the
parser of Node.js, in C, kept by the uvloop/uvicorn maintainers.

What a crawler needs and nothing more: GET (any method with a body in memory),
keep-alive connections per origin, TLS with the client's context, a local address to
send from, and httpcore's ``trace`` hook for the moment the request goes out. Bodies
are delimited by Content-Length, chunked encoding or the connection's close. A
connection goes back to its origin's idle list only when its response was read to
the end and both sides keep it alive; one that is readable while idle (closed by the
server, or sent something unasked) is dropped before use. Proxies from the environment
are httpx's own transports (its mounts), not this one.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import httptools
import httpx
import trio

__all__ = ["CrawlTransport"]

READ_SIZE = 64 * 1024
DEFAULT_PORTS = {b"http": 80, b"https": 443}
#: Statuses whose response has no body whatever its headers say.
NO_BODY = frozenset({204, 304})


class _Conn:
    __slots__ = ("stream", "idle_since")

    def __init__(self, stream: trio.abc.Stream):
        self.stream = stream
        self.idle_since = 0.0

    def socket(self):
        s = self.stream
        return (s.transport_stream if isinstance(s, trio.SSLStream) else s).socket

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(self.stream)


class _Parse:
    """httptools' callbacks: each message's headers, then its body chunks as they come."""

    __slots__ = ("headers", "chunks", "headers_done", "done")

    def __init__(self) -> None:
        self.on_message_begin()

    def on_message_begin(self) -> None:  # also after an informational (1xx) response
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.headers_done = self.done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.done = True


class _Exchange:
    """One request's response on one connection: read until its headers, then its body
    as the caller iterates; the connection goes back to the pool or is closed."""

    def __init__(self, transport: "CrawlTransport", origin: tuple, conn: _Conn, read_timeout: float | None):
        self.transport, self.origin, self.conn, self.read_timeout = transport, origin, conn, read_timeout
        self.parse = _Parse()
        self.parser = httptools.HttpResponseParser(self.parse)
        self.until_close = False  # the body ends with the connection
        self.keep_alive = False  # both sides keep the connection after this response
        self.finished = False

    async def _feed(self) -> bool:
        """Read once into the parser; False at the connection's end."""
        try:
            data = await self.conn.stream.receive_some(READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            raise httpx.ReadError(f"read failed: {e!r}") from e
        if not data:
            return False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:
            raise httpx.RemoteProtocolError("unexpected protocol upgrade") from e
        except httptools.HttpParserError as e:
            raise httpx.RemoteProtocolError(f"malformed response: {e}") from e
        return True

    async def head(self) -> int:
        """Read up to the end of the headers (1xx informational responses skipped)."""
        while True:
            while not self.parse.headers_done:
                if not await self._feed():
                    raise httpx.RemoteProtocolError("connection closed before a response")
            status = self.parser.get_status_code()
            if not 100 <= status < 200:
                break
            self.parse.headers_done = False  # the response follows (its message begins anew)
        fields = {name.lower(): value for name, value in self.parse.headers}
        connection = fields.get(b"connection", b"").lower()
        # (the parser's should_keep_alive() is reset once it has the whole message)
        self.keep_alive = (b"close" not in connection if self.parser.get_http_version() == "1.1"
                           else b"keep-alive" in connection)
        self.until_close = (status not in NO_BODY and b"content-length" not in fields
                            and b"transfer-encoding" not in fields)
        if status in NO_BODY and not self.parse.done:
            self.parse.done = True
        return status

    async def body(self) -> AsyncIterator[bytes]:
        parse = self.parse
        while True:
            if parse.chunks:
                chunks, parse.chunks = parse.chunks, []
                for chunk in chunks:
                    yield chunk
            if parse.done:
                break
            with _Limit(self.read_timeout, httpx.ReadTimeout):
                more = await self._feed()
            if not more:
                if self.until_close:
                    parse.done = True
                    continue
                raise httpx.RemoteProtocolError("connection closed in the middle of a response")
        self.finished = True

    async def aclose(self) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        if self.finished and self.keep_alive and not self.until_close and not self.transport.closed:
            self.transport._release(self.origin, conn)
        else:
            await conn.aclose()


class _Body(httpx.AsyncByteStream):
    """A response's body; it holds one of the transport's connection slots until closed."""

    def __init__(self, exchange: _Exchange, slots: trio.Semaphore):
        self._exchange, self._slots, self._held = exchange, slots, True

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._exchange.body():
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._exchange.aclose()
        finally:
            if self._held:
                self._held = False
                self._slots.release()


class CrawlTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 connections per origin: at most ``max_connections`` requests
    at once (one more waits for a slot, up to httpx's pool timeout), each on an idle
    connection of its origin if there is one, else on a new one; an idle connection is
    kept ``keepalive_expiry`` seconds. Meant, as the crawler uses it, for one site's
    client (:class:`~local_host.crawler.fetch.ClientPool`)."""

    def __init__(self, *, ssl_context: ssl.SSLContext, max_connections: int, keepalive_expiry: float,
                 local_address: str | None = None):
        self._ssl = ssl_context
        self._slots = trio.Semaphore(max_connections)
        self._expiry = keepalive_expiry
        self._local = local_address
        self._idle: dict[tuple, list[_Conn]] = {}
        self.closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.raw_scheme
        if scheme not in DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"unsupported scheme {url.scheme!r}")
        host = url.raw_host.decode("ascii")
        origin = (scheme, host, url.port or DEFAULT_PORTS[scheme])
        timeouts = request.extensions.get("timeout", {})
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            with _Limit(timeouts.get("pool"), httpx.PoolTimeout):
                await self._slots.acquire()
        try:
            conn = self._idle_conn(origin) or await self._connect(origin, timeouts.get("connect"))
            exchange = _Exchange(self, origin, conn, timeouts.get("read"))
            try:
                # One deadline from sending to the answer's headers: a GET's few hundred
                # bytes go into the socket's buffer at once, so a write timeout of its own
                # would only cost a cancel scope per request.
                with _Limit(exchange.read_timeout, httpx.ReadTimeout):
                    await self._send(conn.stream, request)
                    status = await exchange.head()
                if request.method == "HEAD":  # its headers may announce a body it does not have
                    exchange.parse.done, exchange.keep_alive = True, False
            except BaseException:
                exchange.until_close = True  # never reused
                await exchange.aclose()
                raise
        except BaseException:
            self._slots.release()
            raise
        return httpx.Response(status, headers=exchange.parse.headers, stream=_Body(exchange, self._slots),
                              extensions={"http_version": b"HTTP/1.1"})

    def _idle_conn(self, origin: tuple) -> _Conn | None:
        idle = self._idle.get(origin)
        now = trio.current_time()
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < self._expiry and not conn.socket().is_readable():
                return conn
            conn.socket().close()  # no TLS goodbye: it is going away
        return None

    async def _connect(self, origin: tuple, timeout: float | None) -> _Conn:
        scheme, host, port = origin
        try:
            with _Limit(timeout, httpx.ConnectTimeout):
                stream: trio.abc.Stream = await trio.open_tcp_stream(host, port, local_address=self._local)
        except OSError as e:
            raise httpx.ConnectError(f"connect to {host}:{port} failed: {e!r}") from e
        if scheme == b"https":
            tls = trio.SSLStream(stream, self._ssl, server_hostname=host, https_compatible=True)
            try:
                with _Limit(timeout, httpx.ConnectTimeout):
                    await tls.do_handshake()
            except BaseException as e:
                await trio.aclose_forcefully(stream)
                if isinstance(e, (trio.BrokenResourceError, OSError)):
                    raise httpx.ConnectError(f"TLS with {host}:{port} failed: {e!r}") from e
                raise
            stream = tls
        return _Conn(stream)

    async def _send(self, stream: trio.abc.Stream, request: httpx.Request) -> None:
        url = request.url
        lines = [b"%s %s HTTP/1.1" % (request.method.encode("ascii"), url.raw_path)]
        lines += [b"%s: %s" % kv for kv in request.headers.raw]
        body = await request.aread()
        data = b"\r\n".join(lines) + b"\r\n\r\n" + body
        trace = request.extensions.get("trace")
        if trace is not None:
            await trace("http11.send_request_headers.started", {"request": request})
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            raise httpx.WriteError(f"write failed: {e!r}") from e

    def _release(self, origin: tuple, conn: _Conn) -> None:
        conn.idle_since = trio.current_time()
        self._idle.setdefault(origin, []).append(conn)

    async def aclose(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                await conn.aclose()


class _Limit:
    """httpx's timeout of one step (connect, pool, read): ``error`` when it runs out. A
    class, not a generator context manager: one is entered per read."""

    __slots__ = ("_seconds", "_error", "_scope")

    def __init__(self, seconds: float | None, error: type[httpx.TimeoutException]):
        self._seconds, self._error, self._scope = seconds, error, None

    def __enter__(self) -> None:
        if self._seconds is not None:
            self._scope = trio.CancelScope(deadline=trio.current_time() + self._seconds)
            self._scope.__enter__()

    def __exit__(self, *exc) -> bool:
        scope = self._scope
        if scope is None:
            return False
        swallowed = scope.__exit__(*exc)
        if scope.cancelled_caught:
            raise self._error(f"no progress in {self._seconds} s")
        return bool(swallowed)

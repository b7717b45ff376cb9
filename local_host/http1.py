"""A small HTTP/1.1 client for the crawler: keep-alive GETs on trio, responses parsed
by ``httptools`` (llhttp, the parser of Node.js, in C).

Why not httpx for the pages: the crawler's requests are all alike (GET, a few fixed
headers, a body read once up to a bound, connections kept per site by
:class:`~local_host.fetch.ClientPool`), and httpx spends most of the crawler's CPU on
what it offers beyond that — its request and URL models, cookies, auth and redirect
layers, httpcore's pool bookkeeping and h11's pure-Python parsing. This client is
what :mod:`local_host.fetch` uses of ``httpx.AsyncClient`` and nothing else:
``stream()`` / ``aclose()``, a response with ``status_code``, ``headers``,
``charset_encoding``, ``aiter_bytes()`` (decoded: gzip, deflate, br), ``aiter_raw()``,
``num_bytes_downloaded``, the ``trace`` extension (when the request goes out), and
redirects followed when asked (robots.txt). It raises httpx's exception classes, so
callers sort failures exactly as before. Proxies from the environment are httpx's
job: :func:`~local_host.fetch.client_factory` makes httpx clients when there are any.

A connection that was idle is checked before it is used (a server that closed it
makes it readable); a request whose reused connection turns out closed before any
byte of the answer came is sent once more on a new one (GET is idempotent).
"""

from __future__ import annotations

import re
import select
import ssl
import urllib.parse
import zlib
from collections.abc import AsyncIterator

import httptools
import httpx
import trio

try:
    import brotli
except ImportError:  # pragma: no cover - brotli is httpx[brotli]'s, installed here
    brotli = None

__all__ = ["Http1Client", "Http1Response", "Headers"]

ACCEPT_ENCODING = b"gzip, deflate, br" if brotli is not None else b"gzip, deflate"
REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 20  # httpx's default
_CHARSET = re.compile(r";\s*charset\s*=\s*[\"']?([^\s;\"']+)", re.IGNORECASE)


class Headers(dict):
    """Response headers: lowercase names, values of a repeated header joined by ", "
    (as ``httpx.Headers.get`` gives them)."""


class _Parsed:
    """httptools' callbacks: what has come of the answer so far."""

    __slots__ = ("parser", "headers", "headers_done", "chunks", "complete", "keep_alive", "answered")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.chunks: list[bytes] = []
        self.complete = False
        self.keep_alive = False  # known once the answer is complete (llhttp forgets it then)
        self.answered = False  # a byte of the answer came

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()


class _Connection:
    __slots__ = ("stream", "socket", "reused")

    def __init__(self, stream: trio.abc.Stream, socket) -> None:
        self.stream = stream
        self.socket = socket
        self.reused = False

    def closed_by_peer(self) -> bool:
        """An idle connection the server closed (or wrote to): readable with nothing asked."""
        try:
            p = select.poll()
            p.register(self.socket.fileno(), select.POLLIN)
            return bool(p.poll(0))
        except (OSError, ValueError):
            return True

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(self.stream)


def _split(url: str) -> tuple[str, str, int, bytes, bytes]:
    """(scheme, host, port, Host header, request target) of an absolute http(s) URL."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise httpx.UnsupportedProtocol(f"Request URL has an unsupported protocol '{scheme}://'.")
    end = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if 0 <= i < end:
            end = i
    authority, target = rest[:end], rest[end:].partition("#")[0]
    if not target.startswith("/"):
        target = "/" + target
    authority = authority.rpartition("@")[2]
    if authority.startswith("["):
        close = authority.find("]")
        host, port_text = authority[1:close], authority[close + 2:]
    else:
        host, _, port_text = authority.partition(":")
    if not host:
        raise httpx.InvalidURL(f"no host in {url[:200]!r}")
    try:
        port = int(port_text) if port_text else (443 if scheme == "https" else 80)
    except ValueError:
        raise httpx.InvalidURL(f"bad port in {url[:200]!r}") from None
    host_header = authority
    if port_text and port == (443 if scheme == "https" else 80):
        host_header = authority[: -len(port_text) - 1]  # no default port in Host
    try:
        return scheme, host, port, host_header.encode("ascii" if host_header.isascii() else "idna"), _target(target)
    except UnicodeError:
        raise httpx.InvalidURL(f"bad host in {url[:200]!r}") from None


def _target(target: str) -> bytes:
    if target.isascii() and " " not in target:
        return target.encode("ascii")
    return urllib.parse.quote(target, safe="/?&=%:@!$'()*+,;~-._[]").encode("ascii")


def _decoder(encoding: str):
    """A function body chunk -> decoded bytes (b"" at the end flushes), or None for identity."""
    encoding = encoding.strip().lower()
    if encoding in ("gzip", "x-gzip"):
        d = zlib.decompressobj(zlib.MAX_WBITS | 16)
    elif encoding == "deflate":
        return _Deflate()
    elif encoding == "br" and brotli is not None:
        d = brotli.Decompressor()
        return lambda data: d.process(data) if data else b""
    else:
        return None
    return lambda data: d.decompress(data) if data else d.flush()


class _Deflate:
    """'deflate' as servers send it: zlib-wrapped, or raw (as httpx accepts both)."""

    def __init__(self) -> None:
        self._d = zlib.decompressobj()
        self._first = True

    def __call__(self, data: bytes) -> bytes:
        if not data:
            return self._d.flush()
        if self._first:
            self._first = False
            try:
                return self._d.decompress(data)
            except zlib.error:
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._d.decompress(data)


class Http1Response:
    """One answer, its body read as it is iterated (see the module's docstring)."""

    def __init__(self, client: Http1Client, key: tuple, conn: _Connection, parsed: _Parsed, timeout: float,
                 url: str) -> None:
        self._client, self._key, self._conn = client, key, conn
        self._parsed, self._timeout = parsed, timeout
        self.url = url
        self.status_code: int = parsed.parser.get_status_code()
        headers = Headers()
        for name, value in parsed.headers:
            k = name.decode("latin-1").lower()
            v = value.decode("latin-1")
            headers[k] = f"{headers[k]}, {v}" if k in headers else v
        parsed.headers = []
        self.headers = headers
        self.num_bytes_downloaded = 0

    @property
    def charset_encoding(self) -> str | None:
        m = _CHARSET.search(self.headers.get("content-type", ""))
        return m.group(1) if m else None

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        parsed = self._parsed
        while True:
            if parsed.chunks:
                chunks, parsed.chunks = parsed.chunks, []
                for chunk in chunks:
                    self.num_bytes_downloaded += len(chunk)
                    yield chunk
            if parsed.complete:
                return
            await self._client._receive(self._conn, parsed, self._timeout, eof_ends=True)

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        decode = _decoder(self.headers.get("content-encoding", "")) if "content-encoding" in self.headers else None
        async for chunk in self.aiter_raw():
            if decode is not None:
                try:
                    chunk = decode(chunk)
                except Exception as e:  # noqa: BLE001 - zlib.error, brotli.error (a plain Exception)
                    raise httpx.DecodingError(f"{type(e).__name__}: {e}") from None
            if chunk:
                yield chunk
        if decode is not None:
            try:
                tail = decode(b"")
            except Exception as e:  # noqa: BLE001 - as above
                raise httpx.DecodingError(f"{type(e).__name__}: {e}") from None
            if tail:
                yield tail

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._parsed.parser = None  # no cycle left for the garbage collector
        if self._parsed.complete and self._parsed.keep_alive:  # all of it read off the connection
            self._client._put_back(self._key, conn)
        else:
            await conn.aclose()


class _Stream:
    """``client.stream(...)``: an async context manager for one response."""

    __slots__ = ("_client", "_url", "_headers", "_trace", "_follow", "_response")

    def __init__(self, client: Http1Client, url: str, headers, trace, follow: bool) -> None:
        self._client, self._url, self._headers, self._trace, self._follow = client, url, headers, trace, follow
        self._response: Http1Response | None = None

    async def __aenter__(self) -> Http1Response:
        url = self._url
        for _ in range(MAX_REDIRECTS + 1):
            r = await self._client._send(url, self._headers, self._trace)
            location = r.headers.get("location")
            if not (self._follow and r.status_code in REDIRECTS and location):
                self._response = r
                return r
            await _discard(r)
            url = urllib.parse.urljoin(url, location.strip())
        raise httpx.TooManyRedirects("Exceeded maximum allowed redirects.")

    async def __aexit__(self, *exc) -> None:
        if self._response is not None:
            await self._response.aclose()


async def _discard(r: Http1Response) -> None:
    """Read a small body to the end (the connection is kept) or close it."""
    try:
        if int(r.headers.get("content-length", "-1")) in range(0, 64 * 1024 + 1):
            async for _ in r.aiter_raw():
                pass
    except (ValueError, httpx.HTTPError):
        pass
    finally:
        await r.aclose()


class Http1Client:
    """Keep-alive connections per origin, at most ``connections`` of them kept idle
    (:class:`~local_host.fetch.ClientPool` never puts more requests on one client)."""

    def __init__(self, *, ssl_context: ssl.SSLContext, timeout: float, user_agent: str,
                 local_address: str | None = None, connections: int = 4) -> None:
        self._ssl = ssl_context
        self._timeout = timeout
        self._local_address = local_address
        self._keep = max(1, connections)
        self._idle: dict[tuple, list[_Connection]] = {}
        self._fixed = b"User-Agent: " + user_agent.encode("latin-1", "replace") + b"\r\nAccept-Encoding: " + \
            ACCEPT_ENCODING + b"\r\n"
        self._closed = False

    def stream(self, method: str, url: str, *, headers: dict | None = None, extensions: dict | None = None,
               follow_redirects: bool | None = None) -> _Stream:
        if method != "GET":
            raise ValueError("only GET")
        trace = (extensions or {}).get("trace")
        return _Stream(self, url, headers, trace, bool(follow_redirects))

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                await conn.aclose()

    # -- connections ---------------------------------------------------------------------
    async def _connect(self, scheme: str, host: str, port: int) -> _Connection:
        timeout = self._timeout
        try:
            with trio.fail_after(timeout):
                tcp = await trio.open_tcp_stream(host, port, local_address=self._local_address)
                if scheme == "https":
                    stream = trio.SSLStream(tcp, self._ssl, server_hostname=host, https_compatible=True)
                    try:
                        await stream.do_handshake()
                    except BaseException:
                        await trio.aclose_forcefully(tcp)
                        raise
                    return _Connection(stream, tcp.socket)
                return _Connection(tcp, tcp.socket)
        except trio.TooSlowError:
            raise httpx.ConnectTimeout(f"connect to {host}:{port} timed out") from None
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as e:
            raise httpx.ConnectError(f"{type(e).__name__}: {e}") from None

    def _take_idle(self, key: tuple) -> _Connection | None:
        conns = self._idle.get(key)
        while conns:
            conn = conns.pop()
            if not conn.closed_by_peer():
                conn.reused = True
                return conn
            _close_now(conn)
        return None

    def _put_back(self, key: tuple, conn: _Connection) -> None:
        conns = self._idle.setdefault(key, [])
        if self._closed or len(conns) >= self._keep:
            _close_now(conn)
        else:
            conns.append(conn)

    # -- one request ---------------------------------------------------------------------
    async def _send(self, url: str, headers: dict | None, trace) -> Http1Response:
        scheme, host, port, host_header, target = _split(url)
        key = (scheme, host, port)
        request = b"".join([b"GET ", target, b" HTTP/1.1\r\nHost: ", host_header, b"\r\n", self._fixed,
                            *[f"{k}: {v}\r\n".encode("latin-1") for k, v in (headers or {}).items()], b"\r\n"])
        while True:
            conn = self._take_idle(key)
            fresh = conn is None
            if fresh:
                conn = await self._connect(scheme, host, port)
            try:
                if trace is not None:
                    await trace("http11.send_request_headers.started", {})
                try:
                    with trio.CancelScope(deadline=trio.current_time() + self._timeout) as scope:
                        await conn.stream.send_all(request)
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
                    raise _Stale() if not fresh else httpx.WriteError(str(e) or type(e).__name__) from None
                if scope.cancelled_caught:
                    raise httpx.WriteTimeout("write timed out")
                parsed = _Parsed()
                while not parsed.headers_done:
                    try:
                        await self._receive(conn, parsed, self._timeout, eof_ends=False)
                    except (httpx.RemoteProtocolError, httpx.ReadError):
                        if not fresh and not parsed.answered:
                            raise _Stale() from None
                        raise
                return Http1Response(self, key, conn, parsed, self._timeout, url)
            except _Stale:
                await conn.aclose()  # the server had closed it: once more on a new one
                continue
            except BaseException:
                await conn.aclose()
                raise

    async def _receive(self, conn: _Connection, parsed: _Parsed, timeout: float, *, eof_ends: bool) -> None:
        """Feed the parser what comes next; at the end of the stream the answer ends
        if it had neither length nor chunks (``eof_ends``), else it was cut short."""
        data = None
        try:
            # A plain cancel scope: trio.fail_after is a generator context manager, dearer.
            with trio.CancelScope(deadline=trio.current_time() + timeout):
                data = await conn.stream.receive_some(65536)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
            raise httpx.ReadError(str(e) or type(e).__name__) from None
        if data is None:
            raise httpx.ReadTimeout("read timed out")
        if not data:
            if eof_ends and parsed.headers_done and not parsed.parser.should_keep_alive():
                parsed.complete = True  # an answer without a length ends with its connection
                return
            raise httpx.RemoteProtocolError("Server disconnected without sending a complete response.")
        parsed.answered = True
        try:
            parsed.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise httpx.RemoteProtocolError("unexpected upgrade") from None
        except httptools.HttpParserError as e:
            raise httpx.RemoteProtocolError(f"bad response: {e}") from None


class _Stale(Exception):
    """A reused keep-alive connection was closed by the server before it answered."""


def _close_now(conn: _Connection) -> None:
    """Close a connection at once, without a checkpoint (nothing to say on it)."""
    try:
        conn.socket.close()
    except OSError:
        pass

"""The crawler's HTTP/1.1 client (local_host/http1.py) against a scripted server on
loopback: what goes on the wire, keep-alive, bodies (length, chunked, to the close,
compressed), redirects, and the failures it reports as httpx's."""

from __future__ import annotations

import gzip
import socket
import ssl
import zlib

import httpx
import pytest
import trio

from local_host.fetch import _tls_context
from local_host.http1 import Http1Client


class Scripted:
    """A server whose every answer is ``answer(connection number, request head)``:
    bytes to send (then the connection stays open), ``(bytes, True)`` to send and
    close, or None to close without answering."""

    def __init__(self, answer):
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.port = 0

    async def serve(self, nursery: trio.Nursery) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        number = self.connections
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                self.requests.append(head)
                out = self.answer(number, head)
                if out is None:
                    return
                close = isinstance(out, tuple)
                await stream.send_all(out[0] if close else out)
                if close:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def ok(body: bytes = b"hello", *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body


@pytest.fixture
async def nursery():
    async with trio.open_nursery() as n:
        yield n
        n.cancel_scope.cancel()


def client(**kw) -> Http1Client:
    return Http1Client(ssl_context=_tls_context(False), timeout=5.0, user_agent="test-agent/1", **kw)


async def get(c: Http1Client, url: str, **kw) -> tuple[httpx.Response, bytes]:
    async with c.stream("GET", url, **kw) as r:
        body = b"".join([chunk async for chunk in r.aiter_bytes()])
    return r, body


async def test_requests_go_out_as_http11_and_keep_alive_reuses_one_connection(nursery):
    server = Scripted(lambda n, head: ok(b"page " + head.split(b" ")[1], "Content-Type: text/html; charset=ISO-8859-1",
                                         "X-Twice: a", "X-Twice: b"))
    await server.serve(nursery)
    c = client()
    sent = []

    async def trace(name, info):
        sent.append(name)

    for path in ("/a", "/b?q=1", "/c"):
        r, body = await get(c, server.url(path), headers={"Accept": "text/html"}, extensions={"trace": trace})
        assert r.status_code == 200 and body == b"page " + path.encode()
    assert server.connections == 1  # three requests, one connection
    assert r.headers["x-twice"] == "a, b" and r.charset_encoding == "ISO-8859-1"
    assert r.num_bytes_downloaded == len(b"page /c")
    assert sent == ["http11.send_request_headers.started"] * 3
    lines = server.requests[1].split(b"\r\n")
    assert lines[0] == b"GET /b?q=1 HTTP/1.1"
    assert f"Host: 127.0.0.1:{server.port}".encode() in lines
    assert b"User-Agent: test-agent/1" in lines and b"Accept: text/html" in lines
    await c.aclose()


async def test_bodies_chunked_to_the_close_and_compressed(nursery):
    text = b"<html>" + b"x" * 5000 + b"</html>"
    answers = {
        b"/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        b"/gzip": ok(gzip.compress(text), "Content-Encoding: gzip"),
        b"/deflate": ok(zlib.compress(text), "Content-Encoding: deflate"),
        b"/raw-deflate": ok(zlib.compress(text)[2:-4], "Content-Encoding: deflate"),
        b"/bad-gzip": ok(b"not gzip at all", "Content-Encoding: gzip"),
    }
    server = Scripted(lambda n, head: (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", True) if b"/close" in head
                      else answers[head.split(b" ")[1]])
    await server.serve(nursery)
    c = client()
    assert (await get(c, server.url("/chunked")))[1] == b"abcde"
    r, body = await get(c, server.url("/gzip"))
    assert body == text and r.num_bytes_downloaded == len(gzip.compress(text))  # bytes on the wire
    assert (await get(c, server.url("/deflate")))[1] == text
    assert (await get(c, server.url("/raw-deflate")))[1] == text
    assert server.connections == 1
    assert (await get(c, server.url("/close")))[1] == b"until the end"
    with pytest.raises(httpx.DecodingError):
        await get(c, server.url("/bad-gzip"))
    await c.aclose()


async def test_a_body_left_unread_closes_its_connection(nursery):
    server = Scripted(lambda n, head: ok(b"y" * 100_000))
    await server.serve(nursery)
    c = client()
    for _ in range(2):
        async with c.stream("GET", server.url("/big")) as r:
            assert r.status_code == 200  # the body is not read: the connection cannot serve another
    assert server.connections == 2
    await c.aclose()


async def test_a_connection_the_server_closed_is_replaced_and_the_request_sent_once_more(nursery):
    # Connection 1 answers its first request, then closes on the second without an
    # answer (as a server whose keep-alive timed out just then); connection 2 answers.
    def answer(n, head):
        if n == 1 and len(server.requests) == 2:
            return None
        return ok(b"fine")

    server = Scripted(answer)
    await server.serve(nursery)
    c = client()
    assert (await get(c, server.url("/1")))[1] == b"fine"
    assert (await get(c, server.url("/2")))[1] == b"fine"
    assert server.connections == 2 and len(server.requests) == 3
    # Closed while idle (seen before it is used): a new connection, nothing sent twice.
    server.answer = lambda n, head: (ok(b"once"), True)
    assert (await get(c, server.url("/3")))[1] == b"once"
    assert (await get(c, server.url("/4")))[1] == b"once"
    assert server.connections == 3 and len(server.requests) == 5
    await c.aclose()


async def test_a_new_connection_closed_without_an_answer_is_an_error_not_a_retry(nursery):
    server = Scripted(lambda n, head: None)
    await server.serve(nursery)
    c = client()
    with pytest.raises(httpx.RemoteProtocolError):
        await get(c, server.url("/"))
    assert server.connections == 1
    server.answer = lambda n, head: b"this is not HTTP\r\n\r\n"
    with pytest.raises(httpx.RemoteProtocolError):
        await get(c, server.url("/"))
    await c.aclose()


async def test_redirects_are_followed_only_when_asked_and_a_loop_ends(nursery):
    def answer(n, head):
        path = head.split(b" ")[1]
        if path == b"/from":
            return b"HTTP/1.1 301 Moved\r\nLocation: /to\r\nContent-Length: 0\r\n\r\n"
        if path == b"/loop":
            return b"HTTP/1.1 302 Found\r\nLocation: /loop\r\nContent-Length: 0\r\n\r\n"
        return ok(b"arrived")

    server = Scripted(answer)
    await server.serve(nursery)
    c = client()
    r, _ = await get(c, server.url("/from"))
    assert r.status_code == 301 and r.headers["location"] == "/to"
    r, body = await get(c, server.url("/from"), follow_redirects=True)
    assert r.status_code == 200 and body == b"arrived" and server.connections == 1
    with pytest.raises(httpx.TooManyRedirects):
        await get(c, server.url("/loop"), follow_redirects=True)
    await c.aclose()


async def test_failures_are_httpx_errors():
    c = client()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(httpx.ConnectError):
        await get(c, f"http://127.0.0.1:{port}/")
    with pytest.raises(httpx.UnsupportedProtocol):
        await get(c, "ftp://127.0.0.1/")
    await c.aclose()


async def test_https_verifies_the_server_and_keeps_its_connection(nursery, tmp_path):
    from dedupnet.adapters.tls import make_certs

    made = make_certs(tmp_path, [1], [(1, "127.0.0.1")], days=2)
    cert, key = made.hosts["127.0.0.1"]
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    server = Scripted(lambda n, head: ok(b"secret"))
    listeners = await trio.open_ssl_over_tcp_listeners(0, server_ctx, host="127.0.0.1")
    port = listeners[0].transport_listener.socket.getsockname()[1]
    nursery.start_soon(trio.serve_listeners, server._connection, listeners)
    trusting = Http1Client(ssl_context=ssl.create_default_context(cafile=str(made.ca)), timeout=5.0,
                           user_agent="t")
    for _ in range(2):
        assert (await get(trusting, f"https://127.0.0.1:{port}/"))[1] == b"secret"
    assert server.connections == 1
    with pytest.raises(httpx.ConnectError):  # the system's CAs do not know this one
        await get(client(), f"https://127.0.0.1:{port}/")
    await trusting.aclose()


async def test_a_server_that_stops_answering_is_a_read_timeout(nursery, autojump_clock):
    def answer(n, head):
        if b"/half" in head:
            return b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfive!"  # and the rest never comes
        return b""  # nothing at all

    server = Scripted(answer)
    await server.serve(nursery)
    c = client()
    with pytest.raises(httpx.ReadTimeout):
        await get(c, server.url("/silent"))
    with pytest.raises(httpx.ReadTimeout):
        await get(c, server.url("/half"))
    await c.aclose()


async def test_an_answer_without_a_body_keeps_its_connection_unread(nursery):
    server = Scripted(lambda n, head: b"HTTP/1.1 204 No Content\r\n\r\n")
    await server.serve(nursery)
    c = client()
    for _ in range(3):
        async with c.stream("GET", server.url("/")) as r:
            assert r.status_code == 204  # nothing iterated: the answer was whole with its head
    assert server.connections == 1
    await c.aclose()

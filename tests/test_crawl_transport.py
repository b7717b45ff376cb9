"""The crawler's HTTP/1.1 transport against a server on loopback that answers with the
bytes each test gives it: how bodies end, which connections are kept, which errors
come out (as httpx's, so the crawler sorts them as before)."""

from __future__ import annotations

import functools
import gzip
import ssl

import httpx
import pytest
import trio

from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.net.tls import make_certs
from local_host.crawler.fetch import ClientPool, FetchError, charset_of, client_factory, get_page
from local_host.crawler.transport import CrawlTransport

HTML = b"Content-Type: text/html\r\n"


class Server:
    """Each connection is answered, request by request, with the next of ``replies``
    (bytes, or a callable ``async (stream) -> bool``: False closes the connection);
    ``connections`` counts those accepted and keeps each one's peer address."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.peers: list[str] = []
        self.requests: list[bytes] = []
        self.port = 0

    @property
    def connections(self) -> int:
        return len(self.peers)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _serve(self, stream: trio.SocketStream) -> None:
        self.peers.append(getattr(stream, "transport_stream", stream).socket.getpeername()[0])
        async with stream:
            try:
                await self._answer(stream)
            except trio.BrokenResourceError:  # the client went away mid-answer
                pass

    async def _answer(self, stream: trio.SocketStream) -> None:
        buf = b""
        while self.replies:
            while b"\r\n\r\n" not in buf:
                data = await stream.receive_some(4096)
                if not data:
                    return
                buf += data
            request, buf = buf.split(b"\r\n\r\n", 1)
            self.requests.append(request)
            reply = self.replies.pop(0)
            if callable(reply):
                if not await reply(stream):
                    return
            else:
                await stream.send_all(reply)

    async def start(self, nursery: trio.Nursery) -> "Server":
        listeners = await nursery.start(functools.partial(trio.serve_tcp, self._serve, 0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]
        return self


def transport(**kw) -> CrawlTransport:
    return CrawlTransport(ssl_context=httpx.create_ssl_context(), max_connections=kw.pop("max_connections", 4),
                          keepalive_expiry=kw.pop("keepalive_expiry", 30.0), **kw)


async def get(client: httpx.AsyncClient, url: str) -> tuple[int, bytes]:
    r = await client.get(url)
    return r.status_code, r.content


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + HTML + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body


async def test_a_connection_is_kept_for_the_next_request_of_its_origin(nursery):
    server = await Server([ok(b"one"), ok(b"two"), b"HTTP/1.1 204 No Content\r\n\r\n", ok(b"four")]).start(nursery)
    async with httpx.AsyncClient(transport=transport()) as client:
        assert [await get(client, server.url(f"/{i}")) for i in range(4)] == [
            (200, b"one"), (200, b"two"), (204, b""), (200, b"four")]
    assert server.connections == 1
    assert server.requests[1].startswith(b"GET /1 HTTP/1.1\r\n") and b"\r\nhost: 127.0.0.1:" in server.requests[1].lower()


async def test_chunked_and_close_delimited_bodies(nursery):
    chunked = (b"HTTP/1.1 200 OK\r\n" + HTML + b"Transfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n")

    async def in_pieces(stream):  # a chunked body split across many reads
        for i in range(0, len(chunked), 3):
            await stream.send_all(chunked[i:i + 3])
            await trio.sleep(0)
        return True

    async def until_close(stream):
        await stream.send_all(b"HTTP/1.1 200 OK\r\n" + HTML + b"\r\nno length, ended by the close")
        return False

    server = await Server([chunked, in_pieces, until_close, ok(b"after")]).start(nursery)
    async with httpx.AsyncClient(transport=transport()) as client:
        assert await get(client, server.url()) == (200, b"hello, world")
        assert await get(client, server.url()) == (200, b"hello, world")
        assert await get(client, server.url()) == (200, b"no length, ended by the close")
        assert await get(client, server.url()) == (200, b"after")
    assert server.connections == 2  # the close-delimited body ended its connection


async def test_connections_the_server_will_not_keep_are_not_reused(nursery):
    server = await Server([ok(b"a", b"Connection: close\r\n"), b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nb",
                           b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nc",
                           ok(b"d")]).start(nursery)
    async with httpx.AsyncClient(transport=transport()) as client:
        assert [(await get(client, server.url()))[1] for _ in range(4)] == [b"a", b"b", b"c", b"d"]
    assert server.connections == 3  # after a: new; after b (1.0): new; after c (1.0 keep-alive): kept


async def test_informational_responses_are_skipped(nursery):
    async def apart(stream):
        await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
        await trio.sleep(0.05)
        await stream.send_all(ok(b"second"))
        return True

    server = await Server([b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n" + ok(b"first"), apart]).start(nursery)
    async with httpx.AsyncClient(transport=transport()) as client:
        r = await client.get(server.url())
        assert (r.status_code, r.content, "link" in r.headers) == (200, b"first", False)
        assert await get(client, server.url()) == (200, b"second")
    assert server.connections == 1


async def test_an_idle_connection_the_server_closed_is_not_used(nursery):
    async def answer_then_close(stream):
        await stream.send_all(ok(b"x"))
        return False  # closed right after a keep-alive answer, as servers do when idle

    server = await Server([answer_then_close, ok(b"y")]).start(nursery)
    async with httpx.AsyncClient(transport=transport()) as client:
        assert await get(client, server.url()) == (200, b"x")
        await trio.sleep(0.05)  # the close arrives
        assert await get(client, server.url()) == (200, b"y")
    assert server.connections == 2


async def test_bad_answers_are_protocol_errors_and_the_connection_is_dropped(nursery):
    async def half_a_body(stream):
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        return False

    async def nothing(stream):
        return False

    server = await Server([b"HTTP/1.1 2OO OK\r\n\r\n", half_a_body, nothing, ok(b"fine")]).start(nursery)
    async with httpx.AsyncClient(transport=transport()) as client:
        for _ in range(3):
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get(server.url())
        assert await get(client, server.url()) == (200, b"fine")
    assert server.connections == 4


async def test_errors_reach_the_crawler_as_it_sorts_them(nursery, autojump_clock):
    async def never(stream):
        await trio.sleep_forever()

    server = await Server([never, b"garbage\r\n\r\n"]).start(nursery)
    counters = Counters()
    async with httpx.AsyncClient(transport=transport(), timeout=5.0) as client:
        kinds = []
        for url in (server.url(), server.url(), "http://127.0.0.1:9/", "ftp://127.0.0.1/"):
            with pytest.raises(FetchError) as e:
                await get_page(client, url, lambda: None, counters, timeout=60, max_body=1000, any_body=False)
            kinds.append((e.value.kind, e.value.transient))
    assert kinds == [("timeout", True), ("network", True), ("connect", True), ("bad_url", False)]


async def test_a_body_left_unread_does_not_leave_its_connection_in_the_pool(nursery):
    big = ok(b"x" * 200_000)
    server = await Server([big, ok(b"next")]).start(nursery)
    async with httpx.AsyncClient(transport=transport()) as client:
        async with client.stream("GET", server.url()) as r:
            async for _ in r.aiter_raw():
                break  # stop reading early: the rest of the body is still on the wire
        assert await get(client, server.url()) == (200, b"next")
    assert server.connections == 2


async def test_a_cancelled_request_frees_its_slot_and_its_connection(nursery, autojump_clock):
    async def slow(stream):
        await trio.sleep(100)
        await stream.send_all(ok(b"late"))
        return True

    server = await Server([slow, ok(b"after")]).start(nursery)
    async with httpx.AsyncClient(transport=transport(max_connections=1)) as client:
        with trio.move_on_after(1):
            await client.get(server.url())
        with trio.fail_after(5):  # the one slot is free again
            assert await get(client, server.url()) == (200, b"after")
    assert server.connections == 2


async def test_at_most_max_connections_at_once(nursery):
    async def held(stream):
        await trio.sleep(0.2)
        await stream.send_all(ok(b"z"))
        return True

    server = await Server([held] * 4).start(nursery)
    async with httpx.AsyncClient(transport=transport(max_connections=2)) as client:
        async with trio.open_nursery() as n:
            for _ in range(4):
                n.start_soon(get, client, server.url())
    assert server.connections == 2


async def test_requests_go_out_from_the_local_address(nursery):
    server = await Server([ok(b"me")]).start(nursery)
    async with httpx.AsyncClient(transport=transport(local_address="127.0.0.7")) as client:
        assert await get(client, server.url()) == (200, b"me")
    assert server.peers == ["127.0.0.7"]


async def test_https_with_the_clients_context_and_kept_alive(nursery, tmp_path):
    made = make_certs(tmp_path, [1], center_ips={1: ["127.0.0.1"]})
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(*made.centers[1])
    server = Server([ok(b"secret"), ok(b"again")])

    async def serve_tls(stream):
        await server._serve(trio.SSLStream(stream, server_tls, server_side=True))

    listeners = await nursery.start(functools.partial(trio.serve_tcp, serve_tls, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    trusting = CrawlTransport(ssl_context=ssl.create_default_context(cafile=str(made.ca)), max_connections=2,
                              keepalive_expiry=30.0)
    async with httpx.AsyncClient(transport=trusting) as client:
        assert await get(client, f"https://127.0.0.1:{port}/") == (200, b"secret")
        assert await get(client, f"https://127.0.0.1:{port}/") == (200, b"again")
    assert server.connections == 1
    async with httpx.AsyncClient(transport=transport()) as client:  # the system's CAs: not trusted
        with pytest.raises(httpx.ConnectError):
            await client.get(f"https://127.0.0.1:{port}/")


async def test_a_body_that_stops_coming_is_a_read_timeout(nursery, autojump_clock):
    async def stalls(stream):
        await stream.send_all(b"HTTP/1.1 200 OK\r\n" + HTML + b"Content-Length: 100\r\n\r\nthe first part")
        await trio.sleep_forever()

    server = await Server([stalls, ok(b"fine")]).start(nursery)
    async with httpx.AsyncClient(transport=transport(), timeout=5.0) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(server.url())
        assert trio.current_time() < 10  # the read timeout, not a wait for ever
        assert await get(client, server.url()) == (200, b"fine")


async def test_a_compressed_body_is_decoded_by_httpx(nursery):
    packed = gzip.compress(b"<a href=/x>x</a>" * 100)
    server = await Server([ok(packed, b"Content-Encoding: gzip\r\n")]).start(nursery)
    async with httpx.AsyncClient(transport=transport()) as client:
        assert await get(client, server.url()) == (200, b"<a href=/x>x</a>" * 100)
    assert b"accept-encoding: gzip" in server.requests[0].lower()


async def test_a_sites_client_keeps_the_cookies_the_site_sets(nursery):
    """The crawler's clients read a response's cookies only when it sets one; those it
    sets still go back with the later requests."""
    server = await Server([ok(b"a"), ok(b"b", b"Set-Cookie: s=1; Path=/\r\n"), ok(b"c"), ok(b"d")]).start(nursery)
    make = client_factory(4, user_agent="test", timeout=5.0, local_address=None, trust_env=False)
    async with make() as client:
        for i in range(4):
            await get(client, server.url(f"/{i}"))
    assert [b"\r\ncookie: s=1" in r.lower() for r in server.requests] == [False, False, True, True]


@pytest.mark.parametrize("content_type", [
    "text/html; charset=utf-8", 'text/html; charset="ISO-8859-1"', "text/html;charset=UTF-8", "text/html",
    "text/html; foo=bar; charset=koi8-r", "TEXT/HTML; CHARSET=utf-8", "text/html; charset = utf-8",
    "text/html; charset=utf-8; foo=bar", "text/html; charset='latin1'", "text/html;; charset=windows-1252",
    'text/html; charset="utf-8"extra', "text/html; CharSet=Shift_JIS", "text/html; charset=utf-8;", "text/html; charset="])
def test_a_pages_charset_is_read_as_httpx_reads_it(content_type):
    want = httpx.Response(200, headers={"content-type": content_type}).charset_encoding
    assert charset_of(content_type.partition(";")[2]) == want


async def test_the_client_pool_shares_clients_within_their_bound_and_closes_the_least_recent(autojump_clock):
    made: list[httpx.AsyncClient] = []

    def make() -> httpx.AsyncClient:
        made.append(httpx.AsyncClient(transport=transport()))
        return made[-1]

    pool = ClientPool(make, per_client=2, max_clients=2)
    async with pool.client("a") as a1, pool.client("a") as a2:
        assert a1 is a2  # room for two requests on one client
        async with pool.client("a") as a3:
            assert a3 is not a1 and len(pool) == 2
    await trio.sleep(1)
    async with pool.client("b") as b1:  # a third client: the least recent site's unused one goes
        assert len(pool) == 2 and b1 is made[2] and made[0].is_closed and not made[1].is_closed
        await trio.sleep(10)
        assert await pool.close_idle(5) == 1  # a's other client; b's is in use
        assert len(pool) == 1 and not b1.is_closed
    await pool.aclose()
    assert all(c.is_closed for c in made)

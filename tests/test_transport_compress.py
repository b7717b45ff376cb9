"""Compression negotiated at Register, and the heartbeat lane: real TCP on loopback, no mocks.

A peer that offers nothing (here: a raw socket speaking the pre-compression protocol,
or a client with ``compress=False``) must never see a Welcome or a compressed body;
two current peers compress both ways. Heartbeats sent with ``send_urgent`` overtake
queued data without ever splitting a message.
"""

from __future__ import annotations

import dataclasses
import socket
import zlib

import pytest
import trio
import trio.testing
import zstandard

from dedupnet.codec import wire
from dedupnet.codec.messages import COMPRESSIONS, Frame, Heartbeat, Register, Status, Task, Welcome
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.net.transport import Connection, ConnectionClosed, connect
from dedupnet.adapters.net.transport.forms import _recode
from dedupnet.codec.wire import FLAG_ZSTD, Decoder, encode, is_compressed

from .helpers import echo, reg, start_server

SERVER = "127.0.0.1"
CLIENT_IP = "127.0.0.5"
OLD_IP = "127.0.0.6"

BIG_FRAME = Frame({f"http://site{i % 13}.example/docs/{i}/index.html": 0 for i in range(400)}, CLIENT_IP, 77, 1)
BIG_FRAME_BYTES = len(encode(BIG_FRAME))


class RawPeer:
    """A client of the protocol as it was before compression: a socket and a Decoder that
    rejects compressed bodies (a flags byte it does not know would be bad-header)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = Decoder(allow_compressed=False)
        self.received: list = []
        self.raw = bytearray()

    @classmethod
    async def open(cls, port: int, register: Register, ip: str = OLD_IP) -> RawPeer:
        stream = await trio.open_tcp_stream(SERVER, port, local_address=ip)
        await stream.send_all(encode(register))
        return cls(stream)

    async def read_until(self, count: int) -> list:
        while len(self.received) < count:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                break
            self.raw += chunk
            self.decoder.feed(chunk)
            self.received.extend(self.decoder)
        return self.received


# --- negotiation ------------------------------------------------------------------------------


async def test_default_offer_makes_each_direction_one_deflate_stream():
    """Two current peers: ``deflate-stream``. What the client sends before it has read the
    Welcome goes plain; then it says so (its own Welcome) and both directions are one
    deflate stream, every message (headers, heartbeats, acks) compressed against the
    ones before it: the same frame a second time costs a few bytes."""
    server_counters, client_counters = Counters(), Counters()
    seen: list[Connection] = []

    async def handler(conn: Connection) -> None:
        seen.append(conn)
        await echo(conn)

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, server_counters)
        with trio.fail_after(10):
            async with await connect(SERVER, port, reg(CLIENT_IP), local_ip=CLIENT_IP,
                                     counters=client_counters) as conn:
                assert conn.register.compress == COMPRESSIONS and conn.compression is None
                await conn.send(encode(Status(True)))  # plain: the Welcome is not read yet
                assert await conn.receive() == Status(True)  # the Welcome came first, consumed
                assert conn.compression == "deflate-stream"
                before = client_counters.get("sent_bytes")
                await conn.send(encode(BIG_FRAME))
                assert await conn.receive() == BIG_FRAME
                first = client_counters.get("sent_bytes") - before
                await conn.send(encode(BIG_FRAME, compress=True))  # zstd bodies go plain into the stream
                assert await conn.receive() == BIG_FRAME
                second = client_counters.get("sent_bytes") - before - first
                for i in range(20):
                    beat = Heartbeat(CLIENT_IP, 1700000000.0 + i)
                    await conn.send(encode(beat))
                    assert await conn.receive() == beat
        nursery.cancel_scope.cancel()
    [server_conn] = seen
    assert server_conn.compression == "deflate-stream"
    assert first < BIG_FRAME_BYTES / 3 and second < first / 4  # a repeat is a few bytes per 258 (deflate's longest match)
    beats = client_counters.get("sent_kind_bytes", kind="heartbeat")
    assert beats < 20 * len(encode(Heartbeat(CLIENT_IP, 1700000000.0))) / 3
    assert client_counters.get("frames_sent", kind="welcome") == 1  # the switch
    assert server_counters.get("frames_received", kind="welcome") == 1
    for counters in (server_counters, client_counters):
        assert not counters.total("bad_input") and not counters.get("compressed_sent")
        assert counters.total("sent_kind_bytes") == counters.get("sent_bytes")
    assert client_counters.get("sent_bytes") == server_counters.get("received_bytes")


async def test_a_client_with_nothing_to_say_after_the_welcome_writes_nothing():
    """The client's switch goes with its first message after the Welcome, never alone: a
    server that sends and closes sees no bytes come back into a closed socket."""
    async def handler(conn):
        for n in range(3):
            assert conn.send_nowait(encode(Task(n, ())))

    counters = Counters()
    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, Counters())
        with trio.fail_after(10):
            async with await connect(SERVER, port, reg(CLIENT_IP), local_ip=CLIENT_IP, counters=counters) as conn:
                assert [await conn.receive() for _ in range(3)] == [Task(0, ()), Task(1, ()), Task(2, ())]
                with pytest.raises(ConnectionClosed):
                    await conn.receive()
                assert conn.compression == "deflate-stream" and conn.close_reason == "eof"
        nursery.cancel_scope.cancel()
    assert not counters.get("frames_sent", kind="welcome")


async def test_zstd_bodies_when_that_is_what_is_offered():
    server_counters, client_counters = Counters(), Counters()
    seen: list[Connection] = []

    async def handler(conn: Connection) -> None:
        seen.append(conn)
        await echo(conn)

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, server_counters)
        with trio.fail_after(10):
            async with await connect(SERVER, port, reg(CLIENT_IP, compress=("zstd",)), local_ip=CLIENT_IP,
                                     counters=client_counters) as conn:
                assert conn.register.compress == ("zstd",) and conn.compression is None
                await conn.send(encode(Status(True)))  # plain: the Welcome is not read yet
                assert await conn.receive() == Status(True)  # the Welcome came first, consumed
                assert conn.compression == "zstd"
                for _ in range(2):
                    await conn.send(encode(BIG_FRAME))
                    assert await conn.receive() == BIG_FRAME
                await conn.send(encode(BIG_FRAME, compress=True))  # already compressed: as is
                assert await conn.receive() == BIG_FRAME
        nursery.cancel_scope.cancel()
    [server_conn] = seen
    assert server_conn.compression == "zstd" and server_conn.register.compress == ("zstd",)
    for counters in (server_counters, client_counters):
        assert counters.get("compressed_sent") == 3 and counters.get("compressed_received") == 3
        assert not counters.get("bad_input", reason="bad-header")
    assert server_counters.get("frames_sent", kind="welcome") == 1
    assert client_counters.get("frames_received", kind="welcome") == 1
    # Three big frames each way took far less than three plain frames.
    assert client_counters.get("sent_bytes") < BIG_FRAME_BYTES


async def test_old_peer_that_does_not_offer_gets_plain_bytes_and_no_welcome():
    counters = Counters()
    ready = trio.Event()
    conns: list[Connection] = []

    async def handler(conn: Connection) -> None:
        conns.append(conn)
        assert conn.compression is None
        data = encode(BIG_FRAME, compress=True)  # a broadcast encoded compressed once
        assert is_compressed(data)
        conn.send_nowait(data)
        conn.send_nowait(encode(BIG_FRAME))
        ready.set()
        await echo(conn)

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, counters)
        with trio.fail_after(10):
            old = await RawPeer.open(port, reg(OLD_IP))
            async with old.stream:
                await ready.wait()
                assert await old.read_until(2) == [BIG_FRAME, BIG_FRAME]
                assert old.raw[wire.FLAGS_OFFSET] == 0 and len(old.raw) == 2 * BIG_FRAME_BYTES
                await old.stream.send_all(encode(BIG_FRAME))  # and it sends plain
                assert (await old.read_until(3))[2] == BIG_FRAME
        nursery.cancel_scope.cancel()
    assert not counters.get("compressed_sent") and not counters.get("frames_sent", kind="welcome")
    assert not counters.get("bad_input", reason="bad-header")


async def test_client_with_compress_off_offers_nothing():
    counters = Counters()
    seen: list[Connection] = []

    async def handler(conn: Connection) -> None:
        seen.append(conn)
        await echo(conn)

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, counters)
        with trio.fail_after(10):
            async with await connect(SERVER, port, reg(CLIENT_IP, compress=("zstd",)), local_ip=CLIENT_IP,
                                     counters=Counters(), compress=False) as conn:
                assert conn.register.compress is None
                await conn.send(encode(BIG_FRAME, compress=True))
                assert await conn.receive() == BIG_FRAME
        nursery.cancel_scope.cancel()
    assert seen[0].register.compress is None and seen[0].compression is None
    assert not counters.get("compressed_sent") and not counters.get("compressed_received")
    assert not counters.get("frames_sent", kind="welcome")


async def test_server_with_compress_off_declines_the_offer():
    server_counters, client_counters = Counters(), Counters()

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, echo, server_counters, compress=False)
        with trio.fail_after(10):
            async with await connect(SERVER, port, reg(CLIENT_IP), local_ip=CLIENT_IP,
                                     counters=client_counters) as conn:
                await conn.send(encode(Status(True)))
                assert await conn.receive() == Status(True)
                assert conn.compression is None  # Welcome(()) read and consumed
                await conn.send(encode(BIG_FRAME))
                assert await conn.receive() == BIG_FRAME
        nursery.cancel_scope.cancel()
    assert client_counters.get("frames_received", kind="welcome") == 1
    assert not server_counters.get("compressed_sent") and not client_counters.get("compressed_sent")


async def test_server_that_never_welcomes_gets_plain_bytes():
    """A server that does not answer the offer (no Welcome): the client never compresses.
    (A server that predates compression rejects the offer instead: see PROTOCOL.md §5.)"""
    received: list = []
    done = trio.Event()

    async def old_server(stream: trio.SocketStream) -> None:
        decoder = Decoder(allow_compressed=False)  # what an old decoder accepts
        while len(received) < 3:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            decoder.feed(chunk)
            received.extend(decoder)
        done.set()
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        [listener] = await trio.open_tcp_listeners(0, host=SERVER)
        nursery.start_soon(trio.serve_listeners, old_server, [listener])
        with trio.fail_after(10):
            async with await connect(SERVER, listener.socket.getsockname()[1], reg(CLIENT_IP),
                                     local_ip=CLIENT_IP, counters=Counters()) as conn:
                conn.send_nowait(encode(BIG_FRAME))
                conn.send_nowait(encode(BIG_FRAME, compress=True))
                await done.wait()
        nursery.cancel_scope.cancel()
    assert received[1:] == [BIG_FRAME, BIG_FRAME]


async def test_broadcast_converts_once_per_form():
    plain, small = encode(BIG_FRAME), encode(BIG_FRAME, compress=True)
    assert _recode(plain, True) is _recode(plain, True) == small
    assert _recode(small, False) is _recode(small, False) == plain
    assert _recode(small, True) is small and _recode(plain, False) is plain
    beat = encode(Heartbeat(SERVER, 1.0))
    assert _recode(beat, True) is beat


# --- hostile compressed input -----------------------------------------------------------------


STREAM = ("deflate-stream",)
SWITCH = encode(Welcome(STREAM))


def _deflated(data: bytes, flush: int = zlib.Z_PARTIAL_FLUSH) -> bytes:
    z = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return z.compress(data) + z.flush(flush)


async def _bad_client(port: int, register: Register, payload: bytes) -> list:
    """Register (reading the Welcome if offered), send ``payload``; everything received."""
    peer = await RawPeer.open(port, register)
    peer.decoder.allow_compressed = True
    async with peer.stream:
        if register.compress:
            [welcome] = await peer.read_until(1)
            assert welcome == Welcome(register.compress[:1])
            if welcome.compress == ("deflate-stream",):
                peer.decoder.start_inflate()  # the server's side is one deflate stream now
        await peer.stream.send_all(payload)
        while chunk := await peer.stream.receive_some(65536):
            peer.decoder.feed(chunk)
            peer.received.extend(peer.decoder)
    return peer.received


@pytest.mark.parametrize(
    ("offer", "payload", "reason"),
    [
        (None, encode(BIG_FRAME, compress=True), "bad-header"),  # compressed without negotiating
        (("zstd",), wire.pack(1, b"\x28\xb5\x2f\xfd garbage", flags=FLAG_ZSTD), "bad-compression"),
        (("zstd",), wire.pack(1, zstandard.ZstdCompressor().compress(b"{" + b" " * 5_000_000 + b"}"),
                              flags=FLAG_ZSTD), "too-large"),
        (("zstd",), encode(Welcome(("zstd",))), "unexpected-welcome"),
        (("zstd",), wire.header(1, 0)[:9] + b"\x80" + bytes(6), "bad-header"),  # unknown flag bit
        (STREAM, SWITCH + b"\xff garbage, not deflate", "bad-compression"),
        (STREAM, SWITCH + _deflated(encode(BIG_FRAME), zlib.Z_FINISH), "bad-compression"),  # a final block
        (STREAM, SWITCH + _deflated(wire.header(1, 5_000_000) + b"{" + b" " * 5_000_000), "too-large"),
        (STREAM, SWITCH + _deflated(encode(Welcome(("deflate-stream",)))), "unexpected-welcome"),
        (STREAM, encode(BIG_FRAME, compress=True), "bad-header"),  # zstd bodies were not chosen
    ],
    ids=["not-negotiated", "corrupt", "zip-bomb", "welcome-to-server", "unknown-flag", "deflate-garbage",
         "deflate-ends", "deflate-bomb", "switch-twice", "zstd-in-stream"],
)
async def test_bad_compressed_input_is_counted_and_closes_only_that_connection(offer, payload, reason):
    counters = Counters()
    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, echo, counters, max_frame_size=1024 * 1024)
        with trio.fail_after(10):
            got = await _bad_client(port, reg(OLD_IP, compress=offer), payload)
            assert got[-1].reason == reason  # told why, then closed
            async with await connect(SERVER, port, reg(CLIENT_IP), local_ip=CLIENT_IP,
                                     counters=Counters()) as good:  # everyone else is served
                await good.send(encode(BIG_FRAME))
                assert await good.receive() == BIG_FRAME
        nursery.cancel_scope.cancel()
    assert counters.get("bad_input", reason=reason) == 1


async def test_welcome_naming_what_was_not_offered_is_rejected():
    async def server(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(encode(Welcome(("lz4",))))
        await trio.sleep_forever()

    counters = Counters()
    async with trio.open_nursery() as nursery:
        [listener] = await trio.open_tcp_listeners(0, host=SERVER)
        nursery.start_soon(trio.serve_listeners, server, [listener])
        with trio.fail_after(10):
            async with await connect(SERVER, listener.socket.getsockname()[1], reg(CLIENT_IP),
                                     local_ip=CLIENT_IP, counters=counters) as conn:
                with pytest.raises(ConnectionClosed):
                    await conn.receive()
        nursery.cancel_scope.cancel()
    assert counters.get("bad_input", reason="unexpected-welcome") == 1 and conn.compression is None


# --- the heartbeat lane -----------------------------------------------------------------------

DATA = [encode(Task(i, tuple(f"http://site.test/{i}/{j:05d}" for j in range(2000)))) for i in range(60)]  # ~60 KB


async def test_heartbeat_overtakes_queued_data_to_a_slow_reader():
    """A full queue to a peer that is not reading: the heartbeat sent with send_urgent goes
    out right after the message being written, before everything still queued, and only
    the newest of two heartbeats goes out. Every message arrives whole and in order."""
    counters = Counters()
    state: dict = {}
    queued_up = trio.Event()
    finished = trio.Event()

    async def handler(conn: Connection) -> None:
        conn.stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
        for data in DATA:
            assert conn.send_nowait(data)
        await trio.testing.wait_all_tasks_blocked()  # the writer is stuck in send_all
        state["queued"] = conn._send_ch.statistics().current_buffer_used
        assert conn.send_urgent(encode(Heartbeat(SERVER, 1.0)))
        assert conn.send_urgent(encode(Heartbeat(SERVER, 2.0)))  # replaces the first
        queued_up.set()
        await finished.wait()

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, counters, max_queue=len(DATA))
        with trio.fail_after(30):
            peer = await RawPeer.open(port, reg(OLD_IP))
            peer.stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
            async with peer.stream:
                await queued_up.wait()
                got = await peer.read_until(len(DATA) + 1)
                finished.set()
        nursery.cancel_scope.cancel()

    queued = state["queued"]
    assert 0 < queued < len(DATA) - 1, "the queue must hold data behind the message being written"
    beats = [i for i, m in enumerate(got) if isinstance(m, Heartbeat)]
    assert beats == [len(DATA) - queued]  # right after the message in flight
    assert got[beats[0]] == Heartbeat(SERVER, 2.0)
    assert [m.number for m in got if isinstance(m, Task)] == list(range(len(DATA)))
    assert counters.get("urgent_replaced") == 1


async def test_urgent_message_wakes_an_idle_writer_and_goes_first():
    counters = Counters()
    got: list = []

    async def handler(conn: Connection) -> None:
        await trio.testing.wait_all_tasks_blocked()  # the writer waits on an empty queue
        assert conn.send_urgent(encode(Heartbeat(SERVER, 1.0)))
        await trio.testing.wait_all_tasks_blocked()
        conn.send_nowait(encode(Task(1, ("http://a.test/",))))
        assert conn.send_urgent(encode(Heartbeat(SERVER, 2.0)))  # queued after, sent before
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, counters)
        with trio.fail_after(10):
            async with await connect(SERVER, port, reg(CLIENT_IP), local_ip=CLIENT_IP,
                                     counters=Counters()) as conn:
                for _ in range(3):
                    got.append(await conn.receive())
                conn.send_urgent(encode(Heartbeat(CLIENT_IP, 3.0)))
        nursery.cancel_scope.cancel()
    assert got == [Heartbeat(SERVER, 1.0), Heartbeat(SERVER, 2.0), Task(1, ("http://a.test/",))]
    assert not conn.send_urgent(encode(Heartbeat(CLIENT_IP, 4.0)))  # closed


def test_compressed_header_flag_position():
    assert encode(BIG_FRAME, compress=True)[wire.FLAGS_OFFSET] == FLAG_ZSTD
    assert dataclasses.replace(reg(CLIENT_IP), compress=("zstd",)).to_json()["compress"] == ["zstd"]

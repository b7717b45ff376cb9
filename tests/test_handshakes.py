"""docs/PROTOCOL.md §4.1 and §6.1 over real TCP: what each side sends, in order, when a
host, a peer center or a control client connects to a real center (and a real center
dials a peer); the refusals at register time; closing on bad input. Raw sockets read
every message as it arrives (the transport's client would consume the welcome)."""

from __future__ import annotations

import time

import pytest
import trio

from center_host.daemon import CenterDaemon, CenterSettings, PeerAddress
from dedupnet.adapters.storage.store import Store
from dedupnet.codec import wire
from dedupnet.codec.messages import COMPRESSIONS, Error, Frame, Heartbeat, Register, Status, Welcome

CENTER, LAN = "127.0.6.1", "127.0.6.0/24"
PEER, PEER_LAN = "127.0.5.1", "127.0.5.0/24"
HOST = "127.0.6.10"
BEAT = 0.1


class Raw:
    """One raw connection: what it sends is bytes, what it gets is every message."""

    def __init__(self, stream: trio.SocketStream):
        self.stream = stream
        self.decoder = wire.Decoder(4 * 1024 * 1024, 10_000, allow_compressed=True)
        self.eof = False

    @classmethod
    async def open(cls, port: int, source: str, to: str = CENTER) -> "Raw":
        return cls(await trio.open_tcp_stream(to, port, local_address=source))

    async def send(self, *messages) -> None:
        await self.stream.send_all(b"".join(m if isinstance(m, bytes) else wire.encode(m) for m in messages))

    async def read(self, seconds: float, until=None) -> list:
        """Messages within ``seconds`` (or until ``until(messages)``, or the peer closes)."""
        got: list = []
        with trio.move_on_after(seconds):
            while not self.eof and not (until and until(got)):
                data = await self.stream.receive_some(1 << 16)
                if not data:
                    self.eof = True
                    break
                self.decoder.feed(data)
                got += list(self.decoder)
        got += list(self.decoder)
        return got


@pytest.fixture
async def center(redis_url, prefix, nursery):
    store = Store(redis_url, prefix)
    daemon = CenterDaemon(CenterSettings(6, CENTER, 0, LAN, [PeerAddress(5, PEER, 0, PEER_LAN)],
                                         heartbeat_interval=BEAT, heartbeat_timeout=50 * BEAT), store)
    await nursery.start(daemon.run)
    yield daemon
    store.delete_prefix()
    store.close()


async def test_a_host_gets_the_welcome_first_and_no_success_reply(center):
    raw = await Raw.open(center.port, HOST)
    await raw.send(Register(HOST, 6, "host", f"{HOST}:1", LAN, ("zstd",)))
    got = await raw.read(6 * BEAT)
    assert got[0] == Welcome(("zstd",))
    assert got[1:] and all(isinstance(m, Heartbeat) for m in got[1:]), got  # nothing else: no reply
    assert HOST in center.core.members.hosts  # a member all the same
    assert abs(got[1].time - time.time()) < 60  # Unix time (§4), not a monotonic clock


async def test_a_host_that_offers_nothing_gets_no_welcome(center):
    raw = await Raw.open(center.port, HOST)
    await raw.send(Register(HOST, 6, "host", f"{HOST}:1"))
    got = await raw.read(6 * BEAT, until=lambda g: len(g) >= 2)
    assert got and all(isinstance(m, Heartbeat) for m in got), got


async def test_a_peer_gets_the_welcome_then_the_centers_own_register(center):
    homes = center.register().homes
    raw = await Raw.open(center.port, PEER)
    await raw.send(Register(PEER, 5, "center", f"{PEER}:1", PEER_LAN, ("zstd",), homes))
    got = await raw.read(6 * BEAT, until=lambda g: len(g) >= 2)
    assert got[0] == Welcome(("zstd",))
    reg = got[1]
    assert isinstance(reg, Register) and (reg.role, reg.network, reg.IP, reg.CIDR, reg.compress, reg.homes) == (
        "center", 6, CENTER, LAN, None, homes)
    assert reg.listen == f"{CENTER}:{center.port}"


async def test_a_control_client_is_answered_and_sent_nothing_else(center):
    raw = await Raw.open(center.port, HOST)
    await raw.send(Register(HOST, 0, "control", f"{HOST}:1"), Status(True))
    got = await raw.read(6 * BEAT)
    assert len(got) == 1 and isinstance(got[0], Status) and not got[0].request, got  # no heartbeats either
    assert got[0].body["role"] == "center" and got[0].body["network"] == 6
    assert HOST not in center.core.members.hosts


@pytest.mark.parametrize("case", ["not-register", "source-mismatch", "host-not-in-lan", "unknown-peer", "map-mismatch",
                                  "bad-magic", "bad-flag"])
async def test_a_refusal_is_an_error_then_the_close(center, case):
    source, first = HOST, Register(HOST, 6, "host", f"{HOST}:1")
    then = b""
    if case == "not-register":
        first = Heartbeat(HOST, time.time())
    elif case == "source-mismatch":
        first = Register("127.0.6.11", 6, "host", "127.0.6.11:1")
    elif case == "host-not-in-lan":
        source = "127.0.7.10"
        first = Register(source, 6, "host", f"{source}:1")
    elif case == "unknown-peer":
        source = "127.0.9.1"
        first = Register(source, 9, "center", f"{source}:1")
    elif case == "map-mismatch":
        source = PEER
        first = Register(PEER, 5, "center", f"{PEER}:1", PEER_LAN, None, None)  # broadcasts; the center routes
    elif case == "bad-magic":
        first = b"GET / HTTP/1.0\r\n\r\n"
    elif case == "bad-flag":  # after a good register: the body of a frame with flag 4
        body = b'{"URL_set":{},"IP":"127.0.6.10","number":1,"flag":4}'
        then = b"DN\x01\x01" + len(body).to_bytes(4, "big") + bytes(8) + body
    raw = await Raw.open(center.port, source)
    await raw.send(first, *([then] if then else []))
    got = await raw.read(5.0, until=lambda g: any(isinstance(m, Error) for m in g))
    errors = [m for m in got if isinstance(m, Error)]
    assert [e.reason for e in errors] == [case], got
    assert all(isinstance(m, (Heartbeat, Error)) for m in got), got  # nothing else was sent first
    await raw.read(2.0)
    assert raw.eof  # and the connection is closed
    counters = center.counters
    assert (counters.get("handshake_failed", reason=case) + counters.get("rejected", reason=case)
            + counters.get("bad_input", reason=case)) == 1
    # The center goes on serving.
    other = await Raw.open(center.port, "127.0.6.12")
    await other.send(Register("127.0.6.12", 6, "host", "127.0.6.12:1"),
                     Frame({"http://a.example/": 0}, "127.0.6.12", (1 << 32) | (6 << 16) | 12, 1))
    assert any(getattr(m, "status", None) == "stored" for m in await other.read(5.0, until=lambda g: any(
        getattr(m, "status", None) for m in g)))


async def test_the_dialing_center_registers_and_wants_the_peers_register_first(redis_url, prefix, nursery):
    """Center 5 dials center 6 (the lower id dials): its register, then it takes only a
    center's register as the answer (after the welcome)."""
    registers: list[Register] = []
    answers = iter(["heartbeat", "register"])  # first session: a wrong answer; second: the right one
    closed = trio.Event()

    async def peer(stream):
        raw = Raw(stream)
        got = await raw.read(5.0, until=lambda g: len(g) >= 1)
        registers.append(got[0])
        answer = next(answers)
        reply = (Heartbeat(CENTER, time.time()) if answer == "heartbeat"
                 else Register(CENTER, 6, "center", f"{CENTER}:1", LAN, None, got[0].homes))
        await raw.send(Welcome(("zstd",)), reply)
        await raw.read(30.0)
        if answer == "heartbeat":
            closed.set()  # the dialing center closed it

    from functools import partial
    listeners = await nursery.start(partial(trio.serve_tcp, peer, 0, host=CENTER))
    port = listeners[0].socket.getsockname()[1]
    store = Store(redis_url, prefix)
    try:
        dialer = CenterDaemon(CenterSettings(5, PEER, 0, PEER_LAN, [PeerAddress(6, CENTER, port, LAN)],
                                             heartbeat_interval=BEAT, heartbeat_timeout=10 * BEAT), store)
        await nursery.start(dialer.run)
        with trio.fail_after(10):
            await closed.wait()
            while 6 not in dialer.core.members.peers:
                await trio.sleep(0.01)
        first = registers[0]
        assert (first.role, first.network, first.IP, first.CIDR, first.compress) == ("center", 5, PEER, PEER_LAN,
                                                                                     COMPRESSIONS)
        assert first.homes == dialer.register().homes
    finally:
        store.delete_prefix()
        store.close()

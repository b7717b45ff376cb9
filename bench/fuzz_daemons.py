"""Fuzz live daemons over TCP: hostile frames through a running center and a running host.

bench/fuzz_wire.py drives the decoder alone. This drives the whole receiving path of
the two daemons — transport, handshake, decoder, reactor, sans-I/O core, Redis — with
real TCP connections that register first, so that what they send reaches the cores:

* **a center** (``CenterDaemon``, network 2, one configured peer network 1) is sent
  frames by fuzzing LAN hosts (each on its own loopback address, as the center checks
  the source address), by a fuzzing peer center of network 1, by control clients, and
  by clients that never register properly;
* **a host** (``LocalDaemon`` of network 3) connects to a fuzzing center that sends it
  nothing but hostile messages; its status port is fuzzed by control clients.

Most messages are *valid-shaped with hostile contents*, since those pass the decoder
and reach the protocol: URLs that are not normalised, not http(s), too long for a pool
(up to the wire's 8,192), numbers spoofed into another host's or network's range or
echoed from what the daemon sent (answers for sets never asked about, acks for tasks
never given), IPs of other hosts and networks, flags sent where they do not belong,
kinds out of place (tasks, acks, registers, statuses and welcomes where none is
due), compressed bodies, whole connections compressed (``deflate-stream``, with raw
garbage inside the stream now and then), sets of up to 10,000 URLs. The rest are bench/fuzz_wire.py's
mutated inputs, which end the connection they arrive on.

Meanwhile a well-behaved host of the center's LAN stays connected. After the storm a
well-behaved peer answers every set of the center's that waits for network 1, the
well-behaved host pushes new URLs, and each must reach its ``task_pool`` or, if its
site's home is network 1, be routed there (docs/PROTOCOL.md, homes); the fuzzed
host must take a task and send a set for new URLs to a now well-behaved center. The
daemons run in this process's trio nursery: one exception out of either ends the run.

Run: ``.venv/bin/python bench/fuzz_daemons.py --frames 10000000`` (needs no Redis: an
embedded one is started). It reports frames per second, what each daemon counted, and
exits 1 if a daemon failed, counted an internal error, or lost the well-behaved URLs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import trio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fuzz_wire  # noqa: E402

from center_host.daemon import CenterDaemon, CenterSettings, PeerAddress  # noqa: E402
from center_host.sets import task_parts  # noqa: E402
from dedupnet.adapters.monitor.metrics import Counters  # noqa: E402
from dedupnet.adapters.storage.store import Store  # noqa: E402
from dedupnet.codec import wire  # noqa: E402
from dedupnet.codec.errors import ProtocolError  # noqa: E402
from dedupnet.codec.messages import Ack, Error, Frame, Heartbeat, Register, Status, Task, Welcome  # noqa: E402
from dedupnet.codec.numbers import make_number  # noqa: E402
from dedupnet.codec.urls import fingerprint_many  # noqa: E402
from local_host.daemon import LocalDaemon, LocalSettings  # noqa: E402
from local_host.pools import TASK_FP  # noqa: E402

CENTER_NET, PEER_NET, HOST_NET = 2, 1, 3
CENTER_IP, GOOD_HOST_IP = "127.0.2.1", "127.0.2.10"
PEER_IP = "127.0.1.1"
FAKE_CENTER_IP, FUZZED_HOST_IP = "127.0.3.1", "127.0.3.10"
FUZZ_HOSTS = [f"127.0.2.{i}" for i in range(100, 200)]

HOSTILE_URLS = [
    "javascript:alert(1)", "HTTP://Norm.Example:80/a/./b#f", "http://x.test/" + "a" * 5000, "mailto:a@b.test",
    "ftp://x.test/", "http:///x", "http://[::1%25eth0]/", "http://[zz]/", "http://a b.test/", "http://x.test:99999/",
    "http://\x00.test/", "http://bücher.test/", "http://xn--/", "http://" + "a" * 300 + ".test/", " http://x.test/ ",
    "http://x.test/%zz", "http://@x.test/", "https://x.test:443", "http://x.test/" + "é" * 3000, "http://x.test/?",
    "http://1.2.3.4.5/", "http://[::ffff:1.2.3.4]/", "http://x..test/", "http://-x.test/", "http://x.test/\t/",
    "http://x.test/" + "%41" * 2700, "//x.test/", "x", "http://", "https://[::1]:0/", "http://x.test:/",
    "http://X.TEST/A/../../b", "http://x.test/\u202e", "http://[v1.x]/", "data:text/html,hi", "http://x.test/" * 500,
    "http://x.test/\ufffd", "http://x.test/a#" + "f" * 8000, "http://x.test/" + "z" * 8178,
]


def good_urls(tag: str, n: int) -> list[str]:
    """Normalised URLs no fuzzer ever sends (their host names are the run's own)."""
    return [f"http://good-{tag}-{i % 13}.example/p/{i}" for i in range(n)]


@dataclass
class Figures:
    sent: Counter = field(default_factory=Counter)
    connections: Counter = field(default_factory=Counter)
    received: Counter = field(default_factory=Counter)
    elapsed: float = 0.0

    @property
    def frames(self) -> int:
        return sum(self.sent.values())


class Hostile:
    """Seeded maker of hostile messages: valid-shaped ones with hostile contents, and
    bench/fuzz_wire.py's mutated inputs."""

    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd
        self.corpus = fuzz_wire.corpus(rnd)
        self.seen: list[int] = []  # numbers the daemons sent us: echoed back in the wrong places
        self.seq = 0

    def remember(self, number: int) -> None:
        if len(self.seen) < 4096:
            self.seen.append(number)
        else:
            self.seen[self.rnd.randrange(4096)] = number

    def url(self) -> str:
        r = self.rnd.random()
        if r < 0.35:
            return self.rnd.choice(HOSTILE_URLS)
        if r < 0.45:  # a hostile one with a random twist
            u = self.rnd.choice(HOSTILE_URLS)
            i = self.rnd.randrange(len(u) + 1)
            return (u[:i] + self.rnd.choice(("%", "#", "?", "/..", "\x7f", ":", "@", "[", "é", "\u3000")) + u[i:])[:8192]
        return f"http://f{self.rnd.randrange(500)}.test/{self.rnd.randrange(10**6)}"

    def urls(self, big: bool = False) -> list[str]:
        n = self.rnd.choice((0, 1, 1, 2, 3, 5, 8, 20)) if not big else self.rnd.choice((1000, 10_000))
        out = list(dict.fromkeys(self.url() for _ in range(n)))
        return out[:10_000]

    def number(self, own: tuple[int, int] | None = None) -> int:
        r = self.rnd.random()
        if r < 0.25 and self.seen:
            return self.rnd.choice(self.seen)
        if r < 0.45:  # the well-behaved host's own first numbers (a spoofed sender)
            return make_number(CENTER_NET, 10, self.rnd.randint(1, 300))
        if r < 0.6 and own is not None:
            self.seq += 1
            return make_number(own[0], own[1], self.seq)
        if r < 0.7:
            return make_number(self.rnd.choice((PEER_NET, HOST_NET, 0, 65535)), self.rnd.randrange(65536),
                               self.rnd.randint(0, 400))
        return self.rnd.choice((0, 1, 2**63 - 1, 2**32, self.rnd.randrange(2**63)))

    def ip(self, own: str) -> str:
        return self.rnd.choice((own, own, GOOD_HOST_IP, CENTER_IP, PEER_IP, "127.0.1.77", FUZZED_HOST_IP,
                                self.rnd.choice(FUZZ_HOSTS), "10.9.9.9", "::1", "2001:db8::7", "0.0.0.0"))

    def frame(self, own_ip: str, flags=(1, 2, 3), own: tuple[int, int] | None = None) -> Frame:
        urls = self.urls(big=self.rnd.random() < 0.0005)
        values = {u: self.rnd.choice((0, 0, 1)) for u in urls}
        return Frame(values, self.ip(own_ip), self.number(own), self.rnd.choice(flags))

    def other(self, own_ip: str, own: tuple[int, int] | None = None):
        """A message of another kind, placed where it does not belong (or barely does)."""
        rnd = self.rnd
        r = rnd.random()
        if r < 0.25:
            return Ack(self.number(own), rnd.choice(("stored", "duplicate", "rejected")),
                       rnd.choice((None, "x", "too-many-urls", "a" * 1024, "number-reused")),
                       rnd.choice((None, None, 1, 2, 1000, rnd.randint(1, 2**31 - 1), 2**31 - 1)))
        if r < 0.4:
            return Task(self.number(own), tuple(self.urls(big=rnd.random() < 0.0005)))
        if r < 0.65:
            return Heartbeat(self.ip(own_ip), rnd.choice((0.0, 1.5, 1e18, time.time(), rnd.random() * 1e9)))
        if r < 0.78:
            return Status(rnd.random() < 0.5, rnd.choice((None, {}, {"role": "center", "x": [1, None]})))
        if r < 0.88:
            return Error(rnd.choice(("bad-tag", "x", "schema", "a" * 64)), "m" * rnd.choice((0, 10, 4096)))
        return Register(self.ip(own_ip), rnd.choice((1, 2, 3, 65535)), rnd.choice(("host", "center", "control")),
                        f"{own_ip}:1", rnd.choice((None, "127.0.2.0/24", "0.0.0.0/0")),
                        rnd.choice((None, (), ("zstd",), ("zstd", "lz4"))))

    def encode(self, msg, compress: bool) -> bytes:
        return wire.encode(msg, compress=compress and self.rnd.random() < 0.5)

    def mutated(self) -> bytes:
        """An input that almost always breaks the decoder (and so ends the connection)."""
        if self.rnd.random() < 0.1:
            return wire.encode(Welcome(self.rnd.choice(((), ("zstd",)))))  # no welcome is due from a client
        return fuzz_wire.mutate(self.rnd.choice(self.corpus), self.rnd, self.corpus)


STREAM = "deflate-stream"


class Out:
    """What a fuzzer writes on one connection: plain, or one deflate stream after its
    switch (its own Welcome, or the one it answered with as the server)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.deflater: wire.Deflater | None = None

    async def send(self, data: bytes, *, raw: bool = False) -> None:
        """``raw``: not through the stream (garbage to the daemon's inflater)."""
        await self.stream.send_all(data if self.deflater is None or raw else self.deflater.compress(data))

    async def switch(self, welcome: Welcome = Welcome((STREAM,))) -> None:
        await self.stream.send_all(wire.encode(welcome))
        self.deflater = wire.Deflater()


def switches(msg) -> bool:
    return isinstance(msg, Welcome) and msg.compress == (STREAM,)


async def _drain(stream: trio.SocketStream, hostile: Hostile, figures: Figures, on_message=None,
                 decoder: wire.Decoder | None = None) -> None:
    """Read what the daemon sends until it closes: numbers are remembered for echoing."""
    decoder = decoder or wire.Decoder(64 * 1024 * 1024, 10_000, allow_compressed=True)
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError, OSError):
        while data := await stream.receive_some(1 << 16):
            decoder.feed(data)
            while (msg := decoder.next_message()) is not wire.NEED_DATA:
                if switches(msg):
                    decoder.start_inflate()
                figures.received[type(msg).__name__] += 1
                if isinstance(msg, (Frame, Task, Ack)):
                    hostile.remember(msg.number)
                if on_message is not None:
                    await on_message(msg)


async def _client(address: tuple[str, int], me: str, register: Register | None, make, count: int,
                  hostile: Hostile, figures: Figures, kind: str, end_broken: bool) -> int:
    """One connection: register (or not), ``count`` messages from ``make`` in batches,
    then either a mutated input (and wait for the daemon to close) or our own close."""
    try:
        stream = await trio.open_tcp_stream(*address, local_address=me)
    except OSError:
        figures.connections["connect-failed"] += 1
        return 0
    figures.connections[kind] += 1
    before = figures.frames
    offered = () if register is None or register.compress is None else register.compress
    stream_mode = STREAM in offered  # the center prefers it: our side goes deflated after our switch
    compress = bool(offered) and (not stream_mode or hostile.rnd.random() < 0.1)  # zstd bodies in a stream: bad-header
    out = Out(stream)
    closed = trio.Event()

    async def drain():
        await _drain(stream, hostile, figures)
        closed.set()

    with trio.move_on_after(20):
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            try:
                if register is not None:
                    await stream.send_all(wire.encode(register))
                    figures.sent["register"] += 1
                    if stream_mode:
                        await out.switch()
                left = count
                while left > 0:
                    n = min(left, hostile.rnd.choice((1, 4, 16, 64)))
                    batch = [hostile.encode(make(), compress) for _ in range(n)]
                    await out.send(b"".join(batch))
                    figures.sent[kind] += n
                    left -= n
                if end_broken:
                    await out.send(hostile.mutated(), raw=hostile.rnd.random() < 0.5)
                    figures.sent["mutated"] += 1
                    with trio.move_on_after(5):
                        await stream.send_eof()
                        await closed.wait()  # the daemon closes
                nursery.cancel_scope.cancel()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                nursery.cancel_scope.cancel()
    return figures.frames - before


class CenterStorm:
    """Clients that attack the center, in every role."""

    def __init__(self, address: tuple[str, int], rnd: random.Random, figures: Figures, homes: str | None):
        self.address = address
        self.homes = homes  # the center's home map: a peer whose map differs is refused
        self.rnd = rnd
        self.hostile = Hostile(rnd)
        self.figures = figures
        self.peer_lock = trio.Lock()

    def _length(self) -> int:
        return self.rnd.choice((1, 5, 20, 100, 300, 1000, 3000))

    async def one(self, budget: int) -> None:
        rnd, h = self.rnd, self.hostile
        r = rnd.random()
        offer = rnd.choice((None, ("zstd",), (STREAM, "zstd")))
        count = min(budget, self._length())
        broken = rnd.random() < 0.5
        if r < 0.62:  # a LAN host
            me = rnd.choice(FUZZ_HOSTS)
            own = (CENTER_NET, int(me.rsplit(".", 1)[1]))

            def make():
                if rnd.random() < 0.55:
                    return h.frame(me, own=own)
                return h.other(me, own)
            reg = Register(me, CENTER_NET, "host", f"{me}:1", rnd.choice((None, "127.0.2.0/24")), offer)
            await _client(self.address, me, reg, make, count, h, self.figures, "host", broken)
        elif r < 0.82:  # the peer network (one connection at a time: the center keeps one per peer)
            async with self.peer_lock:
                def make():
                    if rnd.random() < 0.7:
                        f = h.frame(PEER_IP, flags=(1, 2, 3, 2, 3), own=(PEER_NET, 7))
                        if rnd.random() < 0.5:  # the IPs a valid request or answer would carry
                            ip = f"127.0.1.{rnd.randrange(2, 250)}" if f.flag == 2 else rnd.choice((GOOD_HOST_IP, rnd.choice(FUZZ_HOSTS)))
                            f = Frame(f.URL_set, ip, f.number, f.flag)
                        return f
                    return h.other(PEER_IP, (PEER_NET, 7))
                homes = self.homes if rnd.random() < 0.95 else None
                reg = Register(PEER_IP, PEER_NET, "center", f"{PEER_IP}:1", "127.0.1.0/24", offer, homes)
                await _client(self.address, PEER_IP, reg, make, count, h, self.figures, "peer", broken)
        elif r < 0.88:  # a control client
            me = rnd.choice(FUZZ_HOSTS)
            reg = Register(me, CENTER_NET, "control", f"{me}:1", None, offer)
            await _client(self.address, me, reg, lambda: rnd.choice((Status(True), h.other(me))), min(count, 20), h,
                          self.figures, "control", broken)
        else:  # a handshake that must fail: garbage first, or a register the center refuses
            me = rnd.choice(FUZZ_HOSTS + ["127.0.9.9", "127.0.1.50"])
            reg = rnd.choice((None, Register("127.0.2.3", 2, "host", "127.0.2.3:1"),  # not the source address
                              Register(me, 9, "center", f"{me}:1"), Register(me, 2, "host", f"{me}:1", None, offer)))
            if reg is None or rnd.random() < 0.3:
                await _client(self.address, me, None, lambda: h.other(me), 1, h, self.figures, "handshake", True)
            else:
                await _client(self.address, me, reg, lambda: h.frame(me), min(count, 5), h, self.figures, "handshake",
                              broken)


class FakeCenter:
    """The fuzzed host's center: hostile while ``storming``, well-behaved afterwards."""

    def __init__(self, rnd: random.Random, figures: Figures, session_seconds: float):
        self.rnd = rnd
        self.hostile = Hostile(rnd)
        self.figures = figures
        self.session_seconds = session_seconds
        self.storming = True
        self.enough = lambda: False  # the host has had its share: pause
        self.sessions = 0
        self.frames_from_host: list[Frame] = []
        self.acked_tasks: set[int] = set()
        self.connected = trio.Event()

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await trio.serve_tcp(self.handle, 0, host=FAKE_CENTER_IP, task_status=task_status)

    async def handle(self, stream: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            async with stream:
                decoder = wire.Decoder(64 * 1024 * 1024, 10_000, allow_compressed=True)
                while True:  # its Register
                    data = await stream.receive_some(1 << 16)
                    if not data:
                        return
                    decoder.feed(data)
                    reg = decoder.next_message()
                    if reg is not wire.NEED_DATA:
                        break
                out = Out(stream)
                compress = bool(reg.compress)
                if compress and STREAM in reg.compress and self.rnd.random() < 0.5:
                    await out.switch()  # the server's side is deflated right after its Welcome
                    compress = False
                elif compress:
                    await stream.send_all(wire.encode(Welcome(("zstd",))))
                self.sessions += 1
                self.connected.set()
                if self.storming:
                    await self._storm(out, decoder, compress)
                else:
                    await self._behave(out, decoder)

    async def _storm(self, out: Out, decoder, compress: bool) -> None:
        rnd, h, stream = self.rnd, self.hostile, out.stream
        own = (HOST_NET, 1)
        started = trio.current_time()

        async def reader():
            for msg in decoder:  # what came with the Register
                self._note(msg)
            await _drain(stream, h, self.figures, self._on_message, decoder)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            # A session that ends early makes the host back off (up to 5 s): end one with
            # a mutated input only after that long, so the host comes back at once.
            while self.storming:
                if self.enough():
                    await trio.sleep(0.05)
                    continue
                n = rnd.choice((1, 4, 16, 64))
                batch = []
                for _ in range(n):
                    if rnd.random() < 0.5:
                        msg = h.frame(FAKE_CENTER_IP, flags=(2, 2, 2, 1, 3), own=own)
                        if rnd.random() < 0.4:
                            msg = Frame(msg.URL_set, rnd.choice(("127.0.3.11", FUZZED_HOST_IP)), msg.number, msg.flag)
                    else:
                        msg = h.other(FAKE_CENTER_IP, own)
                    batch.append(h.encode(msg, compress))
                await out.send(b"".join(batch))
                self.figures.sent["to-host"] += n
                if trio.current_time() - started > self.session_seconds and rnd.random() < 0.05:
                    await out.send(h.mutated(), raw=rnd.random() < 0.5)
                    self.figures.sent["mutated-to-host"] += 1
                    break
                await trio.sleep(0)
            nursery.cancel_scope.cancel()

    async def _on_message(self, msg) -> None:
        self._note(msg)

    def _note(self, msg) -> None:
        if isinstance(msg, Frame) and msg.flag == 1:
            self.frames_from_host.append(msg)
        elif isinstance(msg, Ack):
            self.acked_tasks.add(msg.number)

    async def _behave(self, out: Out, decoder) -> None:
        """Acknowledge every set, hand out one task, as a center does."""
        await out.send(wire.encode(Task(make_number(HOST_NET, 0, 1), tuple(good_urls("task", 5)))))
        while True:
            while (msg := decoder.next_message()) is not wire.NEED_DATA:
                if switches(msg):
                    decoder.start_inflate()
                await self._behave_on(out, msg)
            if not (data := await out.stream.receive_some(1 << 16)):
                return
            decoder.feed(data)

    async def _behave_on(self, out: Out, msg) -> None:
        self._note(msg)
        if isinstance(msg, Frame) and msg.flag == 1:
            await out.send(wire.encode(Ack(msg.number, "stored")))


async def good_peer(address: tuple[str, int], homes: str | None, routed: set[str], stop: trio.Event) -> None:
    """Network 1 as it should be: answers every set it is asked with nothing seen, and
    takes (acknowledges) every URL routed to it as the home of its site."""
    async with await trio.open_tcp_stream(*address, local_address=PEER_IP) as stream:
        reg = Register(PEER_IP, PEER_NET, "center", f"{PEER_IP}:1", "127.0.1.0/24", homes=homes)
        await stream.send_all(wire.encode(reg))
        decoder = wire.Decoder(64 * 1024 * 1024, 10_000)

        async def answer():
            while data := await stream.receive_some(1 << 16):
                decoder.feed(data)
                for msg in decoder:
                    if isinstance(msg, Frame) and msg.flag == 2:
                        reply = Frame(dict.fromkeys(msg.URL_set, 0), msg.IP, msg.number, 3)
                        await stream.send_all(wire.encode(reply))
                    elif isinstance(msg, Frame) and msg.flag == 1:
                        routed.update(msg.URL_set)
                        await stream.send_all(wire.encode(Ack(msg.number, "stored")))
                    elif isinstance(msg, Heartbeat):
                        await stream.send_all(wire.encode(Heartbeat(PEER_IP, time.time())))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer)
            await stop.wait()
            nursery.cancel_scope.cancel()


#: URLs the feeder lets wait in the fuzzed host's URL_pool and sets in flight.
FEED_BACKLOG = 200


def queued_of(host: LocalDaemon, urls: list[str]) -> set[str]:
    """The ``urls`` that are tasks in ``host``'s task_pool (their fingerprints in
    ``task_pool:fp``: queued, nothing crawls them here). Only those URLs are looked up:
    over a long storm the task_pool grows by millions (the peer's routed URLs), and
    reading it whole every tenth of a second kept the shared Redis and this process too
    busy for the daemons to serve."""
    store = host.pools.store
    return {u for u, hit in zip(urls, store.fp_contains(TASK_FP, fingerprint_many(urls))) if hit}


async def backlog(host: LocalDaemon) -> int:
    sizes = await host.store.run(host.pools.sizes)
    return sizes.get("URL_pool", 0) + sum(len(urls) for _, urls in host.core.unacked.values())


async def state(center: CenterDaemon, good: LocalDaemon, fuzzed: LocalDaemon) -> str:
    """What the daemons hold (read when a run goes wrong): the center's sets by stage,
    sets held back, URLs waiting for network 1, task_URL for the good host and in all,
    and the two hosts' backlogs."""
    core = center.core
    stages: Counter = Counter(rec.stage.value for rec in core.stages.sets.values())
    tasks: Counter = Counter()
    for key, urls in core.members.tasks.items():
        tasks[task_parts(key)[1]] += len(urls)
    good_pools = await good.store.run(good.pools.sizes)
    return (f"center: sets {dict(stages)}, held {len(core.stages.waiting)}, routed waiting {core.stages.routed_waiting()}, "
            f"hosts {len(core.members.hosts)}, task_URL {sum(tasks.values()):,} in {len(core.members.tasks):,} keys "
            f"({tasks[GOOD_HOST_IP]:,} for the good host); "
            f"good host: connected {good.conn is not None}, unacked {len(good.core.unacked)}, pools {good_pools}; "
            f"fuzzed host: backlog {await backlog(fuzzed):,}, unacked {len(fuzzed.core.unacked)}")


def frames_counted(counters: Counters) -> int:
    """Messages a daemon decoded, and inputs it refused as bad."""
    snap = counters.snapshot()
    return sum(v for k, v in snap.items() if k.startswith(("frames_received", "bad_input"))
               and 'reason="bad-url"' not in k)  # URLs dropped from sets already counted


INTERNAL = ("handler_error", "session_error", "writer_error")


def internal_errors(counters: Counters) -> dict[str, int]:
    return {k: v for k, v in counters.snapshot().items() if k.startswith(INTERNAL) and v}


async def run(redis_url: str, frames: int, *, seed: int = 1, prefix: str = "fuzzd", concurrency: int = 6,
              progress: float | None = None, session_seconds: float = 5.5, host_share: float = 0.25,
              settle: float = 60.0, patience: float = 0.0) -> tuple[Figures, dict]:
    """Storm a live center and a live host until they have counted ``frames`` hostile
    messages between them (decoded or refused; ``host_share`` of them the host's), then
    check both still serve. Returns the figures and a report dict (``ok``, what failed)."""
    rnd = random.Random(seed)
    figures = Figures()
    stores = [Store(redis_url, f"{prefix}:{name}") for name in ("center", "good", "fuzzed")]
    report: dict = {"failures": []}
    center = CenterDaemon(CenterSettings(network=CENTER_NET, ip=CENTER_IP, port=0, lan="127.0.2.0/24",
                                         peers=[PeerAddress(PEER_NET, PEER_IP, 0, "127.0.1.0/24")]), stores[0])
    fake = FakeCenter(random.Random(seed + 1), figures, session_seconds)
    started = time.perf_counter()
    try:
        async with trio.open_nursery() as nursery:
            cport = await nursery.start(center.run)
            good = LocalDaemon(LocalSettings(network=CENTER_NET, ip=GOOD_HOST_IP, lan="127.0.2.0/24",
                                             center=(CENTER_IP, cport), set_size=50), stores[1])
            await nursery.start(good.run)
            listeners = await nursery.start(fake.serve)
            fport = listeners[0].socket.getsockname()[1]
            fuzzed = LocalDaemon(LocalSettings(network=HOST_NET, ip=FUZZED_HOST_IP, lan="127.0.3.0/24",
                                               center=(FAKE_CENTER_IP, fport), set_size=20), stores[2])
            await nursery.start(fuzzed.run)
            await trio.to_thread.run_sync(fuzzed.pools.push, good_urls("early", 60))

            storm = CenterStorm((CENTER_IP, cport), rnd, figures, center.register().homes)
            center_target, host_target = frames - int(frames * host_share), int(frames * host_share)
            fake.enough = lambda: frames_counted(fuzzed.counters) >= host_target
            last = time.perf_counter()

            def done() -> bool:
                return frames_counted(center.counters) >= center_target and fake.enough()

            async def center_worker():
                while frames_counted(center.counters) < center_target:
                    await storm.one(center_target - frames_counted(center.counters))

            async def status_port_worker():
                """The fuzzed host's status port: control clients and garbage."""
                h = Hostile(random.Random(seed + 2))
                while not done():
                    reg = Register(FUZZED_HOST_IP, HOST_NET, "control", f"{FUZZED_HOST_IP}:1")
                    if h.rnd.random() < 0.5:
                        reg = None
                    await _client((FUZZED_HOST_IP, fuzzed.port), FUZZED_HOST_IP, reg,
                                  lambda: h.rnd.choice((Status(True), h.other(FUZZED_HOST_IP))), 3, h, figures,
                                  "host-control", True)
                    await trio.sleep(0.05)

            async def feeder():
                """New URLs for the fuzzed host: sets in flight, for the hostile acks to hit.
                Bounded: the hostile center acknowledges almost nothing, so an unbounded
                feed is a backlog (hundreds of thousands of URLs over a long storm) that the
                URLs pushed after the storm would wait behind."""
                for i in range(10**9):
                    if (await backlog(fuzzed)) < FEED_BACKLOG:
                        await trio.to_thread.run_sync(fuzzed.pools.push, good_urls(f"feed{i}", 20))
                    await trio.sleep(0.2)

            async with trio.open_nursery() as workers:
                for _ in range(concurrency):
                    workers.start_soon(center_worker)
                workers.start_soon(status_port_worker)
                workers.start_soon(feeder)
                while not done():
                    await trio.sleep(0.2)
                    if progress and time.perf_counter() - last >= progress:
                        last = time.perf_counter()
                        print(f"{figures.frames:,} frames sent in {last - started:,.0f} s; center counted "
                              f"{frames_counted(center.counters):,}, host {frames_counted(fuzzed.counters):,}; "
                              f"{await state(center, good, fuzzed)}", flush=True)
                workers.cancel_scope.cancel()
            fake.frames_from_host.clear()
            fake.storming = False
            figures.elapsed = time.perf_counter() - started
            report["storm_seconds"] = figures.elapsed

            # After the storm: both daemons must still serve well-behaved peers.
            stop = trio.Event()
            routed: set[str] = set()
            nursery.start_soon(good_peer, (CENTER_IP, cport), center.register().homes, routed, stop)
            fresh = good_urls(f"after{seed}", 40)
            await trio.to_thread.run_sync(good.pools.push, fresh)
            host_fresh = good_urls(f"host{seed}", 30)
            await trio.to_thread.run_sync(fuzzed.pools.push, host_fresh)

            async def served() -> tuple[set, set, bool]:
                tasks = await trio.to_thread.run_sync(queued_of, good, fresh)
                sent = {u for f in fake.frames_from_host for u in f.URL_set}
                host_tasks = await trio.to_thread.run_sync(queued_of, fuzzed, good_urls("task", 5))
                return set(fresh) - tasks - routed, set(host_fresh) - sent, set(good_urls("task", 5)) <= host_tasks

            settled = time.perf_counter()
            with trio.move_on_after(settle) as waited:
                while (got := await served()) and (got[0] or got[1] or not got[2]):
                    await trio.sleep(0.1)
            if waited.cancelled_caught:
                report["state_at_settle"] = await state(center, good, fuzzed)
                report["failures"].append(f"after the storm: {len(got[0])} of the well-behaved host's {len(fresh)} "
                                          f"URLs neither in its task_pool nor routed to their home; fuzzed host: "
                                          f"{len(got[1])} of {len(host_fresh)} URLs not sent, task queued: {got[2]}")
                with trio.move_on_after(patience):  # slow, or stuck?
                    while (got := await served()) and (got[0] or got[1] or not got[2]):
                        await trio.sleep(1)
                report["served_after"] = (f"served {time.perf_counter() - settled:,.0f} s after the storm"
                                          if not (got[0] or got[1] or not got[2]) else
                                          f"still not served {patience:,.0f} s after the settle time: {await state(center, good, fuzzed)}")
            stop.set()
            report["center_frames"] = frames_counted(center.counters)
            report["host_frames"] = frames_counted(fuzzed.counters)
            report["center_errors"] = internal_errors(center.counters)
            report["host_errors"] = internal_errors(fuzzed.counters)
            report["center_counters"] = center.counters.snapshot()
            report["host_counters"] = fuzzed.counters.snapshot()
            report["host_sessions"] = fake.sessions
            nursery.cancel_scope.cancel()
    finally:
        for s in stores:
            with contextlib.suppress(Exception):
                s.delete_prefix()
            s.close()
    for side in ("center", "host"):
        if report.get(f"{side}_errors"):
            report["failures"].append(f"{side} counted internal errors: {report[f'{side}_errors']}")
    report["ok"] = not report["failures"]
    return figures, report


def summary(figures: Figures, report: dict) -> str:
    rate = figures.frames / max(figures.elapsed, 1e-9)
    lines = [
        f"sent:      {figures.frames:,} messages in {figures.elapsed:,.1f} s = {rate:,.0f}/s "
        f"({', '.join(f'{k} {v:,}' for k, v in figures.sent.most_common())})",
        f"conns:     {', '.join(f'{k} {v:,}' for k, v in figures.connections.most_common())}; "
        f"fuzzed host sessions {report.get('host_sessions', 0)}",
        f"counted:   center {report.get('center_frames', 0):,}, host {report.get('host_frames', 0):,} "
        f"(messages decoded + inputs refused)",
        "refused:   center " + ", ".join(f"{k} {v:,}" for k, v in sorted(report.get("center_counters", {}).items())
                                        if k.startswith(("rejected", "bad_input", "handshake_failed")) and v),
        "           host " + ", ".join(f"{k} {v:,}" for k, v in sorted(report.get("host_counters", {}).items())
                                      if k.startswith(("rejected", "bad_input", "handshake_failed")) and v),
        f"internal errors: center {report.get('center_errors')}, host {report.get('host_errors')}",
        "OK" if report["ok"] else "FAILED: " + "; ".join(report["failures"]),
        *(f"{k}: {report[k]}" for k in ("state_at_settle", "served_after") if k in report),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=1_000_000,
                   help="hostile messages the two daemons must have counted (decoded or refused) in all")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=6, help="fuzzing clients of the center at once")
    p.add_argument("--redis", help="a Redis URL (default: start an embedded server)")
    p.add_argument("--progress", type=float, default=30.0, metavar="S", help="a progress line every S seconds")
    p.add_argument("--patience", type=float, default=600.0, metavar="S",
                   help="on a failed check, wait up to S more seconds to tell slow from stuck")
    p.add_argument("--log", default="ERROR", help="the daemons' log level during the storm")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("dedupnet").setLevel(args.log)
    with contextlib.ExitStack() as stack:
        url = args.redis
        if url is None:
            from dedupnet.adapters.storage.embedded import EmbeddedRedis
            url = stack.enter_context(EmbeddedRedis())
        figures, report = trio.run(lambda: run(url, args.frames, seed=args.seed, concurrency=args.concurrency,
                                               progress=args.progress, patience=args.patience))
    print(summary(figures, report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

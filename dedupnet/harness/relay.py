"""A fault-injecting TCP relay for the links between daemons (faults on the links).

The daemons talk through a :class:`Relay` exactly as through TCP: it listens on a
loopback address, and for every connection it accepts it connects on to the real
target and forwards both directions. In between it acts on whole messages (it reads
the 16-byte header of :mod:`dedupnet.codec.wire` to find where each one ends), so a fault
hits a frame, an ack or a task, never half of one:

* **delay** with **jitter** (a WAN): every message waits ``delay ± jitter`` seconds,
  but never overtakes an earlier one (TCP keeps order; a latency that varies does not
  reorder a stream);
* **reorder**: a message is held ``reorder_delay`` longer, so later ones overtake it
  (TCP itself never does this; it models a message that arrives late anyway, as a
  re-send over a new connection does);
* **duplicate**: a message is forwarded twice (what a re-send after a lost ack looks
  like to the receiver: the protocol numbers every set so that repeats are harmless,
  the paper's §2.1 ``number``, PROTOCOL.md gap 7);
* **drop**: the message is lost *and the connection is reset right after*. TCP never
  loses a message inside a live connection: a loss it cannot repair ends the
  connection, and everything still in flight on it (queued here behind a delay) is
  lost with it. That is what ``drop`` models;
* **reset**: the message is delivered, then the connection is reset (the request got
  through, its answer or ack is lost with the connection);
* **silent_drop**: the message is discarded and the connection stays up. This is *not*
  something TCP does; it is here to test what the daemons would do if it happened (a
  buggy middlebox, an application that loses a message), see tests/test_relay.py;
* **partition** for N seconds, then **heal**: ``silent`` (the default, a cable cut or
  a routing failure) stops all traffic on the live connections, both ways, so each
  side learns of it only by missed heartbeats, as on a real WAN (data still queued
  when the link heals is delivered, as TCP's retransmission would, to whichever end
  still holds the connection); ``reset`` cuts every live connection at once. New
  connections during a partition are refused (reset as soon as accepted).
* resets **on command** (:meth:`Relay.reset_all`).

The probabilistic faults apply only to the message kinds in ``LinkConfig.kinds``
(frames, acks and tasks by default): the handshake (Register, Welcome) and heartbeats
are left alone, since a repeated Register or Welcome is a protocol error by design
(:mod:`dedupnet.adapters.net.transport`), not a fault of the link. Delay and partitions apply to
everything. Bytes that do not start with the wire's magic are forwarded as they come.

**Compression.** A connection that negotiated ``deflate-stream`` is, in each direction
after that direction's Welcome, one deflate stream. The relay acts on messages all
the same: it inflates what it reads and deflates what it writes with its own stream,
as a proxy that terminates compression would, so a message it drops, repeats or
holds back leaves a stream the receiver can still read.

**Source address.** A center trusts a connection by its TCP source address: the
transport's handshake accepts a Register only if its ``IP`` is the peer address
(``verify_source``, PROTOCOL.md gap 2), and the center then checks that address
against its LAN or the peer network (center_host/daemon.py ``_on_connection``). So the
relay connects on *from the client's own address* (it binds the outgoing socket to
the peer address of the accepted connection; on Linux any 127.x.y.z can be bound):
to the target the relayed connection looks exactly like the direct one.

**Seeded.** Every decision is drawn from a :class:`random.Random` seeded by the relay's
``seed``, its name, the connection's ordinal and the direction, so the same messages in
the same order meet the same faults. Timing uses ``trio.current_time()`` (tests run it
on a MockClock). :attr:`Relay.counters` says what the relay did.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import socket
import struct
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import trio

from dedupnet.harness.faults import DEFAULT_DURATION, LINK_FAULTS, Fault
from dedupnet.codec.messages import STREAM_COMPRESSION, Kind
from dedupnet.codec.wire import HEADER_SIZE, MAGIC, Deflater

__all__ = [
    "DATA_KINDS",
    "LinkConfig",
    "CLEAN",
    "Relay",
    "LINK_DEFAULTS",
    "ScheduledFault",
    "link_names",
    "schedule_link_faults",
    "relay_target",
    "start_link_relays",
    "LinkFaults",
    "format_links",
]

log = logging.getLogger("dedupnet.harness.relay")

RECEIVE_CHUNK = 64 * 1024
_LEN = struct.Struct(">IB")  # body_len, tag_len at offset 4 of a header
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST

#: The kinds the probabilistic faults hit by default: the protocol's messages, not
#: the handshake or heartbeats.
DATA_KINDS = frozenset({int(Kind.FRAME), int(Kind.ACK), int(Kind.TASK)})


@dataclass(frozen=True)
class LinkConfig:
    """What a relay does to each message (probabilities per message of ``kinds``)."""

    delay: float = 0.0  # seconds every message waits
    jitter: float = 0.0  # +- seconds, uniform; order is kept
    duplicate: float = 0.0  # forwarded twice
    reorder: float = 0.0  # held reorder_delay longer, later messages overtake it
    reorder_delay: float = 0.05
    drop: float = 0.0  # lost, and the connection reset right after
    reset: float = 0.0  # delivered, then the connection reset
    silent_drop: float = 0.0  # lost, the connection stays up (not TCP: a test of the daemons)
    kinds: frozenset[int] = DATA_KINDS

    def merged(self, other: LinkConfig) -> LinkConfig:
        """Two faults on one link at once: the larger of each figure, the union of kinds."""
        values: dict[str, Any] = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            values[f.name] = a | b if f.name == "kinds" else max(a, b)
        return LinkConfig(**values)

    @property
    def clean(self) -> bool:
        return all(getattr(self, f.name) == 0 for f in fields(self) if f.name not in ("kinds", "reorder_delay"))


CLEAN = LinkConfig()


_SWITCH = f'"{STREAM_COMPRESSION}"'.encode()


@dataclass(order=True)
class _Item:
    release: float
    seq: int
    data: bytes | None = field(compare=False)  # None: the source closed (EOF)
    reset_after: bool = field(default=False, compare=False)
    switch: bool = field(default=False, compare=False)  # a Welcome after which this direction is deflated


class _Pipe:
    """One relayed connection: client <-> relay <-> target, two directions."""

    def __init__(self, relay: Relay, ordinal: int, client: trio.SocketStream, server: trio.SocketStream):
        self.relay = relay
        self.ordinal = ordinal
        self.streams = (client, server)
        self.scope = trio.CancelScope()
        self.reset_reason: str | None = None
        self.rngs = [random.Random(f"{relay.seed}:{relay.name}:{ordinal}:{d}") for d in (0, 1)]
        self.queues: list[list[_Item]] = [[], []]
        self.wake = [trio.Event(), trio.Event()]
        self.last_release = [0.0, 0.0]
        self.seqs = itertools.count()
        self.inflaters: list[Any] = [None, None]  # per direction, once its Welcome switched it
        self.deflaters: list[Deflater | None] = [None, None]

    def reset(self, reason: str) -> None:
        if self.reset_reason is None:
            self.reset_reason = reason
            self.relay.counters[f"resets:{reason}"] += 1
        self.scope.cancel()

    async def run(self) -> None:
        graceful = False
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    for d in (0, 1):
                        nursery.start_soon(self._read, d)
                        nursery.start_soon(self._write, d)
                    # _write returns after an EOF it forwarded: then the pipe ends.
            graceful = self.reset_reason is None
        finally:
            for s in self.streams:
                if not graceful:
                    _arm_reset(s)
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(s)

    def _push(self, d: int, item: _Item) -> None:
        heapq.heappush(self.queues[d], item)
        self.wake[d].set()

    async def _read(self, d: int) -> None:
        src = self.streams[d]
        relay = self.relay
        buf = bytearray()
        raw = False
        while True:
            await relay._wait_healed()
            try:
                data = await src.receive_some(RECEIVE_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self.reset("peer")
                return
            if not data:
                self._push(d, _Item(self._release(d, 0.0), next(self.seqs), None))
                return
            relay.counters["bytes"] += len(data)
            if raw:
                self._push(d, _Item(self._release(d, 0.0), next(self.seqs), bytes(data)))
                continue
            if (plain := self._inflate(d, data)) is None:
                return
            buf += plain
            while buf:
                n = min(len(buf), len(MAGIC))
                if buf[:n] != MAGIC[:n]:  # not our framing: forward as it comes
                    raw = True
                    relay.counters["raw_bytes"] += len(buf)
                    self._push(d, _Item(self._release(d, 0.0), next(self.seqs), bytes(buf)))
                    buf.clear()
                    break
                if len(buf) < HEADER_SIZE:
                    break
                body_len, tag_len = _LEN.unpack_from(buf, 4)
                total = HEADER_SIZE + body_len + tag_len
                if len(buf) < total:
                    break
                message = bytes(buf[:total])
                del buf[:total]
                switch = message[3] == Kind.WELCOME and _SWITCH in message
                self._decide(d, message, message[3], switch)
                if switch:  # what follows in this direction is deflated
                    self.inflaters[d] = zlib.decompressobj(-zlib.MAX_WBITS)
                    if (plain := self._inflate(d, bytes(buf))) is None:
                        return
                    buf[:] = plain

    def _inflate(self, d: int, data: bytes) -> bytes | None:
        """``data`` as direction ``d``'s messages (inflated once its Welcome switched it);
        None, and the pipe reset, if it is not deflate."""
        if self.inflaters[d] is None:
            return data
        try:
            return self.inflaters[d].decompress(data)
        except zlib.error:
            self.reset("bad-compression")
            return None

    def _release(self, d: int, jittered_delay: float) -> float:
        """When a message may go: after its delay, and not before the one ahead of it."""
        release = max(self.last_release[d], trio.current_time() + jittered_delay)
        self.last_release[d] = release
        return release

    def _decide(self, d: int, message: bytes, kind: int, switch: bool = False) -> None:
        cfg, rng, counters = self.relay.config, self.rngs[d], self.relay.counters
        counters["messages"] += 1
        delay = cfg.delay
        if cfg.jitter:
            delay += rng.uniform(-cfg.jitter, cfg.jitter)
        release = self._release(d, max(delay, 0.0))
        if delay > 0:
            counters["delayed"] += 1
        if kind in cfg.kinds:
            if cfg.silent_drop and rng.random() < cfg.silent_drop:
                counters["silent_dropped"] += 1
                return
            if cfg.drop and rng.random() < cfg.drop:
                counters["dropped"] += 1
                self.reset("drop")
                return
            reset_after = bool(cfg.reset) and rng.random() < cfg.reset
            if cfg.reorder and rng.random() < cfg.reorder:
                counters["reordered"] += 1
                release += cfg.reorder_delay  # later messages (kept in order) go first
            self._push(d, _Item(release, next(self.seqs), message, reset_after))
            if cfg.duplicate and rng.random() < cfg.duplicate:
                counters["duplicated"] += 1
                self._push(d, _Item(release, next(self.seqs), message))
            return
        self._push(d, _Item(release, next(self.seqs), message, switch=switch))

    async def _write(self, d: int) -> None:
        dst = self.streams[1 - d]
        queue = self.queues[d]
        relay = self.relay
        last_seq = -1
        while True:
            if not queue:
                await self.wake[d].wait()
                self.wake[d] = trio.Event()
                continue
            now = trio.current_time()
            if queue[0].release > now:
                with trio.move_on_after(queue[0].release - now):
                    await self.wake[d].wait()  # an earlier message may come (reorder)
                    self.wake[d] = trio.Event()
                continue
            await relay._wait_healed()
            item = heapq.heappop(queue)
            if item.data is None:
                self.scope.cancel()  # the source closed: so does the pipe, both ways
                return
            if item.seq < last_seq:
                relay.counters["out_of_order"] += 1
            last_seq = max(last_seq, item.seq)
            deflater = self.deflaters[d]
            try:
                await dst.send_all(item.data if deflater is None else deflater.compress(item.data))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self.reset("peer")
                return
            if item.switch:
                self.deflaters[d] = Deflater()
            relay.counters["forwarded"] += 1
            if item.reset_after:
                self.reset("reset")
                return


def _arm_reset(stream: trio.SocketStream) -> None:
    """Make the next close send RST instead of FIN (what a reset looks like to the peer)."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    except OSError:
        pass


class Relay:
    """A fault-injecting TCP relay in front of ``target`` (see the module docstring).

    Run it in a nursery: ``address = await nursery.start(relay.run)``; clients connect
    to ``address`` instead of ``target``. :attr:`config` may be replaced at any time
    (it applies to the messages read from then on); :meth:`partition`, :meth:`heal`
    and :meth:`reset_all` act at once.
    """

    def __init__(self, target: tuple[str, int], config: LinkConfig = CLEAN, *, name: str = "relay",
                 seed: int = 0, listen_host: str = "127.0.0.1", listen_port: int = 0,
                 bind_source: bool = True, connect_timeout: float = 5.0):
        self.target = target
        self.config = config
        self.name = name
        self.seed = seed
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.bind_source = bind_source
        self.connect_timeout = connect_timeout
        self.counters: Counter[str] = Counter()
        #: (trio time, "partition" | "heal"): when the link was cut and healed.
        self.history: list[tuple[float, str]] = []
        self.address: tuple[str, int] | None = None
        self.pipes: set[_Pipe] = set()
        self._ordinals = itertools.count()
        self._healed: trio.Event | None = None  # set while partitioned; set() heals
        self._partition_token = 0
        self._nursery: trio.Nursery | None = None

    def __repr__(self) -> str:
        return f"<Relay {self.name} {self.address} -> {self.target}>"

    @property
    def partitioned(self) -> bool:
        return self._healed is not None

    async def run(self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.listen_port, host=self.listen_host)
        self.address = (self.listen_host, listeners[0].socket.getsockname()[1])
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(self.address)
            await trio.serve_listeners(self._on_accept, listeners, handler_nursery=nursery)

    async def _on_accept(self, client: trio.SocketStream) -> None:
        ordinal = next(self._ordinals)
        self.counters["accepted"] += 1
        if self.partitioned:
            self.counters["refused"] += 1
            _arm_reset(client)
            await trio.aclose_forcefully(client)
            return
        try:
            source = client.socket.getpeername()[0] if self.bind_source else None
            with trio.fail_after(self.connect_timeout):
                server = await trio.open_tcp_stream(*self.target, local_address=source)
        except (OSError, trio.TooSlowError) as exc:
            log.info("relay %s: cannot connect on to %s:%d: %s", self.name, *self.target, exc)
            self.counters["connect_failed"] += 1
            _arm_reset(client)
            await trio.aclose_forcefully(client)
            return
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        pipe = _Pipe(self, ordinal, client, server)
        self.pipes.add(pipe)
        try:
            await pipe.run()
        finally:
            self.pipes.discard(pipe)

    # -- commands ---------------------------------------------------------------------
    def reset_all(self, reason: str = "command") -> int:
        """Reset every live connection now; returns how many."""
        pipes = list(self.pipes)
        for p in pipes:
            p.reset(reason)
        return len(pipes)

    def partition(self, duration: float | None = None, *, mode: str = "silent") -> None:
        """Cut the link (see the module docstring for ``silent`` and ``reset``); heal
        after ``duration`` seconds, or on :meth:`heal`."""
        if mode not in ("silent", "reset"):
            raise ValueError(f"partition mode must be 'silent' or 'reset', not {mode!r}")
        if self._healed is None:
            self._healed = trio.Event()
            self.counters["partitions"] += 1
            self.history.append((trio.current_time(), "partition"))
            log.info("relay %s: partitioned (%s)", self.name, mode)
        self._partition_token += 1
        if mode == "reset":
            self.reset_all("partition")
        if duration is not None:
            assert self._nursery is not None, "partition(duration) needs a running relay"
            self._nursery.start_soon(self._heal_after, duration, self._partition_token)

    async def _heal_after(self, duration: float, token: int) -> None:
        await trio.sleep(duration)
        if token == self._partition_token:
            self.heal()

    def heal(self) -> None:
        if self._healed is not None:
            self._healed.set()
            self._healed = None
            self.counters["heals"] += 1
            self.history.append((trio.current_time(), "heal"))
            log.info("relay %s: healed", self.name)

    async def _wait_healed(self) -> None:
        while self._healed is not None:
            await self._healed.wait()


# --- scenarios: which links, which faults, when -----------------------------------------

#: What each link fault does to the links it hits (the issue's scenarios).
LINK_DEFAULTS: dict[str, LinkConfig] = {
    # A WAN cut: the link goes silent (partition(), not a LinkConfig).
    "partition": CLEAN,
    # 200 ms +- 100 ms, and 5 % of messages end their connection: half lost with it, half
    # delivered before it (the answer or ack is lost instead).
    "lossy-wan": LinkConfig(delay=0.2, jitter=0.1, drop=0.025, reset=0.025),
    # One host's link to its center resets often: 10 % of messages, a LAN's latency.
    "lossy-lan": LinkConfig(delay=0.002, jitter=0.002, drop=0.05, reset=0.05),
    # A quarter of the protocol's messages arrive twice.
    "duplicate-frames": LinkConfig(duplicate=0.25),
}


@dataclass(frozen=True)
class ScheduledFault:
    """A link fault with everything decided: when (fraction of the crawl), how long, which links."""

    kind: str
    at: float
    duration: float | None
    links: tuple[str, ...]
    target: str

    def describe(self) -> str:
        lasts = "to the end" if self.duration is None else f"{self.duration:g} s"
        return f"{self.kind} on {self.target} at {self.at:.0%} of the crawl, {lasts}"


def wan_name(a: int, b: int) -> str:
    a, b = sorted((a, b))
    return f"wan:{a}-{b}"


def host_name(network: int, index: int) -> str:
    return f"host:{network}.{index}"


def link_names(target: str, networks: int, hosts: int) -> tuple[str, ...]:
    """The relayed links a fault target covers: ``host:N.I`` (that host's link to its
    center), ``wan:A-B`` (the link between two centers), ``center:N`` (every link of
    center N: its hosts' and its WAN links)."""
    kind, _, rest = target.partition(":")
    try:
        if kind == "host":
            n, i = (int(x) for x in rest.split("."))
            if 1 <= n <= networks and 0 <= i < hosts:
                return (host_name(n, i),)
        elif kind == "wan":
            a, b = (int(x) for x in rest.split("-"))
            if a != b and 1 <= a <= networks and 1 <= b <= networks:
                return (wan_name(a, b),)
        elif kind == "center":
            n = int(rest)
            if 1 <= n <= networks:
                return (*(host_name(n, i) for i in range(hosts)),
                        *(wan_name(n, m) for m in range(1, networks + 1) if m != n))
    except ValueError:
        pass
    raise ValueError(f"fault target {target!r} is not a link of {networks} networks x {hosts} hosts "
                     f"(host:<network>.<index>, center:<network>, wan:<a>-<b>)")


def schedule_link_faults(faults: Iterable[Fault], networks: int, hosts: int, seed: int) -> list[ScheduledFault]:
    """Decide what the seed decides: the start (``at`` None: 10-60 % of the crawl) and
    the target (``target`` None: a random pair of networks for ``partition``, every WAN
    link for ``lossy-wan``, a random host for ``lossy-lan``, one random WAN link and
    one random host per network for ``duplicate-frames``). A given target may be any
    link: ``partition`` on ``host:N.I`` cuts one host off its center."""
    rng = random.Random(f"links:{seed}")
    out = []
    for f in faults:
        if f.kind not in LINK_FAULTS:
            continue
        at = f.at if f.at is not None else round(rng.uniform(0.1, 0.6), 2)
        duration = f.duration if f.duration is not None else DEFAULT_DURATION[f.kind]
        wans = [wan_name(a, b) for a in range(1, networks + 1) for b in range(a + 1, networks + 1)]
        if f.target is not None:
            target, links = f.target, link_names(f.target, networks, hosts)
        elif f.kind in ("partition", "lossy-wan", "duplicate-frames") and not wans:
            raise ValueError(f"{f.kind} needs at least two networks")
        elif f.kind == "partition":
            target = rng.choice(wans)
            links = (target,)
        elif f.kind == "lossy-wan":
            target, links = "every WAN link", tuple(wans)
        elif f.kind == "lossy-lan":
            target = host_name(rng.randint(1, networks), rng.randrange(hosts))
            links = (target,)
        else:
            links = (rng.choice(wans), *(host_name(n, rng.randrange(hosts)) for n in range(1, networks + 1)))
            target = ", ".join(links)
        out.append(ScheduledFault(f.kind, at, duration, links, target))
    return out


def relay_target(link: str, center_address: Callable[[int], tuple[str, int]]) -> tuple[str, int]:
    """Where a link's relay connects on to: a host's center, or the higher-numbered
    center of a WAN link (the lower one dials, center_host/daemon.py ``_dial``)."""
    kind, _, rest = link.partition(":")
    if kind == "host":
        return center_address(int(rest.split(".")[0]))
    if kind == "wan":
        return center_address(max(int(x) for x in rest.split("-")))
    raise ValueError(f"not a link: {link!r}")


async def start_link_relays(nursery: trio.Nursery, links: Iterable[str],
                            center_address: Callable[[int], tuple[str, int]], *, seed: int = 0,
                            listen_host: str = "127.0.0.1") -> dict[str, Relay]:
    """Start one clean relay per link (faults are switched on later by :class:`LinkFaults`)
    and return them by link name. The daemon on the link's dialing side is then given
    ``relay.address`` instead of its center's or peer's: a host's ``--center``, the
    lower-numbered center's ``--peer`` address of the higher one. Used by the in-process
    cluster (dedupnet/harness/cluster.py) and meant for the process runner too."""
    relays = {}
    for link in dict.fromkeys(links):
        relay = Relay(relay_target(link, center_address), name=link, seed=seed, listen_host=listen_host)
        await nursery.start(relay.run)
        relays[link] = relay
    return relays


class LinkFaults:
    """Switches scheduled faults on and off on the relays as the crawl goes on.

    Call :meth:`tick` with the fraction of the crawl done; a fault starts at its ``at``,
    ends after its ``duration`` (seconds; None: never). :attr:`events` records what was
    done and when (trio time), :meth:`summary` adds the relays' counters.
    """

    def __init__(self, schedule: list[ScheduledFault], relays: dict[str, Relay], nursery: trio.Nursery):
        self.schedule = schedule
        self.relays = relays
        self.nursery = nursery
        self.started: set[int] = set()
        self.active: set[int] = set()
        self.events: list[dict] = []
        self.windows: dict[int, tuple[float, float | None]] = {}  # index -> (start, end)
        self.total = 0  # what progress is a fraction of (the caller's to set; for the report)

    @property
    def settled(self) -> bool:
        """No fault with an end is still on (the run may end only after a heal)."""
        return not any(self.schedule[i].duration is not None for i in self.active)

    def tick(self, progress: float) -> None:
        for i, f in enumerate(self.schedule):
            if i not in self.started and progress >= f.at:
                self._start(i)

    def _start(self, i: int) -> None:
        f = self.schedule[i]
        self.started.add(i)
        self.active.add(i)
        now = trio.current_time()
        self.windows[i] = (now, None)
        self.events.append({"t": now, "event": "start", "fault": f.describe()})
        log.warning("link fault: %s", f.describe())
        if f.kind == "partition":
            for link in f.links:
                self.relays[link].partition()
        else:
            self._apply()
        if f.duration is not None:
            self.nursery.start_soon(self._end_after, i, f.duration)

    async def _end_after(self, i: int, duration: float) -> None:
        await trio.sleep(duration)
        f = self.schedule[i]
        self.active.discard(i)
        now = trio.current_time()
        self.windows[i] = (self.windows[i][0], now)
        self.events.append({"t": now, "event": "end", "fault": f.describe()})
        log.warning("link fault over: %s", f.describe())
        if f.kind == "partition":
            for link in f.links:
                if not any(self.schedule[j].kind == "partition" and link in self.schedule[j].links
                           for j in self.active):
                    self.relays[link].heal()
        else:
            self._apply()

    def _apply(self) -> None:
        """Each relay's config: the merge of the active non-partition faults on its link."""
        for link, relay in self.relays.items():
            config = CLEAN
            for j in self.active:
                f = self.schedule[j]
                if f.kind != "partition" and link in f.links:
                    config = config.merged(LINK_DEFAULTS[f.kind])
            relay.config = config

    def summary(self, t0: float = 0.0) -> dict:
        """What was scheduled, what happened when (seconds after ``t0``), the relays' counters."""
        return {
            "faults": [f.describe() for f in self.schedule],
            "events": [{**e, "t": round(e["t"] - t0, 3)} for e in self.events],
            "relays": {name: dict(sorted(r.counters.items())) for name, r in sorted(self.relays.items())},
        }


def format_links(summary: dict) -> str:
    """Report lines for link faults: each event, then what the relays did, summed."""
    if not summary:
        return ""
    lines = [f"  link fault                  {e['event']:<5} at {e['t']:6.1f} s: {e['fault']}" for e in summary["events"]]
    total: Counter[str] = Counter()
    for counters in summary["relays"].values():
        total.update(counters)
    keys = ("messages", "delayed", "duplicated", "reordered", "dropped", "silent_dropped", "refused")
    did = ", ".join(f"{k} {total[k]:,}" for k in keys if total[k])
    resets = sum(v for k, v in total.items() if k.startswith("resets:"))
    lines.append(f"  relays ({len(summary['relays'])})                 {did}, connections reset {resets:,}")
    return "\n".join(lines)

"""``dedupnet center``: the center core wired to TCP, Redis and timers.

One reactor feeds the core one event at a time (messages, joins and leaves, timer
firings, look-up results); each event's writes go to Redis in one transaction before
its messages are sent, so an acknowledgement always follows durable storage.

Connections: LAN hosts connect to the center; of two peer centers the one with the
lower network id connects to the other, and that one connection carries both
networks' requests and answers. Every connection starts with a Register whose IP
must be the TCP source address (paper gap 2), and carries heartbeats; a member whose
heartbeats stop for ``heartbeat_timeout`` is closed and leaves (gap 3).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from dedupnet import wire
from dedupnet.aio import AsyncStore
from dedupnet.messages import Heartbeat, Register
from dedupnet.metrics import Counters, serve_metrics
from dedupnet.runtime import Reactor, Timers, control_session, until_stored
from dedupnet.store import Store
from dedupnet.transport import Connection, ConnectionClosed, connect_forever, serve

from . import protocol as cp
from .pools import WRITES, CenterPools

log = logging.getLogger("dedupnet.center")


@dataclass(frozen=True)
class PeerAddress:
    network: int
    host: str
    port: int
    cidr: str


@dataclass
class CenterSettings:
    network: int
    ip: str  # the address this center listens on and connects from
    port: int
    lan: str
    peers: list[PeerAddress] = field(default_factory=list)
    mode: str = "exact"
    answer_timeout: float = 2.0
    max_resends: int = 2
    resume_grace: float = 5.0
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 5.0
    max_frame_size: int = 4 * 1024 * 1024
    max_urls: int = 10_000
    metrics: tuple[str, int] | None = None
    #: Address to bind (e.g. 0.0.0.0); default ``ip``.
    listen_host: str | None = None


class CenterDaemon:
    def __init__(self, settings: CenterSettings, store: Store, counters: Counters | None = None):
        self.settings = settings
        self.counters = counters or Counters()
        config = cp.CenterConfig(
            network=settings.network, lan=settings.lan, peers={p.network: p.cidr for p in settings.peers},
            mode=settings.mode, answer_timeout=settings.answer_timeout, max_resends=settings.max_resends,
            resume_grace=settings.resume_grace,
        )
        self.core = cp.CenterProtocol(config, self.counters)
        self.pools = CenterPools(store)
        self.store = AsyncStore(store)
        self.conns: dict[cp.Member, Connection] = {}
        self.last_seen: dict[cp.Member, float] = {}
        self.reactor = Reactor(self.core.handle, self._execute)
        self.timers = Timers(self.reactor.post, cp.TimerFired)
        self.port = settings.port
        #: Called with the URLs of each admission (the simulation's latency measure).
        self.on_admit: Callable[[tuple[str, ...]], None] | None = None

    def register(self) -> Register:
        s = self.settings
        return Register(s.ip, s.network, "center", f"{s.ip}:{self.port}", s.lan)

    # -- running -------------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self.reactor.process(await until_stored(self.store, self.counters, self.pools.load))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.reactor.run)
            nursery.start_soon(self.timers.run)
            self.port = await nursery.start(self._serve)
            if self.settings.metrics:
                await nursery.start(serve_metrics, self.counters, *self.settings.metrics)
            for peer in self.settings.peers:
                if self.settings.network < peer.network:
                    nursery.start_soon(self._dial, peer)
            nursery.start_soon(self._heartbeats)
            log.info("center of network %d listening on %s:%d (LAN %s, %d peers, %s mode)", self.settings.network,
                     self.settings.ip, self.port, self.settings.lan, len(self.settings.peers), self.settings.mode)
            task_status.started(self.port)

    async def _serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await serve(self.settings.listen_host or self.settings.ip, self.settings.port, self._on_connection, counters=self.counters,
                    max_frame_size=self.settings.max_frame_size, max_urls=self.settings.max_urls,
                    accept_roles=("host", "center", "control"), task_status=task_status)

    async def _dial(self, peer: PeerAddress) -> None:
        await connect_forever(peer.host, peer.port, self.register(), self._peer_session,
                              local_ip=self.settings.ip, counters=self.counters,
                              max_frame_size=self.settings.max_frame_size, max_urls=self.settings.max_urls)

    async def _peer_session(self, conn: Connection) -> None:
        reply = await conn.receive(timeout=self.settings.heartbeat_timeout)  # the peer registers back
        if not isinstance(reply, Register) or reply.role != "center":
            raise ConnectionClosed(f"peer answered {type(reply).__name__}, not a center's Register")
        await self._member_session(conn, cp.Peer(reply.network))

    async def _on_connection(self, conn: Connection) -> None:
        reg = conn.register
        if reg.role == "control":
            return await self._control_session(conn)
        if reg.role == "host":
            if self.core.config.network_of(reg.IP) != self.settings.network:
                self.counters.inc("rejected", reason="host-not-in-lan")
                return await conn.close_with_error("host-not-in-lan", f"{reg.IP} is not in LAN {self.settings.lan}")
            return await self._member_session(conn, cp.Host(reg.IP))
        if reg.network not in self.core.config.peers:
            self.counters.inc("rejected", reason="unknown-peer")
            return await conn.close_with_error("unknown-peer", f"network {reg.network} is not a configured peer")
        conn.send_nowait(wire.encode(self.register()))
        await self._member_session(conn, cp.Peer(reg.network))

    async def _member_session(self, conn: Connection, member: cp.Member) -> None:
        old = self.conns.get(member)
        if old is not None:
            log.info("%s reconnected; closing its old connection", member)
            await old.aclose()
        self.conns[member] = conn
        self.last_seen[member] = trio.current_time()
        log.info("%s joined", member)
        await self.reactor.put(cp.Joined(member))
        try:
            while True:
                message = await conn.receive()
                self.last_seen[member] = trio.current_time()
                if not isinstance(message, Heartbeat):
                    await self.reactor.put(cp.Received(member, message))
        except ConnectionClosed:
            pass
        finally:
            if self.conns.get(member) is conn:
                del self.conns[member]
                self.last_seen.pop(member, None)
                log.info("%s left", member)
                self.reactor.post(cp.Left(member))

    async def _heartbeats(self) -> None:
        """Send ours to every member; gap 3: a member whose heartbeats stop is closed, and so leaves."""
        while True:
            await trio.sleep(self.settings.heartbeat_interval)
            beat = wire.encode(Heartbeat(self.settings.ip, trio.current_time()))
            for conn in list(self.conns.values()):
                conn.send_nowait(beat)
            limit = trio.current_time() - self.settings.heartbeat_timeout
            for member, seen in list(self.last_seen.items()):
                if seen < limit and member in self.conns:
                    self.counters.inc("heartbeat_missed")
                    log.warning("%s missed its heartbeats; it leaves", member)
                    await self.conns[member].aclose()

    # -- carrying out the core's actions --------------------------------------------------
    async def _execute(self, actions: list) -> list:
        if any(isinstance(a, WRITES) for a in actions):
            await until_stored(self.store, self.counters, self.pools.apply_steps, actions)
        followups = []
        for a in actions:
            if isinstance(a, cp.Send):
                for member in a.to:
                    conn = self.conns.get(member)
                    if conn is None or not conn.send_nowait(a.data):
                        self.counters.inc("send_skipped")  # gone: the timers or a rejoin catch up
            elif isinstance(a, cp.SetTimer):
                self.timers.set(a.number, a.delay)
            elif isinstance(a, cp.CancelTimer):
                self.timers.cancel(a.number)
            elif isinstance(a, cp.Admit) and self.on_admit is not None:
                self.on_admit(a.urls)
            elif isinstance(a, cp.Lookup):
                followups.append(functools.partial(until_stored, self.store, self.counters, self.pools.lookup_steps, a.number, a.urls))
        return followups

    # -- status ------------------------------------------------------------------------
    async def status(self) -> dict:
        now = trio.current_time()
        stages: dict[str, int] = {}
        for rec in self.core.sets.values():
            stages[rec.stage.value] = stages.get(rec.stage.value, 0) + 1
        return {
            "role": "center", "network": self.settings.network, "listen": f"{self.settings.ip}:{self.port}",
            "mode": self.settings.mode, "pools": await self.store.run(self.pools.sizes),
            "members": {str(m): round(now - t, 3) for m, t in sorted(self.last_seen.items(), key=str)},
            "sets_in_flight": stages, "timers": len(self.timers), "counters": self.counters.snapshot(),
        }

    async def _control_session(self, conn: Connection) -> None:
        await control_session(conn, self.status)

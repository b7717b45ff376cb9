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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from dedupnet.adapters.storage.store_choice import on_trio
from dedupnet.codec import wire
from dedupnet.codec.auth import keyring_from
from dedupnet.adapters.monitor.census import ask_hosts, build_report
from dedupnet.adapters.net.discovery import Responder, center_address, serve_discovery
from dedupnet.codec.messages import Ack, Heartbeat, Register, Task
from dedupnet.codec.settings import declared
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.codec.ages import RecrawlPolicy
from dedupnet.adapters.runtime import (Reactor, Timers, check_durable, check_memory, control_session, beat,
                                      heartbeat, keep_watermarks, open_watermarks, until_stored, watch_room)
from dedupnet.adapters.storage.watermark import Behind, Watermarks, log_reaches
from dedupnet.adapters.storage.store import Store
from dedupnet.adapters.net.tls import ServerTLS, TLSConfig, center_uri, client_context, server_context
from dedupnet.adapters.net.transport import Connection, ConnectionClosed, connect_forever, serve, watch_keyrings
from dedupnet.adapters.monitor.status_page import AGE_BUCKETS, OLDEST_SETS, member_order, serve_status

from .events import (Admit, CancelTimer, Conclude, Host, Joined, Left, Lookup, Member, Operator, Peer, Reassign,
                     Received, Reoffer, Resume, Save, Send, SetTimer, TimerFired)
from .config import CenterConfig
from .sets import task_parts
from .protocol import CenterProtocol
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
    #: The fields made with ``declared`` carry the operator's setting of that name
    #: (dedupnet/codec/settings.py: its default and help are there).
    mode: str = declared("mode")
    answer_timeout: float = declared("answer_timeout")
    max_resends: int = declared("max_resends")
    partition_policy: str | None = declared("partition_policy")  # None: by mode (CenterConfig)
    foreign_lookup: str | None = declared("foreign_lookup")  # None: by mode (CenterConfig)
    local_lookup: str | None = declared("local_lookup")  # None: by mode (CenterConfig)
    routing: str | None = declared("routing")  # None: by mode (CenterConfig): "home" in exact mode
    #: Each network's share of the sites under ``routing = "home"`` (1 if absent).
    weights: dict[int, float] = field(default_factory=dict)
    #: The maps in force before a change of the map (CenterConfig.previous_weights).
    previous_weights: tuple[dict[int, float], ...] = ()
    resume_grace: float = 5.0
    heartbeat_interval: float = declared("heartbeat_interval")
    heartbeat_timeout: float = declared("heartbeat_timeout")
    reissue_after: float = declared("reissue_after")
    max_frame_size: int = declared("max_frame_size")
    max_urls: int = declared("max_urls_per_set")
    compress: bool = declared("compress")
    #: ``--http`` (old name ``--metrics``): /metrics, the status page and /status.json.
    metrics: tuple[str, int] | None = None
    #: Address to bind (e.g. 0.0.0.0); default ``ip``.
    listen_host: str | None = None
    #: Key files (dedupnet/codec/auth.py). None: that role is trusted by its source
    #: address alone.
    lan_key_file: str | None = declared("lan_key_file")
    peer_key_file: str | None = declared("peer_key_file")
    key_poll_interval: float = declared("key_poll_interval")
    #: Limits against abuse (dedupnet/adapters/net/transport.py); None: no limit.
    max_connections_per_source: int | None = declared("max_connections_per_source")
    max_bytes_per_s: float | None = declared("max_bytes_per_s")
    max_messages_per_s: float | None = declared("max_messages_per_s")
    #: TLS with the peer centers (and with ``tls.lan_tls`` the hosts): dedupnet/adapters/net/tls.py.
    #: None: plain TCP, trusted by source address only (loopback simulations).
    tls: TLSConfig | None = None
    #: LAN discovery (dedupnet/adapters/net/discovery.py): answer hosts started with ``--center auto``
    #: on this UDP port (0: any free one). None: no responder, as in-process clusters
    #: want; ``dedupnet center`` turns it on by default (docs/DECISIONS.md).
    discovery_port: int | None = None
    #: Re-crawl by age (dedupnet/adapters/storage/recrawl.py): admitted URLs count as seen for their age
    #: only. None: for ever. Every center of the system must have the same policy.
    recrawl: RecrawlPolicy | None = None
    durable_acks: bool = declared("durable_acks")
    #: Assignments kept per host (``task_log:<host>``) to offer again if the host's store
    #: comes back behind what it acknowledged (dedupnet/adapters/storage/watermark.py); 0: none.
    rewind_log: int = 256


def core_config(settings: CenterSettings) -> CenterConfig:
    """The core's configuration from the daemon's settings: the one mapping, which the
    deterministic simulation (dedupnet/harness/dst) uses too, so both run the same core."""
    return CenterConfig(
        network=settings.network, lan=settings.lan, peers={p.network: p.cidr for p in settings.peers},
        mode=settings.mode, answer_timeout=settings.answer_timeout, max_resends=settings.max_resends,
        resume_grace=settings.resume_grace, partition_policy=settings.partition_policy,
        foreign_lookup=settings.foreign_lookup, local_lookup=settings.local_lookup, recrawl=settings.recrawl,
        routing=settings.routing, weights=settings.weights,
        previous_weights=settings.previous_weights, reissue_after=settings.reissue_after,
    )


class CenterDaemon:
    def __init__(self, settings: CenterSettings, store: Store, counters: Counters | None = None):
        self.settings = settings
        self.counters = counters or Counters()
        self.core = CenterProtocol(core_config(settings), self.counters)
        #: The highest store watermark heard from each member (set up by run()).
        self.marks = Watermarks(self.counters)
        self.pools = CenterPools(store, settings.recrawl, task_log=settings.rewind_log,
                                 step_of=lambda host: self.marks.step_of(host))
        self.store = on_trio(store)
        self.conns: dict[Member, Connection] = {}
        self.last_seen: dict[Member, float] = {}
        self.busy_with: set[Member] = set()  # members whose reader waits for our inbox
        #: Host IP -> (task_pool size its last heartbeat gave, trio time): what a host that
        #: went down holds, as far as this center heard (memory only).
        self.reported_tasks: dict[str, tuple[int, float]] = {}
        #: Peer network -> the listen address its Register gave (``status --cluster``
        #: asks it there when the configuration has no port for it).
        self.peer_listen: dict[int, str] = {}
        #: Operator requests waiting for the core's answer (set when it is sent).
        self._answered: dict[Operator, trio.Event] = {}
        #: number -> when this center stored the set (trio time): the status page's ages.
        self.set_since: dict[int, float] = {}
        #: The bound port of ``settings.metrics`` (the HTTP endpoint), once serving.
        self.http_port: int | None = None
        self.reactor = Reactor(self.core.handle, self._execute)
        self.timers = Timers(self.reactor.post, TimerFired)
        self.port = settings.port
        #: The UDP port discovery answers on, once bound (None: off, or it could not bind).
        self.discovery_port: int | None = None
        tls = settings.tls
        self.server_tls = None if tls is None else ServerTLS(
            server_context(tls), settings.network, ("center", "host") if tls.lan_tls else ("center",))
        self.client_tls = None if tls is None else client_context(tls)
        #: Called with the URLs of each admission (the simulation's latency measure).
        self.on_admit: Callable[[tuple[str, ...]], None] | None = None
        #: The LAN's and the peers' keyrings (None: not authenticated), re-read while running.
        self.lan_keyring = keyring_from(settings.lan_key_file)
        self.peer_keyring = keyring_from(settings.peer_key_file)

    def register(self) -> Register:
        s = self.settings
        homes = self.core.homes_described()
        return Register(s.ip, s.network, "center", f"{s.ip}:{self.port}", s.lan, homes=homes)

    async def _refused_map(self, conn: Connection, reg: Register) -> bool:
        """Every center must compute the same home for every site (docs/PROTOCOL.md §11):
        a peer that routes by another map, or broadcasts while we route, is refused."""
        ours = self.register().homes
        if reg.homes == ours:
            return False
        why = (f"network {reg.network} routes by homes {reg.homes or '(none: broadcast)'}, network "
               f"{self.settings.network} by {ours or '(none: broadcast)'}: give every center the same "
               f"networks, weights and routing")
        self.counters.inc("rejected", reason="map-mismatch")
        conn.note(logging.ERROR, "peer refused: %s", why, logger=log)
        await conn.close_with_error("map-mismatch", why)
        return True

    # -- running -------------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await check_memory(self.store, self.counters, self.pools.store)
        if self.settings.durable_acks:
            await check_durable(self.store, self.counters, self.pools.store)
        self.marks = await open_watermarks(self.store, self.counters, self.pools.store)
        resume = await until_stored(self.store, self.counters, self.pools.load)
        self._say_resumed(resume, await until_stored(self.store, self.counters, self.pools.admitted_total))
        await self.reactor.process(resume)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self.reactor.run)
            nursery.start_soon(keep_watermarks, self.store, self.counters, self.pools.store, self.marks,
                               self.settings.heartbeat_interval)
            nursery.start_soon(self.timers.run)
            nursery.start_soon(watch_room, self.store, self.counters)
            self.port = await nursery.start(self._serve)
            if self.settings.discovery_port is not None:
                self.discovery_port = await nursery.start(self._answer_discovery)
            if self.settings.metrics:
                self.http_port = await nursery.start(functools.partial(
                    serve_status, self.counters, *self.settings.metrics, self.status, self.pools.store,
                    crawl=self.crawl_report))
            for peer in self.settings.peers:
                if self.settings.network < peer.network:
                    nursery.start_soon(self._dial, peer)
            nursery.start_soon(self._heartbeats)
            nursery.start_soon(watch_keyrings, [self.lan_keyring, self.peer_keyring], self.counters,
                               self.settings.key_poll_interval)
            log.info("center of network %d listening on %s:%d (LAN %s, %d peers, %s mode)", self.settings.network,
                     self.settings.ip, self.port, self.settings.lan, len(self.settings.peers), self.settings.mode)
            if self.settings.recrawl is not None:
                log.info("re-crawl by age: a URL counts as seen for %s", self.settings.recrawl.describe())
            task_status.started(self.port)

    def _say_resumed(self, resume: Resume, admitted: int) -> None:
        """One line when the store is not new: a center started again on an old data
        directory goes on from what it holds (and a crawl it finished stays finished),
        which an operator who meant a fresh start must be told."""
        if not (admitted or resume.sets or resume.tasks or resume.hosts):
            return
        assigned = sum(len(urls) for urls in resume.tasks.values())
        log.warning("resuming from an existing store (%s, prefix %s): %d URLs admitted before, %d sets in flight, "
                    "%d task URLs not acknowledged by their hosts, %d known hosts", self.pools.store.url,
                    self.pools.store.prefix, admitted, len(resume.sets), assigned, len(resume.hosts))

    async def _serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await serve(self.settings.listen_host or self.settings.ip, self.settings.port, self._on_connection, counters=self.counters,
                    max_frame_size=self.settings.max_frame_size, max_urls=self.settings.max_urls,
                    accept_roles=("host", "center", "control"), compress=self.settings.compress,
                    keyrings={"host": self.lan_keyring, "control": self.lan_keyring, "center": self.peer_keyring},
                    max_connections_per_source=self.settings.max_connections_per_source,
                    max_bytes_per_s=self.settings.max_bytes_per_s, max_messages_per_s=self.settings.max_messages_per_s,
                    tls=self.server_tls,
                    task_status=task_status)

    async def _answer_discovery(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Tell the LAN's hosts where this center listens (paper gap 5). A center that
        cannot (an IPv6 LAN, a port in use) logs why and serves its hosts all the same."""
        s = self.settings
        try:
            responder = Responder(s.network, s.lan, center_address(s.listen_host, s.ip, s.lan, self.port),
                                  self.lan_keyring, self.counters)
        except ValueError as exc:
            self.counters.inc("discovery_failed", reason="address")
            log.error("discovery off: %s", exc)
            task_status.started(None)
            return
        await serve_discovery(responder, s.discovery_port, task_status=task_status)

    async def _dial(self, peer: PeerAddress) -> None:
        await connect_forever(peer.host, peer.port, self.register(), self._peer_session,
                              local_ip=self.settings.ip, counters=self.counters,
                              max_frame_size=self.settings.max_frame_size, max_urls=self.settings.max_urls,
                              compress=self.settings.compress, keyring=self.peer_keyring,
                              **self._peer_tls(peer))

    def _peer_tls(self, peer: PeerAddress) -> dict:
        """TLS to a peer: its certificate must name the network we dial (dedupnet/adapters/net/tls.py)."""
        if self.client_tls is None:
            return {}
        return {"tls_context": self.client_tls, "expect_uri": center_uri(peer.network)}

    async def _peer_session(self, conn: Connection) -> None:
        reply = await conn.receive(timeout=self.settings.heartbeat_timeout)  # the peer registers back
        if not isinstance(reply, Register) or reply.role != "center":
            raise ConnectionClosed(f"peer answered {type(reply).__name__}, not a center's Register")
        if await self._refused_map(conn, reply):
            raise ConnectionClosed("map-mismatch")
        self.peer_listen[reply.network] = reply.listen
        await self._member_session(conn, Peer(reply.network))

    async def _on_connection(self, conn: Connection) -> None:
        reg = conn.register
        if reg.role == "control":
            return await self._control_session(conn)
        if reg.role == "host":
            if self.core.config.network_of(reg.IP) != self.settings.network:
                return await self._refuse(conn, "host-not-in-lan", f"{reg.IP} is not in LAN {self.settings.lan}")
            if reg.network != self.settings.network:
                return await self._refuse(conn, "wrong-network", f"host {reg.IP} registered for network "
                                          f"{reg.network}; this is the center of network {self.settings.network}")
            return await self._member_session(conn, Host(reg.IP))
        if reg.network not in self.core.config.peers:
            return await self._refuse(conn, "unknown-peer", f"network {reg.network} is not a configured peer")
        if await self._refused_map(conn, reg):
            return
        conn.send_nowait(wire.encode(self.register()))
        self.peer_listen[reg.network] = reg.listen
        await self._member_session(conn, Peer(reg.network))

    async def _refuse(self, conn: Connection, reason: str, text: str) -> None:
        """A registration this center does not take: counted, one line (under the
        per-source log budget), the reason sent back, the connection closed."""
        self.counters.inc("rejected", reason=reason)
        conn.note(logging.WARNING, "refused %s: %s: %s", conn.peer, reason, text, logger=log)
        await conn.close_with_error(reason, text)

    async def _member_session(self, conn: Connection, member: Member) -> None:
        old = self.conns.get(member)
        if old is not None:
            conn.note(logging.INFO, "%s reconnected; closing its old connection", member, logger=log)
            await old.aclose()
        self.conns[member] = conn
        self.last_seen[member] = trio.current_time()
        conn.note(logging.INFO, "%s joined", member, logger=log)
        address = conn.register.listen if isinstance(member, Host) and conn.register is not None else ""
        # A peer's events go ahead of the hosts' (Reactor: the urgent lane), all of them.
        urgent = isinstance(member, Peer)
        await self.reactor.put(Joined(member, address), conn, urgent=urgent)
        try:
            while True:
                message = await conn.receive()
                self.last_seen[member] = trio.current_time()
                if isinstance(message, Heartbeat):
                    if message.tasks is not None and isinstance(member, Host):
                        self.reported_tasks[member.ip] = (message.tasks, trio.current_time())
                    behind = self.marks.hear(str(member), message.store) if message.store else None
                    if behind is not None:
                        self._nursery.start_soon(self._reoffer, member, behind)
                else:
                    # While our own inbox is full this member's silence is ours, not its own.
                    self.busy_with.add(member)
                    try:
                        await self.reactor.put(Received(member, message), conn, urgent=urgent)
                    finally:
                        self.busy_with.discard(member)
                        self.last_seen[member] = trio.current_time()
        except ConnectionClosed:
            pass
        finally:
            if self.conns.get(member) is conn:
                del self.conns[member]
                self.last_seen.pop(member, None)
                conn.note(logging.INFO, "%s left", member, logger=log)
                self.reactor.post(Left(member), urgent=urgent)

    async def _heartbeats(self) -> None:
        """Send ours to every member we sent nothing else to during the last interval (any
        message counts as a heartbeat, so a busy link carries none: they were a large part
        of a WAN link's messages); gap 3: a member whose heartbeats stop is closed, and so
        leaves. Slow is not dead: a member whose message waits for room in our own inbox is
        not silent, and a pause of this daemon (an overloaded event loop, a GC or VM
        freeze) is not counted against anyone."""
        interval = self.settings.heartbeat_interval
        last = trio.current_time()
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            stalled, last = max(0.0, now - last - interval), now
            ours, lean = heartbeat(self.settings.ip, store=self.pools.store.watermark), heartbeat(self.settings.ip)
            for member, conn in list(self.conns.items()):
                # A control client is never a member. A busy link still carries our store
                # watermark now and then, and at once on a new connection (a store that came
                # back behind is noticed by what it reports: dedupnet/adapters/storage/watermark.py).
                if isinstance(member, Operator):
                    continue
                beat(conn, ours, interval, lean)
            limit = now - self.settings.heartbeat_timeout
            for member, seen in list(self.last_seen.items()):
                seen = self.last_seen[member] = now if member in self.busy_with else seen + stalled
                if seen < limit and member in self.conns:
                    self.counters.inc("heartbeat_missed")
                    log.warning("%s missed its heartbeats: silent for %.1f s (heartbeat timeout %g s); it leaves",
                                member, now - seen, self.settings.heartbeat_timeout)
                    await self.conns[member].aclose()

    async def _reoffer(self, member: Member, behind: Behind) -> None:
        """A member's store came back behind: a host is assigned again what its log
        holds (it drops on arrival what its store still has); a peer center is only
        reported, nothing handed to it is logged here."""
        if not isinstance(member, Host):
            self.counters.inc("rewind_unrepaired", member=str(member))
            log.error("%s: what was routed to it and acknowledged since its step %d may be lost; this center "
                      "keeps no log of it", member, behind.now[1])
            return
        entries, tasks = await until_stored(self.store, self.counters, self.pools.task_log_steps, member.ip)
        if not log_reaches(entries, self.settings.rewind_log, behind):
            self.counters.inc("rewind_unrepaired", member=str(member))
            log.error("%s: the log of its last %d assignments may not reach back to its step %d; tasks "
                      "assigned before them may be lost", member, len(entries), behind.now[1])
        log.warning("%s: %d tasks of its last %d assignments offered again", member,
                    sum(len(u) for u in tasks.values()), len(entries))
        await self.reactor.put(Reoffer(member.ip, tasks))

    # -- carrying out the core's actions --------------------------------------------------
    async def _execute(self, actions: list) -> list:
        if any(isinstance(a, WRITES) for a in actions):
            sends = any(isinstance(a, Send) for a in actions)
            await until_stored(self.store, self.counters, self.pools.apply_steps, actions, sends)
        followups = []
        for a in actions:
            if isinstance(a, Save):
                self.set_since.setdefault(a.number, trio.current_time())
            elif isinstance(a, Conclude):
                self.set_since.pop(a.number, None)
            elif isinstance(a, Send):
                for member in a.to:
                    if member in self._answered:
                        self._answered[member].set()
                    conn = self.conns.get(member)
                    if conn is None or not conn.send_nowait(a.data):
                        self.counters.inc("send_skipped")  # gone: the timers or a rejoin catch up
            elif isinstance(a, SetTimer):
                self.timers.set(a.number, a.delay)
            elif isinstance(a, CancelTimer):
                self.timers.cancel(a.number)
            elif isinstance(a, Admit) and self.on_admit is not None:
                self.on_admit(a.urls)
            elif isinstance(a, Lookup):
                followups.append(functools.partial(until_stored, self.store, self.counters, self.pools.lookup_steps, a.number, a.urls))
        return followups

    # -- status ------------------------------------------------------------------------
    async def status(self) -> dict:
        now = trio.current_time()
        stages: dict[str, int] = {}
        for rec in self.core.stages.sets.values():
            stages[rec.stage.value] = stages.get(rec.stage.value, 0) + 1
        return {
            "role": "center", "network": self.settings.network, "listen": f"{self.settings.ip}:{self.port}",
            "lan": self.settings.lan,
            "mode": self.settings.mode, "pools": await self.store.run(self.pools.sizes),
            "admitted_total": await self.store.run(self.pools.admitted_total),
            "members": {str(m): round(now - t, 3) for m, t in sorted(self.last_seen.items(), key=str)},
            "sets_in_flight": stages, "waiting_for": self.core.stages.waiting_for(), "timers": len(self.timers),
            "routing": self.core.config.routing,
            "waiting_for_networks": {f"net:{n}": k for n, k in sorted(self.core.stages.routed_waiting().items())},
            "partition_policy": self.core.config.partition_policy, "counters": self.counters.snapshot(),
            "store_watermark": self.pools.store.watermark,
            **center_detail(self),
        }

    async def crawl_report(self) -> dict:
        """This network's verdict for the status page (dedupnet/adapters/monitor/census.py): its
        sets and tasks, and what its live hosts say; the whole system's needs every
        network's key (``dedupnet status --cluster``)."""
        report = build_report(await ask_hosts(await self.status(), [self.lan_keyring]))
        return {"verdict": report["verdict"], "reasons": report["reasons"], "hosts": report["networks"][0]["hosts"]}

    async def _control_session(self, conn: Connection) -> None:
        """``dedupnet status``, and ``dedupnet reassign``: a Task naming the gone host,
        answered with the core's Ack once its writes are stored."""
        operator = Operator(str(conn.peer))

        async def reassign(message) -> None:
            if not isinstance(message, Task) or message.IP is None:
                self.counters.inc("rejected", reason="unexpected-message")
                conn.send_nowait(wire.encode(Ack(getattr(message, "number", 0), "rejected", "unexpected-message")))
                return
            answered = self._answered[operator] = trio.Event()
            self.conns[operator] = conn
            try:
                await self.reactor.put(Reassign(message.IP, message.number, message.URLs, operator), conn)
                await answered.wait()
            finally:
                self.conns.pop(operator, None)
                self._answered.pop(operator, None)

        await control_session(conn, self.status, reassign)


def host_detail(daemon: "CenterDaemon", ip: str, now: float) -> dict:
    """What a center's liveness row adds for a LAN host: one of the LAN's hosts (until
    it leaves), its ledger (URLs given to it, not reported finished: docs/PROTOCOL.md
    section 12) and the task_pool its last heartbeat gave."""
    reported = daemon.reported_tasks.get(ip)
    return {"known": ip in daemon.core.members.known, "ledger": len(daemon.core.members.ledger.get(ip, ())),
            "task_pool": None if reported is None else reported[0],
            "task_pool_age": None if reported is None else round(now - reported[1], 3)}


def center_detail(daemon: "CenterDaemon") -> dict:
    """What ``CenterDaemon.status()`` adds for the page and ``dedupnet status --json``:
    each member's liveness (paper gap 3: a member silent for ``heartbeat_timeout``
    leaves), sets in flight by stage and age (§2.3, §2.4), the oldest of them one by
    one, and ``task_URL`` per host (gap 8). Ages count from when this center stored the
    set (``CenterDaemon.set_since``); a set resumed after a restart, from the restart."""
    now = trio.current_time()
    core, since = daemon.core, daemon.set_since
    for number in [n for n in since if n not in core.stages.sets]:
        del since[number]  # concluded by a path that did not pass _execute (never expected)
    for number in core.stages.sets:
        since.setdefault(number, now)

    stages: dict[str, dict] = {}
    for rec in core.stages.sets.values():
        age = now - since[rec.number]
        st = stages.setdefault(rec.stage.value, {"count": 0, "urls": 0, "oldest": 0.0,
                                                 "ages": {label: 0 for _, label in AGE_BUCKETS}})
        st["count"] += 1
        st["urls"] += len(rec.frame.URL_set)
        st["oldest"] = round(max(st["oldest"], age), 3)
        st["ages"][next(label for bound, label in AGE_BUCKETS if age < bound)] += 1
    oldest = sorted(core.stages.sets.values(), key=lambda r: (since[r.number], r.number))[:OLDEST_SETS]

    tasks: Counter[str] = Counter()
    for key, urls in core.members.tasks.items():
        tasks[task_parts(key)[1]] += len(urls)  # "" = admitted while no host was there

    s = daemon.settings
    # max: the daemon moves last_seen forward over its own pauses (CenterDaemon._heartbeats).
    silent = {str(m): max(0.0, now - t) for m, t in daemon.last_seen.items() if not isinstance(m, Operator)}
    waiting = core.stages.waiting_for()
    addresses = {f"net:{p.network}": f"{p.host}:{p.port}" if p.port else  # 0: it dials us (its Register says where)
                 daemon.peer_listen.get(p.network, p.host) for p in s.peers}
    addresses.update({ip: address for ip, address in core.members.known.items() if address})
    names = (set(silent) | {f"net:{p.network}" for p in s.peers} | set(waiting) | {h for h in tasks if h}
             | set(core.members.known) | set(core.members.ledger))
    liveness = []
    for name in sorted(names, key=lambda n: (n.startswith("net:"), member_order(n))):
        quiet = silent.get(name)
        state = "down" if quiet is None else "live" if quiet <= 2 * s.heartbeat_interval else "late"
        entry = {"member": name, "kind": "peer" if name.startswith("net:") else "host",
                 "address": addresses.get(name, name), "state": state,
                 "silent": None if quiet is None else round(quiet, 3),
                 "waiting_sets": waiting.get(name, 0), "task_urls": tasks.get(name, 0)}
        if entry["kind"] == "host":
            entry.update(host_detail(daemon, name, now))
        liveness.append(entry)
    return {
        "heartbeat": {"interval": s.heartbeat_interval, "timeout": s.heartbeat_timeout},
        "liveness": liveness,
        "sets": dict(sorted(stages.items())),
        "oldest_sets": [{"number": r.number, "stage": r.stage.value, "origin": r.origin,
                         "age": round(now - since[r.number], 3), "urls": len(r.frame.URL_set),
                         "awaiting": sorted(r.awaiting), "attempts": r.attempts} for r in oldest],
        "task_URL_per_host": dict(sorted(tasks.items())),
        "ledger": sum(map(len, core.members.ledger.values())),
        "frames_held": len(core.stages.waiting),
    }

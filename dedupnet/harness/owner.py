"""The hash-partitioned owner baseline (a DHT crawler's: Kademlia-style): every URL goes
to the one host that owns its fingerprint, which de-dups and queues it. One message per
URL instead of the paper's broadcast, on the same workload, for ``dedupnet sim``.

Choices (documented here because the comparison depends on them):

* **Ring**: all hosts of all networks form one flat ring, no centers. The owner of a URL
  is the configured host of highest rendezvous weight ``xxh3_64(ip, seed=fingerprint)``
  over **all configured hosts**, not the live ones: as in a DHT without replicas, a dead
  owner's URLs wait (pending at their senders) until it is back; nothing is re-homed,
  so no URL can end in two task_pools.
* **Links**: one TCP connection per pair, the lower IP dials the higher (as the centers
  do); both directions use it. Each side registers with role ``host`` from its own IP
  (``verify_source``); heartbeats every ``heartbeat_interval``, a silent link is closed
  after ``heartbeat_timeout`` and its unacknowledged URLs are sent again.
* **One message per URL_pool entry**: ``Task(0, (url,))``. The sender does no de-dup of
  its own (the owner is the only judge); an entry repeated in URL_pool is sent again.
* **Nothing lost**: an entry leaves ``URL_pool`` (XACK+XDEL) only after its owner
  stored it: the owner answers, per connection, with a cumulative
  ``Ack(number=<Tasks of this connection stored so far>, "stored")``, one per batch it
  processed, sent after its task_pool write. TCP keeps a connection's messages in order,
  so the sender acknowledges the oldest ones in flight. A lost link puts its in-flight
  entries back in front of the peer's queue; a restart re-reads the pending entries of
  URL_pool. A re-sent URL the owner already queued is dropped there (``task_pool:fp``).
  Locally owned entries leave URL_pool in the same transaction that queues them.
* **Owner side**: one serial processor drains what has arrived (local and remote, up to
  ``batch`` items), does one look-up (finish_URL + task_pool:fp) and one transaction
  (AddTasks, Forget of local entries) per batch.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio
import xxhash

from dedupnet.adapters.storage.store_choice import on_trio, store_for
from local_host import protocol as hp
from local_host.pools import GROUP, WALKER, HostPools

from dedupnet.codec import wire
from dedupnet.harness.cluster import host_ip
from dedupnet.codec.messages import Ack, Register, Task
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.runtime import control_session, heartbeat, until_stored
from dedupnet.adapters.storage.store import URL_POOL, Store
from dedupnet.adapters.net.transport import Connection, connect_forever, serve
from dedupnet.codec.urls import fingerprint

log = logging.getLogger("dedupnet.harness.owner")


@dataclass
class OwnerSettings:
    ip: str
    hosts: list[tuple[str, int]]  # the whole ring, this host included; ports of lower IPs unused
    network: int = 0
    port: int = 0  # own listening port (peers and status tools); 0 picks a free one
    batch: int = 1000  # URL_pool entries per take; items per owner-side batch
    window: int = 512  # Tasks in flight per peer before waiting for an Ack
    max_outstanding: int = 20_000  # entries taken and not yet handed on, before the walker pauses
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 5.0
    idle_poll: float = 0.05
    max_queue: int = 4096  # transport send queue per connection (> window + Acks + heartbeats)


def owner_of(url: str, ring: list[str]) -> str:
    """Rendezvous (highest random weight) hashing of the URL's 64-bit fingerprint."""
    fp = fingerprint(url)
    return max(ring, key=lambda ip: (xxhash.xxh3_64_intdigest(ip.encode(), seed=fp), ip))


@dataclass(eq=False)
class _Session:
    conn: Connection
    inflight: collections.deque = field(default_factory=collections.deque)  # (id, url) sent, unacked
    acked: int = 0  # our Tasks the peer has stored
    received: int = 0  # the peer's Tasks we have stored (number of our next Ack)


class OwnerDaemon:
    def __init__(self, settings: OwnerSettings, store: Store, counters: Counters | None = None):
        self.settings = s = settings
        self.counters = counters or Counters()
        self.pools = HostPools(store, exact=True)
        self.store = on_trio(store)
        self.ring = sorted({ip for ip, _ in s.hosts} | {s.ip})
        self.addresses = dict(s.hosts)
        self.port = s.port
        self.sessions: dict[str, _Session] = {}
        self.waiting: dict[str, collections.deque] = {ip: collections.deque() for ip in self.ring if ip != s.ip}
        self._inbox, self._inbox_out = trio.open_memory_channel(4 * s.batch)
        self._local = 0  # own entries handed to the processor, not yet written
        self._busy = False
        self._opts = {"max_queue": s.max_queue, "counters": self.counters}

    def owner_of(self, url: str) -> str:
        return owner_of(url, self.ring)

    # -- running -------------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        s = self.settings
        await until_stored(self.store, self.counters, self.pools.setup)
        pending = await until_stored(self.store, self.counters, lambda: self.pools.store.stream_take(
            URL_POOL, GROUP, WALKER, 1 << 30, pending=True))  # taken before a restart, never handed on
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._process)
            if pending:
                log.info("%d URLs taken before a restart and not handed on: routing them again", len(pending))
                await self._route(pending)
            self.port = await nursery.start(lambda task_status: serve(
                s.ip, s.port, self._on_connection, accept_roles=("host", "control"),
                task_status=task_status, **self._opts))
            me = ipaddress.ip_address(s.ip)
            for ip in self.waiting:
                if me < ipaddress.ip_address(ip):
                    nursery.start_soon(lambda ip=ip: connect_forever(
                        ip, self.addresses[ip], self._register(), lambda conn: self._session(ip, conn),
                        local_ip=s.ip, **self._opts))
            nursery.start_soon(self._walk)
            nursery.start_soon(self._heartbeats)
            log.info("owner host %s on port %d, ring of %d", s.ip, self.port, len(self.ring))
            task_status.started(self.port)

    def _register(self) -> Register:
        return Register(self.settings.ip, self.settings.network, "host", f"{self.settings.ip}:{self.port}")

    async def _on_connection(self, conn: Connection) -> None:
        if conn.register.role == "control":
            return await control_session(conn, self.status)
        ip = conn.register.IP
        if ip not in self.waiting:
            return await conn.close_with_error("bad-role", f"{ip} is not a peer in this ring")
        await self._session(ip, conn)

    async def _session(self, ip: str, conn: Connection) -> None:
        old, sess = self.sessions.get(ip), _Session(conn)
        self.sessions[ip] = sess
        if old is not None:  # the peer reconnected before we saw its old link die
            await old.conn.aclose(flush_timeout=0)  # its session ends, its in-flight go here
        self._pump(ip)
        try:
            while True:
                msg = await conn.receive(timeout=self.settings.heartbeat_timeout)
                if isinstance(msg, Task):
                    await self._inbox.send((sess, None, msg.URLs))
                elif isinstance(msg, Ack):
                    await self._acked(ip, sess, msg.number)
        except trio.TooSlowError:
            log.info("peer %s silent for %.1f s: closing", ip, self.settings.heartbeat_timeout)
            self.counters.inc("owner_peer_timeout")
        finally:
            if self.sessions.get(ip) is sess:
                del self.sessions[ip]
            self.waiting[ip].extendleft(reversed(sess.inflight))  # sent again, in order
            sess.inflight.clear()
            self._pump(ip)  # a newer session to the same peer, if any

    async def _heartbeats(self) -> None:
        while True:
            data = heartbeat(self.settings.ip)
            for sess in list(self.sessions.values()):
                sess.conn.send_nowait(data)
            await trio.sleep(self.settings.heartbeat_interval)

    # -- sending -------------------------------------------------------------------------
    async def _walk(self) -> None:
        s = self.settings
        while True:
            if self.outstanding()["total"] < s.max_outstanding:
                entries = await until_stored(self.store, self.counters, self.pools.take, s.batch)
                if entries:
                    await self._route(entries)
                    continue
            await trio.sleep(s.idle_poll)

    async def _route(self, entries: list[tuple[bytes, str]]) -> None:
        local = []
        for eid, url in entries:
            owner = self.owner_of(url)
            if owner == self.settings.ip:
                local.append((None, eid, (url,)))
            else:
                self.waiting[owner].append((eid, url))
        for ip in self.waiting:
            self._pump(ip)
        self.counters.inc("owner_urls_local", len(local))
        self._local += len(local)
        for item in local:
            await self._inbox.send(item)

    def _pump(self, ip: str) -> None:
        sess, queue = self.sessions.get(ip), self.waiting[ip]
        if sess is None:
            return
        sent = 0
        while queue and len(sess.inflight) < self.settings.window:
            eid, url = queue[0]
            if not sess.conn.send_nowait(wire.encode(Task(0, (url,)))):
                break  # closed: the session's end puts its in-flight entries back
            queue.popleft()
            sess.inflight.append((eid, url))
            sent += 1
        self.counters.inc("owner_messages_sent", sent)

    async def _acked(self, ip: str, sess: _Session, number: int) -> None:
        count = min(number - sess.acked, len(sess.inflight))
        sess.acked = number
        ids = tuple(sess.inflight.popleft()[0] for _ in range(max(count, 0)))
        self._pump(ip)
        if ids:  # until this is written the entries are still in URL_pool (so not quiescent)
            await until_stored(self.store, self.counters, self.pools.apply, [hp.Forget(ids)])

    # -- owning --------------------------------------------------------------------------
    async def _process(self) -> None:
        while True:
            items = [await self._inbox_out.receive()]
            self._busy = True
            self.counters.inc("owner_batches")
            while len(items) < self.settings.batch:
                try:
                    items.append(self._inbox_out.receive_nowait())
                except trio.WouldBlock:
                    break
            urls = [u for _, _, us in items for u in us]
            unique = tuple(dict.fromkeys(urls))
            done = await until_stored(self.store, self.counters, self.pools.lookup,
                                      hp.Lookup(("task", 0), unique))
            new = tuple(u for u, seen in zip(unique, done.seen) if not seen)
            local = tuple(eid for sess, eid, _ in items if sess is None)
            await until_stored(self.store, self.counters, self.pools.apply, [hp.AddTasks(new), hp.Forget(local)])
            self.counters.inc("owner_urls_new", len(new))
            self.counters.inc("owner_urls_dropped", len(urls) - len(new))
            self._local -= len(local)
            for sess, n in collections.Counter(sess for sess, _, _ in items if sess is not None).items():
                sess.received += n
                sess.conn.send_nowait(wire.encode(Ack(sess.received, "stored")))  # closed: peer re-sends
            self._busy = False

    # -- for the harness -----------------------------------------------------------------
    def outstanding(self) -> dict[str, int]:
        """What this host holds in memory and has not finished: entries waiting for a link,
        Tasks sent and not acknowledged, items received or routed and not yet written."""
        out = {"waiting": sum(map(len, self.waiting.values())),
               "in_flight": sum(len(s.inflight) for s in self.sessions.values()),
               "inbox": self._inbox.statistics().current_buffer_used + self._busy, "local": self._local}
        out["total"] = out["waiting"] + out["in_flight"] + out["local"]
        return out

    async def quiescent(self) -> bool:
        """URL_pool empty (every entry handed on and acknowledged, or queued here) and
        nothing outstanding in memory."""
        o = self.outstanding()
        if o["total"] or o["inbox"]:
            return False
        return (await until_stored(self.store, self.counters, self.pools.sizes))[URL_POOL] == 0

    async def status(self) -> dict:
        return {"role": "owner", "ip": self.settings.ip, "network": self.settings.network,
                "ring": len(self.ring), "connected": sorted(self.sessions),
                "pools": await self.store.run(self.pools.sizes), "outstanding": self.outstanding(),
                "counters": self.counters.snapshot()}


@dataclass
class OwnerCluster:
    redis_url: str
    prefix: str
    timing: dict
    ring: dict[str, int] = field(default_factory=dict)  # ip -> port (0 until started)
    network_of: dict[str, int] = field(default_factory=dict)
    hosts: dict[str, OwnerDaemon] = field(default_factory=dict)
    stores: dict[str, Store] = field(default_factory=dict)
    scopes: dict[str, tuple[trio.CancelScope, trio.Event]] = field(default_factory=dict)
    nursery: trio.Nursery | None = None

    async def start_host(self, ip: str) -> OwnerDaemon:
        if ip not in self.stores:
            self.stores[ip] = store_for(self.redis_url, f"{self.prefix}:host:{ip}")
        timing = {k: v for k, v in self.timing.items() if k in OwnerSettings.__dataclass_fields__}
        daemon = OwnerDaemon(OwnerSettings(ip, list(self.ring.items()), self.network_of[ip], self.ring[ip],
                                           **timing), self.stores[ip])

        async def run(task_status=trio.TASK_STATUS_IGNORED):
            self.scopes[ip] = scope, ended = trio.CancelScope(), trio.Event()
            try:
                with scope:
                    await daemon.run(task_status=task_status)
            finally:
                ended.set()
        self.ring[ip] = await self.nursery.start(run)
        self.hosts[ip] = daemon
        return daemon

    async def kill(self, ip: str) -> None:
        """Stop one daemon at once, as a crash would: its memory is gone, its Redis stays."""
        scope, ended = self.scopes.pop(ip)
        scope.cancel()
        await ended.wait()  # its sockets are closed: the port can be bound again

    async def restart_host(self, ip: str) -> OwnerDaemon:
        if ip in self.scopes:  # not killed already
            await self.kill(ip)
        return await self.start_host(ip)  # same port: lower IPs dial it there again

    async def quiescent(self) -> bool:
        """Every host quiescent: every URL_pool empty, nothing waiting, in flight or unwritten."""
        return all([await h.quiescent() for h in self.hosts.values()])

    async def wait_quiescent(self, poll: float = 0.05) -> None:
        while not await self.quiescent():
            await trio.sleep(poll)

    async def wait_connected(self) -> None:
        while any(len(h.sessions) < len(self.ring) - 1 for h in self.hosts.values()):
            await trio.sleep(0.02)

    def close(self) -> None:
        for store in self.stores.values():
            store.delete_prefix()
            store.close()


@asynccontextmanager
async def open_owner_cluster(redis_url: str, networks: int, hosts: int, *, prefix: str = "sim",
                             **timing) -> AsyncIterator[OwnerCluster]:
    """networks × hosts owner daemons at 127.0.L.(10+i) (the protocol's host addresses),
    each on ``{prefix}:host:{ip}``; started highest IP first, so each dials peers already
    listening; yields once every pair is connected; on exit stops them all and removes
    the keys. ``timing`` takes any OwnerSettings field (others, e.g. ``mode``, are ignored)."""
    cluster = OwnerCluster(redis_url, prefix, timing)
    for n in range(1, networks + 1):
        for i in range(hosts):
            cluster.ring[host_ip(n, i)] = 0
            cluster.network_of[host_ip(n, i)] = n
    try:
        async with trio.open_nursery() as nursery:
            cluster.nursery = nursery
            for ip in sorted(cluster.ring, key=ipaddress.ip_address, reverse=True):
                await cluster.start_host(ip)
            await cluster.wait_connected()
            yield cluster
            nursery.cancel_scope.cancel()
    finally:
        cluster.close()

"""A whole system on one machine: L centers and L×H hosts as trio tasks, real TCP on
loopback addresses (center of network L at 127.0.L.1, hosts at 127.0.L.10+), real
Redis (one server, a key prefix per daemon). The tests and ``dedupnet sim`` use it.

Links named in ``open_cluster(links=...)`` (``wan:A-B`` between two centers, ``host:N.I``
between a host and its center) go through a fault-injecting relay
(:mod:`dedupnet.harness.relay`): the daemon that dials — the host, or the lower-numbered
center (``CenterDaemon._dial``) — is given the relay's address instead of its
center's or peer's, and the relay connects on from the daemon's own address, so the
center's source-address check (PROTOCOL.md gap 2) sees the real client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import trio

from dedupnet.adapters.storage.store_choice import store_for
from center_host.daemon import CenterDaemon, CenterSettings, PeerAddress
from local_host.daemon import LocalDaemon, LocalSettings

from dedupnet.harness.relay import Relay, host_name, start_link_relays, wan_name
from dedupnet.adapters.storage.store import URL_POOL, Store
from dedupnet.adapters.net.tls import TLSConfig


def lan(network: int) -> str:
    return f"127.0.{network}.0/24"


def center_ip(network: int) -> str:
    return f"127.0.{network}.1"


def host_ip(network: int, index: int) -> str:
    return f"127.0.{network}.{10 + index}"


def network_of_host(ip: str) -> int | None:
    """The network of a host address of this layout (127.0.N.x: N); None for any other."""
    parts = ip.split(".")
    if len(parts) != 4 or parts[:2] != ["127", "0"] or not parts[2].isdigit() or parts[2] == "0":
        return None
    return int(parts[2])


@dataclass
class Cluster:
    redis_url: str
    prefix: str
    mode: str
    set_size: int
    timing: dict
    centers: dict[int, CenterDaemon] = field(default_factory=dict)
    hosts: dict[str, LocalDaemon] = field(default_factory=dict)
    stores: dict[str, Store] = field(default_factory=dict)
    scopes: dict[str, trio.CancelScope] = field(default_factory=dict)
    stopped: dict[str, trio.Event] = field(default_factory=dict)
    nursery: trio.Nursery | None = None
    #: Links that go through a fault-injecting relay (dedupnet/harness/relay.py): "wan:A-B",
    #: "host:N.I"; the relays themselves, by link, once started.
    links: frozenset[str] = frozenset()
    link_seed: int = 0
    relays: dict[str, Relay] = field(default_factory=dict)
    #: TLS (dedupnet/adapters/net/tls.py): a directory made by ``dedupnet certs`` (ca.pem,
    #: center-<N>.pem, ...): centers peer over TLS; with ``lan_tls`` hosts use it too.
    tls_dir: str | None = None
    lan_tls: bool = False

    def center_tls(self, n: int) -> TLSConfig | None:
        if self.tls_dir is None:
            return None
        return TLSConfig(f"{self.tls_dir}/ca.pem", f"{self.tls_dir}/center-{n}.pem",
                         f"{self.tls_dir}/center-{n}-key.pem", self.lan_tls)

    def host_tls(self) -> TLSConfig | None:
        return TLSConfig(f"{self.tls_dir}/ca.pem", lan_tls=True) if self.tls_dir and self.lan_tls else None

    def _store(self, name: str) -> Store:
        if name not in self.stores:
            self.stores[name] = store_for(self.redis_url, f"{self.prefix}:{name}")
        return self.stores[name]

    async def _start(self, name: str, daemon) -> None:
        stopped = self.stopped[name] = trio.Event()

        async def run(task_status=trio.TASK_STATUS_IGNORED):
            try:
                with trio.CancelScope() as scope:
                    self.scopes[name] = scope
                    await daemon.run(task_status=task_status)
            finally:
                stopped.set()
        await self.nursery.start(run)

    def center_address(self, n: int) -> tuple[str, int]:
        return center_ip(n), self.centers[n].port

    async def _via(self, link: str, n: int) -> tuple[str, int]:
        """The address a daemon dials to reach center ``n``: the center itself, or the
        relay of ``link`` if that link goes through one (started on first use; a
        restarted center keeps its port, so the relay stays valid)."""
        if link not in self.links:
            return self.center_address(n)
        if link not in self.relays:
            self.relays.update(await start_link_relays(self.nursery, [link], self.center_address, seed=self.link_seed))
        return self.relays[link].address

    async def start_center(self, n: int, networks: int, port: int = 0) -> CenterDaemon:
        peers = []
        for m in range(1, networks + 1):
            if m == n:
                continue
            # The lower-numbered center dials the higher one (center_host/daemon.py _dial).
            host, peer_port = (await self._via(wan_name(n, m), m) if n < m and m in self.centers
                               else (center_ip(m), self.centers[m].port if m in self.centers else 0))
            peers.append(PeerAddress(m, host, peer_port, lan(m)))
        timing = {k: v for k, v in self.timing.items() if k in CenterSettings.__dataclass_fields__}
        daemon = CenterDaemon(CenterSettings(n, center_ip(n), port, lan(n), peers, mode=self.mode,
                                             tls=self.center_tls(n), **timing), self._store(f"center{n}"))
        await self._start(f"center{n}", daemon)
        self.centers[n] = daemon
        return daemon

    async def start_host(self, n: int, i: int) -> LocalDaemon:
        ip = host_ip(n, i)
        timing = {k: v for k, v in self.timing.items() if k in LocalSettings.__dataclass_fields__}
        if timing.get("crawler") is not None and timing["crawler"].local_address is None:
            # Its crawler fetches from the host's own address, as a daemon's does (dedupnet/service/daemons.py):
            # the web server's log then tells which host fetched what.
            timing["crawler"] = replace(timing["crawler"], local_address=ip)
        daemon = LocalDaemon(LocalSettings(n, ip, lan(n), await self._via(host_name(n, i), n),
                                           set_size=self.set_size, mode=self.mode, tls=self.host_tls(), **timing),
                             self._store(f"host:{ip}"))
        await self._start(ip, daemon)
        self.hosts[ip] = daemon
        return daemon

    async def kill(self, name: str) -> None:
        """Stop one daemon at once, as a crash would: its memory is gone, its Redis stays."""
        self.scopes.pop(name).cancel()
        # Until its worker threads have returned: a restarted daemon must not read the
        # pools while the old one is still writing them.
        await self.stopped.pop(name).wait()

    async def restart_center(self, n: int) -> CenterDaemon:
        old = self.centers[n]
        await self.kill(f"center{n}")
        return await self.start_center(n, len(self.centers), port=old.port)

    async def restart_host(self, ip: str) -> LocalDaemon:
        old = self.hosts[ip]
        await self.kill(ip)
        n, i = old.settings.network, int(ip.rsplit(".", 1)[1]) - 10
        return await self.start_host(n, i)

    async def leave_host(self, ip: str) -> int:
        """The host leaves for good (handing its tasks back), and is gone from the cluster."""
        handed = await self.hosts[ip].leave()
        await self.kill(ip)
        del self.hosts[ip]
        return handed

    def close(self) -> None:
        for store in self.stores.values():
            store.delete_prefix()
            store.close()

    async def quiescent(self) -> bool:
        """Nothing in any URL_pool, no frame unacknowledged, no set in flight, no task
        unassigned, no event waiting or being handled: judged at one moment.

        The URL_pool sizes are Redis reads, awaits during which the daemons run on, so
        they come first, and the daemons' memory is then read with no await in between.
        Checked the other way round (centers, then each host's URL_pool), a host's frame
        could be stored, acknowledged and its entries released during the reads, after
        the centers had been looked at: the set was seen nowhere, and a test asserted on
        task_pools with it still in flight. Reading URL_pool first misses nothing that
        is not pushed meanwhile: an entry leaves it only once a center holds its set
        (gap 7), which stays in that center's memory until the hosts have acknowledged
        its tasks, and a host acknowledges only once they are in its task_pool."""
        for h in list(self.hosts.values()):
            if (await h.store.run(h.pools.sizes))[URL_POOL]:
                return False
        # No await from here on.
        if any(c.core.stages.sets or c.core.members.tasks or not c.reactor.idle for c in self.centers.values()):
            return False
        return not any(h.core.unacked or not h.reactor.idle or h.conn is None for h in self.hosts.values())

    async def wait_quiescent(self, poll: float = 0.05) -> None:
        while not await self.quiescent():
            await trio.sleep(poll)

    async def wait_connected(self) -> None:
        n = len(self.centers)
        per_lan = {c: sum(1 for h in self.hosts.values() if h.settings.network == c) for c in self.centers}
        while any(h.conn is None for h in self.hosts.values()) or any(
                len(c.core.members.peers) < n - 1 or len(c.core.members.hosts) < per_lan[k] for k, c in self.centers.items()):
            await trio.sleep(0.02)


@asynccontextmanager
async def open_cluster(redis_url: str, networks: int, hosts: int, *, mode: str = "exact", set_size: int = 100,
                       prefix: str = "sim", links: frozenset[str] | set[str] | tuple[str, ...] = (),
                       link_seed: int = 0, tls_dir: str | None = None, lan_tls: bool = False,
                       **timing) -> AsyncIterator[Cluster]:
    """Start centers (highest network first, so each dials peers already listening),
    then hosts; yields once all are connected; on exit stops every daemon, waits for
    them, and removes the cluster's keys. ``links`` ("wan:A-B", "host:N.I") go through
    a fault-injecting relay each (:mod:`dedupnet.harness.relay`), clean until told otherwise.
    ``tls_dir`` (certificates from :func:`dedupnet.adapters.net.tls.make_certs` for every network):
    the centers peer over TLS; ``lan_tls``: hosts to their center too."""
    timing.setdefault("durable_acks", False)  # a test's or simulation's server keeps nothing on disk
    cluster = Cluster(redis_url, prefix, mode, set_size, timing, links=frozenset(links), link_seed=link_seed,
                      tls_dir=tls_dir, lan_tls=lan_tls)
    try:
        async with trio.open_nursery() as nursery:
            cluster.nursery = nursery
            for n in range(networks, 0, -1):
                await cluster.start_center(n, networks)
            for n in range(1, networks + 1):
                for i in range(hosts):
                    await cluster.start_host(n, i)
            await cluster.wait_connected()
            yield cluster
            nursery.cancel_scope.cancel()
    finally:
        cluster.close()

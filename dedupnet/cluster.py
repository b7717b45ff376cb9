"""A whole system on one machine: L centers and L×H hosts as trio tasks, real TCP on
loopback addresses (center of network L at 127.0.L.1, hosts at 127.0.L.10+), real
Redis (one server, a key prefix per daemon). The tests and ``dedupnet sim`` use it."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from center_host.daemon import CenterDaemon, CenterSettings, PeerAddress
from local_host.daemon import LocalDaemon, LocalSettings

from .store import Store


def lan(network: int) -> str:
    return f"127.0.{network}.0/24"


def center_ip(network: int) -> str:
    return f"127.0.{network}.1"


def host_ip(network: int, index: int) -> str:
    return f"127.0.{network}.{10 + index}"


@dataclass
class Cluster:
    centers: dict[int, CenterDaemon] = field(default_factory=dict)
    hosts: dict[str, LocalDaemon] = field(default_factory=dict)
    stores: list[Store] = field(default_factory=list)

    def close(self) -> None:
        for store in self.stores:
            store.delete_prefix()
            store.close()

    async def quiescent(self) -> bool:
        """Nothing in any URL_pool, no frame unacknowledged, no set in flight, no task unassigned."""
        for c in self.centers.values():
            if c.core.sets or c.core.tasks or c.reactor.pending():
                return False
        for h in self.hosts.values():
            if h.core.unacked or h.reactor.pending() or h.conn is None:
                return False
            if (await h.store.run(h.pools.sizes))["URL_pool"]:
                return False
        return True

    async def wait_quiescent(self, poll: float = 0.05) -> None:
        while not await self.quiescent():
            await trio.sleep(poll)


async def start_cluster(nursery: trio.Nursery, redis_url: str, networks: int, hosts: int, *, mode: str = "exact",
                        set_size: int = 100, prefix: str = "sim", **timing) -> Cluster:
    """Start centers (highest network first, so each dials peers already listening),
    then hosts; returns once every host is connected to its center."""
    cluster = Cluster()
    center_timing = {k: v for k, v in timing.items() if k in CenterSettings.__dataclass_fields__}
    host_timing = {k: v for k, v in timing.items() if k in LocalSettings.__dataclass_fields__}
    for n in range(networks, 0, -1):
        peers = [PeerAddress(m, center_ip(m), cluster.centers[m].port if m in cluster.centers else 0, lan(m))
                 for m in range(1, networks + 1) if m != n]
        store = Store(redis_url, f"{prefix}:center{n}")
        cluster.stores.append(store)
        daemon = CenterDaemon(CenterSettings(n, center_ip(n), 0, lan(n), peers, mode=mode, **center_timing), store)
        await nursery.start(daemon.run)
        cluster.centers[n] = daemon
    for n in range(1, networks + 1):
        for i in range(hosts):
            ip = host_ip(n, i)
            store = Store(redis_url, f"{prefix}:host:{ip}")
            cluster.stores.append(store)
            daemon = LocalDaemon(LocalSettings(n, ip, lan(n), (center_ip(n), cluster.centers[n].port),
                                               set_size=set_size, mode=mode, **host_timing), store)
            await nursery.start(daemon.run)
            cluster.hosts[ip] = daemon
    while any(h.conn is None for h in cluster.hosts.values()) or any(
            len(c.core.peers) < networks - 1 or len(c.core.hosts) < hosts for c in cluster.centers.values()):
        await trio.sleep(0.02)
    return cluster

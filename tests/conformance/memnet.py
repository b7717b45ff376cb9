"""A whole multi-network system of in-memory cores, with messages delivered in a
random order (FIFO per link, as TCP is), for the exactness and no-loss properties.

Faults on demand: timers that fire while answers are still on their way (an
overloaded system: late is not missing), and partitions between two networks' centers
(the link's messages in flight are lost, both sides see the other leave, then rejoin)."""

from __future__ import annotations

import random
from collections import defaultdict, deque

from center_host.events import Host, Joined, Left, Peer, Received
from local_host import protocol as hp

from .memory import MemoryCenter, MemoryHost, decode


class MemNet:
    def __init__(self, networks: int, hosts: int, *, mode: str = "exact", set_size: int = 4, seed: int = 0,
                 max_in_flight: int = 16, partition_policy: str | None = None, early_timers: float = 0.0,
                 partitions: float = 0.0, foreign_lookup: str | None = None,
                 local_lookup: str | None = None, **center_config):
        self.rnd = random.Random(seed)
        self.centers: dict[int, MemoryCenter] = {}
        self.hosts: dict[str, MemoryHost] = {}
        self.links: dict[tuple[str, str], deque] = defaultdict(deque)
        self.early_timers = early_timers  # chance per step that a random timer fires early
        self.partitions = partitions  # chance per step that a WAN link is cut or healed
        self.cut: set[frozenset[int]] = set()
        cidr = {n: f"127.0.{n}.0/24" for n in range(1, networks + 1)}
        for n in cidr:
            peers = {m: c for m, c in cidr.items() if m != n}
            self.centers[n] = MemoryCenter.make(network=n, lan=cidr[n], peers=peers, mode=mode,
                                                max_in_flight=max_in_flight, partition_policy=partition_policy,
                                                foreign_lookup=foreign_lookup, local_lookup=local_lookup,
                                                **center_config)
            for h in range(hosts):
                ip = f"127.0.{n}.{10 + h}"
                self.hosts[ip] = MemoryHost.make(ip=ip, network=n, host_id=10 + h, set_size=set_size, mode=mode)
        for n, center in self.centers.items():
            for m in self.centers:
                if m != n:
                    center.feed(Joined(Peer(m)))
            for ip in self.hosts_of(n):
                center.feed(Joined(Host(ip)))
                self.hosts[ip].feed(hp.Connected())

    def hosts_of(self, network: int) -> list[str]:
        return [ip for ip, h in self.hosts.items() if h.core.config.network == network]

    def _collect(self) -> None:
        for ip, host in self.hosts.items():
            for data in host.take_outbox():
                self.links[(ip, f"center:{host.core.config.network}")].append(data)
        for n, center in self.centers.items():
            for to, data in center.take_outbox():
                if isinstance(to, Peer) and frozenset((n, to.network)) in self.cut:
                    continue  # no connection: the daemon skips the send
                dst = f"center:{to.network}" if isinstance(to, Peer) else to.ip
                self.links[(f"center:{n}", dst)].append(data)

    def cut_link(self, a: int, b: int) -> None:
        """Partition networks a and b: what is on the wire between them is lost."""
        self.cut.add(frozenset((a, b)))
        self.links.pop((f"center:{a}", f"center:{b}"), None)
        self.links.pop((f"center:{b}", f"center:{a}"), None)
        self.centers[a].feed(Left(Peer(b)))
        self.centers[b].feed(Left(Peer(a)))

    def heal(self, a: int, b: int) -> None:
        self.cut.discard(frozenset((a, b)))
        self.centers[a].feed(Joined(Peer(b)))
        self.centers[b].feed(Joined(Peer(a)))

    def _fault(self) -> bool:
        """Maybe inject a fault; True if one happened."""
        if self.early_timers and self.rnd.random() < self.early_timers:
            armed = [(c, n) for c in self.centers.values() for n in c.timers]
            if armed:
                center, number = self.rnd.choice(armed)
                center.fire(number)
                return True
        if self.partitions and self.rnd.random() < self.partitions:
            a, b = self.rnd.sample(sorted(self.centers), 2)
            (self.heal if frozenset((a, b)) in self.cut else self.cut_link)(a, b)
            return True
        return False

    def _deliver(self, src: str, dst: str, data: bytes) -> None:
        msg = decode(data)
        if dst.startswith("center:"):
            center = self.centers[int(dst[7:])]
            sender = Peer(int(src[7:])) if src.startswith("center:") else Host(src)
            center.feed(Received(sender, msg))
        else:
            self.hosts[dst].feed(hp.FromCenter(msg))

    def step(self) -> bool:
        """Deliver one message on a random link, or let a random host walk its URL_pool.
        Returns False when nothing is left to do."""
        self._collect()
        if self._fault():
            return True
        busy = [k for k, q in self.links.items() if q]
        walkers = [h for h in self.hosts.values() if any(i not in h._taken for i in h.URL_pool)]
        if not busy and not walkers:
            if self.cut:  # every partition heals in the end
                self.heal(*sorted(self.cut.pop()))
                return True
            return False
        if walkers and (not busy or self.rnd.random() < 0.3):
            self.rnd.choice(walkers).walk()
        else:
            src, dst = self.rnd.choice(busy)
            self._deliver(src, dst, self.links[(src, dst)].popleft())
        return True

    def run(self, max_steps: int = 100_000) -> None:
        for _ in range(max_steps):
            if not self.step():
                return
        raise AssertionError("the system did not quiesce")

    def settle(self, max_steps: int = 100_000) -> None:
        """Run with no new faults until quiescent; then fire what timers are left (a set
        still waiting would ask again) until none is."""
        self.early_timers = self.partitions = 0.0
        for _ in range(max_steps):
            if self.step():
                continue
            armed = [(c, n) for c in self.centers.values() for n in c.timers]
            if not armed:
                return
            center, number = armed[0]
            center.fire(number)
        raise AssertionError("the system did not settle")
        raise AssertionError("the system did not quiesce")

    def admitted(self) -> list[str]:
        """Every admission in the whole system (a URL twice here = crawled twice)."""
        return [u for c in self.centers.values() for _, urls in c.admissions for u in urls]

    def task_pools(self) -> list[str]:
        return [u for h in self.hosts.values() for u in h.task_pool]

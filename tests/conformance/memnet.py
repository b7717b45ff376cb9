"""A whole multi-network system of in-memory cores, with messages delivered in a
random order (FIFO per link, as TCP is), for the exactness and no-loss properties."""

from __future__ import annotations

import random
from collections import defaultdict, deque

from center_host import protocol as cp
from local_host import protocol as hp

from .memory import MemoryCenter, MemoryHost, decode


class MemNet:
    def __init__(self, networks: int, hosts: int, *, mode: str = "exact", set_size: int = 4, seed: int = 0,
                 max_in_flight: int = 16):
        self.rnd = random.Random(seed)
        self.centers: dict[int, MemoryCenter] = {}
        self.hosts: dict[str, MemoryHost] = {}
        self.links: dict[tuple[str, str], deque] = defaultdict(deque)
        cidr = {n: f"127.0.{n}.0/24" for n in range(1, networks + 1)}
        for n in cidr:
            peers = {m: c for m, c in cidr.items() if m != n}
            self.centers[n] = MemoryCenter.make(network=n, lan=cidr[n], peers=peers, mode=mode,
                                                max_in_flight=max_in_flight)
            for h in range(hosts):
                ip = f"127.0.{n}.{10 + h}"
                self.hosts[ip] = MemoryHost.make(ip=ip, network=n, host_id=10 + h, set_size=set_size, mode=mode)
        for n, center in self.centers.items():
            for m in self.centers:
                if m != n:
                    center.feed(cp.Joined(cp.Peer(m)))
            for ip in self.hosts_of(n):
                center.feed(cp.Joined(cp.Host(ip)))
                self.hosts[ip].feed(hp.Connected())

    def hosts_of(self, network: int) -> list[str]:
        return [ip for ip, h in self.hosts.items() if h.core.config.network == network]

    def _collect(self) -> None:
        for ip, host in self.hosts.items():
            for data in host.take_outbox():
                self.links[(ip, f"center:{host.core.config.network}")].append(data)
        for n, center in self.centers.items():
            for to, data in center.take_outbox():
                dst = f"center:{to.network}" if isinstance(to, cp.Peer) else to.ip
                self.links[(f"center:{n}", dst)].append(data)

    def _deliver(self, src: str, dst: str, data: bytes) -> None:
        msg = decode(data)
        if dst.startswith("center:"):
            center = self.centers[int(dst[7:])]
            sender = cp.Peer(int(src[7:])) if src.startswith("center:") else cp.Host(src)
            center.feed(cp.Received(sender, msg))
        else:
            self.hosts[dst].feed(hp.FromCenter(msg))

    def step(self) -> bool:
        """Deliver one message on a random link, or let a random host walk its URL_pool.
        Returns False when nothing is left to do."""
        self._collect()
        busy = [k for k, q in self.links.items() if q]
        walkers = [h for h in self.hosts.values() if any(i not in h._taken for i in h.URL_pool)]
        if not busy and not walkers:
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

    def admitted(self) -> list[str]:
        """Every admission in the whole system (a URL twice here = crawled twice)."""
        return [u for c in self.centers.values() for _, urls in c.admissions for u in urls]

    def task_pools(self) -> list[str]:
        return [u for h in self.hosts.values() for u in h.task_pool]

"""A center core under home routing on the in-memory network, for the tests that drive
it (tests/test_homes.py, tests/test_backlog.py): a center with its hosts and peers
joined, set numbers, URLs of sites a map homes at a given network, and what it sent."""

from __future__ import annotations

from center_host.events import Host, Joined, Peer
from dedupnet.codec.homes import HomeMap

from .conformance.memory import MemoryCenter, decode

SITES = [f"site{i}.example" for i in range(6000)]


def center(network=1, peers=(2, 3), hosts=("10", "11"), **kw):
    c = MemoryCenter.make(network=network, lan=f"127.0.{network}.0/24",
                          peers={n: f"127.0.{n}.0/24" for n in peers}, **kw)
    for h in hosts:
        c.feed(Joined(Host(f"127.0.{network}.{h}")))
    for n in peers:
        c.feed(Joined(Peer(n)))
    c.take_outbox()
    return c


def num(network, host, seq):
    return seq << 32 | network << 16 | host


def urls_homed(m: HomeMap, network: int, k: int, tag="p") -> list[str]:
    return [f"http://{s}/{tag}" for s in SITES if m.home_of_site(s) == network][:k]


def sent(c):
    return [(str(to), decode(data)) for to, data in c.take_outbox()]

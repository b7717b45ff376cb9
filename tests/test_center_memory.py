"""What a center keeps in memory stays bounded in a long crawl: the URLs its peers' homes
have taken (``held_elsewhere``) are a cache of ``held_elsewhere_max`` entries, least
recently used out first, so a URL found again and again stays while the cache turns over."""

from center_host import protocol as cp
from dedupnet.codec.homes import HomeMap
from dedupnet.codec.messages import Ack, Frame

from .conformance.memory import MemoryCenter, decode

SITES = [f"site{i}.example" for i in range(4000)]


def homed_at_2(k: int) -> list[str]:
    m = HomeMap({1: 1.0, 2: 1.0})
    return [f"http://{s}/x" for s in SITES if m.home_of_site(s) == 2][:k]


def found(c: MemoryCenter, seq: int, urls: list[str]) -> None:
    """A LAN host finds ``urls`` (homed at network 2); network 2 takes them."""
    c.feed(cp.Received(cp.Host("127.0.1.10"), Frame(dict.fromkeys(urls, 0), "127.0.1.10", seq << 32 | 1 << 16 | 10, 1)))
    for to, data in c.take_outbox():
        msg = decode(data)
        if str(to) == "net:2" and isinstance(msg, Frame):
            c.feed(cp.Received(cp.Peer(2), Ack(msg.number, "stored")))
    c.take_outbox()


def test_held_elsewhere_stays_within_its_cap_and_keeps_what_is_found_again():
    c = MemoryCenter.make(network=1, lan="127.0.1.0/24", peers={2: "127.0.2.0/24"}, held_elsewhere_max=3)
    c.feed(cp.Joined(cp.Host("127.0.1.10")))
    c.feed(cp.Joined(cp.Peer(2)))
    a, b, d, e, f = homed_at_2(5)
    for seq, url in enumerate((a, b, d), 1):
        found(c, seq, [url])
    assert list(c.core.held_elsewhere) == [a, b, d]
    found(c, 4, [a])  # found again: dropped here at once, and kept as the newest
    assert c.core.counters.get("urls_dropped", stage="center-record") == 1
    found(c, 5, [e])
    found(c, 6, [f])
    assert list(c.core.held_elsewhere) == [a, e, f]  # b and d, not used since, went first
    assert len(c.core.held_elsewhere) <= 3


def test_the_default_cap_is_a_few_megabytes():
    assert cp.CenterConfig(network=1, lan="127.0.1.0/24").held_elsewhere_max * 158 < 4_000_000

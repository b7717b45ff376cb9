"""What a center keeps in memory stays bounded in a long crawl: the URLs its peers' homes
have taken (``held_elsewhere``) are a cache of ``held_elsewhere_max`` entries, least
recently used out first, so a URL found again and again stays while the cache turns over."""

from center_host.events import Host, Joined, Peer, Received
from center_host.config import CenterConfig
from center_host.sets import RECENTLY_CONCLUDED
from dedupnet.codec.homes import HomeMap
from dedupnet.codec.messages import Ack, Done, Frame, Task

from .conformance.memory import MemoryCenter, decode

SITES = [f"site{i}.example" for i in range(4000)]


def homed_at_2(k: int) -> list[str]:
    m = HomeMap({1: 1.0, 2: 1.0})
    return [f"http://{s}/x" for s in SITES if m.home_of_site(s) == 2][:k]


def found(c: MemoryCenter, seq: int, urls: list[str]) -> None:
    """A LAN host finds ``urls`` (homed at network 2); network 2 takes them."""
    c.feed(Received(Host("127.0.1.10"), Frame(dict.fromkeys(urls, 0), "127.0.1.10", seq << 32 | 1 << 16 | 10, 1)))
    for to, data in c.take_outbox():
        msg = decode(data)
        if str(to) == "net:2" and isinstance(msg, Frame):
            c.feed(Received(Peer(2), Ack(msg.number, "stored")))
    c.take_outbox()


def test_held_elsewhere_stays_within_its_cap_and_keeps_what_is_found_again():
    c = MemoryCenter.make(network=1, lan="127.0.1.0/24", peers={2: "127.0.2.0/24"}, held_elsewhere_max=3)
    c.feed(Joined(Host("127.0.1.10")))
    c.feed(Joined(Peer(2)))
    a, b, d, e, f = homed_at_2(5)
    for seq, url in enumerate((a, b, d), 1):
        found(c, seq, [url])
    assert list(c.core.claims.held_elsewhere) == [a, b, d]
    found(c, 4, [a])  # found again: dropped here at once, and kept as the newest
    assert c.core.counters.get("urls_dropped", stage="center-record") == 1
    found(c, 5, [e])
    found(c, 6, [f])
    assert list(c.core.claims.held_elsewhere) == [a, e, f]  # b and d, not used since, went first
    assert len(c.core.claims.held_elsewhere) <= 3


def test_the_default_cap_is_a_few_megabytes():
    assert CenterConfig(network=1, lan="127.0.1.0/24").held_elsewhere_max * 158 < 4_000_000


def test_nothing_of_a_finished_set_stays_behind():
    """A long crawl passes sets through every stage (home routing, tasks acknowledged and
    reported); what the core keeps per set or per URL is gone once each is done, and its
    caches stay within their caps, so a center's memory is what is in flight, not what
    has been."""
    c = MemoryCenter.make(network=1, lan="127.0.1.0/24", peers={2: "127.0.2.0/24"}, routing="home",
                          held_elsewhere_max=500)
    host = Host("127.0.1.10")
    c.feed(Joined(host, "127.0.1.10:7701"))
    c.feed(Joined(Peer(2)))
    reports = 0
    for seq in range(1, 401):
        urls = [f"http://site{seq % 300}.example/p{seq}-{i}" for i in range(6)]
        c.feed(Received(host, Frame(dict.fromkeys(urls, 0), "127.0.1.10", seq << 32 | 1 << 16 | 10, 1)))
        while out := c.take_outbox():
            for to, data in out:
                msg = decode(data)
                if str(to) == "net:2" and isinstance(msg, Frame):
                    c.feed(Received(Peer(2), Ack(msg.number, "stored")))
                elif isinstance(msg, Task):
                    c.feed(Received(host, Ack(msg.number, "stored")))
                    reports += 1
                    c.feed(Received(host, Done(reports << 32 | 1 << 16 | 10, tuple(msg.URLs))))
    core = c.core
    assert reports > 100 and core.counters.get("tasks_reported") > 500
    stages, members = core.stages, core.members
    left = {"sets": stages.sets, "claims": core.claims.by_url, "lookups": stages.lookups, "waiting": stages.waiting,
            "gathering": stages.gathering, "tasks": members.tasks, "ledger": members.ledger, "moved": members.moved,
            "moved_out": members.moved_out, "reissue_timers": members.reissue_timers}
    assert not {name for name, held in left.items() if held}
    assert not any(core.homes.route_queue.values()) and not any(core.homes.route_out.values())
    assert len(core.claims.held_elsewhere) == 500
    assert len(core.stages.recently_concluded) <= RECENTLY_CONCLUDED
    assert len(core.members.sequences) == len(core.members.known) == 1

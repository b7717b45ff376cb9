"""A map change with URLs waiting for their homes on both sides (docs/PROTOCOL.md §11,
"Changing the map"): every URL is admitted exactly once, at its home under the new map
unless an old home had already stored it, and a set routed to a center is never routed
on. The cores, through the in-memory adapters; the daemons' version is in
tests/test_homes.py."""

from collections import Counter

import pytest

from center_host.events import Host, Joined, Left, Peer, Received
from dedupnet.codec.homes import HomeMap
from dedupnet.codec.messages import Ack, Frame

from .conformance.memory import MemoryCenter, decode

A, B = 56, 57
OLD = {A: 1.0, B: 1.0}
SITES = [f"site{i}.example" for i in range(4000)]


def lan(n):
    return f"127.0.{n}.0/24"


def host(n):
    return f"127.0.{n}.10"


def num(network, seq):
    return seq << 32 | network << 16 | 10


def make(n, **kw):
    other = B if n == A else A
    c = MemoryCenter.make(network=n, lan=lan(n), peers={other: lan(other)}, resume_grace=1.0, **kw)
    c.feed(Joined(Host(host(n))))
    return c


def urls(old: HomeMap, new: HomeMap, was: int, now: int, k: int, tag: str) -> list[str]:
    """``k`` URLs of sites homed at ``was`` under ``old`` and at ``now`` under ``new``."""
    return [f"http://{s}/{tag}" for s in SITES if old.home_of_site(s) == was and new.home_of_site(s) == now][:k]


class Pair:
    """Two centers; messages between them delivered in order, or lost while cut."""

    def __init__(self, **kw):
        self.c = {A: make(A, **kw), B: make(B, **kw)}
        self.connected = False
        self.hosts_answer = True  # each LAN's host answers flag=2 with nothing seen

    def connect(self):
        self.connected = True
        self.c[A].feed(Joined(Peer(B)))
        self.c[B].feed(Joined(Peer(A)))
        self.run()

    def cut(self):
        self.run()
        self.connected = False
        self.c[A].feed(Left(Peer(B)))
        self.c[B].feed(Left(Peer(A)))

    def found(self, n, seq, found):
        self.c[n].feed(Received(Host(host(n)), Frame(dict.fromkeys(found, 0), host(n), num(n, seq), 1)))
        self.run()

    def run(self, drop_acks_to=None, steps=10_000):
        for _ in range(steps):
            moved = False
            for n, c in self.c.items():
                for to, data in c.take_outbox():
                    msg = decode(data)
                    if isinstance(to, Host):  # tasks need no ack here; a look-up is answered
                        if self.hosts_answer and isinstance(msg, Frame) and msg.flag == 2:
                            c.feed(Received(to, msg.with_flag(3)))
                            moved = True
                        continue
                    if not self.connected:
                        continue
                    if isinstance(msg, Ack) and to.network == drop_acks_to:
                        continue
                    self.c[to.network].feed(Received(Peer(n), msg))
                    moved = True
            if not moved:
                return
        raise AssertionError("the centers never went quiet")

    def restart(self, **config):
        """Both centers restart with a new map (crash semantics: memory lost, pools kept)."""
        for n, c in self.c.items():
            self.c[n] = c.restart(**config)
            self.c[n].feed(Joined(Host(host(n))))
        self.connected = False

    def settle(self):
        """Timers fire until nothing is left in flight."""
        for _ in range(50):
            self.run()
            due = [(n, t) for n, c in self.c.items() for t in list(c.timers)]
            if not due and not any(c.core.stages.sets for c in self.c.values()):
                return
            for n, t in due:
                if t in self.c[n].timers:
                    self.c[n].fire(t)
        raise AssertionError({n: sorted(c.core.stages.sets) for n, c in self.c.items()})

    def admissions(self) -> Counter:
        return Counter((n, u) for n, c in self.c.items() for _, batch in c.admissions for u in batch)


def admitted_once(pair: Pair, wanted: set[str]) -> dict[str, int]:
    """Each wanted URL -> the network that admitted it; fails on a URL admitted twice or never."""
    where: dict[str, list[int]] = {}
    for (n, u), k in pair.admissions().items():
        where.setdefault(u, []).extend([n] * k)
    assert set(where) >= wanted, f"lost: {sorted(wanted - set(where))[:5]}"
    twice = {u: ns for u, ns in where.items() if len(ns) > 1}
    assert not twice, f"admitted twice: {list(twice.items())[:5]}"
    return {u: ns[0] for u, ns in where.items() if u in wanted}


def test_retiring_a_network_while_urls_wait_for_it_admits_each_once_at_the_new_home():
    """The operator's retirement (``--weight 57=0 --previous-weights 56=1,57=1``) while
    56 holds URLs for 57, which is down: none may be lost. Routing them on from 57 back
    to 56 under their number, which 56 still held, lost every one of them."""
    old, new = HomeMap(OLD), HomeMap({A: 1.0, B: 0.0})
    p = Pair()
    waiting = urls(old, new, B, A, 10, "w")
    p.found(A, 1, waiting)
    assert p.c[A].core.stages.routed_waiting() == {B: 10}
    p.restart(weights={B: 0.0}, previous_weights=(OLD,))
    p.connect()
    p.settle()
    where = admitted_once(p, set(waiting))
    assert set(where.values()) == {A}


@pytest.mark.parametrize("ack_lost", [False, True])
@pytest.mark.parametrize("new_weights", [{A: 1.0, B: 0.0}, {A: 1.0, B: 4.0}], ids=["57-retired", "57-weighs-4"])
def test_a_map_change_with_urls_waiting_on_both_sides_admits_each_once(new_weights, ack_lost):
    """Sites move one way (to 56 when 57 is retired, to 57 when it weighs more); each
    center holds URLs for the other when the map changes, of sites that move and of
    sites that stay; with ``ack_lost`` the home had stored one side's URLs and its ack
    never came back. Afterwards both networks find every URL again. Each is admitted
    once, and a URL nobody had stored is admitted at its home under the new map."""
    old, new = HomeMap(OLD), HomeMap(new_weights)
    # With ack_lost the home's LAN stage (asking its host) is still going on at the
    # restart: the routed set is in flight there when the new home asks about it.
    p = Pair(local_lookup="lan") if ack_lost else Pair()
    sides = {}
    for n, other in ((A, B), (B, A)):
        sides[n] = (urls(old, new, other, A, 6, f"to{other}a") + urls(old, new, other, B, 6, f"to{other}b")
                    + urls(old, new, n, n, 3, f"own{n}"))
    if ack_lost:
        p.connect()
        p.hosts_answer = False
        p.c[A].feed(Received(Host(host(A)), Frame(dict.fromkeys(sides[A], 0), host(A), num(A, 1), 1)))
        p.run(drop_acks_to=A)  # 57 stored 56's routed URLs; its ack is lost with the link
        assert num(A, 1) in p.c[B].core.stages.sets and p.c[A].core.stages.routed_waiting()
        p.cut()
        p.hosts_answer = True
        p.found(B, 1, sides[B])
    else:
        p.found(A, 1, sides[A])
        p.found(B, 1, sides[B])
    assert p.c[A].core.stages.routed_waiting() and p.c[B].core.stages.routed_waiting()
    p.restart(weights=new_weights, previous_weights=(OLD,))
    p.connect()
    p.settle()
    everything = set(sides[A]) | set(sides[B])
    p.found(A, 3, sorted(everything))
    p.found(B, 3, sorted(everything))
    p.settle()
    where = admitted_once(p, everything)
    stored_at_b = set(sides[A]) if ack_lost else set()
    for u, n in where.items():
        if u not in stored_at_b:
            assert n == new.home_of(u), (u, n)


# -- real daemons ---------------------------------------------------------------------
async def test_retiring_a_network_that_is_down_loses_none_of_the_urls_waiting_for_it(redis_url):
    """The retirement as an operator does it, on real daemons and Redis: center 2 is down
    while center 1 holds 10 URLs homed at 2; both restart with network 2 retired and the
    old map as the previous one. All 10 are admitted once, by network 1."""
    import random

    import trio

    from dedupnet.harness.cluster import open_cluster

    old = {1: 1.0, 2: 1.0}
    waiting = [f"http://{s}/w" for s in SITES if HomeMap(old).home_of_site(s) == 2][:10]
    async with open_cluster(redis_url, 2, 1, set_size=20, prefix=f"retire{random.random()}") as system:
        with trio.fail_after(30):
            await system.wait_connected()
        two = system.centers[2].port
        await system.kill("center2")
        one = system.hosts["127.0.1.10"]
        await one.store.run(one.pools.push, waiting)
        with trio.fail_after(30):
            while system.centers[1].core.stages.routed_waiting() != {2: 10}:
                await trio.sleep(0.05)
        system.timing["weights"] = {2: 0.0}
        system.timing["previous_weights"] = (old,)
        await system.restart_center(1)
        await system.start_center(2, 2, port=two)
        with trio.fail_after(60):
            await system.wait_connected()
            await system.wait_quiescent()
        tasks = {ip: [u for _, u in await h.store.run(h.pools.all_tasks)] for ip, h in system.hosts.items()}
    queued = Counter(u for urls in tasks.values() for u in urls)
    assert set(waiting) <= set(queued), f"lost: {len(set(waiting) - set(queued))} of 10"
    assert max(queued.values()) == 1
    assert set(waiting) <= set(tasks["127.0.1.10"])

"""Re-crawl by age: fingerprint sets that forget after a URL's age
(dedupnet/adapters/storage/recrawl.py), the protocol's "seen" answers that follow them, and a simulated
crawl in which every page is fetched exactly once per window (docs/PROTOCOL.md,
"Re-crawl by age"). Ages run on injected clocks, never on sleeps, except in the
simulation, where the web's own request log is the judge."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from center_host.events import Admit, Host, Joined, Lookup, Peer, Received, Send
from center_host.config import CenterConfig
from center_host.protocol import CenterProtocol
from center_host.pools import ADMITTED, CenterPools
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.storage.recrawl import SLICES, AgedSet
from dedupnet.codec.ages import RecrawlPolicy
from dedupnet.adapters.storage.store import FINISH_URL, URL_POOL
from local_host.frontier.sites import task_count
from dedupnet.codec import wire
from dedupnet.codec.messages import FLAG_LOOKUP, FLAG_NEW_SET, Frame, Task
from dedupnet.codec.numbers import make_number
from dedupnet.codec.urls import fingerprint_many
from dedupnet.harness.report import SimConfig, format_report
from dedupnet.harness.sim import simulate
from dedupnet.service.config import Settings, load_settings
from local_host import protocol as hp
from local_host.crawler.crawl import Crawler, CrawlerSettings, Outcome, seed_urls
from local_host.frontier import sites
from local_host.pools import TASK_FP, HostPools

from .conformance.memnet import MemNet

A = 100.0  # seconds: the age in the unit tests
WIDTH = A / SLICES
T0 = 1_000_000.0  # a slice boundary of A / SLICES


class Clock:
    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def urls(*names):
    return [f"http://site{n % 3}.example/{n}" for n in names]


# -- the store: a fingerprint set that forgets -----------------------------------------
def test_a_member_is_seen_for_its_age_and_less_than_one_slice_more(store):
    clock = Clock()
    aged = AgedSet(store, FINISH_URL, RecrawlPolicy(A), clock)
    first, last = urls(1), urls(2)  # written at the start and at the end of one slice: seen
    # until it ends, A + WIDTH after its start, i.e. for A + WIDTH and for A seconds

    def seen(u):
        batch = store.batch()
        handle = aged.contains(batch, u)
        return bool(handle.flags(store.execute(batch))[0])

    def add(u):
        batch = store.batch()
        return aged.add(batch, u).total(store.execute(batch))

    assert add(first) == 1
    clock.now = T0 + WIDTH - 0.001
    assert add(last) == 1
    for offset, expect in [(A - 0.001, True), (A + WIDTH - 0.002, True), (A + WIDTH, False)]:
        clock.now = T0 + offset
        assert (seen(first), seen(last)) == (expect, expect), offset
    # Nothing per URL but the 8-byte member; the slice's buckets expire by themselves,
    # one slice after the last look-up that asks them.
    clock.now = T0
    key = f"{store.key(FINISH_URL)}@100:{int(T0 // WIDTH)}"
    bucket = int(fingerprint_many(first)[0]) >> (64 - store.bucket_bits)
    ttl = store.redis.pttl(f"{key}:{bucket}")
    assert (SLICES + 1) * WIDTH * 1000 < ttl <= (SLICES + 2) * WIDTH * 1000
    assert not store.redis.exists(f"{store.key(FINISH_URL)}:{bucket}")  # not the plain layout


def test_sites_have_their_own_age_and_never_keeps_the_plain_layout(store):
    policy = RecrawlPolicy.from_settings(A, ["*.news.example=10", "static.example=never"])
    assert policy.age_of("http://a.news.example/x") == 10 and policy.age_of("http://static.example/") is None
    assert policy.age_of("http://other.example/") == A
    clock = Clock()
    aged = AgedSet(store, FINISH_URL, policy, clock)
    batch = store.batch()
    mix = ["http://a.news.example/x", "http://static.example/y", "http://other.example/z"]
    aged.add(batch, mix)
    store.execute(batch)
    assert store.fp_contains(FINISH_URL, fingerprint_many(mix)).tolist() == [False, True, False]
    clock.now = T0 + 20  # the news site's age (and its slice) has passed, the others not
    batch = store.batch()
    handle = aged.contains(batch, mix)
    assert handle.flags(store.execute(batch)).tolist() == [False, True, True]
    assert RecrawlPolicy.from_settings(None, ["x.example=never"]) is None  # nothing ever ages: today's layout
    with pytest.raises(ValueError, match="GLOB=SECONDS"):
        RecrawlPolicy.from_settings(A, ["no-age"])
    with pytest.raises(ValueError, match="positive"):
        RecrawlPolicy.from_settings(-1)


def test_settings_and_flags():
    s = load_settings(recrawl_after=3600.0, recrawl_sites=["*.example.org=60"])
    assert s.recrawl() == RecrawlPolicy(3600.0, (("*.example.org", 60.0),))
    assert Settings().recrawl() is None
    with pytest.raises(ValueError, match="Bloom filter cannot forget"):
        Settings(recrawl_after=10, finish_url_filter="bloom")
    with pytest.raises(ValueError, match="recrawl_sites"):
        Settings(recrawl_sites=["x=soon"])
    from dedupnet.cli import build_parser

    args = build_parser().parse_args(["local", "--recrawl-after", "60", "--recrawl-site", "a.example=never"])
    assert (args.recrawl_after, args.recrawl_sites) == (60.0, ["a.example=never"])


# -- the center: admitted for its age --------------------------------------------------
class Center:
    """One center's core and its Redis pools, driven as its daemon drives them (writes
    first, then each look-up, answered before anything else)."""

    def __init__(self, store, clock, **config):
        config.setdefault("recrawl", RecrawlPolicy(A))
        self.core = CenterProtocol(CenterConfig(**config), Counters())
        self.pools = CenterPools(store, config["recrawl"], clock)
        self.admitted: list[str] = []
        self.sent: list[tuple] = []
        self._seq = 0

    def feed(self, event) -> None:
        pending = [event]
        while pending:
            actions = self.core.handle(pending.pop(0))
            self.pools.apply(actions)
            for a in actions:
                if isinstance(a, Lookup):
                    pending.append(self.pools.lookup(a.number, a.urls))
                elif isinstance(a, Admit):
                    self.admitted += a.urls
                elif isinstance(a, Send):
                    self.sent.append((a.to, wire.decode_one(a.data)))

    def offer(self, host: str, found: list[str]) -> list[str]:
        """A host's set of ``found`` URLs (flag=1); returns what it admitted."""
        self._seq += 1
        before = len(self.admitted)
        number = make_number(1, int(host.rsplit(".", 1)[1]), self._seq)
        self.feed(Received(Host(host), Frame(dict.fromkeys(found, 0), host, number, FLAG_NEW_SET)))
        return self.admitted[before:]


def test_the_center_admits_a_url_again_only_after_its_age(store):
    clock = Clock()
    center = Center(store, clock, network=1, lan="127.0.1.0/24")
    center.feed(Joined(Host("127.0.1.10")))
    u, v, w = urls(1, 2, 3)
    assert center.offer("127.0.1.10", [u, v]) == [u, v]
    clock.now = T0 + A / 2
    assert center.offer("127.0.1.10", [u, w]) == [w]  # u: admitted half an age ago
    assert center.core.counters.get("urls_dropped", stage="center-record") == 1
    clock.now = T0 + A - 0.001
    assert center.offer("127.0.1.10", [u, v]) == []
    clock.now = T0 + A + WIDTH  # past its age (and the slice it was written in)
    assert center.offer("127.0.1.10", [u, v, w]) == [u, v]  # w: admitted at A / 2
    assert center.pools.store.fp_count(ADMITTED) == 0  # nothing in the plain record


@pytest.mark.parametrize("recrawl", [None, RecrawlPolicy(A)])
def test_no_early_drop_for_a_url_another_network_held_under_a_recrawl_policy(store, recrawl):
    """``held_elsewhere`` (an early drop, PROTOCOL.md §10) is not kept under a re-crawl
    policy: the other network's set may give the URL up to a third network's admission
    that is fresh now but old by the time of a later offer, which must then go on."""
    center = Center(store, Clock(), network=1, lan="127.0.1.0/24", peers={2: "127.0.2.0/24"}, recrawl=recrawl,
                    routing="broadcast")  # another network's look-up: §10's
    center.feed(Joined(Host("127.0.1.10")))
    center.feed(Joined(Peer(2)))
    u = urls(7)[0]
    theirs = make_number(2, 10, 1)
    center.feed(Received(Peer(2), Frame({u: 0}, "127.0.2.10", theirs, FLAG_LOOKUP)))
    ((_, answer),) = [s for s in center.sent if isinstance(s[1], Frame) and s[1].number == theirs]
    assert answer.URL_set == {u: 0}
    center.offer("127.0.1.10", [u])
    asked = [rec.frame.URL_set for rec in center.core.stages.sets.values()]
    assert asked == ([] if recrawl is None else [{u: 0}])  # without ages dropped at once


# -- a host: crawled for its age, queued until crawled ----------------------------------
def host_lookup(pools: HostPools, kind: str, found: list[str]) -> list[bool]:
    return pools.lookup(hp.Lookup((kind, 1), tuple(found))).seen


def test_a_host_forgets_what_it_crawled_after_its_age_and_queues_a_url_until_crawled(store):
    clock = Clock()
    policy = RecrawlPolicy(A)
    pools = HostPools(store, exact=True, recrawl=policy, clock=clock)
    crawler = Crawler(store, CrawlerSettings(recrawl=policy), Counters(), consumer="h")
    crawler._finished.clock = clock
    u, v = urls(1, 2)
    pools.apply([hp.AddTasks((u,))])
    assert host_lookup(pools, "task", [u, v]) == [True, False]  # a task sent again is not queued twice
    assert host_lookup(pools, "found", [u]) == [True]  # queued: exact mode answers seen
    ((eid, _),) = sites.take(store, "h", 10).entries
    store.transact(lambda b: crawler._fill_done([(eid, Outcome(u, [u]))], b))
    assert not store.fp_contains(TASK_FP, fingerprint_many([u]))[0]  # crawled: no longer queued
    assert host_lookup(pools, "task", [u]) == [True]  # crawled just now
    clock.now = T0 + A + WIDTH
    assert host_lookup(pools, "found", [u]) == [False]
    assert host_lookup(pools, "task", [u]) == [False]  # admitted again: queued again
    assert pools.finish([v]) == 1 and host_lookup(pools, "found", [v]) == [True]  # `dedupnet finish`: now
    # The core: a task whose URLs this host has seen queues only the others.
    core = hp.HostProtocol(hp.HostConfig("127.0.1.10", 1, 10))
    (lookup,) = core.handle(hp.FromCenter(Task(5, (u, v))))
    add, _ = core.handle(pools.lookup(lookup))
    assert add == hp.AddTasks((u,), 5)


def test_seeds_are_crawled_again_through_the_protocol(store):
    """Under a re-crawl policy the seed re-crawl goes through URL_pool (and its age
    check), not straight into task_pool as without one."""
    policy = RecrawlPolicy(A)
    seeds = urls(1, 2)
    assert seed_urls(store, seeds) == 2
    store.command(b"DEL", store.key(URL_POOL))
    crawler = Crawler(store, CrawlerSettings(recrawl=policy, recrawl_interval=60), Counters(), consumer="h")
    assert crawler._requeue_seeds() == 2
    store.ensure_group(URL_POOL, "g")
    assert sorted(u for _, u in store.stream_take(URL_POOL, "g", "c", 10)) == seeds
    assert task_count(store) == 0


# -- the whole protocol: never twice within the age, anywhere --------------------------
class AgedRecord:
    """An in-memory admitted record / finish_URL with exact ages on a shared clock, for
    MemNet's in-memory centers and hosts; ``history`` keeps every write."""

    def __init__(self, clock: Clock, age: float):
        self.clock, self.age = clock, age
        self.at: dict[str, float] = {}
        self.history: list[tuple[str, float]] = []

    def update(self, found) -> None:
        for u in found:
            self.at[u] = self.clock.now
            self.history.append((u, self.clock.now))

    def add(self, u) -> None:
        self.update([u])

    def __contains__(self, u) -> bool:
        return u in self.at and self.clock.now - self.at[u] < self.age


class TimedNet(MemNet):
    """MemNet whose messages carry the clock's time when sent: ``max_delay`` is the
    longest any was on its way."""

    def __init__(self, clock: Clock, *args, **kwargs):
        self.clock, self.max_delay = clock, 0.0
        super().__init__(*args, **kwargs)

    def _collect(self) -> None:
        before = {k: len(q) for k, q in self.links.items()}
        super()._collect()
        for k, q in self.links.items():
            for i in range(before.get(k, 0), len(q)):
                q[i] = (self.clock.now, q[i])

    def _deliver(self, src: str, dst: str, item) -> None:
        sent, data = item
        self.max_delay = max(self.max_delay, self.clock.now - sent)
        super()._deliver(src, dst, data)


@pytest.mark.parametrize("lookup", ["center", "lan"])
@pytest.mark.parametrize("seed", range(5))
def test_no_url_is_admitted_twice_within_its_age_across_networks(seed, lookup):
    """3 networks x 3 hosts of in-memory cores, messages in random order, timers firing
    early and WAN links cut and healed (tests/conformance/memnet.py), while the clock
    runs and hosts keep finding the same URLs again and crawl what they are given. Every
    center's admitted record and every host's finish_URL forget after the age (exact
    ages here; the store's slices only ever answer "seen" longer). Then: two admissions
    of one URL, anywhere in the system, are never less than the age apart; and every
    offer of a URL is covered: the URL was admitted or crawled within the age before it,
    or is admitted or crawled after it."""
    age = 10.0
    clock = Clock(0.0)
    # Every early timer re-sends a set; asking every host ("lan") makes that many more
    # messages, so timers fire early less often there, or the links never empty.
    early = 0.2 if lookup == "center" else 0.03
    net = TimedNet(clock, 3, 3, mode="exact", seed=seed, early_timers=early, partitions=0.02, foreign_lookup=lookup,
                   local_lookup=lookup, recrawl=RecrawlPolicy(age))
    rnd = random.Random(seed)
    for c in net.centers.values():
        c.admitted = AgedRecord(clock, age)
    crawled: dict[str, list[float]] = defaultdict(list)
    offers: list[tuple[str, float]] = []
    for h in net.hosts.values():
        h.finish_URL = AgedRecord(clock, age)
    shared = urls(*range(12))

    def crawl_one() -> None:
        busy = [h for h in net.hosts.values() if h.task_pool]
        if busy:
            h = rnd.choice(busy)
            u = h.task_pool.pop(0)
            h.finish_URL.add(u)
            crawled[u].append(clock.now)

    for _ in range(4000):
        r = rnd.random()
        if r < 0.03:  # time passes while messages are on their way
            clock.now += rnd.uniform(0, age / 10)
        elif r < 0.045:
            found = rnd.sample(shared, 4)
            rnd.choice(list(net.hosts.values())).push(found)
            offers += [(u, clock.now) for u in found]
        elif r < 0.105:
            crawl_one()
        elif not net.step():
            clock.now += rnd.uniform(0, age / 3)
    net.settle()
    while any(h.task_pool for h in net.hosts.values()):
        crawl_one()
    admissions: dict[str, list[float]] = defaultdict(list)
    for c in net.centers.values():
        for u, t in c.admitted.history:
            admissions[u].append(t)
    assert sum(map(len, admissions.values())) > len(shared)  # URLs were admitted again
    for u, times in admissions.items():
        times.sort()
        assert all(b - a >= age for a, b in zip(times, times[1:])), (u, times)
    # An answer "seen" that was on its way while the URL was offered again may cover the
    # offer with an admission that was fresh when it was given: within the age plus
    # the longest a message was on its way.
    for u, t in offers:
        covered = [e for e in admissions[u] + crawled[u] if e > t - age - net.max_delay]
        assert covered, (u, t, net.max_delay, admissions[u], crawled[u])


# -- the simulation: every page once in every window ---------------------------------------
async def test_every_page_is_fetched_exactly_once_per_window(redis_url):
    """2 networks x 2 hosts crawl a small synthetic web in 2 windows: the seeds are
    offered again once the first window is older than recrawl_after, and every URL
    the web serves must be fetched exactly twice (the web's own counts), none more,
    none less, and never twice within recrawl_after."""
    cfg = SimConfig(networks=2, hosts=2, pages=100, sites=4, seeds=4, timeout=60,
                    recrawl_after=6.0, windows=2)
    r = await simulate(cfg, redis_url, out=None)
    assert not r.timed_out
    assert r.window_counts == {"exactly": r.reachable_urls, "fewer": 0, "more": 0}
    assert r.duplicate_fetches == 0 and r.lost_urls == 0 and r.invariant_violations == 0
    assert r.min_refetch_gap >= 6.0
    assert [w["requests"] for w in r.windows] == [r.reachable_urls] * 2
    assert "fetched exactly 2 times" in format_report(r)
    assert any(k.startswith("admitted@6") for k in r.redis_bytes["center"])

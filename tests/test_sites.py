"""The per-site frontier (local_host/frontier/sites.py) driven directly on a real Redis, its clock
given by the test: who is handed out when, and that nothing is handed out twice or lost."""

from __future__ import annotations

import pytest

from dedupnet.adapters.storage.store import TASK_POOL
from local_host.frontier import sites
from local_host.frontier.sites import Pace
from local_host.frontier.tasks import GROUP

T0 = 1_800_000_000.0


def _queue(store, urls):
    store.ensure_group(TASK_POOL, GROUP)
    store.stream_add(TASK_POOL, urls)


def _take(store, n, pace=Pace(), now=T0, taker="c", **kw):
    return sites.take(store, taker, n, pace, now=now, **kw)


def test_small_sites_are_not_held_behind_a_big_one(store):
    """10,000 tasks of one site queued before 10 of each of 50 small sites: the first
    takes hand out every small site at once, one task of the big site per delay."""
    _queue(store, [f"http://big.example/p{i}" for i in range(10_000)])
    _queue(store, [f"http://s{k}.example/p{i}" for i in range(10) for k in range(50)])
    seen: dict[str, int] = {}
    now = T0
    for _ in range(40):  # 40 takes, 0.25 s apart: 10 s of crawl
        taken = _take(store, 64, Pace(delay=0.25), now=now)
        for _, url in taken.entries:
            site = url.split("/")[2]
            seen[site] = seen.get(site, 0) + 1
        now += 0.25
    assert sum(1 for s in seen if s.startswith("s")) == 50
    assert all(seen[f"s{k}.example"] == 10 for k in range(50))
    assert seen["big.example"] == 40  # one per 0.25 s: never two in one delay


def test_a_site_is_handed_out_once_per_delay_and_crawl_delay_raises_it(store):
    _queue(store, [f"http://a.example/{i}" for i in range(10)] + [f"http://b.example/{i}" for i in range(10)])
    first = _take(store, 10, Pace(delay=0.25), delays={"b.example": 2.0})
    assert sorted(u.split("/")[2] for _, u in first.entries) == ["a.example", "b.example"]
    assert _take(store, 10, Pace(delay=0.25), now=T0 + 0.1).entries == []  # neither is due
    got = {u.split("/")[2] for _, u in _take(store, 10, Pace(delay=0.25), now=T0 + 0.25).entries}
    assert got == {"a.example"}  # b waits out its Crawl-delay of 2 s
    assert {u.split("/")[2] for _, u in _take(store, 10, Pace(delay=0.25), now=T0 + 1.99).entries} == {"a.example"}
    assert "b.example" in {u.split("/")[2] for _, u in _take(store, 10, Pace(delay=0.25), now=T0 + 2.0).entries}


def test_back_off_holds_a_site_back_for_every_taker(store):
    _queue(store, [f"http://a.example/{i}" for i in range(5)])
    assert len(_take(store, 1).entries) == 1
    sites.back_off(store, "a.example", T0 + 30)
    assert _take(store, 5, now=T0 + 29.9, taker="other").entries == []
    taken = _take(store, 5, now=T0 + 30, taker="other")
    assert len(taken.entries) == 1  # burst 1, no delay: one a call
    assert taken.next_ready == T0 + 30


def test_no_delay_hands_out_a_burst_and_next_ready_says_when(store):
    _queue(store, [f"http://a.example/{i}" for i in range(10)])
    taken = _take(store, 10, Pace(delay=0, burst=4))
    assert [u for _, u in taken.entries] == [f"http://a.example/{i}" for i in range(4)]
    assert taken.next_ready == T0
    polite = _take(store, 10, Pace(delay=0.5), now=T0 + 1)
    assert len(polite.entries) == 1 and polite.next_ready == T0 + 1.5


def test_every_task_is_handed_out_exactly_once(store):
    urls = [f"http://s{i % 37}.example/{i}" for i in range(3000)]  # more than one sort batch
    _queue(store, urls)
    got: list[str] = []
    now = T0
    for i in range(2000):
        taken = _take(store, 50, Pace(delay=0.25), now=now, taker=f"c{i % 3}")
        got += [u for _, u in taken.entries]
        if taken.next_ready is None:
            break
        now = max(now, taken.next_ready or now)
    assert sorted(got) == sorted(urls)


def test_entries_added_to_the_stream_directly_are_queued_by_site_and_counted(store):
    """What ``dedupnet reassign`` or re-crawled seeds add to the stream goes to its
    site's list at the next take, and every task is counted once wherever it is."""
    store.ensure_group(TASK_POOL, GROUP)
    batch = store.batch()
    sites.queue_tasks(batch, store, ["http://a.example/1", "http://a.example/2"])
    store.execute(batch)
    store.stream_add(TASK_POOL, ["http://b.example/1", "not a url"])
    assert sites.task_count(store) == 4
    taken = _take(store, 10, Pace(delay=1.0))
    assert sorted(u for _, u in taken.entries) == ["http://a.example/1", "http://b.example/1", "not a url"]
    assert sites.task_count(store) == 4  # handed out: in the stream until finished
    store.stream_done(TASK_POOL, GROUP, [eid for eid, _ in taken.entries])
    assert sites.task_count(store) == 1


def test_unsort_puts_every_queued_task_back_in_the_stream(store):
    _queue(store, [f"http://s{i % 5}.example/{i}" for i in range(50)])
    _take(store, 3, Pace(delay=1.0))  # three handed out (pending), 47 queued by site
    sites.unsort(store, sites_per_call=2)
    entries = store.redis.xrange(store.key(TASK_POOL))
    assert len(entries) == 50 and sites.task_count(store) == 50
    assert sorted(f[b"u"].decode() for _, f in entries) == sorted(f"http://s{i % 5}.example/{i}" for i in range(50))
    assert store.redis.zcard(store.key(sites.SITES)) == 0


def test_counts(store):
    _queue(store, [f"http://a.example/{i}" for i in range(3)] + ["http://b.example/1", "http://c.example/1"])
    _take(store, 2, Pace(delay=1.0))  # a and b (sorted by name among equals); c waits for a slot
    c = sites.counts(store, now=T0 + 0.5)
    assert (c.sites_queued, c.sites_waiting) == (2, 1)  # b is done; a waits for its delay
    assert c.ready_wait > 0  # c has waited since it was queued


def test_counts_of_a_host_with_nothing_queued_yet(store):
    """A host whose crawler has not started: no task_pool, no group (its status must answer)."""
    assert sites.counts(store) == sites.SiteCounts(0, 0, 0.0)
    assert sites.task_count(store) == 0


def test_queued_tasks_and_the_schedule_survive_a_redis_restart(tmp_path):
    """The per-site lists, the schedule and the leases are Redis data like task_pool:
    after a restart on the append-only file, every task is handed out once, the one
    leased before the restart is not handed out again, and a site's time holds."""
    from dedupnet.adapters.storage.embedded import EmbeddedRedis
    from dedupnet.adapters.storage.store import Store

    urls = [f"http://s{i % 7}.example/{i}" for i in range(200)]
    with EmbeddedRedis(persistent=True, data_dir=tmp_path) as url:
        store = Store(url, "r")
        _queue(store, urls)
        first = _take(store, 7, Pace(delay=10.0)).entries  # one of each site, each then waits 10 s
        store.close()
    with EmbeddedRedis(persistent=True, data_dir=tmp_path) as url:
        store = Store(url, "r")
        assert _take(store, 50, Pace(delay=10.0), now=T0 + 9).entries == []  # the schedule came back
        got, now = [u for _, u in first], T0 + 10
        while (taken := _take(store, 50, Pace(delay=10.0), now=now)).entries:
            got += [u for _, u in taken.entries]
            now += 10
        assert sorted(got) == sorted(urls)
        store.close()


@pytest.mark.slow
def test_a_million_queued_urls_cost_the_taker_no_memory(store):
    """1,000,000 tasks over 100,000 sites wait in Redis; the process that takes from
    them holds nothing per queued URL or per queued site (only what it takes): its
    RSS grows by less than 20 MB while it takes from all of them."""
    import resource

    n, n_sites = 1_000_000, 100_000
    store.ensure_group(TASK_POOL, GROUP)
    for start in range(0, n, 50_000):
        batch = store.batch()
        sites.queue_tasks(batch, store, [f"http://s{i % n_sites}.example/p/{i}" for i in range(start, start + 50_000)])
        store.execute(batch)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB; a peak: it only grows
    handed = 0
    for k in range(200):
        handed += len(_take(store, 64, Pace(delay=0.25), now=T0 + k * 0.01, taker="big").entries)
    c = sites.counts(store, now=T0 + 2)
    assert handed == 200 * 64 and c.sites_queued == n_sites
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) < 20 * 1024


def test_an_idle_taker_wakes_at_once_when_tasks_are_queued(store):
    """It waits in Redis on the bell that every batch of queued tasks rings: not until
    its timeout (a taker of another process, too, wakes this way)."""
    import threading

    store.ensure_group(TASK_POOL, GROUP)
    idle = _take(store, 10)
    assert idle.entries == [] and idle.next_ready is None
    assert sites.wait_for_new(store, idle, 1) is False  # ran out: a taker may wait again without a take
    woke, came = threading.Event(), []
    waiter = threading.Thread(target=lambda: (came.append(sites.wait_for_new(store, idle, 20_000)), woke.set()))
    waiter.start()
    try:
        assert not woke.wait(0.3)  # still waiting: nothing new
        batch = store.batch()
        sites.queue_tasks(batch, store, ["http://a.example/1"])
        store.execute(batch)
        assert woke.wait(5)
    finally:
        waiter.join(25)
    assert came == [True]
    assert [u for _, u in _take(store, 10).entries] == ["http://a.example/1"]


def test_the_frontier_in_metrics():
    from dedupnet.adapters.monitor.levels import levels_of

    body = {"role": "host", "network": 1, "pools": {}, "connected": True,
            "crawler": {"in_progress": 40, "on_the_wire": 31},
            "frontier": {"sites_queued": 120, "sites_waiting": 80, "ready_wait": 2.5}}
    series = {(name, tuple(sorted(labels.items()))): v for name, labels, v in levels_of(body)}
    assert series["fetch_slots_in_use", ()] == 31
    assert series["frontier_sites", (("state", "queued"),)] == 120
    assert series["frontier_sites", (("state", "waiting"),)] == 80
    assert series["frontier_ready_wait_seconds", ()] == 2.5


def test_a_queued_url_is_kept_without_its_site_and_comes_back_whole(store):
    """Its site's list knows the site: ``http[s]://<site>`` is one byte; any other
    form is kept whole. Whatever path a URL takes (queued by a writer or moved from
    the stream; handed out, or moved back by unsort), it comes back to the letter."""
    urls = ["http://a.example/x?q=1", "https://a.example/", "http://a.example:8080/p", "http://u:p@a.example/",
            "https://[::1]:8443/v6", "http://a.example", "ftp://a.example/f", "not a url", "http://A.example/up"]
    assert all(sites.unpack(sites.pack(u, s), s) == u for u in urls for s in ("a.example", "[::1]", "?"))
    batch = store.batch()
    sites.queue_tasks(batch, store, urls)
    store.execute(batch)
    store.stream_add(TASK_POOL, urls)  # the other way in: moved into the lists by a take
    _take(store, 0)
    assert sorted(sites.queued_urls(store)) == sorted(urls * 2)
    assert store.redis.lindex(store.key(sites.QUEUE) + "a.example", 0) == b"\x01/x?q=1"
    handed = [u for _, u in _take(store, 3, Pace(delay=0, burst=2)).entries]
    assert len(handed) == 3 and set(handed) <= set(urls)
    sites.unsort(store)  # the rest into the stream beside the three handed out
    assert sorted(f[b"u"].decode() for _, f in store.redis.xrange(store.key(TASK_POOL))) == sorted(urls * 2)


def test_drop_takes_urls_out_wherever_they_wait(store):
    """What moved to another host leaves this one's task_pool: queued in a list (whole
    or packed) or handed out; the others stay, and the count follows."""
    _queue(store, ["http://a.example/1", "http://a.example/2", "http://u@b.example/3", "http://c.example/4"])
    handed = [u for _, u in _take(store, 1, Pace(delay=1.0)).entries]  # a.example/1, into the stream
    assert handed == ["http://a.example/1"] and sites.task_count(store) == 4
    gone = sites.drop(store, ["http://a.example/1", "http://a.example/2", "http://u@b.example/3",
                                     "http://never.example/"])
    assert gone == 3 and sites.task_count(store) == 1
    assert sites.queued_urls(store) == ["http://c.example/4"] and store.redis.xlen(store.key(TASK_POOL)) == 0


def test_a_task_of_many_sites_is_queued_once_whole(store):
    """A center's task with a URL on each of 9,000 sites, written once (its number, as a
    host's reactor writes it) and then again as a re-sent batch: every URL queued once,
    every site scheduled and marked for the compactor. The sites' commands go in chunks:
    one ZADD of every site is more than the once-script can unpack."""
    urls = [f"http://s{k}.example/p" for k in range(9_000)]
    for _ in range(2):
        batch = store.batch()
        sites.queue_tasks(batch, store, urls, number=77)
        store.execute(batch)
    assert sorted(sites.queued_urls(store)) == sorted(urls)
    assert store.command(b"ZCARD", store.key(sites.SITES)) == 9_000
    assert store.command(b"SCARD", store.key(sites.site_blocks.DIRTY)) == 9_000
    assert sites.task_count(store) == 9_000

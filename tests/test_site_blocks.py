"""Sites' lists sealed into blocks (local_host/frontier/site_blocks.py) on a real Redis: every step
keeps each queued URL in exactly one place, in its order, whoever works meanwhile; and a
queue of realistic URLs costs what docs/BENCHMARKS.md says."""

from __future__ import annotations

import threading

from dedupnet.adapters.storage.store import TASK_POOL
from dedupnet.harness.url_shapes import distinct_urls
from local_host.frontier import site_blocks, sites
from local_host.frontier.sites import Pace
from local_host.frontier.tasks import GROUP

T0 = 1_800_000_000.0


def _queue(store, urls):
    store.ensure_group(TASK_POOL, GROUP)
    batch = store.batch()
    sites.queue_tasks(batch, store, urls)
    store.execute(batch)


def _compact(store):
    while store.drive(sites.compact_steps(store)):
        pass


def _elements(store, site):
    return store.redis.lrange(store.key(sites.QUEUE) + site, 0, -1)


def _take_all(store, pace=Pace(burst=1000), taker="c"):
    got, now = [], T0
    while True:
        taken = sites.take(store, taker, 500, pace, now=now)
        got += [u for _, u in taken.entries]
        if taken.next_ready is None:
            return got
        now = max(now, taken.next_ready)


def test_sealed_urls_come_out_once_each_in_their_order(store):
    urls = [f"https://a.example/docs/{i}.html" for i in range(1000)] + [f"http://b.example/{i}" for i in range(300)]
    _queue(store, urls[:700])
    _queue(store, urls[700:])
    _compact(store)
    a = _elements(store, "a.example")
    assert len(a) < 20 and all(map(site_blocks.is_block, a[:-1]))  # 1,000 URLs in 16 blocks (64 each)
    assert sites.queued_urls(store) == urls  # site by site, each in its order
    assert dict(sites.queued_by_site(store)) == {"a.example": 1000, "b.example": 300}
    got = _take_all(store)
    assert sorted(got) == sorted(urls) and len(got) == len(set(got))
    assert [u for u in got if "a.example" in u] == urls[:1000]  # first in, first out within a site
    assert sites.task_count(store) == len(urls)  # handed out, not finished: still the host's tasks
    assert int(store.redis.get(store.key(sites.QUEUED_COUNT))) == 0


def test_a_tail_appended_to_while_it_is_read_is_not_sealed(store):
    """The compare-and-set: a seal planned from a tail that changed since does nothing,
    and the site is marked for the next round."""
    _queue(store, [f"http://a.example/{i}" for i in range(40)])
    key = store.key(sites.QUEUE) + "a.example"
    n, digest, new = site_blocks.plan_seal(_elements(store, "a.example"), whole=True)
    _queue(store, ["http://a.example/late"])
    assert store.redis.eval(site_blocks._SEAL, 1, key, n, digest, *new) == 0
    assert len(_elements(store, "a.example")) == 41
    _compact(store)
    assert len(_elements(store, "a.example")) == 1  # one block of 41
    assert sites.queued_urls(store) == [f"http://a.example/{i}" for i in range(40)] + ["http://a.example/late"]


def test_a_full_block_is_kept_and_a_partial_one_topped_up(store):
    _queue(store, [f"http://a.example/{i}" for i in range(100)])
    _compact(store)
    assert [site_blocks.count_of(e) for e in _elements(store, "a.example")] == [64, 36]
    _queue(store, [f"http://a.example/x{i}" for i in range(5)])
    _compact(store)  # 5 plain: fewer than SEAL_MIN, left for more
    assert [site_blocks.count_of(e) for e in _elements(store, "a.example")] == [64, 36, 1, 1, 1, 1, 1]
    _queue(store, [f"http://a.example/y{i}" for i in range(30)])
    _compact(store)
    assert [site_blocks.count_of(e) for e in _elements(store, "a.example")] == [64, 64, 7]


def test_urls_split_off_at_the_head_are_not_sealed_again(store):
    """A seal tops up the last block and stops there: the head's plain URLs (split off
    by a taker) stay plain, not sealed only to be split again."""
    _queue(store, [f"http://a.example/{i}" for i in range(100)])
    _compact(store)
    assert [u for _, u in sites.take(store, "c", 3, Pace(burst=3), now=T0).entries] == \
        [f"http://a.example/{i}" for i in range(3)]
    _queue(store, [f"http://a.example/x{i}" for i in range(10)])
    _compact(store)
    assert [site_blocks.count_of(e) for e in _elements(store, "a.example")] == \
        [1] * (site_blocks.SPLIT - 3) + [64 - site_blocks.SPLIT, 46]
    assert sites.queued_urls(store) == [f"http://a.example/{i}" for i in range(3, 100)] + \
        [f"http://a.example/x{i}" for i in range(10)]


def test_a_split_of_a_head_that_changed_does_nothing(store):
    _queue(store, [f"http://a.example/{i}" for i in range(100)])
    _compact(store)
    key = store.key(sites.QUEUE) + "a.example"
    head = _elements(store, "a.example")[0]
    assert store.redis.eval(*site_blocks.split_args(key, head)[1:]) == 1
    assert [site_blocks.count_of(e) for e in _elements(store, "a.example")][:site_blocks.SPLIT + 1] == \
        [1] * site_blocks.SPLIT + [64 - site_blocks.SPLIT]
    assert store.redis.eval(*site_blocks.split_args(key, head)[1:]) == 0  # that block is gone
    assert sites.queued_urls(store) == [f"http://a.example/{i}" for i in range(100)]


def test_drop_finds_urls_in_blocks_and_plain(store):
    urls = [f"http://a.example/{i}" for i in range(150)] + ["http://b.example/1"]
    _queue(store, urls)
    _compact(store)
    _queue(store, ["http://a.example/tail"])
    gone = [f"http://a.example/{i}" for i in range(0, 150, 7)] + ["http://a.example/tail", "http://b.example/1",
                                                                  "http://c.example/never"]
    assert sites.drop(store, gone) == len(gone) - 1
    left = [u for u in urls + ["http://a.example/tail"] if u not in gone]
    assert sites.queued_urls(store) == left
    assert int(store.redis.get(store.key(sites.QUEUED_COUNT))) == len(left)


def test_unsort_puts_sealed_urls_back_in_the_stream(store):
    urls = [f"http://a.example/{i}" for i in range(200)] + [f"http://b.example/{i}" for i in range(3)]
    _queue(store, urls)
    _compact(store)
    sites.unsort(store, sites_per_call=1)
    assert sites.queued_urls(store) == [] and int(store.redis.get(store.key(sites.QUEUED_COUNT))) == 0
    assert sorted(e[1][b"u"].decode() for e in store.redis.xrange(store.key(TASK_POOL))) == sorted(urls)


def test_writers_compactors_and_takers_at_once_hand_out_each_url_once(store, redis_url, prefix):
    """Two writers, two compactors and two takers on their own connections, for 12,000
    URLs over 20 sites: each handed out exactly once, none left behind."""
    from dedupnet.adapters.storage.store import Store

    urls = [f"http://s{i % 20}.example/p/{i}" for i in range(12_000)]
    store.ensure_group(TASK_POOL, GROUP)
    stores = [Store(redis_url, prefix) for _ in range(6)]
    writing = threading.Event()
    got: list[list[str]] = [[], []]

    def write(s, part):
        for i in range(0, len(part), 37):
            batch = s.batch()
            sites.queue_tasks(batch, s, part[i:i + 37])
            s.execute(batch)

    def compact(s):
        while writing.is_set() or s.drive(sites.compact_steps(s)):
            s.drive(sites.compact_steps(s))

    def take(s, out, name):
        idle = 0
        while idle < 50:
            taken = sites.take(s, name, 20, Pace(burst=3))
            out += [u for _, u in taken.entries]
            idle = 0 if taken.entries or writing.is_set() else idle + 1

    writing.set()
    threads = [threading.Thread(target=write, args=(stores[0], urls[0::2])),
               threading.Thread(target=write, args=(stores[1], urls[1::2]))]
    others = [threading.Thread(target=compact, args=(stores[2],)), threading.Thread(target=compact, args=(stores[3],)),
              threading.Thread(target=take, args=(stores[4], got[0], "t0")),
              threading.Thread(target=take, args=(stores[5], got[1], "t1"))]
    for t in threads + others:
        t.start()
    for t in threads:
        t.join(60)
    writing.clear()
    for t in others:
        t.join(60)
    for s in stores:
        s.close()
    handed = got[0] + got[1]
    assert len(handed) == len(set(handed)) and sorted(handed) == sorted(urls)
    assert sites.queued_urls(store) == [] and int(store.redis.get(store.key(sites.QUEUED_COUNT))) == 0


def test_a_queue_of_realistic_urls_costs_under_24_bytes_a_url(store):
    """100,000 URLs of a broad crawl's shape (dedupnet/harness/url_shapes.py) over 1,000
    sites, queued as task messages bring them and sealed by the compactor: Redis'
    memory per queued URL, the lists and their fingerprints (``task_pool:fp``) both."""
    from local_host.pools import HostPools
    from local_host import protocol as hp

    pools = HostPools(store, exact=True)
    pools.setup()
    before = store.redis.info("memory")["used_memory"]
    n = 0
    for links in distinct_urls(100_000, 1_000):
        pools.apply([hp.AddTasks(tuple(links))])
        n += len(links)
    _compact(store)
    per_url = (store.redis.info("memory")["used_memory"] - before) / n
    assert sites.task_count(store) == n
    print("bytes per queued URL", round(per_url, 1))
    assert per_url < 24, per_url


async def test_a_host_daemon_seals_what_its_center_hands_it(redis_url):
    """A real center and host: the tasks the host is handed end up sealed by its daemon
    by itself, each still there once."""
    import random

    import trio

    from dedupnet.harness.cluster import open_cluster
    from tests.helpers import until

    urls = [f"http://s{i % 3}.example/page/{i}" for i in range(900)]
    async with open_cluster(redis_url, 1, 1, set_size=100, prefix=f"t{random.random()}") as cluster:
        host = next(iter(cluster.hosts.values()))
        host.pools.push(urls)
        with trio.fail_after(30):
            await cluster.wait_quiescent()
        store = host.pools.store

        def sealed():
            return all(len(_elements(store, f"s{k}.example")) <= 300 // site_blocks.BLOCK + 1 for k in range(3))

        await until(sealed, 20, what="the host's lists sealed")
        assert sorted(u for _, u in await host.store.run(host.pools.all_tasks)) == sorted(urls)

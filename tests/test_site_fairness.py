"""A host's crawler keeps every site busy as its politeness allows: a big site's queued
pages do not hold small sites back (the per-site frontier, local_host/frontier/sites.py), on a
real HTTP server on loopback and a real Redis."""

from __future__ import annotations

import trio

from dedupnet.adapters.storage.store import TASK_POOL
from tests.crawling import crawling


async def test_small_sites_are_fetched_at_once_behind_a_big_one(store, web):
    """10,000 tasks of one site queued before 10 of each of 50 small sites, with the
    daemons' politeness (0.25 s between two requests to a site): every small site's ten
    pages come within seconds (their own bound is 2.5 s), not after the big site's
    2,500 s. The big site is fetched all along, once per delay."""
    async with trio.open_nursery() as nursery:
        small = [await web.add(nursery, f"s{k}", f"127.88.1.{k + 1}") for k in range(50)]
        big = web.sites["a"]
        for site in small:
            for i in range(10):
                site.page(f"/p{i}")
        store.stream_add(TASK_POOL, [big.url(f"/p{i}") for i in range(10_000)])
        store.stream_add(TASK_POOL, [site.url(f"/p{i}") for i in range(10) for site in small])
        start = trio.current_time()
        async with crawling(store, per_site_delay=0.25, per_site_concurrency=2, concurrency=32):
            with trio.fail_after(30):
                while sum(1 for h in web.hits if h.site.startswith("s") and h.path != "/robots.txt") < 500:
                    await trio.sleep(0.05)
            took = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert took < 12.0, f"the small sites took {took:.1f} s"  # generous: a loaded machine
    big_hits = sorted(h.t for h in big.hits() if h.path != "/robots.txt")
    assert len(big_hits) >= 5  # the big site was fetched meanwhile too
    # Server-side times, in the process that also runs the crawler and 51 servers: a
    # request held up on its way in shortens the gap seen after it.
    assert min(b - a for a, b in zip(big_hits, big_hits[1:])) >= 0.25 - 0.08


def test_the_urlfrontier_service_hands_out_small_sites_behind_a_big_one(store):
    """GetURLs takes from the same per-site frontier: 5,000 tasks of one site queued
    before three of each of ten small sites (first in, first out, its window of the
    4,096 oldest would hold only the big site's)."""
    from dedupnet.adapters.monitor.metrics import Counters
    from local_host.frontier.queues import FrontierQueues, Get

    frontier = FrontierQueues(store, Counters())
    frontier.setup()
    store.stream_add(TASK_POOL, [f"http://big.example/{i}" for i in range(5000)])
    store.stream_add(TASK_POOL, [f"http://s{k}.example/{i}" for i in range(3) for k in range(10)])
    out = frontier.get(Get(max_urls_per_queue=1))
    assert sorted(queue for _, queue in out) == sorted(["big.example"] + [f"s{k}.example" for k in range(10)])

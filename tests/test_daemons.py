"""Real daemons, real TCP on loopback, real Redis: the protocol end to end."""

import random
from collections import Counter

import pytest
import trio

from dedupnet.cluster import start_cluster
from dedupnet.store import TASK_POOL


def site_urls(tag, n):
    return [f"http://site{i % 7}.example/{tag}/{i}" for i in range(n)]


async def host_tasks(host):
    entries = await host.store.run(host.store.store.redis.xrange, host.store.store.key(TASK_POOL))
    return [fields[b"u"].decode() for _, fields in entries]


async def task_pool_urls(cluster):
    """Every URL queued in any host's task_pool (one entry each)."""
    return [u for h in cluster.hosts.values() for u in await host_tasks(h)]


async def crawl_everything(cluster):
    """What a crawler does with its tasks, for the paper's look-ups: finish them."""
    for h in cluster.hosts.values():
        h.pools.finish(await host_tasks(h))


@pytest.fixture
async def system(redis_url, nursery, request):
    mode = getattr(request, "param", "exact")
    cluster = await start_cluster(nursery, redis_url, 2, 3, mode=mode, set_size=20, prefix=f"t{random.random()}")
    yield cluster
    nursery.cancel_scope.cancel()
    cluster.close()


@pytest.mark.parametrize("system", ["exact", "paper"], indirect=True)
async def test_two_networks_three_hosts_each_url_in_one_task_pool(system):
    hosts = list(system.hosts.values())
    new = site_urls("new", 200)
    crawled = site_urls("old", 30)
    # Some already crawled, in various hosts' finish_URL (in both networks).
    for i, url in enumerate(crawled):
        hosts[i % len(hosts)].pools.finish([url])
    # Several hosts find overlapping URLs (sequentially, no race: both modes are exact here).
    hosts[0].pools.push(new[:120] + crawled)
    with trio.fail_after(30):
        await system.wait_quiescent()
    await crawl_everything(system)
    hosts[4].pools.push(new[80:] + crawled[:10])
    with trio.fail_after(30):
        await system.wait_quiescent()
    queued = Counter(await task_pool_urls(system))
    assert set(queued) == set(new)
    assert max(queued.values()) == 1
    lan = system.centers[1].counters
    assert hosts[0].counters.get("urls_dropped", stage="host") > 0  # §2.2: own finish_URL
    assert lan.get("urls_dropped", stage="lan") > 0  # §2.3: another LAN host had it
    assert lan.get("urls_dropped", stage="dist") > 0  # §2.4: the other network had it


@pytest.mark.parametrize("seed", range(3))
async def test_concurrent_discovery_exact_mode_admits_once(system, seed):
    rnd = random.Random(seed)
    shared = site_urls(f"c{seed}", 150)
    async with trio.open_nursery() as pushers:
        for h in system.hosts.values():
            picked = rnd.sample(shared, 100)

            async def push(h=h, picked=picked):
                await trio.sleep(rnd.random() * 0.05)
                await h.store.run(h.pools.push, picked)
            pushers.start_soon(push)
    with trio.fail_after(60):
        await system.wait_quiescent()
    queued = Counter(await task_pool_urls(system))
    assert set(queued) == set(shared)
    assert max(queued.values()) == 1, queued.most_common(3)

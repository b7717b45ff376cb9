"""A Redis past its ``maxmemory`` refuses writes (``-OOM``): the daemons acknowledge
nothing they did not store, take no new work, say so once, and go on by themselves
when it has room again. A server of the test's own (``maxmemory`` is the server's),
real daemons on loopback, virtual time."""

import logging
import random
from collections import Counter

import pytest
import redis
import trio
from redis.exceptions import ResponseError

from dedupnet.adapters.storage.embedded import EmbeddedRedis
from dedupnet.adapters.runtime import ROOM_POLL, check_memory, open_store, until_room, until_stored
from dedupnet.adapters.storage.aio import AsyncStore
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.storage.store import TASK_POOL, URL_POOL, MemoryFull, Store, raise_if_refused
from dedupnet.codec.errors import SettingsError
from dedupnet.harness.cluster import open_cluster
from dedupnet.service.config import Settings

from .helpers import until
from .crawling import crawling, finished, settle, slow_pages


@pytest.fixture
def server():
    with EmbeddedRedis() as url:
        yield url, redis.Redis.from_url(url)


def used(client) -> int:
    return int(client.info("memory")["used_memory"])


async def task_pools(cluster) -> Counter:
    queued: Counter = Counter()
    for h in cluster.hosts.values():
        queued.update(url for _, url in await h.store.run(h.pools.all_tasks))
    return queued


def taken(cluster, client) -> list:
    """URLs each host's walker has taken from URL_pool (new work: each becomes a set to
    store), read without a write (a full Redis refuses those). What was taken before
    goes on as far as Redis takes its writes."""
    return [client.xinfo_groups(h.pools.store.key(URL_POOL))[0]["entries-read"] for h in cluster.hosts.values()]


def gauges(cluster) -> list:
    daemons = [*cluster.centers.values(), *cluster.hosts.values()]
    return [d.counters.get_gauge("store_memory_full") for d in daemons]


async def test_a_full_redis_loses_nothing_acknowledged_and_the_daemons_come_back_by_themselves(
        server, autojump_clock, caplog):
    """URLs are pushed into a host's URL_pool, as its crawler would, until Redis refuses
    the push. Every URL whose push was stored ends in exactly one task_pool: a center
    that acknowledged a set it had not stored, or a host a task, would lose it. (Before
    ``MemoryFull``, a host read its look-up's refused ``INCRBY`` as a number and died
    with a TypeError, and every daemon logged the refusal every few seconds.)"""
    url, client = server
    caplog.set_level(logging.WARNING, logger="dedupnet.adapters.runtime")
    async with open_cluster(url, 1, 2, set_size=20, prefix=f"m{random.random()}") as cluster:
        hosts = list(cluster.hosts.values())
        stored = [f"http://site{i % 5}.example/before/{i}" for i in range(100)]
        hosts[0].pools.push(stored)
        with trio.fail_after(60):
            await cluster.wait_quiescent()
        assert gauges(cluster) == [0, 0, 0]  # shown from the start

        client.config_set("maxmemory", used(client) + (256 << 10))
        maybe: list[str] = []  # a push refused part-way: some of its URLs may be in
        for chunk in range(200):
            urls = [f"http://site{i % 5}.example/fill/{chunk}/{i}" for i in range(200)]
            try:
                hosts[chunk % 2].pools.push(urls)
            except MemoryFull:
                maybe = urls
                break
            stored += urls
            await trio.sleep(0.2)  # the daemons work meanwhile, and fill it too
        else:
            pytest.fail("Redis never refused a push")

        # Full: every daemon ends up waiting, none dies, nothing moves on (once what the
        # daemons free is used up: a center re-deflating its ledger's small blocks together
        # frees some, and a set may go in it; that is bounded, so the walkers stop).
        await until(lambda: any(gauges(cluster)), timeout=120, what="a daemon finds its Redis full")
        for _ in range(10):
            await trio.sleep(30)
            before = taken(cluster, client)
            await trio.sleep(30)
            if taken(cluster, client) == before:
                break
        else:
            pytest.fail("the walkers kept taking new work from a full Redis")
        assert not any(e.is_set() for e in cluster.stopped.values())
        full = [r for r in caplog.records if "is full" in r.getMessage()]
        assert 1 <= len(full) <= len(gauges(cluster))  # once per daemon, not once per refused call
        assert "OOM" not in caplog.text  # the refusals themselves are not logged one by one

        client.config_set("maxmemory", 0)
        await until(lambda: not any(gauges(cluster)), timeout=60, what="every daemon sees room again")
        with trio.fail_after(120):
            await cluster.wait_quiescent()
        # ...and takes new work by itself.
        after = [f"http://site{i % 5}.example/after/{i}" for i in range(100)]
        hosts[1].pools.push(after)
        with trio.fail_after(60):
            await cluster.wait_quiescent()
        queued = await task_pools(cluster)

    assert len(stored) > 1000
    assert {u: n for u, n in queued.items() if n > 1} == {}, "a URL queued twice"
    assert [u for u in stored + after if not queued[u]] == [], "a URL whose push was stored is lost"
    assert set(queued) <= set(stored + after + maybe)
    room = [r for r in caplog.records if "has room again" in r.getMessage()]
    assert len(room) == len([r for r in caplog.records if "is full" in r.getMessage()])


async def test_new_work_waits_for_room_and_a_look_every_poll_finds_it(server, autojump_clock):
    """What takes new work (the walker, the crawler) waits in ``until_room`` while a write
    was refused, and goes on once a look finds room, without anyone writing meanwhile."""
    url, client = server
    store = Store(url, f"r{random.random()}")
    astore, counters = AsyncStore(store), Counters()
    try:
        await check_memory(astore, counters, store)
        assert counters.get_gauge("store_memory_full") == 0
        client.config_set("maxmemory", 1)
        wrote = []

        async def write():
            wrote.append(await until_stored(astore, counters, store.command_steps, b"SET", store.key("k"), b"v"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            await until(lambda: counters.get_gauge("store_memory_full") == 1, what="the refusal noticed")
            passed = trio.Event()

            async def take():
                await until_room(astore, counters)
                passed.set()

            nursery.start_soon(take)
            await trio.sleep(10 * ROOM_POLL)
            assert not passed.is_set() and not wrote
            nursery.cancel_scope.cancel()  # the writer gone: only the waiting taker looks
        async with trio.open_nursery() as nursery:
            nursery.start_soon(take)
            await trio.sleep(ROOM_POLL)
            client.config_set("maxmemory", 0)
            with trio.fail_after(5 * ROOM_POLL):
                await passed.wait()
        assert counters.get_gauge("store_memory_full") == 0
    finally:
        client.config_set("maxmemory", 0)
        await astore.aclose()
        store.close()


async def test_a_crawler_starts_no_fetch_while_its_redis_is_full(server, web):
    """A page's result has nowhere to go while Redis refuses writes: a crawler that went
    on fetching its leased tasks held every result in memory (all fetched again if the
    host stopped meanwhile). Now, as while Redis is down, only the pages in flight when it
    filled, and those that took their slots before the crawler saw a write refused, are
    fetched; once there is room each page is fetched once and recorded. Real time (the
    web and its client): the pause is an upper bound on what could be fetched in it."""
    url, client = server
    a = web.sites["a"]
    tasks = slow_pages(a, 20)
    store = Store(url, "crawl")
    try:
        store.stream_add(TASK_POOL, tasks)
        async with crawling(store, concurrency=2, per_site_concurrency=0, max_leased=20, take_batch=20,
                            respect_robots=False) as crawler:
            await until(lambda: a.active == 2 and crawler.in_progress == 20)
            client.config_set("maxmemory", 1)
            full_at = len(a.hits())
            await trio.sleep(1.5)  # the 18 others would all be fetched by now
            during = len(a.hits()) - full_at
            client.config_set("maxmemory", 0)
            await settle(store, crawler)
        assert during <= 2 * 2, during
        assert [len(a.hits(f"/w{i}")) for i in range(20)] == [1] * 20
        assert finished(store, tasks) == [True] * 20
    finally:
        client.config_set("maxmemory", 0)
        store.close()


def test_a_refusal_is_memory_full_wherever_the_server_says_it():
    """At a command, or at EXEC when the server filled between MULTI and EXEC (a
    transaction's results read as a list took a host down); other errors stay replies."""
    oom = "OOM command not allowed when used memory > 'maxmemory'."
    with pytest.raises(MemoryFull):
        raise_if_refused([b"OK", ResponseError(oom)])
    with pytest.raises(MemoryFull):
        raise_if_refused([b"OK", b"QUEUED", ResponseError(f"EXECABORT Transaction discarded because of: {oom}")])
    other = [ResponseError("EXECABORT Transaction discarded because of previous errors."), ResponseError("WRONGTYPE")]
    assert raise_if_refused(other) is other


async def test_a_refusal_met_through_redis_py_is_the_same_case(server, caplog):
    """Some calls go through redis-py's client (the bucket layout, a host's setup): its
    ``OutOfMemoryError`` is waited out and said once, as ``MemoryFull`` is. Real time:
    the call runs in a worker thread, and a virtual clock jumps while it does (under load
    its 20 s passed before five refusals); five back-offs are some 1.5 s."""
    url, client = server
    store = Store(url, f"p{random.random()}")
    astore, counters = AsyncStore(store), Counters()
    caplog.set_level(logging.WARNING, logger="dedupnet.adapters.runtime")
    try:
        client.config_set("maxmemory", 1)
        async with trio.open_nursery() as nursery:
            done = trio.Event()

            async def setup():
                await until_stored(astore, counters, store.redis.set, store.key("k"), b"v")
                done.set()

            nursery.start_soon(setup)
            await until(lambda: counters.get("store_errors") >= 5, what="five refusals")
            assert counters.get_gauge("store_memory_full") == 1 and not done.is_set()
            client.config_set("maxmemory", 0)
            await done.wait()
        said = [r.getMessage() for r in caplog.records]  # no "Redis call ... failed" every few seconds
        assert len(said) == 2 and "is full" in said[0] and "has room again" in said[1], said
        assert counters.get_gauge("store_memory_full") == 0
    finally:
        client.config_set("maxmemory", 0)
        await astore.aclose()
        store.close()


def test_the_embedded_redis_gets_its_maxmemory_from_the_settings_and_keeps_it_when_restarted():
    with open_store(None, "sized", data_dir=None, maxmemory="5mb") as (store, server):
        assert store.redis.config_get("maxmemory") == {"maxmemory": str(5 << 20)}
        assert store.redis.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        server.kill()
        server.restart()
        assert redis.Redis.from_url(server.url).config_get("maxmemory") == {"maxmemory": str(5 << 20)}


@pytest.mark.parametrize("given, why", [
    (dict(redis_maxmemory="lots"), "a size such as 512mb"),
    (dict(redis_maxmemory="0"), "a size such as 512mb"),  # 0 would be no limit: leave it out for that
    (dict(redis_maxmemory="2gb", redis_url="redis://127.0.0.1:6379/0"), "with redis_url, set maxmemory on"),
])
def test_a_maxmemory_that_cannot_work_is_refused(given, why):
    with pytest.raises(ValueError, match=why):
        Settings(**given)


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
async def test_a_redis_that_evicts_keys_is_refused_with_one_line(server, policy):
    url, client = server
    client.config_set("maxmemory-policy", policy)
    store = Store(url, "evicts")
    try:
        with pytest.raises(SettingsError, match=f"maxmemory-policy {policy}.*noeviction"):
            await check_memory(AsyncStore(store), Counters(), store)
    finally:
        store.close()

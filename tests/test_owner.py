"""The hash-partitioned owner baseline: real daemons, real TCP on loopback, real Redis."""

import random
from collections import Counter

import pytest
import trio

from dedupnet.service.daemons import fetch_status
from dedupnet.harness.owner import open_owner_cluster, owner_of


def urls(tag, n):
    return [f"http://site{i % 7}.example/{tag}/{i}" for i in range(n)]


async def task_pool(host):
    return [url for _, url in await host.store.run(host.pools.all_tasks)]


async def queued_where(cluster):
    """url -> list of the hosts whose task_pool has it (one per entry)."""
    where = {}
    for ip, h in cluster.hosts.items():
        for u in await task_pool(h):
            where.setdefault(u, []).append(ip)
    return where


def total(cluster, name, **labels):
    return sum(h.counters.get(name, **labels) for h in cluster.hosts.values())


@pytest.fixture
async def ring(redis_url):
    async with open_owner_cluster(redis_url, 2, 2, prefix=f"t{random.random()}",
                                  heartbeat_interval=0.2, heartbeat_timeout=2.0) as cluster:
        yield cluster


def test_rendezvous_owner_is_deterministic_and_spread():
    ips = ["127.0.1.10", "127.0.1.11", "127.0.2.10", "127.0.2.11"]
    owners = Counter(owner_of(u, ips) for u in urls("x", 2000))
    assert set(owners) == set(ips) and min(owners.values()) > 350
    assert all(owner_of(u, ips) == owner_of(u, list(reversed(ips))) for u in urls("x", 100))


async def test_each_url_lands_once_in_its_owners_task_pool(ring):
    hosts = list(ring.hosts.values())
    everything = urls("u", 600)
    pushes = {hosts[0]: everything[:300], hosts[1]: everything[200:500] + everything[:50],
              hosts[3]: everything[450:] + everything[100:150]}
    async with trio.open_nursery() as nursery:  # overlapping, concurrently
        for h, batch in pushes.items():
            nursery.start_soon(trio.to_thread.run_sync, h.pools.push, batch)
    with trio.fail_after(30):
        await ring.wait_quiescent()

    where = await queued_where(ring)
    assert set(where) == set(everything)
    assert all(ips == [owner_of(u, ring.hosts[ips[0]].ring)] for u, ips in where.items())
    remote = sum(h.owner_of(u) != h.settings.ip for h, batch in pushes.items() for u in batch)
    entries = sum(map(len, pushes.values()))
    assert total(ring, "owner_messages_sent") == remote  # one message per URL not owned locally
    assert total(ring, "frames_sent", kind="task") == remote
    assert total(ring, "owner_urls_local") == entries - remote
    assert total(ring, "owner_urls_new") == len(everything)
    assert total(ring, "owner_urls_new") + total(ring, "owner_urls_dropped") == entries
    status = await fetch_status((hosts[2].settings.ip, hosts[2].port))  # `dedupnet status`
    assert status["pools"]["URL_pool"] == 0 and len(status["connected"]) == 3
    assert status["outstanding"]["total"] == 0


async def test_urls_finished_at_their_owner_are_not_queued(ring):
    hosts = list(ring.hosts.values())
    by_ip = ring.hosts
    crawled = urls("old", 80)
    for u in crawled[:40]:  # in the owner's finish_URL: never queued again
        by_ip[hosts[0].owner_of(u)].pools.finish([u])
    for u in crawled[40:]:  # only in some other host's finish_URL: the owner decides, queued
        next(h for h in hosts if h.settings.ip != h.owner_of(u)).pools.finish([u])
    new = urls("new", 100)
    hosts[0].pools.push(new + crawled)
    hosts[2].pools.push(crawled + new[:30])
    with trio.fail_after(30):
        await ring.wait_quiescent()
    where = await queued_where(ring)
    assert set(where) == set(new) | set(crawled[40:])
    assert max(map(len, where.values())) == 1
    assert total(ring, "owner_urls_dropped") == 40 * 2 + 30 + 40  # finished twice, repeats


@pytest.mark.parametrize("victim", [0, 3])  # highest IP (others redial it), lowest (it redials)
async def test_restarted_host_loses_nothing(ring, victim):
    hosts = list(ring.hosts.values())
    ip = hosts[victim].settings.ip
    everything = urls("r", 3000)
    for k, h in enumerate(hosts):
        h.pools.push(everything[k * 500 : k * 500 + 1500])
    await trio.sleep(0.02)
    await ring.kill(ip)  # mid-way: some entries taken, some Tasks in flight to and from it
    others = [h for h in hosts if h.settings.ip != ip]
    others[0].pools.push(urls("while-down", 200))
    await trio.sleep(0.3)
    assert not await ring.quiescent()  # its URLs wait for it
    await ring.restart_host(ip)
    with trio.fail_after(30):
        await ring.wait_connected()
        await ring.wait_quiescent()
    where = await queued_where(ring)
    assert set(where) == set(everything) | set(urls("while-down", 200))
    assert all(ips == [ring.hosts[ip].owner_of(u)] for u, ips in where.items())

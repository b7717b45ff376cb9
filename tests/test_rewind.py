"""A store that comes back behind what it acknowledged (an older backup restored, an
AOF cut short) is noticed by the daemons it acknowledged to, and what they handed it is
offered again (docs/PROTOCOL.md section 7, dedupnet/adapters/storage/watermark.py). Real daemons,
real Redis: a daemon's keys are rewound by restoring a DUMP of them taken earlier."""

import random

import trio

from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.storage.watermark import Watermarks
from dedupnet.harness.cluster import open_cluster

H0, H1 = "127.0.1.10", "127.0.1.11"


def snapshot(store) -> dict[bytes, bytes]:
    """Every key of the daemon's prefix, as DUMP gives it: the store at this moment."""
    return {k: store.redis.dump(k) for k in store.redis.scan_iter(match=f"{store.prefix}:*")}


def rewind(store, snap: dict[bytes, bytes]) -> None:
    store.delete_prefix()
    for k, v in snap.items():
        store.redis.restore(k, 0, v)


def cluster(redis_url):
    return open_cluster(redis_url, 1, 2, set_size=20, prefix=f"rewind{random.random()}", heartbeat_interval=0.1)


async def tasks_of(host) -> set[str]:
    return {u for _, u in await host.store.run(host.pools.all_tasks)}


async def heard(daemon, member: str, store) -> None:
    """Until ``daemon`` has heard the durable step ``store`` is at now."""
    while daemon.marks.step_of(member) < store.watermark[1]:
        await trio.sleep(0.02)


async def test_a_host_whose_store_comes_back_behind_gets_its_tasks_again(redis_url):
    async with cluster(redis_url) as system:
        center = system.centers[1]
        store1 = system.stores[f"host:{H1}"]
        before = snapshot(store1)
        urls = [f"http://site{i}.example/" for i in range(60)]
        with trio.fail_after(60):
            await system.hosts[H0].store.run(system.hosts[H0].pools.push, urls)
            await system.wait_quiescent()
            share = await tasks_of(system.hosts[H1])
            assert share and share | await tasks_of(system.hosts[H0]) == set(urls)
            await heard(center, H1, system.hosts[H1].pools.store)
            # H1's Redis comes back as it was before those tasks: they are gone from it.
            await system.kill(H1)
            rewind(store1, before)
            h1 = await system.start_host(1, 1)
            while center.counters.get("stores_behind", member=H1) == 0:
                await trio.sleep(0.02)
            await system.wait_quiescent()
            assert await tasks_of(h1) == share  # every task back, none twice
        assert center.counters.get("tasks_reoffered") >= len(share)
        assert center.counters.get("rewind_unrepaired", member=H1) == 0


async def test_a_center_whose_store_comes_back_behind_gets_the_acknowledged_sets_again(redis_url):
    async with open_cluster(redis_url, 2, 1, set_size=20, prefix=f"rewind{random.random()}",
                            heartbeat_interval=0.1) as system:
        center1, center2 = system.centers[1], system.centers[2]
        h0 = system.hosts[H0]
        cstore = system.stores["center1"]
        # Network 2 is down: the URLs homed there wait in center 1, acknowledged to H0 as stored.
        await system.kill("center2")
        before = snapshot(cstore)
        urls = [f"http://site{i}.example/" for i in range(60)]
        with trio.fail_after(60):
            await h0.store.run(h0.pools.push, urls)
            while (await h0.store.run(h0.pools.sizes))["URL_pool"] or h0.core.unacked or not center1.core.stages.sets:
                await trio.sleep(0.02)
            await heard(h0, "center", cstore)
            # Center 1's Redis comes back as it was before those sets.
            await system.kill("center1")
            rewind(cstore, before)
            await system.start_center(2, 2, port=center2.port)
            center1 = await system.start_center(1, 2, port=center1.port)
            while h0.counters.get("stores_behind", member="center") == 0:
                await trio.sleep(0.02)
            await system.wait_connected()
            await system.wait_quiescent()
            queued = [u for h in system.hosts.values() for _, u in await h.store.run(h.pools.all_tasks)]
        assert sorted(queued) == sorted(urls)  # none lost, none queued twice
        assert h0.counters.get("sets_reoffered") >= 1
        assert h0.counters.get("rewind_unrepaired", member="center") == 0


def test_a_lower_step_or_another_incarnation_is_behind_once():
    marks = Watermarks(Counters())
    assert marks.hear("h", ("a", 5)) is None
    assert marks.hear("h", ("a", 9)) is None
    behind = marks.hear("h", ("a", 4))
    assert behind is not None and not behind.replaced and "5 acknowledged steps lost" in behind.describe()
    assert marks.hear("h", ("a", 4)) is None and marks.hear("h", ("a", 6)) is None  # said once
    assert marks.hear("h", ("b", 0)).replaced
    assert marks.counters.get("stores_behind", member="h") == 2

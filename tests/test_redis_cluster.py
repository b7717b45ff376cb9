"""The store on a real Redis Cluster: three masters started from the
embedded ``valkey-server`` in cluster mode on loopback ports (``EmbeddedCluster``).

What is checked: the key layout (a daemon's own keys share a slot, fingerprint buckets
spread over every master), every store operation, a batch as one round trip per node,
``-MOVED`` and ``-ASK`` followed, a transaction across slots made whole again after a
crash between its two halves (the redo record), the protocol end to end on the cluster
(``dedupnet sim``: 0 duplicates, 0 lost), and a master SIGKILLed under a running crawl:
a clear error, retried, nothing lost once it is back.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import time

import numpy as np
import pytest
import redis
import trio

from dedupnet.adapters.storage.store_choice import on_trio, store_for
from dedupnet.harness.embedded_cluster import EmbeddedCluster
from dedupnet.codec.errors import StoreUnavailable
from dedupnet.adapters.storage.redis_cluster import (
    AsyncClusterStore,
    ClusterStore,
    Wave,
    bucket_slots,
    cluster_seeds,
    execute_plan,
    slot_of,
)
from dedupnet.adapters.storage.store import FINISH_URL
from dedupnet.codec.backoff import Backoff

_prefixes = itertools.count()


@pytest.fixture(scope="module")
def cluster():
    c = EmbeddedCluster(3)
    c.start()
    yield c
    c.stop()


@pytest.fixture
def cstore(cluster):
    s = store_for(cluster.url, f"c{os.getpid()}-{next(_prefixes)}")
    yield s
    s.delete_prefix()
    s.close()


def fps(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**64, n, dtype=np.uint64)


def test_url_parsing_and_dispatch(cluster):
    assert cluster_seeds("redis+cluster://a:1,b:2") == ([("a", 1), ("b", 2)], {})
    assert cluster_seeds("redis+cluster://u:pw@h:7000")[1] == {"username": "u", "password": "pw"}
    with pytest.raises(ValueError, match="only database 0"):
        cluster_seeds("redis+cluster://h:7000/?db=2")
    assert isinstance(store_for(cluster.url, "x"), ClusterStore)
    with pytest.raises(ValueError, match="braces"):
        store_for(cluster.url, "a{b}")


def test_keys_share_a_slot_and_buckets_spread_over_every_master(cstore, cluster):
    own = {slot_of(cstore.key(p).encode()) for p in ("URL_pool", "task_pool", "task_URL", "local_reduce_pool",
                                                      "dist_reduce_pool", "number_seq", "redo")}
    assert own == {cstore.home_slot}
    cstore.slots.refresh()
    assert cstore.slots.loaded
    slots = bucket_slots(cstore.fp_key("admitted"), cstore.bucket_bits)
    owners = {cstore.slots.node(int(s)) for s in slots}
    assert len(set(slots.tolist())) > 900 and len(owners) == 3  # ~990 expected; the prefix (a pid) varies it
    # and the data lands there: every master holds about a third of the buckets
    cstore.fp_add("admitted", fps(30_000))
    per_node = [redis.Redis(port=n.port).dbsize() for n in cluster.nodes]
    assert all(250 < k < 450 for k in per_node), per_node


def test_every_store_operation(cstore):
    f = fps(5000)
    assert cstore.fp_add(FINISH_URL, f) == 5000
    assert cstore.fp_add(FINISH_URL, f[:100]) == 0
    flags = cstore.fp_contains(FINISH_URL, np.r_[f[:50], fps(50, seed=2)])
    assert flags[:50].all() and not flags[50:].any()
    assert cstore.fp_count(FINISH_URL) == 5000
    assert cstore.fp_remove(FINISH_URL, f[:10]) == 10
    ids = cstore.stream_add("URL_pool", ["http://a/", "http://b/"])
    cstore.ensure_group("URL_pool", "g")
    cstore.ensure_group("URL_pool", "g")  # BUSYGROUP is fine
    assert [u for _, u in cstore.stream_take("URL_pool", "g", "c", 10)] == ["http://a/", "http://b/"]
    assert cstore.stream_done("URL_pool", "g", ids) == 2
    assert list(cstore.next_sequences(3)) == [1, 2, 3]

    def fill(batch):
        batch.add(b"HSET", cstore.key("local_reduce_pool"), 7, b"frame")
        batch.fingerprints(b"SADD", cstore.key("admitted"), f[:300])
        batch.add(b"HLEN", cstore.key("local_reduce_pool"))

    results = cstore.transact(fill)
    assert results[0] == 1 and results[-1] == 1 and sum(results[1:-1]) == 300
    assert cstore.fp_contains("admitted", f[:300]).all()
    # the buckets are written; the redo record goes with the next transaction's MULTI
    assert cstore.command(b"HLEN", cstore.key("redo")) == 1
    cstore.transact(lambda b: b.add(b"HSET", cstore.key("local_reduce_pool"), 8, b"frame"))
    assert cstore.command(b"HLEN", cstore.key("redo")) == 0
    assert cstore.used_memory() > 0


def test_a_batch_is_one_round_trip_per_node(cstore):
    cstore.fp_contains(FINISH_URL, fps(10))  # the slot map is loaded
    before = cstore.round_trips
    cstore.fp_contains(FINISH_URL, fps(3000))  # ~950 buckets on 3 nodes
    assert cstore.round_trips - before == 1  # one wave: every node's pipeline written, then read


def test_stale_slot_map_follows_moved(cstore):
    f = fps(2000)
    cstore.fp_add(FINISH_URL, f)
    wrong = cstore.slots.known[0]
    cstore.slots.owner = [wrong] * len(cstore.slots.owner)  # as if every slot had moved there
    before = cstore.slots.refreshes
    assert cstore.fp_contains(FINISH_URL, f).all()
    assert cstore.slots.refreshes == before + 1


def test_ask_during_a_slot_migration(cstore, cluster):
    """A slot half-way through a migration: a key the source no longer has is answered
    ``-ASK`` and written on the importing node behind ``ASKING``."""
    key = cstore.key("task_URL")
    slot = cstore.home_slot
    cstore.command(b"HSET", key, b"a", b"1")
    cstore.slots.refresh()
    source = cstore.slots.node(slot)
    target = next(a for a in cstore.slots.known if a != source)
    src, dst = (redis.Redis(host=a[0], port=a[1]) for a in (source, target))
    src_id, dst_id = (c.execute_command("CLUSTER MYID") for c in (src, dst))
    other = f"{{{cstore.prefix}}}:elsewhere"  # same slot, not on the source: ASK for it
    try:
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
        src.execute_command("MIGRATE", target[0], target[1], "", 0, 5000, "KEYS", key)
        assert cstore.command(b"HGET", key, b"a") == b"1"  # ASK -> the importing node
        cstore.command(b"SET", other, b"x")
        assert dst.execute_command("ASKING") and dst.execute_command("GET", other) == b"x"
    finally:
        for c in (src, dst):
            c.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
        src.close()
        dst.close()
    cstore.slots.refresh()
    assert cstore.slots.node(slot) == target


def test_a_transaction_cut_between_its_halves_is_replayed(cstore, cluster):
    """The crash window of a cross-slot transaction: EXEC committed on the home slot,
    the fingerprint writes on the other masters not sent. Any store opened on the
    prefix applies the redo record before its first batch."""
    f = fps(500, seed=3)
    batch = cstore.batch()
    batch.add(b"MULTI")
    batch.add(b"HDEL", cstore.key("local_reduce_pool"), 9)
    batch.fingerprints(b"SADD", cstore.key("admitted"), f)
    batch.add(b"EXEC")
    cstore.redo_unchecked = False  # (it would look for an earlier redo record first)
    cstore.slots.refresh()
    plan = execute_plan(cstore, batch)
    step = next(plan)
    assert isinstance(step, Wave) and len(step.sends) == 1  # MULTI ... EXEC on the home slot's node
    step = plan.send(cstore._wave(step.sends))  # EXEC committed ...
    assert isinstance(step, Wave) and len(step.sends) == 3  # ... the buckets' writes would go to every master,
    plan.close()  # ... but the process "dies" here
    assert cstore.redis.hlen(cstore.key("redo")) == 1
    assert not cstore.fp_contains("admitted", f).any()  # (this store does not look for redo records again)
    other = store_for(cstore.url, cstore.prefix)  # a restarted daemon
    try:
        assert other.fp_contains("admitted", f).all()
        assert other.command(b"HLEN", other.key("redo")) == 0
    finally:
        other.close()


def test_bloom_finish_url_on_the_cluster(cstore):
    from dedupnet.adapters.storage.bloom import BloomSpec, attach

    spec = BloomSpec(3_000_000, 0.01)  # 28.8 M bits: 28 segment keys, spread over the masters
    attach(cstore, spec)
    f = fps(5000, seed=6)
    # inside a transaction too: the segments are not on the home slot (the redo record)
    cstore.transact(lambda b: (b.add(b"XADD", cstore.key("URL_pool"), b"*", b"u", b"x"),
                               b.fingerprints(b"SADD", cstore.key(FINISH_URL), f)))
    assert cstore.fp_contains(FINISH_URL, f).all()
    assert cstore.fp_contains(FINISH_URL, fps(5000, seed=7)).mean() < 0.01
    keys = [k.decode() for k in cstore.redis.scan_iter(match=f"{cstore.prefix}:finish_URL:bloom:*")]
    assert len(keys) == 28 and len({cstore.slots.node(slot_of(k.encode())) for k in keys}) == 3


def test_async_store_on_the_cluster(cstore):
    from local_host.pools import HostPools

    pools = HostPools(cstore, exact=True)

    async def main():
        astore = on_trio(cstore)
        assert isinstance(astore, AsyncClusterStore)
        f = fps(3000, seed=4)
        n = await astore.drive(cstore.transact_steps(lambda b: b.fingerprints(b"SADD", cstore.key(FINISH_URL), f)))
        assert sum(n) == 3000
        from local_host import protocol as hp

        done = await astore.drive(pools.lookup_steps(hp.Lookup(("t", 1), ("http://x.example/",), 2)))
        assert done.seen == [False] and list(done.sequences) == [1, 2]
        assert (await astore.command(b"XLEN", cstore.key("URL_pool"))) == 0
        await astore.aclose()

    trio.run(main)


def test_protocol_end_to_end_on_the_cluster(cluster):
    from dedupnet.harness.report import SimConfig
    from dedupnet.harness.sim import simulate

    cfg = SimConfig(networks=2, hosts=2, pages=300, sites=10, timeout=60)
    r = trio.run(functools.partial(simulate, cfg, cluster.url, out=None))
    assert not r.timed_out
    assert r.duplicate_fetches == 0 and r.lost_urls == 0 and r.fetched_urls == r.reachable_urls


def test_every_daemon_its_own_process_on_the_cluster(cluster):
    """``dedupnet sim --processes --redis-cluster N``: every daemon process is given the
    cluster URL, and the harness reads counters and memory from every node. The run
    leaves none of its keys behind."""
    from dedupnet.adapters.storage.redis_cluster import admin_client
    from dedupnet.harness.faults import Fault
    from dedupnet.harness.report import SimConfig
    from dedupnet.harness.simproc import simulate_processes

    cfg = SimConfig(networks=2, hosts=2, pages=300, sites=10, timeout=60)
    r = trio.run(functools.partial(simulate_processes, cfg, cluster.url, out=None))
    assert not r.timed_out
    assert r.duplicate_fetches == 0 and r.lost_urls == 0 and r.fetched_urls == r.reachable_urls
    assert r.redis_lookups > 0 and r.redis_bytes["center"].get("admitted", 0) > 0
    admin = admin_client(cluster.url)
    try:
        assert not list(admin.scan_iter(match="simproc-*", target_nodes=admin.PRIMARIES))
    finally:
        admin.close()
    with pytest.raises(ValueError, match="kill-redis"):
        trio.run(functools.partial(simulate_processes, dataclasses.replace(cfg, faults=(Fault("kill-redis"),)),
                                   cluster.url, out=None))


def test_a_killed_master(cluster, caplog):
    """SIGKILL one master while a crawl runs: the daemons log the error and retry, the
    crawl finishes once the node is back (restarted on its AOF and nodes.conf), and no
    URL was lost or fetched twice. A store call with nothing left to retry says what
    failed; what was written before the kill is all there after it."""
    from dedupnet.harness.report import SimConfig
    from dedupnet.harness.sim import simulate

    s = store_for(cluster.url, "killed", retry=Backoff(first=0.01, cap=2.0, attempts=2))
    before = fps(3000, seed=5)
    s.fp_add(FINISH_URL, before)
    victim = 1
    cfg = SimConfig(networks=2, hosts=1, pages=300, sites=8, timeout=60)
    report: list = [None]
    errors: list[str] = []

    def call_while_down():
        try:
            s.fp_contains(FINISH_URL, before)
        except StoreUnavailable as e:
            errors.append(str(e))

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(fault)
            report[0] = await simulate(cfg, cluster.url, out=None)

    def crawled() -> int:  # buckets of the hosts' finish_URL: the crawl is under way
        return sum(1 for _ in admin.scan_iter(match="sim-*:host:*:finish_URL:*", count=1000))

    async def fault():
        with trio.fail_after(cfg.timeout):  # a crawl that never starts fails the test, not hangs it
            while await trio.to_thread.run_sync(crawled) < earlier + 30:  # a tenth of this crawl done
                await trio.sleep(0.05)
        await trio.to_thread.run_sync(cluster.kill, victim)
        await trio.to_thread.run_sync(call_while_down)
        await trio.sleep(2.5)  # longer than cluster-node-timeout (2 s): the cluster goes CLUSTERDOWN
        await trio.to_thread.run_sync(cluster.restart, victim)

    admin = s.redis
    earlier = crawled()  # (an earlier test's crawl may have left its keys)
    trio.run(main)
    r = report[0]
    assert errors and "Redis Cluster at redis+cluster://" in errors[0] and "unavailable" in errors[0], errors
    assert not r.timed_out
    # The crawl saw the outage: a daemon's store call ran out of retries and waits for it
    # (the harness's own 0.1 s samples may ride it out inside their retries).
    assert any("retrying until it answers" in m for m in caplog.messages) or \
        any(sample.get("store_unavailable") for sample in r.timeline)
    assert r.duplicate_fetches == 0 and r.lost_urls == 0 and r.fetched_urls == r.reachable_urls
    assert any("Redis" in m and ("failed" in m or "retrying" in m) for m in caplog.messages)
    assert s.fp_contains(FINISH_URL, before).all()  # nothing lost: the node's AOF
    s.delete_prefix()
    s.close()

def test_failover_to_a_replica(caplog):
    """Three masters with a replica each: a master SIGKILLed is replaced by its replica
    (after ``cluster-node-timeout``); the store retries (connection refused, then
    ``-CLUSTERDOWN``), reloads the slot map and reads every URL from the new master."""
    cluster = EmbeddedCluster(3, replicas=1, node_timeout=1000)
    cluster.start()
    try:
        s = store_for(cluster.url, "failover", retry=Backoff(first=0.05, cap=0.5, attempts=12))
        f = fps(3000, seed=8)
        s.fp_add(FINISH_URL, f)
        slot = int(bucket_slots(s.fp_key(FINISH_URL), s.bucket_bits)[0])
        victim = cluster.master_of(slot)
        replica = next(i for i in range(3, 6) if i % 3 == victim)
        master_c, replica_c = (redis.Redis(port=cluster.nodes[i].port) for i in (victim, replica))
        deadline = time.monotonic() + 10
        while replica_c.dbsize() != master_c.dbsize() and time.monotonic() < deadline:
            time.sleep(0.02)  # asynchronous replication: what the master acknowledged reaches the replica
        assert replica_c.dbsize() == master_c.dbsize() > 0
        master_c.close()
        replica_c.close()
        cluster.kill(victim)
        assert s.fp_contains(FINISH_URL, f).all()  # after the failover, from the replica
        assert cluster.master_of(slot) == replica
        assert any("Redis Cluster:" in m for m in caplog.messages)
        s.close()
    finally:
        cluster.stop()

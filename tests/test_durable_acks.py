"""Acknowledged means on disk: a daemon sends a message that depends on an event's writes
only once its Redis has fsynced them to the AOF (``WAITAOF``), and says so when its
Redis cannot tell. Real servers with their AOF on, real daemons on loopback."""

import logging
import random

import pytest
import trio

from dedupnet.adapters.storage.embedded import EmbeddedRedis
from dedupnet.adapters.storage.store import Store
from dedupnet.harness.cluster import open_cluster


@pytest.fixture
def aof_url(tmp_path):
    """A server of its own that keeps an AOF (``appendfsync everysec``, as a daemon's)."""
    with EmbeddedRedis(persistent=True, data_dir=tmp_path / "aof") as url:
        yield url


def test_a_durable_transaction_returns_once_fsynced_and_a_plain_one_does_not_wait(aof_url):
    store = Store(aof_url, "durable")
    try:
        assert store.drive(store.durable_check_steps()) is None
        store.durable = True
        store.drive(store.transact_steps(lambda b: b.add(b"SET", store.key("a"), b"1"), durable=True))
        assert store.fsync_waits == 1
        store.drive(store.transact_steps(lambda b: b.add(b"SET", store.key("b"), b"1")))
        assert store.fsync_waits == 1  # nothing depends on it: no wait
        assert store.command(b"GET", store.key("a")) == b"1"
    finally:
        store.close()


def test_a_server_without_its_aof_is_found_out_and_never_waited_for(redis_url, prefix):
    store = Store(redis_url, prefix)  # the session's server keeps nothing on disk
    try:
        why = store.drive(store.durable_check_steps())
        assert why is not None and "appendonly" in why
        store.drive(store.transact_steps(lambda b: b.add(b"SET", store.key("a"), b"1"), durable=True))
        assert store.fsync_waits == 0
    finally:
        store.delete_prefix()
        store.close()


async def _one_set_through(url, **options):
    async with open_cluster(url, 1, 2, set_size=10, prefix=f"d{random.random()}", **options) as cluster:
        host = next(iter(cluster.hosts.values()))
        host.pools.push([f"http://site{i}.example/{i}" for i in range(25)])
        with trio.fail_after(30):
            await cluster.wait_quiescent()
        return cluster.centers[1], list(cluster.hosts.values())


async def test_daemons_wait_for_the_fsync_of_what_they_acknowledge(aof_url):
    """The host's sets (saved unacked, then sent), the center's acks and tasks, the
    other host's task acks: each such event waited for its fsync."""
    center, hosts = await _one_set_through(aof_url, durable_acks=True)
    assert center.pools.store.durable and center.pools.store.fsync_waits > 0
    assert center.counters.get_gauge("durable_acks") == 1
    assert all(h.pools.store.durable for h in hosts)
    assert sum(h.pools.store.fsync_waits for h in hosts) >= 2  # a set sent, its tasks acknowledged


async def test_daemons_on_a_redis_without_aof_warn_once_each_and_carry_on(redis_url, caplog):
    with caplog.at_level(logging.WARNING, logger="dedupnet.adapters.runtime"):
        center, hosts = await _one_set_through(redis_url, durable_acks=True)
    warnings = [r for r in caplog.records if "acknowledgements are not durable" in r.getMessage()]
    assert len(warnings) == 1 + len(hosts)
    assert "appendonly" in warnings[0].getMessage()
    assert center.counters.get_gauge("durable_acks") == 0
    assert center.pools.store.fsync_waits == 0

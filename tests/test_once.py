"""Writes that must not happen twice when their batch is sent again (a reply lost with its
connection, then the retry of Store.execute or until_stored): sending the same batch
twice is exactly what such a retry does, so the tests do that on a real Redis."""

from __future__ import annotations

from dedupnet.adapters.storage.once import APPLIED, KEEP, once
from local_host import protocol as hp
from local_host.frontier import sites
from local_host.pools import TASKS_DONE, HostPools


def _twice(store, pools, actions):
    for _ in range(2):
        batch = store.batch()
        batch.add(b"MULTI")
        pools._queue(batch, actions)
        batch.add(b"EXEC")
        store.execute(batch)


def test_tasks_sent_twice_are_queued_once(store):
    pools = HostPools(store, exact=True)
    urls = tuple(f"http://a.example/{i}" for i in range(5)) + ("http://b.example/x",)
    _twice(store, pools, [hp.AddTasks(urls, 7)])
    assert sorted(sites.queued_urls(store)) == sorted(urls)
    assert sites.task_count(store) == len(urls)


def test_another_task_message_with_the_same_urls_or_number_is_queued(store):
    """Only the very same write is done once: the same number with other URLs (a center
    that lost its store numbers anew) and other numbers with the same URLs are queued."""
    pools = HostPools(store, exact=True)
    pools.apply([hp.AddTasks(("http://a.example/1",), 7)])
    pools.apply([hp.AddTasks(("http://a.example/2",), 7)])
    pools.apply([hp.AddTasks(("http://a.example/2",), 8)])
    assert sites.queued_urls(store) == ["http://a.example/1", "http://a.example/2", "http://a.example/2"]


def test_a_report_taken_twice_trims_tasks_done_once(store):
    pools = HostPools(store, exact=True)
    store.command(b"RPUSH", store.key(TASKS_DONE), *[f"http://a.example/{i}" for i in range(10)])
    _twice(store, pools, [hp.TakeDone(4, 3)])
    assert store.command(b"LLEN", store.key(TASKS_DONE)) == 6


def test_the_newest_tokens_are_kept(store):
    for i in range(KEEP + 10):
        batch = store.batch()
        once(batch, store, f"t{i}", [(b"INCR", store.key("n"))])
        store.execute(batch)
    assert store.command(b"ZCARD", store.key(APPLIED)) == KEEP
    batch = store.batch()
    ran = once(batch, store, f"t{KEEP + 9}", [(b"INCR", store.key("n"))])
    assert store.execute(batch)[ran] == 0
    assert int(store.command(b"GET", store.key("n"))) == KEEP + 10

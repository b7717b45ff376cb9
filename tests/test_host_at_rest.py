"""A host at rest asks its Redis little: its loops wait for what makes their work (a
task finished, an ack stored, links pushed), not on a timer, each with a long deadline
(local_host/daemon.py ``RECHECK``). Virtual time (trio's MockClock): a wait that polls
shows up as reads per virtual second whatever the machine's speed."""

from __future__ import annotations

import random
import socket

import trio

from dedupnet.harness.cluster import open_cluster
from local_host.crawler.settings import CrawlerSettings
from local_host.daemon import RECHECK


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: A crawler that gives a task up at its first failure, quickly.
QUICK = CrawlerSettings(max_retries=0, respect_robots=False, per_site_delay=0.0, timeout=2.0, page_timeout=2.0)


def _counting(host, name: str) -> list[int]:
    calls = [0]
    real = getattr(host.pools, name)

    def counted(*args):
        calls[0] += 1
        return real(*args)

    counted.__name__ = real.__name__
    setattr(host.pools, name, counted)
    return calls


async def test_an_idle_host_reads_tasks_done_only_at_its_long_deadline(redis_url, autojump_clock):
    """Nothing finishes, nothing is acked: over 60 virtual seconds the report loop reads
    tasks_done about once a RECHECK, not four times a second (240 reads)."""
    async with open_cluster(redis_url, 1, 1, set_size=20, prefix=f"rest{random.random()}", crawler=QUICK) as cluster:
        host = cluster.hosts["127.0.1.10"]
        reads = _counting(host, "tasks_done")
        start = trio.current_time()
        await trio.sleep(60)
        elapsed = trio.current_time() - start
    assert reads[0] <= elapsed / RECHECK + 3, reads[0]


async def test_a_finished_task_is_reported_without_waiting_for_the_deadline(redis_url, autojump_clock):
    """The crawler's write of a done task wakes the report loop: the center hears of the
    tasks well before RECHECK, though nothing polls tasks_done meanwhile."""
    port = _closed_port()
    urls = [f"http://127.0.0.1:{port}/page{i}" for i in range(5)]
    async with open_cluster(redis_url, 1, 1, set_size=20, prefix=f"done{random.random()}", crawler=QUICK) as cluster:
        host, center = cluster.hosts["127.0.1.10"], cluster.centers[1]
        await host.store.run(host.pools.push, urls)
        with trio.fail_after(120):
            while host.crawler.pages_done < len(urls):
                await trio.sleep(0.01)
            done_at = trio.current_time()
            while center.core.members.ledger.get("127.0.1.10") or center.counters.get("tasks_reported") < len(urls):
                await trio.sleep(0.01)
        assert trio.current_time() - done_at < RECHECK / 2
        assert not await host.store.run(host.pools.tasks_done, 1)

"""Is the crawl complete, and a dead host's work moves: real daemons on loopback, real
Redis (dedupnet/adapters/monitor/census.py, dedupnet/service/reassign.py)."""

import random
import sys
from collections import Counter

import httpx
import pytest
import trio

from dedupnet.adapters.monitor.census import survey
from dedupnet.adapters.storage.store import TASK_POOL
from dedupnet.harness.cluster import open_cluster
from dedupnet.service.reassign import SET_ASIDE, Refused, reassign


def site_urls(tag, n):
    return [f"http://site{i % 11}.example/{tag}/{i}" for i in range(n)]


async def tasks_of(host):
    return [url for _, url in await host.store.run(host.pools.all_tasks)]


async def crawl(cluster):
    """What the crawlers do with their tasks: fetch each (recorded), then finish it as
    every crawler front end does (local_host/frontier/tasks.py): finish_URL, task_pool and the
    report to the center in one transaction."""
    from local_host.frontier.tasks import finish_tasks

    fetched = []
    for h in cluster.hosts.values():
        entries = await h.store.run(h.pools.all_tasks)
        fetched += [u for _, u in entries]
        urls = [u for _, u in entries]

        def finish(store=h.pools.store, eids=[i for i, _ in entries], urls=urls):
            batch = store.batch()
            finish_tasks(batch, store, eids, urls, urls, None)
            store.execute(batch)
        await h.store.run(finish)
    return fetched


async def verdict_becomes(cluster, verdict, network=1, timeout=10.0):
    """The survey's report once its verdict is ``verdict`` (the hosts' reports of finished
    tasks reach their centers within a fraction of a second)."""
    with trio.fail_after(timeout):
        while True:
            report = await survey(cluster.center_address(network), [None], settle=0.1)
            if report["verdict"] == verdict:
                return report
            await trio.sleep(0.05)


async def cli(*args):
    done = await trio.run_process([sys.executable, "-m", "dedupnet.cli", *args], capture_stdout=True,
                                  capture_stderr=True, check=False)
    done.stdout, done.stderr = done.stdout.decode(), done.stderr.decode()
    return done


async def status_json(port):
    async with httpx.AsyncClient(timeout=5) as client:
        return (await client.get(f"http://127.0.0.1:{port}/status.json")).json()


async def test_a_host_down_holding_tasks_is_stuck_until_reassigned(redis_url):
    prefix = f"verdict{random.random()}"
    async with open_cluster(redis_url, 2, 2, set_size=20, prefix=prefix, heartbeat_interval=0.1,
                            metrics=("127.0.0.1", 0)) as cluster:
        urls = site_urls("v", 300)
        hosts = list(cluster.hosts.values())
        hosts[0].pools.push(urls[:200])
        hosts[2].pools.push(urls[150:])
        with trio.fail_after(30):
            await cluster.wait_quiescent()
        center, dead = cluster.centers[1], "127.0.1.11"
        held = len(await tasks_of(cluster.hosts[dead]))
        assert held > 0
        with trio.fail_after(10):  # its heartbeats tell its center what its task_pool holds
            while center.reported_tasks.get(dead, (None,))[0] != held:
                await trio.sleep(0.05)

        report = await survey(cluster.center_address(1), [None], settle=0.1)
        assert report["verdict"] == "in progress"  # tasks wait in the task_pools (no crawler here)

        await cluster.kill(dead)  # stopped hard, as by a second SIGTERM: its task_pool stays in its Redis
        del cluster.hosts[dead]
        dead_store = cluster.stores[f"host:{dead}"]
        with trio.fail_after(10):
            while dead in center.core.members.hosts:
                await trio.sleep(0.05)
        fetched = await crawl(cluster)  # everything else is crawled

        # Asked from the other network's center, which learnt where network 1 listens from its Register.
        report = await survey(cluster.center_address(2), [None], settle=0.1)
        assert report["verdict"] == "stuck"
        assert any(f"host {dead} is down holding {held} tasks" in r for r in report["reasons"]), report["reasons"]
        assert {v["network"] for v in report["networks"]} == {1, 2}
        page = await status_json(center.http_port)  # the center's status page says so too
        assert page["crawl"]["verdict"] == "stuck" and dead in page["crawl"]["reasons"][0]
        assert {m["member"]: m["task_pool"] for m in page["liveness"] if m["kind"] == "host"}[dead] == held

        with pytest.raises(Refused, match="connected"):  # a live host keeps its tasks
            await reassign(cluster.center_address(1), "127.0.1.10", key_file=None, data=None)
        with pytest.raises(Refused, match="task_pool"):  # its own task_pool would be left behind unsaid
            await reassign(cluster.center_address(1), dead, key_file=None, data=None)

        where = "%s:%d" % cluster.center_address(1)
        out = await cli("status", "--cluster", where)
        assert out.returncode == 4 and out.stdout.strip().splitlines()[-1].startswith(
            f"verdict: stuck (host {dead} is down holding {held} tasks"), out.stdout
        out = await cli("reassign", where, "--host", dead, "--redis", redis_url, "--prefix", f"{prefix}:host:{dead}")
        assert out.returncode == 0, out.stderr
        assert f"and {held} from its task_pool handed to the live hosts" in out.stdout
        assert dead_store.redis.xlen(dead_store.key(TASK_POOL)) == 0  # a restart would not fetch them again
        assert not dead_store.redis.exists(dead_store.key(SET_ASIDE))
        with trio.fail_after(30):
            await cluster.wait_quiescent()
        fetched += await crawl(cluster)

        assert [u for u, n in Counter(fetched).items() if n > 1] == []  # 0 duplicates
        assert set(urls) - set(fetched) == set()  # 0 lost
        report = await verdict_becomes(cluster, "complete")
        assert report["reasons"] == []


def test_a_center_that_does_not_answer_is_never_complete():
    from dedupnet.adapters.monitor.census import build_report

    report = build_report({"centers": {}, "hosts": {}, "unreachable": [
        {"what": "center", "network": 2, "address": "10.2.0.1:7700", "why": "Connection refused"}]})
    assert report["verdict"] == "stuck"
    assert report["reasons"] == ["center of network 2 at 10.2.0.1:7700 did not answer (Connection refused): its "
                                 "work is unknown"]


async def test_nothing_admitted_is_not_started_and_a_restart_on_a_finished_crawl_stays_complete(redis_url, caplog):
    """0 URLs admitted anywhere is ``not started`` (exit status 5), not ``complete``; a
    crawl finished and its centers restarted on the same stores is ``complete`` with 0
    admitted since the start, and each center says at start that it resumes and what it
    holds."""
    import logging

    prefix = f"notstarted{random.random()}"
    async with open_cluster(redis_url, 2, 1, set_size=20, prefix=prefix) as cluster:
        with trio.fail_after(30):
            await cluster.wait_connected()
        report = await survey(cluster.center_address(1), [None], settle=0.1)
        assert report["verdict"] == "not started", report
        where = "%s:%d" % cluster.center_address(1)
        out = await cli("status", "--cluster", where)
        assert out.returncode == 5 and out.stdout.strip().splitlines()[-1].startswith("verdict: not started"), out.stdout

        urls = site_urls("n", 40)
        cluster.hosts["127.0.1.10"].pools.push(urls)
        with trio.fail_after(30):
            await cluster.wait_quiescent()
        assert (await survey(cluster.center_address(1), [None], settle=0.1))["verdict"] == "in progress"
        assert sorted(await crawl(cluster)) == sorted(urls)
        await verdict_becomes(cluster, "complete")

        with caplog.at_level(logging.WARNING, logger="dedupnet.center"):
            for n in (1, 2):
                await cluster.restart_center(n)
        resumed = [r.getMessage() for r in caplog.records if "resuming from an existing store" in r.getMessage()]
        before = [int(line.split("): ", 1)[1].split(" URLs admitted before")[0]) for line in resumed]
        assert len(resumed) == 2 and sum(before) == len(urls), resumed  # each its own sites' share
        with trio.fail_after(30):
            await cluster.wait_connected()
        report = await survey(cluster.center_address(1), [None], settle=0.1)
        assert report["verdict"] == "complete" and sum(v["admitted"] for v in report["networks"]) == 0
        assert sum(v["admitted_total"] for v in report["networks"]) == len(urls)
        out = await cli("status", "--cluster", where)
        assert out.returncode == 0 and "admitted 0 URLs since the center started" in out.stdout, out.stdout


async def test_a_host_gone_with_its_disk_loses_no_url_its_center_gave_it(redis_url):
    """A host killed with tasks fetched but not reported, tasks queued, and its data
    directory lost: while it is down the verdict is stuck (never complete); `dedupnet
    reassign --leave-task-pool` (nothing of its store is left to read) moves its
    center's ledger, whole sites at a time, to the live host; every URL is fetched, at
    most the unreported ones twice. Before the ledger, the center forgot acknowledged
    tasks: the verdict said complete with them never fetched."""
    from local_host.frontier.tasks import finish_tasks

    prefix = f"disklost{random.random()}"
    async with open_cluster(redis_url, 1, 2, set_size=20, prefix=prefix, heartbeat_interval=0.1) as cluster:
        urls = site_urls("d", 200)
        cluster.hosts["127.0.1.10"].pools.push(urls)
        with trio.fail_after(30):
            await cluster.wait_quiescent()
        dead = "127.0.1.11"
        entries = await tasks_of_entries(cluster.hosts[dead])
        assert len(entries) > 20
        fetched = [u for _, u in entries[:10]]  # fetched and recorded; its Redis dies before the report goes
        store = cluster.hosts[dead].pools.store

        def finish_unreported():
            batch = store.batch()
            finish_tasks(batch, store, [i for i, _ in entries[:10]], fetched, fetched, None)
            store.execute(batch)
        await cluster.hosts[dead].store.run(finish_unreported)
        await cluster.kill(dead)
        del cluster.hosts[dead]
        store.delete_prefix()  # the disk is gone
        center = cluster.centers[1]
        with trio.fail_after(10):
            while dead in center.core.members.hosts:
                await trio.sleep(0.05)
        assert len(center.core.members.ledger[dead]) == len(entries)
        fetched += await crawl(cluster)
        report = await survey(cluster.center_address(1), [None], settle=0.1)
        assert report["verdict"] == "stuck", report  # never complete while its URLs are unfetched

        where = "%s:%d" % cluster.center_address(1)
        out = await cli("reassign", where, "--host", dead, "--leave-task-pool")
        assert out.returncode == 0, out.stderr
        with trio.fail_after(30):
            await cluster.wait_quiescent()
        fetched += await crawl(cluster)
        await verdict_becomes(cluster, "complete")
    twice = [u for u, n in Counter(fetched).items() if n > 1]
    assert set(urls) - set(fetched) == set()  # 0 lost
    assert set(twice) <= set(u for _, u in entries[:10])  # only what it had fetched and not reported


async def tasks_of_entries(host):
    return await host.store.run(host.pools.all_tasks)

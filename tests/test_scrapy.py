"""Scrapy spiders as dedupnet local hosts: a real Scrapy crawl, in
subprocesses, of the synthetic web, next to real ``dedupnet center`` / ``dedupnet
local`` daemons, checked against the web's own fetch log.

Layout: network 1 has a Scrapy host (127.0.1.10, ``dedupnet local --no-crawl`` + the
example project's spider) and a host with dedupnet's own crawler (127.0.1.11);
network 2 has a Scrapy host (127.0.2.10). Each spider binds its host's IP
(``DOWNLOAD_BIND_ADDRESS``), so the web's log says who fetched what.
"""

from __future__ import annotations

import collections
import os
import signal
import time
from pathlib import Path

import pytest
import redis
import trio

pytest.importorskip("scrapy")

from scrapy import Request  # noqa: E402

from dedupnet.harness import procdaemons, procplan, simproc  # noqa: E402
from dedupnet.scrapy import GROUP, TASK_META, TaskBook  # noqa: E402
from dedupnet.harness.report import SimConfig, assign_seeds  # noqa: E402
from dedupnet.harness.scrapyhost import Spider  # noqa: E402
from dedupnet.adapters.storage.store import FINISH_URL, Store  # noqa: E402
from local_host.frontier.sites import task_count  # noqa: E402
from dedupnet.harness.web import SyntheticWeb, WebSpec  # noqa: E402
from local_host.frontier.sites import QUEUED  # noqa: E402

from .helpers import SCRAPY_HOSTS  # noqa: E402

CRAWLER_HOST = "127.0.1.11"


def _scrapy_host_quiet(st: dict | None) -> bool:
    if not st:
        return False
    pools = st.get("pools", {})
    return bool(st.get("connected") and not pools.get("URL_pool") and not pools.get("task_pool")
                and not pools.get("unacked_sets") and not st.get("sets_in_flight", {}).get("unacked"))


async def _crawl(redis_url: str, tmp_path: Path, *, kill_after: int | None = None) -> dict:
    """Run the layout of the module doc to quiescence; with ``kill_after``, SIGKILL the
    first Scrapy host's spider once it has fetched that many pages and holds leased
    tasks (pending entries of its consumer), and start it again."""
    web = SyntheticWeb(WebSpec(pages=300, sites=6, seed=5), port=0)
    cfg = SimConfig(networks=2, hosts=2, pages=300, sites=6, seed=5, set_size=100,
                    concurrency=8)
    prefix = f"scrapytest-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    env = procplan.daemon_env()
    async with trio.open_nursery() as nursery:
        await nursery.start(web.serve)
        centers, hosts = procplan.plan_daemons(cfg, redis_url, prefix, tmp_path)
        hosts = [h for h in hosts if h.name in (*SCRAPY_HOSTS, CRAWLER_HOST)]
        for h in hosts:
            if h.name in SCRAPY_HOSTS:
                h.argv.append("--no-crawl")
        by_ip = {h.name: h for h in hosts}
        spiders = [Spider(ip, redis_url, by_ip[ip].prefix, tmp_path) for ip in SCRAPY_HOSTS]
        daemons = centers + hosts
        seeds = web.seeds(3)
        reach = web.reachable_detail(seeds)
        killed = 0
        server = redis.Redis.from_url(redis_url)
        try:
            await procdaemons.start_all(centers, hosts, tmp_path, env, 60)
            for s in spiders:
                s.start(env)
            with trio.move_on_after(30):
                while not all(s.ready() for s in spiders):
                    for s in spiders:
                        assert s.alive(), f"spider on {s.ip} exited:\n{s.log()[-3000:]}"
                    await trio.sleep(0.1)
            plan = assign_seeds([h.name for h in hosts], seeds)
            for ip, urls in plan.items():
                await trio.to_thread.run_sync(simproc._push, redis_url, by_ip[ip].prefix, urls)
            victim = spiders[0]

            async def kill_when_it_holds_tasks() -> None:
                # Looked at every 20 ms, apart from the quiescence polls (which take a
                # while): a fast spider holds its leases only for moments.
                nonlocal killed
                while not killed:
                    await trio.sleep(0.02)
                    if sum(victim.ip in by for by in web.answered_by.values()) >= kill_after:
                        info = server.xpending(f"{by_ip[victim.ip].prefix}:task_pool", GROUP)
                        pending = sum(c["pending"] for c in info["consumers"] if c["name"] != QUEUED.encode())
                        if pending:
                            killed = pending
                            victim.stop(signal.SIGKILL)
                            victim.start(env)

            if kill_after is not None:
                nursery.start_soon(kill_when_it_holds_tasks)
            quiet = 0
            with trio.move_on_after(60) as scope:
                while quiet < 5:
                    await trio.sleep(0.2)
                    for s in spiders:
                        assert s.alive(), f"spider on {s.ip} exited:\n{s.log()[-3000:]}"
                    st = await procdaemons.poll_all(daemons)
                    done = all(_scrapy_host_quiet(st[ip]) for ip in SCRAPY_HOSTS) and all(
                        procdaemons.is_quiet(d, st[d.name]) for d in daemons if d.name not in SCRAPY_HOSTS)
                    quiet = quiet + 1 if done else 0
            logs = "\n".join(f"--- {s.ip}\n{s.log()[-4000:]}" for s in spiders)
            assert not scope.cancelled_caught, f"not quiescent after 60 s; {len(web.answer_counts)} of " \
                                               f"{len(reach.fetched)} fetched\n{logs}"
        finally:
            for s in spiders:
                s.stop()
            await procdaemons.stop_all(daemons, 15)
            for name in [d.prefix for d in daemons]:
                store = Store(redis_url, name)
                store.delete_prefix()
                store.close()
            server.close()
            nursery.cancel_scope.cancel()
    return {"web": web, "reach": reach, "spiders": spiders, "killed": killed}


def _check(run: dict, *, allow_refetch_by: str | None = None) -> None:
    web, reach = run["web"], run["reach"]
    answered = set(web.answer_counts)
    lost = reach.fetched - answered
    extra = answered - reach.fetched
    dups = {u: web.answered_by[u] for u, c in web.answer_counts.items() if c > 1}
    if allow_refetch_by is not None:
        # At least once: the killed spider fetches again the pages it had in progress,
        # and nobody else fetches them.
        dups = {u: by for u, by in dups.items() if set(by) != {allow_refetch_by}}
    assert not lost, f"{len(lost)} lost, e.g. {sorted(lost)[:5]}"
    if extra:  # e.g. a robots-disallowed page, which the scheduler's own gate must never hand out
        robots = {s.ip: [line for line in s.log().splitlines() if "robots" in line or "Error downloading" in line]
                  for s in run["spiders"]}
        raise AssertionError(f"{len(extra)} fetched that a correct crawl does not request, by: "
                             f"{ {u: web.answered_by[u] for u in sorted(extra)[:5]} }; robots.txt requests: "
                             f"{dict(web.robots_fetches)}; the spiders' robots lines: {robots}")
    assert not dups, f"{len(dups)} fetched twice: {list(dups.items())[:5]}"
    by_client = collections.Counter(ip for u in answered for ip in web.answered_by[u])
    for ip in (*SCRAPY_HOSTS, CRAWLER_HOST):
        assert by_client[ip] > 0, f"host {ip} fetched nothing: {by_client}"


async def test_two_scrapy_hosts_and_a_dedupnet_crawler_fetch_every_page_once(redis_url, tmp_path):
    run = await _crawl(redis_url, tmp_path)
    _check(run)
    for s in run["spiders"]:
        log = s.log()
        assert "is the crawler of" in log
        assert "Traceback" not in log, log[-3000:]


async def test_a_killed_spider_loses_nothing(redis_url, tmp_path):
    run = await _crawl(redis_url, tmp_path, kill_after=15)
    assert run["killed"], "the spider was never seen holding a task"
    _check(run, allow_refetch_by=SCRAPY_HOSTS[0])
    log = run["spiders"][0].log()
    assert log.count("Spider opened") == 2
    # Its second life took up the tasks the first had leased and not finished.
    assert "before and not finished are fetched again" in log, log[-3000:]


# -- the lease book, without Scrapy's engine ---------------------------------------------------
def _task(book: TaskBook, eid: bytes, url: str) -> Request:
    lease = book.taken(eid, url)
    assert lease is not None
    return Request(url, meta={TASK_META: eid.decode()})


def test_a_task_is_finished_only_when_its_last_request_is_done():
    book = TaskBook()
    req = _task(book, b"1-0", "http://a.example/")
    book.handed(req)
    assert book.taken(b"1-0", "http://a.example/") is None  # delivered again: not leased twice
    retry = req.replace(dont_filter=True)
    retry.meta["retry_times"] = 1
    assert book.child(retry, "http://a.example/") == "retry"
    assert book.released({retry}) == 1 and book.finished() == []  # the retry keeps the task
    book.handed(retry)
    assert book.released(set()) == 1
    [lease] = book.finished()
    assert lease.chain == ["http://a.example/"] and not book.leases


def test_a_redirect_finishes_the_task_and_its_target_is_discovered():
    book = TaskBook()
    req = _task(book, b"2-0", "http://a.example/old")
    book.handed(req)
    hop = req.replace(url="http://a.example/new")
    hop.meta["redirect_urls"] = ["http://a.example/old"]
    assert book.child(hop, "http://a.example/new") == "redirect"
    copied = Request("http://b.example/", meta=dict(req.meta))  # a spider that copies meta
    assert book.child(copied, "http://b.example/") == "other"
    book.released({req})
    assert book.finished() == []  # the engine still holds the redirecting request
    book.released(set())
    assert [lease.eid for lease in book.finished()] == [b"2-0"]


# -- the scheduler on a real Redis, without a running engine -----------------------------------
class _Spider(__import__("scrapy").Spider):
    name = "unit"

    def parse(self, response):
        return []

    def parse_item(self, response, kind=None):
        return []

    def failed(self, failure):
        return []


def _scheduler(redis_url: str, prefix: str, **settings):
    from scrapy.utils.test import get_crawler

    from dedupnet.scrapy import Scheduler

    crawler = get_crawler(_Spider, {"DEDUPNET_REDIS_URL": redis_url, "DEDUPNET_PREFIX": prefix,
                                    "DEDUPNET_CONSUMER": "unit", "DUPEFILTER_CLASS": "dedupnet.scrapy.DupeFilter",
                                    **settings})
    crawler._apply_settings()
    spider = crawler._create_spider()
    sched = Scheduler.from_crawler(crawler)
    sched.spider = spider
    sched.store.ensure_group("task_pool", GROUP)
    return sched, spider, crawler.stats


def _stream(store: Store, pool: str) -> list[str]:
    return [fields[b"u"].decode() for _, fields in store.redis.xrange(store.key(pool))]


def test_discovered_requests_go_to_url_pool_normalised_once_and_bad_ones_are_counted(redis_url, store):
    sched, spider, stats = _scheduler(redis_url, store.prefix)
    try:
        for url in ("HTTP://A.example:80/x/./y#top", "http://a.example/x/y", "ftp://a.example/file",
                    "http://b.example/"):
            sched.enqueue_request(Request(url))
        assert _stream(store, "URL_pool") == []  # batched: nothing written yet
        sched._flush()
        assert _stream(store, "URL_pool") == ["http://a.example/x/y", "http://b.example/"]
        assert stats.get_value("dedupnet/pushed") == 2
        assert stats.get_value("dedupnet/filtered_local") == 1
        assert stats.get_value("dedupnet/bad_input/scheme") == 1
        assert not sched.has_pending_requests()
    finally:
        sched.store.close()


def test_non_get_and_dont_filter_requests_bypass_dedupnet(redis_url, store):
    sched, spider, stats = _scheduler(redis_url, store.prefix)
    try:
        post = Request("http://a.example/form", method="POST", body=b"q=1")
        again = Request("http://a.example/page", dont_filter=True, priority=5)
        seed = Request("http://a.example/seed", dont_filter=True, meta={"is_start_request": True})
        for r in (post, again, seed):
            assert sched.enqueue_request(r)
        sched._flush()
        assert _stream(store, "URL_pool") == ["http://a.example/seed"]  # a start request is a seed
        assert sched.next_request() is again and sched.next_request() is post  # by priority
        assert stats.get_value("dedupnet/bypassed/not_get") == 1
        assert stats.get_value("dedupnet/bypassed/dont_filter") == 1
    finally:
        sched.store.close()


def test_a_task_gets_back_its_callback_errback_priority_and_kwargs(redis_url, store):
    sched, spider, stats = _scheduler(redis_url, store.prefix)
    try:
        sched.enqueue_request(Request("http://a.example/item", callback=spider.parse_item, errback=spider.failed,
                                      cb_kwargs={"kind": "book"}, priority=3))
        sched.enqueue_request(Request("http://a.example/plain", callback=spider.parse))
        sched._flush()
        # The protocol admits them: they come back as plain URLs in task_pool.
        store.stream_add("task_pool", _stream(store, "URL_pool"))
        got = {r.url: r for r in (sched.next_request(), sched.next_request())}
        item, plain = got["http://a.example/item"], got["http://a.example/plain"]
        assert item.callback == spider.parse_item and item.errback == spider.failed
        assert item.cb_kwargs == {"kind": "book"} and item.priority == 3
        assert plain.callback is None and plain.errback is None  # parse, as Scrapy's default
        assert {r.meta[TASK_META] for r in got.values()} and len(sched.book) == 2
        # Done with both (the engine holds neither): finished, acknowledged, recorded.
        sched.book.released(set())
        sched._done += sched.book.finished()
        sched._flush()
        assert task_count(store) == 0
        assert store.redis.hlen(store.key("scrapy_requests")) == 0
        from dedupnet.codec.urls import fingerprint_many
        assert store.fp_contains("finish_URL", fingerprint_many(list(got))).all()
    finally:
        sched.store.close()


def test_a_finished_task_not_yet_written_is_not_taken_again(redis_url, store):
    """A look through the consumer's pending entries (a restart, a lost reply) must not
    re-lease a task that is finished but not acknowledged yet: it would be fetched twice."""
    sched, spider, stats = _scheduler(redis_url, store.prefix, DEDUPNET_TAKE_BATCH=1)
    try:
        store.stream_add("task_pool", ["http://a.example/1", "http://a.example/2"])
        first = sched.next_request()
        sched.book.released(set())
        sched._done += sched.book.finished()  # done with it; the flush has not run yet
        sched._cursor = b"0"  # the next read looks through our pending entries
        second = sched.next_request()
        assert second is not None and second.url != first.url
        assert sched.next_request() is None
        sched._flush()
        assert task_count(store) == 1  # the second one, still leased
    finally:
        sched.store.close()


def test_what_cannot_be_written_is_kept_and_written_when_redis_is_back(redis_url, store, caplog):
    from dedupnet.codec.backoff import Backoff

    sched, spider, stats = _scheduler(redis_url, store.prefix)
    reachable = sched.store
    nobody = Backoff(first=0.05, cap=2.0, attempts=1)  # one try: nobody is there
    sched.store = Store("redis://127.0.0.1:1/0", store.prefix, retry=nobody)
    try:
        sched.enqueue_request(Request("http://a.example/"))
        sched._try_flush()
        assert sched._links == ["http://a.example/"]
        assert "failed" in caplog.text and "kept, tried again" in caplog.text
        sched.store.close()
        sched.store = reachable
        sched._try_flush()
        assert _stream(store, "URL_pool") == ["http://a.example/"] and sched._links == []
    finally:
        reachable.close()


def test_a_finished_task_counts_against_the_lease_bound_until_it_is_written(redis_url, store):
    """What a killed spider fetches again is every entry pending for its consumer: the
    tasks it holds and those finished but not written. Both together stay within
    DEDUPNET_MAX_LEASED."""
    sched, spider, stats = _scheduler(redis_url, store.prefix, DEDUPNET_TAKE_BATCH=2, DEDUPNET_MAX_LEASED=2)

    def pending() -> int:  # leased: pending for a consumer other than the frontier's queue
        info = store.redis.xpending(store.key("task_pool"), GROUP)
        return sum(c["pending"] for c in info["consumers"] if c["name"] != QUEUED.encode())

    try:
        store.stream_add("task_pool", [f"http://a.example/{i}" for i in range(6)])
        for _ in range(3):
            assert sched.next_request() is not None and sched.next_request() is not None
            assert pending() <= 2
            sched.book.released(set())  # the engine is done with both; no flush has run
            sched._done += sched.book.finished()
        assert sched.next_request() is None and pending() == 0
        assert task_count(store) == 0
    finally:
        sched.store.close()


def test_new_tasks_wake_the_scheduler_without_waiting_for_a_tick(redis_url, store, monkeypatch):
    """A watch blocked in Redis on task_pool (XREAD, which takes nothing) hands the
    reactor a call as soon as an entry is added; the call takes it."""
    import threading
    from types import SimpleNamespace

    import dedupnet.scrapy as ds

    sched, spider, stats = _scheduler(redis_url, store.prefix)
    woken = threading.Event()
    monkeypatch.setattr(ds, "reactor", SimpleNamespace(callFromThread=lambda fn: woken.set()))
    sched._watching = True
    watcher = threading.Thread(target=sched._watch_tasks, daemon=True)
    watcher.start()
    try:
        time.sleep(0.3)  # the watch is blocked in Redis
        assert not woken.is_set()
        store.stream_add("task_pool", ["http://a.example/new"])
        assert woken.wait(10)
        sched._new_tasks()  # what the reactor runs
        assert len(sched) == 1 and stats.get_value("dedupnet/tasks_taken") == 1
        assert store.redis.xpending(store.key("task_pool"), GROUP)["pending"] == 1
    finally:
        sched._watching = False
        watcher.join(5)
        sched.store.close()


def test_a_scrapy_host_under_recrawl_after_re_crawls_like_a_dedupnet_crawler(redis_url, store):
    """The scheduler finishes a task as the host's own crawler does, under the re-crawl
    policy the host's daemon publishes in its Redis: into the aged finish_URL and out of
    task_pool:fp, so that once the URL's age has passed it is admitted and queued again
    (tests/test_recrawl.py checks the same of dedupnet's crawler)."""
    from dedupnet.codec.ages import RecrawlPolicy
    from dedupnet.codec.urls import fingerprint_many
    from local_host import protocol as hp
    from local_host.pools import TASK_FP, HostPools

    age = 100.0
    now = [time.time()]  # the scheduler writes by the wall clock; the look-ups move on from it
    pools = HostPools(store, exact=True, recrawl=RecrawlPolicy(age), clock=lambda: now[0])
    pools.setup()  # the daemon's start
    sched, spider, stats = _scheduler(redis_url, store.prefix)
    sched.open(spider)
    try:
        u = "http://a.example/again"
        pools.apply([hp.AddTasks((u,))])
        request = sched.next_request()
        assert request is not None and request.url == u
        sched.book.released(set())
        sched._done += sched.book.finished()
        sched._flush()

        def seen(kind: str) -> list[bool]:
            return pools.lookup(hp.Lookup((kind, 1), (u,))).seen

        assert not store.fp_contains(TASK_FP, fingerprint_many([u]))[0]  # crawled: no longer queued
        assert seen("found") == [True]  # crawled just now
        now[0] += age * 1.5
        assert seen("found") == [False] and seen("task") == [False]  # its age passed: admitted, queued again
    finally:
        sched.close("finished")
        sched.store.close()


def test_a_finished_task_keeps_one_fingerprint_and_stays_seen(redis_url, store):
    """A fingerprint is stored once per host: a crawled task moves from task_pool:fp to
    finish_URL in the transaction that finishes it, and is still seen (as a task sent
    again and as a link found) afterwards."""
    from dedupnet.codec.urls import fingerprint_many
    from local_host import protocol as hp
    from local_host.pools import TASK_FP, HostPools

    pools = HostPools(store, exact=True)
    pools.setup()
    sched, spider, stats = _scheduler(redis_url, store.prefix)
    sched.open(spider)
    try:
        u = "http://a.example/once"
        pools.apply([hp.AddTasks((u,))])
        assert store.fp_contains(TASK_FP, fingerprint_many([u]))[0]  # queued
        request = sched.next_request()
        assert request is not None and request.url == u
        sched.book.released(set())
        sched._done += sched.book.finished()
        sched._flush()
        assert store.fp_count(TASK_FP) == 0 and store.fp_count(FINISH_URL) == 1
        for kind in ("found", hp.OfferedTask.KIND):
            assert pools.lookup(hp.Lookup((kind, 1), (u,))).seen == [True]
    finally:
        sched.close("finished")
        sched.store.close()


def test_a_small_site_is_not_starved_behind_a_big_one(redis_url, store):
    """The scheduler takes from the host's per-site frontier: 3,000 tasks of one site
    queued before two of each of ten small sites, and every small site is among the
    first tasks the spider gets (first in, first out it would wait for all 3,000)."""
    sched, spider, stats = _scheduler(redis_url, store.prefix, DEDUPNET_TAKE_BATCH=16, DEDUPNET_MAX_LEASED=16,
                                      DOWNLOAD_DELAY=0.5, RANDOMIZE_DOWNLOAD_DELAY=False)
    try:
        store.stream_add("task_pool", [f"http://big.example/{i}" for i in range(3000)])
        store.stream_add("task_pool", [f"http://s{k}.example/{i}" for i in range(2) for k in range(10)])
        first = [sched.next_request() for _ in range(11)]
        assert {r.url.split("/")[2] for r in first} == {"big.example"} | {f"s{k}.example" for k in range(10)}
    finally:
        sched.store.close()


def test_the_addon_sets_the_scheduler_and_a_body_limit_that_the_project_can_override():
    """One line makes a spider a dedupnet host, and a body is cut off where dedupnet's
    own crawler cuts it, not at Scrapy's 1 GB; a setting of the project's own wins."""
    from scrapy.utils.test import get_crawler

    from local_host.crawler.settings import CrawlerSettings

    crawler = get_crawler(_Spider, {"ADDONS": {"dedupnet.scrapy.Addon": 0}})
    crawler._apply_settings()
    s = crawler.settings
    assert s["SCHEDULER"] == "dedupnet.scrapy.Scheduler" and s["DUPEFILTER_CLASS"] == "dedupnet.scrapy.DupeFilter"
    assert s.getint("DOWNLOAD_MAXSIZE") == CrawlerSettings.max_body < 1024**3
    own = get_crawler(_Spider, {"ADDONS": {"dedupnet.scrapy.Addon": 0}, "DOWNLOAD_MAXSIZE": 10**6})
    own._apply_settings()
    assert own.settings.getint("DOWNLOAD_MAXSIZE") == 10**6

"""The crawler against a real HTTP server on loopback and a real Redis.

The protocol is not needed: tests put URLs straight into the host's ``task_pool`` and
check what the crawler writes to ``finish_URL``, ``URL_pool`` and ``failed``. The
server (trio + h11, tests/crawling.py) serves a few sites on different 127.88.0.x
addresses and records every request with its (server-side) time.
"""

from __future__ import annotations

import base64
import json
from collections import Counter

import trio

import local_host.crawler.crawl as crawler_mod
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.storage.store import TASK_POOL, URL_POOL
from dedupnet.adapters.storage.resp import fingerprint_fields
from local_host.frontier.sites import task_count
from dedupnet.codec.urls import fingerprint_many
from local_host.crawler.crawl import DEPTH, FAILED, GROUP, SEEDS, Crawler, seed_urls
from local_host.crawler.links import extract_links, in_scope
from local_host.pools import HostPools

from .crawling import HOSTS, Reply, crawling, finished, page, settle, slow_pages
from .helpers import until


# -- helpers -----------------------------------------------------------------------------
async def crawl(store, urls, **overrides):
    """Queue ``urls`` as tasks, crawl until done; returns the counters."""
    counters = Counters()
    store.stream_add(TASK_POOL, urls)
    async with crawling(store, counters=counters, **overrides) as crawler:
        await settle(store, crawler)
        await until(lambda: crawler.idle)
    return counters


def pushed(store) -> list[str]:
    return [f[b"u"].decode() for _, f in store.redis.xrange(store.key(URL_POOL))]


def failures(store) -> dict[str, dict]:
    return {k.decode(): json.loads(v) for k, v in store.redis.hgetall(store.key(FAILED)).items()}


def assert_drained(store):
    assert task_count(store) == 0
    assert store.redis.xpending(store.key(TASK_POOL), GROUP)["pending"] == 0


# -- link extraction (pure) ----------------------------------------------------------------
def test_extract_links_resolves_and_filters():
    html = page("a.html", "/b.html#x", "#top", "", " javascript:void(0) ", "mailto:x@y.z", "data:text/html,hi",
                "tel:123", "HTTP://Other.Example/c", "http://[bad", "a.html", "//cdn.example/d")
    links = extract_links(html, "http://site.example/dir/index.html")
    assert links.urls == ["http://site.example/dir/a.html", "http://site.example/b.html",
                          "http://Other.Example/c", "http://cdn.example/d"]
    assert links.found == 12
    assert links.dropped == Counter({"fragment": 2, "scheme": 4, "unparsable": 1})
    based = extract_links(page("x.html", head='<base href="/other/">'), "http://s.example/a/b.html")
    assert based.urls == ["http://s.example/other/x.html"]


def test_scope():
    allowed = frozenset({"example.org", "127.88.0.1"})
    assert in_scope("example.org", allowed) and in_scope("www.example.org", allowed)
    assert not in_scope("badexample.org", allowed) and not in_scope("example.com", allowed)
    assert in_scope("127.88.0.1", allowed) and not in_scope("1.127.88.0.1", frozenset({"0.1"}))
    assert in_scope("anything", frozenset())


# -- the crawler -------------------------------------------------------------------------
async def test_fetch_and_links(store, web):
    a, b, c = web.sites["a"], web.sites["b"], web.sites["c"]
    a.page("/links/index.html", page(
        "page1.html", "/abs/page2.html#frag", "#top", "javascript:alert(1)", "mailto:x@y.z",
        "data:text/html,hi", b.url("/other.html"), c.url("/out.html"), "http://[bad", "page1.html",
        "index.html", "http://exa mple.org/"))
    a.page("/based/index.html", page("x.html", "../y.html", head='<base href="/elsewhere/deep/">'))
    tasks = [a.url("/links/index.html"), a.url("/based/index.html")]
    counters = await crawl(store, tasks, allowed_domains=frozenset({HOSTS["a"], HOSTS["b"]}))
    links = pushed(store)  # two pages crawled side by side: each page's links in order
    assert [u for u in links if "/elsewhere/" not in u] == [
        a.url("/links/page1.html"), a.url("/abs/page2.html"), b.url("/other.html")]
    assert [u for u in links if "/elsewhere/" in u] == [a.url("/elsewhere/deep/x.html"), a.url("/elsewhere/y.html")]
    assert finished(store, tasks) == [True, True]
    assert failures(store) == {}
    assert_drained(store)
    assert counters.get("pages_fetched", status=200) == 2
    assert counters.get("links_pushed") == 5
    assert counters.get("links_found") == 14
    assert counters.get("links_dropped", reason="out_of_scope") == 1
    assert counters.get("links_dropped", reason="scheme") == 3
    assert counters.get("links_dropped", reason="self") == 1
    assert counters.total("links_dropped") == 14 - 5 - 1  # minus the duplicate page1.html
    assert counters.get("pages_done", outcome="ok") == 2
    assert counters.get("fetched_bytes") > 0
    assert len(a.hits("/robots.txt")) == 1  # robots fetched once per site


async def test_max_depth(store, web):
    a = web.sites["a"]
    a.page("/d0", page("/d1"))
    a.page("/d1", page("/d2"))
    store.stream_add(TASK_POOL, [a.url("/d0")])
    async with crawling(store, max_depth=1) as crawler:
        await settle(store, crawler)
        assert pushed(store) == [a.url("/d1")]  # the seed-less task counts as depth 0
        (fp,) = fingerprint_fields(fingerprint_many([a.url("/d1")]))
        assert store.redis.hget(store.key(DEPTH), fp) == b"1"
        store.stream_add(TASK_POOL, [a.url("/d1")])  # what the protocol would do
        await settle(store, crawler)
    assert pushed(store) == [a.url("/d1")]  # /d2 would be at depth 2
    assert finished(store, [a.url("/d0"), a.url("/d1")]) == [True, True]
    assert len(a.hits("/d1")) == 1


async def test_depth_keeps_the_minimum(store, web):
    a = web.sites["a"]
    a.page("/deep", page("/shared"))
    (fp,) = fingerprint_fields(fingerprint_many([a.url("/shared")]))
    store.redis.hset(store.key(DEPTH), mapping={fingerprint_fields(fingerprint_many([a.url("/deep")]))[0]: 2})
    store.redis.hset(store.key(DEPTH), fp, 1)
    await crawl(store, [a.url("/deep")], max_depth=5)
    assert store.redis.hget(store.key(DEPTH), fp) == b"1"  # 3 found later does not raise it
    assert pushed(store) == [a.url("/shared")]


async def test_404_recorded_not_retried(store, web):
    a = web.sites["a"]
    a.route("/gone", lambda n: Reply(410, b"gone"))
    a.route("/forbidden", lambda n: Reply(403, b"no"))
    tasks = [a.url("/missing"), a.url("/gone"), a.url("/forbidden")]
    counters = await crawl(store, tasks)
    fails = failures(store)
    assert {u: (f["reason"], f["status"], f["attempts"]) for u, f in fails.items()} == {
        a.url("/missing"): ("http", 404, 1), a.url("/gone"): ("http", 410, 1), a.url("/forbidden"): ("http", 403, 1)}
    for path in ("/missing", "/gone", "/forbidden"):
        assert len(a.hits(path)) == 1
    assert finished(store, tasks) == [True, True, True]
    assert counters.get("retries") == 0
    assert counters.get("pages_fetched", status=404) == 1
    assert counters.get("pages_done", outcome="failed") == 3
    assert_drained(store)


async def test_503_retried_until_success(store, web):
    a = web.sites["a"]
    a.route("/flaky", lambda n: Reply(503, b"busy") if n < 2 else Reply(body=page("/after").encode()))
    a.route("/down", lambda n: Reply(502, b"bad gateway"))
    counters = await crawl(store, [a.url("/flaky"), a.url("/down")], max_retries=3)
    assert len(a.hits("/flaky")) == 3
    assert len(a.hits("/down")) == 4  # 1 + 3 retries
    fails = failures(store)
    assert list(fails) == [a.url("/down")]
    assert (fails[a.url("/down")]["status"], fails[a.url("/down")]["attempts"]) == (502, 4)
    assert pushed(store) == [a.url("/after")]
    assert finished(store, [a.url("/flaky"), a.url("/down")]) == [True, True]
    assert counters.get("retries") == 2 + 3
    assert counters.get("fetch_errors", kind="http_5xx") == 2 + 4
    assert_drained(store)


async def test_retry_wait_holds_no_slot(store, web):
    """With one global slot, a page waiting to retry lets another page through."""
    a, b = web.sites["a"], web.sites["b"]
    a.route("/down", lambda n: Reply(503, b"busy"))
    b.page("/fast")
    store.stream_add(TASK_POOL, [a.url("/down")])
    async with crawling(store, concurrency=1, retry_base=0.3, max_retries=1) as crawler:
        await until(lambda: len(a.hits("/down")) == 1)
        store.stream_add(TASK_POOL, [b.url("/fast")])  # while /down waits to retry
        await settle(store, crawler)
    down = [h.t for h in a.hits("/down")]
    fast = b.hits("/fast")[0].t
    assert len(down) == 2 and down[0] < fast < down[1]


async def test_timeouts_and_connection_errors_are_retried(store, web):
    a = web.sites["a"]

    async def slow_once(n):
        if n == 0:
            await trio.sleep(1)
        return Reply(body=page().encode())

    a.route("/slow", slow_once)
    dead = "http://127.88.0.9:9/nothing"  # nothing listens there
    counters = await crawl(store, [a.url("/slow"), dead], timeout=0.2, max_retries=2, respect_robots=False)
    assert len(a.hits("/slow")) == 2
    assert counters.get("fetch_errors", kind="timeout") == 1
    assert counters.get("fetch_errors", kind="connect") == 3
    assert failures(store)[dead]["reason"] == "connect"
    assert finished(store, [a.url("/slow"), dead]) == [True, True]


async def test_redirects_go_through_de_dup_as_discovered_urls(store, web):
    """A redirect finishes its URL and pushes the target into URL_pool, so a page reached
    both by a redirect and by a link is fetched once system-wide; loops end by themselves."""
    a, b = web.sites["a"], web.sites["b"]
    a.route("/old", lambda n: Reply(301, b"", headers=[("location", "/new")]))
    a.route("/tob", lambda n: Reply(302, b"", headers=[("location", b.url("/landing"))]))
    a.route("/loop1", lambda n: Reply(302, b"", headers=[("location", "/loop2")]))
    a.route("/self", lambda n: Reply(307, b"", headers=[("location", "/self")]))
    tasks = [a.url("/old"), a.url("/tob"), a.url("/loop1"), a.url("/self")]
    counters = await crawl(store, tasks)
    assert finished(store, tasks) == [True] * 4
    # Targets are new URLs for the protocol, not fetched here.
    assert sorted(pushed(store)) == sorted([a.url("/new"), b.url("/landing"), a.url("/loop2")])
    assert [len(a.hits(p)) for p in ("/old", "/tob", "/loop1", "/self", "/new", "/loop2")] == [1, 1, 1, 1, 0, 0]
    assert b.hits("/landing") == []
    assert failures(store) == {}
    assert counters.get("redirects") == 4
    assert_drained(store)


async def test_robots(store, web):
    a, b, c = web.sites["a"], web.sites["b"], web.sites["c"]
    b.page("/robots.txt", "User-agent: *\nDisallow: /private\n", content_type="text/plain")
    b.page("/public.html")
    b.page("/public2.html")
    b.page("/private/x")
    c.route("/robots.txt", lambda n: Reply(503, b"later") if n == 0 else Reply(200, b"User-agent: *\nAllow: /\n", "text/plain"))
    c.page("/page")
    a.page("/page")  # a has no robots.txt: 404 allows everything
    tasks = [b.url("/private/x"), b.url("/public.html"), b.url("/public2.html"), c.url("/page"), a.url("/page")]
    counters = await crawl(store, tasks)
    assert b.hits("/private/x") == []
    assert len(b.hits("/robots.txt")) == 1
    assert len(c.hits("/robots.txt")) == 2 and len(c.hits("/page")) == 1
    assert len(a.hits("/page")) == 1
    assert counters.get("robots_skipped") == 1
    assert counters.get("pages_done", outcome="skipped") == 1
    assert failures(store) == {b.url("/private/x"): failures(store)[b.url("/private/x")]}
    assert failures(store)[b.url("/private/x")]["reason"] == "robots"
    assert finished(store, tasks) == [True] * 5
    assert_drained(store)


async def test_robots_can_be_turned_off(store, web):
    b = web.sites["b"]
    b.page("/robots.txt", "User-agent: *\nDisallow: /\n", content_type="text/plain")
    b.page("/x")
    await crawl(store, [b.url("/x")], respect_robots=False)
    assert b.hits("/robots.txt") == [] and len(b.hits("/x")) == 1


async def test_huge_body_cut_off(store, web):
    a = web.sites["a"]
    sent = []

    async def huge_chunks():
        chunk = b"<p><a href='/x'>x</a></p>" * 2500  # ~62 KiB
        for _ in range(320):  # ~20 MiB
            sent.append(len(chunk))
            yield chunk

    a.route("/huge", lambda n: Reply(body=huge_chunks()))
    a.route("/declared", lambda n: Reply(body=b"<p>" * (1 << 20)))  # Content-Length: 3 MiB
    counters = await crawl(store, [a.url("/huge"), a.url("/declared")], max_body=256 * 1024)
    assert counters.get("too_large") == 2
    assert pushed(store) == []
    assert finished(store, [a.url("/huge"), a.url("/declared")]) == [True, True]
    assert failures(store) == {}
    assert counters.get("fetched_bytes") < 2 * 256 * 1024 + 256 * 1024
    assert sum(sent) < 320 * 62500 // 4  # the crawler hung up long before the end


async def test_not_html(store, web):
    a = web.sites["a"]
    a.route("/img.png", lambda n: Reply(body=b"\x89PNG" + b"<a href='/x'>" * 10, content_type="image/png"))
    a.route("/untyped", lambda n: Reply(body=page("/from-untyped").encode(), content_type=None))
    counters = await crawl(store, [a.url("/img.png"), a.url("/untyped")])
    assert counters.get("not_html") == 1
    assert pushed(store) == [a.url("/from-untyped")]  # no content type: tried as HTML
    assert finished(store, [a.url("/img.png"), a.url("/untyped")]) == [True, True]


async def test_politeness_delay(store, web):
    a, b = web.sites["a"], web.sites["b"]
    for i in range(6):
        a.page(f"/p{i}")
        b.page(f"/p{i}")
    tasks = [s.url(f"/p{i}") for i in range(6) for s in (a, b)]
    await crawl(store, tasks, per_site_delay=0.2, per_site_concurrency=2)
    for site in (a, b):
        times = sorted(h.t for h in site.hits())
        assert len(times) == 7  # robots.txt + 6 pages
        gaps = [t2 - t1 for t1, t2 in zip(times, times[1:])]
        assert min(gaps) >= 0.2 - 0.02, gaps  # server-side times: allow for scheduling
    # the two sites were crawled side by side, not one after the other
    assert max(h.t for h in a.hits()) > min(h.t for h in b.hits()) + 0.4
    assert max(h.t for h in b.hits()) > min(h.t for h in a.hits()) + 0.4


async def test_robots_crawl_delay(store, web):
    c = web.sites["c"]
    c.page("/robots.txt", "User-agent: *\nCrawl-delay: 0.3\n", content_type="text/plain")
    for i in range(3):
        c.page(f"/p{i}")
    await crawl(store, [c.url(f"/p{i}") for i in range(3)], per_site_delay=0.0)
    times = sorted(h.t for h in c.hits())
    assert len(times) == 4
    assert min(t2 - t1 for t1, t2 in zip(times, times[1:])) >= 0.3 - 0.02


async def test_concurrency_bounds(store, web):
    async def slow(n):
        await trio.sleep(0.1)
        return Reply(body=page().encode())

    tasks = []
    for s in web.sites.values():
        for i in range(5):
            s.route(f"/s{i}", slow)
            tasks.append(s.url(f"/s{i}"))
    await crawl(store, tasks, concurrency=4, per_site_concurrency=2, respect_robots=False)
    assert max(s.max_active for s in web.sites.values()) == 2
    assert web.max_active == 4


async def test_crash_and_restart_loses_nothing(store, web):
    a = web.sites["a"]
    release = trio.Event()

    async def held(n):
        if not release.is_set():
            await release.wait()
        return Reply(body=page().encode())

    for i in range(10):
        if i < 5:
            a.page(f"/c{i}", page(f"/from{i}"))
        else:
            a.route(f"/c{i}", held)
    tasks = [a.url(f"/c{i}") for i in range(10)]
    store.stream_add(TASK_POOL, tasks)
    async with crawling(store, concurrency=10, per_site_concurrency=0) as first:
        await until(lambda: first.pages_done == 5 and a.active == 5)
        assert task_count(store) == 5
    # the first crawler is gone with 5 requests in flight: start again on the same store
    release.set()
    async with crawling(store, concurrency=10, per_site_concurrency=0) as second:
        await settle(store, second)
        assert second.pages_done == 5
    assert finished(store, tasks) == [True] * 10
    assert_drained(store)
    assert [len(a.hits(f"/c{i}")) for i in range(10)] == [1] * 5 + [2] * 5
    assert sorted(pushed(store)) == sorted(a.url(f"/from{i}") for i in range(5))


async def test_a_task_whose_delivery_reply_was_lost_is_crawled_once_when_idle(store, web, monkeypatch):
    """Found by ``--fault kill-redis``: XREADGROUP ran (the entry is pending for this
    consumer) but its reply died with the connection, so the crawler never saw it and
    the crawl never ended. Idle, the crawler looks for such entries (every
    PENDING_RESCAN) and fetches them, skipping the ones in progress."""
    monkeypatch.setattr(crawler_mod, "PENDING_RESCAN", 0.2)
    a = web.sites["a"]
    a.page("/lost", page())
    a.page("/seen", page())
    key = store.key(TASK_POOL)
    async with crawling(store) as crawler:
        store.stream_add(TASK_POOL, [a.url("/seen")])
        await settle(store, crawler)
        # Delivered to c1 in one transaction with its XADD (the blocked crawler cannot
        # be served in between); the reply comes here, as if lost on the way.
        pipe = store.redis.pipeline(transaction=True)
        pipe.xadd(key, {"u": a.url("/lost")})
        pipe.xreadgroup(GROUP, "c1", {key: ">"}, count=1)
        _, delivered = pipe.execute()
        assert delivered[0][1][0][1][b"u"].decode() == a.url("/lost")
        await settle(store, crawler)
    assert finished(store, [a.url("/lost"), a.url("/seen")]) == [True, True]
    assert_drained(store)
    assert len(a.hits("/lost")) == 1 and len(a.hits("/seen")) == 1


async def test_a_rescan_does_not_take_up_again_a_task_that_finished_while_it_read(store, web, monkeypatch):
    """Found by re-measuring the process faults (a host fetched one page twice within a
    second, after kill-center and lossy-wan): the idle rescan of this consumer's pending
    entries listed a task that was in progress when the read went out and finished
    (acknowledged, no longer in progress) before the reply was handled, so it was taken
    up as never seen. The read is held here, in its worker thread, until the task is done."""
    import threading

    monkeypatch.setattr(crawler_mod, "PENDING_RESCAN", 0.2)
    a = web.sites["a"]
    release = trio.Event()

    async def held(n):
        await release.wait()
        return Reply(body=page().encode())

    a.route("/slow", held)
    read, go_on = threading.Event(), threading.Event()
    reads = []
    real_read = Crawler._read

    def slow_read(self, count, start):
        reads.append(start)
        result = real_read(self, count, start)
        if start == b"0" and result[0]:  # a rescan that found this consumer's pending entries
            read.set()
            go_on.wait(10)
        return result

    monkeypatch.setattr(Crawler, "_read", slow_read)
    async with crawling(store, respect_robots=False) as crawler:
        store.stream_add(TASK_POOL, [a.url("/slow")])
        await until(lambda: crawler.in_progress == 1)
        await trio.to_thread.run_sync(read.wait, 10)  # the rescan has listed /slow as pending
        release.set()
        await until(lambda: crawler.in_progress == 0)  # fetched, recorded, acknowledged
        done_reading = len(reads)
        go_on.set()
        await until(lambda: len(reads) > done_reading + 1)  # the rescan's entries were handled
        await settle(store, crawler)
    assert len(a.hits("/slow")) == 1
    assert_drained(store)


async def test_a_failure_never_crashes_the_crawler(store, web, monkeypatch):
    a = web.sites["a"]
    a.page("/boom", page("/x"))
    a.page("/fine", page("/y"))
    real = crawler_mod.extract_links

    def exploding(html, url):
        if url.endswith("/boom"):
            raise RuntimeError("parser bug")
        return real(html, url)

    monkeypatch.setattr(crawler_mod, "extract_links", exploding)
    counters = await crawl(store, [a.url("/boom"), "not a url", a.url("/fine")])
    fails = failures(store)
    assert fails[a.url("/boom")]["reason"] == "internal"
    assert fails["not a url"]["reason"].startswith("bad_url")
    assert pushed(store) == [a.url("/y")]
    assert finished(store, [a.url("/boom"), a.url("/fine")]) == [True, True]
    assert counters.get("fetch_errors", kind="internal") == 1
    assert_drained(store)


async def test_seeds_and_recrawl(store, web):
    a = web.sites["a"]
    a.page("/seed", page("/found"))
    assert seed_urls(HostPools(store, exact=True), [a.url("/seed"), a.url("/seed"), "ftp://x/"]) == 1
    assert pushed(store) == [a.url("/seed")]  # into URL_pool, through the protocol
    (fp,) = fingerprint_fields(fingerprint_many([a.url("/seed")]))
    assert store.redis.hget(store.key(DEPTH), fp) == b"0"
    assert store.redis.smembers(store.key(SEEDS)) == {a.url("/seed").encode()}
    counters = Counters()
    async with crawling(store, counters=counters, recrawl_interval=0.2) as crawler:
        assert await crawler.seed([a.url("/seed")]) == 1
        # nothing puts the seed into task_pool but the re-crawl
        await until(lambda: len(a.hits("/seed")) >= 2, timeout=5)
        await settle(store, crawler)
    assert counters.get("recrawls") >= 2
    assert finished(store, [a.url("/seed")]) == [True]


async def test_recrawl_off_by_default(store, web):
    a = web.sites["a"]
    a.page("/seed")
    seed_urls(store, [a.url("/seed")])
    async with crawling(store) as crawler:
        await until(lambda: crawler.idle)
        assert crawler.settings.recrawl_interval is None
    assert a.hits("/seed") == []


async def test_store_dir(store, web, tmp_path):
    a = web.sites["a"]
    a.page("/doc", page("/l"))
    a.route("/bin", lambda n: Reply(body=b"\x00\x01binary", content_type="application/octet-stream"))
    counters = await crawl(store, [a.url("/doc"), a.url("/bin")], store_dir=str(tmp_path))
    lines = [json.loads(x) for x in (tmp_path / "pages-c1.jsonl").read_text().splitlines()]
    by_url = {r["url"]: r for r in lines}
    assert set(by_url) == {a.url("/doc"), a.url("/bin")}
    assert by_url[a.url("/doc")]["text"] == page("/l")
    assert by_url[a.url("/doc")]["status"] == 200
    assert base64.b64decode(by_url[a.url("/bin")]["body_b64"]) == b"\x00\x01binary"
    assert counters.get("not_html") == 1


async def test_nothing_stored_by_default(store, web, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = web.sites["a"]
    a.page("/doc")
    await crawl(store, [a.url("/doc")])
    assert list(tmp_path.iterdir()) == []


async def test_idle_and_blocking_take(store, web):
    """An idle crawler waits in Redis (BLOCK): a task put in later is taken at once."""
    a = web.sites["a"]
    a.page("/later")
    async with crawling(store, block_timeout=1.0) as crawler:
        await until(lambda: crawler.idle)
        # blocking, not spinning: over half a second idle, at most one read ends and one starts
        round_trips = store.round_trips
        await trio.sleep(0.5)  # a measurement window, not synchronisation
        assert store.round_trips - round_trips <= 2
        t0 = trio.current_time()
        await trio.to_thread.run_sync(store.stream_add, TASK_POOL, [a.url("/later")])
        await until(lambda: len(a.hits("/later")) == 1, timeout=2)
        assert trio.current_time() - t0 < 0.5  # taken at once, not when the block times out
        await settle(store, crawler)
        await until(lambda: crawler.idle)


async def test_no_fetch_starts_while_redis_is_down(web, tmp_path):
    """A page's result is in memory only until its transaction is written: a crawler that
    went on fetching its leased tasks while its Redis was dead held every one of them
    (up to max_leased) in memory, all fetched again if the daemon was then restarted.
    Now the tasks wait: during the outage only the pages in flight at the kill, and those
    that started before the crawler saw a call to Redis fail, are fetched; after it, each
    page once."""
    from dedupnet.adapters.storage.embedded import EmbeddedRedis
    from dedupnet.adapters.storage.store import Store

    a = web.sites["a"]
    tasks = slow_pages(a, 20)
    server = EmbeddedRedis(persistent=True, data_dir=tmp_path / "redis")
    store = Store(server.start(), "held")
    try:
        store.stream_add(TASK_POOL, tasks)
        async with crawling(store, concurrency=2, per_site_concurrency=0, max_leased=20, take_batch=20,
                            respect_robots=False) as crawler:
            await until(lambda: a.active == 2 and crawler.in_progress == 20)
            await trio.to_thread.run_sync(server.kill)
            killed = len(a.hits())
            await trio.sleep(1.5)  # the 18 others would all be fetched by now
            during = len(a.hits()) - killed
            await trio.to_thread.run_sync(server.restart)
            await settle(store, crawler)
        # The pages in flight, and at most the next ones that took their slots before
        # those pages' write failed (the crawler's first sight of the dead Redis).
        assert during <= 2 * 2, during
        assert [len(a.hits(f"/w{i}")) for i in range(20)] == [1] * 20
        assert finished(store, tasks) == [True] * 20
    finally:
        store.close()
        server.stop()


async def test_stop_taking_gives_up_at_once_what_has_not_been_requested(store, web):
    """A host stopping: the pages on the wire finish and are recorded; the tasks still
    waiting for the site's slots are given up at once and stay in task_pool (to be
    handed back), so none of them is requested after the stop."""
    a = web.sites["a"]
    release = trio.Event()

    async def held(n):
        await release.wait()
        return Reply(body=page().encode())

    for i in range(20):
        a.route(f"/w{i}", held)
    counters = Counters()
    store.stream_add(TASK_POOL, [a.url(f"/w{i}") for i in range(20)])
    async with crawling(store, counters=counters, concurrency=10, per_site_concurrency=2,
                        respect_robots=False) as crawler:
        await until(lambda: crawler.in_progress == 20 and a.active == 2)
        crawler.stop_taking()
        await until(lambda: crawler.in_progress == 2)  # only the two on the wire are left
        assert crawler.on_the_wire == 2
        release.set()
        await until(lambda: crawler.in_progress == 0)
        assert crawler.pages_done == 2
    assert len(a.hits()) == 2
    assert task_count(store) == 18
    assert counters.get("tasks_given_up") == 18

"""robots.txt on a Scrapy host: the scheduler hands out no task its site's robots.txt
disallows, whatever Scrapy's RobotsTxtMiddleware does. That middleware (Scrapy 2.19, asyncio
reactor) lets the third and later requests of a site that arrive while its robots.txt is
being fetched through unchecked: every waiter after the first gets None, not the rules."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import trio

pytest.importorskip("scrapy")

from dedupnet.adapters.storage.store import Store  # noqa: E402
from local_host.frontier.sites import task_count  # noqa: E402
from dedupnet.harness import procplan  # noqa: E402
from dedupnet.harness.scrapyhost import EXAMPLE  # noqa: E402
from dedupnet.harness.web import SyntheticWeb, WebSpec  # noqa: E402


def _urls(web: SyntheticWeb) -> tuple[list[str], list[str]]:
    """Site 0's private pages and some of its public ones."""
    on_site0 = [web.url(i) for i in range(web.spec.sites + 10, web.spec.pages) if web.site[i] == 0
                and web.kind[i] == 0 and not web.flaky[i]]
    private = [u for u in on_site0 if web.disallowed(u)]
    public = [u for u in on_site0 if not web.disallowed(u)]
    return private, public


async def test_tasks_disallowed_by_robots_txt_are_never_fetched(redis_url, tmp_path):
    web = SyntheticWeb(WebSpec(pages=600, sites=2, seed=3, private_share=0.2), port=0)
    prefix = f"scrapyrobots-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    store = Store(redis_url, prefix)
    log = tmp_path / "scrapy.log"
    argv = [sys.executable, "-m", "scrapy", "crawl", "follow", "-s", f"DEDUPNET_REDIS_URL={redis_url}",
            "-s", f"DEDUPNET_PREFIX={prefix}", "-s", "DEDUPNET_CONSUMER=robots", "-s", "DEDUPNET_MAX_IDLE=1",
            "-s", "DEDUPNET_FLUSH_INTERVAL=0.1", "-s", "LOG_LEVEL=INFO"]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(web.serve)
            private, public = _urls(web)
            assert len(private) >= 6
            # Many tasks of one site at once, before its robots.txt is known: the private ones first.
            store.stream_add("task_pool", private[:8] + public[:4])
            with open(log, "wb") as out:
                proc = await trio.to_thread.run_sync(lambda: subprocess.run(
                    argv, cwd=EXAMPLE, env=procplan.daemon_env(), stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, timeout=90))
            nursery.cancel_scope.cancel()
        text = log.read_text(errors="replace")
        assert proc.returncode == 0, text[-3000:]
        fetched = set(web.answer_counts)
        assert not fetched & set(private), f"robots-disallowed pages fetched: {sorted(fetched & set(private))}"
        assert set(public[:4]) <= fetched, text[-3000:]
        # Every task is finished, the disallowed ones without a fetch.
        assert task_count(store) == 0, text[-3000:]
    finally:
        store.delete_prefix()
        store.close()


# -- the gate alone ------------------------------------------------------------------------------
ROBOTS = b"User-agent: *\nDisallow: /private/\n"


def test_the_gate_fetches_once_per_origin_and_checks_every_waiting_task_by_its_rules():
    from dedupnet.scrapy.robots import ALLOWED, DISALLOWED, FETCH, WAIT, RobotsGate
    from local_host.crawler.fetch import ROBOTS_TTL

    now = [0.0]
    gate = RobotsGate("bot", clock=lambda: now[0])
    assert gate.check("http://a.example/private/1", "t1") == FETCH
    assert gate.check("http://a.example/private/2", "t2") == WAIT
    assert gate.check("http://a.example/x", "t3") == WAIT
    assert len(gate) == 3
    assert gate.answered("http://a.example", 200, ROBOTS) == ["t1", "t2", "t3"]
    assert [gate.check(u, None) for u in ("http://a.example/private/1", "http://a.example/x")] == [DISALLOWED, ALLOWED]
    now[0] = ROBOTS_TTL + 1  # the rules are old: fetched again
    assert gate.check("http://a.example/x", "t4") == FETCH
    assert gate.answered("http://a.example", 404, b"") == ["t4"]  # none: everything allowed
    assert gate.check("http://a.example/private/1", None) == ALLOWED


def test_an_unavailable_robots_txt_holds_its_tasks_then_gives_them_up():
    from dedupnet.scrapy.robots import FETCH, RobotsGate
    from local_host.crawler.fetch import RobotsUnavailable

    gate = RobotsGate("bot", attempts=2)
    assert gate.check("http://a.example/x", "t1") == FETCH
    with pytest.raises(RobotsUnavailable):
        gate.answered("http://a.example", 503, b"")
    assert gate.failed("http://a.example") is None  # asked again later
    assert gate.failed("http://a.example") == ["t1"]  # given up: never fetched unchecked
    assert gate.check("http://a.example/y", "t2") == FETCH  # the next task tries again

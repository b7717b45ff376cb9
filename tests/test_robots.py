"""The one robots.txt cache (local_host/crawler/fetch.py) behind both crawlers: its rules, their
age and bound, and our crawler's single fetch per origin."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from dedupnet.scrapy.robots import RobotsGate
from local_host.crawler.fetch import ROBOTS_TTL, RobotsCache, RobotsCheck, RobotsUnavailable

ROBOTS = "User-agent: *\nDisallow: /private/\n"


def test_rules_are_known_until_they_are_old():
    now = [0.0]
    cache = RobotsCache("bot", clock=lambda: now[0])
    assert cache.allowed("http://a.example/x") is None  # not fetched yet
    cache.learn("http://a.example", ROBOTS)
    cache.learn("http://b.example", None)  # no robots.txt: everything allowed
    assert cache.allowed("http://a.example/x") is True
    assert cache.allowed("http://a.example/private/1") is False
    assert cache.allowed("http://b.example/private/1") is True
    now[0] = ROBOTS_TTL
    assert cache.allowed("http://a.example/x") is None  # fetch again


def test_the_least_recently_used_origin_goes_first():
    cache = RobotsCache("bot", clock=lambda: 0.0, max_entries=2)
    cache.learn("http://a.example", None)
    cache.learn("http://b.example", None)
    assert cache.allowed("http://a.example/") is True  # a used last
    cache.learn("http://c.example", None)
    assert len(cache) == 2
    assert cache.allowed("http://b.example/") is None
    assert cache.allowed("http://a.example/") is True


def test_both_crawlers_keep_their_rules_in_the_one_cache():
    async def fetch(origin):
        return None

    assert isinstance(RobotsGate("bot").rules, RobotsCache)
    assert isinstance(RobotsCheck(fetch, agent="bot").cache, RobotsCache)


async def test_concurrent_askers_share_one_fetch():
    fetched = []
    release = trio.Event()

    async def fetch(origin):
        fetched.append(origin)
        await release.wait()
        return ROBOTS

    check = RobotsCheck(fetch, agent="bot")
    verdicts = {}

    async def ask(url):
        verdicts[url] = await check.allowed(url)

    async with trio.open_nursery() as nursery:
        for url in ("http://a.example/x", "http://a.example/private/1", "http://a.example/y"):
            nursery.start_soon(ask, url)
        await trio.testing.wait_all_tasks_blocked()
        release.set()
    assert fetched == ["http://a.example"]
    assert verdicts == {"http://a.example/x": True, "http://a.example/private/1": False, "http://a.example/y": True}
    assert await check.allowed("http://a.example/private/2") is False and len(fetched) == 1


async def test_a_failed_fetch_fails_its_waiters_and_is_not_cached():
    answers = [RobotsUnavailable("http://a.example/robots.txt: HTTP 503"), ROBOTS]
    release = trio.Event()

    async def fetch(origin):
        await release.wait()
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    check = RobotsCheck(fetch, agent="bot")
    failures = []

    async def ask():
        with pytest.raises(RobotsUnavailable):
            await check.allowed("http://a.example/x")
        failures.append(1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        release.set()
    assert failures == [1, 1] and answers == [ROBOTS]  # one fetch for both
    assert await check.allowed("http://a.example/private/x") is False  # asked again

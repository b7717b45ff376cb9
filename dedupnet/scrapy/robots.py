"""robots.txt for the tasks a Scrapy spider takes from its host: the scheduler's gate.

A dedupnet host never fetches what a site's robots.txt disallows, whatever the crawler
in front of it does. Scrapy's ``RobotsTxtMiddleware`` cannot be relied on for that: on
Scrapy 2.19 with the asyncio reactor, the requests of a site that reach it while its
robots.txt is being fetched all wait on one Deferred, and each waiter after the first
receives None (the Deferred's result is used up by the first one's callback) — which
the middleware reads as "no robots.txt, everything allowed". A crawl that hands a site
many tasks at once (a batch from ``task_pool``) hits that every time.

So the scheduler checks each task itself before handing it to the engine, with the
rules the dedupnet crawler uses (``local_host.crawler.fetch``: :func:`robots_text` reads the
answer, protego the rules), and marks what it let through ``dont_obey_robotstxt``: the
middleware is not asked again, and robots.txt is fetched once per site, not twice.

:class:`RobotsGate` is sans-I/O: it says what to do with a task URL (hand it out, skip
it, wait, fetch robots.txt first), keeps the tasks waiting per origin and is told the
answers; the scheduler does the fetching through Scrapy's engine. The rules are kept in
the same cache as our crawler's (``local_host.crawler.fetch.RobotsCache``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from local_host.crawler.fetch import RobotsCache, origin_of, robots_text

__all__ = ["RobotsGate", "ALLOWED", "DISALLOWED", "WAIT", "FETCH"]

ALLOWED, DISALLOWED, WAIT, FETCH = "allowed", "disallowed", "wait", "fetch"


@dataclass
class _Pending:
    """An origin whose robots.txt is being fetched, and the tasks waiting for it."""

    fetching: bool = False
    failures: int = 0
    waiting: list[Any] = field(default_factory=list)


class RobotsGate:
    """The rules (the host's :class:`~local_host.crawler.fetch.RobotsCache`, on ``clock``) and,
    per origin whose rules are being fetched, the tasks waiting for them.

    ``attempts``: robots.txt fetches that fail in a row before the tasks waiting for it
    are given up (RFC 9309: an unreachable robots.txt allows nothing)."""

    def __init__(self, agent: str, *, attempts: int = 3, clock: Callable[[], float] = time.monotonic):
        self.rules = RobotsCache(agent, clock=clock)
        self.attempts = attempts
        self._pending: dict[str, _Pending] = {}

    def __len__(self) -> int:
        """Tasks waiting for a robots.txt."""
        return sum(len(p.waiting) for p in self._pending.values())

    def check(self, url: str, task: Any) -> str:
        """What to do with ``task`` (of ``url``): ``ALLOWED`` or ``DISALLOWED`` by known
        rules; else it waits here, and ``FETCH`` says robots.txt of ``origin_of(url)`` is
        to be fetched (once: later tasks of the origin get ``WAIT``)."""
        allowed = self.rules.allowed(url)
        if allowed is not None:
            return ALLOWED if allowed else DISALLOWED
        pending = self._pending.setdefault(origin_of(url), _Pending())
        pending.waiting.append(task)
        if pending.fetching:
            return WAIT
        pending.fetching = True
        return FETCH

    def answered(self, origin: str, status: int, body: bytes) -> list[Any]:
        """robots.txt of ``origin`` came back: the tasks that waited for it, to check
        again. Raises :class:`RobotsUnavailable` for an answer that says nothing (a 5xx):
        then it is :meth:`failed`."""
        self.rules.learn(origin, robots_text(origin + "/robots.txt", status, body))
        pending = self._pending.pop(origin, None)
        return pending.waiting if pending is not None else []

    def failed(self, origin: str) -> list[Any] | None:
        """The fetch of ``origin``'s robots.txt failed. None: fetch it again later; after
        ``attempts`` failures in a row, the tasks that waited for it, given up (the next
        task of the origin starts a new fetch)."""
        pending = self._pending.setdefault(origin, _Pending())
        pending.failures += 1
        if pending.failures < self.attempts:
            return None
        del self._pending[origin]
        return pending.waiting

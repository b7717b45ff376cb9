"""robots.txt for the tasks a Scrapy spider takes from its host: the scheduler's gate.

A dedupnet host never fetches what a site's robots.txt disallows, whatever the crawler
in front of it does. Scrapy's ``RobotsTxtMiddleware`` cannot be relied on for that: on
Scrapy 2.19 with the asyncio reactor, the requests of a site that reach it while its
robots.txt is being fetched all wait on one Deferred, and each waiter after the first
receives None (the Deferred's result is used up by the first one's callback) — which
the middleware reads as "no robots.txt, everything allowed". A crawl that hands a site
many tasks at once (a batch from ``task_pool``) hits that every time.

So the scheduler checks each task itself before handing it to the engine, with the
rules the dedupnet crawler uses (``local_host.fetch``: :func:`robots_text` reads the
answer, protego the rules), and marks what it let through ``dont_obey_robotstxt``: the
middleware is not asked again, and robots.txt is fetched once per site, not twice.

:class:`RobotsGate` is sans-I/O: it says what to do with a task URL (hand it out, skip
it, wait, fetch robots.txt first), keeps the tasks waiting per origin and is told the
answers; the scheduler does the fetching through Scrapy's engine.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protego import Protego

from local_host.fetch import origin_of, robots_text

__all__ = ["RobotsGate", "ALLOWED", "DISALLOWED", "WAIT", "FETCH"]

ALLOWED, DISALLOWED, WAIT, FETCH = "allowed", "disallowed", "wait", "fetch"


@dataclass
class _Origin:
    rules: Protego | None = None  # None: everything allowed (no robots.txt)
    expires: float = 0.0  # 0: not known yet
    fetching: bool = False
    failures: int = 0
    waiting: list[Any] = field(default_factory=list)


class RobotsGate:
    """Per origin: its rules (cached ``ttl`` seconds, at most ``max_entries`` origins,
    least recently used dropped first) and the tasks waiting for them.

    ``attempts``: robots.txt fetches that fail in a row before the tasks waiting for it
    are given up (RFC 9309: an unreachable robots.txt allows nothing)."""

    def __init__(self, agent: str, *, ttl: float = 86400.0, max_entries: int = 10_000, attempts: int = 3,
                 clock: Callable[[], float] = time.monotonic):
        self.agent = agent
        self.ttl = ttl
        self.max_entries = max_entries
        self.attempts = attempts
        self.clock = clock
        self._origins: collections.OrderedDict[str, _Origin] = collections.OrderedDict()

    def __len__(self) -> int:
        """Tasks waiting for a robots.txt."""
        return sum(len(o.waiting) for o in self._origins.values())

    def check(self, url: str, task: Any) -> str:
        """What to do with ``task`` (of ``url``): ``ALLOWED`` or ``DISALLOWED`` by known
        rules; else it waits here, and ``FETCH`` says robots.txt of ``origin_of(url)`` is
        to be fetched (once: later tasks of the origin get ``WAIT``)."""
        origin = origin_of(url)
        entry = self._origins.get(origin)
        if entry is None:
            entry = self._origins[origin] = _Origin()
            self._trim()
        self._origins.move_to_end(origin)
        if entry.expires > self.clock():
            return ALLOWED if entry.rules is None or entry.rules.can_fetch(url, self.agent) else DISALLOWED
        entry.waiting.append(task)
        if entry.fetching:
            return WAIT
        entry.fetching = True
        return FETCH

    def answered(self, origin: str, status: int, body: bytes) -> list[Any]:
        """robots.txt of ``origin`` came back: the tasks that waited for it, to check
        again. Raises :class:`RobotsUnavailable` for an answer that says nothing (a 5xx):
        then it is :meth:`failed`."""
        text = robots_text(origin + "/robots.txt", status, body)
        entry = self._origins.setdefault(origin, _Origin())
        entry.rules = Protego.parse(text) if text is not None else None
        entry.expires = self.clock() + self.ttl
        entry.fetching, entry.failures = False, 0
        waiting, entry.waiting = entry.waiting, []
        return waiting

    def failed(self, origin: str) -> list[Any] | None:
        """The fetch of ``origin``'s robots.txt failed. None: fetch it again later; after
        ``attempts`` failures in a row, the tasks that waited for it, given up (the next
        task of the origin starts a new fetch)."""
        entry = self._origins.setdefault(origin, _Origin())
        entry.failures += 1
        if entry.failures < self.attempts:
            return None
        entry.fetching, entry.failures = False, 0
        waiting, entry.waiting = entry.waiting, []
        return waiting

    def _trim(self) -> None:
        while len(self._origins) > self.max_entries:
            oldest = next(iter(self._origins))
            if self._origins[oldest].waiting or self._origins[oldest].fetching:
                return  # never drop what tasks wait on
            del self._origins[oldest]

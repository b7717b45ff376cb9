"""Rate limits that do not depend on trio's clock being real: the token bucket that
throttles what a connection is read at, and the budget of log lines per source.

Why a budget of log lines: every connection a server accepts can make it write a line
(refused, aborted, bad input, registered). Anyone who can open TCP connections to a
daemon could otherwise fill its disk and bury the lines that matter; a line that is
not written is counted (``log_suppressed``, on /metrics with the other counters), and
the next line that is written for that source says how many were not.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

import trio

from dedupnet.adapters.monitor.metrics import Counters

__all__ = ["TokenBucket", "LogLimiter"]


class TokenBucket:
    """A token bucket (sans-I/O: the caller passes the time): ``rate`` tokens a second
    up to ``burst``. :meth:`take` may leave it in debt; :meth:`wait` says how long until
    the debt is paid; :meth:`allow` takes one token only if there is one."""

    __slots__ = ("rate", "burst", "tokens", "last")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.last = now

    def _refill(self, now: float) -> None:
        if now > self.last:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now

    def take(self, n: float, now: float) -> None:
        self._refill(now)
        self.tokens -= n

    def wait(self, now: float) -> float:
        """Seconds until the bucket is out of debt (0 if it is not in debt)."""
        self._refill(now)
        return -self.tokens / self.rate if self.tokens < 0 else 0.0

    def allow(self, now: float) -> bool:
        """Take one token if there is a whole one; never goes into debt."""
        self._refill(now)
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class LogLimiter:
    """Log lines about connections, at most ``burst`` at once and ``rate`` a second per
    source address, and ``total_burst`` / ``total_rate`` for all sources together (so
    that many sources cannot flood the log either). What is over the budget is counted
    (``log_suppressed``) and mentioned in the next line written for that source.

    Sources are kept in a table of at most ``max_sources`` entries, the least recently
    heard of dropped first: memory stays bounded however many addresses connect."""

    def __init__(self, counters: Counters, *, burst: float = 10, rate: float = 0.1, total_burst: float = 100,
                 total_rate: float = 2.0, max_sources: int = 4096,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self.counters = counters
        self.burst, self.rate, self.max_sources = burst, rate, max_sources
        self.clock = clock
        self._total = TokenBucket(total_rate, total_burst, clock())
        #: source -> (its bucket, lines of it not written since its last line)
        self._sources: OrderedDict[str, list] = OrderedDict()

    def log(self, logger: logging.Logger, level: int, source: str | None, msg: str, *args: object,
            exc_info: object = None) -> bool:
        """Write ``msg % args`` at ``level`` if ``source`` and everyone together are within
        their budgets; else count it. Returns whether it was written."""
        if not logger.isEnabledFor(level):
            return False
        now = self.clock()
        key = source or "?"
        entry = self._sources.get(key)
        if entry is None:
            entry = self._sources[key] = [TokenBucket(self.rate, self.burst, now), 0]
            if len(self._sources) > self.max_sources:
                self._sources.popitem(last=False)
        else:
            self._sources.move_to_end(key)
        if not (entry[0].allow(now) and self._total.allow(now)):
            entry[1] += 1
            self.counters.inc("log_suppressed")
            return False
        if entry[1]:
            msg += " (%d earlier lines about %s not logged: over its log budget)"
            args = (*args, entry[1], key)
            entry[1] = 0
        logger.log(level, msg, *args, exc_info=exc_info)
        return True

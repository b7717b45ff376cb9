"""A Scrapy extension for bench/bench_scrapy_crawl.py: keeps a spider open until it has
had nothing to do for ``IDLE_CLOSE_AFTER`` seconds, then lets it close.

A plain spider on scrapy-redis's scheduler closes the first time it finds the shared
queue empty (at start, before the seeds are in; mid-crawl, while other spiders still
fetch pages that bring links). scrapy-redis keeps a spider open only for its own
``RedisSpider``; the example spider is a plain one, so the bench gives it this."""

from __future__ import annotations

import time

from scrapy import signals
from scrapy.exceptions import DontCloseSpider


class IdleClose:
    def __init__(self, after: float):
        self.after = after
        self.active_at = time.monotonic()

    @classmethod
    def from_crawler(cls, crawler):
        ext = cls(crawler.settings.getfloat("IDLE_CLOSE_AFTER", 10.0))
        for signal in (signals.request_scheduled, signals.response_received):
            crawler.signals.connect(ext.active, signal=signal)
        crawler.signals.connect(ext.idle, signal=signals.spider_idle)
        return ext

    def active(self, *args, **kwargs) -> None:
        self.active_at = time.monotonic()

    def idle(self, spider) -> None:
        if time.monotonic() - self.active_at < self.after:
            raise DontCloseSpider

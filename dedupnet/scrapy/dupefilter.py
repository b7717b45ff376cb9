"""The dupefilter of a Scrapy spider on a dedupnet host (``DUPEFILTER_CLASS =
"dedupnet.scrapy.DupeFilter"``): the first, host-local layer of the de-dup, before a
URL goes to ``URL_pool``."""

from __future__ import annotations

import logging

from scrapy import Request
from scrapy.dupefilters import BaseDupeFilter

from dedupnet.codec.urls import fingerprint
from dedupnet.scrapy.leases import normal_url

log = logging.getLogger("dedupnet.scrapy")


class DupeFilter(BaseDupeFilter):
    """The host-local first layer: drops a URL this spider has pushed already in this
    run, by dedupnet's normalisation and fingerprint (``http://A.com:80/x#y`` and
    ``http://a.com/x`` are one URL), so ``URL_pool`` is not fed the same URL again and
    again. The real de-dup (``finish_URL``, the LAN, other networks) is the protocol's.

    In memory, bounded by ``DEDUPNET_SEEN_MAX`` fingerprints (default 1,000,000, 8 bytes
    each plus the set's overhead): when full it starts again empty, which costs only
    URLs pushed twice (the protocol drops them). Requests that are not GETs or have a
    body are never "seen" (the scheduler does not ask for them)."""

    def __init__(self, max_size: int = 1_000_000, debug: bool = False):
        self.max_size = max_size
        self.debug = debug
        self.seen: set[int] = set()
        self.filtered = 0

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        return cls(s.getint("DEDUPNET_SEEN_MAX", 1_000_000), s.getbool("DUPEFILTER_DEBUG"))

    @classmethod
    def from_settings(cls, settings):  # pragma: no cover - Scrapy < 2.12 path
        return cls(settings.getint("DEDUPNET_SEEN_MAX", 1_000_000), settings.getbool("DUPEFILTER_DEBUG"))

    def request_fingerprint(self, request: Request) -> int | None:
        url = normal_url(request.url)
        return None if url is None else fingerprint(url)

    def request_seen(self, request: Request) -> bool:
        fp = self.request_fingerprint(request)
        if fp is None:
            return False  # the scheduler counts and drops bad URLs
        if fp in self.seen:
            self.filtered += 1
            return True
        if len(self.seen) >= self.max_size:
            self.seen.clear()
        self.seen.add(fp)
        return False

    def log(self, request: Request, spider) -> None:
        if self.debug:
            log.debug("filtered (pushed already): %s", request.url)

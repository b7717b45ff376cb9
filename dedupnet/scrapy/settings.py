"""The Scrapy settings a spider on a dedupnet host is configured by: where the host's
Redis is, its key prefix, and the ``DEDUPNET_*`` knobs of the scheduler (docs/SCRAPY.md
lists them). Read once, when Scrapy builds the scheduler; what is missing or wrong
stops the spider with ``NotConfigured`` and says which setting to give.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from scrapy.exceptions import NotConfigured

from dedupnet.adapters.storage.store import Store
from dedupnet.adapters.storage.store_choice import store_for
from dedupnet.codec.backoff import Backoff
from dedupnet.scrapy.census import CrawlCensus
from dedupnet.scrapy.robots import RobotsGate
from local_host.crawler.settings import CrawlerSettings
from local_host.frontier.sites import Pace


class Addon:
    """``ADDONS = {"dedupnet.scrapy.Addon": 0}``: a spider as a dedupnet host in one
    line, with its scheduler and dupefilter, and bodies cut off where dedupnet's own
    crawler cuts them (``DOWNLOAD_MAXSIZE``; Scrapy's default, 1 GB, had a spider read
    two 200 MB files whole on a real web) and warned of at a quarter of that. Set in
    the project's settings, any of them wins over the add-on's."""

    def update_settings(self, settings) -> None:
        for name, value in (("SCHEDULER", "dedupnet.scrapy.Scheduler"),
                            ("DUPEFILTER_CLASS", "dedupnet.scrapy.DupeFilter"),
                            ("DOWNLOAD_MAXSIZE", CrawlerSettings.max_body),
                            ("DOWNLOAD_WARNSIZE", CrawlerSettings.max_body // 4)):
            settings.set(name, value, priority="addon")


#: The scheduler's calls block the reactor: few, short retries (what is not written
#: stays in memory and goes at the next tick).
SCRAPY_STORE_RETRY = Backoff(first=0.05, cap=0.5, attempts=3)


def scheduler_args(crawler) -> tuple[Store, Any, dict[str, Any]]:
    """The host's store, the dupefilter and the keyword arguments of the scheduler."""
    s = crawler.settings
    url, prefix, bits = _redis_settings(s)
    # Calls block the reactor: short timeouts too.
    store = store_for(url, prefix, bucket_bits=bits, retry=SCRAPY_STORE_RETRY,
                      socket_timeout=s.getfloat("DEDUPNET_SOCKET_TIMEOUT", 5.0))
    consumer = s.get("DEDUPNET_CONSUMER") or s.get("DEDUPNET_HOST_IP") or f"scrapy-{socket.gethostname()}"
    concurrency = s.getint("CONCURRENT_REQUESTS", 16)
    dupefilter = _build(_load(s.get("DUPEFILTER_CLASS")), crawler)
    return store, dupefilter, dict(
        consumer=consumer,
        take_batch=s.getint("DEDUPNET_TAKE_BATCH", concurrency),
        max_leased=s.getint("DEDUPNET_MAX_LEASED", concurrency),
        pace=_pace(s),
        flush_interval=s.getfloat("DEDUPNET_FLUSH_INTERVAL", 0.2),
        push_batch=s.getint("DEDUPNET_PUSH_BATCH", 1000),
        max_idle=s.getfloat("DEDUPNET_MAX_IDLE", 0.0),
        seed_start_requests=s.getbool("DEDUPNET_SEED_START_REQUESTS", True),
        keep_callbacks=s.getbool("DEDUPNET_KEEP_CALLBACKS", True),
        robots=RobotsGate(s.get("ROBOTSTXT_USER_AGENT") or s.get("USER_AGENT") or "Scrapy")
        if s.getbool("ROBOTSTXT_OBEY") else None,
        census=_census(s),
    )


def _pace(s) -> Pace:
    """How the host's frontier spaces one site's tasks for this spider: Scrapy's own
    per-domain delay (its shortest, when randomised) and concurrency. Scrapy's
    downloader still keeps the exact delay; the frontier only hands out no site faster."""
    delay = s.getfloat("DOWNLOAD_DELAY", 0.0) * (0.5 if s.getbool("RANDOMIZE_DOWNLOAD_DELAY", True) else 1.0)
    return Pace(delay, max(1, s.getint("CONCURRENT_REQUESTS_PER_DOMAIN", 8)))


def _redis_settings(settings) -> tuple[str, str, int]:
    """(Redis URL, key prefix, bucket bits) of the host from Scrapy settings."""
    url = settings.get("DEDUPNET_REDIS_URL")
    data_dir = settings.get("DEDUPNET_DATA_DIR")
    if not url and data_dir:
        path = Path(data_dir) / "redis.url"
        try:
            url = path.read_text().strip()
        except OSError as e:
            raise NotConfigured(f"DEDUPNET_DATA_DIR: cannot read {path} (is `dedupnet local` running "
                                f"with this --data-dir?): {e}") from None
    if not url:
        raise NotConfigured("dedupnet.scrapy needs DEDUPNET_REDIS_URL (the host daemon's --redis) "
                            "or DEDUPNET_DATA_DIR (its --data-dir, for its embedded Redis)")
    prefix = settings.get("DEDUPNET_PREFIX")
    ip = settings.get("DEDUPNET_HOST_IP")
    if not prefix and ip:
        prefix = f"dedupnet:host:{ip}"  # the daemon's default (dedupnet/service/daemons.py run_local)
    if not prefix:
        raise NotConfigured("dedupnet.scrapy needs DEDUPNET_PREFIX (the host daemon's --prefix) "
                            "or DEDUPNET_HOST_IP (its --ip, for the default prefix)")
    return url, prefix, settings.getint("DEDUPNET_BUCKET_BITS", 0)


def _build(objcls, crawler):
    try:
        from scrapy.utils.misc import build_from_crawler  # Scrapy 2.12+
    except ImportError:  # pragma: no cover - Scrapy 2.11
        from scrapy.utils.misc import create_instance

        return create_instance(objcls, crawler.settings, crawler)
    return build_from_crawler(objcls, crawler)


def _census(settings) -> CrawlCensus | None:
    try:
        return CrawlCensus.from_settings(settings)
    except ValueError as e:
        raise NotConfigured(f"dedupnet.scrapy: {e}") from None


def _load(path: str):
    from scrapy.utils.misc import load_object

    return load_object(path)


def safe_url(url: str) -> str:
    """A Redis URL without its password, for logs."""
    head, at, tail = url.rpartition("@")
    return f"{head.split('://')[0]}://***@{tail}" if at else url

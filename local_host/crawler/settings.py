"""What a host's crawler is told: its politeness, retries, limits and scope, as one
object (the daemon builds it from the host's settings, dedupnet/codec/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass

from dedupnet.codec.ages import RecrawlPolicy
from dedupnet.codec.backoff import Backoff
from dedupnet.codec.settings import default_of


@dataclass
class CrawlerSettings:
    #: Requests on the wire at once, all sites together.
    concurrency: int = default_of("concurrency")
    #: Requests on the wire at once to one site (host); 0 = no per-site bound.
    per_site_concurrency: int = default_of("per_site_concurrency")
    #: Minimum seconds between the starts of two requests to one site; 0 = none.
    per_site_delay: float = default_of("per_site_delay")
    #: robots.txt ``Crawl-delay`` is honoured up to this many seconds; 0 ignores it.
    max_crawl_delay: float = 10.0
    respect_robots: bool = default_of("respect_robots")
    user_agent: str = "dedupnet-crawler/0.1"
    #: The product token robots.txt groups are matched against.
    robots_agent: str = "dedupnet"
    #: Largest body read (bytes, after content decoding); a larger page is cut off.
    max_body: int = 2 * 1024 * 1024
    #: Retries of a request after a 5xx in ``retry_statuses``, a timeout or a connection error.
    max_retries: int = 3
    #: Back-off before retry k is ``retry_base * 2**(k-1)`` seconds (at most
    #: ``retry_max_delay``), jittered: :attr:`retry_backoff`.
    retry_base: float = 0.5
    retry_max_delay: float = 30.0
    retry_statuses: frozenset[int] = frozenset({500, 502, 503, 504})
    #: httpx connect / read / write / pool timeout, seconds.
    timeout: float = 10.0
    #: One whole request including its body, seconds (a slow-drip server).
    page_timeout: float = 60.0
    #: Hosts (and their subdomains) links may point to; empty = any.
    allowed_domains: frozenset[str] = frozenset()
    #: Links of a page at depth ``max_depth`` are not followed; None = no limit.
    max_depth: int | None = None
    #: Depth hash key (full key, no prefix added); default ``<prefix>:depth``.
    depth_key: str | None = None
    #: Seconds between re-crawls of the seeds; None = off.
    recrawl_interval: float | None = None
    #: Re-crawl by age (the host's ``recrawl_after``; the daemon fills it in): finish_URL
    #: forgets a URL after its age, and re-crawled seeds go through URL_pool. None: off.
    recrawl: RecrawlPolicy | None = None
    #: Write fetched pages as JSON lines to ``store_dir/pages-<consumer>.jsonl``.
    store_dir: str | None = None
    #: Source address of HTTP connections (e.g. the host's IP); None = any.
    local_address: str | None = None
    #: Honour HTTP(S)_PROXY / NO_PROXY from the environment.
    trust_env: bool = False
    #: HTTP clients kept open (per site, each with a few keep-alive connections);
    #: beyond this the least recently used idle ones are closed. The frontier takes
    #: its sites in turn, so a site comes back after every other ready one: enough
    #: clients keep its connection warm till then (a few MB more for 1,024 than 256).
    max_clients: int = 1024
    #: Tasks taken from task_pool and not yet done (fetching, retrying, being written);
    #: None: twice ``concurrency``. The frontier hands a task out only when its site may
    #: be fetched (local_host/frontier/sites.py), so a lease rarely waits.
    max_leased: int | None = None
    #: Entries asked for by one XREADGROUP.
    take_batch: int = 64
    #: Longest wait in Redis, seconds, for new tasks or a site's politeness while
    #: nothing can be taken (also the longest a cancellation waits for the blocked thread).
    block_timeout: float = 1.0
    #: Seconds between progress lines at INFO.
    progress_interval: float = 10.0

    @property
    def retry_backoff(self) -> Backoff:
        """The waits before a page's retries. A quarter of jitter: the tasks of a site that
        failed together (a burst of 503s) do not all come back in the same instant."""
        return Backoff(first=self.retry_base, cap=self.retry_max_delay, jitter=0.25)

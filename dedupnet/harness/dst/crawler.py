"""A host's crawler as local_host/crawler/crawl.py behaves toward the protocol, with the
synthetic web's link graph instead of HTTP.

Kept from the real crawler: tasks are taken from ``task_pool`` by its consumer group
(a taken task is pending until done, and a restarted crawler takes its own pending
tasks first, so the pages in progress at a crash are fetched again); at most
``max_leased`` tasks at once, ``concurrency`` requests on the wire and
``per_site_concurrency`` per site, ``per_site_delay`` between two starts on a site;
robots.txt's ``/private/`` is skipped without a request; a redirect's target is a link
like any other (it goes through de-dup); a flaky page's 503s are retried after
``retry_base * 2**k`` (:attr:`CrawlModel.retry_backoff`); a done task writes
``finish_URL`` (its chain), pushes its links to ``URL_pool`` and acknowledges the task
in one transaction.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from dedupnet.codec.backoff import Backoff
from dedupnet.harness.web import SyntheticWeb
from local_host.crawler.settings import CrawlerSettings

from .clock import Scheduler
from .store import HostStore


@dataclass(frozen=True)
class CrawlModel:
    concurrency: int = 16
    per_site_concurrency: int = 4
    per_site_delay: float = 0.0
    max_leased: int = 256
    retry_base: float = 0.05
    max_retries: int = 3
    #: A site's answer time: drawn per site between these (seconds), times a jitter per request.
    site_latency: tuple[float, float] = (0.02, 0.2)

    @property
    def retry_backoff(self) -> Backoff:
        """The crawler's waits before a retry (``CrawlerSettings.retry_backoff``) without
        its jitter: a draw here would change the story of every seeded run."""
        return Backoff(first=self.retry_base, cap=CrawlerSettings.retry_max_delay)


class Web:
    """What every crawler of a run fetches from: the graph, per-site answer times and
    the requests counted per URL (the ground truth's counterpart)."""

    def __init__(self, web: SyntheticWeb, sched: Scheduler, model: CrawlModel):
        self.web, self.sched, self.model = web, sched, model
        lo, hi = model.site_latency
        self.site_base = {h: lo + (hi - lo) * sched.rng.random() for h in web.hosts}
        self.requests: Counter[str] = Counter()  # every request, 503s included
        self.answered: dict[str, list[str]] = {}  # URL -> the hosts whose request it answered (not 503)
        self.skipped: set[str] = set()
        self.on_answer: Callable[[str, str], None] | None = None

    def latency(self, site: str) -> float:
        return self.site_base.get(site, 0.05) * (0.5 + self.sched.rng.random())

    def request(self, url: str, host: str) -> tuple[int, list[str]]:
        """One GET: (status, links or the redirect target)."""
        self.requests[url] += 1
        i = self.web.lookup(url)
        if i is not None and self.web.flaky[i] and self.requests[url] <= self.web.spec.flaky_failures:
            return 503, []
        self.answered.setdefault(url, []).append(host)
        if self.on_answer is not None:
            self.on_answer(url, host)
        if i is None:
            return 404, []
        redirect = self.web.redirect_of(url)
        if redirect is not None:
            return redirect[0], [redirect[1]] if redirect[1] != url else []
        links = [u for u in dict.fromkeys(self.web.links_of(url)) if u != url]
        return 200, links


def site_of_url(url: str) -> str:
    return url.split("/", 3)[2].rsplit(":", 1)[0]


class Crawler:
    """One host's crawler. ``post(fn, *args)``/``after(delay, fn, *args)`` run callbacks
    in its host's process (so a crash or freeze of the host stops them too)."""

    def __init__(self, ip: str, store: HostStore, web: Web, model: CrawlModel, *, after: Callable,
                 on_commit: Callable[[list[str]], None]):
        self.ip, self.store, self.web, self.model = ip, store, web, model
        self.after, self.on_commit = after, on_commit
        self.leased: dict[bytes, str] = {}
        self.waiting: deque[tuple[bytes, str, int]] = deque()  # leased, waiting for a slot
        self.on_wire = 0
        self.site_busy: Counter[str] = Counter()
        self.site_next: dict[str, float] = {}
        self.resume = True  # first this consumer's pending tasks (after a start)
        self.pages_done = 0
        self._wake_set = False

    @property
    def idle(self) -> bool:
        return not self.leased and not self.store.task_pool.new and not self.store.task_pool.pending

    def wake(self) -> None:
        if not self._wake_set:
            self._wake_set = True
            self.after(0.0, self._take)

    def _take(self) -> None:
        self._wake_set = False
        room = self.model.max_leased - len(self.leased)
        if self.resume:
            self.resume = False
            taken = [(e, u) for e, u in self.store.task_pool.pending.items() if e not in self.leased][:room]
        else:
            taken = self.store.task_pool.take(room) if room > 0 else []
        for eid, url in taken:
            self.leased[eid] = url
            self.waiting.append((eid, url, 0))
        self._start()

    def _start(self) -> None:
        m, now = self.model, self.web.sched.now
        blocked: list = []
        while self.waiting and self.on_wire < m.concurrency:
            eid, url, tries = self.waiting.popleft()
            if self.web.web.disallowed(url):
                self.web.skipped.add(url)
                self._done(eid, url, [])
                continue
            site = site_of_url(url)
            if m.per_site_concurrency and self.site_busy[site] >= m.per_site_concurrency:
                blocked.append((eid, url, tries))
                continue
            start = max(now, self.site_next.get(site, 0.0))
            self.site_next[site] = start + m.per_site_delay
            self.site_busy[site] += 1
            self.on_wire += 1
            self.after(start - now + self.web.latency(site), self._answer, eid, url, tries, site)
        self.waiting.extendleft(reversed(blocked))

    def _answer(self, eid: bytes, url: str, tries: int, site: str) -> None:
        self.on_wire -= 1
        self.site_busy[site] -= 1
        status, links = self.web.request(url, self.ip)
        if status == 503 and tries < self.model.max_retries:
            self.after(self.model.retry_backoff.delay(tries + 1), self._retry, eid, url, tries + 1)
        else:
            self._done(eid, url, links if status != 503 else [])
        self._start()

    def _retry(self, eid: bytes, url: str, tries: int) -> None:
        self.waiting.append((eid, url, tries))
        self._start()

    def _done(self, eid: bytes, url: str, links: list[str]) -> None:
        self.store.finish_task(eid, [url], links)
        self.leased.pop(eid, None)
        self.pages_done += 1
        if links:
            self.on_commit(links)
        self.wake()

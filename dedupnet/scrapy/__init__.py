"""A Scrapy spider as the crawler of a dedupnet local host.

One line of ``settings.py`` (and where the host's Redis is)::

    ADDONS = {"dedupnet.scrapy.Addon": 0}   # the scheduler, the dupefilter, a body limit
    DEDUPNET_REDIS_URL = "redis://localhost:6379/0"   # or DEDUPNET_DATA_DIR = "dedupnet-data/host-10.0.0.5"
    DEDUPNET_PREFIX = "dedupnet:host:10.0.0.5"        # or DEDUPNET_HOST_IP = "10.0.0.5"

Next to the spider runs the host's protocol daemon without its own crawler
(``dedupnet local --no-crawl ...``, config ``crawl = false``). The spider takes the
place of ``local_host/crawler/crawl.py`` on the host's pools (paper §1.1):

* a request the spider yields is a *discovered URL*: normalised by the host's rules
  (:class:`dedupnet.codec.urls.URLGate`) and appended to ``URL_pool`` (batched: one
  pipelined ``XADD`` per batch). The host daemon's walker de-dups it host-locally
  (§2.2), its center LAN-wide (§2.3) and across networks (§2.4); a URL new
  everywhere comes back, as a task in the ``task_pool`` of one host of the system;
* :meth:`Scheduler.next_request` hands the spider the tasks of its host's
  ``task_pool``, taken by site as politeness allows (local_host/frontier/sites.py: the one
  frontier dedupnet's own crawler takes from) into the consumer group ``crawl``. A task
  taken is *leased*: it stays in the stream, pending for this consumer, until it is
  finished;
* a task is finished — its URL (and each redirect hop) added to ``finish_URL``, its
  entry acknowledged and deleted — only once Scrapy is done with it: the response
  went through the spider callback and every request and item the callback produced
  was handed on (items through the item pipelines), or the final failure went
  through the errback (after retries; robots.txt refusals, ``IgnoreRequest`` and
  ``HttpError`` included). That is the moment the engine takes the request out of its
  in-progress set (``engine._slot.inprogress``; Scrapy 2.11+), which the scheduler
  looks at on every ``next_request`` and every ``DEDUPNET_FLUSH_INTERVAL``. Scrapy has
  no signal for it: ``response_received`` comes before the callback ran, so a spider
  killed after it would lose the page's links.
  Links and finished tasks go in one ``MULTI/EXEC``: the links a callback yielded are
  in ``URL_pool`` no later than its task leaves ``task_pool``. A spider killed at any
  point loses nothing: on start it takes its own pending entries first (the same
  ``DEDUPNET_CONSUMER`` must be used across restarts) and fetches again the pages that
  were in progress (at least once, as docs/DECISIONS.md says for the crawler).

Requests that are not plain discovered GETs:

* a *retry* (Scrapy's RetryMiddleware sends a copy of the request, ``dont_filter``) of
  a task stays with its task: it is queued here, and the task finishes after it;
* a *redirect* (RedirectMiddleware's new request, ``meta["redirect_urls"]``) of a task
  finishes the task (the redirecting URL goes into ``finish_URL``) and its target is a
  discovered URL like any link, into ``URL_pool``: a page reached both by a redirect and
  by a link is fetched once in the whole system, as with dedupnet's crawler;
* start requests (``meta["is_start_request"]``, Scrapy 2.13+) that are GETs are seeds:
  into ``URL_pool`` even though Scrapy makes them ``dont_filter`` (``DEDUPNET_SEED_START_REQUESTS
  = False`` fetches them here directly instead);
* other ``dont_filter=True`` requests, non-GET requests and GETs with a body bypass
  dedupnet: they go to an in-memory priority queue of this spider, are fetched by it,
  and are not recorded anywhere (Scrapy's own behaviour; they are lost if the spider is
  killed, as without ``JOBDIR``);
* a task coming back from the protocol is a plain URL, so by default it goes to the
  spider's ``parse``. A discovered request with another callback or an errback, a
  non-zero priority or ``cb_kwargs`` has them kept in this host's hash
  ``<prefix>:scrapy_requests`` (8-byte fingerprint -> JSON), and its task gets them back;
  its ``meta`` is not kept. The hash is per host: a URL the protocol gives to another
  host goes to that host's ``parse``.

With ``ROBOTSTXT_OBEY`` each task is checked against its site's robots.txt here, before
the engine gets it (:mod:`dedupnet.scrapy.robots` says why Scrapy's middleware is not
enough): a disallowed task is finished without a fetch.

Bad URLs (not http(s), unparsable, too long) are dropped with a log line and the
stat ``dedupnet/bad_input/<reason>``. Redis errors are retried by the store; if it
stays away, what was to be written is kept in memory and written at the next tick,
never dropped.

The spider does not close when it runs out of tasks: more may come from the protocol
while any host of the system still has pages to fetch. Given a center
(``DEDUPNET_CENTER``), the scheduler asks it, each time it has nothing to do, whether
the whole crawl is complete (:mod:`dedupnet.scrapy.census`, the verdict of ``dedupnet
status --cluster``) and closes the spider when it is. Without an answer (no center
given, none reachable), ``DEDUPNET_MAX_IDLE`` seconds (0, the default: never) of
nothing to do close it.

All Redis calls are made from the Twisted reactor's thread, synchronously, in batches:
one round trip per batch of tasks taken and per flush, not per request.

This module holds the scheduler; its parts live beside it, each importable on its own:
the lease book (:mod:`dedupnet.scrapy.leases`, sans-I/O), the records of callbacks
(:mod:`dedupnet.scrapy.records`), the dupefilter (:mod:`dedupnet.scrapy.dupefilter`),
the reading of the settings (:mod:`dedupnet.scrapy.settings`), the robots.txt gate
(:mod:`dedupnet.scrapy.robots`) and the census (:mod:`dedupnet.scrapy.census`). The
names users give Scrapy (``dedupnet.scrapy.Scheduler``, ``dedupnet.scrapy.DupeFilter``)
are all here.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time

from redis.exceptions import RedisError
from scrapy import Request, signals
from scrapy.exceptions import DontCloseSpider
from twisted.internet import reactor, task

from dedupnet.adapters.storage.recrawl import AgedSet
from dedupnet.adapters.storage.store import FINISH_URL, TASK_POOL, URL_POOL, Batch, Store
from dedupnet.adapters.storage.resp import fingerprint_fields
from dedupnet.codec.errors import BadURL, DedupnetError
from dedupnet.codec.urls import fingerprint_many, normalize
from dedupnet.scrapy.census import NOT_STARTED, CrawlCensus
from dedupnet.scrapy.dupefilter import DupeFilter
from dedupnet.scrapy.leases import ROBOTS_META, TASK_META, Lease, TaskBook, forget_task, normal_url
from dedupnet.scrapy.records import REQUESTS, record_of, records_of, task_request
from dedupnet.scrapy.robots import ALLOWED, DISALLOWED, FETCH, RobotsGate
from dedupnet.scrapy.settings import Addon, safe_url, scheduler_args
from local_host.crawler.fetch import RobotsUnavailable, origin_of
from local_host.pools import published_recrawl
from local_host.frontier.sites import BELL, Pace
from local_host.frontier.tasks import GROUP, finish_tasks, take_tasks

__all__ = ["Addon", "Scheduler", "DupeFilter", "TaskBook", "Lease", "GROUP", "TASK_META", "REQUESTS"]

log = logging.getLogger("dedupnet.scrapy")

#: Seconds before a robots.txt that could not be fetched is asked for again.
ROBOTS_RETRY_DELAY = 5.0
#: Longest a watch for new tasks blocks in Redis (also how long closing may wait for it).
WATCH_BLOCK = 1.0
#: Seconds between two looks, while idle, for entries delivered to this consumer that
#: it never received (as the crawler's PENDING_RESCAN).
PENDING_RESCAN = 5.0


# -- the scheduler ----------------------------------------------------------------------------
class Scheduler:
    """Scrapy scheduler on a dedupnet host's ``URL_pool`` / ``task_pool`` (module doc)."""

    def __init__(self, crawler, store: Store, dupefilter, *, consumer: str, take_batch: int,
                 max_leased: int, flush_interval: float, push_batch: int, max_idle: float,
                 pace: Pace = Pace(), seed_start_requests: bool, keep_callbacks: bool,
                 robots: RobotsGate | None = None,
                 census: CrawlCensus | None = None):
        self.crawler = crawler
        self.stats = crawler.stats
        self.store = store
        self.df = dupefilter
        self.consumer = consumer
        self.take_batch = take_batch
        self.max_leased = max_leased
        #: How the host's frontier spaces one site's tasks for this spider.
        self.pace = pace
        self.flush_interval = flush_interval
        self.push_batch = push_batch
        self.max_idle = max_idle
        self.seed_start_requests = seed_start_requests
        self.keep_callbacks = keep_callbacks
        #: With ROBOTSTXT_OBEY: the scheduler's own robots.txt check of each task.
        self.robots = robots
        #: With DEDUPNET_CENTER: asks whether the whole crawl is complete.
        self.census = census
        #: An ask is under way (in its thread).
        self._asking = False
        #: The last ask had an answer: idle time alone does not close the spider.
        self._verdict_known = False
        #: When the ask that found the crawl complete started (it counts only if
        #: nothing happened here since).
        self._complete_at: float | None = None
        #: finish_URL under the host's re-crawl policy (read when the spider opens); None: the plain set.
        self.finished: AgedSet | None = None
        self.spider = None
        self.book = TaskBook()
        #: Requests fetched here: retries of tasks, tasks read ahead, bypassing requests.
        self._queue: list[tuple[int, int, Request]] = []
        self._order = itertools.count()
        #: Discovered URLs (normalised) and their side records, not yet in URL_pool.
        self._links: list[str] = []
        self._records: dict[bytes, bytes] = {}
        #: Finished leases not yet written.
        self._done: list[Lease] = []
        self._cursor: bytes | None = b"0"  # our own pending entries first (a restart)
        self._rescan_at = time.monotonic() + PENDING_RESCAN
        self._active_at = time.monotonic()
        self._loop: task.LoopingCall | None = None
        self._write_failing = False
        self._watching = False
        self._watcher: threading.Thread | None = None

    @classmethod
    def from_crawler(cls, crawler):
        store, dupefilter, options = scheduler_args(crawler)
        return cls(crawler, store, dupefilter, **options)

    # -- Scrapy's scheduler interface --------------------------------------------------------
    def open(self, spider):
        self.spider = spider
        self.store.ensure_group(TASK_POOL, GROUP)
        # Finished tasks are written as the host's own crawler writes them: under its
        # re-crawl policy, into the aged finish_URL and out of task_pool:fp.
        policy = published_recrawl(self.store)
        self.finished = AgedSet(self.store, FINISH_URL, policy) if policy is not None else None
        if policy is not None:
            log.info("dedupnet: the host re-crawls: a URL counts as crawled for %s", policy.describe())
        if hasattr(self.df, "open"):
            self.df.open()
        self.crawler.signals.connect(self._spider_idle, signal=signals.spider_idle)
        self._loop = task.LoopingCall(self._tick)
        self._loop.start(self.flush_interval, now=False)
        self._watching = True
        self._watcher = threading.Thread(target=self._watch_tasks, name="dedupnet-task-watch", daemon=True)
        self._watcher.start()
        log.info("dedupnet: spider %s is the crawler of %s (consumer %r of group %r on %s)",
                 spider.name, self.store.prefix, self.consumer, GROUP, safe_url(self.store.url))
        return None

    def close(self, reason: str):
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        # The watch may be blocked in Redis for up to WATCH_BLOCK: not waited for (closing
        # would take that long); what it hands the reactor from now on is ignored.
        self._watching = False
        self._release()
        try:
            self._flush()
        except (RedisError, DedupnetError, OSError) as e:
            log.error("dedupnet: could not write %d links and %d finished tasks at close: %s "
                      "(the tasks stay pending and are fetched again)", len(self._links), len(self._done), e)
        if self.book.leases:
            log.info("dedupnet: %d tasks not finished stay pending in task_pool for the next start",
                     len(self.book.leases))
        bypassed = sum(1 for _, _, r in self._queue if TASK_META not in r.meta)
        if bypassed:
            log.warning("dedupnet: %d requests outside dedupnet (dont_filter / non-GET) were never fetched", bypassed)
        if hasattr(self.df, "close"):
            self.df.close(reason)
        self.store.close()
        return None

    def has_pending_requests(self) -> bool:
        return bool(self._queue)

    def __len__(self) -> int:
        return len(self._queue) + (len(self.robots) if self.robots is not None else 0)

    def enqueue_request(self, request: Request) -> bool:
        self._active_at = time.monotonic()
        url = normal_url(request.url) if request.method in ("GET", "HEAD") else None
        if TASK_META in request.meta:
            kind = self.book.child(request, url)
            if kind == "retry":
                self._push_local(request)
                self.stats.inc_value("dedupnet/retries")
                return True
            if kind == "redirect":
                # The task's URL answered with a redirect: done with it; the target is
                # a discovered URL (the lease ends when the engine lets the redirecting
                # request go, right after this call).
                forget_task(request)
                self.stats.inc_value("dedupnet/redirects")
                return self._discovered(request, url, redirect=True)
            forget_task(request)  # copied meta: not ours
        if request.method != "GET" or request.body:
            return self._bypass(request, "not_get")
        if request.dont_filter and not (self.seed_start_requests and request.meta.get("is_start_request")):
            return self._bypass(request, "dont_filter")
        if url is None:
            return self._bad(request)
        return self._discovered(request, url)

    def next_request(self) -> Request | None:
        self._release()
        if not self._queue and self._room():
            self._take()
        while self._queue:
            _, _, request = heapq.heappop(self._queue)
            if self.robots is None or TASK_META not in request.meta or self._robots_allow(request):
                self.book.handed(request)
                self.stats.inc_value("scheduler/dequeued/dedupnet")
                return request
        return None

    # -- robots.txt (dedupnet/scrapy/robots.py) -------------------------------------------------
    def _robots_allow(self, request: Request) -> bool:
        """Whether a task request may go to the engine now; if not it is finished
        without a fetch (forbidden) or waits for its site's robots.txt."""
        verdict = self.robots.check(request.url, request)
        if verdict == ALLOWED:
            request.meta[ROBOTS_META] = True
            request.meta["dont_obey_robotstxt"] = True  # checked here: Scrapy's middleware is not asked
            return True
        if verdict == DISALLOWED:
            self.stats.inc_value("dedupnet/robots_forbidden")
            log.debug("dedupnet: forbidden by robots.txt, finished without a fetch: %s", request.url)
            self.book.not_fetched(request)
        elif verdict == FETCH:
            self._fetch_robots(origin_of(request.url))
        return False

    def _fetch_robots(self, origin: str) -> None:
        """robots.txt of ``origin`` through Scrapy's engine (its downloader middlewares,
        retries included); the tasks waiting for it are checked again when it comes."""
        engine = self.crawler.engine
        req = Request(origin + "/robots.txt", priority=1000, dont_filter=True,
                      meta={"dont_obey_robotstxt": True})
        if hasattr(engine, "download_async"):  # Scrapy 2.14+
            from scrapy.utils.defer import deferred_from_coro

            d = deferred_from_coro(engine.download_async(req))
        else:  # pragma: no cover - older Scrapy
            d = engine.download(req)
        self.stats.inc_value("dedupnet/robots_requests")
        d.addCallbacks(lambda resp: self._robots_answered(origin, resp.status, resp.body),
                       lambda failure: self._robots_failed(origin, failure.getErrorMessage()))

    def _robots_answered(self, origin: str, status: int, body: bytes) -> None:
        try:
            ready = self.robots.answered(origin, status, body)
        except RobotsUnavailable as e:
            return self._robots_failed(origin, str(e))
        for request in ready:
            self._push_local(request)
        self._wake_engine()

    def _robots_failed(self, origin: str, why: str) -> None:
        given_up = self.robots.failed(origin)
        if given_up is None:
            log.warning("dedupnet: robots.txt of %s unavailable (%s): asked again in %g s", origin, why,
                        ROBOTS_RETRY_DELAY)
            reactor.callLater(ROBOTS_RETRY_DELAY, self._fetch_robots, origin)
            return
        log.error("dedupnet: robots.txt of %s unavailable (%s): %d tasks finished without a fetch", origin, why,
                  len(given_up))
        self.stats.inc_value("dedupnet/robots_unavailable", len(given_up))
        for request in given_up:
            self.book.not_fetched(request)
        self._release()

    # -- discovered URLs ---------------------------------------------------------------------
    def _discovered(self, request: Request, url: str, *, redirect: bool = False) -> bool:
        if self.df.request_seen(request):
            self.df.log(request, self.spider)
            self.stats.inc_value("dedupnet/filtered_local")
            return False
        self._links.append(url)
        if self.keep_callbacks:
            record = record_of(request, self.spider, self.stats)
            if record is not None:
                self._records[fingerprint_fields(fingerprint_many([url]))[0]] = record
        self.stats.inc_value("dedupnet/pushed")
        if len(self._links) >= self.push_batch:
            self._try_flush()
        return True

    def _bypass(self, request: Request, why: str) -> bool:
        self.stats.inc_value(f"dedupnet/bypassed/{why}")
        self._push_local(request)
        return True

    def _bad(self, request: Request) -> bool:
        try:
            normalize(request.url)
            reason = "unparsable"
        except BadURL as e:
            reason = e.reason
        self.stats.inc_value(f"dedupnet/bad_input/{reason}")
        log.warning("dedupnet: dropped a request with a bad URL (%s): %r", reason, request.url[:200])
        return False

    def _push_local(self, request: Request) -> None:
        heapq.heappush(self._queue, (-request.priority, next(self._order), request))

    # -- tasks ---------------------------------------------------------------------------------
    def _room(self) -> int:
        """Tasks that may be taken now. A finished task counts against ``max_leased``
        until it is written: a spider killed before that fetches it again, so what a
        crash costs stays within the bound. At the bound, what is finished is written
        first."""
        if len(self.book) + len(self._done) >= self.max_leased and self._done:
            self._try_flush()
        return max(self.max_leased - len(self.book) - len(self._done), 0)

    def _take(self) -> int:
        """Read tasks from task_pool into the local queue: first this consumer's pending
        entries not leased here (after a restart; and every ``PENDING_RESCAN`` s, for a
        reply lost with a connection), page by page, then new entries."""
        count = min(self.take_batch, self._room())
        if count <= 0:
            return 0
        if self._cursor is None and time.monotonic() >= self._rescan_at:
            self._cursor = b"0"
        # Finished but not acknowledged yet: still pending, and not to be fetched again.
        unwritten = {lease.eid for lease in self._done}
        fresh: list[Lease] = []
        resumed = 0
        try:
            while not fresh:
                start = self._cursor if self._cursor is not None else b">"
                entries, last = self._read(count, start)
                if start != b">":
                    if entries:
                        self._cursor = last  # page on through our pending entries
                    else:  # none (left): new entries now
                        self._cursor, self._rescan_at = None, time.monotonic() + PENDING_RESCAN
                        continue
                for eid, url in entries:
                    lease = None if eid in unwritten else self.book.taken(eid, url)
                    if lease is not None:
                        fresh.append(lease)
                        resumed += start != b">"
                if start == b">":
                    break
        except (RedisError, DedupnetError, OSError) as e:
            log.warning("dedupnet: reading task_pool failed: %s (tried again later)", e)
        if resumed:
            log.info("dedupnet: %d tasks delivered to %s before and not finished are fetched again",
                     resumed, self.consumer)
            self.stats.inc_value("dedupnet/tasks_resumed", resumed)
        if not fresh:
            return 0
        records = records_of(self.store, [lease.url for lease in fresh], self.stats) if self.keep_callbacks else {}
        for lease in fresh:
            self._push_local(task_request(lease, records.get(lease.url), self.spider))
        self.stats.inc_value("dedupnet/tasks_taken", len(fresh))
        self._active_at = time.monotonic()
        return len(fresh)

    def _read(self, count: int, start: bytes) -> tuple[list[tuple[bytes, str]], bytes | None]:
        entries, last = take_tasks(self.store, self.consumer, count, start, self.pace)
        good, bad = [], []
        for eid, value in entries:
            url = normal_url(value)
            if url is None:
                bad.append(eid)
                self.stats.inc_value("dedupnet/bad_input/task")
                log.warning("dedupnet: task %s has a bad URL %r: dropped", eid, value[:200])
            else:
                good.append((eid, url))
        if bad:
            self.store.stream_done(TASK_POOL, GROUP, bad)
        return good, last

    # -- finishing -------------------------------------------------------------------------------
    def _engine_slot(self):
        """The engine's slot, whose ``inprogress`` set holds each request from the moment
        ``next_request`` hands it out until Scrapy is done with it (``_slot`` since
        Scrapy 2.13, ``slot`` before); None while there is no engine."""
        try:
            engine = self.crawler.engine
        except (AttributeError, RuntimeError):  # Scrapy 2.19: RuntimeError before the crawl starts
            return None
        return getattr(engine, "_slot", None) or getattr(engine, "slot", None)

    def _engine_in_progress(self):
        slot = self._engine_slot()
        return None if slot is None else slot.inprogress

    def _release(self) -> None:
        """Tasks the engine is done with are finished; written at once when it holds no
        other task (nothing to batch them with: the links are what the crawl waits for),
        else at the next tick."""
        in_progress = self._engine_in_progress()
        if in_progress is None:
            return
        if self.book.released(in_progress):
            self._active_at = time.monotonic()
        finished = self.book.finished()
        self._done += finished
        if finished and not self.book.out:
            self._try_flush()

    def _tick(self) -> None:
        """Every ``flush_interval``: finished tasks and links out; if idle, tasks in (and
        the engine told, so it does not wait for its 5 s heartbeat)."""
        try:
            self._release()
            self._try_flush()
            if not self._queue and self._room() and self._take():
                self._wake_engine()
            self._ask_census()
        except Exception:  # never let the LoopingCall die
            log.exception("dedupnet: scheduler tick failed")

    def _watch_tasks(self) -> None:
        """In a thread of its own: wait in Redis for entries added to task_pool (``XREAD
        BLOCK``, which reads without taking) and have the reactor take them at once, so
        a task does not wait for the next tick. The tick still looks, should this fail."""
        keys = (self.store.key(TASK_POOL), self.store.key(BELL))  # the stream, and the bell of queued tasks
        last: dict = dict.fromkeys(keys, "$")
        while self._watching:
            try:
                reply = self.store.redis.xread(last, count=1, block=int(WATCH_BLOCK * 1000))
            except (RedisError, OSError) as e:
                log.debug("dedupnet: watching task_pool: %s", e)
                time.sleep(WATCH_BLOCK)
                last = dict.fromkeys(keys, "$")
                continue
            if reply and self._watching:
                for key, entries in reply:
                    last[key.decode() if isinstance(key, bytes) else key] = entries[-1][0]
                reactor.callFromThread(self._new_tasks)

    def _new_tasks(self) -> None:
        if not self._watching:
            return  # closed (or closing): no new lease
        try:
            self._release()
            if not self._queue and self._room() and self._take():
                self._wake_engine()
        except Exception:
            log.exception("dedupnet: taking new tasks failed")

    def _wake_engine(self) -> None:
        """Requests are ready here: the engine asks for them now, not at its 5 s heartbeat."""
        slot = self._engine_slot()
        if slot is not None:
            slot.nextcall.schedule()

    def _try_flush(self) -> None:
        try:
            self._flush()
            if self._write_failing:
                log.info("dedupnet: writing to Redis works again")
            self._write_failing = False
        except (RedisError, DedupnetError, OSError) as e:
            if not self._write_failing:
                log.error("dedupnet: writing %d links and %d finished tasks failed: %s (kept, tried again)",
                          len(self._links), len(self._done), e)
            self._write_failing = True

    def _flush(self) -> None:
        """One MULTI/EXEC: links into URL_pool (with their side records), finished tasks
        into finish_URL and out of task_pool. Buffers are emptied only once it is written."""
        if not self._links and not self._done:
            return
        links, records, done = self._links, self._records, self._done
        key = self.store.key

        def fill(batch: Batch) -> None:
            url_pool = key(URL_POOL)
            for url in links:
                batch.add(b"XADD", url_pool, b"*", b"u", url)
            if records:
                batch.add(b"HSET", key(REQUESTS), *[x for kv in records.items() for x in kv])
            if done:
                finish_tasks(batch, self.store, [lease.eid for lease in done], [lease.url for lease in done],
                             [u for lease in done for u in lease.chain], self.finished)
                if self.keep_callbacks:
                    batch.add(b"HDEL", key(REQUESTS), *fingerprint_fields(fingerprint_many([d.url for d in done])))

        self.store.transact(fill)
        self._links, self._records, self._done = [], {}, []
        if done:
            self.stats.inc_value("dedupnet/tasks_done", len(done))

    # -- closing ---------------------------------------------------------------------------------
    def _idle_here(self) -> bool:
        """Nothing queued, leased, waiting for robots.txt or unwritten in this spider."""
        return not (self._queue or self.book.leases or self._links or self._done
                    or (self.robots is not None and len(self.robots)))

    def _ask_census(self) -> None:
        """While idle here, one ask at a time, in a thread: it blocks for a while."""
        if self.census is None or self._asking or not self._idle_here():
            return
        self._asking = True
        started = time.monotonic()

        def run() -> None:
            try:
                verdict = self.census.verdict()
            except Exception:
                log.exception("dedupnet: asking whether the crawl is complete failed")
                verdict = None
            reactor.callFromThread(self._census_answered, verdict, started)

        threading.Thread(target=run, name="dedupnet-census", daemon=True).start()

    def _census_answered(self, verdict: str | None, started: float) -> None:
        self._asking = False
        # A crawl that admitted nothing yet (or whose centers restarted) says nothing
        # about idle time: DEDUPNET_MAX_IDLE still applies to it.
        self._verdict_known = verdict not in (None, NOT_STARTED)
        if verdict == "complete" and self._active_at <= started and self._idle_here():
            self._complete_at = started
            self._wake_engine()  # the engine finds itself idle and asks _spider_idle

    def _spider_idle(self, spider) -> None:
        """Stay open for tasks the protocol may still send, unless the crawl is complete
        cluster-wide, or (with no verdict to be had) idle ``max_idle`` s."""
        self._release()
        self._try_flush()
        busy = self.book.leases or self._links or self._done
        if not busy and self._complete_at is not None and self._complete_at >= self._active_at:
            log.info("dedupnet: the crawl is complete in every network (the center at %s says): closing",
                     self.census.where)
            return
        if busy or self._verdict_known or not self.max_idle or time.monotonic() - self._active_at < self.max_idle:
            raise DontCloseSpider
        log.info("dedupnet: nothing to do for %.0f s (DEDUPNET_MAX_IDLE): closing", self.max_idle)


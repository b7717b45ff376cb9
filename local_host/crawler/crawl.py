"""The crawler of a local host: takes tasks from ``task_pool``, fetches them
politely with trio + httpx, and hands what it found to the protocol through ``URL_pool``.

Flow of one task::

    task_pool  --XREADGROUP (group "crawl", BLOCK <= 1 s)-->  lease (pending entry)
       robots.txt (protego, cached per origin) -> politeness slot -> GET (redirects by hand)
       -> links (selectolax) -> scope, depth, URLGate
    one MULTI/EXEC:  SADD finish_URL (page + redirect chain) ; XADD URL_pool (links)
                     ; depth records ; failed record ; XACK + XDEL the task entry

The transaction is shared by the pages that finished while the previous one was being
written (group commit, :meth:`Crawler._commit_loop`): one round trip and one worker
thread hop for many pages, each page still all or nothing.

Crash safety: the lease is the task entry's pending state in the ``crawl`` group. Until
the transaction above runs, nothing of the page is written; after it, everything is.
A crawler killed at any point therefore loses no task, and re-fetches only the pages
that were in progress: on start it re-takes its own pending entries first (the same
``consumer`` name must be used across restarts — the daemon uses the host's IP).

Depth (for ``max_depth``) is kept per URL fingerprint beside the tasks, and written in
the same transaction as the links (:mod:`local_host.crawler.records`).

Re-crawl (``recrawl_interval``): seeds given to :meth:`Crawler.seed` / :func:`seed_urls`
are remembered in the set ``<prefix>:seeds``. Every interval the seeds are put straight
into this host's ``task_pool`` again (depth 0), bypassing de-dup — as the re-import
of seed tasks in related system C. Going through the protocol cannot work: the seeds
are in this host's ``finish_URL`` and, in exact mode, in the center's admitted
record, so de-dup would (rightly) drop them. Their links go through the protocol as
usual, so only new pages are crawled. ``<prefix>:recrawl_lock`` (SET NX PX interval)
makes one crawler of a host re-queue per interval, also across restarts.

With a re-crawl policy (``CrawlerSettings.recrawl``, ``recrawl_after``: dedupnet/adapters/storage/recrawl.py)
URLs are crawled again once older than their age, and the seeds go through the protocol
instead: every interval they are put into ``URL_pool`` like any discovered URL, so a seed
too is admitted again only when its age has passed, and at most once in the whole
system; their links re-offer the pages behind them, which come back the same way
(docs/DECISIONS.md, "Re-crawl by age"). ``finish_URL`` is then written into its current
time slice, and the transaction that finishes a task also removes its URL from
``task_pool:fp`` (queued, not yet crawled).

HTTP (:mod:`local_host.crawler.fetch`): a few ``httpx.AsyncClient`` objects per site
(:class:`~local_host.crawler.fetch.ClientPool`) over the crawler's own HTTP/1.1 transport
(:mod:`local_host.crawler.transport`: httptools, in C). Small unwanted bodies (404, redirect) are read to
the end so their connection is kept alive. ``bench/bench_crawler.py`` measures pages/s
and CPU per page. What the crawler writes besides the task stream (failure records,
depths, seeds) is :mod:`local_host.crawler.records`.
"""

from __future__ import annotations

import base64
import functools
import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson
import trio

from dedupnet.adapters.storage.store_choice import on_trio
from dedupnet.codec.errors import BadURL
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.storage.recrawl import AgedSet
from dedupnet.adapters.runtime import Changes, until_room, until_stored
from dedupnet.adapters.storage.store import FINISH_URL, TASK_POOL, Batch, Steps, Store
from dedupnet.codec.urls import URLGate, normalize, site_of

from .settings import CrawlerSettings
from .records import (DEPTH, FAILED, SEEDS, Failure, Outcome, depth_of, fill_done, internal_failure,
                      requeue_seeds, add_seeds, seed_urls)
from .fetch import (CLIENT_IDLE, CONNECTIONS_PER_CLIENT, ClientPool, FetchError, Politeness, Response, RobotsCheck,
                    RobotsUnavailable, client_factory, fetch_robots, get_page, retry_after)
from .links import decode_html, extract_links, in_scope
from ..frontier import sites
from ..frontier.sites import Pace
from ..frontier.tasks import GROUP, take_tasks

__all__ = ["Crawler", "CrawlerSettings", "Outcome", "Failure", "seed_urls", "GROUP", "FAILED", "DEPTH", "SEEDS"]

log = logging.getLogger("dedupnet.crawler")

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
PARSE_IN_THREAD = 256 * 1024
#: Seconds between two looks, while idle, for task entries delivered to this crawler
#: that it never received (see ``Crawler._take``).
PENDING_RESCAN = 5.0
#: Most done tasks written in one transaction (see ``Crawler._commit_loop``).
COMMIT_GROUP = 256

@dataclass
class _Task:
    """One task on its way through robots.txt, retries and the fetch."""

    url: str
    depth: int
    eid: bytes
    attempts: int = 0
    retries: int = 0

    @property
    def chain(self) -> list[str]:
        return [self.url]  # a redirect is not followed here: its target goes through de-dup

    def outcome(self, **what) -> Outcome:
        return Outcome(self.url, self.chain, self.depth, attempts=self.attempts, **what)

    def failed(self, reason: str, status: int | None = None) -> Outcome:
        return self.outcome(failure=Failure(reason, status), kind="failed")


def _file_name_part(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "crawler"


class Crawler:
    """Fetches the tasks of one host's ``task_pool`` until cancelled."""

    def __init__(self, store: Store, settings: CrawlerSettings, counters: Counters, *, consumer: str):
        self.store = store
        self.settings = settings
        self.counters = counters
        self.consumer = consumer
        s = settings
        self._reader = on_trio(store, max_threads=1)  # takes, and waits in Redis for new tasks
        self._writer = on_trio(store, max_threads=8)
        self.politeness = Politeness(s.concurrency, s.per_site_concurrency, s.per_site_delay)
        self.robots = RobotsCheck(self._fetch_robots, agent=s.robots_agent, on_rules=self._robots_rules)
        self.allowed = frozenset(d.lower().strip(".") for d in s.allowed_domains)
        self.depth_key = s.depth_key or store.key(DEPTH)
        self._finished = AgedSet(store, FINISH_URL, s.recrawl) if s.recrawl is not None else None
        self._clients: ClientPool | None = None
        self._leases = trio.Semaphore(max(1, s.max_leased or 2 * s.concurrency))
        # One site gives a take at most its own bound (or one client's connections): the
        # next take goes on to other sites, each request warm on its site's connection.
        self._pace = Pace(s.per_site_delay, s.per_site_concurrency or CONNECTIONS_PER_CLIENT)
        #: Crawl-delays learned from robots.txt, for the frontier at the next take.
        self._site_delays: dict[str, float] = {}
        self._drained = False
        self._taken: set[bytes] = set()  # task entry ids in progress here
        #: While this consumer's pending entries are read: the ids of tasks finished
        #: meanwhile (that read may still list them: see :meth:`_take`).
        self._finished_during_read: set[bytes] | None = None
        #: Cancelled by :meth:`stop_taking`: no new task is taken.
        self._take_scope = trio.CancelScope()
        #: Each task in progress: its cancel scope (:meth:`stop_taking` cancels those whose
        #: request has not gone out) ...
        self._tasks: dict[bytes, trio.CancelScope] = {}
        #: ... and those whose request is on the wire or whose page is being recorded.
        self._on_wire: set[bytes] = set()
        self.stopping = False
        self._page_file = None
        self._page_limiter = trio.CapacityLimiter(1)
        #: Done tasks waiting to be written: (entry id, outcome, written event, error box).
        self._done_queue: list[tuple[bytes, Outcome, trio.Event, list]] = []
        self._done_ready = trio.Event()
        #: Set while Redis answers; cleared when a call to it failed (the store counts
        #: every failed attempt in ``reconnects``): no fetch starts meanwhile
        #: (:meth:`_until_store_answers`).
        self.store_up = trio.Event()
        self.store_up.set()
        self._reconnects = getattr(store, "reconnects", 0)
        self._probing = trio.Lock()
        #: Called after each write that pushed links into URL_pool (the host's walker
        #: wakes on it instead of polling).
        self.on_commit: Callable[[], None] | None = None
        #: Called after each write of done tasks (the host's report loop wakes on it: a
        #: finished task is a report to make).
        self.on_done: Callable[[], None] | None = None
        #: Tasks taken and not yet done (fetching, waiting for a slot or a retry).
        self.in_progress = 0
        #: Notified each time a task is done: :attr:`in_progress` went down.
        self.changes = Changes()
        #: Tasks done by this crawler (fetched, failed or skipped).
        self.pages_done = 0

    @property
    def idle(self) -> bool:
        """Nothing in progress, and the last take left nothing queued in task_pool.

        Cheap and local; it can lag behind a task that has just arrived by up to one
        read. For quiescence, ``XLEN task_pool == 0`` is exact: an entry leaves the
        stream only in the transaction that pushes the page's links."""
        return self._drained and self.in_progress == 0

    # -- seeds ---------------------------------------------------------------------------
    async def seed(self, urls: Iterable[str]) -> int:
        """Async :func:`seed_urls` on this crawler's store."""
        return await until_stored(self._writer, self.counters, add_seeds, self.store, list(urls))

    # -- running ---------------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        s = self.settings
        await until_stored(self._writer, self.counters, self.store.ensure_group, TASK_POOL, GROUP)
        per_client = min(s.per_site_concurrency or s.concurrency, s.concurrency, CONNECTIONS_PER_CLIENT)
        make = client_factory(per_client, user_agent=s.user_agent, timeout=s.timeout,
                              local_address=s.local_address, trust_env=s.trust_env)
        clients = self._clients = ClientPool(make, per_client=per_client, max_clients=s.max_clients)
        try:
            if s.store_dir:
                Path(s.store_dir).mkdir(parents=True, exist_ok=True)
                path = Path(s.store_dir) / f"pages-{_file_name_part(self.consumer)}.jsonl"
                self._page_file = open(path, "ab")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._commit_loop)
                nursery.start_soon(self._take_loop, nursery)
                nursery.start_soon(self._progress_loop)
                if s.recrawl_interval:
                    nursery.start_soon(self._recrawl_loop)
                log.info("crawler %s: concurrency %d, %d per site, %.2fs per-site delay, robots %s",
                         self.consumer, s.concurrency, s.per_site_concurrency, s.per_site_delay,
                         "on" if s.respect_robots else "off")
                task_status.started()
        finally:
            await clients.aclose()
            if self._page_file is not None:
                self._page_file.close()
                self._page_file = None

    # -- taking tasks ----------------------------------------------------------------------
    def _read(self, count: int, start: bytes) -> tuple[list[tuple[bytes, str]], bytes | None]:
        """This consumer's pending entries from ``start`` (in a worker thread), and the
        last id read (to page on through them)."""
        return take_tasks(self.store, self.consumer, count, start)

    def _take_ready(self, count: int) -> Steps[sites.Taken]:
        """Tasks of sites whose politeness allows one now (on trio: no thread hop), with
        the Crawl-delays learned since the last take."""
        delays, self._site_delays = self._site_delays, {}
        try:
            return (yield from sites.take_steps(self.store, self.consumer, count, self._pace, delays=delays))
        except BaseException:
            self._site_delays = {**delays, **self._site_delays}
            raise

    async def _wait_for_work(self, taken: sites.Taken, until: float) -> None:
        """Nothing (more) could be taken: wait in Redis for a new task, at most until the next
        site's politeness allows one (or ``block_timeout``). With no site queued, a wait
        that ends with nothing new is begun again until ``until`` (trio's clock: the next
        look for pending entries): a take then would find nothing either, and an idle
        crawler's take each ``block_timeout`` was most of an idle host's Redis commands.
        Each wait stays ``block_timeout`` long at most (it holds a Redis connection)."""
        while True:
            wait = self.settings.block_timeout
            if taken.next_ready is not None:
                wait = min(wait, taken.next_ready - time.time())
            if wait < 0.002:
                return
            new = await until_stored(self._reader, self.counters, sites.wait_for_new_steps, self.store, taken,
                                     int(wait * 1000))
            if new or taken.next_ready is not None or trio.current_time() >= until:
                return

    def stop_taking(self) -> None:
        """Take no new task, and give up at once every task whose request has not gone
        out yet (waiting for a politeness slot, robots.txt or a retry): it stays in
        task_pool, pending, to be handed back. Pages on the wire go on to be recorded
        (a host stopping; the caller bounds how long they get)."""
        self.stopping = True
        self._take_scope.cancel()
        for eid, scope in self._tasks.items():
            if eid not in self._on_wire:
                scope.cancel()

    @property
    def on_the_wire(self) -> int:
        """Pages whose request has gone out and whose result is not recorded yet."""
        return len(self._on_wire)

    async def _take_loop(self, nursery: trio.Nursery) -> None:
        with self._take_scope:
            await self._take(nursery)

    async def _take(self, nursery: trio.Nursery) -> None:
        s = self.settings
        cursor: bytes | None = b"0"  # first this consumer's pending entries (a restart)
        resumed = 0
        rescan_at = trio.current_time() + PENDING_RESCAN
        while True:
            await until_room(self._reader, self.counters)  # a full Redis could not record the pages
            await self._leases.acquire()
            n = 1
            while n < s.take_batch:
                try:
                    self._leases.acquire_nowait()
                except trio.WouldBlock:
                    break
                n += 1
            if cursor is not None:
                # Pending here but not in progress: never seen (a reply lost). A task in
                # progress when the read went out may be finished (acknowledged, out of
                # _taken) before its reply is back, and is not taken up again.
                self._finished_during_read = set()
                try:
                    entries, cursor = await until_stored(self._reader, self.counters, self._read, n, cursor)
                    entries = [(eid, url) for eid, url in entries
                               if eid not in self._taken and eid not in self._finished_during_read]
                finally:
                    self._finished_during_read = None
                resumed += len(entries)
                if cursor is None and resumed:
                    log.info("crawler %s: %d tasks delivered to it but not in progress (a restart, or a "
                             "reply lost with a Redis connection) are fetched again", self.consumer, resumed)
                    self.counters.inc("tasks_resumed", resumed)
                    resumed = 0
                taken = None
            else:
                taken = await until_stored(self._reader, self.counters, self._take_ready, n)
                entries = taken.entries
                self._drained = taken.next_ready is None  # nothing left queued: the wait below may be long
                if self._drained and trio.current_time() >= rescan_at:
                    # Idle: look for entries delivered to this consumer whose reply never
                    # reached it (Redis went away mid-reply): pending, but not in progress.
                    cursor, rescan_at = b"0", trio.current_time() + PENDING_RESCAN
            for _ in range(n - len(entries)):
                self._leases.release()
            for eid, url in entries:
                self.in_progress += 1
                self._taken.add(eid)
                nursery.start_soon(self._process, eid, url)
            if taken is not None and len(entries) < n and cursor is None:
                # Fewer than asked: no site was ready for more (a polite crawl's every
                # take); taking again before the next one is would find nothing.
                await self._wait_for_work(taken, rescan_at)

    # -- one task --------------------------------------------------------------------------
    async def _process(self, eid: bytes, url: str) -> None:
        try:
            outcome = None
            with trio.CancelScope() as scope:
                self._tasks[eid] = scope
                if self.stopping:
                    scope.cancel()
                try:
                    outcome = await self._crawl(url, eid)
                except Exception:
                    log.exception("crawler %s: unexpected error on %s", self.consumer, url)
                    self.counters.inc("fetch_errors", kind="internal")
                    outcome = internal_failure(url)
            if outcome is None:  # given up before its request went out: it stays in task_pool
                self.counters.inc("tasks_given_up")
                return
            try:
                await self._record(eid, outcome)
            except Exception:
                log.exception("crawler %s: recording %s failed; dropping its results", self.consumer, url)
                self.counters.inc("fetch_errors", kind="internal")
                outcome = internal_failure(url)
                await until_stored(self._writer, self.counters, self.store.transact_steps,
                                   functools.partial(self._fill_done, [(eid, outcome)]))
            self.pages_done += 1
            self.counters.inc("pages_done", outcome=outcome.kind)
            self.counters.inc("links_pushed", len(outcome.links))
            if outcome.failure is not None:
                f = outcome.failure
                if outcome.kind == "skipped" or f.status in (404, 410):  # routine, counted: pages_done, pages_fetched
                    log.debug("%s %s: %s%s", outcome.kind, url, f.reason,
                              f" {f.status}" if f.status is not None else "")
                else:
                    log.warning("failed %s: %s%s after %d attempt(s)", url, f.reason,
                                f" {f.status}" if f.status is not None else "", outcome.attempts)
        finally:
            self.in_progress -= 1
            self.changes.notify()
            self._tasks.pop(eid, None)
            self._on_wire.discard(eid)
            self._taken.discard(eid)
            if self._finished_during_read is not None:
                self._finished_during_read.add(eid)
            self._leases.release()

    # -- recording done tasks ----------------------------------------------------------------
    async def _record(self, eid: bytes, outcome: Outcome) -> None:
        """Write a done task (see :meth:`_commit_loop`); returns once it is in Redis.
        Raises what writing it raised (then nothing of it was written)."""
        done, error = trio.Event(), []
        self._done_queue.append((eid, outcome, done, error))
        self._done_ready.set()
        await done.wait()
        if error:
            raise error[0]

    async def _commit_loop(self) -> None:
        """Group commit: the tasks done since the last write go out together, as one
        MULTI/EXEC on trio. A write per page cost a round trip each (with the worker-thread
        hop of the time, some 10-15 % of the crawler's CPU at 300 pages/s); grouping adds
        no wait: a group is what finished while the previous write was out.

        The invariant is unchanged: a task entry leaves task_pool only in the
        transaction that records its URL in finish_URL and pushes its links (all of
        a group's pages are in it, all or nothing). If a group cannot be written (a
        bug in one page's record), each page is written on its own, so only the bad
        one fails."""
        while True:
            await self._done_ready.wait()
            self._done_ready = trio.Event()
            while self._done_queue:
                group = self._done_queue[:COMMIT_GROUP]
                del self._done_queue[:COMMIT_GROUP]
                items = [(eid, outcome) for eid, outcome, _, _ in group]
                try:
                    await until_stored(self._writer, self.counters, self.store.transact_steps,
                                       functools.partial(self._fill_done, items))
                    errors: list[Exception | None] = [None] * len(group)
                except Exception:
                    errors = []
                    for item in items:
                        try:
                            await until_stored(self._writer, self.counters, self.store.transact_steps,
                                               functools.partial(self._fill_done, [item]))
                            errors.append(None)
                        except Exception as e:
                            errors.append(e)
                for (_, _, done, error), e in zip(group, errors):
                    if e is not None:
                        error.append(e)
                    done.set()
                if self.on_commit is not None and any(o.links for _, o in items):
                    self.on_commit()
                if self.on_done is not None:
                    self.on_done()

    def _fill_done(self, items: list[tuple[bytes, Outcome]], batch: Batch) -> None:
        fill_done(batch, self.store, items, max_depth=self.settings.max_depth, depth_key=self.depth_key,
                  finished=self._finished)

    def _backoff(self, retry: int, retry_after: float | None) -> float:
        backoff = self.settings.retry_backoff
        delay = backoff.delay(retry)
        if retry_after is not None:
            delay = max(delay, min(retry_after, backoff.cap))
        return delay

    async def _until_store_answers(self) -> None:
        """Start no fetch while Redis does not answer: a page's result exists only in
        memory until its transaction is written, so pages fetched meanwhile would be
        fetched again if the daemon stopped before Redis came back. The tasks taken
        wait instead (their leases are in Redis); a crash re-fetches at most the pages
        that were in flight when the crawler saw a call to Redis fail (the crawl
        concurrency; twice that at worst, when the slots of the pages in flight are
        taken by the next ones before those pages' write has failed). One waiting task
        asks Redis until it answers. A Redis that is full holds them the same way
        (:func:`~dedupnet.adapters.runtime.until_room`): their pages could not be recorded."""
        await until_room(self._writer, self.counters)
        reconnects = getattr(self.store, "reconnects", 0)
        if reconnects != self._reconnects:  # a call failed since we last looked: is it back?
            self._reconnects = reconnects
            if self.store_up.is_set():
                self.store_up = trio.Event()
        while not self.store_up.is_set():
            if self._probing.locked():
                await self.store_up.wait()
                continue
            async with self._probing:
                if not self.store_up.is_set():
                    self.counters.inc("fetches_held")
                    log.info("crawler %s: a call to Redis failed; no fetch starts until it answers", self.consumer)
                    await until_stored(self._writer, self.counters, self.store.command, b"PING")
                    self._reconnects = getattr(self.store, "reconnects", 0)
                    self.store_up.set()

    async def _retry_later(self, eid: bytes, delay: float) -> None:
        """Wait before a retry, as a task that may be given up (its request is not out)."""
        self._on_wire.discard(eid)
        if self.stopping and eid in self._tasks:
            self._tasks[eid].cancel()
        await trio.sleep(delay)

    async def _crawl(self, raw_url: str, eid: bytes = b"") -> Outcome:
        try:
            url = normalize(raw_url)
        except BadURL as e:
            self.counters.inc("fetch_errors", kind="bad_url")
            return Outcome(raw_url, [], failure=Failure(f"bad_url:{e.reason}"), kind="failed")
        depth = 0
        if self.settings.max_depth is not None:
            depth = await until_stored(self._writer, self.counters, depth_of, self.store, self.depth_key, url)
        task = _Task(url, depth, eid)
        while (outcome := await self._attempt(task)) is None:
            pass
        return outcome

    async def _attempt(self, task: _Task) -> Outcome | None:
        """One try at a task: robots.txt, then the request. Its outcome, or None to try
        again (the back-off already waited)."""
        s = self.settings
        if s.respect_robots:
            try:
                allowed = await self.robots.allowed(task.url)
            except RobotsUnavailable:
                self.counters.inc("fetch_errors", kind="robots_unavailable")
                return await self._retry(task, "robots_unavailable")
            if not allowed:
                self.counters.inc("robots_skipped")
                return task.outcome(failure=Failure("robots"), kind="skipped")
        task.attempts += 1
        try:
            resp = await self._fetch(task.url, task.eid)
        except FetchError as e:
            self.counters.inc("fetch_errors", kind=e.kind)
            return await self._retry(task, e.kind) if e.transient else task.failed(e.kind)
        status = resp.status
        self.counters.inc("pages_fetched", status=status)
        if status in s.retry_statuses:
            self.counters.inc("fetch_errors", kind="http_5xx" if status >= 500 else "http_retry")
            return await self._retry(task, "http", status, retry_after(resp.headers))
        location = resp.headers.get("location")
        if status in REDIRECT_STATUSES and location:
            return self._redirected(task, status, location)
        if 200 <= status < 300:
            return await self._page(task.url, task.chain, task.depth, task.attempts, resp)
        self.counters.inc("fetch_errors", kind="http_4xx" if 400 <= status < 500 else "http_other")
        return task.failed("http", status)

    async def _retry(self, task: _Task, reason: str, status: int | None = None,
                     after: float | None = None) -> Outcome | None:
        """Wait the back-off and return None (try again), or the failure once the
        retries of this task are spent."""
        if task.retries >= self.settings.max_retries:
            return task.failed(reason, status)
        task.retries += 1
        self.counters.inc("retries")
        delay = self._backoff(task.retries, after)
        # The site's other tasks wait too, for every taker of the host: its server is in trouble.
        await until_stored(self._writer, self.counters, sites.back_off, self.store, site_of(task.url),
                           time.time() + delay)
        await self._retry_later(task.eid, delay)
        return None

    def _redirected(self, task: _Task, status: int, location: str) -> Outcome:
        """The target is a discovered URL like any link: it goes through de-dup
        (URL_pool), so a page reached both by a redirect and by a link is fetched once
        in the whole system. Loops end by themselves: each URL of the loop is fetched once."""
        self.counters.inc("redirects")
        try:
            target = normalize(urllib.parse.urljoin(task.url, location.strip()))
        except (BadURL, ValueError):
            self.counters.inc("fetch_errors", kind="bad_redirect")
            return task.failed("bad_redirect", status)
        if not in_scope(site_of(target), self.allowed):
            self.counters.inc("fetch_errors", kind="redirect_out_of_scope")
            return task.failed("redirect_out_of_scope", status)
        return task.outcome(links=[target] if target != task.url else [])

    async def _page(self, url: str, chain: list[str], depth: int, attempts: int, resp: Response) -> Outcome:
        s = self.settings
        done = Outcome(url, chain, depth, attempts=attempts)
        if resp.too_large:
            self.counters.inc("too_large")
            await self._store_page(chain[-1], resp, None)
            return done
        if not resp.html:
            self.counters.inc("not_html")
            await self._store_page(chain[-1], resp, None)
            return done
        body = resp.body or b""
        if len(body) > PARSE_IN_THREAD:
            html = await trio.to_thread.run_sync(decode_html, body, resp.charset)
        else:
            html = decode_html(body, resp.charset)
        await self._store_page(chain[-1], resp, html)
        if s.max_depth is not None and depth >= s.max_depth:
            return done  # its links would be deeper than max_depth: not even parsed
        if len(body) > PARSE_IN_THREAD:
            found = await trio.to_thread.run_sync(extract_links, html, chain[-1])
        else:
            found = extract_links(html, chain[-1])
        self.counters.inc("links_found", found.found)
        for reason, n in found.dropped.items():
            self.counters.inc("links_dropped", n, reason=reason)
        gate = URLGate()
        links = gate.accept(found.urls)
        for reason, n in gate.rejected.items():
            self.counters.inc("links_dropped", n, reason=reason)
        kept: dict[str, None] = {}
        out_of_scope = own = 0
        for link in links:
            if link in kept:
                continue
            if link in chain:
                own += 1  # a link to the page itself: finished with it
            elif not in_scope(site_of(link), self.allowed):
                out_of_scope += 1
            else:
                kept[link] = None
        if out_of_scope:
            self.counters.inc("links_dropped", out_of_scope, reason="out_of_scope")
        if own:
            self.counters.inc("links_dropped", own, reason="self")
        done.links = list(kept)
        return done

    # -- HTTP ------------------------------------------------------------------------------
    async def _fetch(self, url: str, eid: bytes = b"") -> Response:
        """One GET through the politeness gate, once Redis answers (see
        :meth:`_until_store_answers`); the task counts as on the wire from then on."""
        assert self._clients is not None
        s = self.settings
        site = site_of(url)
        async with self.politeness.slot(site) as sent, self._clients.client(site) as client:
            await self._until_store_answers()  # with the slot: the check is the last thing before the request
            scope = self._tasks.get(eid)
            if scope is not None and scope.cancel_called:
                await trio.lowlevel.checkpoint()  # given up (the crawler stops) before anything went out
            self._on_wire.add(eid)
            return await get_page(client, url, sent, self.counters, timeout=s.page_timeout, max_body=s.max_body,
                                  any_body=bool(s.store_dir))

    async def _fetch_robots(self, origin: str) -> str | None:
        """robots.txt of an origin for :class:`RobotsCheck`, with the pages' gate and clients."""
        assert self._clients is not None
        return await fetch_robots(origin, self.politeness, self._clients, self.counters, self.settings.page_timeout)

    def _robots_rules(self, origin: str, rules) -> None:
        if self.settings.max_crawl_delay <= 0:
            return
        try:
            delay = rules.crawl_delay(self.settings.robots_agent)
        except Exception:  # a malformed Crawl-delay must not cost the page
            delay = None
        if delay:
            site, delay = site_of(origin + "/"), min(float(delay), self.settings.max_crawl_delay)
            self.politeness.set_delay(site, delay)
            self._site_delays[site] = delay

    # -- page store ------------------------------------------------------------------------
    async def _store_page(self, url: str, resp: Response, html: str | None) -> None:
        if self._page_file is None:
            return
        record: dict = {"url": url, "status": resp.status, "headers": dict(resp.headers),
                        "fetched_at": round(time.time(), 3)}
        if html is not None:
            record["text"] = html
        elif resp.body is not None:
            record["body_b64"] = base64.b64encode(resp.body).decode("ascii")
        if resp.too_large:
            record["too_large"] = True
        line = orjson.dumps(record) + b"\n"
        await trio.to_thread.run_sync(self._write_page, line, limiter=self._page_limiter)

    def _write_page(self, line: bytes) -> None:
        if self._page_file is not None:
            self._page_file.write(line)
            self._page_file.flush()

    # -- background ------------------------------------------------------------------------
    def _requeue_seeds(self) -> int:
        return requeue_seeds(self.store, self.consumer, self.settings.recrawl_interval, self.depth_key,
                             by_age=self._finished is not None)

    async def _recrawl_loop(self) -> None:
        interval = self.settings.recrawl_interval
        while True:
            await trio.sleep(interval)
            n = await until_stored(self._writer, self.counters, self._requeue_seeds)
            if n and self._finished is not None and self.on_commit is not None:
                self.on_commit()  # the seeds are in URL_pool: the host's walker takes them now
            if n:
                self.counters.inc("recrawls")
                self.counters.inc("recrawl_urls", n)
                log.info("crawler %s: re-crawl of %d seeds queued", self.consumer, n)

    async def _progress_loop(self) -> None:
        interval = self.settings.progress_interval
        last_done, last_t = 0, trio.current_time()
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            done = self.pages_done
            if done != last_done or self.in_progress:
                rate = (done - last_done) / max(now - last_t, 1e-9)
                log.info("crawler %s: %d pages (%.1f pages/s), %d in progress, %d on the wire, %d failed, %d robots-skipped",
                         self.consumer, done, rate, self.in_progress, self.politeness.active,
                         self.counters.get("pages_done", outcome="failed"), self.counters.get("robots_skipped"))
            last_done, last_t = done, now
            self.politeness.forget_idle()
            if self._clients is not None:
                await self._clients.close_idle(CLIENT_IDLE)

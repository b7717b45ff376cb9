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

Depth (for ``max_depth``): task entries carry only ``u``, so the depth of a URL is kept
in the hash ``<prefix>:depth`` (8-byte URL fingerprint -> depth), written in the same
transaction that pushes links (the minimum of the known and the new depth, by a small
Lua script), and read when the task is fetched. A URL without a record is a seed
(depth 0): seeds are written with 0, and so are URLs pushed by other means
(``dedupnet push``). Nothing is written when ``max_depth`` is None. The hash is per
host: a URL the protocol assigns to another host (site hash) arrives there without
its depth, i.e. as depth 0, unless the hosts share the key (``depth_key``).

Re-crawl (``recrawl_interval``): seeds given to :meth:`Crawler.seed` / :func:`seed_urls`
are remembered in the set ``<prefix>:seeds``. Every interval the seeds are put straight
into this host's ``task_pool`` again (depth 0), bypassing de-dup — as the re-import
of seed tasks in related system C. Going through the protocol cannot work: the seeds
are in this host's ``finish_URL`` and, in exact mode, in the center's admitted
record, so de-dup would (rightly) drop them. Their links go through the protocol as
usual, so only new pages are crawled. ``<prefix>:recrawl_lock`` (SET NX PX interval)
makes one crawler of a host re-queue per interval, also across restarts.

With a re-crawl policy (``CrawlerSettings.recrawl``, ``recrawl_after``: dedupnet/adapters/recrawl.py)
URLs are crawled again once older than their age, and the seeds go through the protocol
instead: every interval they are put into ``URL_pool`` like any discovered URL, so a seed
too is admitted again only when its age has passed, and at most once in the whole
system; their links re-offer the pages behind them, which come back the same way
(docs/DECISIONS.md, "Re-crawl by age"). ``finish_URL`` is then written into its current
time slice, and the transaction that finishes a task also removes its URL from
``task_pool:fp`` (queued, not yet crawled).

HTTP: a few ``httpx.AsyncClient`` objects per site (:class:`~local_host.fetch.ClientPool`),
not one shared client: httpcore's pool work grows with the connections it holds, and
one pool for every site cost most of the crawler's CPU. Small unwanted bodies (404,
redirect) are read to the end so their connection is kept alive. ``bench/bench_crawler.py``
measures pages/s and CPU per page.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import trio

from dedupnet.adapters.stores import on_trio
from dedupnet.codec.errors import BadURL
from dedupnet.adapters.metrics import Counters
from dedupnet.adapters.recrawl import AgedSet
from dedupnet.codec.ages import RecrawlPolicy
from dedupnet.adapters.runtime import until_stored
from dedupnet.adapters.store import FINISH_URL, TASK_POOL, URL_POOL, Batch, Store, fingerprint_fields
from dedupnet.codec.urls import URLGate, fingerprint_many, normalize, site_of

from .fetch import (ROBOTS_MAX, ClientPool, Politeness, RobotsCache, RobotsUnavailable, decode_html, extract_links,
                    in_scope, robots_text)
from .tasks import GROUP, fill_discovered, finish_tasks, take_tasks

__all__ = ["Crawler", "CrawlerSettings", "Outcome", "Failure", "seed_urls", "GROUP", "FAILED", "DEPTH", "SEEDS"]

log = logging.getLogger("dedupnet.crawler")

#: Hash URL -> JSON ``{reason, status, attempts, final_url, time}`` of permanent failures.
FAILED = "failed"
#: Hash 8-byte fingerprint -> depth (only with ``max_depth``).
DEPTH = "depth"
#: Set of seed URLs (for re-crawl).
SEEDS = "seeds"
RECRAWL_LOCK = "recrawl_lock"

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
ACCEPT = "text/html,application/xhtml+xml;q=0.9,*/*;q=0.1"
PARSE_IN_THREAD = 256 * 1024
#: An unwanted body (404, redirect, 503, a PDF) declared at most this long is read and
#: dropped, so the connection goes back to the pool: far cheaper than a new connection.
DRAIN_MAX = 64 * 1024
#: Seconds between two looks, while idle, for task entries delivered to this crawler
#: that it never received (see ``Crawler._take``).
PENDING_RESCAN = 5.0
#: Most done tasks written in one transaction (see ``Crawler._commit_loop``).
COMMIT_GROUP = 256
#: Requests (so connections) one httpx client carries at once; a site with more on the
#: wire gets more clients (see :class:`~local_host.fetch.ClientPool`: httpcore's pool
#: costs O(connections^2) per request, so pools are kept small).
CONNECTIONS_PER_CLIENT = 4
#: Clients unused this long (seconds) are closed, with their keep-alive connections.
CLIENT_IDLE = 30.0

# Keeps the smaller depth of each field. KEYS[1] = depth hash, ARGV[1] = depth,
# ARGV[2..] = fields. Atomic inside MULTI/EXEC like any command.
_MIN_DEPTH = b"""
local d = tonumber(ARGV[1])
for i = 2, #ARGV do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if (not cur) or tonumber(cur) > d then redis.call('HSET', KEYS[1], ARGV[i], d) end
end
return 0
"""


@functools.lru_cache(maxsize=2)
def _tls_context(trust_env: bool):
    """One TLS context for every client of every crawler in the process: making one loads
    the CA bundle (~30 ms of CPU), and a one-process simulation starts dozens of crawlers."""
    return httpx.create_ssl_context(trust_env=trust_env)


@dataclass
class CrawlerSettings:
    #: Requests on the wire at once, all sites together.
    concurrency: int = 32
    #: Requests on the wire at once to one site (host); 0 = no per-site bound.
    per_site_concurrency: int = 2
    #: Minimum seconds between the starts of two requests to one site; 0 = none.
    per_site_delay: float = 0.25
    #: robots.txt ``Crawl-delay`` is honoured up to this many seconds; 0 ignores it.
    max_crawl_delay: float = 10.0
    respect_robots: bool = True
    #: How long a fetched robots.txt is trusted (RFC 9309: at most 24 h).
    robots_ttl: float = 86400.0
    user_agent: str = "dedupnet-crawler/0.1"
    #: The product token robots.txt groups are matched against.
    robots_agent: str = "dedupnet"
    #: Largest body read (bytes, after content decoding); a larger page is cut off.
    max_body: int = 2 * 1024 * 1024
    #: Retries of a request after a 5xx in ``retry_statuses``, a timeout or a connection error.
    max_retries: int = 3
    #: Back-off before retry k is ``retry_base * 2**(k-1)`` seconds (at most ``retry_max_delay``).
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
    #: beyond this the least recently used idle ones are closed.
    max_clients: int = 256
    #: Tasks taken from task_pool and not yet done (waiting for a site or a slot included).
    max_leased: int = 256
    #: Entries asked for by one XREADGROUP.
    take_batch: int = 64
    #: XREADGROUP BLOCK, seconds: how long an idle crawler waits in Redis for work
    #: (also the longest a cancellation waits for the blocked thread).
    block_timeout: float = 1.0
    #: Seconds between progress lines at INFO.
    progress_interval: float = 10.0


@dataclass
class Failure:
    reason: str
    status: int | None = None


@dataclass
class Outcome:
    """What one task came to. ``chain``: the task URL and every redirect target that was
    requested (all go into finish_URL); ``links``: normalised links to push."""

    url: str
    chain: list[str]
    depth: int = 0
    links: list[str] = field(default_factory=list)
    failure: Failure | None = None
    attempts: int = 0
    kind: str = "ok"  # ok | failed | skipped


@dataclass
class _Response:
    status: int
    headers: httpx.Headers
    body: bytes | None = None
    too_large: bool = False
    html: bool = True
    charset: str | None = None


class _FetchError(Exception):
    def __init__(self, kind: str, transient: bool):
        super().__init__(kind)
        self.kind = kind
        self.transient = transient


def _seed_fill(store: Store, urls: list[str], batch: Batch) -> None:
    key = store.key
    for url in urls:
        batch.add(b"XADD", key(URL_POOL), b"*", b"u", url)
    fields = fingerprint_fields(fingerprint_many(urls))
    batch.add(b"HSET", key(DEPTH), *[x for f in fields for x in (f, b"0")])
    batch.add(b"SADD", key(SEEDS), *urls)


def _seed(store: Store, urls: Iterable[str], gate: URLGate | None = None) -> int:
    accepted = list(dict.fromkeys((gate or URLGate()).accept(urls)))
    for i in range(0, len(accepted), 10_000):
        chunk = accepted[i : i + 10_000]
        store.transact(functools.partial(_seed_fill, store, chunk))
    return len(accepted)


def seed_urls(pools, urls: Iterable[str], gate: URLGate | None = None) -> int:
    """Push seeds into ``URL_pool`` like any discovered URL (the protocol de-dups and
    assigns them), record their depth as 0 and remember them for re-crawl.
    ``pools`` is a :class:`~local_host.pools.HostPools` (or a :class:`Store`).
    Returns how many were accepted (normalised, duplicates removed)."""
    store = pools if isinstance(pools, Store) else pools.store
    return _seed(store, urls, gate)


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
        self._reader = on_trio(store, max_threads=1)  # the blocking XREADGROUP
        self._writer = on_trio(store, max_threads=8)
        self.politeness = Politeness(s.concurrency, s.per_site_concurrency, s.per_site_delay)
        self.robots = RobotsCache(self._fetch_robots, agent=s.robots_agent, ttl=s.robots_ttl,
                                  on_rules=self._robots_rules)
        self.allowed = frozenset(d.lower().strip(".") for d in s.allowed_domains)
        self.depth_key = s.depth_key or store.key(DEPTH)
        self._finished = AgedSet(store, FINISH_URL, s.recrawl) if s.recrawl is not None else None
        self._clients: ClientPool | None = None
        self._leases = trio.Semaphore(max(1, s.max_leased))
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
        #: Tasks taken and not yet done (fetching, waiting for a slot or a retry).
        self.in_progress = 0
        #: Tasks done by this crawler (fetched, failed or skipped).
        self.pages_done = 0

    @property
    def idle(self) -> bool:
        """Nothing in progress, and the last read of task_pool found nothing new.

        Cheap and local; it can lag behind a task that has just arrived by up to one
        read. For quiescence, ``XLEN task_pool == 0`` is exact: an entry leaves the
        stream only in the transaction that pushes the page's links."""
        return self._drained and self.in_progress == 0

    # -- seeds ---------------------------------------------------------------------------
    async def seed(self, urls: Iterable[str]) -> int:
        """Async :func:`seed_urls` on this crawler's store."""
        return await until_stored(self._writer, self.counters, _seed, self.store, list(urls))

    # -- running ---------------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        s = self.settings
        await until_stored(self._writer, self.counters, self.store.ensure_group, TASK_POOL, GROUP)
        per_client = min(s.per_site_concurrency or s.concurrency, s.concurrency, CONNECTIONS_PER_CLIENT)
        clients = self._clients = ClientPool(self._client_factory(per_client), per_client=per_client,
                                             max_clients=s.max_clients)
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

    def _client_factory(self, connections: int):
        """Makes the clients of :class:`ClientPool`, ``connections`` each (the pool never
        puts more requests on one), all with the process's one TLS context. An idle
        connection is kept as long as its client (httpx's default, 5 s, made a crawler
        that comes back to a site every few seconds connect again each time; a
        connection the server closed meanwhile is seen before it is used)."""
        s = self.settings
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections,
                              keepalive_expiry=CLIENT_IDLE)
        tls = _tls_context(s.trust_env)
        timeout = httpx.Timeout(s.timeout)
        headers = {"User-Agent": s.user_agent}

        def make() -> httpx.AsyncClient:
            transport = httpx.AsyncHTTPTransport(verify=tls, limits=limits, local_address=s.local_address,
                                                 trust_env=s.trust_env, retries=0)
            return httpx.AsyncClient(transport=transport, verify=tls, timeout=timeout, follow_redirects=False,
                                     trust_env=s.trust_env, headers=headers)

        return make

    # -- taking tasks ----------------------------------------------------------------------
    def _read(self, count: int, start: bytes, block_ms: int | None) -> tuple[list[tuple[bytes, str]], bytes | None]:
        """One XREADGROUP (in a worker thread): entries, and the last id read (for paging
        through this consumer's pending entries)."""
        return take_tasks(self.store, self.consumer, count, start, block_ms)

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
        block_ms = max(1, int(s.block_timeout * 1000))
        cursor: bytes | None = b"0"  # first this consumer's pending entries (a restart)
        resumed = 0
        rescan_at = trio.current_time() + PENDING_RESCAN
        while True:
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
                    entries, cursor = await until_stored(self._reader, self.counters, self._read, n, cursor, None)
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
            else:
                entries, _ = await until_stored(self._reader, self.counters, self._read, n, b">", block_ms)
                self._drained = not entries
                if not entries and trio.current_time() >= rescan_at:
                    # Idle: look for entries delivered to this consumer whose reply never
                    # reached it (Redis went away mid-reply): pending, but not in progress.
                    cursor, rescan_at = b"0", trio.current_time() + PENDING_RESCAN
            for _ in range(n - len(entries)):
                self._leases.release()
            for eid, url in entries:
                self.in_progress += 1
                self._taken.add(eid)
                nursery.start_soon(self._process, eid, url)

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
                    outcome = _internal_failure(url)
            if outcome is None:  # given up before its request went out: it stays in task_pool
                self.counters.inc("tasks_given_up")
                return
            try:
                await self._record(eid, outcome)
            except Exception:
                log.exception("crawler %s: recording %s failed; dropping its results", self.consumer, url)
                self.counters.inc("fetch_errors", kind="internal")
                outcome = _internal_failure(url)
                await until_stored(self._writer, self.counters, self.store.transact,
                                   functools.partial(self._fill_done, [(eid, outcome)]))
            self.pages_done += 1
            self.counters.inc("pages_done", outcome=outcome.kind)
            self.counters.inc("links_pushed", len(outcome.links))
            if outcome.failure is not None:
                f = outcome.failure
                if outcome.kind == "skipped":
                    log.info("skipped %s: %s", url, f.reason)
                else:
                    log.warning("failed %s: %s%s after %d attempt(s)", url, f.reason,
                                f" {f.status}" if f.status is not None else "", outcome.attempts)
        finally:
            self.in_progress -= 1
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
        MULTI/EXEC in one worker-thread hop. A write per page cost a thread hop and a
        round trip each (some 10-15 % of the crawler's CPU at 300 pages/s); grouping
        adds no wait: a group is what finished while the previous write was out.

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
                    await until_stored(self._writer, self.counters, self.store.transact,
                                       functools.partial(self._fill_done, items))
                    errors: list[Exception | None] = [None] * len(group)
                except Exception:
                    errors = []
                    for item in items:
                        try:
                            await until_stored(self._writer, self.counters, self.store.transact,
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

    def _fill_done(self, items: list[tuple[bytes, Outcome]], batch: Batch) -> None:
        """Everything done tasks write, queued into one MULTI/EXEC: their URLs (and
        redirect chains) into finish_URL, their links into URL_pool (with depths),
        failure records set or cleared, and their task entries acknowledged and deleted."""
        key = self.store.key
        fill_discovered(batch, self.store, [link for _, o in items for link in o.links])
        records: dict[str, bytes | None] = {}  # URL -> failure record, None: clear it (last wins)
        for _, o in items:
            if o.links and self.settings.max_depth is not None:
                batch.add(b"EVAL", _MIN_DEPTH, 1, self.depth_key, o.depth + 1,
                          *fingerprint_fields(fingerprint_many(o.links)))
            if o.failure is not None:
                record = {"reason": o.failure.reason, "status": o.failure.status, "attempts": o.attempts,
                          "final_url": o.chain[-1] if o.chain else o.url, "time": round(time.time(), 3)}
                records[o.url] = orjson.dumps(record)
            else:
                records[o.url] = None
        cleared = [url for url, r in records.items() if r is None]
        if cleared:
            batch.add(b"HDEL", key(FAILED), *cleared)
        failed = [x for url, r in records.items() if r is not None for x in (url, r)]
        if failed:
            batch.add(b"HSET", key(FAILED), *failed)
        finish_tasks(batch, self.store, [eid for eid, _ in items], [o.url for _, o in items],
                      [u for _, o in items for u in o.chain], self._finished)

    def _depth_record(self, url: str) -> int:
        (field_,) = fingerprint_fields(fingerprint_many([url]))
        value = self.store.command(b"HGET", self.depth_key, field_)
        return int(value) if value is not None else 0

    def _backoff(self, retry: int, retry_after: float | None) -> float:
        s = self.settings
        delay = min(s.retry_base * 2 ** (retry - 1), s.retry_max_delay)
        if retry_after is not None:
            delay = max(delay, min(retry_after, s.retry_max_delay))
        return delay

    async def _until_store_answers(self) -> None:
        """Start no fetch while Redis does not answer: a page's result exists only in
        memory until its transaction is written, so pages fetched meanwhile would be
        fetched again if the daemon stopped before Redis came back. The tasks taken
        wait instead (their leases are in Redis); a crash re-fetches at most the pages
        that were in flight when the crawler saw a call to Redis fail (the crawl
        concurrency; twice that at worst, when the slots of the pages in flight are
        taken by the next ones before those pages' write has failed). One waiting task
        asks Redis until it answers."""
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
        s = self.settings
        try:
            url = normalize(raw_url)
        except BadURL as e:
            self.counters.inc("fetch_errors", kind="bad_url")
            return Outcome(raw_url, [], failure=Failure(f"bad_url:{e.reason}"), kind="failed")
        depth = 0
        if s.max_depth is not None:
            depth = await until_stored(self._writer, self.counters, self._depth_record, url)
        chain = [url]
        current = url
        attempts = 0
        retries = 0  # on the current hop

        def failed(reason: str, status: int | None = None) -> Outcome:
            return Outcome(url, chain, depth, failure=Failure(reason, status), attempts=attempts, kind="failed")

        while True:
            if s.respect_robots:
                try:
                    allowed = await self.robots.allowed(current)
                except RobotsUnavailable:
                    self.counters.inc("fetch_errors", kind="robots_unavailable")
                    if retries < s.max_retries:
                        retries += 1
                        self.counters.inc("retries")
                        await self._retry_later(eid, self._backoff(retries, None))
                        continue
                    return failed("robots_unavailable")
                if not allowed:
                    self.counters.inc("robots_skipped")
                    return Outcome(url, chain, depth, failure=Failure("robots"), attempts=attempts, kind="skipped")
            attempts += 1
            try:
                resp = await self._fetch(current, eid)
            except _FetchError as e:
                self.counters.inc("fetch_errors", kind=e.kind)
                if e.transient and retries < s.max_retries:
                    retries += 1
                    self.counters.inc("retries")
                    await self._retry_later(eid, self._backoff(retries, None))
                    continue
                return failed(e.kind)
            status = resp.status
            self.counters.inc("pages_fetched", status=status)
            if status in s.retry_statuses:
                self.counters.inc("fetch_errors", kind="http_5xx" if status >= 500 else "http_retry")
                if retries < s.max_retries:
                    retries += 1
                    self.counters.inc("retries")
                    await self._retry_later(eid, self._backoff(retries, _retry_after(resp.headers)))
                    continue
                return failed("http", status)
            location = resp.headers.get("location")
            if status in REDIRECT_STATUSES and location:
                # The target is a discovered URL like any link: it goes through de-dup
                # (URL_pool), so a page reached both by a redirect and by a link is
                # fetched once in the whole system. Loops end by themselves: each URL
                # of the loop is fetched once.
                self.counters.inc("redirects")
                try:
                    target = normalize(urllib.parse.urljoin(current, location.strip()))
                except (BadURL, ValueError):
                    self.counters.inc("fetch_errors", kind="bad_redirect")
                    return failed("bad_redirect", status)
                if not in_scope(site_of(target), self.allowed):
                    self.counters.inc("fetch_errors", kind="redirect_out_of_scope")
                    return failed("redirect_out_of_scope", status)
                return Outcome(url, chain, depth, links=[target] if target != url else [], attempts=attempts)
            if 200 <= status < 300:
                return await self._page(url, chain, depth, attempts, resp)
            self.counters.inc("fetch_errors", kind="http_4xx" if 400 <= status < 500 else "http_other")
            return failed("http", status)

    async def _page(self, url: str, chain: list[str], depth: int, attempts: int, resp: _Response) -> Outcome:
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
    async def _fetch(self, url: str, eid: bytes = b"") -> _Response:
        """One GET through the politeness gate; the body is read (up to ``max_body``) only
        for a 2xx HTML page (or any 2xx with ``store_dir``)."""
        assert self._clients is not None
        s = self.settings
        site = site_of(url)
        async with self.politeness.slot(site) as sent, self._clients.client(site) as client:
            await self._until_store_answers()  # with the slot: the check is the last thing before the request
            scope = self._tasks.get(eid)
            if scope is not None and scope.cancel_called:
                await trio.lowlevel.checkpoint()  # given up (the crawler stops) before anything went out
            self._on_wire.add(eid)
            with trio.move_on_after(s.page_timeout):
                try:
                    async with client.stream("GET", url, headers={"Accept": ACCEPT},
                                                   extensions={"trace": _on_send(sent)}) as r:
                        try:
                            return await self._read_response(r)
                        finally:
                            self.counters.inc("fetched_bytes", r.num_bytes_downloaded)
                except httpx.TimeoutException:
                    raise _FetchError("timeout", True) from None
                except httpx.ConnectError:
                    raise _FetchError("connect", True) from None
                except (httpx.UnsupportedProtocol, httpx.InvalidURL):
                    raise _FetchError("bad_url", False) from None
                except httpx.TransportError:
                    raise _FetchError("network", True) from None
                except (httpx.DecodingError, httpx.StreamError):
                    raise _FetchError("decoding", False) from None
            raise _FetchError("timeout", True)

    async def _read_response(self, r: httpx.Response) -> _Response:
        s = self.settings
        resp = _Response(r.status_code, r.headers)
        if not 200 <= r.status_code < 300:
            await _drain(r)
            return resp
        mime = r.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        resp.html = not mime or mime in HTML_TYPES  # no type: try it as HTML
        if not resp.html and not s.store_dir:
            await _drain(r)
            return resp
        length = r.headers.get("content-length", "")
        if length.isdigit() and int(length) > s.max_body:
            resp.too_large = True
            return resp
        resp.charset = r.charset_encoding  # parsing Content-Type costs: only for a body kept
        chunks, total = [], 0
        async with contextlib.aclosing(r.aiter_bytes()) as body:  # we may stop early
            async for chunk in body:
                total += len(chunk)
                if total > s.max_body:
                    resp.too_large = True
                    return resp
                chunks.append(chunk)
        resp.body = b"".join(chunks)
        return resp

    async def _fetch_robots(self, origin: str) -> str | None:
        """robots.txt of an origin for :class:`RobotsCache` (through the politeness gate)."""
        assert self._clients is not None
        s = self.settings
        url = origin + "/robots.txt"
        site = site_of(url)
        try:
            async with self.politeness.slot(site) as sent, self._clients.client(site) as client:
                with trio.move_on_after(s.page_timeout):
                    async with client.stream("GET", url, follow_redirects=True,
                                                   extensions={"trace": _on_send(sent)}) as r:
                        self.counters.inc("robots_fetched", status=r.status_code)
                        if not 200 <= r.status_code < 300:
                            return robots_text(url, r.status_code)
                        chunks, total = [], 0
                        async with contextlib.aclosing(r.aiter_bytes()) as body:
                            async for chunk in body:
                                chunks.append(chunk)
                                total += len(chunk)
                                if total >= ROBOTS_MAX:
                                    break
                        self.counters.inc("fetched_bytes", r.num_bytes_downloaded)
                        return robots_text(url, r.status_code, b"".join(chunks))
                raise RobotsUnavailable(f"{url}: timeout")
        except httpx.TooManyRedirects:
            return None  # RFC 9309: more than 5 redirects = unavailable (4xx-like): allow
        except httpx.HTTPError as e:
            raise RobotsUnavailable(f"{url}: {type(e).__name__}") from None

    def _robots_rules(self, origin: str, rules) -> None:
        if self.settings.max_crawl_delay <= 0:
            return
        try:
            delay = rules.crawl_delay(self.settings.robots_agent)
        except Exception:  # a malformed Crawl-delay must not cost the page
            delay = None
        if delay:
            self.politeness.set_delay(site_of(origin + "/"), min(float(delay), self.settings.max_crawl_delay))

    # -- page store ------------------------------------------------------------------------
    async def _store_page(self, url: str, resp: _Response, html: str | None) -> None:
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
        """Re-crawl: the seeds straight into task_pool, or with a re-crawl policy into
        URL_pool (see the module doc), at most once per interval per host (``recrawl_lock``)."""
        interval_ms = max(1, int(self.settings.recrawl_interval * 1000))
        if not self.store.command(b"SET", self.store.key(RECRAWL_LOCK), self.consumer, b"NX", b"PX", interval_ms):
            return 0
        seeds = self.store.command(b"SMEMBERS", self.store.key(SEEDS))
        if not seeds:
            return 0

        pool = self.store.key(URL_POOL if self._finished is not None else TASK_POOL)

        def fill(batch: Batch) -> None:
            for url in seeds:
                batch.add(b"XADD", pool, b"*", b"u", url)
            fields = fingerprint_fields(fingerprint_many([u.decode() for u in seeds]))
            batch.add(b"HSET", self.depth_key, *[x for f in fields for x in (f, b"0")])

        self.store.transact(fill)
        return len(seeds)

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


def _internal_failure(url: str) -> Outcome:
    """A task that raised: recorded as failed and finished (never fetched in a loop)."""
    try:
        url = normalize(url)
        chain = [url]
    except BadURL:
        chain = []
    return Outcome(url, chain, failure=Failure("internal"), kind="failed")


def _on_send(sent):
    """An httpcore ``trace`` callback calling ``sent()`` when the request headers go out."""

    async def trace(name: str, info: dict) -> None:
        if name.endswith("send_request_headers.started"):
            sent()

    return trace


async def _drain(r: httpx.Response) -> None:
    """Read and drop a small body (see ``DRAIN_MAX``); an error only costs the connection."""
    length = r.headers.get("content-length", "")
    if length.isdigit() and int(length) <= DRAIN_MAX:
        try:
            async for _ in r.aiter_raw():
                pass
        except httpx.HTTPError:
            pass


def _retry_after(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after", "").strip()
    if value.isdigit():
        return float(value)
    return None


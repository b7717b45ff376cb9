"""A host's ``task_pool`` seen as URLFrontier queues: what the URLFrontier service
(local_host/frontier/service.py) does to the host's Redis, with no gRPC in it.

A URL handed out by ``GetURLs`` is a task leased to the consumer ``urlfrontier`` of the
crawlers' group (local_host/frontier/tasks.py): pending there, not popped, so a client that dies
loses nothing. URLFrontier leases expire (``delay_requestable``); dedupnet's crawler
leases do not. The lease's end is kept in the pending entry itself, in its idle time:
every entry the frontier has read is pending for ``urlfrontier``, and

* idle for ``LEASE_WINDOW_MS`` or more: waiting, to be handed out;
* handed out with a delay of D ms: its idle time is set to ``LEASE_WINDOW_MS - D``,
  so it is waiting again, by itself, D ms later.

``XCLAIM ... min-idle-time`` hands an entry out only if it is still waiting when the
claim runs: two ``GetURLs`` at once never hand out one URL twice. The idle time is
Redis' own clock and is kept across a restart of Redis, so a lease outlives the host.

Queues are sites (the host of the URL): the protocol carries URLs only, so a client's
own ``key`` cannot follow a URL to the host it is assigned to. Per-queue delays and
blocks are kept in the host's Redis (``frontier:delays``, ``frontier:blocked``); the
time a queue last gave URLs is kept in memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.storage.recrawl import AgedSet
from dedupnet.adapters.storage.store import FINISH_URL, TASK_POOL, Store
from dedupnet.codec.ages import RecrawlPolicy
from dedupnet.codec.errors import BadURL
from dedupnet.codec.urls import fingerprint_many, normalize, site_of

from ..pools import TASK_FP
from . import sites
from .sites import Pace
from .tasks import GROUP, fill_discovered, finish_tasks

log = logging.getLogger("dedupnet.frontier")

#: The consumer (in the crawlers' group) that holds every task the frontier has read.
CONSUMER = "urlfrontier"
#: Hash URL -> task entry id of the URLs handed out (to find the task of a known URL).
LEASES = "frontier:leases"
#: Hash queue key -> seconds between two hand-outs of that queue ("" : every queue's default).
DELAYS = "frontier:delays"
#: Hash queue key -> epoch seconds until which the queue gives nothing.
BLOCKED = "frontier:blocked"
#: Longest lease, ms: ``delay_requestable`` is capped to it (see the module doc).
LEASE_WINDOW_MS = 7 * 86400 * 1000
#: ``delay_requestable`` 0 means "the service's default": seconds.
DEFAULT_LEASE = 30
#: Waiting entries one ``GetURLs`` looks at, the oldest first (so also the most it
#: hands out; Lua's ``unpack`` takes at most some 8,000 values).
WINDOW = 4096

#: New entries one site gives a refill of the window (the queues' own delays apply after).
PER_SITE_REFILL = 64

OK, SKIPPED, FAIL = 0, 1, 2  # AckMessage.Status

# KEYS[1] task_pool; ARGV: group, consumer, window ms, most entries. The waiting entries
# (oldest first) as a flat list id, url, ...
_WAITING = b"""
local key, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local window, want = tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
local function url_of(fields)
  for i = 1, #fields, 2 do if fields[i] == 'u' then return fields[i + 1] end end
  return nil
end
local pending = redis.call('XPENDING', key, group, 'IDLE', window, '-', '+', want, consumer)
for _, p in ipairs(pending) do
  local e = redis.call('XRANGE', key, p[1], p[1])
  local url = e[1] and url_of(e[1][2])
  if url then
    out[#out + 1] = p[1]; out[#out + 1] = url
  else
    redis.call('XACK', key, group, p[1])
  end
end
return out
"""

# KEYS[1] task_pool, KEYS[2] leases; ARGV: group, consumer, window ms, idle ms, then id, url
# pairs. Claims those still waiting (their lease starts), records their URLs' entries;
# returns the ids claimed.
_LEASE = b"""
local key, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local window, idle = ARGV[3], ARGV[4]
local claim, url_of = {'XCLAIM', key, group, consumer, window}, {}
for i = 5, #ARGV, 2 do claim[#claim + 1] = ARGV[i]; url_of[ARGV[i]] = ARGV[i + 1] end
claim[#claim + 1] = 'IDLE'; claim[#claim + 1] = idle; claim[#claim + 1] = 'JUSTID'
local claimed = redis.call(unpack(claim))
for _, id in ipairs(claimed) do redis.call('HSET', KEYS[2], url_of[id], id) end
return claimed
"""


@dataclass(frozen=True)
class Get:
    """The parameters of one ``GetURLs`` (0: no limit; ``delay`` 0: the default)."""

    max_urls_per_queue: int = 0
    max_queues: int = 0
    key: str = ""
    delay: int = 0


def queue_of(url: str) -> str:
    return site_of(url)


class FrontierQueues:
    """Called from gRPC's worker threads, so every method is synchronous and safe to
    call from several threads at once (the Store takes a connection per round trip)."""

    def __init__(self, store: Store, counters: Counters, *, recrawl: RecrawlPolicy | None = None,
                 max_url_length: int = 2048, clock: Callable[[], float] = time.time):
        self.store = store
        self.counters = counters
        self.finished = AgedSet(store, FINISH_URL, recrawl, clock) if recrawl is not None else None
        self.max_url_length = max_url_length
        self.clock = clock
        #: False after ``SetActive(false)``: GetURLs hands out nothing (puts go on).
        self.active = True
        #: Called after discovered URLs went into URL_pool (wakes the host's walker).
        self.on_push: Callable[[], None] | None = None
        #: Called after tasks were finished (wakes the host's report loop).
        self.on_finish: Callable[[], None] | None = None
        self._served: dict[str, float] = {}
        self._lock = threading.Lock()

    def setup(self) -> None:
        self.store.ensure_group(TASK_POOL, GROUP)

    # -- GetURLs -------------------------------------------------------------------------
    def get(self, params: Get) -> list[tuple[str, str]]:
        """URLs to crawl now, ``(url, queue)``, each leased for ``params.delay`` seconds."""
        if not self.active:
            return []
        delay_ms = min((params.delay or DEFAULT_LEASE) * 1000, LEASE_WINDOW_MS)
        with self._lock:  # one selection at a time: per-queue delays hold across callers
            waiting = self._waiting()
            delays, blocked = self._rules()
            now = self.clock()
            chosen: list[tuple[bytes, str, str]] = []
            per_queue: dict[str, int] = {}
            closed: set[str] = set()
            for eid, url in waiting:
                try:
                    queue = queue_of(url)
                except ValueError:
                    self._drop_bad_task(eid, url)
                    continue
                if queue in closed or (params.key and queue != params.key):
                    continue
                n = per_queue.get(queue)
                if n is None:
                    if (params.max_queues and len(per_queue) >= params.max_queues) or \
                            blocked.get(queue, 0) > now or \
                            self._served.get(queue, -1e18) + delays.get(queue, delays.get("", 0)) > now:
                        closed.add(queue)
                        continue
                    n = 0
                if params.max_urls_per_queue and n >= params.max_urls_per_queue:
                    continue
                per_queue[queue] = n + 1
                chosen.append((eid, url, queue))
            claimed = set(self._lease(chosen, delay_ms)) if chosen else set()
            out = [(url, queue) for eid, url, queue in chosen if eid in claimed]
            for _, queue in out:
                self._served[queue] = now
        self.counters.inc("frontier_urls_out", len(out))
        return out

    def _waiting(self) -> list[tuple[bytes, str]]:
        """The entries waiting here, oldest first; if fewer than ``WINDOW``, new ones from
        the host's frontier, a few per site in turn (local_host/frontier/sites.py), marked waiting:
        a big site's pages never fill the window while small sites have work."""
        reply = self.store.command(b"EVAL", _WAITING, 1, self.store.key(TASK_POOL), GROUP, CONSUMER,
                                   LEASE_WINDOW_MS, WINDOW)
        waiting = [(reply[i], reply[i + 1].decode("utf-8", "replace")) for i in range(0, len(reply), 2)]
        if len(waiting) < WINDOW:
            waiting += sites.take(self.store, CONSUMER, WINDOW - len(waiting), Pace(burst=PER_SITE_REFILL),
                                  idle_ms=LEASE_WINDOW_MS).entries
        return waiting

    def _lease(self, chosen: list[tuple[bytes, str, str]], delay_ms: int) -> list[bytes]:
        args = [x for eid, url, _ in chosen for x in (eid, url)]
        return self.store.command(b"EVAL", _LEASE, 2, self.store.key(TASK_POOL), self.store.key(LEASES),
                                  GROUP, CONSUMER, LEASE_WINDOW_MS, LEASE_WINDOW_MS - delay_ms, *args)

    def _rules(self) -> tuple[dict[str, float], dict[str, float]]:
        batch = self.store.batch()
        batch.add(b"HGETALL", self.store.key(DELAYS))
        batch.add(b"HGETALL", self.store.key(BLOCKED))
        return tuple({k.decode(): float(v) for k, v in zip(flat[0::2], flat[1::2])}
                     for flat in self.store.execute(batch))

    def _drop_bad_task(self, eid: bytes, url: str) -> None:
        """A task that is not a normalised URL cannot be crawled; it is finished, not
        handed out for ever."""
        log.warning("task %s is not a URL (%r): finished without a fetch", eid, url[:200])
        self.counters.inc("frontier_bad_input", reason="task")
        self.store.stream_done(TASK_POOL, GROUP, [eid])

    # -- PutURLs -------------------------------------------------------------------------
    def _normal(self, url: str, crawl_ok: bool) -> str | None:
        if not crawl_ok:
            self.counters.inc("frontier_bad_input", reason="crawl_id")
            log.warning("URL %r put for another crawl than this frontier's: refused", url[:200])
            return None
        try:
            return normalize(url, max_length=self.max_url_length)
        except BadURL as e:
            self.counters.inc("frontier_bad_input", reason=e.reason)
            log.warning("not a URL to crawl (%s): %r", e.reason, url[:200])
            return None

    def put_discovered(self, items: Sequence[tuple[str, bool]]) -> list[int]:
        """URLs found by the crawler (``(url, crawl id is ours)``): into URL_pool and the
        protocol (OK), unless this host has crawled or queued them already (SKIPPED) or
        they are not URLs (FAIL). One status per item, in order."""
        urls = [self._normal(url, ok) for url, ok in items]
        fresh = list(dict.fromkeys(u for u in urls if u is not None))
        known = dict(zip(fresh, self._known_here(fresh))) if fresh else {}
        statuses, pushed = [], []
        for url in urls:
            if url is None:
                statuses.append(FAIL)
            elif known[url]:
                statuses.append(SKIPPED)
            else:
                statuses.append(OK)
                known[url] = True  # a second one in this batch is known now
                pushed.append(url)
        if pushed:
            self.store.transact(lambda batch: fill_discovered(batch, self.store, pushed))
            if self.on_push is not None:
                self.on_push()
        self.counters.inc("frontier_discovered", len(pushed))
        self.counters.inc("frontier_skipped", statuses.count(SKIPPED))
        return statuses

    def _known_here(self, urls: list[str]) -> np.ndarray:
        """A URL this host has: crawled here or queued here."""
        done, queued = self._lookup(urls)
        return done | queued

    def _lookup(self, urls: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Which URLs are in finish_URL, and which in task_pool:fp (queued here, not
        crawled yet)."""
        batch = self.store.batch()
        fps = fingerprint_many(urls)
        queued = batch.fingerprints(b"SMISMEMBER", self.store.key(TASK_FP), fps)  # first: see HostPools.lookup_steps
        if self.finished is not None:
            done = self.finished.contains(batch, urls, fps)
        else:
            done = batch.fingerprints(b"SMISMEMBER", self.store.key(FINISH_URL), fps)
        results = self.store.execute(batch)
        return done.flags(results), queued.flags(results)

    def put_known(self, items: Sequence[tuple[str, bool]]) -> list[int]:
        """URLs the crawler has fetched: recorded in finish_URL, their tasks acknowledged
        and gone from task_pool, in one transaction (the crawlers' own, local_host/frontier/tasks.py)."""
        urls = [self._normal(url, ok) for url, ok in items]
        done = list(dict.fromkeys(u for u in urls if u is not None))
        if done:
            eids = self.store.command(b"HMGET", self.store.key(LEASES), *done)
            leased = [eid for eid in eids if eid is not None]
            if len(leased) < len(done):
                self.counters.inc("frontier_known_unleased", len(done) - len(leased))

            def fill(batch) -> None:
                finish_tasks(batch, self.store, leased, done, done, self.finished)
                batch.add(b"HDEL", self.store.key(LEASES), *done)

            self.store.transact(fill)
            if self.on_finish is not None:
                self.on_finish()
        self.counters.inc("frontier_known", len(done))
        return [FAIL if u is None else OK for u in urls]

    # -- inspection and control ----------------------------------------------------------
    def set_delay(self, queue: str, seconds: int) -> None:
        self.store.command(b"HSET", self.store.key(DELAYS), queue, seconds)

    def block_until(self, queue: str, when: int) -> None:
        if when:
            self.store.command(b"HSET", self.store.key(BLOCKED), queue, when)
        else:
            self.store.command(b"HDEL", self.store.key(BLOCKED), queue)

    def census(self) -> dict[str, list[int]]:
        """Every queue with its URLs ``[waiting, in flight]``: a read of the whole
        task_pool, its stream and its sites' lengths (so not for every second)."""
        in_flight = self._in_flight()
        out: dict[str, list[int]] = {}
        last = b"-"
        while True:
            page = self.store.command(b"XRANGE", self.store.key(TASK_POOL), last, b"+", b"COUNT", 10_000)
            for eid, fields in page:
                url = dict(zip(fields[0::2], fields[1::2])).get(b"u") if fields else None
                if url is None:
                    continue
                try:
                    queue = queue_of(url.decode("utf-8", "replace"))
                except ValueError:
                    continue
                out.setdefault(queue, [0, 0])[eid in in_flight] += 1
            if len(page) < 10_000:
                break
            last = b"(" + page[-1][0]
        for site, n in sites.queued_by_site(self.store):
            out.setdefault(site, [0, 0])[0] += n
        return out

    def _in_flight(self) -> set[bytes]:
        """Task entries being crawled: leased to this service and not expired, or taken
        by another crawler of the host."""
        out: set[bytes] = set()
        last = b"-"
        while True:
            page = self.store.command(b"XPENDING", self.store.key(TASK_POOL), GROUP, last, b"+", 10_000)
            for eid, consumer, idle, _ in page:
                if consumer != CONSUMER.encode() or int(idle) < LEASE_WINDOW_MS:
                    out.add(eid)
            if len(page) < 10_000:
                return out
            last = b"(" + page[-1][0]

    def blocked_now(self) -> set[str]:
        _, blocked = self._rules()
        now = self.clock()
        return {q for q, until in blocked.items() if until > now}

    def status_of(self, url: str) -> str | None:
        """``done`` (in finish_URL), ``queued`` (a task of this host), or None.
        Raises BadURL."""
        done, queued = self._lookup([normalize(url, max_length=self.max_url_length)])
        return "done" if done[0] else "queued" if queued[0] else None

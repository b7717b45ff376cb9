"""What the crawler keeps in Redis besides the task stream: what a task came to (the
finished URLs, the links found, a failure record), the depth of each URL, and the
seeds with their re-crawl.

Every write here is queued into a :class:`~dedupnet.adapters.storage.store.Batch`, so that a
task's records go out in the one MULTI/EXEC that acknowledges it (all or nothing: see
:mod:`local_host.frontier.tasks`).

Depth (for ``max_depth``): task entries carry only ``u``, so the depth of a URL is kept
in the hash ``<prefix>:depth`` (8-byte URL fingerprint -> depth), written in the same
transaction that pushes links (the minimum of the known and the new depth, by a small
Lua script), and read when the task is fetched. A URL without a record is a seed
(depth 0): seeds are written with 0, and so are URLs pushed by other means
(``dedupnet push``). Nothing is written when ``max_depth`` is None. The hash is per
host: a URL the protocol assigns to another host (site hash) arrives there without
its depth, i.e. as depth 0, unless the hosts share the key (``depth_key``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from dedupnet.adapters.storage.recrawl import AgedSet
from dedupnet.adapters.storage.store import TASK_POOL, URL_POOL, Batch, Store
from dedupnet.adapters.storage.resp import fingerprint_fields
from dedupnet.codec.errors import BadURL
from dedupnet.codec.urls import URLGate, fingerprint_many, normalize

from ..frontier.tasks import fill_discovered, finish_tasks

__all__ = ["DEPTH", "FAILED", "SEEDS", "Failure", "Outcome", "depth_of", "fill_done", "internal_failure",
           "requeue_seeds", "add_seeds", "seed_urls"]

#: Hash URL -> JSON ``{reason, status, attempts, final_url, time}`` of permanent failures.
FAILED = "failed"
#: Hash 8-byte fingerprint -> depth (only with ``max_depth``).
DEPTH = "depth"
#: Set of seed URLs (for re-crawl).
SEEDS = "seeds"
RECRAWL_LOCK = "recrawl_lock"

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


def internal_failure(url: str) -> Outcome:
    """A task that raised: recorded as failed and finished (never fetched in a loop)."""
    try:
        url = normalize(url)
        chain = [url]
    except BadURL:
        chain = []
    return Outcome(url, chain, failure=Failure("internal"), kind="failed")


def fill_done(batch: Batch, store: Store, items: list[tuple[bytes, Outcome]], *, max_depth: int | None,
              depth_key: str, finished: AgedSet | None) -> None:
    """Everything done tasks write, queued into one MULTI/EXEC: their URLs (and
    redirect chains) into finish_URL, their links into URL_pool (with depths),
    failure records set or cleared, and their task entries acknowledged and deleted."""
    key = store.key
    fill_discovered(batch, store, [link for _, o in items for link in o.links])
    records: dict[str, bytes | None] = {}  # URL -> failure record, None: clear it (last wins)
    for _, o in items:
        if o.links and max_depth is not None:
            batch.add(b"EVAL", _MIN_DEPTH, 1, depth_key, o.depth + 1, *fingerprint_fields(fingerprint_many(o.links)))
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
    finish_tasks(batch, store, [eid for eid, _ in items], [o.url for _, o in items],
                  [u for _, o in items for u in o.chain], finished)


def depth_of(store: Store, depth_key: str, url: str) -> int:
    """The recorded depth of ``url`` (0: none recorded, a seed)."""
    (field_,) = fingerprint_fields(fingerprint_many([url]))
    value = store.command(b"HGET", depth_key, field_)
    return int(value) if value is not None else 0


def _fill_at_depth_0(batch: Batch, pool: str | bytes, depth_key: str | bytes, urls: list[str]) -> None:
    for url in urls:
        batch.add(b"XADD", pool, b"*", b"u", url)
    fields = fingerprint_fields(fingerprint_many(urls))
    batch.add(b"HSET", depth_key, *[x for f in fields for x in (f, b"0")])


def _fill_seeds(store: Store, urls: list[str], batch: Batch) -> None:
    _fill_at_depth_0(batch, store.key(URL_POOL), store.key(DEPTH), urls)
    batch.add(b"SADD", store.key(SEEDS), *urls)


def add_seeds(store: Store, urls: Iterable[str], gate: URLGate | None = None) -> int:
    """:func:`seed_urls` on a store."""
    accepted = list(dict.fromkeys((gate or URLGate()).accept(urls)))
    for i in range(0, len(accepted), 10_000):
        chunk = accepted[i : i + 10_000]
        store.transact(functools.partial(_fill_seeds, store, chunk))
    return len(accepted)


def seed_urls(pools, urls: Iterable[str], gate: URLGate | None = None) -> int:
    """Push seeds into ``URL_pool`` like any discovered URL (the protocol de-dups and
    assigns them), record their depth as 0 and remember them for re-crawl.
    ``pools`` is a :class:`~local_host.pools.HostPools` (or a :class:`Store`).
    Returns how many were accepted (normalised, duplicates removed)."""
    store = pools if isinstance(pools, Store) else pools.store
    return add_seeds(store, urls, gate)


def requeue_seeds(store: Store, consumer: str, interval: float, depth_key: str, *, by_age: bool) -> int:
    """Re-crawl: the seeds straight into task_pool, or with a re-crawl policy
    (``by_age``) into URL_pool (see :mod:`local_host.crawler.crawl`), at most once per
    ``interval`` per host (``recrawl_lock``). Returns how many were queued."""
    interval_ms = max(1, int(interval * 1000))
    if not store.command(b"SET", store.key(RECRAWL_LOCK), consumer, b"NX", b"PX", interval_ms):
        return 0
    seeds = store.command(b"SMEMBERS", store.key(SEEDS))
    if not seeds:
        return 0
    pool = store.key(URL_POOL if by_age else TASK_POOL)
    urls = [u.decode() for u in seeds]
    store.transact(lambda batch: _fill_at_depth_0(batch, pool, depth_key, urls))
    return len(seeds)

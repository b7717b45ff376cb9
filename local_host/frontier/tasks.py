"""The crawler side of ``task_pool``: how a task is taken and how a fetched one is
recorded, for every crawler front end of a host (dedupnet's crawler, the URLFrontier
service) so that they cannot drift apart.

A task is leased, not popped: it is handed out by site, as politeness allows
(local_host/frontier/sites.py), by claiming its entry in the group ``crawl`` for the consumer
that takes it; the entry stays in the stream, pending for that consumer. It leaves
``task_pool`` only in the transaction that records its URL in ``finish_URL``
(:func:`finish_tasks`), with whatever else the crawler writes for the page: a crawler
killed at any point loses no task, and fetches again at most what it had in hand.

The same two calls serve the Scrapy scheduler (dedupnet/scrapy/__init__.py), which runs in a
process of its own: it reads the host's re-crawl policy with
:func:`~local_host.pools.published_recrawl` so that it finishes a task as the host's own
crawler would.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.exceptions import ResponseError

from dedupnet.adapters.storage.recrawl import AgedSet
from dedupnet.adapters.storage.store import FINISH_URL, TASK_POOL, URL_POOL, Batch, Store
from dedupnet.codec.urls import fingerprint_many

from . import sites
from ..pools import TASK_FP
from .sites import GROUP, Pace



def take_tasks(store: Store, consumer: str, count: int, start: bytes,
               pace: Pace = Pace()) -> tuple[list[tuple[bytes, str]], bytes | None]:
    """Up to ``count`` tasks for ``consumer``: with ``start`` ``>``, tasks of sites whose
    politeness allows one now (:func:`local_host.frontier.sites.take`); else its own pending ones from
    ``start`` on (a restart). Returns the entries ``(id, url)`` and the last id read (to
    page on through the pending ones; None when nothing was read, and after ``>``)."""
    if start == b">":
        return sites.take(store, consumer, count, pace).entries, None
    key = store.key(TASK_POOL)
    try:
        reply = store.command(b"XREADGROUP", b"GROUP", GROUP, consumer, b"COUNT", count, b"STREAMS", key, start)
    except ResponseError as e:
        if "NOGROUP" not in str(e):
            raise
        store.ensure_group(TASK_POOL, GROUP)
        return [], None
    raw = reply[0][1] if reply else []
    if not raw:
        return [], None
    entries, gone = [], []
    for eid, fields in raw:
        url = dict(zip(fields[0::2], fields[1::2])).get(b"u") if fields else None
        if url is None:
            gone.append(eid)  # deleted under us, or not a task: nothing to do
        else:
            entries.append((eid, url.decode("utf-8", "replace")))
    if gone:
        store.stream_done(TASK_POOL, GROUP, gone)
    return entries, raw[-1][0]


def finish_tasks(batch: Batch, store: Store, eids: Sequence[bytes], urls: Sequence[str],
                  chains: Sequence[str], finished: AgedSet | None) -> None:
    """Queue what records fetched tasks into a transaction: the URLs fetched for them
    (``chains``: each task URL and the redirects followed from it) into ``finish_URL``,
    the task URLs out of ``task_pool:fp`` and the task entries acknowledged and deleted.

    A fingerprint is kept once per host: ``task_pool:fp`` holds what is queued and not
    yet crawled, ``finish_URL`` what is crawled, and the move from one to the other is
    one transaction, so "seen here" (either set, read ``task_pool:fp`` first) never
    misses a URL. Under a re-crawl policy (``finished``: the aged ``finish_URL``) this
    is also what lets a later admission of a URL be queued again."""
    key = store.key
    if chains and finished is not None:
        finished.add(batch, list(chains))
    elif chains:
        batch.fingerprints(b"SADD", key(FINISH_URL), fingerprint_many(list(chains)))
    # A task whose URL did not reach finish_URL (a failure with no fetch recorded) stays
    # in task_pool:fp, seen, as before; under a re-crawl policy it may be admitted again.
    gone = list(urls) if finished is not None else list(set(urls) & set(chains))
    if gone:
        batch.fingerprints(b"SREM", key(TASK_FP), fingerprint_many(gone))
    if eids:
        batch.add(b"XACK", key(TASK_POOL), GROUP, *eids)
        batch.add(b"XDEL", key(TASK_POOL), *eids)
    # Each finished task is reported to the center, whose ledger holds it until then
    # (docs/PROTOCOL.md section 12): queued here, in the transaction that records it,
    # so a power cut loses the page and its report together or neither. Each entry
    # carries the newest URL_pool entry's id as the transaction ends (the page's links
    # included): the report waits until URL_pool holds nothing up to it (pools.py).
    from ..pools import TASKS_DONE

    if urls:
        batch.add(b"EVAL", _DONE, 2, key(TASKS_DONE), key(URL_POOL), *urls)


#: Push finished task URLs onto tasks_done, each as ``<url> <id>``: ``id`` the newest
#: URL_pool entry's (``0-0``: URL_pool empty). A normalised URL has no space.
_DONE = b"""
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local id = last[1] and last[1][1] or '0-0'
for i = 1, #ARGV, 1000 do
  local tagged = {}
  for j = i, math.min(i + 999, #ARGV) do tagged[#tagged + 1] = ARGV[j] .. ' ' .. id end
  redis.call('RPUSH', KEYS[1], unpack(tagged))
end
return #ARGV
"""


def fill_discovered(batch: Batch, store: Store, urls: Sequence[str]) -> None:
    """Queue normalised URLs a crawler found into ``URL_pool`` (§2.2 step 1): from there
    the host's walker takes them through the protocol."""
    url_pool = store.key(URL_POOL)
    for url in urls:
        batch.add(b"XADD", url_pool, b"*", b"u", url)

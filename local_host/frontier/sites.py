"""``task_pool`` by site: the one place a host's tasks wait and are taken from, by every
crawler front end (dedupnet's crawler, the Scrapy scheduler, the URLFrontier service).

``task_pool`` is what the paper calls it (§1.1, the host's queue of tasks to crawl). A
crawler that read it first in, first out held its window of leases full of one big
site's pages, each waiting out that site's politeness delay, while its fetch slots
stood idle and every other site waited behind them. So, as BUbiNG's workbench and
Heritrix's per-host queues do, tasks wait **by site**, and a site hands one out only
when its politeness allows. ``task_pool`` is realised by:

* ``task_pool:site:<site>``: a list per site of the URLs queued there, oldest first,
  most of them sealed in deflated blocks (local_host/frontier/site_blocks.py; ``task_pool:queued``
  counts them all);
* ``task_pool:sites``: a sorted set of the sites with queued URLs, scored by the time
  (epoch ms) each may next hand one out: a hand-out moves it on by the site's delay
  (``task_pool:delays``: its robots.txt ``Crawl-delay``, or the taker's own delay), a
  failure pushes it out by its back-off;
* the stream ``task_pool``, read by the consumer group ``crawl``: the tasks handed out.
  Taking moves a ready site's head URL into the stream and reads it into the group for
  the taker (pending for it: the lease a crawler has always held, kept across its
  restart); it leaves the stream only in the transaction that records its URL in
  ``finish_URL`` (local_host/frontier/tasks.py).

A writer adds to the lists (:func:`queue_tasks`); an entry added to the stream by
anything else (``dedupnet reassign``, re-crawled seeds, an older version) is moved into
its site's list by the next take. Each step is one transaction or Lua script, so a URL
is always in exactly one place, and a crash at any point loses none and hands none out
twice. Quiescence is :func:`task_count` 0 (lists and stream empty).

Why lists of URLs and not an index of stream entries: an entry that waits in a
consumer group's pending list costs Redis some 130 bytes on top of the entry itself;
a URL in a site's list costs its own length and a byte or two, a third of that once
sealed in a block. The daemon's process keeps nothing per queued task or site.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dedupnet.adapters.storage.once import once
from dedupnet.adapters.storage.store import TASK_POOL, Batch, Steps, Store
from dedupnet.codec.urls import site_of

from . import site_blocks

#: The consumer group of every taker of a host on the ``task_pool`` stream.
GROUP = "crawl"
#: The consumer of the crawlers' group that moves entries added to the stream directly
#: into their sites' lists (it never holds one).
QUEUED = "queued"
#: Sorted set: site -> epoch ms from which it may hand out its next task.
SITES = f"{TASK_POOL}:sites"
#: Hash: site -> ms between two hand-outs of that site (robots.txt Crawl-delay), when
#: above the taker's own delay.
DELAYS = f"{TASK_POOL}:delays"
#: Prefix of the per-site lists of queued URLs, oldest first.
QUEUE = f"{TASK_POOL}:site:"
#: How many URLs the lists hold, all sites together.
QUEUED_COUNT = f"{TASK_POOL}:queued"
#: A stream of one entry, written with every batch of tasks queued: what an idle taker
#: waits on in Redis (``XREAD BLOCK``) to wake at once.
BELL = f"{TASK_POOL}:bell"
#: Stream entries moved into lists by one call: bounds the time one script holds Redis.
SORT_BATCH = 2000
#: Takes one call makes at most while it finds blocks to split at ready sites' heads.
SPLIT_ROUNDS = 4
#: Rounds :func:`drop` and :func:`unsort` make at most while a taker or the compactor
#: changes a block they are reading.
DROP_ROUNDS = 8
#: URLs one RPUSH carries (a script's call takes at most some 8,000 arguments).
PUSH_CHUNK = 1000
#: Site of a URL that has none (not a URL: its taker finishes it as failed).
NO_SITE = "?"

# A queued URL of the form ``http[s]://<its site><rest>`` is kept as one byte for the
# scheme and ``<rest>``: its list is its site's, so the prefix is known (some 20-30
# bytes a URL). Anything else (userinfo, a host not in lower case) is kept whole: a
# normalised URL never starts with byte 1 or 2. (The helpers every script below shares.)
_LUA = b"""
local function url_of(fields)
  if not fields then return nil end
  for i = 1, #fields, 2 do if fields[i] == 'u' then return fields[i + 1] end end
  return nil
end
local function site_of(url)
  local rest = string.match(url, '^%a[%w+.-]*://(.*)$')
  if not rest then return '?' end
  local auth = string.gsub(string.match(rest, '^[^/?#]*'), '^.*@', '')
  local host = string.match(auth, '^%[[^%]/?#@]*%]') or string.match(auth, '^[^:/?#@]*')
  return string.lower(host)
end
local function finish(stream, group, ids)  -- entries leave the group and the stream
  if #ids > 0 then
    redis.call('XACK', stream, group, unpack(ids))
    redis.call('XDEL', stream, unpack(ids))
  end
end
local function pack(url, site)
  for mark, scheme in pairs({[string.char(1)] = 'http://', [string.char(2)] = 'https://'}) do
    local head = scheme .. site
    if string.sub(url, 1, #head) == head then return mark .. string.sub(url, #head + 1) end
  end
  return url
end
local function unpack_url(packed, site)
  local b = string.byte(packed, 1)
  if b == 1 then return 'http://' .. site .. string.sub(packed, 2) end
  if b == 2 then return 'https://' .. site .. string.sub(packed, 2) end
  return packed
end
"""
_MARKS = (("\x01", "http://"), ("\x02", "https://"))


def pack(url: str, site: str) -> str:
    """A URL as its site's list keeps it (see ``_LUA``'s ``pack``)."""
    for mark, scheme in _MARKS:
        if url.startswith(scheme + site):
            return mark + url[len(scheme) + len(site):]
    return url


def unpack(packed: str, site: str) -> str:
    for mark, scheme in _MARKS:
        if packed.startswith(mark):
            return scheme + site + packed[1:]
    return packed

# KEYS: task_pool, sites, delays, queued count, bell, dirty; ARGV: group, queue prefix,
# taker, now ms, want, delay ms, burst, idle ms, sort batch, then (site, delay ms) pairs
# to record. Returns {next ready ms or -1, more to sort (0/1), the stream's last id, the
# bell's last id, n, n (site, block) pairs of ready sites whose head is a block, id,
# url, ...}.
_TAKE = _LUA + b"""
local stream, sites, delays, count, bell = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local dirty = KEYS[6]
local group, prefix, taker = ARGV[1], ARGV[2], ARGV[3]
local now, want, delay = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local burst, idle, batch = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
for i = 10, #ARGV, 2 do redis.call('HSET', delays, ARGV[i], ARGV[i + 1]) end
-- Entries added to the stream directly go to their sites' lists.
local read = {'XREADGROUP', 'GROUP', group, 'queued', 'COUNT', batch, 'STREAMS', stream, '>'}
local got = redis.pcall(unpack(read))
if type(got) == 'table' and got.err then
  if not string.find(got.err, 'NOGROUP') then return redis.error_reply(got.err) end
  redis.call('XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')  -- no taker has started yet
  got = redis.call(unpack(read))
end
local more = 0
if got then
  local ids, moved = {}, 0
  if #got[1][2] >= batch then more = 1 end
  for _, e in ipairs(got[1][2]) do
    ids[#ids + 1] = e[1]
    local url = url_of(e[2])
    if url then
      local site = site_of(url)
      redis.call('RPUSH', prefix .. site, pack(url, site))
      redis.call('ZADD', sites, 'NX', now, site)
      redis.call('SADD', dirty, site)
      moved = moved + 1
    end
  end
  if moved > 0 then redis.call('INCRBY', count, moved) end
  finish(stream, group, ids)
end
-- Hand out the heads of ready sites, those ready longest first (not while entries are
-- left to move: the taker's read below must find only its own).
-- A block at a site's head is left for the caller to split (local_host/frontier/site_blocks.py).
local taken, blocked = 0, {}
if want > 0 and more == 0 then
  local ready = redis.call('ZRANGEBYSCORE', sites, '-inf', now, 'LIMIT', 0, want)
  for _, site in ipairs(ready) do
    if taken >= want then break end
    local q = prefix .. site
    local gap = math.max(delay, tonumber(redis.call('HGET', delays, site) or '0'))
    local n = 0
    while n < (gap > 0 and 1 or burst) and taken < want do
      local url = redis.call('LINDEX', q, 0)
      if not url then break end
      if string.byte(url, 1) == 0 then
        blocked[#blocked + 1] = site; blocked[#blocked + 1] = url
        break
      end
      redis.call('LPOP', q)
      redis.call('XADD', stream, '*', 'u', unpack_url(url, site))
      n = n + 1; taken = taken + 1
    end
    if redis.call('LLEN', q) == 0 then
      redis.call('ZREM', sites, site)
    elseif n > 0 then
      redis.call('ZADD', sites, now + gap, site)
    end
  end
  if taken > 0 then redis.call('DECRBY', count, taken) end
end
local head = {-1, more, '0-0', '0-0', #blocked / 2}
for _, b in ipairs(blocked) do head[#head + 1] = b end
local first = redis.call('ZRANGE', sites, 0, 0, 'WITHSCORES')
if first[2] then head[1] = tonumber(first[2]) end
if taken > 0 then
  local mine = redis.call('XREADGROUP', 'GROUP', group, taker, 'COUNT', taken, 'STREAMS', stream, '>')
  local ids = {}
  for _, e in ipairs(mine[1][2]) do
    head[#head + 1] = e[1]; head[#head + 1] = url_of(e[2]); ids[#ids + 1] = e[1]
  end
  if idle > 0 then
    local claim = {'XCLAIM', stream, group, taker, 0}
    for _, id in ipairs(ids) do claim[#claim + 1] = id end
    claim[#claim + 1] = 'IDLE'; claim[#claim + 1] = idle; claim[#claim + 1] = 'JUSTID'
    redis.call(unpack(claim))
  end
end
local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
if last[1] then head[3] = last[1][1] end
local rung = redis.call('XREVRANGE', bell, '+', '-', 'COUNT', 1)
if rung[1] then head[4] = rung[1][1] end
return head
"""

# KEYS: task_pool, queued count; ARGV: group, queue prefix, then (site, packed URL, URL)
# triples. Removes each URL from its site's list and its entries from the stream;
# returns how many went.
_DROP = _LUA + b"""
local stream, count, group, prefix = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local queued, urls = 0, {}
for i = 3, #ARGV, 3 do
  queued = queued + redis.call('LREM', prefix .. ARGV[i], 0, ARGV[i + 1])
  urls[ARGV[i + 2]] = true
end
if queued > 0 then redis.call('DECRBY', count, queued) end
local ids = {}
for _, e in ipairs(redis.call('XRANGE', stream, '-', '+')) do
  if urls[url_of(e[2]) or ''] then ids[#ids + 1] = e[1] end
end
finish(stream, group, ids)
return queued + #ids
"""

# KEYS: task_pool, sites, queued count; ARGV: queue prefix, most sites. Moves the URLs of
# up to that many sites back into the stream (not read into any group); returns how
# many sites are left, or -1 if it met a block (and moved nothing of that site).
_UNSORT = _LUA + b"""
local stream, sites, count, prefix = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
for _, site in ipairs(redis.call('ZRANGE', sites, 0, tonumber(ARGV[2]) - 1)) do
  local urls = redis.call('LRANGE', prefix .. site, 0, -1)
  for _, url in ipairs(urls) do
    if string.byte(url, 1) == 0 then return -1 end  -- sealed since the caller unsealed it
  end
  for _, url in ipairs(urls) do redis.call('XADD', stream, '*', 'u', unpack_url(url, site)) end
  redis.call('DECRBY', count, #urls)
  redis.call('DEL', prefix .. site)
  redis.call('ZREM', sites, site)
end
return redis.call('ZCARD', sites)
"""


@dataclass(frozen=True)
class Pace:
    """How a taker spaces one site's tasks: ``delay`` seconds between two hand-outs of a
    site (its own politeness delay; a site's Crawl-delay raises it), and when that is
    0, ``burst`` tasks of a site at once (its per-site concurrency)."""

    delay: float = 0.0
    burst: int = 1


@dataclass
class Taken:
    """One take: the tasks ``(id, url)`` handed out, and the epoch seconds at which the
    next site becomes ready (None: no site has queued tasks); ``last`` is the stream's
    newest entry's id, to wait in Redis for what comes after it."""

    entries: list[tuple[bytes, str]]
    next_ready: float | None
    last: bytes = b"0-0"
    rung: bytes = b"0-0"  # the bell's newest entry


def take(store: Store, taker: str, count: int, pace: Pace = Pace(), *, group: str = GROUP,
         now: float | None = None, idle_ms: int = 0, delays: Mapping[str, float] | None = None) -> Taken:
    """:func:`take_steps` run here (the crawler drives it on trio)."""
    return store.drive(take_steps(store, taker, count, pace, group=group, now=now, idle_ms=idle_ms, delays=delays))


def take_steps(store: Store, taker: str, count: int, pace: Pace = Pace(), *, group: str = GROUP,
               now: float | None = None, idle_ms: int = 0,
               delays: Mapping[str, float] | None = None) -> Steps[Taken]:
    """Hand out up to ``count`` tasks of sites whose time has come, to ``taker`` (the
    entries become pending for it, with idle time ``idle_ms``). ``delays``: site ->
    seconds, Crawl-delays learned since the last take, recorded first. ``now`` (epoch
    seconds) is the caller's clock: a test drives the schedule with its own. Entries
    added to the stream directly are moved into their sites first, ``SORT_BATCH`` a call;
    a ``task_pool`` with no group yet (no taker has started) gets one."""
    now_ms = int((time.time() if now is None else now) * 1000)
    keys = (store.key(TASK_POOL), store.key(SITES), store.key(DELAYS), store.key(QUEUED_COUNT), store.key(BELL),
            store.key(site_blocks.DIRTY))
    recorded = [x for site, seconds in (delays or {}).items() for x in (site, int(seconds * 1000))]
    entries: list[tuple[bytes, str]] = []
    rounds = 0
    while True:
        reply = yield from store.command_steps(
            b"EVAL", _TAKE, len(keys), *keys, group, store.key(QUEUE), taker, now_ms, max(0, count - len(entries)),
            int(pace.delay * 1000), max(1, pace.burst), idle_ms, SORT_BATCH, *recorded)
        recorded = []
        if int(reply[1]):
            continue  # entries added to the stream directly are still being sorted
        head, last, rung, blocked = int(reply[0]), reply[2], reply[3], 5 + 2 * int(reply[4])
        entries += [(reply[i], reply[i + 1].decode("utf-8", "replace")) for i in range(blocked, len(reply), 2)]
        rounds += 1
        if blocked == 5 or len(entries) >= count or rounds == SPLIT_ROUNDS:
            break
        # Ready sites whose head is a block: split a few URLs off each, and take again.
        batch = store.batch()
        for i in range(5, blocked, 2):
            batch.add(*site_blocks.split_args(store.key(QUEUE) + reply[i].decode(), reply[i + 1]))
        yield batch
    return Taken(entries, None if head < 0 else head / 1000, last, rung)


def _site(url: str) -> str:
    try:
        return site_of(url)
    except ValueError:
        return NO_SITE


def queue_tasks(batch: Batch, store: Store, urls: Sequence[str], number: int | None = None) -> None:
    """Queue into ``batch`` new tasks (normalised URLs) in their sites' lists: a site
    new to the frontier is ready at once. With ``number`` (the task message's), the
    write happens once however often the batch is sent: a second ``RPUSH`` would queue
    every URL twice."""
    key, now_ms = store.key, int(time.time() * 1000)
    by_site: dict[str, list[str]] = {}
    for url in urls:
        by_site.setdefault(_site(url), []).append(url)
    commands: list[tuple] = []
    for site, queued in by_site.items():
        for i in range(0, len(queued), PUSH_CHUNK):
            commands.append((b"RPUSH", key(QUEUE) + site, *[pack(url, site) for url in queued[i : i + PUSH_CHUNK]]))
    # One ZADD and one SADD for many sites (a broad crawl's task is a URL or two per
    # site), in chunks: a script (once) unpacks at most some thousands of arguments.
    names = list(by_site)
    for i in range(0, len(names), PUSH_CHUNK):
        chunk = names[i : i + PUSH_CHUNK]
        commands.append((b"ZADD", key(SITES), b"NX", *[arg for site in chunk for arg in (now_ms, site)]))
        commands.append((b"SADD", key(site_blocks.DIRTY), *chunk))
    commands.append((b"INCRBY", key(QUEUED_COUNT), len(urls)))
    commands.append((b"XADD", key(BELL), b"MAXLEN", 1, b"*", b"n", len(urls)))
    if number is None:
        for command in commands:
            batch.add(*command)
        return
    # The URLs too: a center that lost its store may number other tasks alike.
    digest = hashlib.blake2b("\n".join(urls).encode(), digest_size=8).hexdigest()
    once(batch, store, f"tasks:{number}:{digest}", commands)


def task_count(store: Store) -> int:
    """Tasks of the host not crawled yet: queued in the lists and handed out (0: the
    host's frontier is empty)."""
    return store.drive(task_count_steps(store))


def task_count_steps(store: Store) -> Steps[int]:
    batch = store.batch()
    count = count_tasks(batch, store)
    return count((yield batch))


def count_tasks(batch: Batch, store: Store) -> Callable[[list], int]:
    """Queue into ``batch`` the count of :func:`task_count` (to share another read's round
    trip); returns what reads it from the batch's results."""
    handed = batch.add(b"XLEN", store.key(TASK_POOL))
    queued = batch.add(b"GET", store.key(QUEUED_COUNT))
    return lambda results: int(results[handed]) + int(results[queued] or 0)


def _per_site(store: Store, command: bytes, *args, only: Sequence[str] | None = None) -> list[tuple[str, Any]]:
    """``command`` on every site's list (pipelined, 10,000 a round trip), or on those
    ``only``: a read of every site, for tools and tests, not for every second."""
    names = list(only) if only is not None else [
        n.decode() for n in store.command(b"ZRANGE", store.key(SITES), 0, -1)]
    out: list[tuple[str, object]] = []
    for i in range(0, len(names), 10_000):
        batch = store.batch()
        for name in names[i : i + 10_000]:
            batch.add(command, store.key(QUEUE) + name, *args)
        out += zip(names[i : i + 10_000], store.execute(batch))
    return out


def queued_urls(store: Store) -> list[str]:
    """Every URL queued in the sites' lists (not handed out), site by site."""
    return [unpack(u.decode(), site) for site, elements in _per_site(store, b"LRANGE", 0, -1)
            for u in site_blocks.urls_of(elements)]


def queued_by_site(store: Store) -> list[tuple[str, int]]:
    """Every site with queued tasks and how many."""
    return [(site, sum(map(site_blocks.count_of, elements))) for site, elements in _per_site(store, b"LRANGE", 0, -1)]


def compact_steps(store: Store) -> Steps[int]:
    """One round of sealing the plain URLs queued lately into blocks
    (local_host/frontier/site_blocks.py); 0: nothing was left to seal."""
    return (yield from site_blocks.compact_steps(store, store.key(QUEUE)))


def mark_all_dirty(store: Store) -> None:
    """Every site with queued URLs to be looked at by the compactor (after a restart:
    URLs queued by a version that did not seal them, or by one stopped before it did)."""
    names = store.command(b"ZRANGE", store.key(SITES), 0, -1)
    for i in range(0, len(names), PUSH_CHUNK):
        store.command(b"SADD", store.key(site_blocks.DIRTY), *names[i:i + PUSH_CHUNK])


def drop(store: Store, urls: Sequence[str], group: str = GROUP) -> int:
    """Take ``urls`` out of task_pool wherever they are: queued in their site's list,
    or in the stream (handed out: a page already on the wire is fetched all the same).
    Exact whatever a taker or the compactor does meanwhile: it goes round until no
    block holds one. Returns how many went."""
    args: list = []
    by_site: dict[str, set[bytes]] = {}
    for url in dict.fromkeys(urls):
        site = _site(url)
        packed = pack(url, site)
        args += [site, packed, url]
        by_site.setdefault(site, set()).add(packed.encode())
    if not args:
        return 0
    dropped = 0
    for _ in range(DROP_ROUNDS):
        dropped += int(store.command(b"EVAL", _DROP, 2, store.key(TASK_POOL), store.key(QUEUED_COUNT), group,
                                     store.key(QUEUE), *args))
        from_blocks = _drop_from_blocks(store, by_site)
        if from_blocks is None:
            break
        dropped += from_blocks
    return dropped


def _drop_from_blocks(store: Store, by_site: Mapping[str, set[bytes]]) -> int | None:
    """Take the packed URLs ``by_site`` out of the blocks of their sites' lists (each
    block that holds some, re-deflated without them); returns how many went, None if no
    block held any. A block a taker split meanwhile is left as it is: the URLs it held
    are plain now, for :func:`drop`'s next round, as are any the compactor sealed after
    that round's plain drop."""
    lists = dict(_per_site(store, b"LRANGE", 0, -1, only=list(by_site)))
    batch = store.batch()
    for site, elements in lists.items():
        replacements: list[tuple[bytes, bytes, int]] = []
        for element in filter(site_blocks.is_block, elements):
            urls = site_blocks.decode(element)
            kept = [u for u in urls if u not in by_site[site]]
            if len(kept) < len(urls):
                replacements.append((element, site_blocks.encode(kept) if kept else b"", len(urls) - len(kept)))
        if replacements:
            batch.add(*site_blocks.replace_args(store.key(QUEUE) + site, store.key(QUEUED_COUNT), replacements))
    return sum(map(int, store.execute(batch))) if len(batch) else None


def unsort(store: Store, sites_per_call: int = 500) -> None:
    """Move every queued URL back into the stream, not handed out to anyone: before the
    stream is renamed or read whole (``dedupnet reassign``, a host handing its tasks
    back). A taker running meanwhile sorts them again; those callers stop it first."""
    keys = (store.key(TASK_POOL), store.key(SITES), store.key(QUEUED_COUNT))
    left = -1
    while left:
        if left < 0:
            _unseal_all(store)
        left = int(store.command(b"EVAL", _UNSORT, 3, *keys, store.key(QUEUE), sites_per_call))


def _unseal_all(store: Store) -> None:
    """Every site's list plain again, one URL an element (what a Lua script can read)."""
    for _ in range(DROP_ROUNDS):
        batch = store.batch()
        for site, elements in _per_site(store, b"LRANGE", 0, -1):
            if any(map(site_blocks.is_block, elements)):
                batch.add(*site_blocks.relist_args(store.key(QUEUE) + site, elements, site_blocks.urls_of(elements)))
        if not len(batch) or all(map(int, store.execute(batch))):
            return


def wait_for_new(store: Store, taken: Taken, block_ms: int) -> bool:
    """:func:`wait_for_new_steps` run here."""
    return store.drive(wait_for_new_steps(store, taken, block_ms))


def wait_for_new_steps(store: Store, taken: Taken, block_ms: int) -> Steps[bool]:
    """Wait in Redis, at most ``block_ms``, for tasks newer than ``taken``: queued (the
    bell rings) or added to the stream directly. How an idle taker wakes at once. True
    if something came (False: the wait ran out). The wait holds its connection, so
    ``block_ms`` stays well under the store's ``socket_timeout``."""
    return bool((yield from store.command_steps(b"XREAD", b"COUNT", 1, b"BLOCK", max(1, block_ms), b"STREAMS",
                                                store.key(TASK_POOL), store.key(BELL), taken.last, taken.rung)))


def back_off(store: Store, site: str, until: float) -> None:
    """Hand out nothing of ``site`` before ``until`` (epoch seconds): the back-off after
    a 5xx, a timeout or a Retry-After, for every taker of the host."""
    store.command(b"ZADD", store.key(SITES), b"XX", b"GT", int(until * 1000), site)


@dataclass(frozen=True)
class SiteCounts:
    """The frontier at a glance (status page, /metrics)."""

    sites_queued: int  # sites with tasks queued
    sites_waiting: int  # of those, sites whose politeness allows none now
    #: Seconds the site that has been ready longest has waited for a taker (0: none
    #: ready): grows when the fetch slots, not politeness, hold the crawl back.
    ready_wait: float


def counts(store: Store, now: float | None = None) -> SiteCounts:
    now = time.time() if now is None else now
    batch = store.batch()
    batch.add(b"ZCARD", store.key(SITES))
    batch.add(b"ZCOUNT", store.key(SITES), f"({int(now * 1000)}".encode(), b"+inf")
    batch.add(b"ZRANGE", store.key(SITES), 0, 0, b"WITHSCORES")
    queued, waiting, first = store.execute(batch)
    wait = max(0.0, now - float(first[1]) / 1000) if first else 0.0
    return SiteCounts(int(queued), int(waiting), wait)

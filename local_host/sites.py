"""``task_pool`` by site: the one place a host's tasks are taken from, by every crawler
front end (dedupnet's crawler, the Scrapy scheduler, the URLFrontier service).

``task_pool`` stays what the paper calls it (§1.1, the host's queue of tasks): a stream,
read by the consumer group ``crawl``, whose entries leave only in the transaction that
records their URL in ``finish_URL`` (local_host/tasks.py). What this module adds is the
order they are handed out in. A crawler that read the stream first in, first out held
its window of leases full of one big site's pages, each waiting out that site's
politeness delay, while its fetch slots stood idle and every other site waited behind
them. So, as BUbiNG's workbench and Heritrix's per-host queues do, tasks wait **by
site**, and a site hands out a task only when its politeness allows:

* every new entry is first read into the group by the consumer ``queued`` (pending for
  it: durable, and never read again by ``>``), and its id appended to its site's list
  ``task_pool:site:<site>``;
* ``task_pool:sites`` (a sorted set) holds each site with queued tasks, scored by the
  time (ms) it may next hand one out: a hand-out moves that time on by the site's delay
  (``task_pool:delays``, its robots.txt ``Crawl-delay``, or the taker's own delay), a
  failure pushes it out by its back-off;
* taking claims the head of each ready site's list from ``queued`` for the taker (an
  ``XCLAIM``: the lease a crawler has always held), the sites that have waited longest
  first, so a task never holds a lease while it waits for its site.

Both steps are one Lua script each, so a queued entry is always in exactly one site's
list, and a crash at any point loses none. Ids in a list whose entry has gone (handed
back, reassigned, deleted under us) are skipped when they come up: an entry is claimed
only while ``queued`` still holds it, so nothing is handed out twice.

Memory: the daemon keeps no per-site state for queued tasks (Redis does); Redis keeps,
besides the stream entry, an id in a list (~18 bytes) and a member per site with work.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from dedupnet.adapters.store import TASK_POOL, Batch, Store

#: The consumer of the crawlers' group that holds every task waiting in a site's list.
QUEUED = "queued"
#: Sorted set: site -> epoch ms from which it may hand out its next task.
SITES = f"{TASK_POOL}:sites"
#: Hash: site -> ms between two hand-outs of that site (robots.txt Crawl-delay), when
#: above the taker's own delay.
DELAYS = f"{TASK_POOL}:delays"
#: Prefix of the per-site lists of queued entry ids, oldest first.
QUEUE = f"{TASK_POOL}:site:"
#: New entries sorted into site lists by one call: bounds the time one script holds Redis.
SORT_BATCH = 2000

# KEYS: task_pool, sites, delays; ARGV: group, queue prefix, taker, now ms, want,
# delay ms, burst, idle ms, sort batch, then (site, delay ms) pairs to record.
# Returns {next ready ms or -1, more to sort (0/1), the stream's last id, id, url, ...}.
_TAKE = b"""
local stream, sites, delays = KEYS[1], KEYS[2], KEYS[3]
local group, prefix, taker = ARGV[1], ARGV[2], ARGV[3]
local now, want, delay = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local burst, idle, batch = tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])
for i = 10, #ARGV, 2 do redis.call('HSET', delays, ARGV[i], ARGV[i + 1]) end
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
local more = 0
local read = {'XREADGROUP', 'GROUP', group, 'queued', 'COUNT', batch, 'STREAMS', stream, '>'}
local got = redis.pcall(unpack(read))
if type(got) == 'table' and got.err then
  if not string.find(got.err, 'NOGROUP') then return redis.error_reply(got.err) end
  redis.call('XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')  -- no crawler has started yet
  got = redis.call(unpack(read))
end
if got then
  local entries = got[1][2]
  if #entries >= batch then more = 1 end
  for _, e in ipairs(entries) do
    local url = url_of(e[2])
    if url then
      local site = site_of(url)
      redis.call('RPUSH', prefix .. site, e[1])
      redis.call('ZADD', sites, 'NX', now, site)
    else
      redis.call('XACK', stream, group, e[1])
    end
  end
end
local out = {}
if want > 0 then
  local ready = redis.call('ZRANGEBYSCORE', sites, '-inf', now, 'LIMIT', 0, want)
  local taken = 0
  for _, site in ipairs(ready) do
    if taken >= want then break end
    local q = prefix .. site
    local own = tonumber(redis.call('HGET', delays, site) or '0')
    local gap = math.max(delay, own)
    local n = 0
    while n < (gap > 0 and 1 or burst) and taken < want do
      local eid = redis.call('LPOP', q)
      if not eid then break end
      if #redis.call('XPENDING', stream, group, eid, eid, 1, 'queued') > 0 then
        local c = redis.call('XCLAIM', stream, group, taker, 0, eid, 'IDLE', idle)
        local url = c[1] and url_of(c[1][2])
        if url then
          out[#out + 1] = eid; out[#out + 1] = url
          n = n + 1; taken = taken + 1
        else
          redis.call('XACK', stream, group, eid)
        end
      end
    end
    if redis.call('LLEN', q) == 0 then
      redis.call('ZREM', sites, site)
    elseif n > 0 then
      redis.call('ZADD', sites, now + gap, site)
    end
  end
end
local first = redis.call('ZRANGE', sites, 0, 0, 'WITHSCORES')
local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
local head = {first[2] and tonumber(first[2]) or -1, more, last[1] and last[1][1] or '0-0'}
for _, v in ipairs(out) do head[#head + 1] = v end
return head
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
    """One take: the tasks ``(id, url)`` handed out, the epoch seconds at which the next
    site becomes ready (None: no site has queued tasks), and whether new entries are
    still waiting to be sorted into their sites (take again at once); ``last`` is the
    newest entry's id, to wait in Redis for what comes after it."""

    entries: list[tuple[bytes, str]]
    next_ready: float | None
    more: bool
    last: bytes = b"0-0"


def take(store: Store, group: str, taker: str, count: int, pace: Pace = Pace(), *,
         now: float | None = None, idle_ms: int = 0, delays: Mapping[str, float] | None = None) -> Taken:
    """Hand out up to ``count`` tasks of sites whose time has come, to ``taker`` (the
    entries become pending for it, with idle time ``idle_ms``). ``delays``: site ->
    seconds, Crawl-delays learned since the last take, recorded first. ``now`` (epoch
    seconds) is the caller's clock: a test drives the schedule with its own."""
    now_ms = int((time.time() if now is None else now) * 1000)
    args: list = [b"EVAL", _TAKE, 3, store.key(TASK_POOL), store.key(SITES), store.key(DELAYS),
                  group, store.key(QUEUE), taker, now_ms, max(0, count), int(pace.delay * 1000),
                  max(1, pace.burst), idle_ms, SORT_BATCH]
    for site, seconds in (delays or {}).items():
        args += [site, int(seconds * 1000)]
    reply = store.command(*args)
    head, more, last = int(reply[0]), bool(int(reply[1])), reply[2]
    entries = [(reply[i], reply[i + 1].decode("utf-8", "replace")) for i in range(3, len(reply), 2)]
    return Taken(entries, None if head < 0 else head / 1000, more, last)


def sort_new(batch: Batch, store: Store, group: str, count: int) -> None:
    """Queue into ``batch``, after the ``XADD`` of ``count`` new tasks, their sorting
    into their sites: a writer that sorts what it adds keeps a big backlog from standing
    between the frontier and the sites queued after it."""
    batch.add(b"EVAL", _TAKE, 3, store.key(TASK_POOL), store.key(SITES), store.key(DELAYS), group,
              store.key(QUEUE), QUEUED, int(time.time() * 1000), 0, 0, 1, 0, max(1, count))


def wait_for_new(store: Store, after: bytes, block_ms: int) -> None:
    """Wait in Redis, at most ``block_ms``, for an entry of ``task_pool`` newer than
    ``after`` (read without taking): how an idle taker wakes at once for new work."""
    store.command(b"XREAD", b"COUNT", 1, b"BLOCK", max(1, block_ms), b"STREAMS", store.key(TASK_POOL), after)


def back_off(store: Store, site: str, until: float) -> None:
    """Hand out nothing of ``site`` before ``until`` (epoch seconds): the back-off after
    a 5xx, a timeout or a Retry-After, for every taker of the host."""
    store.command(b"ZADD", store.key(SITES), b"XX", b"GT", int(until * 1000), site)


@dataclass(frozen=True)
class SiteCounts:
    """The frontier at a glance (status page, /metrics)."""

    sites_queued: int  # sites with tasks waiting
    sites_waiting: int  # of those, sites whose politeness does not allow one now
    oldest_task_age: float  # seconds the oldest queued task has waited (0: none)


def counts(store: Store, group: str, now: float | None = None) -> SiteCounts:
    now = time.time() if now is None else now
    batch = store.batch()
    batch.add(b"ZCARD", store.key(SITES))
    batch.add(b"ZCOUNT", store.key(SITES), f"({int(now * 1000)}".encode(), b"+inf")
    batch.add(b"XPENDING", store.key(TASK_POOL), group, b"-", b"+", 1, QUEUED)
    queued, waiting, oldest = store.execute(batch)
    age = 0.0
    if isinstance(oldest, Exception):  # no task_pool group yet: nothing queued
        if "NOGROUP" not in str(oldest):
            raise oldest
    elif oldest:
        age = max(0.0, now - int(oldest[0][0].split(b"-")[0]) / 1000)
    return SiteCounts(int(queued), int(waiting), age)


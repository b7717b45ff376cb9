"""How a site's list of queued URLs keeps them in little space: runs of URLs sealed into
deflated blocks.

A broad crawl finds many more URLs than it fetches, so the queue, not the crawled set,
is what grows. One URL an element costs Redis its own length (some 30 bytes once the
site is dropped, local_host/frontier/sites.py); the URLs of one site share most of their words,
so a block of :data:`BLOCK` of them deflates to about a third of that.

An element of a site's list is either one URL (packed: :func:`local_host.frontier.sites.pack`)
or a block, ``\\0<count>:<skip>:<raw deflate of its packed URLs joined by newlines>``,
whose first ``skip`` URLs were taken already. Only the ends of a list are plain. A writer appends plain URLs in its own transaction, as it
always did, and marks the site in :data:`DIRTY`; :func:`compact_steps` (run by the host
daemon) seals a site's plain tail into blocks, topping up the last block while it is
not full; a taker that finds a block at a site's head splits off its next :data:`SPLIT`
URLs (:func:`split_args`), which moves the block's ``skip`` on and deflates nothing. Redis' Lua cannot inflate, so the work is done
here and written with a compare-and-set: a script replaces the elements only if they
are still those that were read (by SHA-1), so a taker, a writer or another compactor
working meanwhile turns the step into a no-op to be done again, never a lost or a
doubled URL. Every step keeps each URL in exactly one place, in its order.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Sequence

from dedupnet.adapters.storage.store import TASK_POOL, Steps, Store

#: Set of sites whose lists had plain URLs appended since they were last compacted.
DIRTY = f"{TASK_POOL}:dirty"
#: URLs in a full block: more deflate better (measured in docs/BENCHMARKS.md "A compact
#: queue") but cost more to split one URL off the head.
BLOCK = 64
#: URLs a taker turns plain at a site's head at once: each split inflates the block,
#: so a few at a time keeps that cost per URL small without many plain URLs a site.
SPLIT = 8
#: Plain URLs at a site's tail worth a compaction; fewer wait for more.
SEAL_MIN = 8
#: Sites one compaction round takes from :data:`DIRTY`: a round deflates in the daemon's
#: own thread, so it is kept to some milliseconds.
COMPACT_SITES = 100
#: Elements first read from a site's tail (its plain URLs since the last round, and the
#: block before them); read again wider when the plain run is longer.
TAIL_READ = 4 * SEAL_MIN
_MARK = b"\x00"
_SEP = b"\n"

# The digest both sides compute of a run of elements: each one's length, then itself.
_LUA = b"""
local function digest(elements)
  local parts = {}
  for i, e in ipairs(elements) do parts[#parts + 1] = #e .. ':' .. e end
  return redis.sha1hex(table.concat(parts))
end
"""

# KEYS: a site's list; ARGV: n, digest of its last n elements, the elements to put in
# their place. Returns 1 if they were still those, else 0 (nothing done).
_SEAL = _LUA + b"""
local q, n = KEYS[1], tonumber(ARGV[1])
local tail = redis.call('LRANGE', q, -n, -1)
if #tail ~= n or digest(tail) ~= ARGV[2] then return 0 end
redis.call('LTRIM', q, 0, -n - 1)
for i = 3, #ARGV, 1000 do redis.call('RPUSH', q, unpack(ARGV, i, math.min(i + 999, #ARGV))) end
return 1
"""

# KEYS: a site's list; ARGV: the SHA-1 of its head element, what stays of it ('' for
# nothing), the URLs split off it. Returns 1 if the head was still that block, else 0.
_SPLIT = b"""
local q = KEYS[1]
local head = redis.call('LINDEX', q, 0)
if not head or redis.sha1hex(head) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('LPOP', q) else redis.call('LSET', q, 0, ARGV[2]) end
local urls = {}
for i = #ARGV, 3, -1 do urls[#urls + 1] = ARGV[i] end
if #urls > 0 then redis.call('LPUSH', q, unpack(urls)) end
return 1
"""

# KEYS: a site's list; ARGV: digest of the whole list, the elements to put in its place.
# Returns 1 if the list was still that, else 0.
_RELIST = _LUA + b"""
local q = KEYS[1]
if digest(redis.call('LRANGE', q, 0, -1)) ~= ARGV[1] then return 0 end
redis.call('DEL', q)
for i = 2, #ARGV, 1000 do redis.call('RPUSH', q, unpack(ARGV, i, math.min(i + 999, #ARGV))) end
return 1
"""

# KEYS: a site's list, the queued count; ARGV: (SHA-1 of a block, what replaces it or
# '' for nothing, URLs it loses) triples. Each block still in the list is replaced;
# returns how many URLs went.
_REPLACE = b"""
local q, count = KEYS[1], KEYS[2]
local want, lost = {}, 0
for i = 1, #ARGV, 3 do want[ARGV[i]] = {ARGV[i + 1], tonumber(ARGV[i + 2])} end
local gone = string.char(0) .. 'gone'
for i, e in ipairs(redis.call('LRANGE', q, 0, -1)) do
  if string.byte(e, 1) == 0 then
    local w = want[redis.sha1hex(e)]
    if w then
      redis.call('LSET', q, i - 1, w[1] == '' and gone or w[1])
      lost = lost + w[2]
    end
  end
end
redis.call('LREM', q, 0, gone)
if lost > 0 then redis.call('DECRBY', count, lost) end
return lost
"""


def is_block(element: bytes) -> bool:
    return element[:1] == _MARK


def _header(element: bytes) -> tuple[int, int, int]:
    """A block's URLs in all, those taken already, and where its deflated data starts."""
    count_end = element.index(b":")
    skip_end = element.index(b":", count_end + 1)
    return int(element[1:count_end]), int(element[count_end + 1:skip_end]), skip_end + 1


def count_of(element: bytes) -> int:
    """URLs an element holds."""
    if not is_block(element):
        return 1
    count, skip, _ = _header(element)
    return count - skip


def encode(packed: Sequence[bytes]) -> bytes:
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    return _MARK + b"%d:0:" % len(packed) + deflate.compress(_SEP.join(packed)) + deflate.flush()


def decode(element: bytes) -> list[bytes]:
    """The packed URLs of an element, oldest first."""
    if not is_block(element):
        return [element]
    _, skip, start = _header(element)
    return zlib.decompress(element[start:], -15).split(_SEP)[skip:]


def urls_of(elements: Iterable[bytes]) -> list[bytes]:
    return [url for element in elements for url in decode(element)]


def blocks(packed: Sequence[bytes]) -> list[bytes]:
    """``packed`` URLs as full blocks, the last one partial."""
    return [encode(packed[i:i + BLOCK]) for i in range(0, len(packed), BLOCK)]


def digest(elements: Sequence[bytes]) -> str:
    """What ``_LUA``'s ``digest`` computes of ``elements``."""
    return hashlib.sha1(b"".join(b"%d:%s" % (len(e), e) for e in elements)).hexdigest()


def _plain(element: bytes) -> bool:
    """A URL that may go into a block (one with a newline in it, which no normalised
    URL has, stays as it is)."""
    return not is_block(element) and _SEP not in element


def plan_seal(tail: Sequence[bytes], whole: bool) -> tuple[int, str, list[bytes]] | None:
    """What to seal at the end of a list whose last elements are ``tail`` (``whole``:
    the whole list): ``(n, digest, new)`` puts ``new`` in place of its last ``n``
    elements; None: nothing worth it yet. The run sealed is the plain URLs at the end
    and the block before them if it is not full (topped up), never more: the URLs a
    taker split off a block before that one stay plain at the head, not sealed only to
    be split again. Raises :class:`LookFurther` when the run may begin before ``tail``."""
    start = len(tail)
    while start > 0 and _plain(tail[start - 1]):
        start -= 1
    if start > 0 and is_block(tail[start - 1]) and count_of(tail[start - 1]) < BLOCK:
        start -= 1
    if start == 0 and not whole:
        raise LookFurther
    run = tail[start:]
    if sum(1 for e in run if not is_block(e)) < SEAL_MIN:
        return None
    return len(run), digest(run), blocks(urls_of(run))


class LookFurther(Exception):
    """The plain run at a list's tail is longer than what was read."""


def compact_steps(store: Store, queue: str, most: int = COMPACT_SITES) -> Steps[int]:
    """One round of sealing: up to ``most`` dirty sites' plain tails (lists ``queue`` +
    site) into blocks. A site whose step lost a race is marked dirty again for the next
    round. Returns how many sites were taken (0: nothing was dirty)."""
    batch = store.batch()
    popped = batch.add(b"SPOP", store.key(DIRTY), most)
    names = [n.decode() for n in (yield batch)[popped] or []]
    reads = {name: TAIL_READ for name in names}
    retry: list[str] = []
    while reads:
        batch = store.batch()
        read = {name: (n, batch.add(b"LRANGE", queue + name, -n, -1)) for name, n in reads.items()}
        results = yield batch
        reads, seals = {}, []
        for name, (n, tail) in read.items():
            try:  # fewer elements than asked for: that is the whole list
                plan = plan_seal(results[tail], whole=len(results[tail]) < n)
            except LookFurther:
                reads[name] = 8 * len(results[tail])
                continue
            if plan is not None:
                n, run_digest, new = plan
                seals.append((name, (b"EVAL", _SEAL, 1, queue + name, n, run_digest, *new)))
        if seals:
            batch = store.batch()
            for _, command in seals:
                batch.add(*command)
            replies = yield batch
            retry += [name for (name, _), done in zip(seals, replies) if not int(done)]
    if retry:
        batch = store.batch()
        batch.add(b"SADD", store.key(DIRTY), *retry)
        yield batch
    return len(names)


def split_args(key: bytes | str, head: bytes) -> tuple:
    """The command that turns the next :data:`SPLIT` URLs of the block ``head`` at the
    head of the list ``key`` plain (a no-op if the head has changed)."""
    count, skip, start = _header(head)
    urls = decode(head)[:SPLIT]
    rest = _MARK + b"%d:%d:" % (count, skip + len(urls)) + head[start:] if skip + len(urls) < count else b""
    return (b"EVAL", _SPLIT, 1, key, hashlib.sha1(head).hexdigest(), rest, *urls)


def relist_args(key: bytes | str, elements: Sequence[bytes], new: Sequence[bytes]) -> tuple:
    """The command that puts ``new`` in place of the whole list ``key`` if it still holds
    ``elements``."""
    return (b"EVAL", _RELIST, 1, key, digest(elements), *new)


def replace_args(key: bytes | str, count_key: bytes | str, replacements: Sequence[tuple[bytes, bytes, int]]) -> tuple:
    """The command that replaces each block ``old`` of the list ``key`` still there by
    ``new`` (b'': removes it), ``lost`` URLs fewer queued: ``(old, new, lost)``."""
    args: list = []
    for old, new, lost in replacements:
        args += [hashlib.sha1(old).hexdigest(), new, lost]
    return (b"EVAL", _REPLACE, 2, key, count_key, *args)

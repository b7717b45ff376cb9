"""A local host's pools in Redis (paper §1.1): where the host core's actions become writes.

``URL_pool`` is a stream read by the consumer group ``dedup``: an entry the walker has
taken stays in the stream (in the group's pending list) until it leaves for good —
crawled already, or carried by a frame the center acknowledged (gap 7). Frames sent
and not yet acknowledged are kept in ``URL_pool:unacked`` (number -> frame bytes) and
``URL_pool:unacked_ids`` (number -> the entry ids it carries), to be sent again after
a restart. ``task_pool`` is a stream the crawler consumes; ``task_pool:fp`` the
fingerprints of the URLs queued there and not yet crawled (a crawled one is in
``finish_URL`` instead): exact mode answers "seen" from both.

With a re-crawl policy (``recrawl_after``, dedupnet/adapters/storage/recrawl.py) ``finish_URL`` is an
:class:`~dedupnet.adapters.storage.recrawl.AgedSet` (a URL counts as crawled for its age only):
a URL admitted again after its age is queued again, while a task sent again because its
ack was lost is still recognised, by either set.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson
from redis.exceptions import ResponseError

from dedupnet.adapters.storage.once import once
from dedupnet.adapters.storage.recrawl import AgedSet
from dedupnet.codec.ages import RecrawlPolicy
from dedupnet.adapters.storage.watermark import tagged
from dedupnet.adapters.storage.store import FINISH_URL, TASK_POOL, URL_POOL, Batch, CoreWrites, Steps, Store
from dedupnet.codec import wire
from dedupnet.codec.messages import Done
from dedupnet.codec.numbers import make_number
from dedupnet.codec.urls import URLGate, fingerprint_many

from . import protocol as hp
from .frontier import sites

GROUP = "dedup"
WALKER = "walker"
UNACKED = f"{URL_POOL}:unacked"
UNACKED_IDS = f"{URL_POOL}:unacked_ids"
TASK_FP = f"{TASK_POOL}:fp"
#: The host's re-crawl policy as its daemon runs it (JSON; absent: URLs never age), for
#: crawlers in other processes: how a task is finished depends on it.
RECRAWL_POLICY = "recrawl_policy"


def publish_recrawl(store: Store, policy: RecrawlPolicy | None) -> None:
    """Say in the host's Redis which re-crawl policy its daemon runs (at every start)."""
    if policy is None:
        store.command(b"DEL", store.key(RECRAWL_POLICY))
    else:
        store.command(b"SET", store.key(RECRAWL_POLICY), orjson.dumps({"after": policy.after, "sites": policy.sites}))


def published_recrawl(store: Store) -> RecrawlPolicy | None:
    """The re-crawl policy the host's daemon said it runs (None: URLs never age)."""
    raw = store.command(b"GET", store.key(RECRAWL_POLICY))
    if not raw:
        return None
    value = orjson.loads(raw)
    return RecrawlPolicy(value["after"], tuple((glob, age) for glob, age in value["sites"]))
#: The last frames the center acknowledged (newest first), tagged with the center's
#: watermark step heard then: sent again if the center's store comes back behind.
RELEASED = f"{URL_POOL}:released"

#: Raise the sequence counter to at least ARGV[1], then reserve ARGV[2] numbers (INCRBY).
RAISE_AND_RESERVE = (b"local c = tonumber(redis.call('GET', KEYS[1]) or '0') "
                     b"if c < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end "
                     b"return redis.call('INCRBY', KEYS[1], ARGV[2])")

#: The finished tasks' URLs not yet in a report to the center, oldest first (a list):
#: written with ``finish_URL`` (local_host/frontier/tasks.py), taken into a report by the daemon.
TASKS_DONE = "tasks_done"
#: Tasks that moved to other hosts while this one was away, to take out of task_pool
#: (the daemon does, before they are crawled: local_host/daemon.py).
TASKS_MOVED = "tasks_moved"

WRITES = (hp.SaveUnacked, hp.Release, hp.Forget, hp.AddTasks, hp.TakeDone, hp.DropTasks)


def _stream_id(raw: bytes) -> tuple[int, int]:
    ms, _, seq = raw.partition(b"-")
    return int(ms), int(seq or 0)


class HostPools(CoreWrites):
    writes = WRITES

    def __init__(self, store: Store, *, exact: bool, recrawl: RecrawlPolicy | None = None,
                 clock: Callable[[], float] = time.time, release_log: int = 0,
                 center_step: Callable[[], int] = lambda: 0):
        self.store = store
        self.exact = exact
        #: Acknowledged frames kept for a re-offer (0: none), and the center's step heard.
        self.release_log = release_log
        self.center_step = center_step
        #: ``finish_URL`` under a re-crawl policy; None: the plain fingerprint set.
        self.finished = AgedSet(store, FINISH_URL, recrawl, clock) if recrawl is not None else None

    def setup(self) -> None:
        self.store.ensure_group(URL_POOL, GROUP)
        publish_recrawl(self.store, self.finished.policy if self.finished is not None else None)

    # -- the core's actions ------------------------------------------------------------
    # Each protocol-path operation is also a sans-I/O generator (``*_steps``, see
    # dedupnet.adapters.storage.store.Steps): the daemons drive those on trio with AsyncStore.drive, no
    # worker thread; the plain methods drive them synchronously (CoreWrites: apply).
    def _queue(self, batch: Batch, writes: list) -> None:
        key = self.store.key
        for a in writes:
            if isinstance(a, hp.SaveUnacked):
                batch.add(b"HSET", key(UNACKED), a.number, a.frame)
                batch.add(b"HSET", key(UNACKED_IDS), a.number, b" ".join(a.ids))
            elif isinstance(a, (hp.Release, hp.Forget)):
                if a.ids:
                    batch.add(b"XACK", key(URL_POOL), GROUP, *a.ids)
                    batch.add(b"XDEL", key(URL_POOL), *a.ids)
                if isinstance(a, hp.Release):
                    batch.add(b"HDEL", key(UNACKED), a.number)
                    batch.add(b"HDEL", key(UNACKED_IDS), a.number)
                    if self.release_log and a.frame and a.ids:  # a re-offered frame is logged already
                        batch.add(b"LPUSH", key(RELEASED), tagged(self.center_step(), a.frame))
                        batch.add(b"LTRIM", key(RELEASED), 0, self.release_log - 1)
            elif isinstance(a, hp.DropTasks) and a.urls:
                batch.add(b"SADD", key(TASKS_MOVED), *a.urls)
            elif isinstance(a, hp.TakeDone) and a.count:
                trim = (b"LTRIM", key(TASKS_DONE), a.count, -1)
                if a.number is None:
                    batch.add(*trim)
                else:
                    once(batch, self.store, f"done:{a.number}", [trim])
            elif isinstance(a, hp.AddTasks) and a.urls:
                sites.queue_tasks(batch, self.store, a.urls, a.number)
                batch.fingerprints(b"SADD", key(TASK_FP), fingerprint_many(a.urls))

    def drop_moved(self) -> int:
        """Take the tasks that moved to other hosts out of task_pool (and task_pool:fp: a
        URL that comes here again is a new task); returns how many were dropped."""
        moved = {u.decode() for u in self.store.command(b"SMEMBERS", self.store.key(TASKS_MOVED))}
        if not moved:
            return 0
        dropped = sites.drop(self.store, sorted(moved))
        batch = self.store.batch()
        batch.fingerprints(b"SREM", self.store.key(TASK_FP), fingerprint_many(sorted(moved)))
        batch.add(b"SREM", self.store.key(TASKS_MOVED), *moved)
        self.store.execute(batch)
        return dropped

    def tasks_done(self, count: int) -> list[str]:
        """:meth:`tasks_done_steps` run here."""
        return self.store.drive(self.tasks_done_steps(count))

    def tasks_done_steps(self, count: int) -> Steps[list[str]]:
        """The oldest finished tasks not yet reported (``count`` at most) that may be
        reported now: those whose links have all left ``URL_pool`` (each entry carries
        the newest URL_pool id at its finish, local_host/frontier/tasks.py). A page reported
        before its links were admitted would be forgotten by its center while its links
        were in this host's store only: a host gone with its disk would lose them."""
        batch = self.store.batch()
        done = batch.add(b"LRANGE", self.store.key(TASKS_DONE), 0, count - 1)
        oldest = batch.add(b"XRANGE", self.store.key(URL_POOL), b"-", b"+", b"COUNT", 1)
        results = yield batch
        waiting = _stream_id(results[oldest][0][0]) if results[oldest] else None
        out = []
        for entry in results[done]:
            url, _, tag = entry.decode().partition(" ")
            if waiting is not None and tag and _stream_id(tag.encode()) >= waiting:
                break
            out.append(url)
        return out

    def unreported(self) -> int:
        """Finished tasks whose report has not been acknowledged: not yet in one
        (``tasks_done``) or in one awaiting the center's ack. What the center would give
        to other hosts if this host never came back with its store."""
        batch = self.store.batch()
        waiting = batch.add(b"LLEN", self.store.key(TASKS_DONE))
        frames = batch.add(b"HVALS", self.store.key(UNACKED))
        results = self.store.execute(batch)
        reports = (wire.decode_one(f) for f in results[frames])
        return int(results[waiting]) + sum(len(m.URLs) for m in reports if isinstance(m, Done))

    def released_steps(self) -> Steps[list[bytes]]:
        """The re-offer log, newest first (raw entries: :func:`untag` gives the frame)."""
        batch = self.store.batch()
        at = batch.add(b"LRANGE", self.store.key(RELEASED), 0, -1)
        return (yield batch)[at]

    def lookup(self, action: hp.Lookup) -> hp.LookupDone:
        """§2.2/§2.3 look-up: ``finish_URL`` (and ``task_pool`` in exact mode), plus the
        sequence numbers the new sets need — one round trip."""
        return self.store.drive(self.lookup_steps(action))

    def lookup_steps(self, action: hp.Lookup) -> Steps[hp.LookupDone]:
        batch = self.store.batch()
        fps = fingerprint_many(action.urls)
        # task_pool counts as "seen" for exact mode's answers, and in both modes for
        # incoming tasks: a task sent again (its ack was lost) is not queued twice. Read
        # before finish_URL: a task finished between the two reads moves from the one to
        # the other (local_host/frontier/tasks.py), and is seen in one of them.
        use_queued = self.exact or action.token[0] == hp.OfferedTask.KIND
        queued = batch.fingerprints(b"SMISMEMBER", self.store.key(TASK_FP), fps) if use_queued else None
        if self.finished is not None:
            finished = self.finished.contains(batch, action.urls, fps)
        else:
            finished = batch.fingerprints(b"SMISMEMBER", self.store.key(FINISH_URL), fps)
        seq_at = None
        if action.floor:
            seq_at = batch.add(b"EVAL", RAISE_AND_RESERVE, 1, self.store.key("number_seq"), action.floor - 1, action.sets)
        elif action.sets:
            seq_at = batch.add(b"INCRBY", self.store.key("number_seq"), action.sets)
        results = yield batch
        seen = finished.flags(results)
        if queued is not None:
            seen |= queued.flags(results)
        sequences = range(0)
        if seq_at is not None:
            top = int(results[seq_at])
            sequences = range(top - action.sets + 1, top + 1)
        return hp.LookupDone(action.token, seen.tolist(), sequences)

    # -- the walker and restarts -------------------------------------------------------
    def take(self, count: int) -> list[tuple[bytes, str]]:
        return self.store.drive(self.take_steps(count))

    def take_steps(self, count: int) -> Steps[list[tuple[bytes, str]]]:
        try:
            return (yield from self.store.stream_take_steps(URL_POOL, GROUP, WALKER, count))
        except ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
        yield from self.store.ensure_group_steps(URL_POOL, GROUP)  # URL_pool was deleted under us: start it again, empty
        return []

    def load(self) -> tuple[hp.Resume, list[tuple[bytes, str]]]:
        """Frames to send again, and entries taken before a crash that no frame carries."""
        batch = self.store.batch()
        batch.add(b"HGETALL", self.store.key(UNACKED))
        batch.add(b"HGETALL", self.store.key(UNACKED_IDS))
        frames, ids = self.store.execute(batch)
        frames = dict(zip(frames[0::2], frames[1::2]))
        ids = {n: v.split() for n, v in zip(ids[0::2], ids[1::2])}
        unacked = {int(n): (frames[n], ids.get(n, [])) for n in frames}
        carried = {i for _, entry_ids in unacked.values() for i in entry_ids}
        # The walker takes at most max_unacked sets' worth before frames are saved,
        # so the pending list is small; read it whole.
        pending = self.store.stream_take(URL_POOL, GROUP, WALKER, 1 << 30, pending=True)
        orphans = [(i, u) for i, u in pending if i not in carried]
        return hp.Resume(unacked), orphans

    # -- the API the crawler (and `dedupnet push` / `finish`) uses ------------------------
    def push(self, urls, gate: URLGate | None = None) -> int:
        """Normalise and put URLs into ``URL_pool`` (§2.2 step 1); returns how many entered."""
        accepted = (gate or URLGate()).accept(urls)
        for i in range(0, len(accepted), 10_000):
            self.store.stream_add(URL_POOL, accepted[i : i + 10_000])
        return len(accepted)

    def finish(self, urls, gate: URLGate | None = None) -> int:
        """Record URLs as crawled in ``finish_URL`` (now, under a re-crawl policy);
        returns how many were new there."""
        accepted = (gate or URLGate()).accept(urls)
        if not accepted:
            return 0
        if self.finished is None:
            return self.store.fp_add(FINISH_URL, fingerprint_many(accepted))
        batch = self.store.batch()
        added = self.finished.add(batch, accepted)
        return added.total(self.store.execute(batch))

    def all_tasks(self) -> list[tuple[bytes, str]]:
        """Every task of task_pool, queued or handed out, as stream entries (the queued
        ones moved into the stream first: the host's crawler has stopped)."""
        sites.unsort(self.store)
        entries = self.store.redis.xrange(self.store.key(TASK_POOL))
        return [(eid, fields[b"u"].decode()) for eid, fields in entries]

    def drop_tasks(self, ids: list[bytes]) -> None:
        for i in range(0, len(ids), 10_000):
            self.store.command(b"XDEL", self.store.key(TASK_POOL), *ids[i : i + 10_000])

    def next_numbers(self, config: hp.HostConfig, n: int) -> list[int]:
        return [make_number(config.network, config.host_id, seq) for seq in self.store.next_sequences(n)]

    def task_pool_size_steps(self) -> Steps[int]:
        """:func:`~local_host.frontier.sites.task_count` on trio (no worker thread: a daemon that
        stops is not held by a Redis that does not answer)."""
        return (yield from sites.task_count_steps(self.store))

    def sizes(self) -> dict[str, int]:
        batch = self.store.batch()
        url_pool = batch.add(b"XLEN", self.store.key(URL_POOL))
        unacked = batch.add(b"HLEN", self.store.key(UNACKED))
        tasks = sites.count_tasks(batch, self.store)
        results = self.store.execute(batch)
        return {URL_POOL: results[url_pool], TASK_POOL: tasks(results), "unacked_sets": results[unacked]}


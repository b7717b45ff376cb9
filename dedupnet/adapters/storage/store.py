"""The Redis store: the paper's pools (§1.1) as Redis keys, one round trip per ``URL_set``.

Key names carry the paper's names under a configurable prefix, so several simulated
hosts can share one server and ``redis-cli --scan`` reads like the paper::

    <prefix>:finish_URL:<bucket>      fingerprint set (bucketed intsets, below)
    <prefix>:URL_pool                 stream of newly extracted URLs
    <prefix>:task_pool                stream of URLs this host is to crawl
    <prefix>:task_URL                 stream of admitted URLs at a center
    <prefix>:local_reduce_pool        hash number -> stored frame (§2.3)
    <prefix>:dist_reduce_pool         hash number -> stored frame (§2.4)
    <prefix>:number_seq               the host's persisted ``number`` sequence

Fingerprint sets are split into ``2**bucket_bits`` Redis sets by the top bits of
the 64-bit fingerprint; each member is the remaining bits as an integer. Small
all-integer sets are stored by Redis as *intsets*: 8 bytes a URL instead of the
~52 of one big set of 8-byte strings (measured on the embedded valkey, libc malloc). Correctness never
depends on the encoding: past ``set-max-intset-entries`` Redis converts a bucket to
an ordinary set and only memory grows. The embedded server raises that limit.

Every operation on a batch is one round trip: commands are packed into one write
(the fingerprint commands with numpy, which is what makes 400k+ URLs/s possible
from Python) and all replies are read back at once. Connection loss is retried with
exponential back-off, then surfaces as :class:`~dedupnet.codec.errors.StoreUnavailable`.
Every batch is safe to resend (set adds/removes are idempotent; a stream entry
added twice is a duplicate URL, which de-dup removes).

The packing is ours, not redis-py's ``pipeline()``, because that packs every command and
converts every reply in Python, and for a batch of fingerprints that costs far more than
Redis spends on it (about half our client CPU, ``bench/bench_roundtrip.py``). The same
commands through it (same grouping, hiredis parser; ``tests/test_bench_resp.py`` checks
they are the same) cost the client 4.0-4.4× the CPU of a 400-URL look-up (3,379-5,445 vs
783-1,238 µs) and 2.5-3.7× for 10,000 URLs (``bench/bench_resp.py``, docs/DECISIONS.md).

Operations are written sans-I/O (:data:`Steps`: a generator yields each batch and
receives its replies), so the same code runs synchronously (:meth:`Store.drive`) and
on trio sockets (``dedupnet.adapters.storage.aio.AsyncStore.drive``, no worker thread). Measured
(``bench/bench_roundtrip.py``, client CPU per round trip, medians): a 2-command batch
79 µs called directly, 193 µs through ``trio.to_thread``, 93 µs on trio sockets; a
400-URL look-up 303, 450 and 334 µs.

``Store("redis+cluster://host:port", ...)`` returns a
:class:`~dedupnet.adapters.storage.redis_cluster.ClusterStore`: the same API on a Redis Cluster, keys
hash-tagged by prefix, buckets spread over the masters, a batch one round trip per node
(dedupnet/adapters/storage/redis_cluster/). A store's ``finish_URL`` may be a Bloom filter
(``finish_filter``, dedupnet/adapters/storage/bloom.py): :meth:`Batch.fingerprints` on its key is then
turned into ``BITFIELD`` commands, so callers do not change.

A look-up is one SMISMEMBER per bucket touched (322 commands for 400 URLs, 626 for
1,000, with 1,024 buckets). One EVALSHA whose script loops SMISMEMBER server-side was
measured and rejected (``bench/bench_lookup.py``, 1 M stored): client + server CPU per
1,000-URL look-up 2,139 µs vs 1,433 µs for the per-bucket commands (400 URLs: 1,042 vs
711 µs) — the server's Lua work doubles, the client saves little. 256 buckets
(``bucket_bits=8``) cost 897 µs (400 URLs: 529), but fix another key layout.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import hiredis
import numpy as np
import redis
from redis.exceptions import BusyLoadingError, OutOfMemoryError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from dedupnet.codec.backoff import Backoff
from dedupnet.codec.errors import StoreUnavailable
from dedupnet.codec.pools import (  # noqa: F401 - re-exported: the pools' key names
    ADMITTED, CONCLUDED, DIST_REDUCE_POOL, FINISH_URL, LOCAL_REDUCE_POOL, TASK_POOL, TASK_URL, URL_POOL,
)
from dedupnet.adapters.storage.buckets import (  # noqa: F401 - re-exported
    BUCKET_BITS, LEGACY_BUCKET_BITS, MAX_BUCKET_BITS, MIN_BUCKET_BITS, NEW_STORE_BUCKET_BITS, adopt_bucket_bits, glob_escape,
)
from dedupnet.adapters.storage.resp import (
    FEW_FINGERPRINTS, MEMBER_DIGITS, MEMBER_HEAD, MEMBER_OFFSET, MEMBER_RECORD, bucket_heads, pack_command,
)
from dedupnet.adapters.storage.watermark import WATERMARK

log = logging.getLogger("dedupnet.adapters.storage.store")

T = TypeVar("T")

#: A store operation written sans-I/O: a generator that yields each :class:`Batch` it
#: needs, receives that batch's replies (``results = yield batch``) and returns its
#: result. :meth:`Store.drive` runs one synchronously; ``AsyncStore.drive`` on trio.
Steps = Generator["Batch", list, T]

#: Errors after which a batch is resent on a fresh connection.
TRANSIENT_ERRORS = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)



class MemoryFull(OutOfMemoryError):
    """The server is past its ``maxmemory`` (``-OOM``): the write was not done. The daemon
    waits and sends again (``until_stored``) and takes no new work meanwhile
    (:func:`dedupnet.adapters.runtime.until_room`); redis-py's ``OutOfMemoryError`` is caught alike."""


def raise_if_refused(results: list) -> list:
    """A server that was just (re)started answers ``-LOADING`` to every command until it
    has read its AOF back. That is not an answer but "not yet": raised as
    :class:`BusyLoadingError` (a connection error, so the batch is sent again after a
    back-off, like after a refused connection). Returned as a reply, it would reach the
    callers as data (a look-up's flags) and take the daemon down. Resending is safe: a
    server that is loading has run none of the batch's commands.

    ``-OOM`` is raised as :class:`MemoryFull` for the same reason (a look-up read its
    refused ``INCRBY`` as a number). The server answered, so the store does not retry;
    its callers wait (``until_stored``) and send again, safe as after a lost reply
    (dedupnet/adapters/storage/once.py); a MULTI is refused whole (``EXECABORT``)."""
    for r in results:
        if isinstance(r, ResponseError):
            text = str(r)
            if text.startswith("LOADING"):
                raise BusyLoadingError(text)
            if text.startswith("OOM") or (text.startswith("EXECABORT") and ": OOM" in text):
                raise MemoryFull(text)  # EXECABORT: the server filled between MULTI and EXEC
    return results


#: Milliseconds one ``WAITAOF`` blocks before the daemon logs that the disk is slow and
#: waits again (below the store's socket timeout, so the wait is not a lost connection).
FSYNC_WAIT_MS = 10_000
#: Milliseconds the start-up check gives the server to fsync one write; ``everysec``
#: does it within one server tick, ``appendfsync no`` never.
FSYNC_PROBE_MS = 3_000
#: The key the durability check (and a wait asked again) writes.
FSYNC_PROBE = "fsync_probe"


def read_replies(sock: Any, replies: int, closed: type[Exception] = RedisConnectionError) -> list:
    """``replies`` replies read off a blocking socket with our own hiredis reader:
    redis-py's per-reply path costs ~5 us a reply, and a batch has thousands. Nothing
    is left unread on the connection; a connection the server closed raises ``closed``."""
    reader = hiredis.Reader(replyError=ResponseError)
    results: list = []
    while len(results) < replies:
        data = sock.recv(1 << 18)
        if not data:
            raise closed("connection closed by server")
        reader.feed(data)
        while (reply := reader.gets()) is not False:
            results.append(reply)
    return results


def is_cluster_url(url: str | None) -> bool:
    """``redis+cluster://`` (or ``rediss+cluster://``): a Redis Cluster, see
    dedupnet/adapters/storage/redis_cluster/."""
    return isinstance(url, str) and url.split("://", 1)[0].endswith("+cluster")


#: How long a store keeps trying a Redis that went away before it raises
#: StoreUnavailable: about 1.5 s in all, enough for a restart or a failover to answer;
#: longer waits are the caller's (the daemons' ``until_stored`` waits for ever). No
#: jitter: each store is one client retrying its own connection.
STORE_RETRY = Backoff(first=0.05, cap=2.0, attempts=6)


class Batch:
    """Commands to send in one write and answer in one read: one round trip.

    ``add`` queues a command and returns its index; ``fingerprints`` queues one
    command per bucket touched and returns a handle whose results map back to the
    caller's order. Nothing is sent until :meth:`Store.execute`.
    """

    def __init__(self, bucket_bits: int):
        self.bucket_bits = bucket_bits
        self._shift = np.uint64(64 - bucket_bits)
        self._mask = np.uint64((1 << (64 - bucket_bits)) - 1)
        self._chunks: list[bytes] = []
        self._replies = 0
        #: The store's Bloom-filter finish_URL (dedupnet/adapters/storage/bloom.py), or None.
        self.bloom: Any = None

    def __len__(self) -> int:
        return self._replies

    def add(self, *args: Any) -> int:
        self._chunks.append(pack_command(*args))
        self._replies += 1
        return self._replies - 1

    def add_packed(self, parts: list, key: bytes) -> int:
        """Queue one command already in RESP (``parts`` joined), whose key is ``key``."""
        self._chunks.extend(parts)
        self._replies += 1
        return self._replies - 1

    def fingerprints(self, command: bytes, key: str, fps: np.ndarray) -> "FingerprintReplies":
        """Queue ``command`` (SADD/SREM/SMISMEMBER) for each bucket of ``fps`` under ``key``."""
        if self.bloom is not None and key == self.bloom.key:
            return self.bloom.queue(self, command, fps)
        fps = np.asarray(fps, dtype=np.uint64)
        if len(fps) == 0:
            return FingerprintReplies(self._replies, np.empty(0, np.int64), np.empty(0, np.int64), 0)
        return self._bucket_commands(command, key, fps)

    def _few_bucket_commands(self, command: bytes, key: str, fps: np.ndarray) -> "FingerprintReplies":
        """:meth:`_bucket_commands` in plain Python, the same bytes: for a few
        fingerprints (a page's links, a set's URLs) numpy's per-call costs were most of it."""
        first = self._replies
        shift = 64 - self.bucket_bits
        mask = (1 << shift) - 1
        values = fps.tolist()
        by_bucket: dict[int, list[int]] = {}
        for i, fp in enumerate(values):
            by_bucket.setdefault(fp >> shift, []).append(i)
        heads = bucket_heads(command, key)
        append = self._chunks.append
        order: list[int] = []
        counts: list[int] = []
        for bucket in sorted(by_bucket):
            members = by_bucket[bucket]
            append(b"*%d\r\n" % (len(members) + 2))
            append(heads[bucket])
            append(b"".join([MEMBER_HEAD + b"%d\r\n" % ((values[i] & mask) + MEMBER_OFFSET) for i in members]))
            order += members
            counts.append(len(members))
        self._replies += len(counts)
        return FingerprintReplies(first, np.array(order, dtype=np.int64), np.array(counts, dtype=np.int64), len(values))

    def _bucket_commands(self, command: bytes, key: str, fps: np.ndarray) -> "FingerprintReplies":
        """``command`` for each bucket of ``fps`` (not empty), laid out for one server."""
        if len(fps) <= FEW_FINGERPRINTS:
            return self._few_bucket_commands(command, key, fps)
        return self._many_bucket_commands(command, key, fps)

    def _many_bucket_commands(self, command: bytes, key: str, fps: np.ndarray) -> "FingerprintReplies":
        first = self._replies
        buckets, order, starts, ends, view = self._records(fps)
        heads = bucket_heads(command, key)
        append = self._chunks.append
        for bucket, start, end in zip(buckets[starts].tolist(), starts.tolist(), ends.tolist()):
            append(b"*%d\r\n" % (end - start + 2))
            append(heads[bucket])
            append(view[start * MEMBER_RECORD : end * MEMBER_RECORD])
        self._replies += len(starts)
        return FingerprintReplies(first, order, ends - starts, len(fps))

    def _records(self, fps: np.ndarray) -> tuple:
        """The members of ``fps`` as RESP bulk strings, sorted by bucket: ``(buckets,
        order, starts, ends, view)``; bucket ``buckets[starts[i]]`` holds records
        ``starts[i]:ends[i]`` of ``view`` (``MEMBER_RECORD`` bytes each)."""
        buckets = (fps >> self._shift).astype(np.int64)
        order = np.argsort(buckets, kind="stable")
        buckets = buckets[order]
        members = (fps[order] & self._mask) + np.uint64(MEMBER_OFFSET)
        records = np.empty((len(fps), MEMBER_RECORD), dtype=np.uint8)
        records[:, :5] = np.frombuffer(MEMBER_HEAD, dtype=np.uint8)
        records[:, 5:-2] = members.astype(f"S{MEMBER_DIGITS}").view(np.uint8).reshape(-1, MEMBER_DIGITS)
        records[:, -2:] = np.frombuffer(b"\r\n", dtype=np.uint8)
        body = records.tobytes()
        changed = np.empty(len(buckets), dtype=bool)
        changed[0] = True
        np.not_equal(buckets[1:], buckets[:-1], out=changed[1:])
        starts = np.flatnonzero(changed)
        ends = np.empty_like(starts)
        ends[:-1] = starts[1:]
        ends[-1] = len(buckets)
        return buckets, order, starts, ends, memoryview(body)

    def payload(self) -> bytes:
        return b"".join(self._chunks)


@dataclass(frozen=True)
class FingerprintReplies:
    """Where one :meth:`Batch.fingerprints` call's replies sit in the batch's results."""

    first: int
    order: np.ndarray
    counts: np.ndarray
    size: int

    def _slice(self, results: list) -> list:
        return results[self.first : self.first + len(self.counts)]

    def _raise_error_reply(self, results: list) -> None:
        """Raise the error reply among this call's replies (``-MISCONF`` when the server
        cannot persist, ``-OOM`` past ``maxmemory``, ``-WRONGTYPE``): it is no answer to a
        fingerprint command, and read as one it took the daemon down (TypeError). Raised,
        it is a Redis error: the daemons wait and retry (``until_stored``). Looked for
        only once reading the replies failed, not on every batch."""
        for reply in self._slice(results):
            if isinstance(reply, ResponseError):
                raise reply

    def flags(self, results: list) -> np.ndarray:
        """Per-fingerprint 0/1 replies (SMISMEMBER) in the caller's original order."""
        out = np.zeros(self.size, dtype=bool)
        if self.size:
            try:
                flat = np.fromiter(itertools.chain.from_iterable(self._slice(results)), dtype=np.int8, count=self.size)
            except TypeError:
                self._raise_error_reply(results)
                raise
            out[self.order] = flat.astype(bool)
        return out

    def total(self, results: list) -> int:
        """Sum of integer replies (SADD/SREM: how many were added/removed)."""
        try:
            return int(sum(self._slice(results)))
        except TypeError:
            self._raise_error_reply(results)
            raise


class Store:
    """Synchronous access to one Redis server under one key prefix.

    Trio code drives its ``*_steps`` operations on trio sockets through
    :class:`dedupnet.adapters.storage.aio.AsyncStore` (other calls in worker threads); the benchmark
    and the demo call it directly.
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        *,
        bucket_bits: int | None = None,
        retry: Backoff = STORE_RETRY,
        socket_timeout: float = 30.0,
    ):
        if is_cluster_url(url):
            raise ValueError(f"{url} is a Redis Cluster: open it with dedupnet.adapters.storage.store_choice.store_for")
        self._settle(url, prefix, bucket_bits, retry, socket_timeout)
        self.redis = redis.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=5.0, protocol=2
        )

    def _settle(self, url: str, prefix: str, bucket_bits: int | None, retry: Backoff, socket_timeout: float) -> None:
        """What every store keeps of its arguments (a cluster's too), checked."""
        if bucket_bits and not MIN_BUCKET_BITS <= bucket_bits <= MAX_BUCKET_BITS:
            raise ValueError(f"bucket_bits must be within {MIN_BUCKET_BITS}..{MAX_BUCKET_BITS}")
        self.url = url
        self.prefix = prefix
        #: What was asked for (None or 0: the store's record, else the default for its age);
        #: :attr:`bucket_bits` is what the store holds, read from it on first use.
        self.requested_bits = bucket_bits or None
        self._bits: int | None = None
        self.retry = retry
        self.socket_timeout = socket_timeout
        self.round_trips = 0
        self.reconnects = 0

    @property
    def bucket_bits(self) -> int:
        if self._bits is None:
            self._bits = self._with_retry(lambda: adopt_bucket_bits(self))
        return self._bits

    @bucket_bits.setter
    def bucket_bits(self, bits: int) -> None:
        self._bits = bits

    def key(self, pool: str) -> str:
        return f"{self.prefix}:{pool}"

    def fp_key(self, pool: str) -> str:
        """The base name of a fingerprint set's bucket keys (``<fp_key>:<bucket>``). The
        same as :meth:`key` here; on a cluster without the hash tag, so buckets spread."""
        return self.key(pool)

    #: A Bloom-filter finish_URL (dedupnet/adapters/storage/bloom.py ``attach``); None: exact intsets.
    finish_filter: Any = None
    #: True once :meth:`durable_check_steps` found that this server fsyncs its AOF on
    #: ``WAITAOF``: a ``durable`` transaction then returns only when it is on disk.
    durable = False
    #: Durable transactions that waited for their fsync.
    fsync_waits = 0
    #: This store's watermark ``(incarnation, step)`` (dedupnet/adapters/storage/watermark.py) once
    #: the daemon has read it: every ``durable`` transaction then raises the step inside
    #: itself, and this holds the last one known stored. None: no watermark kept.
    watermark: tuple[str, int] | None = None

    def batch(self) -> Batch:
        batch = Batch(self.bucket_bits)
        batch.bloom = self.finish_filter
        return batch

    def close(self) -> None:
        self.redis.close()

    # -- one round trip, with retry ------------------------------------------------
    def drive(self, steps: Steps[T]) -> T:
        """Run a sans-I/O operation (see :data:`Steps`) here, each batch with :meth:`execute`."""
        try:
            batch = next(steps)
            while True:
                batch = steps.send(self.execute(batch))
        except StopIteration as stop:
            return stop.value
        finally:
            steps.close()

    def execute(self, batch: Batch) -> list:
        """Send the batch in one write and read every reply. Error replies come back
        as :class:`ResponseError` objects in the list rather than raising, so one bad
        command cannot desynchronise the connection."""
        if not len(batch):
            return []
        payload = batch.payload()
        return self._with_retry(lambda: self._round_trip(payload, len(batch)))

    def _round_trip(self, payload: bytes, replies: int) -> list:
        pool = self.redis.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command([payload], check_health=False)
            sock = conn._sock
            if sock is None:  # closed under us (the store is being closed): retry or give up
                raise RedisConnectionError("connection closed")
            results = read_replies(sock, replies)
            self.round_trips += 1
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        return raise_if_refused(results)  # the connection is sound: kept

    def _with_retry(self, call: Callable[[], T]) -> T:
        delays = self.retry.delays()
        while True:
            try:
                return call()
            except TRANSIENT_ERRORS as e:
                delay = next(delays, None)
                if delay is None:
                    raise StoreUnavailable(f"Redis at {self.url} unreachable: {e}") from e
                self.reconnects += 1
                log.debug("Redis at %s: %s; retrying in %.2fs", self.url, e, delay)
                time.sleep(delay)

    def transact(self, fill: Callable[[Batch], None]) -> list:
        """Run the commands ``fill`` queues as one MULTI/EXEC: all or nothing, one round trip.
        Returns EXEC's replies; an error inside the transaction raises it."""
        return self.drive(self.transact_steps(fill))

    def transact_steps(self, fill: Callable[[Batch], None], *, durable: bool = False) -> Steps[list]:
        """``durable``: return only once the server has fsynced the transaction to its AOF
        (when :attr:`durable` says it can): a ``WAITAOF`` rides in the same round trip."""
        batch = self.batch()
        batch.add(b"MULTI")
        fill(batch)
        if len(batch) == 1:
            return []
        step = durable and self.watermark is not None
        if step:
            batch.add(b"HINCRBY", self.key(WATERMARK), b"step", 1)
        batch.add(b"EXEC")
        wait = durable and self.durable
        if wait:
            batch.add(b"WAITAOF", 1, 0, FSYNC_WAIT_MS)
        replies = yield batch
        if wait:
            synced = replies.pop()
        for reply in replies[:-1]:
            if isinstance(reply, ResponseError):
                raise reply
        results = replies[-1]
        if results is None:
            raise ResponseError("transaction aborted")
        for reply in results:
            if isinstance(reply, ResponseError):
                raise reply
        if wait:
            yield from self._fsynced_steps(synced)
        if step:
            results = list(results)
            self.watermark = (self.watermark[0], int(results.pop()))
        return results

    def _fsynced_steps(self, reply: Any) -> Steps[None]:
        """Wait until ``WAITAOF``'s ``reply`` says the AOF is fsynced. A wait that timed out
        (a stalled disk) is asked again after a write of our own, since any connection of
        the pool may carry it and ``WAITAOF`` covers that connection's writes: the AOF is
        one file, so an fsync past our write is past the transaction before it too. A
        server whose AOF was turned off meanwhile cannot be waited for: said once, and
        writes go on as without ``durable``."""
        while True:
            if isinstance(reply, ResponseError):
                self.durable = False
                log.warning("acknowledgements are not durable any more: Redis at %s answers WAITAOF with %s",
                            self.url, reply)
                return
            if reply[0] >= 1:
                self.fsync_waits += 1
                return
            log.warning("Redis at %s has not fsynced its AOF within %d ms (a slow disk?); the messages that depend "
                        "on the writes wait for it", self.url, FSYNC_WAIT_MS)
            batch = self.batch()
            batch.add(b"SET", self.key(FSYNC_PROBE), b"1")
            batch.add(b"WAITAOF", 1, 0, FSYNC_WAIT_MS)
            _, reply = yield batch

    def durable_check_steps(self) -> Steps[str | None]:
        """Can writes be waited for until they are on disk here? None if so, else why not:
        the AOF is off (``WAITAOF`` refused), the server predates ``WAITAOF`` (Redis 7.2,
        Valkey 8), or it does not fsync within :data:`FSYNC_PROBE_MS` (``appendfsync no``)."""
        batch = self.batch()
        batch.add(b"SET", self.key(FSYNC_PROBE), b"1")
        batch.add(b"WAITAOF", 1, 0, FSYNC_PROBE_MS)
        _, reply = yield batch
        if isinstance(reply, ResponseError):
            return str(reply)
        if reply[0] < 1:
            return f"its AOF was not fsynced within {FSYNC_PROBE_MS} ms (appendfsync no?)"
        return None

    def apply_writes_steps(self, actions: list, kinds: tuple, queue: Callable[[Batch, list], None], *,
                           durable: bool = False) -> Steps[None]:
        """The writes among a core's ``actions`` (those of ``kinds``), queued by ``queue``,
        as one MULTI/EXEC: all of one event's writes or none."""
        writes = [a for a in actions if isinstance(a, kinds)]
        if writes:
            yield from self.transact_steps(lambda batch: queue(batch, writes), durable=durable)

    def command(self, *args: Any) -> Any:
        """One plain command (status, admin), with the same retry as batches."""
        return self.drive(self.command_steps(*args))

    def command_steps(self, *args: Any) -> Steps[Any]:
        batch = self.batch()
        batch.add(*args)
        (reply,) = yield batch
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    # -- fingerprint sets (finish_URL, admitted records) --------------------------
    def fp_add(self, pool: str, fps: np.ndarray) -> int:
        """Add fingerprints; returns how many were new."""
        batch = self.batch()
        handle = batch.fingerprints(b"SADD", self.key(pool), fps)
        return handle.total(self.execute(batch))

    def fp_contains(self, pool: str, fps: np.ndarray) -> np.ndarray:
        """Membership of each fingerprint, in order, as a bool array."""
        batch = self.batch()
        handle = batch.fingerprints(b"SMISMEMBER", self.key(pool), fps)
        return handle.flags(self.execute(batch))

    def fp_remove(self, pool: str, fps: np.ndarray) -> int:
        batch = self.batch()
        handle = batch.fingerprints(b"SREM", self.key(pool), fps)
        return handle.total(self.execute(batch))

    def fp_members(self, fps: np.ndarray) -> list[tuple[int, bytes]]:
        """``(bucket, member)`` of each fingerprint, as a fingerprint set stores it."""
        shift = 64 - self.bucket_bits
        mask = (1 << shift) - 1
        return [(int(fp) >> shift, b"%d" % ((int(fp) & mask) + MEMBER_OFFSET)) for fp in fps]

    def fp_buckets(self, pool: str) -> list[str]:
        """The keys of a fingerprint set's buckets, in bucket order."""
        key = self.fp_key(pool)
        return [f"{key}:{bucket}" for bucket in range(1 << self.bucket_bits)]

    def fp_count(self, pool: str) -> int:
        """Size of a fingerprint set (one SCARD per bucket, one round trip)."""
        batch = self.batch()
        for bucket in self.fp_buckets(pool):
            batch.add(b"SCARD", bucket)
        return int(sum(self.execute(batch)))

    def fp_delete(self, pool: str) -> None:
        """Delete a fingerprint set (one DEL per bucket, one round trip)."""
        batch = self.batch()
        for bucket in self.fp_buckets(pool):
            batch.add(b"DEL", bucket)
        self.execute(batch)

    # -- streams (URL_pool, task_pool, task_URL) ----------------------------------
    def stream_add(self, pool: str, urls: Iterable[str]) -> list[bytes]:
        """Append URLs, one entry each; returns their entry ids."""
        batch = self.batch()
        key = self.key(pool)
        for url in urls:
            batch.add(b"XADD", key, b"*", b"u", url)
        return self.execute(batch)

    def stream_len(self, pool: str) -> int:
        return int(self.command(b"XLEN", self.key(pool)))

    def ensure_group(self, pool: str, group: str) -> None:
        """Create the consumer group that reads ``pool`` (no-op if it exists)."""
        self.drive(self.ensure_group_steps(pool, group))

    def ensure_group_steps(self, pool: str, group: str) -> Steps[None]:
        try:
            yield from self.command_steps(b"XGROUP", b"CREATE", self.key(pool), group, b"0", b"MKSTREAM")
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def stream_take(
        self, pool: str, group: str, consumer: str, count: int, *, pending: bool = False
    ) -> list[tuple[bytes, str]]:
        """Up to ``count`` entries ``(id, url)`` for this consumer. New entries by
        default; with ``pending=True`` the ones it took earlier and has not acked
        (what a restarted host must finish). Taken entries stay in the stream."""
        return self.drive(self.stream_take_steps(pool, group, consumer, count, pending=pending))

    def stream_take_steps(
        self, pool: str, group: str, consumer: str, count: int, *, pending: bool = False
    ) -> Steps[list[tuple[bytes, str]]]:
        reply = yield from self.command_steps(
            b"XREADGROUP", b"GROUP", group, consumer, b"COUNT", count,
            b"STREAMS", self.key(pool), b"0" if pending else b">",
        )
        if not reply:
            return []
        entries = reply[0][1]
        return [(eid, fields[1].decode()) for eid, fields in entries if fields]

    def stream_done(self, pool: str, group: str, ids: Sequence[bytes]) -> int:
        """Acknowledge and delete entries: they have left the pool for good."""
        if not ids:
            return 0
        batch = self.batch()
        key = self.key(pool)
        batch.add(b"XACK", key, group, *ids)
        batch.add(b"XDEL", key, *ids)
        return int(self.execute(batch)[1])

    # -- the number sequence (§2.1) ------------------------------------------------
    def next_sequences(self, n: int = 1) -> range:
        """Reserve ``n`` consecutive sequence values, persisted before use."""
        top = int(self.command(b"INCRBY", self.key("number_seq"), n))
        return range(top - n + 1, top + 1)

    # -- housekeeping ----------------------------------------------------------------
    def used_memory(self) -> int:
        """``INFO memory`` ``used_memory`` once the keys deleted before (UNLINK, or DEL
        with lazy free, valkey's default) are freed: a free still under way in the
        background would be taken off the next delta (the benchmarks' bytes per URL)."""
        for _ in range(600):
            info = self.redis.info("memory")
            if not int(info.get("lazyfree_pending_objects", 0)):
                break
            time.sleep(0.05)
        return int(info["used_memory"])

    def delete_prefix(self) -> int:
        """Remove every key under this prefix (tests and the demo clean up with it)."""
        removed = 0
        for keys in _chunked(self.redis.scan_iter(match=f"{self.prefix}:*", count=1000), 1000):
            removed += self.redis.unlink(*keys)
        return removed


class CoreWrites:
    """The store side of a sans-I/O core (center_host/pools.py, local_host/pools.py): the
    write actions among an event's actions (those of ``writes``, queued by ``_queue``)
    carried out as one transaction, in order. ``apply_steps`` is the sans-I/O form the
    daemons drive on trio (AsyncStore.drive); ``apply`` drives it synchronously."""

    writes: tuple = ()
    store: Store

    def _queue(self, batch: Batch, writes: list) -> None:
        raise NotImplementedError

    def apply(self, actions: list) -> None:
        self.store.drive(self.apply_steps(actions))

    def apply_steps(self, actions: list, durable: bool = False) -> Steps[None]:
        """``durable``: the event sends messages that depend on these writes (the store
        returns once they are on disk, if it can tell)."""
        yield from self.store.apply_writes_steps(actions, self.writes, self._queue, durable=durable)


def _chunked(it: Iterable[T], n: int) -> Iterator[list[T]]:
    chunk: list[T] = []
    for item in it:
        chunk.append(item)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk

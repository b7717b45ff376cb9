"""The store on a Redis Cluster (``redis+cluster://host:port``).

A centre's ``admitted`` record for a web-scale crawl (billions of URLs at ~8 bytes each)
outgrows one server; Redis Cluster (or a Valkey cluster) spreads keys over 16,384 hash
slots held by several masters. :class:`ClusterStore` is a :class:`~dedupnet.adapters.store.Store`
with the same API and the same hand-packed RESP; what changes is the key layout and
how a batch travels.

**Keys.** A daemon's own keys carry its prefix as a hash tag, so they share one slot
and one MULTI/EXEC can hold them (``{<prefix>}:URL_pool``, ``{<prefix>}:task_URL``,
``{<prefix>}:local_reduce_pool``, ...). Fingerprint buckets do not: their name is the
untagged ``<prefix>:finish_URL:<bucket>`` (``admitted``, ``concluded``,
``task_pool:fp`` likewise), so the 1,024 buckets of one set hash to ~1,000 slots and
spread over every master.

**A batch is one pipelined round trip per node touched**, sent to all nodes before any
reply is read. The slot map comes from ``CLUSTER SLOTS`` (:class:`SlotMap`, our own:
redis-py's ``RedisCluster`` keeps one too, but its pipeline re-packs every command and
parses every reply in Python, which is what ``dedupnet.adapters.store`` exists to avoid; it is
still used for the admin calls, ``Store.redis``). A command answered ``-MOVED`` makes us
reload the map and send it again to the new owner; ``-ASK`` sends it to the importing
node behind ``ASKING``; ``-TRYAGAIN``, ``-CLUSTERDOWN``, ``-LOADING`` and a node that
cannot be reached are retried after the store's back-off, and only the commands of the
nodes that failed are sent again (safe: batches are idempotent, see dedupnet/adapters/store.py).
When the back-off is spent the batch raises
:class:`~dedupnet.codec.errors.StoreUnavailable`; the daemons log it and keep retrying
(``runtime.until_stored``), so a dead master stalls progress and loses nothing.

**Transactions across slots.** One event's writes are one MULTI/EXEC on a single
server (all of them or none). On a cluster a MULTI/EXEC must stay in one slot, and an
event writes both its daemon's tagged keys and fingerprint buckets on other slots. So
the transaction runs on the daemon's home slot and carries, in the same MULTI, a redo
record ``{<prefix>}:redo`` (a hash: transaction id -> the RESP of the commands on other
slots); once EXEC has committed those commands are sent to their nodes, then the record
is deleted (in the next transaction's MULTI, not a round trip of its own). A redo
record left behind (a crash or a node down in between) is replayed before this store's
next batch and by any store opened on the prefix, before anything reads: so every read after a restart sees all of an event's writes or none, as on one
server. Only the commands of a transaction that leave the home slot go through the redo
record; they must be idempotent (SADD/SREM of fingerprints, the crawler's min-depth
script), which they are. Within a daemon the reactor awaits each event's writes before
the next look-up, so the daemon itself never sees half an event.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import hiredis
import numpy as np
import redis
import trio
from redis.crc import key_slot
from redis.exceptions import ResponseError

from dedupnet.adapters.aio import ASYNC_TRANSIENT_ERRORS, CONNECT_TIMEOUT, AsyncStore, _Connection, _exchange
from dedupnet.codec.errors import StoreUnavailable
from dedupnet.adapters.store import (
    _MEMBER_RECORD,
    Batch,
    FingerprintReplies,
    RetryPolicy,
    Steps,
    Store,
    T,
    _bulk,
    _encode_arg,
    is_cluster_url,
    pack_command,
    read_replies,
)

log = logging.getLogger("dedupnet.adapters.redis_cluster")

SLOTS = 16384
REDO = "redo"
Addr = tuple[str, int]

#: Replies that mean "not here" or "not now": the command is sent again.
_REDIRECT = ("MOVED ", "ASK ")
_NOT_NOW = ("TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN")
_ASKING = pack_command(b"ASKING")
_NO_KEY = {b"MULTI", b"EXEC", b"PING", b"INFO", b"DBSIZE", b"ECHO", b"TIME"}


def cluster_seeds(url: str) -> tuple[list[Addr], dict[str, Any]]:
    """``redis+cluster://[user:pass@]host:port[,host:port...]`` -> the nodes to ask
    for the slot map, and connection options (password)."""
    if not is_cluster_url(url):
        raise ValueError(f"not a cluster URL (redis+cluster://host:port): {url}")
    rest = url.split("://", 1)[1]
    auth, _, hosts = rest.rpartition("@")
    hosts = hosts.split("/", 1)[0].split("?", 1)[0]
    seeds: list[Addr] = []
    for part in hosts.split(","):
        parsed = urlsplit(f"//{part}")
        seeds.append((parsed.hostname or "127.0.0.1", parsed.port or 6379))
    options: dict[str, Any] = {}
    if auth:
        user, _, password = auth.rpartition(":")
        options = {"username": user or None, "password": password}
    if parse_qs(urlsplit(url.replace("+cluster", "", 1)).query).get("db", ["0"])[0] not in ("0", ""):
        raise ValueError("Redis Cluster has only database 0")
    return seeds, options


def admin_client(url: str) -> Any:
    """A redis-py client for admin calls (INFO, SCAN, MEMORY USAGE): ``RedisCluster`` for
    a cluster URL (it routes SCAN and INFO to every primary), else ``Redis``."""
    if not is_cluster_url(url):
        return redis.Redis.from_url(url)
    seeds, options = cluster_seeds(url)
    return redis.RedisCluster(startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in seeds],
                              socket_connect_timeout=5.0, protocol=2, **options)


def merged_info(client: Any, section: str) -> dict:
    """``INFO section`` of one server, or of every cluster node summed (numbers in
    nested dicts, e.g. ``cmdstat_sadd: {calls: ...}``, are added up)."""
    info = client.info(section)
    if not isinstance(client, redis.RedisCluster):
        return info
    nodes = info.values() if info and all(isinstance(v, dict) and ":" in k for k, v in info.items()) else [info]
    out: dict = {}
    for node in nodes:
        for key, value in node.items():
            if isinstance(value, dict):
                slot = out.setdefault(key, {})
                for k, v in value.items():
                    if isinstance(v, (int, float)):
                        slot[k] = slot.get(k, 0) + v
            elif isinstance(value, (int, float)):
                out[key] = out.get(key, 0) + value
    return out


@functools.lru_cache(maxsize=4096)
def slot_of(key: bytes) -> int:
    return key_slot(key)


@functools.lru_cache(maxsize=1024)
def bucket_slots(key: str, bucket_bits: int) -> np.ndarray:
    """Slot of every bucket key ``<key>:<b>`` of a fingerprint set."""
    base = key.encode() + b":"
    return np.array([key_slot(base + b"%d" % b) for b in range(1 << bucket_bits)], dtype=np.int32)


def untagged(key: str) -> str:
    """``{prefix}:admitted`` -> ``prefix:admitted``: a fingerprint set's bucket keys lose
    the daemon's hash tag, so they spread over slots."""
    if key.startswith("{"):
        end = key.find("}")
        if end > 0:
            return key[1:end] + key[end + 1:]
    return key


def _key_of(args: tuple) -> bytes | None:
    name = _encode_arg(args[0]).upper()
    if name in _NO_KEY or len(args) < 2:
        return None
    if name == b"XREADGROUP":
        upper = [_encode_arg(a).upper() if isinstance(a, (bytes, str)) else b"" for a in args]
        return _encode_arg(args[upper.index(b"STREAMS") + 1])
    if name in (b"XGROUP", b"OBJECT", b"MEMORY"):
        return _encode_arg(args[2])
    if name in (b"EVAL", b"EVALSHA"):
        return _encode_arg(args[3]) if int(args[2]) > 0 else None
    return _encode_arg(args[1])


class ClusterBatch(Batch):
    """A :class:`~dedupnet.adapters.store.Batch` that keeps each command apart with its slot, so
    the batch can be split by node. ``slot -1``: no key (the home node takes it)."""

    def __init__(self, bucket_bits: int, home_slot: int):
        super().__init__(bucket_bits)
        self.home_slot = home_slot
        self.cmds: list[bytes] = []
        self.slots: list[int] = []
        self.spread: list[bool] = []  # fingerprint commands: never in the home slot's MULTI

    def add(self, *args: Any) -> int:
        key = _key_of(args)
        self.cmds.append(pack_command(*args))
        self.slots.append(slot_of(key) if key is not None else -1)
        self.spread.append(False)
        self._replies += 1
        return self._replies - 1

    def add_packed(self, parts: list, key: bytes) -> int:
        self.cmds.append(b"".join(parts))
        self.slots.append(slot_of(key))
        self.spread.append(True)
        self._replies += 1
        return self._replies - 1

    def fingerprints(self, command: bytes, key: str, fps: np.ndarray) -> FingerprintReplies:
        if self.bloom is not None and key == self.bloom.key:
            return self.bloom.queue(self, command, fps)
        fps = np.asarray(fps, dtype=np.uint64)
        first = self._replies
        if len(fps) == 0:
            return FingerprintReplies(first, np.empty(0, np.int64), np.empty(0, np.int64), 0)
        key = untagged(key)
        buckets, order, starts, ends, view = self._records(fps)
        head = _bulk(command)
        base = key.encode() + b":"
        slots = bucket_slots(key, self.bucket_bits)
        for bucket, start, end in zip(buckets[starts].tolist(), starts.tolist(), ends.tolist()):
            self.cmds.append(b"".join((b"*%d\r\n" % (end - start + 2), head, _bulk(base + b"%d" % bucket),
                                       view[start * _MEMBER_RECORD: end * _MEMBER_RECORD])))
            self.slots.append(int(slots[bucket]))
            self.spread.append(True)
        self._replies += len(starts)
        return FingerprintReplies(first, order, ends - starts, len(fps))

    def payload(self) -> bytes:
        return b"".join(self.cmds)

    @property
    def transaction(self) -> bool:
        return bool(self.cmds) and self.cmds[0] == _MULTI


_MULTI = pack_command(b"MULTI")
_EXEC = pack_command(b"EXEC")


class SlotMap:
    """Slot -> the master that holds it, from ``CLUSTER SLOTS`` (our own: a list of
    16,384 addresses, refreshed when a node answers ``-MOVED`` or cannot be reached)."""

    def __init__(self, seeds: list[Addr], options: dict[str, Any]):
        self.seeds = list(seeds)
        self.options = options
        self.owner: list[Addr | None] = [None] * SLOTS
        self.known: list[Addr] = list(seeds)
        self.refreshes = 0
        self._lock = threading.Lock()

    def node(self, slot: int) -> Addr:
        addr = self.owner[slot] if slot >= 0 else None
        return addr or self.known[0]

    @property
    def loaded(self) -> bool:
        return self.owner[0] is not None

    def refresh(self) -> None:
        """Ask the known nodes, one after the other, for the slot map; keep the old one
        if none answers (the caller's back-off decides how long to go on)."""
        with self._lock:
            errors = []
            for addr in dict.fromkeys(self.known + self.seeds):
                try:
                    client = redis.Redis(host=addr[0], port=addr[1], socket_connect_timeout=2.0,
                                         socket_timeout=5.0, protocol=2, retry=None, **self.options)
                    try:
                        reply = client.execute_command("CLUSTER SLOTS")
                    finally:
                        client.close()
                except (redis.RedisError, OSError) as e:
                    errors.append(f"{addr[0]}:{addr[1]}: {e}")
                    continue
                owner: list[Addr | None] = [None] * SLOTS
                nodes: list[Addr] = []
                for entry in reply:
                    start, end, master = int(entry[0]), int(entry[1]), entry[2]
                    host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
                    a = (host or addr[0], int(master[1]))
                    owner[start:end + 1] = [a] * (end - start + 1)
                    nodes.append(a)
                self.owner = owner
                self.known = list(dict.fromkeys(nodes + self.known))
                self.refreshes += 1
                return
            log.warning("Redis Cluster: no node gave the slot map (%s)", "; ".join(errors))


# -- the plan: sans-I/O, run by ClusterStore (sync) and AsyncClusterStore (trio) ------------

@dataclass
class Wave:
    """One round trip to each node in ``sends`` (node -> its commands, pipelined), all
    sent before any reply is read. Answered with node -> replies, or the exception."""
    sends: dict[Addr, list[bytes]]


@dataclass
class Pause:
    seconds: float


@dataclass
class Refresh:
    """Reload the slot map."""


@dataclass
class _Retry:
    delays: Any
    url: str
    attempts: int = 0
    last: str = ""

    def next_delay(self) -> float:
        delay = next(self.delays, None)
        if delay is None:
            raise StoreUnavailable(f"Redis Cluster at {self.url} unavailable: {self.last}")
        return delay


Plan = Generator[Any, Any, T]


def run_commands(store: "ClusterStore", cmds: list[bytes], slots: list[int], out: list, where: list[int]) -> Plan[None]:
    """Send ``cmds`` (their replies go to ``out[where[i]]``), each to the node of its slot,
    one wave per attempt; commands whose node failed or redirected are sent again."""
    retry = _Retry(store.retry.delays(), store.url)
    todo = list(range(len(cmds)))
    asking: dict[int, Addr] = {}
    while todo:
        groups: dict[Addr, list[int]] = {}
        for i in todo:
            groups.setdefault(asking.get(i) or store.slots.node(slots[i]), []).append(i)
        results = yield Wave({a: [(_ASKING + cmds[i]) if i in asking else cmds[i] for i in ids]
                              for a, ids in groups.items()})
        again: list[int] = []
        refresh = pause = False
        for addr, ids in groups.items():
            replies = results[addr]
            if isinstance(replies, BaseException):
                again += ids
                refresh = pause = True
                retry.last = f"{addr[0]}:{addr[1]}: {replies!r}"
                continue
            replies = iter(replies)
            for i in ids:
                if i in asking:
                    next(replies)  # ASKING's +OK
                reply = next(replies)
                if isinstance(reply, ResponseError):
                    msg = str(reply)
                    if msg.startswith("MOVED "):
                        asking.pop(i, None)
                        again.append(i)
                        refresh = True
                        retry.last = msg
                        continue
                    if msg.startswith("ASK "):
                        host, _, port = msg.split()[2].rpartition(":")
                        asking[i] = (host or addr[0], int(port))
                        again.append(i)
                        retry.last = msg
                        continue
                    if msg.startswith(_NOT_NOW):
                        again.append(i)
                        pause = True
                        retry.last = msg
                        continue
                asking.pop(i, None)
                out[where[i]] = reply
        todo = again
        if todo:
            if refresh:
                yield Refresh()
            retry.attempts += 1
            # A MOVED is answered at once (the map was just reloaded); anything else,
            # or MOVED again and again, waits the back-off.
            if pause or retry.attempts > 2:
                delay = retry.next_delay()
                store.reconnects += 1
                log.warning("Redis Cluster: %s; retrying %d command(s) in %.2fs", retry.last, len(todo), delay)
                yield Pause(delay)


def execute_plan(store: "ClusterStore", batch: ClusterBatch) -> Plan[list]:
    """The replies of ``batch`` in its order, as ``Store.execute`` returns them."""
    if store.redo_unchecked:
        yield from replay_redo(store)
    if batch.transaction:
        return (yield from _transaction(store, batch))
    out: list = [None] * len(batch.cmds)
    yield from run_commands(store, batch.cmds, batch.slots, out, list(range(len(out))))
    return out


def _transaction(store: "ClusterStore", batch: ClusterBatch) -> Plan[list]:
    n = len(batch.cmds)
    if batch.cmds[-1] != _EXEC:
        raise ValueError("a cluster transaction batch is MULTI, commands, EXEC")
    inner = range(1, n - 1)
    home = [i for i in inner if not batch.spread[i] and batch.slots[i] in (-1, batch.home_slot)]
    other = [i for i in inner if i not in set(home)]
    redo_key = store.key(REDO)
    txid = store.next_txid()
    done, store.redo_done[:] = list(store.redo_done), []  # records of earlier transactions, all applied
    tx = [_MULTI, *(batch.cmds[i] for i in home)]
    if done:
        tx.append(pack_command(b"HDEL", redo_key, *done))
    if other:
        tx.append(pack_command(b"HSET", redo_key, txid, b"".join(batch.cmds[i] for i in other)))
    tx.append(_EXEC)
    retry = _Retry(store.retry.delays(), store.url)
    while True:  # the whole MULTI/EXEC goes again, never a part of it
        addr = store.slots.node(batch.home_slot)
        replies = (yield Wave({addr: tx}))[addr]
        if isinstance(replies, BaseException):
            retry.last = f"{addr[0]}:{addr[1]}: {replies!r}"
        else:
            refused = [r for r in replies[:-1] if isinstance(r, ResponseError) and str(r).startswith(_REDIRECT + _NOT_NOW)]
            if not refused:
                break
            retry.last = str(refused[0])  # EXEC answered EXECABORT: nothing ran
        yield Refresh()
        try:
            delay = retry.next_delay()
        except StoreUnavailable:
            store.redo_done.extend(done)  # still to delete
            raise
        store.reconnects += 1
        log.warning("Redis Cluster: %s; sending the transaction again in %.2fs", retry.last, delay)
        yield Pause(delay)
    queued = replies[1:-1]
    out: list = [replies[0]] + [b"QUEUED"] * (n - 2) + [None]
    for i, r in zip(home, queued):
        out[i] = r
    exec_reply = replies[-1]
    if not isinstance(exec_reply, list):  # aborted or refused: nothing ran, nothing to redo
        store.redo_done.extend(done)
        out[-1] = exec_reply
        return out
    results: list = [None] * (n - 2)
    for i, r in zip(home, exec_reply):
        results[i - 1] = r
    if other:
        try:
            yield from run_commands(store, [batch.cmds[i] for i in other], [batch.slots[i] for i in other],
                                    results, [i - 1 for i in other])
        except StoreUnavailable:
            store.redo_unchecked = True  # the redo record stays: replayed before the next batch
            raise
        # Its record is deleted in the next transaction's MULTI (no round trip of its own);
        # until then a crash only replays writes already made (idempotent).
        store.redo_done.append(txid)
    out[-1] = results
    return out


def replay_redo(store: "ClusterStore") -> Plan[int]:
    """Carry out what committed transactions left in the redo record (a crash, a node
    down between EXEC and the other slots' writes), then remove it. Idempotent."""
    redo_key = store.key(REDO)
    got: list = [None]
    yield from run_commands(store, [pack_command(b"HGETALL", redo_key)], [store.home_slot], got, [0])
    flat = got[0]
    if isinstance(flat, ResponseError):
        raise flat
    txids = flat[0::2]
    if txids:
        cmds: list[bytes] = []
        slots: list[int] = []
        for payload in flat[1::2]:
            reader = hiredis.Reader()
            reader.feed(payload)
            while (args := reader.gets()) is not False:
                cmds.append(pack_command(*args))
                slots.append(slot_of(_key_of(tuple(args)) or b""))
        yield from run_commands(store, cmds, slots, [None] * len(cmds), list(range(len(cmds))))
        yield from run_commands(store, [pack_command(b"HDEL", redo_key, *txids)], [store.home_slot], [None], [0])
        log.warning("Redis Cluster: replayed %d transaction(s) left half-applied under %s", len(txids), store.prefix)
    store.redo_unchecked = False
    return len(txids)


# -- the synchronous store --------------------------------------------------------------------

class ClusterStore(Store):
    """:class:`~dedupnet.adapters.store.Store` on a Redis Cluster; ``store_for("redis+cluster://...")``
    (dedupnet/adapters/store_choice.py) returns one. Keys: see the module docstring."""

    is_cluster = True

    def __init__(self, url: str, prefix: str, *, bucket_bits: int = 10, retry: RetryPolicy = RetryPolicy(),
                 socket_timeout: float = 30.0):
        from dedupnet.adapters.store import MAX_BUCKET_BITS, MIN_BUCKET_BITS

        if not MIN_BUCKET_BITS <= bucket_bits <= MAX_BUCKET_BITS:
            raise ValueError(f"bucket_bits must be within {MIN_BUCKET_BITS}..{MAX_BUCKET_BITS}")
        if "{" in prefix or "}" in prefix:
            raise ValueError(f"a cluster key prefix cannot contain braces (it becomes the hash tag): {prefix!r}")
        self.url = url
        self.prefix = prefix
        self.bucket_bits = bucket_bits
        self.retry = retry
        self.socket_timeout = socket_timeout
        seeds, self.options = cluster_seeds(url)
        self.slots = SlotMap(seeds, self.options)
        self.home_slot = slot_of(f"{{{prefix}}}".encode())
        self.round_trips = 0
        self.reconnects = 0
        self.redo_unchecked = True
        self.redo_done: list[str] = []  # applied transactions whose redo record is still to delete
        self._txids = itertools.count()
        self._txid_base = f"{os.getpid()}-{time.time_ns()}"
        self._idle: dict[Addr, list[socket.socket]] = {}
        self._lock = threading.Lock()
        self._admin: Any = None

    @property
    def redis(self) -> Any:  # type: ignore[override]
        """redis-py's ``RedisCluster``, for admin calls only (made on first use)."""
        if self._admin is None:
            self._admin = admin_client(self.url)
        return self._admin

    def key(self, pool: str) -> str:
        return f"{{{self.prefix}}}:{pool}"

    def durable_check_steps(self) -> Steps[str | None]:
        """A transaction here is split over the masters (with its redo record), so one
        ``WAITAOF`` after it covers nothing: acknowledgements are not waited for."""
        return "a Redis Cluster's transactions span several servers; no WAITAOF covers one"
        yield  # a generator, like every Steps

    def fp_key(self, pool: str) -> str:
        return f"{self.prefix}:{pool}"

    def batch(self) -> ClusterBatch:
        batch = ClusterBatch(self.bucket_bits, self.home_slot)
        batch.bloom = self.finish_filter
        return batch

    def next_txid(self) -> str:
        return f"{self._txid_base}-{next(self._txids)}"

    def close(self) -> None:
        with self._lock:
            for socks in self._idle.values():
                for s in socks:
                    s.close()
            self._idle.clear()
        if self._admin is not None:
            self._admin.close()

    # -- running a plan synchronously ------------------------------------------------------
    def execute(self, batch: Batch) -> list:
        if not len(batch):
            return []
        return self.run_plan(execute_plan(self, batch))

    def run_plan(self, plan: Plan[T]) -> T:
        try:
            step = next(plan)
            while True:
                if isinstance(step, Wave):
                    step = plan.send(self._wave(step.sends))
                elif isinstance(step, Refresh):
                    self.slots.refresh()
                    step = plan.send(None)
                else:
                    time.sleep(step.seconds)
                    step = plan.send(None)
        except StopIteration as stop:
            return stop.value
        finally:
            plan.close()

    def _ensure_map(self) -> None:
        if not self.slots.loaded:
            self.slots.refresh()

    def _wave(self, sends: dict[Addr, list[bytes]]) -> dict[Addr, Any]:
        self._ensure_map()
        out: dict[Addr, Any] = {}
        live: dict[Addr, socket.socket] = {}
        for addr, cmds in sends.items():
            try:
                sock = self._take(addr)
                sock.sendall(b"".join(cmds))
                live[addr] = sock
            except OSError as e:
                out[addr] = e
        for addr, sock in live.items():
            try:
                out[addr] = _read(sock, sum(2 if c.startswith(_ASKING) else 1 for c in sends[addr]))
                with self._lock:
                    self._idle.setdefault(addr, []).append(sock)
            except (OSError, ConnectionError) as e:
                sock.close()
                out[addr] = e
        self.round_trips += 1
        return out

    def _take(self, addr: Addr) -> socket.socket:
        with self._lock:
            idle = self._idle.get(addr)
            if idle:
                return idle.pop()
        sock = socket.create_connection(addr, timeout=5.0)
        sock.settimeout(self.socket_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.options.get("password") is not None:
            user = self.options.get("username")
            sock.sendall(pack_command(b"AUTH", *([user] if user else []), self.options["password"]))
            (reply,) = _read(sock, 1)
            if isinstance(reply, ResponseError):
                sock.close()
                raise reply
        return sock

    # -- housekeeping: through redis-py's cluster client ----------------------------------------
    def used_memory(self) -> int:
        info = self.redis.info("memory", target_nodes=redis.RedisCluster.PRIMARIES)
        return sum(int(v["used_memory"]) for v in info.values())

    def delete_prefix(self) -> int:
        removed = 0
        for pattern in (f"{self.prefix}:*", f"{{{self.prefix}}}:*"):
            keys = [k for k in self.redis.scan_iter(match=pattern, count=1000)]
            for k in keys:
                removed += self.redis.unlink(k)
        return removed


# -- the trio store ------------------------------------------------------------------------------

class AsyncClusterStore(AsyncStore):
    """:class:`~dedupnet.adapters.aio.AsyncStore` on a cluster (``on_trio(cluster_store)`` returns
    one): each wave is one round trip per node, the nodes' exchanges run concurrently
    on trio sockets (the same ``_exchange`` as one server); a slot map reload runs in a
    worker thread (it is rare)."""

    def __init__(self, store: ClusterStore, *, max_threads: int = 4, max_connections: int = 4):
        self.store = store
        self._limiter = trio.CapacityLimiter(max_threads)
        self._conns: dict[Addr, list[_Connection]] = {}

    async def execute(self, batch: Batch) -> list:
        if not len(batch):
            return []
        plan = execute_plan(self.store, batch)
        try:
            step = next(plan)
            while True:
                reply = None
                if isinstance(step, Wave):
                    reply = await self._wave(step.sends)
                elif isinstance(step, Refresh):
                    await trio.to_thread.run_sync(self.store.slots.refresh, limiter=self._limiter)
                else:
                    await trio.sleep(step.seconds)
                step = plan.send(reply)
        except StopIteration as stop:
            return stop.value
        finally:
            plan.close()

    async def _wave(self, sends: dict[Addr, list[bytes]]) -> dict[Addr, Any]:
        if not self.store.slots.loaded:
            await trio.to_thread.run_sync(self.store.slots.refresh, limiter=self._limiter)
        out: dict[Addr, Any] = {}

        async def one(addr: Addr, cmds: list[bytes]) -> None:
            replies = sum(2 if c.startswith(_ASKING) else 1 for c in cmds)
            try:
                out[addr] = await self._node_round_trip(addr, b"".join(cmds), replies)
            except ASYNC_TRANSIENT_ERRORS as e:
                out[addr] = e

        if len(sends) == 1:
            ((addr, cmds),) = sends.items()
            await one(addr, cmds)
        else:
            async with trio.open_nursery() as nursery:
                for addr, cmds in sends.items():
                    nursery.start_soon(one, addr, cmds)
        self.store.round_trips += 1
        return out

    async def _node_round_trip(self, addr: Addr, payload: bytes, replies: int) -> list:
        idle = self._conns.setdefault(addr, [])
        conn = idle.pop() if idle else None
        done = False
        try:
            with trio.fail_after(self.store.socket_timeout):
                if conn is None:
                    with trio.fail_after(CONNECT_TIMEOUT):
                        conn = _Connection(await trio.open_tcp_stream(*addr))
                    options = self.store.options
                    if options.get("password") is not None:
                        user = options.get("username")
                        (ok,) = await _exchange(conn, pack_command(b"AUTH", *([user] if user else []),
                                                                   options["password"]), 1)
                        if isinstance(ok, ResponseError):
                            raise ok
                results = await _exchange(conn, payload, replies)
            done = True
            return results
        finally:
            if done:
                idle.append(conn)
            elif conn is not None:
                conn.close()

    async def aclose(self) -> None:
        for idle in self._conns.values():
            while idle:
                idle.pop().close()


#: Replies off a node's socket; a closed connection is an OSError here (the node is down).
_read = functools.partial(read_replies, closed=ConnectionError)

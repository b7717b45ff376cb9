"""The store on a Redis Cluster, twice: :class:`ClusterStore` (blocking sockets, like
:class:`~dedupnet.adapters.storage.store.Store`) and :class:`AsyncClusterStore` (trio, like
:class:`~dedupnet.adapters.storage.aio.AsyncStore`). Both run the same plans (:mod:`.plan`);
what differs is how a wave reaches its nodes."""

from __future__ import annotations

import functools
import itertools
import os
import socket
import threading
import time
from typing import Any

import redis
import trio
from redis.exceptions import ResponseError

from dedupnet.adapters.storage.aio import ASYNC_TRANSIENT_ERRORS, CONNECT_TIMEOUT, AsyncStore, _Connection, _exchange
from dedupnet.adapters.storage.redis_cluster.plan import ASKING, Plan, Refresh, Wave, execute_plan
from dedupnet.adapters.storage.redis_cluster.slots import Addr, ClusterBatch, SlotMap, admin_client, cluster_seeds, slot_of
from dedupnet.adapters.storage.store import STORE_RETRY, Batch, Steps, Store, T, raise_if_refused, read_replies
from dedupnet.adapters.storage.resp import pack_command
from dedupnet.codec.backoff import Backoff


class ClusterStore(Store):
    """:class:`~dedupnet.adapters.storage.store.Store` on a Redis Cluster; ``store_for("redis+cluster://...")``
    (dedupnet/adapters/storage/store_choice.py) returns one. Keys: see the package docstring."""

    is_cluster = True

    def __init__(self, url: str, prefix: str, *, bucket_bits: int = 10, retry: Backoff = STORE_RETRY,
                 socket_timeout: float = 30.0):
        self._settle(url, prefix, bucket_bits, retry, socket_timeout)
        self.bucket_bits = bucket_bits  # a cluster keeps the layout it always had (store_choice.py)
        if "{" in prefix or "}" in prefix:
            raise ValueError(f"a cluster key prefix cannot contain braces (it becomes the hash tag): {prefix!r}")
        seeds, self.options = cluster_seeds(url)
        self.slots = SlotMap(seeds, self.options)
        self.home_slot = slot_of(f"{{{prefix}}}".encode())
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
        return raise_if_refused(self.run_plan(execute_plan(self, batch)))

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
                out[addr] = _read(sock, sum(2 if c.startswith(ASKING) else 1 for c in sends[addr]))
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


class AsyncClusterStore(AsyncStore):
    """:class:`~dedupnet.adapters.storage.aio.AsyncStore` on a cluster (``on_trio(cluster_store)`` returns
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
            return raise_if_refused(stop.value)
        finally:
            plan.close()

    async def _wave(self, sends: dict[Addr, list[bytes]]) -> dict[Addr, Any]:
        if not self.store.slots.loaded:
            await trio.to_thread.run_sync(self.store.slots.refresh, limiter=self._limiter)
        out: dict[Addr, Any] = {}

        async def one(addr: Addr, cmds: list[bytes]) -> None:
            replies = sum(2 if c.startswith(ASKING) else 1 for c in cmds)
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
        deadline = trio.current_time() + self.store.socket_timeout
        try:
            if conn is None:
                with trio.fail_at(deadline), trio.fail_after(CONNECT_TIMEOUT):
                    conn = _Connection(await trio.open_tcp_stream(*addr))
                options = self.store.options
                if options.get("password") is not None:
                    user = options.get("username")
                    (ok,) = await _exchange(conn, pack_command(b"AUTH", *([user] if user else []),
                                                               options["password"]), 1, deadline)
                    if isinstance(ok, ResponseError):
                        raise ok
            results = await _exchange(conn, payload, replies, deadline)
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

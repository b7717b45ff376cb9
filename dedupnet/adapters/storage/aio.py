"""The adapter between trio and the store: Redis spoken from trio, no thread per call.

The protocol path (the daemons' writes, look-ups and the walker's takes) is written
sans-I/O (:data:`dedupnet.adapters.storage.store.Steps`: generators that yield a
:class:`~dedupnet.adapters.storage.store.Batch` and receive its replies). :meth:`AsyncStore.drive`
runs one on trio: the batch's RESP payload is written to a non-blocking socket and
the replies parsed by ``hiredis`` (the same bytes and parser as :meth:`Store.execute`),
waiting with ``trio.lowlevel.wait_readable``/``wait_writable``. The worker-thread
hand-off it replaces about doubled the client CPU of a small round trip
(``bench/bench_roundtrip.py``).

Several trio tasks share one AsyncStore (reactor, walker, status): each round trip
borrows a connection of a small pool for its whole duration, so replies never
interleave, and a MULTI/EXEC stays one atomic round trip on one connection. Every
round trip runs under a deadline (the store's ``socket_timeout``); a connection that
failed, timed out or was cancelled mid-way is closed, never reused. Connection loss
is retried with the store's back-off (``Store.retry``), then surfaces as
:class:`~dedupnet.codec.errors.StoreUnavailable`, like the synchronous store.

Anything still synchronous (the crawler, status sizes, restarts) runs through
:meth:`AsyncStore.run` in a worker thread; a capacity limiter bounds those threads.
"""

from __future__ import annotations

import functools
import logging
import math
import select
import socket
import time
from typing import Any, TypeVar

import hiredis
import trio
from redis.connection import parse_url
from redis.exceptions import ResponseError

from dedupnet.codec.errors import StoreUnavailable
from dedupnet.adapters.storage.store import TRANSIENT_ERRORS, Batch, Steps, Store, raise_if_refused
from dedupnet.adapters.storage.resp import pack_command

log = logging.getLogger("dedupnet.adapters.storage.aio")

T = TypeVar("T")

#: Errors after which a batch is resent on a fresh connection.
ASYNC_TRANSIENT_ERRORS = TRANSIENT_ERRORS + (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)

CONNECT_TIMEOUT = 5.0
#: Longest a round trip waits for its reply without yielding to other tasks (seconds).
SPIN = 0.002


class _Connection:
    """A connected non-blocking socket and its reply parser. Round trips use the plain
    socket with trio's readiness waits: a trio stream's checkpoints and conflict
    detection cost ~15 µs more per round trip (measured)."""

    def __init__(self, stream: trio.SocketStream):
        # trio connects (happy eyeballs, unix sockets); then the socket is ours.
        self.sock = socket.socket(fileno=stream.socket.detach())
        self.sock.setblocking(False)
        self.reader = hiredis.Reader(replyError=ResponseError)

    def close(self) -> None:
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()


class AsyncStore:
    """``await astore.drive(pools.lookup_steps(...))`` runs a sans-I/O store operation on
    trio; ``await astore.fp_contains(...)`` (any other Store method) still runs it in a
    worker thread."""

    def __init__(self, store: Store, *, max_threads: int = 4, max_connections: int = 4):
        if getattr(store, "is_cluster", False):
            raise TypeError("a cluster store is driven by dedupnet.adapters.storage.store_choice.on_trio")
        self.store = store
        self._limiter = trio.CapacityLimiter(max_threads)
        self._slots = trio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._address = parse_url(store.url)

    # -- the trio-native path ------------------------------------------------------------
    async def drive(self, steps: Steps[T]) -> T:
        """Run a sans-I/O operation, each of its batches one round trip on trio."""
        try:
            batch = next(steps)
            while True:
                batch = steps.send(await self.execute(batch))
        except StopIteration as stop:
            return stop.value
        finally:
            steps.close()

    async def execute(self, batch: Batch) -> list:
        """Like :meth:`Store.execute`: one write, every reply (error replies as
        :class:`ResponseError` objects in the list), retried on connection loss."""
        if not len(batch):
            return []
        payload = batch.payload()
        delays = self.store.retry.delays()
        while True:
            try:
                return await self._round_trip(payload, len(batch))
            except ASYNC_TRANSIENT_ERRORS as e:
                delay = next(delays, None)
                if delay is None:
                    raise StoreUnavailable(f"Redis at {self.store.url} unreachable: {e!r}") from e
                self.store.reconnects += 1
                log.debug("Redis at %s: %r; retrying in %.2fs", self.store.url, e, delay)
                await trio.sleep(delay)

    async def command(self, *args: Any) -> Any:
        return await self.drive(self.store.command_steps(*args))

    async def _round_trip(self, payload: bytes, replies: int) -> list:
        try:  # a free slot is taken without a checkpoint (see _exchange)
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._slots.acquire()
        try:
            conn = self._idle.pop() if self._idle else None
            done = False
            deadline = trio.current_time() + self.store.socket_timeout
            try:
                if conn is None:
                    with trio.fail_at(deadline):
                        conn = await self._connect()
                results = await _exchange(conn, payload, replies, deadline)
                done = True  # the connection is sound even if the server is still loading
                raise_if_refused(results)
            finally:
                if done:
                    self._idle.append(conn)
                elif conn is not None:
                    conn.close()
            self.store.round_trips += 1
            return results
        finally:
            self._slots.release()

    async def _connect(self) -> _Connection:
        address = self._address
        with trio.fail_after(CONNECT_TIMEOUT):
            if "path" in address:
                stream = await trio.open_unix_socket(address["path"])
            else:
                stream = await trio.open_tcp_stream(address.get("host", "localhost"), address.get("port", 6379))
        conn = _Connection(stream)
        try:
            hello = []
            if address.get("password") is not None:
                user = address.get("username")
                hello.append(pack_command(b"AUTH", *([user] if user else []), address["password"]))
            if address.get("db"):
                hello.append(pack_command(b"SELECT", address["db"]))
            if hello:
                for reply in await _exchange(conn, b"".join(hello), len(hello), math.inf):
                    if isinstance(reply, ResponseError):
                        raise reply
        except BaseException:
            conn.close()
            raise
        return conn

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()

    # -- anything still synchronous: a worker thread ---------------------------------------
    async def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=self._limiter)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        if not callable(method):
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self.run(method, *args, **kwargs)

        call.__name__ = name
        return call


async def _exchange(conn: _Connection, payload: bytes, replies: int, deadline: float) -> list:
    """Send ``payload``, read ``replies`` replies; :class:`trio.TooSlowError` if it has to
    wait past ``deadline`` (trio's clock). Only a wait that parks the task has a cancel
    scope: entering and leaving one on every round trip cost about as much as the rest
    of the round trip's own work, and the reply usually comes within the spin.

    A reply that is not there yet is first waited for in ``poll`` for up to ``SPIN``
    seconds (the GIL released), and only then by parking the task. A nearby Redis
    answers in tens of microseconds, while parking costs a whole turn of trio's run
    queue: on a busy daemon (a crawler's hundred tasks) that is tens of milliseconds,
    and the reactor, which awaits each event's round trip before the next event, then
    handled a few dozen events a second — the latency of every set. Not a checkpoint
    unless it waited: callers that loop (:class:`~dedupnet.adapters.runtime.Reactor`) yield on
    their own schedule."""
    sock, reader = conn.sock, conn.reader
    await trio.lowlevel.checkpoint_if_cancelled()
    view = memoryview(payload)
    while view:
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            await _park(trio.lowlevel.wait_writable, sock, deadline)
    results: list = []
    spin_until = time.monotonic() + SPIN
    poller = None
    while len(results) < replies:
        try:
            data = sock.recv(1 << 18)
        except BlockingIOError:
            spin = spin_until - time.monotonic()
            if spin > 0 and poller is None:
                # poll, not select: select() refuses descriptors past FD_SETSIZE (1,024),
                # which a process with a few dozen daemons and their crawlers passes.
                poller = select.poll()
                poller.register(sock, select.POLLIN)
            if spin <= 0 or not poller.poll(spin * 1000):
                await _park(trio.lowlevel.wait_readable, sock, deadline)
            continue
        if not data:
            raise ConnectionError("connection closed by server")
        reader.feed(data)
        while (reply := reader.gets()) is not False:
            results.append(reply)
    return results


async def _park(wait: Any, sock: socket.socket, deadline: float) -> None:
    with trio.move_on_at(deadline) as scope:
        await wait(sock)
    if scope.cancelled_caught:
        raise trio.TooSlowError

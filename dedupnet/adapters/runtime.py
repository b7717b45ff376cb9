"""What both daemons need around a sans-I/O core: serial event processing, timers,
the store on trio (worker threads for what is still synchronous), and the embedded
Redis when no URL is given, kept running (:func:`supervise_redis`)."""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import signal
import time
import weakref
from pathlib import Path
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio
from redis.exceptions import OutOfMemoryError, RedisError, ResponseError

from dedupnet.codec import wire
from dedupnet.codec.backoff import Backoff
from dedupnet.adapters import datadir
from dedupnet.adapters.storage.embedded import EmbeddedRedis, EmbeddedRedisError
from dedupnet.codec.errors import DedupnetError, SettingsError
from dedupnet.codec.messages import Heartbeat, Status
from dedupnet.adapters.storage.watermark import Watermarks, heard_steps, own_steps, save_heard_steps
from dedupnet.adapters.storage.store import Store
from dedupnet.adapters.storage.store_choice import store_for
from dedupnet.adapters.net.transport import Connection

log = logging.getLogger("dedupnet.adapters.runtime")


@contextlib.contextmanager
def open_store(redis_url: str | None, prefix: str, *, data_dir: str | None, bucket_bits: int = 0,
               durable_acks: bool = False, maxmemory: str | None = None) -> Iterator[tuple[Store, EmbeddedRedis | None]]:
    """A store on ``redis_url``, or on an embedded server (persistent when it has a
    ``data_dir``), and that server (None with ``redis_url``): the daemon runs
    :func:`supervise_redis` on it. Must be entered from the main thread, before
    ``trio.run``: the embedded server dies with the thread that started it.
    ``durable_acks``: the embedded server fsyncs every write before its reply
    (``appendfsync always``), so a daemon's wait for the disk costs no server tick
    (docs/DECISIONS.md, "Durable acknowledgements"). ``maxmemory``: the embedded server's,
    given on its command line so that a restart of it keeps it (a ``CONFIG SET`` would not)."""
    with contextlib.ExitStack() as stack:
        server = None
        if redis_url is None and data_dir is not None:  # one daemon per data dir (dedupnet/adapters/datadir.py)
            stack.enter_context(datadir.hold(data_dir))
        if redis_url is None:
            config = {"appendfsync": "always"} if durable_acks and data_dir is not None else {}
            if maxmemory is not None:
                config["maxmemory"] = maxmemory
            server = EmbeddedRedis(persistent=data_dir is not None, data_dir=data_dir, config=config)
            redis_url = stack.enter_context(server)
            if data_dir is not None:  # so `dedupnet push --data-dir` finds this daemon's Redis
                url_file = Path(data_dir) / "redis.url"
                url_file.write_text(redis_url + "\n")
                stack.callback(url_file.unlink, missing_ok=True)
        _origins[redis_url] = "--redis" if server is None else f"the embedded Redis's log, {server.log_path}"
        try:
            store = store_for(redis_url, prefix, bucket_bits=bucket_bits)
        except ValueError as exc:  # a URL redis-py cannot read: the flag that gave it is what to fix
            raise SettingsError(f"--redis {redis_url}: {exc}") from None
        stack.callback(store.close)
        yield store, server


class RedisDied(EmbeddedRedisError):
    """The daemon's embedded server died and could not be kept running."""

    reason = "redis-died"


#: Seconds between two looks at the embedded server's process.
SUPERVISE_POLL = 0.2
#: Attempts to start a dead server again before the daemon gives up.
RESTART_ATTEMPTS = 3
#: Between two attempts to start it again (one process restarting its own server: no jitter).
RESTART_BACKOFF = Backoff(first=0.5, cap=4.0)
#: A server that died this often within ``RESTART_WINDOW`` seconds keeps dying: give up.
MAX_RESTARTS, RESTART_WINDOW = 5, 60.0


async def supervise_redis(server: EmbeddedRedis, counters, *, poll: float = SUPERVISE_POLL,
                          attempts: int = RESTART_ATTEMPTS) -> None:
    """Keep the embedded server this daemon started running: one that died (OOM killer,
    crash, ``kill -9``) is started again on its port and data dir, and the daemon carries
    on (its store calls wait in :func:`until_stored` meanwhile and go on when it answers;
    a persistent server reads its AOF back). A daemon whose Redis is gone can do nothing,
    so when the server cannot be started again (``attempts`` in a row fail) or keeps
    dying (``MAX_RESTARTS`` in ``RESTART_WINDOW`` seconds), this raises
    :class:`RedisDied` with one line saying why: the daemon exits non-zero and a service
    manager can restart it, instead of staying alive and stuck. Runs until cancelled."""
    restarts: list[float] = []
    while True:
        await trio.sleep(poll)
        status = server.exit_status()
        if status is None:
            continue
        pid = server.pid
        how = f"killed by {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"
        now = trio.current_time()
        restarts = [t for t in restarts if now - t < RESTART_WINDOW] + [now]
        if len(restarts) > MAX_RESTARTS:
            raise RedisDied(f"its embedded Redis (pid {pid}) died ({how}), {len(restarts)} times in "
                            f"{RESTART_WINDOW:g} s: not restarting it again")
        counters.inc("redis_restarts")
        where = server.data_dir or "a temporary directory (its data is lost)"
        log.error("embedded Redis (pid %d) died (%s): restarting it on %s", pid, how, where)
        for attempt in range(1, attempts + 1):
            try:
                url = await trio.to_thread.run_sync(server.restart)
            except EmbeddedRedisError as exc:
                why = str(exc).splitlines()[0]
                if attempt == attempts:
                    raise RedisDied(f"its embedded Redis (pid {pid}) died ({how}) and could not be restarted "
                                    f"on {where}: {why}") from None
                log.warning("restarting embedded Redis failed (attempt %d of %d): %s", attempt, attempts, why)
                await trio.sleep(RESTART_BACKOFF.delay(attempt))
            else:
                log.warning("embedded Redis restarted (pid %s) at %s; carrying on", server.pid, url)
                break


#: Between two tries of a daemon's store call while Redis does not answer. Jittered: the
#: many calls of a daemon waiting on one Redis do not all ask again in the same instant.
STORE_WAIT = Backoff(first=0.1, cap=5.0, jitter=0.5)


async def until_stored(astore, counters, fn: Callable, *args: Any) -> Any:
    """Run a store call until it succeeds. A Redis that goes away stops the daemon's
    progress, never its state: the core's writes and sends wait here, logged and
    counted, and go on when Redis is back (:data:`STORE_WAIT`). A generator function
    (a sans-I/O ``*_steps`` operation) runs on trio with ``astore.drive``, started
    afresh on each attempt; anything else in a worker thread."""
    native = inspect.isgeneratorfunction(fn)
    failures = 0
    while True:
        try:
            result = await (astore.drive(fn(*args)) if native else astore.run(fn, *args))
        except OutOfMemoryError as e:  # MemoryFull too; said once, when the daemon finds its Redis full (_Room)
            counters.inc("store_errors")
            await _room(astore.store).fill(astore, counters, e)
        except (DedupnetError, RedisError) as e:
            counters.inc("store_errors")
            _complain(astore.store.url, getattr(fn, "__name__", fn), e)
        else:
            room = _rooms.get(astore.store)
            if room is not None and room.full:
                await room.look(astore, counters)
            return result
        failures += 1
        await trio.sleep(STORE_WAIT.delay(failures))


#: Seconds between two looks at whether a full Redis has room again, and the longest one
#: look may take: new work waits for it (:func:`until_room`), never in a busy loop.
ROOM_POLL, ROOM_LOOK_TIMEOUT = 1.0, 2.0
#: The room a full Redis must have again before new work is taken: this fraction of its
#: ``maxmemory``, at most ``ROOM_TO_RESUME_CAP`` bytes. Taking work again at the first
#: byte freed would fill it again at once, and say so, over and over.
ROOM_TO_RESUME, ROOM_TO_RESUME_CAP = 0.05, 64 << 20
#: The key a look writes: a write the server refuses while it is past its maxmemory.
ROOM_PROBE = "room_probe"


class _Room:
    """Whether this daemon's Redis is past its ``maxmemory``, as the daemon last found it.

    A full Redis refuses writes (``-OOM``), and the daemon cannot do anything it would
    have to acknowledge: the writes it needs wait in :func:`until_stored`, as for a
    Redis that is down, and acknowledge nothing they did not store. Taking new work
    meanwhile would only pile it up in memory (pages fetched, URLs taken from URL_pool),
    so what takes it waits in :func:`until_room`, and the operator is told once, when
    it fills and when it has room again (gauge ``store_memory_full``), not every few
    seconds as for each call of a Redis that is down."""

    def __init__(self) -> None:
        self.full = False
        #: Set while full (:func:`watch_room` waits for it), and while not (:func:`until_room`).
        self.filled, self.freed = trio.Event(), trio.Event()
        self.freed.set()
        self._next_look = -math.inf
        self._looking = False

    async def fill(self, astore, counters, exc: BaseException) -> None:
        if self.full:
            return
        self.full, self.freed = True, trio.Event()
        self.filled.set()
        self._next_look = trio.current_time() + ROOM_POLL
        counters.set_gauge("store_memory_full", 1)
        memory = await _memory(astore)
        used = f"{_mib(memory[0])} used of maxmemory {_mib(memory[1])}" if memory else str(exc)
        log.error("Redis at %s (keys %s:*) is full (%s): taking no new work until memory is freed; what this "
                  "daemon has acknowledged stays stored, and what waits to be written goes on once Redis takes "
                  "writes (docs/DEPLOY.md, \"Sizing memory\")", astore.store.url, astore.store.prefix, used)

    async def look(self, astore, counters) -> None:
        """Has the full Redis room again? A write of our own (refused while it is full)
        and its memory, at most every ``ROOM_POLL`` seconds, one look at a time."""
        now = trio.current_time()
        if not self.full or self._looking or now < self._next_look:
            return
        self._looking, self._next_look = True, now + ROOM_POLL
        try:
            with trio.move_on_after(ROOM_LOOK_TIMEOUT):
                await astore.command(b"SET", astore.store.key(ROOM_PROBE), b"1")
                memory = await _memory(astore)
                if memory is None or not memory[1] or memory[0] <= memory[1] - _room_to_resume(memory[1]):
                    self.full, self.filled = False, trio.Event()
                    self.freed.set()
                    counters.set_gauge("store_memory_full", 0)
                    used = f"{_mib(memory[0])} used of maxmemory {_mib(memory[1])}" if memory and memory[1] else \
                        "no maxmemory" if memory else "it takes writes"
                    log.warning("Redis at %s (keys %s:*) has room again (%s): taking new work", astore.store.url,
                                astore.store.prefix, used)
        except (DedupnetError, RedisError):
            pass  # still full, or gone: the next look asks again
        finally:
            self._looking = False


_rooms: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _room(store: Store) -> _Room:
    room = _rooms.get(store)
    if room is None:
        room = _rooms[store] = _Room()
    return room


def _room_to_resume(maxmemory: int) -> int:
    return min(int(maxmemory * ROOM_TO_RESUME), ROOM_TO_RESUME_CAP)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


async def _memory(astore) -> tuple[int, int] | None:
    """``(used, maxmemory)`` as the server counts them for its limit (without the
    replication and AOF buffers), or None if it does not say (a cluster, INFO refused)."""
    if getattr(astore.store, "is_cluster", False):
        return None
    try:
        with trio.move_on_after(ROOM_LOOK_TIMEOUT):
            text = await astore.command(b"INFO", b"memory")
            info = dict(line.split(":", 1) for line in text.decode().splitlines() if ":" in line)
            used = int(info["used_memory"]) - int(info.get("mem_not_counted_for_evict", 0))
            return used, int(info["maxmemory"])
    except (DedupnetError, RedisError, KeyError, ValueError):
        pass
    return None


async def until_room(astore, counters) -> None:
    """Wait while this daemon's Redis is full (:class:`_Room`): called before taking
    new work. Returns at once when it is not."""
    room = _rooms.get(astore.store)
    while room is not None and room.full:
        with trio.move_on_after(ROOM_POLL):
            await room.freed.wait()
        await room.look(astore, counters)


async def watch_room(astore, counters) -> None:
    """Look for room while this daemon's Redis is full even when nothing of the daemon
    asks Redis anything (an idle center): its gauge and its log say when it is not full
    any more. Runs until cancelled."""
    room = _room(astore.store)
    while True:
        await room.filled.wait()
        await until_room(astore, counters)


#: ``maxmemory-policy`` values that never drop a key dedupnet keeps.
KEEPS_EVERY_KEY = ("noeviction",)


def _policy_steps(store: Store):
    batch = store.batch()
    batch.add(b"CONFIG", b"GET", b"maxmemory-policy")
    (reply,) = yield batch
    if isinstance(reply, ResponseError):  # CONFIG refused to this user, or renamed away
        return ""
    return dict(zip(reply[::2], reply[1::2])).get(b"maxmemory-policy", b"").decode()


async def check_memory(astore, counters, store: Store) -> None:
    """Refuse a Redis that evicts keys when full: an evicted fingerprint bucket would let
    its URLs be admitted again, an evicted pool lose what was acknowledged, silently.
    One that does not tell its policy (``CONFIG`` refused) is used, with one WARNING.
    Shows ``store_memory_full`` from the start, so it can be alerted on."""
    counters.set_gauge("store_memory_full", 0)
    if getattr(store, "is_cluster", False):
        return
    await until_stored(astore, counters, _bucket_layout, store)  # in a worker thread: see open_watermarks
    policy = await until_stored(astore, counters, _policy_steps, store)
    if not policy:
        log.warning("Redis at %s does not say its maxmemory-policy; it must be noeviction, or keys dedupnet keeps "
                    "are dropped when it is full", store.url)
    elif policy not in KEEPS_EVERY_KEY:
        raise SettingsError(f"Redis at {store.url} has maxmemory-policy {policy}: when full it drops keys, and "
                            f"with them URLs already crawled or acknowledged; set it to noeviction (CONFIG SET "
                            f"maxmemory-policy noeviction, and in its redis.conf), or give dedupnet a Redis of its own")


#: Seconds between two lines about one Redis that does not answer, however many calls wait on it.
COMPLAIN_EVERY = 5.0
_last_complaint: dict[str, float] = {}
#: What to check for a store's URL, by URL (open_store fills it): the flag that named it.
_origins: dict[str, str] = {}


def _complain(url: str, call: str, exc: BaseException) -> None:
    now = time.monotonic()
    if now - _last_complaint.get(url, -math.inf) < COMPLAIN_EVERY:
        return
    _last_complaint[url] = now
    text = str(exc) if url in str(exc) else f"Redis at {url}: {exc}"
    log.error("Redis call %s failed: %s; retrying until it answers (check %s)", call, text,
              _origins.get(url, "--redis"))


async def check_durable(astore, counters, store: Store) -> None:
    """With ``durable_acks``: find out whether this daemon's Redis can say when a write is
    on disk (``WAITAOF``), so that the messages depending on an event's writes go only
    after them. A Redis that cannot (its AOF off, too old, never fsyncing) is still used,
    with one WARNING: a power cut can then lose what was acknowledged."""
    why = await until_stored(astore, counters, store.durable_check_steps)
    store.durable = why is None
    counters.set_gauge("durable_acks", int(store.durable))
    if why is not None:
        log.warning("acknowledgements are not durable: Redis at %s: %s. A power cut can lose writes this daemon "
                    "has acknowledged; give it a Redis with appendonly yes (Redis 7.2+ or Valkey 8+)", store.url, why)


class Changes:
    """Wakes whoever waits for a condition on some state each time that state changes:
    what a loop would otherwise poll for. The changer calls :meth:`notify`; a waiter
    checks its condition again on each wake-up, and bounds its wait with a deadline of
    its own."""

    def __init__(self) -> None:
        self._lot = trio.lowlevel.ParkingLot()

    def notify(self) -> None:
        self._lot.unpark_all()

    async def next(self) -> None:
        """Until the next change."""
        await self._lot.park()

    async def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._lot.park()


class Timers:
    """One-shot timers keyed by a number; fired ones are posted as events."""

    def __init__(self, post: Callable[[Any], None], make_event: Callable[[int], Any]):
        self._post = post
        self._make = make_event
        self._due: dict[int, float] = {}
        self._changed = trio.Event()

    def set(self, key: int, delay: float) -> None:
        self._due[key] = trio.current_time() + delay
        self._changed.set()

    def cancel(self, key: int) -> None:
        self._due.pop(key, None)

    def __len__(self) -> int:
        return len(self._due)

    async def run(self) -> None:
        while True:
            self._changed = trio.Event()
            deadline = min(self._due.values(), default=math.inf)
            with trio.move_on_at(deadline):
                await self._changed.wait()
                continue
            now = trio.current_time()
            for key in [k for k, t in self._due.items() if t <= now]:
                del self._due[key]
                self._post(self._make(key))


#: Longest a reactor handles queued events without letting other tasks run (seconds).
YIELD_AFTER = 0.01


class Reactor:
    """Feeds events to a core one at a time; ``execute`` carries out the actions of
    one event and returns its look-ups as zero-argument async callables, which are
    awaited one by one, each right before its result is handled, before any other
    event. Back-pressure: a bounded inbox.

    Two lanes: events put ``urgent`` are handled before any waiting in the other lane.
    A center puts its peer centers' messages there: a peer's frame or ack is one of a
    few in flight between two networks, and waiting behind every set the LAN's hosts
    keep unacknowledged (up to ``max_unacked`` each) made a routed frame's round trip,
    and so the URLs that cross between networks, as slow as the LAN's whole backlog.
    Events from one connection must all use one lane (its join, its messages and its
    leave stay in order); between connections no order is promised anyway.

    An event put with an ``origin`` (the :class:`Connection` its message came on)
    that raises while it is handled — in the core, or in carrying out its actions —
    fails that connection only (:meth:`Connection.fail`): the exception is raised
    from the receive of that connection's handler, which logs and counts it and
    closes the connection, as for any other failure of a peer. So nothing a peer
    sends ends the daemon; an event of the daemon's own (a timer, a look-up of its
    own) that raises is a bug of the daemon and still ends it."""

    def __init__(self, handle: Callable[[Any], list], execute: Callable[[list], Awaitable[list]], *, inbox: int = 4096):
        self._handle = handle
        self._execute = execute
        self._lanes = (trio.open_memory_channel(inbox), trio.open_memory_channel(inbox))  # (urgent, other)
        self._arrived = trio.lowlevel.ParkingLot()
        self._busy = 0
        self._nursery: trio.Nursery | None = None
        #: Notified each time an event has been handled: :attr:`idle` may have changed.
        self.changes = Changes()

    def _lane(self, urgent: bool) -> Any:
        return self._lanes[0 if urgent else 1][0]

    def post(self, event: Any, *, urgent: bool = False) -> None:
        """From a trio task that must not wait (timers, a connection's end). Never
        drops the event: with the inbox full, a helper task waits for room (in
        order with the other waiting senders) while the reactor runs; before it
        runs, a full inbox raises trio.WouldBlock."""
        try:
            self._lane(urgent).send_nowait((event, None))
        except trio.WouldBlock:
            if self._nursery is None:
                raise
            self._nursery.start_soon(self._send, self._lane(urgent), (event, None))
        else:
            self._arrived.unpark_all()

    async def put(self, event: Any, origin: Connection | None = None, *, urgent: bool = False) -> None:
        """``origin``: the connection whose message made ``event``; it is failed,
        not the daemon, if handling ``event`` raises."""
        await self._send(self._lane(urgent), (event, origin))

    async def _send(self, lane: Any, item: tuple[Any, Connection | None]) -> None:
        await lane.send(item)
        self._arrived.unpark_all()

    def pending(self) -> int:
        return sum(send.statistics().current_buffer_used for send, _ in self._lanes)

    def _next(self) -> tuple[Any, Connection | None] | None:
        for _, receive in self._lanes:
            try:
                return receive.receive_nowait()
            except trio.WouldBlock:
                pass
        return None

    async def run(self) -> None:
        """Handles what is in the inbox back to back, yielding to other tasks every
        ``YIELD_AFTER`` seconds: a receive per event would wait a turn of trio's run
        queue each (a checkpoint), which on a busy daemon is most of an event's cost."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                while True:
                    item = self._next()
                    if item is None:
                        await self._arrived.park()  # no checkpoint between the look and the park
                        continue
                    await self._guarded(*item)
                    turn_ends = trio.current_time() + YIELD_AFTER
                    while trio.current_time() < turn_ends and (item := self._next()) is not None:
                        await self._guarded(*item)
                    await trio.lowlevel.checkpoint()
            finally:
                self._nursery = None

    async def _guarded(self, event: Any, origin: Connection | None) -> None:
        if origin is None:
            await self.process(event)
            return
        try:
            await self.process(event)
        except Exception as exc:
            origin.fail(exc)

    @property
    def idle(self) -> bool:
        """No event waiting and none being handled."""
        return not self._busy and self.pending() == 0

    async def process(self, event: Any) -> None:
        self._busy += 1
        try:
            await self._process(event)
        finally:
            self._busy -= 1
            self.changes.notify()

    async def _process(self, event: Any) -> None:
        queue = [event]
        while queue:
            item = queue.pop(0)
            if callable(item):
                # A deferred look-up: done only now, so it sees every write made while
                # handling the results before it.
                item = await item()
            actions = self._handle(item)
            queue[:0] = await self._execute(actions)


#: Heartbeat intervals after which a busy link carries a heartbeat all the same: what
#: only a heartbeat says (the sender's store watermark, a host's task_pool size) stays fresh.
BEAT_EVERY = 10


def beat(conn: Connection, data: bytes, interval: float, lean: bytes | None = None) -> bool:
    """Send heartbeat ``data`` on ``conn`` if one is due (called once per ``interval``);
    True if it went. Any message counts as a heartbeat at the receiver, so a link that
    carried one in the last half interval needs none (on busy links heartbeats were most
    of the messages), except every ``BEAT_EVERY`` intervals. ``lean``: the heartbeat
    without the store watermark, sent instead except on the connection's first heartbeat
    and every ``BEAT_EVERY``-th: the watermark was half of an idle link's bytes, and a
    busy link's receiver hears it no more often than that."""
    now = trio.current_time()
    if now - conn.last_sent < interval / 2 and now - conn.last_beat < BEAT_EVERY * interval:
        return False
    conn.send_urgent(data if lean is None or conn.beats % BEAT_EVERY == 0 else lean)
    conn.last_beat = now
    conn.beats += 1
    return True


def heartbeat(ip: str, tasks: int | None = None, store: tuple[str, int] | None = None) -> bytes:
    """A heartbeat as PROTOCOL.md section 4 has it: the sender's wall clock, seconds
    since the Unix epoch, so a peer or an operator reading the wire can compare clocks.
    Liveness never reads it (a message's arrival is what counts), so the daemons' own
    timing stays on trio's monotonic clock. ``store``: the sender's store watermark."""
    return wire.encode(Heartbeat(ip, round(time.time(), 3), tasks, store))


def _bucket_layout(store: Store) -> int:
    return store.bucket_bits


async def open_watermarks(astore, counters, store: Store) -> Watermarks:
    """Read this store's watermark (writing its incarnation into an empty store) and what
    was heard from the members' stores before a restart. The store's bucket layout is
    read (or recorded) first, in a worker thread: its first use would otherwise block
    the event loop on a Redis that does not answer (dedupnet/adapters/storage/buckets.py)."""
    await until_stored(astore, counters, _bucket_layout, store)
    store.watermark = await until_stored(astore, counters, own_steps, store)
    heard = await until_stored(astore, counters, heard_steps, store)
    log.info("store watermark: incarnation %s, durable step %d", *store.watermark)
    return Watermarks(counters, heard)


async def keep_watermarks(astore, counters, store: Store, marks: Watermarks, interval: float) -> None:
    """Write what was heard back now and then: a record lost in a crash only makes this
    daemon miss one member's rewind, and a heartbeat must never wait for a write."""
    while True:
        await trio.sleep(interval)
        changed = marks.changed()
        if changed:
            await until_stored(astore, counters, save_heard_steps, store, changed)


async def stop_on_signals(scope: trio.CancelScope) -> None:
    """SIGINT/SIGTERM cancel ``scope``: the daemon leaves its nursery in order. Every
    pending set is in Redis already (each event's writes are one transaction), so
    stopping at any point loses nothing."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("%s received: shutting down", signal.Signals(signum).name)
            scope.cancel()
            return


#: Seconds a control connection (``dedupnet status``, ``reassign``) is served.
CONTROL_IDLE = 60


async def control_session(conn: Connection, status: Callable[[], Awaitable[dict]],
                          other: Callable[[Any], Awaitable[None]] | None = None) -> None:
    """Serve an operator's tool (``dedupnet status``; with ``other``, the daemon's further
    requests) until it hangs up or for ``CONTROL_IDLE`` seconds."""
    with trio.move_on_after(CONTROL_IDLE):
        while True:
            message = await conn.receive()
            if isinstance(message, Status) and message.request:
                conn.send_nowait(wire.encode(Status(False, await status())))
            elif other is not None and not isinstance(message, Heartbeat):
                await other(message)

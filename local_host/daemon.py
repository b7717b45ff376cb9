"""``dedupnet local``: the host core wired to its center, its Redis and its URL_pool.

The host connects to its center (source address bound to its own IP, so the center
can trust who it is), registers, sends heartbeats, and re-sends every frame the
center has not acknowledged each time it (re)connects. A center silent for
``heartbeat_timeout`` is given up and dialled again, as the center does with a silent
host: a stopped center whose TCP connection stays open must not hold the host's sets. A walker takes new entries
from ``URL_pool`` while fewer than ``max_unacked`` frames are in flight.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from dedupnet.adapters.storage.store_choice import on_trio
from dedupnet.codec import wire
from dedupnet.codec.auth import keyring_from
from dedupnet.codec.messages import Ack, Heartbeat, Register, Task
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.storage.recrawl import SLICES
from dedupnet.codec.ages import RecrawlPolicy
from dedupnet.codec.numbers import host_id_from_ip
from dedupnet.codec.settings import declared
from dedupnet.adapters.runtime import (Changes, Reactor, check_durable, check_memory, control_session, beat,
                                      heartbeat, keep_watermarks, open_watermarks, until_room, until_stored,
                                      watch_room)
from dedupnet.adapters.monitor.census import CrawlCensus
from dedupnet.adapters.storage.watermark import Behind, Watermarks, log_reaches, untag
from dedupnet.adapters.storage.store import TASK_POOL, URL_POOL, Store
from dedupnet.adapters.net.tls import TLSConfig, center_uri, client_context
from dedupnet.adapters.net.transport import Connection, ConnectionClosed, connect_forever, serve, watch_keyrings
from dedupnet.adapters.monitor.status_page import serve_status

from . import protocol as hp
from .crawler.crawl import Crawler, CrawlerSettings
from .frontier import sites
from .pools import WRITES, HostPools

log = logging.getLogger("dedupnet.local")

#: The member name a host keeps its center's watermark under.
CENTER = "center"

#: Longest wait of a loop that is woken by what makes its work (the report loop, the
#: compactor, the task count): a safety look for what changed where nothing here rings.
RECHECK = 5.0
#: The walker's longest wait on a host with a crawler: what `dedupnet push` writes from
#: another process rings nothing here, and is taken within this.
PUSH_RECHECK = 0.5
#: The walker's sleep while the core has not yet handled what it was given.
BUSY_POLL = 0.005
#: Longest wait of a leaving host between two reads of what it still has to send.
LEAVE_RECHECK = 0.5
#: Seconds between two looks for URLs to seal into blocks when there were none.
COMPACT_INTERVAL = 1.0
#: Seconds between two asks, while this host is idle, whether the whole crawl is
#: complete (``exit_when_complete``): each ask is two passes over every daemon.
COMPLETION_POLL = 1.0


@dataclass
class LocalSettings:
    network: int
    ip: str
    lan: str
    center: tuple[str, int]
    listen_port: int = 0  # status port on ``ip``; 0 picks a free one
    host_id: int | None = None  # default: the host part of ip in lan
    #: The fields made with ``declared`` carry the operator's setting of that name
    #: (dedupnet/codec/settings.py: its default and help are there).
    set_size: int = declared("set_size")
    mode: str = declared("mode")
    max_unacked: int = 64
    heartbeat_interval: float = declared("heartbeat_interval")
    #: A center silent this long (no heartbeat, no other message) is given up: the
    #: connection is closed and dialled again, and the unacknowledged sets go again.
    heartbeat_timeout: float = declared("heartbeat_timeout")
    idle_poll: float = 0.05
    max_frame_size: int = declared("max_frame_size")
    max_urls: int = declared("max_urls_per_set")
    compress: bool = declared("compress")  # offer zstd bodies to the center (used if it accepts)
    metrics: tuple[str, int] | None = None
    #: Address the status port binds (e.g. 0.0.0.0); default ``ip``.
    listen_host: str | None = None
    #: Run the crawler on this host's task_pool; None = protocol only.
    crawler: CrawlerSettings | None = None
    #: Seed URLs, put into URL_pool at start: they go through the protocol like any link.
    seeds: list[str] = field(default_factory=list)
    #: Fault injection for tests and the simulation: every protocol message this host
    #: sends waits this long first, as from a host too busy to answer in time. 0 in use.
    send_delay: float = 0.0
    #: The LAN key file (dedupnet/codec/auth.py): every message to and from the
    #: center is tagged; also required of ``dedupnet status`` clients. None: untagged.
    lan_key_file: str | None = declared("lan_key_file")
    key_poll_interval: float = declared("key_poll_interval")
    #: With ``tls.lan_tls``: TLS to the center, whose certificate must name this
    #: host's network (dedupnet/adapters/net/tls.py). None or without lan_tls: plain TCP.
    tls: TLSConfig | None = None
    #: Re-crawl by age (dedupnet/adapters/storage/recrawl.py): finish_URL counts a URL as crawled for its
    #: age only, and the crawler's seed re-crawl goes through URL_pool. None: for ever.
    recrawl: RecrawlPolicy | None = None
    #: Leaving (:meth:`LocalDaemon.leave`): seconds the pages on the wire get to finish,
    #: and the whole leave may take.
    stop_grace: float = declared("stop_grace")
    stop_timeout: float = declared("stop_timeout")
    #: Ask the center for the crawl's verdict while idle, and set ``LocalDaemon.complete``
    #: once the whole crawl is complete (the command then leaves as on SIGTERM).
    exit_when_complete: bool = declared("exit_when_complete")
    durable_acks: bool = declared("durable_acks")
    #: ``(host, port)`` of the URLFrontier service (local_host/frontier/service.py); None: off.
    frontier: tuple[str, int] | None = None
    #: Frames the center acknowledged, kept (``URL_pool:released``) to send again if the
    #: center's store comes back behind (dedupnet/adapters/storage/watermark.py); 0: none.
    rewind_log: int = 256


def core_config(settings: LocalSettings) -> hp.HostConfig:
    """The core's configuration from the daemon's settings (shared with the deterministic
    simulation, dedupnet/harness/dst, so both run the same core)."""
    host_id = settings.host_id if settings.host_id is not None else host_id_from_ip(settings.ip, settings.lan)
    return hp.HostConfig(settings.ip, settings.network, host_id, settings.set_size, settings.mode,
                         settings.max_unacked)




class LocalDaemon:
    def __init__(self, settings: LocalSettings, store: Store, counters: Counters | None = None):
        self.settings = settings
        self.counters = counters or Counters()
        self.core = hp.HostProtocol(core_config(settings), self.counters)
        #: The highest store watermark heard from the center (set up by run()).
        self.marks = Watermarks(self.counters)
        self.pools = HostPools(store, exact=settings.mode == "exact", recrawl=settings.recrawl,
                               release_log=settings.rewind_log, center_step=lambda: self.marks.step_of(CENTER))
        self.store = on_trio(store)
        self.reactor = Reactor(self.core.handle, self._execute)
        self.conn: Connection | None = None
        self.conn_changes = Changes()
        self.port = settings.listen_port
        self.http_port: int | None = None  # the bound port of settings.metrics (--http), once serving
        crawler = settings.crawler
        if crawler is not None and settings.recrawl is not None:
            crawler = dataclasses.replace(crawler, recrawl=settings.recrawl)
        self.crawler = Crawler(store, crawler, self.counters, consumer=settings.ip) if crawler else None
        self.crawler_scope = trio.CancelScope()
        self._pushed = trio.Event()  # the crawler put links into URL_pool, or the core freed room: walk
        #: Set when a report may be due (tasks finished, an ack stored, a connection):
        #: what the report loop waits for instead of reading tasks_done on a timer.
        self._report_due = trio.Event()
        #: Set when task_pool may have changed size or taken URLs to seal: what the task
        #: count and the compactor wait for (one event each).
        self._tasks_changed_count, self._tasks_changed_compact = trio.Event(), trio.Event()
        self._moved = True  # tasks_moved may hold tasks to drop (at start: left from before a restart)
        if self.crawler is not None:
            self.crawler.on_commit = lambda: self._pushed.set()
            self.crawler.on_done = self._tasks_done
        self.handed_back: trio.Event | None = None
        self._handing_back: int | None = None
        #: Called with the entries the walker takes from URL_pool (the simulation times
        #: discovery-to-admission latency with it).
        self.on_found: Callable[[list[tuple[bytes, str]]], None] | None = None
        #: The LAN's keyring (None: not authenticated), re-read while running.
        self.lan_keyring = keyring_from(settings.lan_key_file)
        #: task_pool's size when last read: each heartbeat tells the center, so that a
        #: host that goes down is known to hold it (None: not read yet).
        self.task_pool_size: int | None = None
        #: The URLFrontier service's queues and its bound port, once it serves.
        self.frontier = None
        self.frontier_port: int | None = None
        #: Set once the center says the whole crawl is complete and nothing happened here
        #: since it was asked (``exit_when_complete``).
        self.complete = trio.Event()
        #: Messages from the center and URLs taken from URL_pool: what says this host
        #: was not idle while the center was being asked.
        self._activity = 0
        self.census = CrawlCensus(settings.center, lambda: [self.lan_keyring], logger=log, setting="its center",
                                  without="this host keeps running", with_verdict="this host exits once the crawl "
                                  "is complete")

    def _tasks_done(self) -> None:
        """Finished tasks were written (with their reports-to-be, in tasks_done)."""
        self._report_due.set()
        self._task_pool_changed()

    def _task_pool_changed(self) -> None:
        self._tasks_changed_count.set()
        self._tasks_changed_compact.set()

    def _say_resumed(self) -> None:
        """One line when the store is not new (its sequence has numbered sets): a host
        started again on an old data directory goes on from what it holds, and seeds it
        crawled before are dropped as crawled, which an operator who meant a fresh start
        must be told."""
        store = self.pools.store
        numbered = int(store.command(b"GET", store.key("number_seq")) or 0)
        sizes = self.pools.sizes()
        if not (numbered or any(sizes.values())):
            return
        log.warning("resuming from an existing store (%s, prefix %s): %d sets numbered before, task_pool %d, "
                    "URL_pool %d, %d sets not acknowledged by the center", store.url, store.prefix, numbered,
                    sizes[TASK_POOL], sizes[URL_POOL], sizes["unacked_sets"])

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await until_stored(self.store, self.counters, self.pools.setup)
        await check_memory(self.store, self.counters, self.pools.store)
        if self.settings.durable_acks:
            await check_durable(self.store, self.counters, self.pools.store)
        self.marks = await open_watermarks(self.store, self.counters, self.pools.store)
        resume, orphans = await until_stored(self.store, self.counters, self.pools.load)
        await until_stored(self.store, self.counters, self._say_resumed)
        await self.reactor.process(resume)
        if orphans:
            log.info("%d URLs taken from URL_pool before a restart but never sent: de-duplicating them now", len(orphans))
            await self.reactor.process(hp.Found(orphans))
        s = self.settings
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self.reactor.run)
            self.port = await nursery.start(self._serve_status)
            register = Register(s.ip, s.network, "host", f"{s.ip}:{self.port}", s.lan)
            if s.metrics:  # --http: /metrics, the status page and /status.json (dedupnet/adapters/monitor/status_page.py)
                self.http_port = await nursery.start(serve_status, self.counters, *s.metrics, self.status, self.pools.store)
            nursery.start_soon(self._walk)
            nursery.start_soon(self._report_done)
            nursery.start_soon(self._heartbeats)
            nursery.start_soon(keep_watermarks, self.store, self.counters, self.pools.store, self.marks,
                               s.heartbeat_interval)
            nursery.start_soon(self._count_tasks)
            nursery.start_soon(self._compact_tasks)
            nursery.start_soon(watch_room, self.store, self.counters)
            nursery.start_soon(watch_keyrings, [self.lan_keyring], self.counters, s.key_poll_interval)
            if s.exit_when_complete:
                nursery.start_soon(self._watch_completion)
            if s.frontier is not None:
                self.frontier_port = await nursery.start(self._serve_frontier)
            if self.crawler is not None:
                await nursery.start(self._run_crawler)
                if s.seeds:
                    log.info("%d seeds into URL_pool", await self.crawler.seed(s.seeds))
                    self._pushed.set()
            nursery.start_soon(lambda: connect_forever(
                *s.center, register, self._session, local_ip=s.ip, counters=self.counters,
                max_frame_size=s.max_frame_size, max_urls=s.max_urls, compress=s.compress, keyring=self.lan_keyring,
                silence_timeout=s.heartbeat_timeout, **self._center_tls()))
            log.info("host %s (network %d, LAN %s) with center %s:%d, %s mode", s.ip, s.network, s.lan,
                     *s.center, s.mode)
            if self.settings.recrawl is not None:
                log.info("re-crawl by age: a URL counts as seen for %s", self.settings.recrawl.describe())
                interval, after = s.crawler and s.crawler.recrawl_interval, self.settings.recrawl.after
                if interval and after and interval < after * (1 + 1 / SLICES):
                    log.warning("recrawl_interval %gs is shorter than 1.25 x recrawl_after (%gs): seeds offered "
                                "again before they are due are dropped, and come round again only at a later "
                                "interval", interval, after)
            task_status.started(self.port)

    def _center_tls(self) -> dict:
        tls = self.settings.tls
        if tls is None or not tls.lan_tls:
            return {}
        return {"tls_context": client_context(tls), "expect_uri": center_uri(self.settings.network)}

    async def _run_crawler(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with self.crawler_scope:
            await self.crawler.run(task_status=task_status)

    async def _serve_frontier(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The URLFrontier service: gRPC's server, in its own threads, on this host's
        Redis (the optional grpcio is imported only here)."""
        from .frontier.service import start_server
        from .frontier.queues import FrontierQueues

        queues = FrontierQueues(self.pools.store, self.counters, recrawl=self.settings.recrawl)
        await until_stored(self.store, self.counters, queues.setup)
        token = trio.lowlevel.current_trio_token()

        def wake_walker() -> None:
            try:
                trio.from_thread.run_sync(lambda: self._pushed.set(), trio_token=token)
            except trio.RunFinishedError:
                pass

        def tasks_done() -> None:
            try:
                trio.from_thread.run_sync(self._tasks_done, trio_token=token)
            except trio.RunFinishedError:
                pass

        queues.on_push = wake_walker
        queues.on_finish = tasks_done
        server, port = await trio.to_thread.run_sync(start_server, queues, self.counters, *self.settings.frontier)
        self.frontier = queues
        try:
            task_status.started(port)
            await trio.sleep_forever()
        finally:
            server.stop(None)

    async def _serve_status(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await serve(self.settings.listen_host or self.settings.ip, self.settings.listen_port, lambda conn: control_session(conn, self.status),
                    counters=self.counters, accept_roles=("control",), keyrings={"control": self.lan_keyring},
                    task_status=task_status)

    async def _session(self, conn: Connection) -> None:
        self.conn = conn
        self.conn_changes.notify()
        self._pushed.set()
        self._report_due.set()
        log.info("connected to the center")
        try:
            await self.reactor.put(hp.Connected(), conn)
            while True:
                message = await conn.receive()
                if isinstance(message, Ack) and message.number == self._handing_back:
                    self.handed_back.set()
                elif isinstance(message, Heartbeat):
                    behind = self.marks.hear(CENTER, message.store) if message.store else None
                    if behind is not None:
                        await self._reoffer(behind)
                else:
                    self._activity += 1
                    await self.reactor.put(hp.FromCenter(message), conn)
        except ConnectionClosed:
            log.info("connection to the center lost")
        finally:
            if self.conn is conn:
                self.conn = None
                self.conn_changes.notify()

    async def _heartbeats(self) -> None:
        """Ours to the center when the link has been quiet (any message is a heartbeat to
        it) and now and then all the same, with our task_pool size and store watermark."""
        while True:
            if self.conn is not None:
                beat(self.conn, heartbeat(self.settings.ip, self.task_pool_size, self.pools.store.watermark),
                     self.settings.heartbeat_interval, lean=heartbeat(self.settings.ip, self.task_pool_size))
            await trio.sleep(self.settings.heartbeat_interval)

    async def _reoffer(self, behind: Behind) -> None:
        """The center's store came back behind: the frames it acknowledged lately go to it
        again (it acknowledges what it still holds as a repeat, and de-duplicates the rest
        as new sets)."""
        entries = await until_stored(self.store, self.counters, self.pools.released_steps)
        if not log_reaches(entries, self.settings.rewind_log, behind):
            self.counters.inc("rewind_unrepaired", member=CENTER)
            log.error("the center: the log of the last %d sets it acknowledged may not reach back to its step %d; "
                      "sets acknowledged before them may be lost", len(entries), behind.now[1])
        log.warning("the center: %d sets it had acknowledged sent again", len(entries))
        await self.reactor.put(hp.Reoffer([untag(e)[1] for e in reversed(entries)]))

    async def _count_tasks(self) -> None:
        """Read task_pool's size for the heartbeats, apart from them: a slow Redis must
        not hold a heartbeat back. Read again once it may have changed (tasks came or
        finished here), at most once a heartbeat interval, and every ``RECHECK`` seconds
        all the same; a host whose tasks are taken by another process (no crawler of its
        own) reads it every interval, as nothing here rings for them."""
        interval = self.settings.heartbeat_interval
        wait = interval if self._outside() else RECHECK
        while True:
            self._tasks_changed_count = trio.Event()
            self.task_pool_size = await until_stored(self.store, self.counters, self.pools.task_pool_size_steps)
            await trio.sleep(interval)
            with trio.move_on_after(wait - interval):
                await self._tasks_changed_count.wait()

    def _outside(self) -> bool:
        """Are this host's tasks taken and finished by another process (a Scrapy
        host's crawler): then nothing in this process says when they change."""
        return self.crawler is None and self.settings.frontier is None

    async def _compact_tasks(self) -> None:
        """Seal the URLs queued lately into blocks (local_host/frontier/site_blocks.py), round
        after round while there are any, then again once tasks came or were taken here
        (at most every ``COMPACT_INTERVAL``, and every ``RECHECK`` seconds all the same):
        what keeps a long queue small. Sites queued before a restart are looked at once."""
        await until_stored(self.store, self.counters, sites.mark_all_dirty, self.pools.store)
        wait = COMPACT_INTERVAL if self._outside() else RECHECK
        while True:
            self._tasks_changed_compact = trio.Event()
            while await until_stored(self.store, self.counters, sites.compact_steps, self.pools.store):
                await trio.sleep(0)
            await trio.sleep(COMPACT_INTERVAL)
            with trio.move_on_after(wait - COMPACT_INTERVAL):
                await self._tasks_changed_compact.wait()

    async def _walk(self) -> None:
        """§2.2: take what the crawler put in URL_pool, while the center keeps up, and hand
        it to the core, which sends it as sets when nothing of this host's is in flight and
        holds it meanwhile (local_host/protocol.py, Nagle's rule). What the core holds
        stays pending in URL_pool; a restart de-dups it again."""
        s = self.settings
        while True:
            entries = []
            await until_room(self.store, self.counters)  # new URLs would be new sets to write
            if self.conn is not None and self.core.can_take and self.core.room > 0:
                if self.reactor.pending():
                    # What was put last is not handled yet, so the core's room is not
                    # known: soon again (waiting for the next push would hold the links
                    # pushed meanwhile for a page's time).
                    await trio.sleep(BUSY_POLL)
                    continue
                room = self.core.room
                entries = await until_stored(self.store, self.counters, self.pools.take_steps, room)
                self._activity += len(entries)
                if entries:
                    if self.on_found is not None:
                        self.on_found(entries)
                    await self.reactor.put(hp.Found(entries))
                if len(entries) == room:
                    continue
            # Nothing more for now: sleep until the crawler pushes links, the core has room
            # again (an ack) or the connection comes, or else a look at PUSH_RECHECK:
            # URL_pool may be fed by another process (`dedupnet push`), whose URLs should
            # not wait long. A host without a crawler of its own is fed only from outside:
            # it polls every idle_poll.
            poll = s.idle_poll if self.crawler is None else PUSH_RECHECK
            with trio.move_on_after(poll):
                await self._pushed.wait()
            self._pushed = trio.Event()

    async def _report_done(self) -> None:
        """Finished tasks go to the center in reports (docs/PROTOCOL.md section 12), up to
        ``set_size`` URLs each: the center's ledger holds them until then, and its verdict
        waits for it. A report goes, as a set does, when no message of this host's awaits
        the center's ack, else once it is full (Nagle's rule): what a host gone with its
        disk leaves unreported, to be fetched again elsewhere, is what finished within
        about a round trip. One report is made at a time, so the entries it takes are out
        of ``tasks_done`` before the next read.

        ``tasks_done`` is read when a report may have become due (:attr:`_report_due`:
        tasks finished here, the core stored an ack, which frees a finished task's links
        from URL_pool and the link from Nagle's hold, or the center connected), at most
        every quarter heartbeat interval (a busy host's finished tasks go together), and
        every ``RECHECK`` seconds all the same. Reading it four times a second whatever
        happened was most of an idle host's Redis commands. A host whose tasks another
        process finishes (a Scrapy host) reads it every quarter interval, as before."""
        gap = min(1.0, self.settings.heartbeat_interval) / 4
        wait = gap if self._outside() else RECHECK
        last = -math.inf
        while True:
            with trio.move_on_after(wait):
                await self._report_due.wait()
            await trio.sleep_until(last + gap)
            self._report_due = trio.Event()  # before the reads: what happens during them wakes the next round
            if self.conn is None:
                continue  # the connection's coming sets _report_due
            last = trio.current_time()
            if self._moved:
                self._moved = False
                if await until_stored(self.store, self.counters, self.pools.drop_moved):
                    log.info("tasks that moved to other hosts while this one was away: out of task_pool")
            urls = await until_stored(self.store, self.counters, self.pools.tasks_done_steps, self.settings.set_size)
            if not urls or (len(urls) < self.settings.set_size and self.core.in_flight):
                continue
            await self.reactor.put(hp.Finished(tuple(urls), len(urls)))
            await self.reactor.changes.until(lambda: self.reactor.idle)
            if len(urls) == self.settings.set_size:
                self._report_due.set()  # a full report: there may be more

    async def _watch_completion(self) -> None:
        """While idle here, ask the center for the whole crawl's verdict (this host's
        empty pools say nothing of the other hosts' and networks'). "complete" counts
        only if nothing happened here during the ask: a task that came in meanwhile
        may have been counted by neither pass. "not started", "stuck", "in progress"
        or no answer: ask again later (a crawl that cannot finish is not a finished one)."""
        while not self.complete.is_set():
            await trio.sleep(COMPLETION_POLL)
            if not self._idle_here():
                continue
            before = self._activity_mark()
            verdict = await self.census.verdict()
            if verdict == "complete" and self._activity_mark() == before and self._idle_here():
                self.complete.set()

    def _idle_here(self) -> bool:
        """Connected, no set in flight or held, nothing for the core to do, no task to crawl."""
        crawler_idle = self.crawler.idle if self.crawler is not None else not self.task_pool_size
        return (self.conn is not None and not self.core.unacked and not self.core.held and self.reactor.idle
                and crawler_idle)

    def _activity_mark(self) -> tuple[int, int]:
        return self._activity, self.crawler.pages_done if self.crawler is not None else 0

    async def _execute(self, actions: list) -> list:
        if any(isinstance(a, WRITES) for a in actions):
            sends = any(isinstance(a, hp.Send) for a in actions)
            await until_stored(self.store, self.counters, self.pools.apply_steps, actions, sends)
            self._wake_after(actions)
        followups = []
        for a in actions:
            if isinstance(a, hp.Send) and self.settings.send_delay:
                self._nursery.start_soon(self._send_later, a.data)
            elif isinstance(a, hp.Send):
                self._send(a.data)
            elif isinstance(a, hp.Lookup):
                followups.append(functools.partial(until_stored, self.store, self.counters, self.pools.lookup_steps, a))
        return followups

    def _wake_after(self, actions: list) -> None:
        """Wake the loops that wait for what these stored actions may have made: an ack
        (Release, Forget, TakeDone) frees room for the walker and may make a report due
        (a finished task's links left URL_pool; nothing awaits the center's ack); tasks
        that came or moved change task_pool."""
        for a in actions:
            if isinstance(a, (hp.Release, hp.Forget, hp.TakeDone)):
                self._pushed.set()
                self._report_due.set()
            elif isinstance(a, hp.AddTasks):
                self._task_pool_changed()
            elif isinstance(a, hp.DropTasks):
                self._moved = True
                self._report_due.set()
                self._task_pool_changed()

    def _send(self, data: bytes) -> None:
        if self.conn is None or not self.conn.send_nowait(data):
            self.counters.inc("send_skipped")  # unacked frames go again on reconnect

    async def _send_later(self, data: bytes) -> None:
        await trio.sleep(self.settings.send_delay)
        self._send(data)

    async def leave(self, *, timeout: float | None = None, grace: float | None = None) -> int:
        """Leave the LAN for good without losing work: take no new task and give up those
        whose request has not gone out, let the pages on the wire finish for ``grace``
        seconds (then cut them off: they are handed back like the rest), let URL_pool drain
        through the protocol, then hand the uncrawled task_pool back to the center and
        drop it once the center has stored it. The first hand-back also tells the center
        to assign nothing more here; tasks it sent before that arrive before its ack (one
        connection), so a second round hands back whatever came in meanwhile. A Redis
        that goes away meanwhile is waited for, within ``timeout`` (a hand-back given up
        leaves the tasks in this host's Redis, where nobody else crawls them), a center
        away for ``heartbeat_timeout`` is not (ConnectionClosed).
        Returns the number of tasks handed back."""
        timeout = self.settings.stop_timeout if timeout is None else timeout
        grace = self.settings.stop_grace if grace is None else grace
        gone = False
        with trio.fail_after(timeout):
            async with trio.open_nursery() as nursery:
                async def watch() -> None:
                    """A center away for ``heartbeat_timeout`` (stopped too) takes nothing back."""
                    nonlocal gone
                    while True:
                        await self.conn_changes.until(lambda: self.conn is None)
                        with trio.move_on_after(self.settings.heartbeat_timeout):
                            await self.conn_changes.until(lambda: self.conn is not None)
                            continue
                        gone = True
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(watch)
                handed = await self._leave_steps(grace)
                nursery.cancel_scope.cancel()
        if gone:
            raise ConnectionClosed(f"no connection to the center for {self.settings.heartbeat_timeout:g} s")
        log.info("left the LAN; %d tasks handed back to the center", handed)
        return handed

    async def _leave_steps(self, grace: float) -> int:
        handed = 0
        if self.frontier is not None:
            self.frontier.active = False  # hand nothing more out: the tasks go back to the center
        if self.crawler is not None:
            self.crawler.stop_taking()
            crawler = self.crawler
            with trio.move_on_after(grace):
                await crawler.changes.until(lambda: not crawler.in_progress)
            if self.crawler.in_progress:
                self.counters.inc("pages_cut_off", amount=self.crawler.on_the_wire)
                log.warning("%d pages still in progress after %g s (stop_grace): cut off; handed back, they are "
                            "fetched again by another host", self.crawler.on_the_wire, grace)
            self.crawler_scope.cancel()
        # Every set stored by the center, every finished task reported: each step of that
        # is an event the core handles (an ack, the walker's take); the store is read
        # again after each, and at least every LEAVE_RECHECK seconds.
        while (self.core.unacked or (await until_stored(self.store, self.counters, self.pools.sizes))[URL_POOL]
               or await until_stored(self.store, self.counters, self.pools.tasks_done_steps, 1)):
            with trio.move_on_after(LEAVE_RECHECK):
                await self.reactor.changes.next()
        first = True
        while True:
            entries = await until_stored(self.store, self.counters, self.pools.all_tasks)
            if not entries and not first:
                break
            for i in range(0, max(len(entries), 1), 5000):  # a Task holds at most 10,000 URLs
                await self._hand_back(entries[i : i + 5000])
            handed += len(entries)
            first = False
            await self.reactor.changes.until(lambda: self.reactor.idle)  # tasks that arrived before the ack, stored
        return handed

    async def _hand_back(self, entries: list[tuple[bytes, str]]) -> None:
        (number,) = await until_stored(self.store, self.counters, self.pools.next_numbers, self.core.config, 1)
        self.handed_back, self._handing_back = trio.Event(), number
        task = wire.encode(Task(number, tuple(dict.fromkeys(u for _, u in entries))))
        while self.conn is None or not self.conn.send_nowait(task):
            await trio.sleep(0.05)
        await self.handed_back.wait()
        with trio.CancelScope(shield=True):  # the center holds them now: never crawled here too
            await until_stored(self.store, self.counters, self.pools.drop_tasks, [i for i, _ in entries])

    async def status(self) -> dict:
        return {
            "role": "host", "ip": self.settings.ip, "network": self.settings.network,
            "center": "%s:%d" % self.settings.center, "connected": self.conn is not None,
            "mode": self.settings.mode, "pools": await self.store.run(self.pools.sizes),
            "sets_in_flight": {"unacked": len(self.core.unacked)}, "counters": self.counters.snapshot(),
            "store_watermark": self.pools.store.watermark,
            "crawler": None if self.crawler is None else {
                "idle": self.crawler.idle, "in_progress": self.crawler.in_progress, "pages_done": self.crawler.pages_done,
                "on_the_wire": self.crawler.politeness.active},
            "frontier": dataclasses.asdict(await self.store.run(sites.counts, self.pools.store)),
        }

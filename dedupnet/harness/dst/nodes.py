"""The simulated daemons: each wraps the real sans-I/O core in an adapter that keeps
the contract the trio daemons keep (docs/ARCHITECTURE.md, "The core and its adapter"):

* events reach the core one at a time, in the order they happen at that process;
* the writes among one event's actions are applied in one transaction, before any of
  that event's messages is sent (center_host/daemon.py ``_execute``);
* a ``Lookup`` is answered from the store, with what is written by then, and its
  ``LookupDone`` handled before any other event (dedupnet/adapters/runtime.py ``Reactor``);
* a restart builds a new core and feeds it what the store holds (``Resume``; a host
  also de-dups the entries it had taken and no frame carries), then members join again.

Action and event types come from the core modules, and the writes are the ones each
role's pools module lists (``WRITES``), so a core that grows an action fails here loudly
instead of being half carried out.
"""

from __future__ import annotations

from collections.abc import Callable

from center_host.events import (Admit, CancelTimer, Host, Joined, Left, Lookup, LookupDone, Member, Peer, Received,
                                Send, SetTimer, TimerFired)
from center_host.protocol import CenterProtocol
from center_host.daemon import CenterSettings, core_config as center_core_config
from center_host.pools import WRITES as CENTER_WRITES
from local_host import protocol as hp
from local_host.daemon import LocalSettings, core_config as host_core_config
from local_host.pools import WRITES as HOST_WRITES

from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.codec import wire
from dedupnet.codec.messages import Frame, Heartbeat, Register

from .clock import Handle
from .crawler import Crawler
from .store import CenterStore, HostStore


def kind_of(message: object) -> str:
    if isinstance(message, Frame):
        return f"flag{message.flag}"
    return type(message).__name__.lower()


def _summary(item: object) -> tuple:
    """A short, stable form of an event for the trace."""
    if isinstance(item, (Received, hp.FromCenter)):
        m = item.message
        return (type(item).__name__, kind_of(m), getattr(m, "number", None), str(getattr(item, "sender", "")))
    if isinstance(item, LookupDone):
        return ("LookupDone", item.number, item.concluded, sum(item.admitted))
    if isinstance(item, hp.LookupDone):
        return ("LookupDone", item.token, sum(item.seen), tuple(item.sequences))
    if isinstance(item, hp.Found):
        return ("Found", len(item.entries))
    if isinstance(item, (Joined, Left)):
        return (type(item).__name__, str(item.member))
    if isinstance(item, TimerFired):
        return ("TimerFired", item.number)
    return (type(item).__name__,)


class Node:
    """A process: ``up``, or ``down`` (crashed; callbacks of the old incarnation are
    dropped). ``paused`` (frozen, or its Redis unreachable) defers callbacks until
    resumed, in order, as a blocked event loop would run them after."""

    def __init__(self, world, name: str):
        self.world, self.name = world, name
        self.sched = world.sched
        self.state = "down"
        self.incarnation = 0
        self.paused: set[str] = set()
        self.deferred: list[tuple[Callable, tuple]] = []
        self.lost = False  # never comes back
        self.counters = Counters()
        self.events = 0
        self.lookups = 0
        self.transactions = 0

    def post(self, incarnation: int, fn: Callable, *args) -> None:
        if incarnation != self.incarnation or self.state != "up":
            return
        if self.paused:
            self.deferred.append((fn, args))
            return
        fn(*args)

    def after(self, delay: float, fn: Callable, *args) -> Handle:
        return self.sched.after(delay, self.post, self.incarnation, fn, *args)

    def pause(self, why: str) -> None:
        self.paused.add(why)

    def unpause(self, why: str) -> None:
        self.paused.discard(why)
        while self.deferred and not self.paused and self.state == "up":
            fn, args = self.deferred.pop(0)
            fn(*args)

    def stop(self) -> None:
        self.state = "down"
        self.incarnation += 1
        self.paused.clear()
        self.deferred.clear()

    # -- the reactor (dedupnet/adapters/runtime.py Reactor._process) ---------------------
    def process(self, event: object) -> None:
        queue = [event]
        while queue:
            item = queue.pop(0)
            if isinstance(item, (Lookup, hp.Lookup)):
                item = self.lookup(item)
                self.lookups += 1
            self.events += 1
            self.sched.record(self.name, _summary(item))
            actions = self.core.handle(item)
            self.check()
            queue[:0] = self.execute(actions)

    def check(self) -> None:
        """After each event: what the core keeps as running counts agrees with a scan."""

    def lookup(self, action):
        raise NotImplementedError

    def execute(self, actions: list) -> list:
        raise NotImplementedError


class CenterNode(Node):
    def __init__(self, world, settings: CenterSettings):
        super().__init__(world, f"c{settings.network}")
        self.settings = settings
        self.network = settings.network
        self.store = CenterStore(world.journal_for(self.name))
        self.joined: dict[str, int] = {}  # member name -> epoch of its connection
        self.timers: dict[int, Handle] = {}

    def check(self) -> None:
        self.core.stages.check_backlog()

    def start(self) -> None:
        self.state = "up"
        self.core = CenterProtocol(center_core_config(self.settings), self.counters)
        self.joined, self.timers = {}, {}
        self.process(self.store.load())
        for peer in self.settings.peers:
            if self.network < peer.network:
                self.world.dial(self, f"c{peer.network}")

    def member(self, name: str) -> Member:
        return Peer(int(name[1:])) if name.startswith("c") else Host(name)

    def lookup(self, action: Lookup) -> LookupDone:
        return self.store.lookup(action)

    def execute(self, actions: list) -> list:
        writes = [a for a in actions if isinstance(a, CENTER_WRITES)]
        if writes:
            self.store.apply(writes)
            self.transactions += 1
        followups = []
        for a in actions:
            if isinstance(a, Send):
                for m in a.to:
                    self.world.send(self, m.ip if isinstance(m, Host) else f"c{m.network}", a.data)
            elif isinstance(a, SetTimer):
                old = self.timers.pop(a.number, None)
                if old is not None:
                    old.cancel()
                self.timers[a.number] = self.after(a.delay, self._fire, a.number)
            elif isinstance(a, CancelTimer):
                old = self.timers.pop(a.number, None)
                if old is not None:
                    old.cancel()
            elif isinstance(a, Admit):
                self.world.admitted(self, a.urls)
            elif isinstance(a, Lookup):
                followups.append(a)
            elif not isinstance(a, CENTER_WRITES):
                raise NotImplementedError(f"the simulated center does not carry out {type(a).__name__}")
        return followups

    def _fire(self, number: int) -> None:
        self.timers.pop(number, None)
        self.process(TimerFired(number))

    # -- membership (center_host/daemon.py _member_session) ------------------------------
    def receive(self, frm: str, epoch: int, message: object) -> None:
        if isinstance(message, Register):
            if frm.startswith("c") and message.homes != self.core.homes_described():
                # Peers on different maps refuse each other (center_host/daemon.py _refused_map).
                self.counters.inc("rejected", reason="map-mismatch")
                self.world.refuse(self, frm)
                return
            if frm.startswith("c") and self.network > int(frm[1:]):
                self.world.send(self, frm, wire.encode(self.world.register_of(self)), epoch=epoch)
            self.joined[frm] = epoch  # a reconnection replaces the old connection: no Left
            self.process(Joined(self.member(frm)))
        elif not isinstance(message, Heartbeat) and self.joined.get(frm) == epoch:
            self.process(Received(self.member(frm), message))

    def closed(self, other: str, epoch: int) -> None:
        if self.joined.get(other) == epoch:
            del self.joined[other]
            self.process(Left(self.member(other)))
        if other.startswith("c") and self.network < int(other[1:]) and other not in self.joined:
            self.world.dial(self, other)  # the lower network dials (connect_forever)


class HostNode(Node):
    def __init__(self, world, settings: LocalSettings):
        super().__init__(world, settings.ip)
        self.settings = settings
        self.network = settings.network
        self.center = f"c{settings.network}"
        self.store = HostStore(world.journal_for(self.name))
        self.epoch: int | None = None
        self.crawler: Crawler | None = None

    def start(self) -> None:
        self.state = "up"
        self.core = hp.HostProtocol(host_core_config(self.settings), self.counters)
        self.epoch = None
        self.walk_at: Handle | None = None
        self.crawler = Crawler(self.name, self.store, self.world.web, self.world.crawl_model,
                               after=self.after, on_commit=self._pushed)
        resume, orphans = self.store.load()
        self.process(resume)
        if orphans:
            self.process(hp.Found(orphans))
        self.crawler.wake()
        self.world.dial(self, self.center)
        self.wake()

    def _pushed(self, links: list[str]) -> None:
        self.world.pushed(links)
        self.wake()

    def lookup(self, action: hp.Lookup) -> hp.LookupDone:
        return self.store.lookup(action, self.core.config.mode == "exact")

    def execute(self, actions: list) -> list:
        writes = [a for a in actions if isinstance(a, HOST_WRITES)]
        if writes:
            self.store.apply(writes)
            self.transactions += 1
        followups = []
        for a in actions:
            if isinstance(a, hp.Send):
                self.world.send(self, self.center, a.data)
            elif isinstance(a, hp.Lookup):
                followups.append(a)
            elif isinstance(a, hp.Release):
                self.wake()
            elif isinstance(a, hp.AddTasks):
                self.crawler.wake()
            elif not isinstance(a, HOST_WRITES):
                raise NotImplementedError(f"the simulated host does not carry out {type(a).__name__}")
        return followups

    # -- the connection (local_host/daemon.py _session) -----------------------------------
    def connected(self, epoch: int) -> None:
        self.epoch = epoch
        self.process(hp.Connected())
        self.wake()

    def receive(self, frm: str, epoch: int, message: object) -> None:
        if epoch == self.epoch and not isinstance(message, Heartbeat):
            self.process(hp.FromCenter(message))

    def closed(self, other: str, epoch: int) -> None:
        if self.epoch == epoch:
            self.epoch = None
            self.world.dial(self, self.center)

    # -- the walker (local_host/daemon.py _walk) ------------------------------------------
    def wake(self) -> None:
        if self.walk_at is None or not self.walk_at.alive:
            self.walk_at = self.after(0.0, self._walk)

    def _walk(self) -> None:
        self.walk_at = None
        while self.epoch is not None and self.core.can_take and self.core.room > 0:
            room = self.core.room
            entries = self.store.url_pool.take(room)
            if entries:
                self.world.found(self, entries)
                self.process(hp.Found(entries))
            if len(entries) < room:
                break

"""In-memory adapters for the sans-I/O cores: pools as Python sets and dicts.

They carry out the cores' actions exactly as the daemons do against Redis, but
synchronously, so the conformance vectors and the randomised interleaving tests can
drive the protocol without I/O. Nothing here decides anything about the protocol.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from center_host.events import (Admit, CancelTimer, Conclude, Drop, DropTask, ForgetHost, ForgetMoved, Ledger, Lookup,
                                LookupDone, Member, NoteHost, NoteMoved, NoteSequence, Resume, Save, SaveTask, Send,
                                SetTimer, TimerFired, Unledger)
from center_host.config import CenterConfig
from center_host.protocol import CenterProtocol
from dedupnet.codec import wire
from dedupnet.harness.dst.store import stored_ledger
from dedupnet.adapters.monitor.metrics import Counters
from local_host import protocol as hp


@dataclass
class MemoryCenter:
    core: CenterProtocol
    local_reduce_pool: dict[int, bytes] = field(default_factory=dict)
    dist_reduce_pool: dict[int, bytes] = field(default_factory=dict)
    task_URL: dict[str, tuple[str, ...]] = field(default_factory=dict)
    admitted: set[str] = field(default_factory=set)
    concluded: set[int] = field(default_factory=set)
    digests: dict[int, int] = field(default_factory=dict)
    sequences: dict[str, int] = field(default_factory=dict)
    timers: dict[int, float] = field(default_factory=dict)
    outbox: list[tuple[Member, bytes]] = field(default_factory=list)
    admissions: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    hosts: dict[str, str] = field(default_factory=dict)  # the known hosts (NoteHost)
    ledger: dict[str, set[str]] = field(default_factory=dict)  # host -> URLs given, not reported finished
    ledger_blocks: dict[str, dict[int, bytes]] = field(default_factory=dict)  # host -> block -> its text
    ledger_live: dict[str, dict[int, bytes]] = field(default_factory=dict)  # host -> block -> its bits
    moved: dict[str, set[str]] = field(default_factory=dict)  # re-issued host -> what moved from it

    @classmethod
    def make(cls, **config) -> "MemoryCenter":
        return cls(CenterProtocol(CenterConfig(**config), Counters()))

    def pool(self, name: str) -> dict[int, bytes]:
        return self.local_reduce_pool if name == "local_reduce_pool" else self.dist_reduce_pool

    def feed(self, event: object) -> None:
        self.run(self.handle(event))

    def handle(self, event: object) -> list:
        """The core's actions for ``event``, its running counts checked against a scan."""
        actions = self.core.handle(event)
        self.core.stages.check_backlog()
        return actions

    def run(self, actions: list) -> None:
        """As the daemons do: every other action first, then each look-up in turn,
        answered right before its result is handled."""
        deferred = []
        for a in actions:
            if isinstance(a, Lookup):
                deferred.append(a)
            elif isinstance(a, Send):
                self.outbox.extend((to, a.data) for to in a.to)
            elif isinstance(a, Save):
                self.pool(a.pool)[a.number] = a.record
            elif isinstance(a, Drop):
                self.pool(a.pool).pop(a.number, None)
            elif isinstance(a, SetTimer):
                self.timers[a.number] = a.delay
            elif isinstance(a, CancelTimer):
                self.timers.pop(a.number, None)
            elif isinstance(a, Admit):
                self.admitted.update(a.urls)
                self.admissions.append((a.number, a.urls))
            elif isinstance(a, Conclude):
                self.concluded.add(a.number)
                if a.digest:
                    self.digests[a.number] = a.digest
            elif isinstance(a, NoteSequence):
                self.sequences[a.host] = a.sequence
            elif isinstance(a, NoteHost):
                self.hosts[a.host] = a.address
            elif isinstance(a, ForgetHost):
                self.hosts.pop(a.host, None)
            elif isinstance(a, SaveTask):
                self.task_URL[a.key] = a.urls
            elif isinstance(a, DropTask):
                self.task_URL.pop(a.key, None)
            elif isinstance(a, Ledger):
                self.ledger.setdefault(a.host, set()).update(a.urls)
                self.ledger_blocks.setdefault(a.host, {})[a.block] = a.data
            elif isinstance(a, Unledger):
                self.ledger.get(a.host, set()).difference_update(a.urls)
                self.ledger_live.setdefault(a.host, {}).update(a.bits)
                for block in a.drop:
                    self.ledger_blocks.get(a.host, {}).pop(block, None)
                    self.ledger_live.get(a.host, {}).pop(block, None)
            elif isinstance(a, NoteMoved):
                self.moved.setdefault(a.host, set()).update(a.urls)
            elif isinstance(a, ForgetMoved):
                self.moved.get(a.host, set()).difference_update(a.urls)
            else:
                raise TypeError(a)
        for a in deferred:
            self.run(self.handle(LookupDone(
                a.number, a.number in self.concluded,
                [u in self.admitted for u in a.urls], self.digests.get(a.number, 0))))

    def fire(self, number: int) -> None:
        assert number in self.timers, f"no timer set for {number}"
        del self.timers[number]
        self.feed(TimerFired(number))

    def take_outbox(self) -> list[tuple[Member, bytes]]:
        out, self.outbox = self.outbox, []
        return out

    def restart(self, **changes) -> "MemoryCenter":
        """A new core over the same pools, as after a crash (memory lost, Redis kept),
        with ``changes`` to its configuration (an operator's edit)."""
        fresh = MemoryCenter(CenterProtocol(dataclasses.replace(self.core.config, **changes), Counters()), self.local_reduce_pool,
                             self.dist_reduce_pool, self.task_URL, self.admitted, self.concluded,
                             self.digests, self.sequences, admissions=self.admissions, hosts=self.hosts,
                             ledger=self.ledger, ledger_blocks=self.ledger_blocks, ledger_live=self.ledger_live,
                             moved=self.moved)
        fresh.feed(Resume(list(self.local_reduce_pool.values()) + list(self.dist_reduce_pool.values()),
                             {k: list(v) for k, v in self.task_URL.items()}, dict(self.sequences), dict(self.hosts),
                             stored_ledger(self.ledger_blocks, self.ledger_live),
                             {h: sorted(u) for h, u in self.moved.items() if u}))
        return fresh


@dataclass
class MemoryHost:
    core: hp.HostProtocol
    finish_URL: set[str] = field(default_factory=set)
    task_pool: list[str] = field(default_factory=list)
    URL_pool: dict[bytes, str] = field(default_factory=dict)
    unacked: dict[int, tuple[bytes, list[bytes]]] = field(default_factory=dict)
    sequence: int = 0
    outbox: list[bytes] = field(default_factory=list)
    _taken: set[bytes] = field(default_factory=set)
    _next_id: int = 0

    @classmethod
    def make(cls, **config) -> "MemoryHost":
        return cls(hp.HostProtocol(hp.HostConfig(**config), Counters()))

    @property
    def ip(self) -> str:
        return self.core.ip

    def push(self, urls) -> None:
        for url in urls:
            self._next_id += 1
            self.URL_pool[b"%d-0" % self._next_id] = url

    def walk(self) -> None:
        """Take what is new in URL_pool, as the daemon's walker does."""
        entries = [(i, u) for i, u in self.URL_pool.items() if i not in self._taken]
        self._taken.update(i for i, _ in entries)
        self.feed(hp.Found(entries))

    def feed(self, event: object) -> None:
        self.run(self.core.handle(event))

    def seen(self, url: str, kind: str) -> bool:
        queued = self.core.config.mode == "exact" or kind == "task"
        return url in self.finish_URL or (queued and url in self.task_pool)

    def run(self, actions: list) -> None:
        deferred = []
        for a in actions:
            if isinstance(a, hp.Send):
                self.outbox.append(a.data)
            elif isinstance(a, hp.Lookup):
                deferred.append(a)
            elif isinstance(a, hp.SaveUnacked):
                self.unacked[a.number] = (a.frame, list(a.ids))
            elif isinstance(a, (hp.Release, hp.Forget)):
                for i in a.ids:
                    self.URL_pool.pop(i, None)
                if isinstance(a, hp.Release):
                    self.unacked.pop(a.number, None)
            elif isinstance(a, hp.AddTasks):
                self.task_pool.extend(a.urls)
            elif isinstance(a, (hp.TakeDone, hp.DropTasks)):
                pass
            else:
                raise TypeError(a)
        for a in deferred:
            self.sequence = max(self.sequence, a.floor - 1)
            seqs = range(self.sequence + 1, self.sequence + 1 + a.sets)
            self.sequence += a.sets
            self.run(self.core.handle(hp.LookupDone(a.token, [self.seen(u, a.token[0]) for u in a.urls], seqs)))

    def take_outbox(self) -> list[bytes]:
        out, self.outbox = self.outbox, []
        return out


def decode(data: bytes):
    return wire.decode_one(data)

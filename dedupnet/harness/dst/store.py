"""Redis as the protocol relies on it, in memory: the pools of one center or one host.

Semantics kept from the real server (dedupnet/adapters/storage/store.py, center_host/pools.py,
local_host/pools.py):

* the writes of one event are one transaction: all applied, in order, or none;
* a read sees every write before it;
* ``URL_pool`` and ``task_pool`` are streams read by a consumer group: a taken entry
  stays pending until acknowledged, and a restarted reader finds it again;
* ``appendfsync everysec``: a crash of the server's machine (:meth:`Journal.lose_unsynced`)
  loses the writes since the last fsync, which runs once a virtual second at a per-store
  phase; a killed server *process* loses nothing (the kernel has the file);
* a wipe (:meth:`wipe`) leaves an empty server, as a new disk or ``FLUSHALL`` would.

The fingerprint sets hold URLs, not 64-bit fingerprints: collisions are one in 2^64
and the simulation is about the protocol, not the hash.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import orjson

from center_host.events import (Admit, Conclude, Drop, DropTask, ForgetHost, ForgetMoved, Ledger, Lookup, LookupDone,
                                NoteHost, NoteMoved, NoteSequence, Resume, Save, SaveTask, Unledger)
from center_host.ledger import StoredBlocks
from local_host import protocol as hp


def stored_ledger(blocks: dict[str, dict[int, bytes]], bits: dict[str, dict[int, bytes]]) -> dict[str, StoredBlocks]:
    """What a center's load makes of its stored ledger (center_host/pools.py
    ``ledger_blocks``): host -> block -> (its text, its bits; None: all on the ledger)."""
    return {host: {block: (data, bits.get(host, {}).get(block)) for block, data in held.items()}
            for host, held in blocks.items() if held}


class Journal:
    """Undo records of the writes since the last fsync (only kept when a power loss may
    be injected on this store: ``enabled``)."""

    def __init__(self, clock: Callable[[], float], phase: float, enabled: bool):
        self.clock, self.phase, self.enabled = clock, phase, enabled
        self.undo: list[tuple[float, Callable[[], None]]] = []

    def note(self, undo: Callable[[], None]) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if self.undo and self.undo[0][0] < self.last_fsync(now):
            self.undo = [u for u in self.undo if u[0] >= self.last_fsync(now)]
        self.undo.append((now, undo))

    def last_fsync(self, now: float) -> float:
        return math.floor(now - self.phase) + self.phase

    def lose_unsynced(self) -> int:
        """Undo what the last fsync did not cover; returns how many writes were lost."""
        since = self.last_fsync(self.clock())
        lost = [u for t, u in self.undo if t >= since]
        for undo in reversed(lost):
            undo()
        self.undo = []
        return len(lost)


def _set_add(s: set, items, journal: Journal) -> None:
    new = [x for x in items if x not in s]
    s.update(new)
    if new and journal.enabled:
        journal.note(lambda: s.difference_update(new))


def _set_remove(s: set, items, journal: Journal) -> None:
    gone = [x for x in items if x in s]
    s.difference_update(gone)
    if gone and journal.enabled:
        journal.note(lambda: s.update(gone))


def _dict_set(d: dict, key, value, journal: Journal) -> None:
    had, old = key in d, d.get(key)
    d[key] = value
    if journal.enabled:
        journal.note(lambda: d.__setitem__(key, old) if had else d.pop(key, None))


def _dict_pop(d: dict, key, journal: Journal):
    if key not in d:
        return None
    old = d.pop(key)
    if journal.enabled:
        journal.note(lambda: d.__setitem__(key, old))
    return old


class Stream:
    """A Redis stream with one consumer group: ``new`` entries not yet delivered,
    ``pending`` ones delivered and not acknowledged (id -> URL, in id order)."""

    def __init__(self, journal: Journal, counter: list[int]):
        self.new: dict[bytes, str] = {}
        self.pending: dict[bytes, str] = {}
        self.journal = journal
        self._ids = counter

    def add(self, url: str) -> bytes:
        self._ids[0] += 1
        eid = b"%d-0" % self._ids[0]
        _dict_set(self.new, eid, url, self.journal)
        return eid

    def take(self, count: int) -> list[tuple[bytes, str]]:
        taken = []
        for eid in list(self.new)[:count]:
            url = _dict_pop(self.new, eid, self.journal)
            _dict_set(self.pending, eid, url, self.journal)
            taken.append((eid, url))
        return taken

    def ack(self, ids) -> None:
        for eid in ids:
            _dict_pop(self.pending, eid, self.journal)
            _dict_pop(self.new, eid, self.journal)

    def __len__(self) -> int:
        return len(self.new) + len(self.pending)

    def urls(self) -> list[str]:
        return [*self.new.values(), *self.pending.values()]


class _Records:
    """What a role's simulated store holds, as (place, URL) pairs (``records``)."""

    def records(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def contents(self) -> list[str]:
        return [u for _, u in self.records()]


class HostStore(_Records):
    """One host's Redis: ``URL_pool``, ``URL_pool:unacked``, ``finish_URL``,
    ``task_pool`` (+ ``:fp``) and ``number_seq``."""

    def __init__(self, journal: Journal):
        self.journal = journal
        self.wipe()

    def wipe(self) -> None:
        ids = [0]
        self.url_pool = Stream(self.journal, ids)
        self.task_pool = Stream(self.journal, ids)
        self.unacked: dict[int, tuple[bytes, list[bytes]]] = {}
        self.finished: set[str] = set()
        self.task_fp: set[str] = set()
        self.seq = [0]
        self.journal.undo = []

    def records(self) -> list[tuple[str, str]]:
        """(where, URL) of every record of a URL this store holds custody of: what a
        wipe or a dead host takes along, what a power loss may take back."""
        from dedupnet.codec import wire

        held = [("URL_pool", u) for u in self.url_pool.urls()] + [("task_pool", u) for u in self.task_pool.urls()]
        for data, _ in self.unacked.values():
            held += [("unacked", u) for u in wire.decode_one(data).URL_set]
        return held

    # -- the core's writes (local_host/pools.py HostPools._queue) ---------------------
    def apply(self, writes: list) -> None:
        j = self.journal
        for a in writes:
            if isinstance(a, hp.SaveUnacked):
                _dict_set(self.unacked, a.number, (a.frame, list(a.ids)), j)
            elif isinstance(a, (hp.Release, hp.Forget)):
                self.url_pool.ack(a.ids)
                if isinstance(a, hp.Release):
                    _dict_pop(self.unacked, a.number, j)
            elif isinstance(a, hp.AddTasks) and a.urls:
                for url in a.urls:
                    self.task_pool.add(url)
                _set_add(self.task_fp, a.urls, j)
            elif isinstance(a, hp.DropTasks) and a.urls:  # moved to other hosts while this one was away
                moved = set(a.urls)
                self.task_pool.ack([i for d in (self.task_pool.new, self.task_pool.pending)
                                    for i, u in d.items() if u in moved])
                _set_remove(self.task_fp, a.urls, j)

    def lookup(self, action: hp.Lookup, exact: bool) -> hp.LookupDone:
        use_queued = exact or action.token[0] == hp.OfferedTask.KIND
        seen = [u in self.finished or (use_queued and u in self.task_fp) for u in action.urls]
        sequences = range(0)
        if action.sets:
            old = self.seq[0]
            base = max(old, action.floor - 1)  # the center has sets numbered below the floor
            self.seq[0] = base + action.sets
            if self.journal.enabled:
                self.journal.note(lambda: self.seq.__setitem__(0, old))
            sequences = range(base + 1, base + action.sets + 1)
        return hp.LookupDone(action.token, seen, sequences)

    def load(self) -> tuple[hp.Resume, list[tuple[bytes, str]]]:
        unacked = {n: (data, list(ids)) for n, (data, ids) in self.unacked.items()}
        carried = {i for _, ids in unacked.values() for i in ids}
        orphans = [(i, u) for i, u in self.url_pool.pending.items() if i not in carried]
        return hp.Resume(unacked), orphans

    # -- the crawler's transaction (local_host/crawler/crawl.py Crawler._fill_done) ----------
    def finish_task(self, eid: bytes, chain: list[str], links: list[str]) -> None:
        _set_add(self.finished, chain, self.journal)
        for link in links:
            self.url_pool.add(link)
        self.task_pool.ack([eid])

    def push(self, urls: list[str]) -> None:
        for url in urls:
            self.url_pool.add(url)


class CenterStore(_Records):
    """One center's Redis: the reduce pools, ``task_URL``, ``admitted`` and ``concluded``."""

    def __init__(self, journal: Journal):
        self.journal = journal
        self.wipe()

    def wipe(self) -> None:
        self.pools: dict[str, dict[int, bytes]] = {}
        self.task_url: dict[str, tuple[str, ...]] = {}
        self.admitted: set[str] = set()
        self.concluded: set[int] = set()
        self.digests: dict[int, int] = {}  # concluded_digest
        self.sequences: dict[str, int] = {}  # host_sequences
        self.hosts: dict[str, str] = {}  # hosts: the LAN's known hosts
        self.ledger_blocks: dict[str, dict[int, bytes]] = {}  # ledger_blocks:<host>
        self.ledger_live: dict[str, dict[int, bytes]] = {}  # ledger_live:<host>
        self.moved: dict[str, set[str]] = {}  # moved:<host>
        self.journal.undo = []

    def records(self) -> list[tuple[str, str]]:
        held = [("task_URL", u) for urls in self.task_url.values() for u in urls]
        for name, pool in self.pools.items():
            for record in pool.values():
                held += [(name, u) for u in orjson.loads(record)["frame"]["URL_set"]]
        return held

    # -- center_host/pools.py CenterPools._queue ---------------------------------------
    def apply(self, writes: list) -> None:
        j = self.journal
        for a in writes:
            if isinstance(a, Save):
                _dict_set(self.pools.setdefault(a.pool, {}), a.number, a.record, j)
            elif isinstance(a, Drop):
                _dict_pop(self.pools.setdefault(a.pool, {}), a.number, j)
            elif isinstance(a, Admit):
                _set_add(self.admitted, a.urls, j)
            elif isinstance(a, Conclude):
                _set_add(self.concluded, (a.number,), j)
                if a.digest:
                    _dict_set(self.digests, a.number, a.digest, j)
            elif isinstance(a, NoteSequence):
                _dict_set(self.sequences, a.host, a.sequence, j)
            elif isinstance(a, NoteHost):
                _dict_set(self.hosts, a.host, a.address, j)
            elif isinstance(a, ForgetHost):
                _dict_pop(self.hosts, a.host, j)
            elif isinstance(a, SaveTask):
                _dict_set(self.task_url, a.key, tuple(a.urls), j)
            elif isinstance(a, DropTask):
                _dict_pop(self.task_url, a.key, j)
            elif isinstance(a, Ledger):
                _dict_set(self.ledger_blocks.setdefault(a.host, {}), a.block, a.data, j)
            elif isinstance(a, Unledger):
                live = self.ledger_live.setdefault(a.host, {})
                for block, bits in a.bits:
                    _dict_set(live, block, bits, j)
                for block in a.drop:
                    _dict_pop(self.ledger_blocks.setdefault(a.host, {}), block, j)
                    _dict_pop(live, block, j)
            elif isinstance(a, NoteMoved):
                _set_add(self.moved.setdefault(a.host, set()), a.urls, j)
            elif isinstance(a, ForgetMoved):
                _set_remove(self.moved.setdefault(a.host, set()), a.urls, j)

    def lookup(self, action: Lookup) -> LookupDone:
        return LookupDone(action.number, action.number in self.concluded, [u in self.admitted for u in action.urls],
                             self.digests.get(action.number, 0))

    def load(self) -> Resume:
        from dedupnet.adapters.storage.store import DIST_REDUCE_POOL, LOCAL_REDUCE_POOL

        sets = [r for pool in (LOCAL_REDUCE_POOL, DIST_REDUCE_POOL) for r in self.pools.get(pool, {}).values()]
        return Resume(sets=sets, tasks={k: list(v) for k, v in self.task_url.items()}, sequences=dict(self.sequences),
                         hosts=dict(self.hosts), ledger=stored_ledger(self.ledger_blocks, self.ledger_live),
                         moved={h: sorted(u) for h, u in self.moved.items() if u})

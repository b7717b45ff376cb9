"""The center's pools in Redis (paper §1.1): where the core's actions become writes.

``local_reduce_pool`` and ``dist_reduce_pool`` are hashes ``number -> record`` (the
stored frame plus who was asked and who answered), ``task_URL`` a hash
``"number:host" -> URLs`` of assignments not yet acknowledged by their host. Exact mode
adds the ``admitted`` record (a fingerprint set); the claims of sets in flight are the
core's memory, rebuilt from the reduce pools on restart (docs/PROTOCOL.md §10), so
nothing per URL is stored for another network's set. ``concluded`` remembers the
numbers already finished, so a frame sent again is recognised. With a re-crawl policy
(``recrawl_after``) ``admitted`` is an :class:`~dedupnet.adapters.storage.recrawl.AgedSet`: a URL counts as
admitted for its age only (docs/PROTOCOL.md, "Re-crawl by age").

All writes of one event go in one MULTI/EXEC; a look-up is one round trip.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import orjson

from dedupnet.adapters.storage.recrawl import AgedSet
from dedupnet.codec.ages import RecrawlPolicy
from dedupnet.adapters.storage.store import (ADMITTED, CONCLUDED, DIST_REDUCE_POOL, LOCAL_REDUCE_POOL, TASK_URL, Batch,
                                     CoreWrites, Steps, Store)
from dedupnet.adapters.storage.watermark import tagged, untag
from dedupnet.codec.urls import fingerprint_many

from .events import (Admit, Conclude, Drop, DropTask, ForgetHost, ForgetMoved, Ledger, LookupDone, NoteHost, NoteMoved,
                     NoteSequence, Resume, Save, SaveTask, Unledger)
from .ledger import MAX_BLOCK, StoredBlocks, deflate, inflate, live_bits, on_ledger
from .sets import task_parts

#: number -> digest of the set it concluded (own sets): tells a reused number from a repeat.
CONCLUDED_DIGEST = "concluded_digest"
#: host IP -> the highest sequence of its sets stored here.
SEQUENCES = "host_sequences"
#: host IP -> its status address: the LAN's hosts, until they leave or are reassigned.
HOSTS = "hosts"
#: URLs admitted here in all, by every run on this store (one INCRBY with each admission):
#: what tells a crawl that has nothing left to do from one that never started.
ADMITTED_TOTAL = "admitted_total"
#: The URLs given to a host it has not reported finished (docs/PROTOCOL.md section 12;
#: center_host/ledger.py): ``ledger_blocks:<host>`` block id -> their text, deflated;
#: ``ledger_live:<host>`` block id -> which of its URLs are still on the ledger, for the
#: blocks some of whose URLs were taken off; ``ledger_hosts``: the hosts that have one.
#: Earlier versions kept ``ledger:<host>`` (a set of their text) or ``ledger_fp:<host>``
#: (the fingerprints of those on the ledger, bucketed, beside the blocks): either is
#: turned into this layout when a center loads it.
LEDGER_BLOCKS = "ledger_blocks"
LEDGER_LIVE = "ledger_live"
LEGACY_LEDGER_FP = "ledger_fp"
LEDGER_HOSTS = "ledger_hosts"
LEGACY_LEDGER = "ledger"
#: ``moved:<host>``: a re-issued host's URLs that went to other hosts, until it is back
#: and has dropped them; ``moved_hosts``: the hosts that have such a set.
MOVED = "moved"
MOVED_HOSTS = "moved_hosts"
#: ``task_log:<host>``: the last assignments made to each host (newest first), tagged with
#: the host's watermark step heard then: re-offered if its store comes back behind.
TASK_LOG = "task_log"

WRITES = (Save, Drop, Admit, Conclude, NoteSequence, NoteHost, ForgetHost, SaveTask,
          DropTask, Ledger, Unledger, NoteMoved, ForgetMoved)


class CenterPools(CoreWrites):
    writes = WRITES

    def __init__(self, store: Store, recrawl: RecrawlPolicy | None = None, clock: Callable[[], float] = time.time,
                 *, task_log: int = 0, step_of: Callable[[str], int] = lambda member: 0):
        self.store = store
        self.admitted = AgedSet(store, ADMITTED, recrawl, clock) if recrawl is not None else None
        #: Assignments kept per host for a re-offer (0: none), and the host's step heard.
        self.task_log = task_log
        self.step_of = step_of

    # ``lookup_steps`` is the sans-I/O form (dedupnet.adapters.storage.store.Steps) the daemon
    # drives on trio with AsyncStore.drive, as CoreWrites.apply_steps.
    def _queue(self, batch: Batch, writes: list) -> None:
        key = self.store.key
        for a in writes:
            if isinstance(a, Save):
                batch.add(b"HSET", key(a.pool), a.number, a.record)
            elif isinstance(a, Drop):
                batch.add(b"HDEL", key(a.pool), a.number)
            elif isinstance(a, Admit):
                if a.urls:
                    batch.add(b"INCRBY", key(ADMITTED_TOTAL), len(a.urls))
                if a.urls and self.admitted is not None:
                    self.admitted.add(batch, a.urls)
                elif a.urls:
                    batch.fingerprints(b"SADD", key(ADMITTED), fingerprint_many(a.urls))
            elif isinstance(a, Conclude):
                batch.fingerprints(b"SADD", key(CONCLUDED), np.array([a.number], dtype=np.uint64))
                if a.digest:
                    batch.add(b"HSET", key(CONCLUDED_DIGEST), a.number, a.digest)
            elif isinstance(a, NoteSequence):
                batch.add(b"HSET", key(SEQUENCES), a.host, a.sequence)
            elif isinstance(a, NoteHost):
                batch.add(b"HSET", key(HOSTS), a.host, a.address)
            elif isinstance(a, ForgetHost):
                batch.add(b"HDEL", key(HOSTS), a.host)
            elif isinstance(a, SaveTask):
                batch.add(b"HSET", key(TASK_URL), a.key, orjson.dumps(a.urls))
                number, host = task_parts(a.key)
                if self.task_log and host:
                    log_key = key(f"{TASK_LOG}:{host}")
                    batch.add(b"LPUSH", log_key, tagged(self.step_of(host), orjson.dumps([number, a.urls])))
                    batch.add(b"LTRIM", log_key, 0, self.task_log - 1)
            elif isinstance(a, DropTask):
                batch.add(b"HDEL", key(TASK_URL), a.key)
            elif isinstance(a, Ledger):
                self._ledger(batch, a.host, a.block, a.data)
            elif isinstance(a, Unledger):
                if a.bits:
                    batch.add(b"HSET", key(f"{LEDGER_LIVE}:{a.host}"), *[x for mark in a.bits for x in mark])
                if a.drop:
                    batch.add(b"HDEL", key(f"{LEDGER_BLOCKS}:{a.host}"), *a.drop)
                    batch.add(b"HDEL", key(f"{LEDGER_LIVE}:{a.host}"), *a.drop)
            elif isinstance(a, NoteMoved) and a.urls:
                batch.add(b"SADD", key(f"{MOVED}:{a.host}"), *a.urls)
                batch.add(b"SADD", key(MOVED_HOSTS), a.host)
            elif isinstance(a, ForgetMoved) and a.urls:
                batch.add(b"SREM", key(f"{MOVED}:{a.host}"), *a.urls)

    def lookup(self, number: int, urls: tuple[str, ...]) -> LookupDone:
        return self.store.drive(self.lookup_steps(number, urls))

    def lookup_steps(self, number: int, urls: tuple[str, ...]) -> Steps[LookupDone]:
        batch = self.store.batch()
        key = self.store.key
        concluded = batch.fingerprints(b"SMISMEMBER", key(CONCLUDED), np.array([number], dtype=np.uint64))
        if self.admitted is not None:
            admitted = self.admitted.contains(batch, urls)
        else:
            admitted = batch.fingerprints(b"SMISMEMBER", key(ADMITTED), fingerprint_many(urls))
        digest_at = batch.add(b"HGET", key(CONCLUDED_DIGEST), number)
        results = yield batch
        return LookupDone(number, bool(concluded.flags(results)[0]), admitted.flags(results).tolist(),
                             int(results[digest_at] or 0))

    def load(self) -> Resume:
        """Everything a restarted center must pick up."""
        batch = self.store.batch()
        for pool in (LOCAL_REDUCE_POOL, DIST_REDUCE_POOL, TASK_URL, SEQUENCES, HOSTS):
            batch.add(b"HGETALL", self.store.key(pool))
        local, dist, tasks, sequences, hosts = self.store.execute(batch)
        return Resume(
            sets=_values(local) + _values(dist),
            tasks={k.decode(): orjson.loads(v) for k, v in _pairs(tasks)},
            sequences={k.decode(): int(v) for k, v in _pairs(sequences)},
            hosts={k.decode(): v.decode() for k, v in _pairs(hosts)},
            ledger=self.ledger_blocks(), moved=self._text_sets(MOVED_HOSTS, MOVED),
        )

    def _ledger(self, batch: Batch, host: str, block: int, data: bytes) -> None:
        batch.add(b"HSET", self.store.key(f"{LEDGER_BLOCKS}:{host}"), block, data)
        batch.add(b"SADD", self.store.key(LEDGER_HOSTS), host)

    def ledger_blocks(self) -> dict[str, StoredBlocks]:
        """Every host's ledger: host IP -> block id -> (its text, its bits; None: all on it)."""
        self._upgrade_text_ledgers()
        hosts = self._members(LEDGER_HOSTS)
        self._upgrade_fingerprint_ledgers(hosts)
        batch = self.store.batch()
        for host in hosts:
            batch.add(b"HGETALL", self.store.key(f"{LEDGER_BLOCKS}:{host}"))
            batch.add(b"HGETALL", self.store.key(f"{LEDGER_LIVE}:{host}"))
        replies = self.store.execute(batch)
        out: dict[str, StoredBlocks] = {}
        for host, blocks, live in zip(hosts, replies[::2], replies[1::2]):
            bits = {int(b): v for b, v in _pairs(live)}
            if held := {int(b): (data, bits.get(int(b))) for b, data in _pairs(blocks)}:
                out[host] = held
        return out

    def ledger(self) -> dict[str, list[str]]:
        """Every host's ledger: host IP -> its unfinished URLs."""
        return {host: sorted(u for data, bits in blocks.values() for u in on_ledger(data, bits))
                for host, blocks in self.ledger_blocks().items()}

    def _upgrade_text_ledgers(self) -> None:
        """A store of an earlier version keeps each host's ledger as a set of text: it
        becomes blocks, in one transaction a host."""
        for host, urls in self._text_sets(LEDGER_HOSTS, LEGACY_LEDGER).items():
            known = self.store.command(b"HKEYS", self.store.key(f"{LEDGER_BLOCKS}:{host}"))
            first = max((int(b) for b in known), default=0) + 1

            def fill(batch: Batch, host: str = host, urls: list[str] = urls) -> None:
                for n, i in enumerate(range(0, len(urls), MAX_BLOCK)):
                    self._ledger(batch, host, first + n, deflate(urls[i:i + MAX_BLOCK]))
                batch.add(b"DEL", self.store.key(f"{LEGACY_LEDGER}:{host}"))
            self.store.transact(fill)

    def _upgrade_fingerprint_ledgers(self, hosts: list[str]) -> None:
        """A store of an earlier version keeps which URLs of its blocks are on a host's
        ledger as a fingerprint set beside them: that becomes the blocks' bits (in one
        transaction a host), then the set goes. Until it has gone, a load does this again
        from it, to the same result: nothing is taken off a ledger before the load ends."""
        for host in hosts:
            legacy = f"{LEGACY_LEDGER_FP}:{host}"
            if not self.store.fp_count(legacy):
                continue
            stored = [(block, inflate(data)) for block, data in
                      _pairs(self.store.command(b"HGETALL", self.store.key(f"{LEDGER_BLOCKS}:{host}")))]
            urls = [u for _, block_urls in stored for u in block_urls]
            held = self.store.fp_contains(legacy, fingerprint_many(urls))

            def fill(batch: Batch, host: str = host, stored: list = stored, held: np.ndarray = held) -> None:
                at = 0
                for block, block_urls in stored:
                    live = held[at:at + len(block_urls)]
                    at += len(block_urls)
                    if not live.any():
                        batch.add(b"HDEL", self.store.key(f"{LEDGER_BLOCKS}:{host}"), block)
                    elif not live.all():
                        batch.add(b"HSET", self.store.key(f"{LEDGER_LIVE}:{host}"), block, live_bits(live))
            self.store.transact(fill)
            self.store.fp_delete(legacy)

    def _members(self, hosts: str) -> list[str]:
        return sorted(m.decode() for m in self.store.command(b"SMEMBERS", self.store.key(hosts)))

    def _text_sets(self, hosts: str, per_host: str) -> dict[str, list[str]]:
        """Host IP -> its set ``<per_host>:<host>`` of URLs, sorted (what moved from each
        re-issued host; a legacy ledger)."""
        names = self._members(hosts)
        if not names:
            return {}
        batch = self.store.batch()
        for host in names:
            batch.add(b"SMEMBERS", self.store.key(f"{per_host}:{host}"))
        return {host: sorted(u.decode() for u in urls) for host, urls in zip(names, self.store.execute(batch)) if urls}

    def task_log_steps(self, host: str) -> Steps[tuple[list[bytes], dict[int, tuple[str, ...]]]]:
        """The log of ``host``'s assignments (its raw entries, newest first, and number ->
        URLs, merged): what a host whose store came back behind is offered again."""
        batch = self.store.batch()
        at = batch.add(b"LRANGE", self.store.key(f"{TASK_LOG}:{host}"), 0, -1)
        entries = (yield batch)[at]
        tasks: dict[int, tuple[str, ...]] = {}
        for entry in reversed(entries):
            number, urls = orjson.loads(untag(entry)[1])
            tasks[number] = tuple(dict.fromkeys([*tasks.get(number, ()), *urls]))
        return entries, tasks

    def admitted_total(self) -> int:
        """URLs admitted on this store in all (every run; 0 on a store that admitted none)."""
        return int(self.store.command(b"GET", self.store.key(ADMITTED_TOTAL)) or 0)

    def sizes(self) -> dict[str, int]:
        batch = self.store.batch()
        for pool in (LOCAL_REDUCE_POOL, DIST_REDUCE_POOL, TASK_URL):
            batch.add(b"HLEN", self.store.key(pool))
        local, dist, tasks = self.store.execute(batch)
        return {LOCAL_REDUCE_POOL: local, DIST_REDUCE_POOL: dist, TASK_URL: tasks}


def _pairs(flat: list) -> list[tuple[bytes, bytes]]:
    return list(zip(flat[0::2], flat[1::2]))


def _values(flat: list) -> list[bytes]:
    return flat[1::2]

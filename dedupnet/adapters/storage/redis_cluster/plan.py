"""How a batch travels on a Redis Cluster, sans I/O: a plan is a generator that yields
steps (:class:`Wave`: one round trip to each node named; :class:`Refresh`: reload the
slot map; :class:`Pause`: wait) and is sent each step's result. :class:`~.stores.ClusterStore`
runs it with blocking sockets, :class:`~.stores.AsyncClusterStore` on trio, so the
redirects, retries and the redo record of a transaction are written once."""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Protocol

import hiredis
from redis.exceptions import ResponseError

from dedupnet.adapters.storage.redis_cluster.slots import EXEC, MULTI, Addr, ClusterBatch, SlotMap, key_of, slot_of
from dedupnet.adapters.storage.store import T
from dedupnet.adapters.storage.resp import pack_command
from dedupnet.codec.backoff import Backoff
from dedupnet.codec.errors import StoreUnavailable

log = logging.getLogger("dedupnet.adapters.storage.redis_cluster")

REDO = "redo"

#: Replies that mean "not here" or "not now": the command is sent again.
_REDIRECT = ("MOVED ", "ASK ")
_NOT_NOW = ("TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN")
ASKING = pack_command(b"ASKING")


class PlannedStore(Protocol):
    """What a plan reads and keeps in the store it runs for (a :class:`~.stores.ClusterStore`)."""

    url: str
    prefix: str
    retry: Backoff
    slots: SlotMap
    home_slot: int
    reconnects: int
    redo_unchecked: bool
    redo_done: list[str]

    def key(self, pool: str) -> str: ...

    def next_txid(self) -> str: ...


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


def run_commands(store: PlannedStore, cmds: list[bytes], slots: list[int], out: list, where: list[int]) -> Plan[None]:
    """Send ``cmds`` (their replies go to ``out[where[i]]``), each to the node of its slot,
    one wave per attempt; commands whose node failed or redirected are sent again."""
    retry = _Retry(store.retry.delays(), store.url)
    todo = list(range(len(cmds)))
    asking: dict[int, Addr] = {}
    while todo:
        groups: dict[Addr, list[int]] = {}
        for i in todo:
            groups.setdefault(asking.get(i) or store.slots.node(slots[i]), []).append(i)
        results = yield Wave({a: [(ASKING + cmds[i]) if i in asking else cmds[i] for i in ids]
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


def execute_plan(store: PlannedStore, batch: ClusterBatch) -> Plan[list]:
    """The replies of ``batch`` in its order, as ``Store.execute`` returns them."""
    if store.redo_unchecked:
        yield from replay_redo(store)
    if batch.transaction:
        return (yield from _transaction(store, batch))
    out: list = [None] * len(batch.cmds)
    yield from run_commands(store, batch.cmds, batch.slots, out, list(range(len(out))))
    return out


def _transaction(store: PlannedStore, batch: ClusterBatch) -> Plan[list]:
    n = len(batch.cmds)
    if batch.cmds[-1] != EXEC:
        raise ValueError("a cluster transaction batch is MULTI, commands, EXEC")
    inner = range(1, n - 1)
    home = [i for i in inner if not batch.spread[i] and batch.slots[i] in (-1, batch.home_slot)]
    other = [i for i in inner if i not in set(home)]
    redo_key = store.key(REDO)
    txid = store.next_txid()
    done, store.redo_done[:] = list(store.redo_done), []  # records of earlier transactions, all applied
    tx = [MULTI, *(batch.cmds[i] for i in home)]
    if done:
        tx.append(pack_command(b"HDEL", redo_key, *done))
    if other:
        tx.append(pack_command(b"HSET", redo_key, txid, b"".join(batch.cmds[i] for i in other)))
    tx.append(EXEC)
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


def replay_redo(store: PlannedStore) -> Plan[int]:
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
                slots.append(slot_of(key_of(tuple(args)) or b""))
        yield from run_commands(store, cmds, slots, [None] * len(cmds), list(range(len(cmds))))
        yield from run_commands(store, [pack_command(b"HDEL", redo_key, *txids)], [store.home_slot], [None], [0])
        log.warning("Redis Cluster: replayed %d transaction(s) left half-applied under %s", len(txids), store.prefix)
    store.redo_unchecked = False
    return len(txids)

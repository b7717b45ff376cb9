"""Store watermarks: how a daemon's peers notice that its Redis came back behind.

Durable acknowledgements make "acknowledged" mean "on disk", but a store can still come
back with less than it had: an operator restores an older backup, a disk lies about an
fsync, a damaged AOF is cut short. The daemon itself cannot tell (its memory went with
the crash), so the ones it acknowledged to keep count for it:

* every store holds ``<prefix>:watermark``, a hash with ``id`` (its incarnation: random,
  written once into an empty store) and ``step`` (raised by one in every transaction a
  message depends on, inside that transaction, so it is on disk exactly when they are);
* a daemon sends ``(id, step)`` of its last such transaction known to be stored in each
  heartbeat;
* each receiver keeps the highest it heard per member (``<prefix>:watermarks_heard``,
  written in the background: a record lost with its own store only makes it miss one
  rewind) and compares every heartbeat with it (:class:`Watermarks`).

A lower step of the same incarnation is a store that went back; another incarnation
where one was heard is a store replaced or wiped. The caller says so once (an ERROR
line, ``stores_behind{member}``) and re-offers what it logged of what it handed that
member (docs/PROTOCOL.md section 7, "A store that comes back behind").
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

import zstandard

from dedupnet.adapters.monitor.metrics import Counters

__all__ = ["WATERMARK", "HEARD", "Behind", "Watermarks", "heard_steps", "save_heard_steps", "own_steps", "tagged", "untag", "log_reaches"]

log = logging.getLogger("dedupnet.watermark")

#: This store's own watermark: hash ``id`` -> incarnation, ``step`` -> durable steps.
WATERMARK = "watermark"
#: What this daemon heard from its members' stores: member -> ``"<id> <step>"``.
HEARD = "watermarks_heard"


@dataclass(frozen=True)
class Behind:
    """``member``'s store reports ``now`` where ``had`` was heard: ``replaced`` when its
    incarnation changed (a wiped or new store: every step lost)."""

    member: str
    had: tuple[str, int]
    now: tuple[str, int]

    @property
    def replaced(self) -> bool:
        return self.had[0] != self.now[0]

    def describe(self) -> str:
        if self.replaced:
            return (f"its store is another one (incarnation {self.now[0]} at step {self.now[1]}, where "
                    f"{self.had[0]} had reached step {self.had[1]}): it holds nothing it had acknowledged")
        return (f"its store went back from durable step {self.had[1]} to {self.now[1]} "
                f"({self.had[1] - self.now[1]} acknowledged steps lost)")


class Watermarks:
    """The highest watermark heard from each member; tells when one comes back behind."""

    def __init__(self, counters: Counters, heard: dict[str, tuple[str, int]] | None = None):
        self.counters = counters
        self.heard: dict[str, tuple[str, int]] = dict(heard or {})
        #: Members whose record changed since :meth:`changed` was last asked.
        self._dirty: set[str] = set()

    def hear(self, member: str, mark: tuple[str, int]) -> Behind | None:
        """Note ``mark`` from ``member``; a :class:`Behind` if it is below what was heard
        (said once: the lower mark becomes the record, so the next heartbeat is fine)."""
        had = self.heard.get(member)
        if had == mark:
            return None
        self.heard[member] = mark
        self._dirty.add(member)
        if had is None or (had[0] == mark[0] and mark[1] >= had[1]):
            return None
        behind = Behind(member, had, mark)
        self.counters.inc("stores_behind", member=member)
        log.error("%s came back behind what it had acknowledged: %s; re-offering what was handed to it",
                  member, behind.describe())
        return behind

    def step_of(self, member: str) -> int:
        """The step last heard from ``member`` (0: none): the tag of what is handed to it."""
        mark = self.heard.get(member)
        return mark[1] if mark else 0

    def changed(self) -> dict[str, bytes]:
        """The records to write back (member -> ``"<id> <step>"``) since the last call."""
        out = {m: f"{self.heard[m][0]} {self.heard[m][1]}".encode() for m in self._dirty}
        self._dirty.clear()
        return out


def heard_steps(store):
    """What was heard from the members' stores (``<prefix>:watermarks_heard``)."""
    batch = store.batch()
    at = batch.add(b"HGETALL", store.key(HEARD))
    flat = (yield batch)[at]
    out = {}
    for k, v in zip(flat[0::2], flat[1::2]):
        ident, _, step = v.decode().partition(" ")
        out[k.decode()] = (ident, int(step or 0))
    return out


def save_heard_steps(store, records: dict[str, bytes]):
    batch = store.batch()
    batch.add(b"HSET", store.key(HEARD), *[x for kv in records.items() for x in kv])
    yield batch


def own_steps(store):
    """This store's watermark ``(id, step)``, its incarnation written first if it has none."""
    batch = store.batch()
    key = store.key(WATERMARK)
    batch.add(b"HSETNX", key, b"id", secrets.token_hex(8).encode())
    got = batch.add(b"HMGET", key, b"id", b"step")
    results = yield batch
    ident, step = results[got]
    return ident.decode(), int(step or 0)


def tagged(step: int, payload: bytes) -> bytes:
    """A re-offer log entry: ``payload`` with the member's step heard when it was handed
    over, zstd-compressed (``<step>:``; ``<step> `` before it: plain). The logs hold URLs
    that are rarely read and compress several-fold: on a small crawl they were the
    largest keys of the deployment."""
    return b"%d:" % step + _compressor.compress(payload)


def untag(entry: bytes) -> tuple[int, bytes]:
    """``(step, payload)`` of a log entry, compressed or plain."""
    for i, byte in enumerate(entry):
        if byte == 0x3A:  # ':'
            return int(entry[:i]), _decompressor.decompress(entry[i + 1:])
        if byte == 0x20:  # ' '
            return int(entry[:i]), entry[i + 1:]
    raise ValueError("not a re-offer log entry")


#: Writes the content size, which the one-shot decompress needs.
_compressor = zstandard.ZstdCompressor(level=3)
_decompressor = zstandard.ZstdDecompressor()


def log_reaches(entries: list[bytes], limit: int, behind: Behind) -> bool:
    """Whether a re-offer log (newest first) may hold all that ``behind`` lost: it was never
    trimmed, or its oldest entry was handed over when the member had not yet passed the
    step it went back to (a replaced store lost everything: only an untrimmed log)."""
    if len(entries) < limit:
        return True
    if behind.replaced or not entries:
        return False
    return untag(entries[-1])[0] <= behind.now[1]

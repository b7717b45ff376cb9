"""A center's ledger (docs/PROTOCOL.md section 12), kept small: every URL it gave a LAN
host and was not told is finished.

A broad crawl queues far more than it fetches, so the ledger holds every URL queued on
the LAN's hosts; kept as a set of text it cost the center more a URL (~84 B in Redis,
~145 B in the process) than the host's own compact queue. Here the URLs of one
assignment are one *block*: sorted and deflated together (some 10-18 B a URL when a
block holds eight or more), and a URL's 64-bit fingerprint names its *slot*: its block
and its place in the block's sorted text (16 B a URL in the process). What is still on
the ledger of a block is one bit a URL, stored only once some of it has been taken off:
a host's report (its finished URLs) clears bits, and only a move (the host gone)
inflates the host's blocks. Blocks whose URLs are mostly finished, and runs of small
ones, are re-deflated together (:meth:`HostLedger.compact`), so the text kept stays
within about twice what is still on the ledger.

In Redis (center_host/pools.py): ``ledger_blocks:<host>`` a hash block id -> deflated
text, ``ledger_live:<host>`` block id -> its bits, for the blocks some of whose URLs
were taken off. Neither grows with anything but the blocks, whatever the ledger holds:
a fingerprint set kept beside them (an earlier layout) made each insert move half a
sorted bucket, so Redis' cost per URL grew with the ledger.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from dedupnet.codec.urls import fingerprint_many

from .events import Action, Ledger, Unledger

#: A block of fewer URLs deflates poorly (and costs its own hash field): :data:`SMALL_RUN`
#: of them are re-deflated together.
SMALL_BLOCK = 64
SMALL_RUN = 64
#: URLs at most in a block a compaction writes: a move inflates no more at once, and a
#: report that clears one of its bits rewrites no more than MAX_BLOCK / 8 bytes of them.
MAX_BLOCK = 4096
#: Fingerprints looked up one by one rather than as arrays.
FEW = 16
#: Text kept beyond twice what is on the ledger, in URLs, before a compaction.
SLACK = 4096
#: A slot is ``block << PLACE_BITS | place``: a block holds at most 2 ** PLACE_BITS URLs.
PLACE_BITS = 20
_PLACE = (1 << PLACE_BITS) - 1


_PLAIN, _DEFLATED = b"p", b"d"


def deflate(urls: Sequence[str]) -> bytes:
    """The text of a block: its URLs (sorted by the caller: neighbours share their site
    and path, and a URL's place is its slot), newline-joined, raw deflate after a
    one-byte mark; a block of fewer than :data:`SMALL_BLOCK` is kept plain (setting up a
    deflate costs some 100 µs, more than a few URLs save, and small blocks are soon
    re-deflated together)."""
    text = "\n".join(urls).encode()
    if len(urls) < SMALL_BLOCK:
        return _PLAIN + text
    packer = zlib.compressobj(6, zlib.DEFLATED, -15)
    return _DEFLATED + packer.compress(text) + packer.flush()


def inflate(data: bytes) -> list[str]:
    text = zlib.decompress(data[1:], -15) if data[:1] == _DEFLATED else data[1:]
    return text.decode().split("\n") if text else []


def all_live(n: int) -> bytearray:
    """The bits of a block of ``n`` URLs all on the ledger: bit ``i % 8`` of byte ``i // 8``."""
    bits = bytearray(b"\xff" * (n >> 3))
    if n & 7:
        bits.append((1 << (n & 7)) - 1)
    return bits


def live_places(bits: bytes | bytearray, n: int) -> np.ndarray:
    """Whether each of a block's ``n`` URLs is on the ledger, from its bits."""
    return np.unpackbits(np.frombuffer(bits, np.uint8), count=n, bitorder="little").astype(bool)


def live_bits(live: np.ndarray) -> bytes:
    """The bits of a block whose URLs ``live`` says are on the ledger (:func:`live_places`' inverse)."""
    return np.packbits(live, bitorder="little").tobytes()


def on_ledger(data: bytes, bits: bytes | bytearray | None) -> list[str]:
    """The URLs of a stored block still on the ledger (``bits`` None: all of them)."""
    urls = inflate(data)
    if bits is None:
        return urls
    return list(itertools.compress(urls, live_places(bits, len(urls)).tolist()))


def block_slots(block: int, n: int) -> np.ndarray:
    """The slots of a new block's ``n`` URLs."""
    return np.arange(block << PLACE_BITS, (block << PLACE_BITS) + n, dtype=np.int64)


class BlockIndex:
    """Fingerprint -> slot, 16 bytes an entry: a sorted array (an entry's slot set to -1
    once it is gone, squeezed out when half are) and a dict of the latest, merged into
    the array when it passes an eighth of it: each of its slots is an int object of its
    own (32 bytes more an entry than the array's), while a merge is one sort of the
    array, nearly in order already."""

    def __init__(self) -> None:
        self.keys = np.empty(0, np.uint64)
        self.slots = np.empty(0, np.int64)
        self.dead = 0
        self.recent: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.keys) - self.dead + len(self.recent)

    def _find(self, fps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each fingerprint is in the array (-1: not there, alive) and its slot
        (-1: not held)."""
        slots = np.full(len(fps), -1, np.int64)
        if not len(self.keys):
            return np.full(len(fps), -1, np.int64), slots
        pos = np.minimum(np.searchsorted(self.keys, fps), len(self.keys) - 1)
        pos = np.where((self.keys[pos] == fps) & (self.slots[pos] >= 0), pos, -1)
        slots[pos >= 0] = self.slots[pos[pos >= 0]]
        return pos, slots

    def _few(self, fps: np.ndarray, take: bool) -> np.ndarray:
        """:meth:`get` (or, with ``take``, :meth:`remove`) one by one: for a few, each
        array operation costs more than the search."""
        keys, held, top = self.keys, self.slots, len(self.keys)
        look = self.recent.pop if take else self.recent.get
        out = []
        for fp, p in zip(fps.tolist(), keys.searchsorted(fps).tolist() if top else [0] * len(fps)):
            slot = int(held[p]) if p < top and int(keys[p]) == fp else -1
            if slot < 0:
                slot = look(fp, -1)
            elif take:
                held[p] = -1
                self.dead += 1
            out.append(slot)
        return np.array(out, np.int64)

    def _recent(self, fps: np.ndarray, slots: np.ndarray, take: bool) -> None:
        """Fill in (or, with ``take``, pop) the slots of those in :attr:`recent`."""
        if self.recent:
            look = self.recent.pop if take else self.recent.get
            miss = np.flatnonzero(slots < 0)
            slots[miss] = [look(fp, -1) for fp in fps[miss].tolist()]

    def get(self, fps: np.ndarray) -> np.ndarray:
        """The slot of each fingerprint, -1 for those not held."""
        if len(fps) <= FEW:
            return self._few(fps, take=False)
        slots = self._find(fps)[1]
        self._recent(fps, slots, take=False)
        return slots

    def add(self, fps: np.ndarray, slots: np.ndarray) -> None:
        """Fingerprints not held (the caller checked) now name ``slots``."""
        self.recent.update(zip(fps.tolist(), slots.tolist()))
        if len(self.recent) > max(SLACK, len(self.keys) // 8):
            self._merge()

    def move(self, fps: np.ndarray, slots: np.ndarray) -> None:
        """Fingerprints held now name ``slots`` (their text was re-deflated)."""
        pos = self._find(fps)[0]
        self.slots[pos[pos >= 0]] = slots[pos >= 0]
        self.recent.update(zip(fps[pos < 0].tolist(), slots[pos < 0].tolist()))

    def remove(self, fps: np.ndarray) -> np.ndarray:
        """Drop these (distinct) fingerprints; returns the slot each was in, -1 if not held."""
        if len(fps) <= FEW:
            slots = self._few(fps, take=True)
        else:
            pos, slots = self._find(fps)
            self.slots[pos[pos >= 0]] = -1
            self.dead += int((pos >= 0).sum())
            self._recent(fps, slots, take=True)
        if self.dead > len(self.keys) // 2:
            self._merge()
        return slots

    def _merge(self) -> None:
        alive = self.slots >= 0
        keys = np.concatenate([self.keys[alive], np.fromiter(self.recent, np.uint64, len(self.recent))])
        slots = np.concatenate([self.slots[alive], np.fromiter(self.recent.values(), np.int64, len(self.recent))])
        order = np.argsort(keys, kind="stable")
        self.keys, self.slots, self.dead, self.recent = keys[order], slots[order], 0, {}


class HostLedger:
    """One host's ledger: its blocks (id -> deflated text, how many URLs each holds and
    has still on the ledger, and for those some were taken off, which) and the index of
    what is on it."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.index = BlockIndex()
        self.text: dict[int, bytes] = {}
        self.size: dict[int, int] = {}
        self.live: dict[int, int] = {}
        self.bits: dict[int, bytearray] = {}  # blocks not all on the ledger
        self.kept = 0  # URLs in all the blocks' text
        self.small = 0  # blocks of fewer than SMALL_BLOCK URLs

    def __len__(self) -> int:
        return len(self.index)

    def __iter__(self) -> Iterator[str]:
        """What is on the ledger (every block inflated)."""
        return iter(self._kept(list(self.text)))

    def _kept(self, blocks: list[int]) -> list[str]:
        """The URLs of ``blocks`` still on the ledger."""
        bits = self.bits.get
        return [u for b in blocks for u in on_ledger(self.text[b], bits(b))]

    def _fresh(self, urls: Iterable[str]) -> tuple[list[str], np.ndarray]:
        """Those of ``urls`` not on the ledger, sorted, and their fingerprints."""
        urls = sorted(set(urls))
        fps = fingerprint_many(urls)
        fresh = self.index.get(fps) < 0
        return list(itertools.compress(urls, fresh.tolist())), fps[fresh]

    def give(self, urls: Iterable[str], new_block: Iterator[int]) -> list[Action]:
        """``urls`` are given to the host: those not on its ledger yet go on it, as a block."""
        fresh, fps = self._fresh(urls)
        if not fresh:
            return []
        actions: list[Action] = []
        for i in range(0, len(fresh), 1 << PLACE_BITS):
            block, part = next(new_block), fresh[i:i + (1 << PLACE_BITS)]
            self.index.add(fps[i:i + len(part)], block_slots(block, len(part)))
            actions.append(self._put(block, part, part))
        return actions + self.compact(new_block)

    def restore(self, block: int, data: bytes, bits: bytes | None) -> None:
        """A block of the stored ledger, after a restart (``bits`` None: all of it on
        the ledger)."""
        urls = inflate(data)
        live = np.ones(len(urls), bool) if bits is None else live_places(bits, len(urls))
        places = np.flatnonzero(live)
        fps = fingerprint_many([urls[p] for p in places.tolist()])
        fresh = self.index.get(fps) < 0  # a URL stored live twice stays in its first block
        if not fresh.any():
            return
        self.index.add(fps[fresh], (block << PLACE_BITS) + places[fresh])
        live[places[~fresh]] = False
        self.text[block] = data
        self.size[block] = len(urls)
        self.live[block] = int(fresh.sum())
        if self.live[block] < len(urls):
            self.bits[block] = bytearray(live_bits(live))
        self.kept += len(urls)
        self.small += len(urls) < SMALL_BLOCK

    def take(self, urls: Iterable[str], new_block: Iterator[int]) -> list[Action]:
        """``urls`` leave the ledger (those on it); blocks left with none of them go, the
        others' bits are stored again."""
        urls = list(dict.fromkeys(urls))
        taken = self.index.remove(fingerprint_many(urls))
        hit = taken >= 0
        if not hit.any():
            return []
        touched: dict[int, bytearray] = {}
        for slot in taken[hit].tolist():
            block, place = slot >> PLACE_BITS, slot & _PLACE
            if (bits := touched.get(block)) is None:
                if (bits := self.bits.get(block)) is None:
                    bits = self.bits[block] = all_live(self.size[block])
                touched[block] = bits
            bits[place >> 3] &= ~(1 << (place & 7))
            self.live[block] -= 1
        emptied = [b for b in touched if not self.live[b]]
        for block in emptied:
            self._drop(block)
        marks = tuple((b, bytes(bits)) for b, bits in touched.items() if b in self.live)
        gone = tuple(itertools.compress(urls, hit.tolist()))
        return [Unledger(self.host, gone, tuple(emptied), marks)] + self.compact(new_block)

    def compact(self, new_block: Iterator[int]) -> list[Action]:
        """When the blocks keep twice what is on the ledger (and :data:`SLACK` more), or
        :data:`SMALL_RUN` small ones are kept, the blocks mostly finished and the small
        ones are re-deflated together; nothing joins or leaves the ledger."""
        if self.kept <= 2 * len(self) + SLACK and self.small < SMALL_RUN:
            return []
        worn = [b for b, n in self.size.items() if n < SMALL_BLOCK or 2 * self.live[b] < n]
        kept = sorted(self._kept(worn))
        for b in worn:
            self._drop(b)
        actions: list[Action] = []
        for i in range(0, len(kept), MAX_BLOCK):
            block, part = next(new_block), kept[i:i + MAX_BLOCK]
            self.index.move(fingerprint_many(part), block_slots(block, len(part)))
            actions.append(self._put(block, part, ()))
        return actions + [Unledger(self.host, (), tuple(worn))]

    def _put(self, block: int, urls: list[str], fresh: Sequence[str]) -> Ledger:
        """Block ``block`` holds ``urls`` (sorted), all on the ledger; ``fresh`` of them
        join it with the block."""
        data = self.text[block] = deflate(urls)
        self.size[block] = self.live[block] = len(urls)
        self.kept += len(urls)
        self.small += len(urls) < SMALL_BLOCK
        return Ledger(self.host, tuple(fresh), block, data)

    def _drop(self, block: int) -> None:
        self.kept -= self.size[block]
        self.small -= self.size[block] < SMALL_BLOCK
        del self.text[block], self.size[block], self.live[block]
        self.bits.pop(block, None)


#: What a center stores of a host's ledger, as its load reads it back: block id -> (the
#: block's deflated text, its bits; None: all of it on the ledger).
StoredBlocks = dict[int, tuple[bytes, bytes | None]]


class Ledgers(dict[str, HostLedger]):
    """Every host's ledger, by host IP, and the ids of new blocks (above every stored one)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = itertools.count(1)

    def give(self, host: str, urls: Iterable[str]) -> list[Action]:
        held = self.get(host) or self.setdefault(host, HostLedger(host))
        actions = held.give(urls, self.blocks)
        if not held:
            del self[host]
        return actions

    def take(self, host: str, urls: Iterable[str]) -> list[Action]:
        held = self.get(host)
        if not held:
            return []
        actions = held.take(urls, self.blocks)
        if not held:
            del self[host]
        return actions

    def restore(self, stored: dict[str, StoredBlocks]) -> None:
        """The stored ledgers (host -> its blocks), after a restart."""
        top = 0
        for host, blocks in stored.items():
            held = self.get(host) or self.setdefault(host, HostLedger(host))
            for block, (data, bits) in sorted(blocks.items()):
                held.restore(block, data, bits)
                top = max(top, block)
            if not held:
                del self[host]
        self.blocks = itertools.count(max(top + 1, next(self.blocks)))

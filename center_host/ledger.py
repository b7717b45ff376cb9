"""A center's ledger (docs/PROTOCOL.md section 12), kept small: every URL it gave a LAN
host and was not told is finished.

A broad crawl queues far more than it fetches, so the ledger holds every URL queued on
the LAN's hosts; kept as a set of text it cost the center more a URL (~84 B in Redis,
~145 B in the process) than the host's own compact queue. Here the URLs of one
assignment are one *block*: sorted and deflated together (some 10-18 B a URL when a
block holds eight or more), and a URL's 64-bit fingerprint names its block (16 B a URL
in the process, one bucketed intset entry in Redis). A host's report (its finished URLs)
is answered from the fingerprints alone; only a move (the host gone) inflates the
host's blocks. Blocks whose URLs are mostly finished, and runs of small ones, are
re-deflated together (:meth:`HostLedger.compact`), so the text kept stays within about
twice what is still on the ledger.

In Redis (center_host/pools.py): ``ledger_fp:<host>`` the fingerprints of what is on the
ledger, ``ledger_blocks:<host>`` a hash block id -> deflated text; a URL is on the
ledger if its fingerprint is in the first and its text in one of the blocks.
"""

from __future__ import annotations

import itertools
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from dedupnet.codec.urls import fingerprint_many

from .events import Action, Ledger, Unledger

#: A block of fewer URLs deflates poorly (and costs its own hash field): :data:`SMALL_RUN`
#: of them are re-deflated together.
SMALL_BLOCK = 64
SMALL_RUN = 64
#: URLs at most in a block a compaction writes: a move inflates no more at once.
MAX_BLOCK = 4096
#: Fingerprints looked up one by one rather than as arrays.
FEW = 16
#: Text kept beyond twice what is on the ledger, in URLs, before a compaction.
SLACK = 4096


_PLAIN, _DEFLATED = b"p", b"d"


def deflate(urls: Sequence[str]) -> bytes:
    """The text of a block: its URLs sorted (neighbours share their site and path),
    newline-joined, raw deflate after a one-byte mark; a block of fewer than
    :data:`SMALL_BLOCK` is kept plain (setting up a deflate costs some 100 µs, more than
    a few URLs save, and small blocks are soon re-deflated together)."""
    text = "\n".join(sorted(urls)).encode()
    if len(urls) < SMALL_BLOCK:
        return _PLAIN + text
    packer = zlib.compressobj(6, zlib.DEFLATED, -15)
    return _DEFLATED + packer.compress(text) + packer.flush()


def inflate(data: bytes) -> list[str]:
    text = zlib.decompress(data[1:], -15) if data[:1] == _DEFLATED else data[1:]
    return text.decode().split("\n") if text else []


class BlockIndex:
    """Fingerprint -> block id, 16 bytes an entry: a sorted array (an entry's block set
    to -1 once it is gone, squeezed out when half are) and a dict of the latest, merged
    into the array when it passes a quarter of it."""

    def __init__(self) -> None:
        self.keys = np.empty(0, np.uint64)
        self.blocks = np.empty(0, np.int64)
        self.dead = 0
        self.recent: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.keys) - self.dead + len(self.recent)

    def _find(self, fps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each fingerprint is in the array (-1: not there, alive) and its block
        (-1: not held)."""
        blocks = np.full(len(fps), -1, np.int64)
        if not len(self.keys):
            return np.full(len(fps), -1, np.int64), blocks
        pos = np.minimum(np.searchsorted(self.keys, fps), len(self.keys) - 1)
        pos = np.where((self.keys[pos] == fps) & (self.blocks[pos] >= 0), pos, -1)
        blocks[pos >= 0] = self.blocks[pos[pos >= 0]]
        return pos, blocks

    def _few(self, fps: np.ndarray, take: bool) -> np.ndarray:
        """:meth:`get` (or, with ``take``, :meth:`remove`) one by one: for a few, each
        array operation costs more than the search."""
        keys, held, top = self.keys, self.blocks, len(self.keys)
        look = self.recent.pop if take else self.recent.get
        out = []
        for fp, p in zip(fps.tolist(), keys.searchsorted(fps).tolist() if top else [0] * len(fps)):
            block = int(held[p]) if p < top and int(keys[p]) == fp else -1
            if block < 0:
                block = look(fp, -1)
            elif take:
                held[p] = -1
                self.dead += 1
            out.append(block)
        return np.array(out, np.int64)

    def _recent(self, fps: np.ndarray, blocks: np.ndarray, take: bool) -> None:
        """Fill in (or, with ``take``, pop) the blocks of those in :attr:`recent`."""
        if self.recent:
            look = self.recent.pop if take else self.recent.get
            miss = np.flatnonzero(blocks < 0)
            blocks[miss] = [look(fp, -1) for fp in fps[miss].tolist()]

    def get(self, fps: np.ndarray) -> np.ndarray:
        """The block of each fingerprint, -1 for those not held."""
        if len(fps) <= FEW:
            return self._few(fps, take=False)
        blocks = self._find(fps)[1]
        self._recent(fps, blocks, take=False)
        return blocks

    def add(self, fps: np.ndarray, block: int) -> None:
        """Fingerprints not held (the caller checked) now name ``block``."""
        self.recent.update(dict.fromkeys(fps.tolist(), block))
        if len(self.recent) > max(SLACK, len(self.keys) // 4):
            self._merge()

    def move(self, fps: np.ndarray, block: int) -> None:
        """Fingerprints held now name ``block`` (their text was re-deflated into it)."""
        pos = self._find(fps)[0]
        self.blocks[pos[pos >= 0]] = block
        for fp in fps[pos < 0].tolist():
            self.recent[fp] = block

    def remove(self, fps: np.ndarray) -> np.ndarray:
        """Drop these (distinct) fingerprints; returns the block each was in, -1 if not held."""
        if len(fps) <= FEW:
            blocks = self._few(fps, take=True)
        else:
            pos, blocks = self._find(fps)
            self.blocks[pos[pos >= 0]] = -1
            self.dead += int((pos >= 0).sum())
            self._recent(fps, blocks, take=True)
        if self.dead > len(self.keys) // 2:
            self._merge()
        return blocks

    def _merge(self) -> None:
        alive = self.blocks >= 0
        keys = np.concatenate([self.keys[alive], np.fromiter(self.recent, np.uint64, len(self.recent))])
        blocks = np.concatenate([self.blocks[alive], np.fromiter(self.recent.values(), np.int64, len(self.recent))])
        order = np.argsort(keys, kind="stable")
        self.keys, self.blocks, self.dead, self.recent = keys[order], blocks[order], 0, {}


class HostLedger:
    """One host's ledger: its blocks (id -> deflated text, and how many URLs each holds
    and has still on the ledger) and the index of what is on it."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.index = BlockIndex()
        self.text: dict[int, bytes] = {}
        self.size: dict[int, int] = {}
        self.live: dict[int, int] = {}
        self.kept = 0  # URLs in all the blocks' text
        self.small = 0  # blocks of fewer than SMALL_BLOCK URLs

    def __len__(self) -> int:
        return len(self.index)

    def __iter__(self) -> Iterator[str]:
        """What is on the ledger (every block inflated)."""
        return iter(self._kept(list(self.text)))

    def _kept(self, blocks: list[int]) -> list[str]:
        """The URLs of ``blocks`` still on the ledger in them: inflated, and looked up at
        once."""
        texts = [inflate(self.text[b]) for b in blocks]
        urls = [u for text in texts for u in text]
        owner = np.repeat(np.array(blocks, np.int64), [len(text) for text in texts])
        held = self.index.get(fingerprint_many(urls)) == owner
        return [u for u, h in zip(urls, held.tolist()) if h]

    def _join(self, block: int, urls: Iterable[str]) -> list[str]:
        """Those of ``urls`` not on the ledger yet join it, in block ``block``."""
        urls = list(dict.fromkeys(urls))
        fps = fingerprint_many(urls)
        fresh = self.index.get(fps) < 0
        if not fresh.any():
            return []
        self.index.add(fps[fresh], block)
        return [u for u, f in zip(urls, fresh.tolist()) if f]

    def give(self, urls: Iterable[str], new_block: Iterator[int]) -> list[Action]:
        """``urls`` are given to the host: those not on its ledger yet go on it, as a block."""
        block = next(new_block)
        fresh = self._join(block, urls)
        return [self._put(block, fresh, fresh)] + self.compact(new_block) if fresh else []

    def restore(self, block: int, urls: Sequence[str]) -> None:
        """A block of the stored ledger (its URLs still on it), after a restart."""
        if fresh := self._join(block, urls):
            self._put(block, fresh, ())

    def take(self, urls: Iterable[str], new_block: Iterator[int]) -> list[Action]:
        """``urls`` leave the ledger (those on it); blocks left with none of them go."""
        urls = list(dict.fromkeys(urls))
        blocks = self.index.remove(fingerprint_many(urls))
        hit = blocks >= 0
        if not hit.any():
            return []
        emptied = []
        for block, n in Counter(blocks[hit].tolist()).items():
            self.live[block] -= n
            if not self.live[block]:
                emptied.append(block)
                self._drop(block)
        gone = tuple(u for u, h in zip(urls, hit.tolist()) if h)
        return [Unledger(self.host, gone, tuple(emptied))] + self.compact(new_block)

    def compact(self, new_block: Iterator[int]) -> list[Action]:
        """When the blocks keep twice what is on the ledger (and :data:`SLACK` more), or
        :data:`SMALL_RUN` small ones are kept, the blocks mostly finished and the small
        ones are re-deflated together; nothing joins or leaves the ledger."""
        if self.kept <= 2 * len(self) + SLACK and self.small < SMALL_RUN:
            return []
        worn = [b for b, n in self.size.items() if n < SMALL_BLOCK or 2 * self.live[b] < n]
        kept = self._kept(worn)
        for b in worn:
            self._drop(b)
        actions: list[Action] = []
        for i in range(0, len(kept), MAX_BLOCK):
            part = kept[i:i + MAX_BLOCK]
            block = next(new_block)
            self.index.move(fingerprint_many(part), block)
            actions.append(self._put(block, part, ()))
        return actions + [Unledger(self.host, (), tuple(worn))]

    def _put(self, block: int, urls: list[str], fresh: Sequence[str]) -> Ledger:
        """Block ``block`` holds ``urls``; ``fresh`` of them join the ledger with it."""
        data = self.text[block] = deflate(urls)
        self.size[block] = self.live[block] = len(urls)
        self.kept += len(urls)
        self.small += len(urls) < SMALL_BLOCK
        return Ledger(self.host, tuple(fresh), block, data)

    def _drop(self, block: int) -> None:
        self.kept -= self.size[block]
        self.small -= self.size[block] < SMALL_BLOCK
        del self.text[block], self.size[block], self.live[block]


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

    def restore(self, stored: dict[str, dict[int, list[str]]]) -> None:
        """The stored ledgers (host -> block -> its URLs on the ledger), after a restart."""
        top = 0
        for host, blocks in stored.items():
            held = self.get(host) or self.setdefault(host, HostLedger(host))
            for block, urls in sorted(blocks.items()):
                held.restore(block, urls)
                top = max(top, block)
            if not held:
                del self[host]
        self.blocks = itertools.count(max(top + 1, next(self.blocks)))

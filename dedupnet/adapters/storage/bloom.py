"""An optional Bloom-filter ``finish_URL`` (as ZooKeeper + Redis crawlers keep theirs).

For operators who trade exactness for memory: ``finish_url_filter = "bloom"`` keeps a
host's ``finish_URL`` (paper §1.1, "the URLs this host has crawled", looked up in §2.2
and §2.3) as a Bloom filter instead of bucketed intsets: about ``-ln(p) / ln(2)^2``
bits per URL (1.2 bytes at ``p = 1 %``, 1.8 at 0.1 %) instead of ~8.1 bytes.

**The price: every false positive is a URL never crawled.** A look-up that wrongly
answers "crawled" drops the URL at the local stage (§2.2) or marks it seen in a LAN
answer (§2.3), so nobody fetches it, nor the pages only it links to. The exact
protocol's guarantee (every URL fetched exactly once) becomes "at most once, and
missing about ``p`` of them" while the filter holds at most ``bloom_capacity`` URLs;
past it the rate climbs (``(1 - e^(-k n / m))^k``). The simulation counts those losses
against the web's ground truth (``lost URLs``). Duplicates are unaffected: a Bloom
filter has no false negatives.

Layout: ``m`` bits in Redis strings of ``2**SEGMENT_BITS`` bits (128 KiB) each,
``<prefix>:finish_URL:bloom:<segment>`` (on a cluster untagged, so segments spread
over slots, like the intset buckets). The ``k`` bit positions of a URL come from its
64-bit xxh3 fingerprint by double hashing (Kirsch and Mitzenmacher): ``h1`` the
fingerprint, ``h2`` a splitmix64 of it (odd), position ``i`` = ``(h1 + i * h2) mod m``.
A batch is one ``BITFIELD ... SET u1 <offset> 1 ...`` (add) or ``BITFIELD_RO ... GET u1
<offset> ...`` (look-up) per segment touched, queued into the store's
:class:`~dedupnet.adapters.storage.store.Batch` like the intset buckets' SADD/SMISMEMBER: the same one
round trip. The server's Bloom module (valkey-bloom ``BF.*``) would be the other way;
the embedded ``valkey-server`` has no modules, so this needs nothing but core commands.

The filter is wired in below the pools: a :class:`Batch` whose store has a filter sends
``fingerprints(SADD / SMISMEMBER, finish_URL, ...)`` here, so the crawler, the host
pools and ``dedupnet finish`` all use it unchanged. It cannot remove (``SREM``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dedupnet.adapters.storage.store import FINISH_URL
from dedupnet.adapters.storage.resp import bulk

#: Bits per Redis string key (128 KiB): segments spread over cluster slots, and SETBIT
#: never grows one string past this.
SEGMENT_BITS = 20
FILTERS = ("exact", "bloom")

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class BloomSpec:
    """Sized for ``capacity`` URLs at false-positive rate ``error_rate``."""

    capacity: int = 10_000_000
    error_rate: float = 0.001

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError("bloom_capacity must be at least 1")
        if not 0 < self.error_rate < 1:
            raise ValueError("bloom_error_rate must be between 0 and 1")

    @property
    def bits(self) -> int:
        """``m = -n ln(p) / ln(2)^2`` (the last segment key is only as long as it needs)."""
        return max(64, math.ceil(-self.capacity * math.log(self.error_rate) / math.log(2) ** 2))

    @property
    def hashes(self) -> int:
        """``k = (m / n) ln 2``, at least 1."""
        return max(1, round(self.bits / self.capacity * math.log(2)))

    def expected_rate(self, stored: int) -> float:
        """False-positive rate once ``stored`` URLs are in: ``(1 - e^(-k n / m))^k``."""
        k, m = self.hashes, self.bits
        return (1 - math.exp(-k * stored / m)) ** k

    def positions(self, fps: np.ndarray) -> np.ndarray:
        """The ``k`` bit positions of each fingerprint, shape ``(n, k)``, in ``[0, m)``."""
        h1 = np.asarray(fps, dtype=np.uint64)
        h2 = _splitmix(h1) | np.uint64(1)
        i = np.arange(self.hashes, dtype=np.uint64)
        with np.errstate(over="ignore"):
            pos = h1[:, None] + i[None, :] * h2[:, None]  # wraps mod 2**64
        return pos % np.uint64(self.bits)


class BloomFilter:
    """The filter of one store's ``finish_URL``: queues its commands into a batch."""

    def __init__(self, spec: BloomSpec, key: str, fp_key: str):
        self.spec = spec
        self.key = key  # the finish_URL key as the pools name it (store.key(FINISH_URL))
        self.fp_key = fp_key  # the base of its keys (store.fp_key: untagged on a cluster)
        self._sized: set[int] = set()  # segments this process has made full-size

    def segment_bytes(self, segment: int) -> int:
        seg = 1 << SEGMENT_BITS
        return (min(seg, self.spec.bits - segment * seg) + 7) // 8

    def segment_key(self, segment: int) -> str:
        return f"{self.fp_key}:bloom:{segment}"

    def queue(self, batch, command: bytes, fps: np.ndarray) -> "BloomReplies":
        """``SADD`` -> set the bits (``BITFIELD SET``); ``SMISMEMBER`` -> read them
        (``BITFIELD_RO GET``); one command per segment touched."""
        if command == b"SMISMEMBER":
            op, tail = b"GET", b""
        elif command == b"SADD":
            op, tail = b"SET", b"1"
        else:
            raise ValueError(f"a Bloom filter cannot {command.decode()} (finish_url_filter = 'bloom')")
        fps = np.asarray(fps, dtype=np.uint64)
        n = len(fps)
        if n == 0:
            return BloomReplies((), np.empty(0, np.int64), 0, self.spec.hashes)
        flat = self.spec.positions(fps).ravel()
        segments = (flat >> np.uint64(SEGMENT_BITS)).astype(np.int64)
        offsets = (flat & np.uint64((1 << SEGMENT_BITS) - 1)).astype(np.int64)
        # Offsets are sent as decimal text without leading zeros (BITFIELD refuses them),
        # so ops are grouped by digit count too: each group is packed as fixed-width
        # records in one numpy step, one command per (digits, segment).
        digits = np.searchsorted(_POWERS, offsets, side="right").astype(np.int64) + 1  # 1..7
        order = np.lexsort((segments, digits))
        segments, offsets, digits = segments[order], offsets[order], digits[order]
        name = bulk(b"BITFIELD_RO" if op == b"GET" else b"BITFIELD")
        per_op = 4 if tail else 3
        replies: list[int] = []  # where this handle's BITFIELD replies sit in the batch
        for d in np.unique(digits).tolist():
            lo, hi = np.searchsorted(digits, [d, d + 1])
            head = b"$3\r\n" + op + b"\r\n$2\r\nu1\r\n$%d\r\n" % d
            end_ = b"\r\n" + (b"$1\r\n" + tail + b"\r\n" if tail else b"")
            width = len(head) + d + len(end_)
            rec = np.empty((hi - lo, width), dtype=np.uint8)
            rec[:, :len(head)] = np.frombuffer(head, dtype=np.uint8)
            rec[:, len(head):len(head) + d] = offsets[lo:hi].astype(f"S{d}").view(np.uint8).reshape(-1, d)
            rec[:, len(head) + d:] = np.frombuffer(end_, dtype=np.uint8)
            view = memoryview(rec.tobytes())
            segs = segments[lo:hi]
            starts = np.flatnonzero(np.r_[True, segs[1:] != segs[:-1]])
            ends = np.r_[starts[1:], len(segs)]
            for seg, a, b in zip(segs[starts].tolist(), starts.tolist(), ends.tolist()):
                key = self.segment_key(seg).encode()
                if tail and seg not in self._sized:
                    # A string grown by SETBIT is allocated with room to spare (up to twice
                    # its length, measured: 2.45 bytes a URL at 1 % instead of 1.2): the
                    # first write of a segment creates it at its exact size (NX: never over
                    # existing bits; its reply is not one of this handle's).
                    self._sized.add(seg)
                    batch.add(b"SET", key, bytes(self.segment_bytes(seg)), b"NX")
                replies.append(batch.add_packed([b"*%d\r\n" % (2 + (b - a) * per_op), name, bulk(key),
                                                 view[a * width: b * width]], key))
        return BloomReplies(tuple(replies), order, n, self.spec.hashes)


_POWERS = np.array([10**i for i in range(1, 19)], dtype=np.int64)


@dataclass(frozen=True)
class BloomReplies:
    """Like :class:`~dedupnet.adapters.storage.store.FingerprintReplies`: ``flags`` (every bit of a URL
    set) for a look-up, ``total`` (URLs with a bit newly set: "new") for an add."""

    replies: tuple[int, ...]
    order: np.ndarray
    size: int
    k: int

    def _bits(self, results: list) -> np.ndarray:
        out = np.zeros(self.size * self.k, dtype=bool)
        if self.size:
            replies = [results[i] for i in self.replies]
            for r in replies:
                if isinstance(r, Exception):
                    raise r
            flat = np.fromiter((b for r in replies for b in r), dtype=np.int8, count=self.size * self.k)
            out[self.order] = flat.astype(bool)
        return out.reshape(self.size, self.k)

    def flags(self, results: list) -> np.ndarray:
        return self._bits(results).all(axis=1)

    def total(self, results: list) -> int:
        """URLs that had a bit still unset before this add (set adds' "how many new")."""
        return int((~self._bits(results).all(axis=1)).sum()) if self.size else 0


def attach(store, spec: BloomSpec | None) -> None:
    """Make ``store``'s ``finish_URL`` a Bloom filter (``None``: the exact intsets)."""
    store.finish_filter = BloomFilter(spec, store.key(FINISH_URL), store.fp_key(FINISH_URL)) if spec else None


def spec_from(settings) -> BloomSpec | None:
    """The filter ``settings`` ask for (``finish_url_filter``, ``bloom_capacity``,
    ``bloom_error_rate``), or None for the exact intsets."""
    kind = getattr(settings, "finish_url_filter", "exact") or "exact"
    if kind not in FILTERS:
        raise ValueError(f"finish_url_filter must be one of {', '.join(FILTERS)}, not {kind!r}")
    if kind == "exact":
        return None
    return BloomSpec(settings.bloom_capacity, settings.bloom_error_rate)

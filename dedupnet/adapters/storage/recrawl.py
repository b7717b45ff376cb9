"""Re-crawl by age: fingerprint sets whose members are "seen" only
for a while.

Without ``recrawl_after`` a URL in ``finish_URL`` (a host) or ``admitted`` (a center) is
seen for ever, and this module is not used. With it, a URL counts as seen for its *age*
``A`` (``recrawl_after``, or the first ``recrawl_sites`` pattern its site matches) after
it was admitted or crawled, and the protocol's look-ups answer "not seen" after that, so
a re-discovered URL is admitted and crawled again (docs/PROTOCOL.md, "Re-crawl by age",
has the argument that no URL is admitted twice within its age anywhere).

**Storage: one bucketed intset per time slice.** A set of age ``A`` is cut into slices of
``A / SLICES`` seconds of the writer's clock; a member is written into the slice of the
moment it is written (``<pool>@<A>:<slice>:<bucket>``, the same 1,024 intset buckets as
``finish_URL``: dedupnet/adapters/storage/store.py) and a look-up asks the newest ``SLICES + 1`` slices.
So a member is seen for at least ``A`` and less than ``A + A / SLICES`` seconds, no
per-URL time stamp is stored (8 bytes per URL and slice, as without ages), and expiry
is whole keys: each slice's buckets carry a Redis TTL (relative, so only the clocks'
rates matter, not their offsets) one slice past the last look-up that asks them. A URL
whose site has no age (``never``) stays in the plain ``<pool>:<bucket>`` layout.

Measured (bench/bench_recrawl.py, 1 M fingerprints in batches of 1,000, embedded valkey,
the shared machine): 8.13 bytes per URL plain, 8.16 in one slice, 8.67 over five; stores
at 124 k URLs/s instead of 294 k (a ``PEXPIRE`` per bucket written), look-ups at 63-71 k
instead of 295 k (five ``SMISMEMBER`` per bucket instead of one).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dedupnet.adapters.storage.store import Batch, FingerprintReplies, Store
from dedupnet.codec.ages import RecrawlPolicy, _label
from dedupnet.codec.urls import fingerprint_many

#: Slices per age: a member is seen for ``A`` to ``A * (1 + 1/SLICES)`` seconds, and a
#: look-up asks ``SLICES + 1`` keys per bucket. Part of the key layout (slice numbers).
SLICES = 4
class AgedSet:
    """A fingerprint set (``finish_URL``, ``admitted``) under a :class:`RecrawlPolicy`:
    :meth:`add` and :meth:`contains` queue their commands into a caller's batch, like
    :meth:`Batch.fingerprints` (one round trip, inside a MULTI/EXEC or not). ``clock``:
    the writer's wall clock (seconds), injectable for tests."""

    def __init__(self, store: Store, pool: str, policy: RecrawlPolicy, clock: Callable[[], float] = time.time):
        self.store = store
        self.pool = pool
        self.policy = policy
        self.clock = clock

    def slice_pool(self, age: float, number: int) -> str:
        return f"{self.pool}@{_label(age)}:{number}"

    def add(self, batch: Batch, urls: Sequence[str], fps: np.ndarray | None = None) -> "AgedReplies":
        """SADD into the current slice of each URL's age, and give every bucket written
        its TTL; :meth:`AgedReplies.total` of the result is how many were new there."""
        return self._queue(batch, urls, fps, write=True)

    def contains(self, batch: Batch, urls: Sequence[str], fps: np.ndarray | None = None) -> "AgedReplies":
        """SMISMEMBER in the slices that can hold a member younger than its age:
        :meth:`AgedReplies.flags` is True for those seen."""
        return self._queue(batch, urls, fps, write=False)

    def _queue(self, batch: Batch, urls: Sequence[str], fps: np.ndarray | None, *, write: bool) -> "AgedReplies":
        fps = fingerprint_many(urls) if fps is None else np.asarray(fps, dtype=np.uint64)
        command = b"SADD" if write else b"SMISMEMBER"
        now = self.clock()
        parts = []
        for age, idx in self.policy.groups(urls).items():
            sub = fps[idx]
            if age is None:  # for ever: the plain set
                parts.append((idx, [batch.fingerprints(command, self.store.key(self.pool), sub)]))
                continue
            width = age / SLICES
            newest = math.floor(now / width)
            numbers = [newest] if write else range(newest - SLICES, newest + 1)
            parts.append((idx, [batch.fingerprints(command, self.store.key(self.slice_pool(age, n)), sub)
                                for n in numbers]))
            if write:
                # Asked until slice ``newest + SLICES`` ends; kept one slice longer (a margin
                # for the time between this write and Redis running it).
                ttl_ms = math.ceil(((newest + SLICES + 2) * width - now) * 1000)
                base = self.store.fp_key(self.slice_pool(age, newest))
                for bucket in np.unique(sub >> np.uint64(64 - self.store.bucket_bits)).tolist():
                    batch.add(b"PEXPIRE", f"{base}:{bucket}", ttl_ms)
        return AgedReplies(len(fps), parts)


@dataclass(frozen=True)
class AgedReplies:
    """Where an :class:`AgedSet` operation's replies sit in its batch's results."""

    size: int
    parts: list[tuple[np.ndarray, list[FingerprintReplies]]]

    def flags(self, results: list) -> np.ndarray:
        out = np.zeros(self.size, dtype=bool)
        for idx, handles in self.parts:
            seen = np.zeros(len(idx), dtype=bool)
            for handle in handles:
                seen |= handle.flags(results)
            out[idx] = seen
        return out

    def total(self, results: list) -> int:
        return sum(h.total(results) for _, handles in self.parts for h in handles)

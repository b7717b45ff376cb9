"""How a store's fingerprint sets are cut into buckets, and the store's own record of it
(``<prefix>:fp_bucket_bits``), so that every process of a host (daemon, crawler, Scrapy
spider) uses the layout its store was written with (dedupnet/adapters/storage/store.py)."""

from __future__ import annotations

import logging
import re

from dedupnet.codec.pools import ADMITTED, CONCLUDED, FINISH_URL, TASK_POOL

log = logging.getLogger("dedupnet.adapters.storage.store")

#: With fewer bucket bits a member (64 - bits bits + the offset) needs more than 17 digits.
MIN_BUCKET_BITS = 8
MAX_BUCKET_BITS = 24
#: ``bucket_bits`` unset: a new store starts with this many, one written before a store
#: recorded its layout has :data:`LEGACY_BUCKET_BITS`. Each bucket key costs ~80 bytes
#: whatever it holds, so on a small crawl the buckets, not the fingerprints, were most
#: of a set; a bigger bucket only makes an insert move more of its intset.
NEW_STORE_BUCKET_BITS = MIN_BUCKET_BITS
LEGACY_BUCKET_BITS = 10
#: The store's record of its buckets (``<prefix>:fp_bucket_bits``): every process of a
#: host (daemon, crawler, Scrapy spider) reads the layout from it, not from its settings.
BUCKET_BITS = "fp_bucket_bits"
#: The fingerprint sets a store may hold, looked for when it has no record yet.
FP_SETS = (FINISH_URL, f"{TASK_POOL}:fp", ADMITTED, CONCLUDED)

_GLOB = re.compile(r"([\\*?\[\]])")


def glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN ``MATCH`` pattern."""
    return _GLOB.sub(r"\\\1", text)


def adopt_bucket_bits(store) -> int:
    """A :class:`~dedupnet.adapters.storage.store.Store`'s recorded bucket bits, recorded first if it has none: the bits asked
    for, else :data:`NEW_STORE_BUCKET_BITS` for a store without fingerprint sets and
    :data:`LEGACY_BUCKET_BITS` for one written before the record (its old default).
    ``SET NX``: processes opening one store at once agree on the first one's."""
    key = store.key(BUCKET_BITS)
    recorded = store.redis.get(key)
    if recorded is None:
        bits = store.requested_bits
        if bits is None:
            held = any(next(store.redis.scan_iter(match=f"{glob_escape(store.fp_key(name))}:*", count=1000), None)
                       for name in FP_SETS)
            bits = LEGACY_BUCKET_BITS if held else NEW_STORE_BUCKET_BITS
        store.redis.set(key, bits, nx=True)
        recorded = store.redis.get(key)
    bits = int(recorded)
    if store.requested_bits is not None and bits != store.requested_bits:
        log.warning("Redis at %s, %s: its fingerprint sets have %d bucket bits; bucket_bits = %d is not used",
                    store.url, store.prefix, bits, store.requested_bits)
    return bits

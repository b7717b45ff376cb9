"""Redis bytes per URL and URLs/s of a fingerprint set with ages (re-crawl by age,
dedupnet/adapters/storage/recrawl.py) against the plain set, on the same embedded server, one after the
other.

For each: N fingerprints stored in batches of B, then N look-ups of which half are
stored. ``plain``: today's ``finish_URL`` (one SADD / SMISMEMBER per bucket). ``aged, 1
slice``: the same URLs under ``recrawl_after``, all written within one slice (a look-up
asks SLICES + 1 slices per bucket). ``aged, N slices``: written over SLICES + 1 slices
(the clock is moved), as a crawl that runs for longer than the age leaves them. The
server's ``used_memory`` before and after gives bytes per URL.

    .venv/bin/python bench/bench_recrawl.py --urls 1000000 --batch 1000
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import time

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.adapters.storage.recrawl import SLICES, AgedSet  # noqa: E402
from dedupnet.codec.ages import RecrawlPolicy  # noqa: E402
from dedupnet.adapters.storage.store import FINISH_URL, Store  # noqa: E402

AGE = 86_400.0


class Clock:
    now = 1_000_000 * AGE / SLICES  # a slice boundary

    def __call__(self) -> float:
        return self.now


def run(url: str, name: str, slices: int | None, stored: np.ndarray, fresh: np.ndarray, batch: int) -> dict:
    store = Store(url, f"bench-recrawl-{slices}")
    store.delete_prefix()
    clock = Clock()
    aged = AgedSet(store, FINISH_URL, RecrawlPolicy(AGE), clock) if slices else None
    # Without site patterns an AgedSet needs only as many URLs as fingerprints, not their text.
    placeholders = [""] * batch

    def add(fps: np.ndarray) -> None:
        if aged is None:
            store.fp_add(FINISH_URL, fps)
            return
        b = store.batch()
        aged.add(b, placeholders[:len(fps)], fps)
        store.execute(b)

    def contains(fps: np.ndarray) -> np.ndarray:
        if aged is None:
            return store.fp_contains(FINISH_URL, fps)
        b = store.batch()
        handle = aged.contains(b, placeholders[:len(fps)], fps)
        return handle.flags(store.execute(b))

    before = store.used_memory()
    per_slice = -(-len(stored) // (slices or 1))
    t = time.perf_counter()
    for i in range(0, len(stored), batch):
        if slices and i and i % per_slice < batch:
            clock.now += AGE / SLICES  # the next slice
        add(stored[i:i + batch])
    add_s = time.perf_counter() - t
    memory = store.used_memory() - before
    probe = np.concatenate([stored[: len(stored) // 2], fresh[: len(stored) // 2]])
    t = time.perf_counter()
    seen = np.concatenate([contains(probe[i:i + batch]) for i in range(0, len(probe), batch)])
    check_s = time.perf_counter() - t
    half = len(stored) // 2
    assert seen[:half].all() and not seen[half:].any()
    row = dict(name=name, bytes_per_url=memory / len(stored), add=len(stored) / add_s, check=len(probe) / check_s,
               keys=store.redis.dbsize())
    store.delete_prefix()
    store.close()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--urls", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--redis", metavar="URL", help="a server of your own (default: the embedded one)")
    args = p.parse_args()
    rng = np.random.default_rng(1)
    stored = rng.integers(0, 2**64, args.urls, dtype=np.uint64)
    fresh = rng.integers(0, 2**64, args.urls, dtype=np.uint64)
    runs = [("plain finish_URL", None), ("aged, 1 slice", 1), (f"aged, {SLICES + 1} slices", SLICES + 1)]
    print(f"{args.urls:,} URLs, batches of {args.batch:,}")
    print(f"{'finish_URL':<22}{'bytes/URL':>10}{'store URLs/s':>14}{'check URLs/s':>14}{'keys':>8}")

    def go(url: str) -> None:
        for name, slices in runs:
            r = run(url, name, slices, stored, fresh, args.batch)
            print(f"{r['name']:<22}{r['bytes_per_url']:>10.2f}{r['add']:>14,.0f}{r['check']:>14,.0f}{r['keys']:>8,}")

    if args.redis:
        go(args.redis)
    else:
        with EmbeddedRedis() as url:
            go(url)


if __name__ == "__main__":
    main()

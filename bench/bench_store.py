"""Benchmark: batched fingerprint look-ups in finish_URL vs the common Redis dupefilter.

Prints URLs/s for checking 1,000,000 already-normalised URLs (half present) against
a finish_URL of 1,000,000, Redis bytes per stored URL, normalisation + fingerprint
throughput on its own line, and in the same run the baseline most Redis
dupefilters use: one SADD of a SHA-1 hex fingerprint per URL, one round trip each.
The baseline runs on a sample (it is ~100x slower); its rate is per URL all the same.

Run: ``make bench`` or ``.venv/bin/python bench/bench_store.py [--urls N] [--batch B]``.
Figures depend on the machine and its load; compare ratios within one run.
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import hashlib
import time
from contextlib import nullcontext

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.adapters.storage.store import FINISH_URL, Store  # noqa: E402
from dedupnet.codec.urls import fingerprint_many, normalize  # noqa: E402


def synthetic_urls(n: int, start: int = 0) -> list[str]:
    return [f"http://site{i % 997}.example/section/{i % 31}/page-{i}.html?ref={i % 7}" for i in range(start, start + n)]


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>12,.0f} URLs/s"


def one_big_set(store: Store, urls: list[str]) -> float:
    """Redis bytes per URL if the fingerprints were one plain set instead of 1,024
    bucketed intsets (docs/DECISIONS.md "Store"): the same 64-bit fingerprints as
    integer members of one key, at the server's default ``set-max-intset-entries``."""
    r = store.redis
    key = "bench:one-big-set"
    limit = r.config_get("set-max-intset-entries")["set-max-intset-entries"]
    r.config_set("set-max-intset-entries", 512)
    try:
        m0 = store.used_memory()
        for i in range(0, len(urls), 10_000):
            r.sadd(key, *fingerprint_many(urls[i : i + 10_000]).view(np.int64).tolist())
        per_url = (store.used_memory() - m0) / r.scard(key)
    finally:
        r.delete(key)  # freed lazily; the next store.used_memory() waits for it
        r.config_set("set-max-intset-entries", limit)
    return per_url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--urls", type=int, default=1_000_000, help="stored URLs, and URLs checked (default 1M)")
    ap.add_argument("--batch", type=int, default=10_000, help="URLs per look-up batch (default 10,000)")
    ap.add_argument("--baseline-sample", type=int, default=20_000, help="URLs for the per-URL SADD baseline")
    ap.add_argument("--redis", help="use this server instead of the embedded one (its keys under bench:* are removed)")
    args = ap.parse_args()
    n, b = args.urls, args.batch

    with nullcontext(args.redis) if args.redis else EmbeddedRedis() as url:
        store = Store(url, "bench")
        store.delete_prefix()
        print(f"Redis {store.redis.info('server').get('redis_version')} at {url}; {n:,} stored, {n:,} checked, batch {b:,}")

        raw = synthetic_urls(200_000)
        t = time.perf_counter()
        normed = [normalize(u) for u in raw]
        fingerprint_many(normed)
        print(f"normalise + fingerprint     {rate(len(raw), time.perf_counter() - t)}")

        stored = synthetic_urls(n)
        query = stored[n // 2 :] + synthetic_urls(n // 2, start=n)  # half present
        np.random.default_rng(1).shuffle(query)

        m0 = store.used_memory()
        t = time.perf_counter()
        for i in range(0, n, b):
            store.fp_add(FINISH_URL, fingerprint_many(stored[i : i + b]))
        add_s = time.perf_counter() - t
        bytes_per_url = (store.used_memory() - m0) / n
        print(f"store (SADD, batched)       {rate(n, add_s)}")

        t = time.perf_counter()
        hits = 0
        for i in range(0, n, b):
            hits += int(store.fp_contains(FINISH_URL, fingerprint_many(query[i : i + b])).sum())
        check_s = time.perf_counter() - t
        assert hits == n // 2, hits
        check_rate = n / check_s
        print(f"check (fingerprint+lookup)  {rate(n, check_s)}   ({hits:,} found)")
        print(f"Redis bytes per stored URL  {bytes_per_url:>12.1f}")
        print(f"one big set, same URLs      {one_big_set(store, stored):>12.1f} bytes/URL "
              "(every fingerprint in one key, server default set-max-intset-entries 512)")

        # Baseline: SHA-1 hex per URL, one SADD round trip each (common Redis dupefilters).
        r = redis.Redis.from_url(url)
        key = "bench:baseline"
        m0 = store.used_memory()
        sample = query[: args.baseline_sample]
        t = time.perf_counter()
        for u in sample:
            r.sadd(key, hashlib.sha1(u.encode()).hexdigest())
        base_s = time.perf_counter() - t
        base_bytes = (store.used_memory() - m0) / len(sample)
        base_rate = len(sample) / base_s
        print(f"baseline SADD sha1-hex/URL  {rate(len(sample), base_s)}   ({base_bytes:.1f} bytes/URL)")
        print(f"ratio check / baseline      {check_rate / base_rate:>12.1f}x")
        r.delete(key)
        store.delete_prefix()


if __name__ == "__main__":
    main()

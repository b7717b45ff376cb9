"""Benchmark: scrapy-redis's own dupefilter against dedupnet's batched check, side by side.

The same stream of Scrapy requests (``--urls``, 1,000,000 by default; a quarter of them
repeat an earlier URL, as crawlers find popular pages again and again) goes

* through scrapy-redis's ``RFPDupeFilter.request_seen`` (scrapy-redis 0.9.1: per
  request a SHA-1 of its canonical URL, method and body as hex, then one ``SADD`` to
  one big Redis set: one round trip per request), and
* through dedupnet's check (what ``dedupnet.scrapy`` and a host do): normalise and
  fingerprint each URL (``URLGate``, xxh3), then per batch of ``--batch`` one round
  trip that asks ``SMISMEMBER`` and ``SADD``s into the bucketed fingerprint sets of
  ``dedupnet/adapters/storage/store.py`` (the same writes as ``bench/bench_store.py``),

on the same embedded server, one after the other, once with the server's default
``set-max-intset-entries`` (512) and once with dedupnet's (``dedupnet/adapters/storage/embedded.py``,
1,048,576). Printed per run: requests/s (building the ``Request`` objects is not
timed, on either side) and Redis bytes per distinct URL: the sum of ``MEMORY USAGE`` of
the keys (exact: ``SAMPLES 0``), and the ``INFO memory`` ``used_memory`` delta (which
also holds the server's other allocations meanwhile). Both must call
the same requests duplicates: the script checks that.

Run: ``.venv/bin/python bench/bench_scrapy_redis.py [--urls N] [--scrapy-redis-urls N]``
(needs the ``bench`` extra: ``pip install -e '.[bench]'``). scrapy-redis takes a round
trip per request: 1 M take minutes; ``--scrapy-redis-urls`` runs it on the first N only
(its rate and bytes are per URL all the same, but a smaller set is cheaper per URL).
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import random
import time

import numpy as np
import redis
from scrapy import Request
from scrapy_redis.dupefilter import RFPDupeFilter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.embedded import INTSET_MAX_ENTRIES, EmbeddedRedis  # noqa: E402
from dedupnet.adapters.storage.store import Store  # noqa: E402
from dedupnet.codec.urls import URLGate, fingerprint_many  # noqa: E402

POOL = "seen"
CHUNK = 10_000  # Request objects built at a time (not timed)


def url_stream(n: int, seed: int = 1) -> list[str]:
    """``n`` URLs of a crawl: three quarters new, a quarter an earlier one again."""
    rng = random.Random(seed)
    out: list[str] = []
    fresh = 0
    for _ in range(n):
        if out and rng.random() < 0.25:
            out.append(out[rng.randrange(len(out))])
        else:
            i = fresh
            fresh += 1
            out.append(f"http://site{i % 997}.example/section/{i % 31}/page-{i}.html?ref={i % 7}")
    return out


def memory_usage(r: redis.Redis, pattern: str) -> int:
    total = 0
    for key in r.scan_iter(match=pattern, count=1000):
        total += r.memory_usage(key, samples=0) or 0
    return total


def run_scrapy_redis(store: Store, urls: list[str]) -> dict:
    r = store.redis
    key = "bench-sr:dupefilter"
    r.delete(key)
    df = RFPDupeFilter(r, key)
    m0 = store.used_memory()
    seen = 0
    spent = 0.0
    for i in range(0, len(urls), CHUNK):
        requests = [Request(u) for u in urls[i : i + CHUNK]]
        t = time.perf_counter()
        for req in requests:
            seen += df.request_seen(req)
        spent += time.perf_counter() - t
    used = store.used_memory() - m0
    distinct = r.scard(key)
    usage = memory_usage(r, key)
    r.delete(key)
    return {"rate": len(urls) / spent, "seen": seen, "distinct": distinct,
            "bytes_info": used / distinct, "bytes_usage": usage / distinct, "encoding": "hashtable of 40-char hex"}


def run_dedupnet(store: Store, urls: list[str], batch: int) -> dict:
    store.delete_prefix()
    r = store.redis
    m0 = store.used_memory()
    gate = URLGate()
    seen = 0
    spent = 0.0
    key = store.key(POOL)
    for i in range(0, len(urls), CHUNK):
        requests = [Request(u) for u in urls[i : i + CHUNK]]
        t = time.perf_counter()
        for j in range(0, len(requests), batch):
            normed = gate.accept([req.url for req in requests[j : j + batch]])
            fps = fingerprint_many(normed)
            # Repeats inside the batch: the first is new, the others seen (as one by one).
            uniq, first = np.unique(fps, return_index=True)
            b = store.batch()
            asked = b.fingerprints(b"SMISMEMBER", key, uniq)
            b.fingerprints(b"SADD", key, uniq)
            present = asked.flags(store.execute(b))
            seen += int(present.sum()) + (len(fps) - len(uniq))
        spent += time.perf_counter() - t
    used = store.used_memory() - m0
    distinct = store.fp_count(POOL)
    usage = memory_usage(r, f"{key}:*")
    encodings = {r.object("encoding", k).decode() for k in list(r.scan_iter(match=f"{key}:*", count=1000))[:50]}
    store.delete_prefix()
    return {"rate": len(urls) / spent, "seen": seen, "distinct": distinct,
            "bytes_info": used / distinct, "bytes_usage": usage / distinct, "encoding": "/".join(sorted(encodings))}


def fingerprint_costs(r: redis.Redis, urls: list[str]) -> tuple[float, float]:
    """Microseconds a request for the fingerprint alone, no Redis: scrapy-redis's
    ``request_fingerprint`` (``canonicalize_url``, JSON, SHA-1 hex) against dedupnet's
    normalisation and xxh3 (``URLGate.accept`` and ``fingerprint_many``, in one batch)."""
    df = RFPDupeFilter(r, "bench-sr:unused")
    requests = [Request(u) for u in urls]
    t = time.perf_counter()
    for req in requests:
        df.request_fingerprint(req)
    sr = time.perf_counter() - t
    t = time.perf_counter()
    fingerprint_many(URLGate().accept([req.url for req in requests]))
    dn = time.perf_counter() - t
    return sr / len(urls) * 1e6, dn / len(urls) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--urls", type=int, default=1_000_000, help="requests through dedupnet (default 1M)")
    ap.add_argument("--scrapy-redis-urls", type=int, help="requests through scrapy-redis (default: --urls)")
    ap.add_argument("--batch", type=int, default=10_000, help="URLs per dedupnet round trip (default 10,000)")
    ap.add_argument("--fingerprint-urls", type=int, default=50_000,
                    help="requests for the fingerprint-only costs (default 50,000; 0: skip)")
    ap.add_argument("--configs", default="default,dedupnet",
                    help="set-max-intset-entries settings to run: default (512), dedupnet (1048576)")
    args = ap.parse_args()
    urls = url_stream(args.urls)
    n_sr = min(args.scrapy_redis_urls or args.urls, args.urls)
    settings = {"default": 512, "dedupnet": INTSET_MAX_ENTRIES}
    rows = []
    with EmbeddedRedis() as url:
        r = redis.Redis.from_url(url)
        store = Store(url, "bench-dn")
        print(f"Redis {r.info('server').get('redis_version')} at {url}; {len(urls):,} requests "
              f"({len(set(urls)):,} distinct URLs), scrapy-redis on the first {n_sr:,}, dedupnet batch {args.batch:,}")
        if args.fingerprint_urls:
            sr_us, dn_us = fingerprint_costs(r, urls[: args.fingerprint_urls])
            print(f"  fingerprint alone, no Redis ({min(args.fingerprint_urls, len(urls)):,} requests): "
                  f"scrapy-redis {sr_us:.1f} µs a request, dedupnet {dn_us:.1f} µs", flush=True)
        for name in args.configs.split(","):
            r.config_set("set-max-intset-entries", settings[name])
            dn = run_dedupnet(store, urls, args.batch)
            print(f"  [{name}] dedupnet     {dn['rate']:>12,.0f} req/s  {dn['bytes_info']:6.1f} B/URL (INFO)  "
                  f"{dn['bytes_usage']:6.1f} B/URL (MEMORY USAGE)  {dn['seen']:,} seen  {dn['encoding']}", flush=True)
            sr = run_scrapy_redis(store, urls[:n_sr])
            print(f"  [{name}] scrapy-redis {sr['rate']:>12,.0f} req/s  {sr['bytes_info']:6.1f} B/URL (INFO)  "
                  f"{sr['bytes_usage']:6.1f} B/URL (MEMORY USAGE)  {sr['seen']:,} seen  {sr['encoding']}", flush=True)
            if n_sr == len(urls):
                assert sr["seen"] == dn["seen"], (sr["seen"], dn["seen"])  # the same duplicates found
            rows.append((name, settings[name], dn, sr))
        store.close()
        r.close()
    print()
    print("| set-max-intset-entries | dupefilter | requests | requests/s | Redis B/URL (INFO) | B/URL (MEMORY USAGE) |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name, value, dn, sr in rows:
        print(f"| {value:,} ({name}) | scrapy-redis 0.9.1 `RFPDupeFilter` | {n_sr:,} | {sr['rate']:,.0f} | "
              f"{sr['bytes_info']:.1f} | {sr['bytes_usage']:.1f} |")
        print(f"| {value:,} ({name}) | dedupnet batched check | {len(urls):,} | {dn['rate']:,.0f} | "
              f"{dn['bytes_info']:.1f} | {dn['bytes_usage']:.1f} |")
    for name, value, dn, sr in rows:
        print(f"[{name}] dedupnet / scrapy-redis: {dn['rate'] / sr['rate']:.0f}x the rate, "
              f"{sr['bytes_usage'] / dn['bytes_usage']:.1f}x less memory per URL (MEMORY USAGE)")


if __name__ == "__main__":
    main()

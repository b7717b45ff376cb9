"""The store's batched path on a Redis Cluster against one server.

On the same machine, in one process, one after the other: one embedded server, then an
embedded 3-master cluster (``EmbeddedCluster``). For each: N fingerprints stored in
batches of B (``SADD`` per bucket), N looked up (half stored), and a center's event
transaction (an ``HSET`` on its own slot + ``SADD`` of 100 URLs on the bucket slots) as
one MULTI/EXEC. The cluster path is dedupnet's own (one pipelined round trip per node,
``dedupnet/adapters/storage/redis_cluster/``); as a baseline the same look-ups go through redis-py's
``RedisCluster`` pipeline (``SMISMEMBER`` per bucket, the way a user would write it).

    .venv/bin/python bench/bench_redis_cluster.py --urls 300000 --batch 10000
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import time

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.store_choice import store_for  # noqa: E402
from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.harness.embedded_cluster import EmbeddedCluster  # noqa: E402
from dedupnet.adapters.storage.store import FINISH_URL  # noqa: E402


def measure(url: str, stored: np.ndarray, fresh: np.ndarray, batch: int, events: int) -> dict:
    store = store_for(url, "bench-cluster")
    store.delete_prefix()
    t = time.perf_counter()
    for i in range(0, len(stored), batch):
        store.fp_add(FINISH_URL, stored[i:i + batch])
    add = len(stored) / (time.perf_counter() - t)
    probe = np.concatenate([stored[: len(stored) // 2], fresh[: len(stored) // 2]])
    t = time.perf_counter()
    for i in range(0, len(probe), batch):
        store.fp_contains(FINISH_URL, probe[i:i + batch])
    check = len(probe) / (time.perf_counter() - t)
    small = [fresh[i * 100:(i + 1) * 100] for i in range(events)]
    trips = store.round_trips
    t = time.perf_counter()
    for n, fps in enumerate(small):
        def fill(b, n=n, fps=fps):
            b.add(b"HSET", store.key("local_reduce_pool"), n, b"frame")
            b.fingerprints(b"SADD", store.key("admitted"), fps)
        store.transact(fill)
    event_us = (time.perf_counter() - t) / events * 1e6
    event_trips = (store.round_trips - trips) / events
    row = dict(add=add, check=check, event_us=event_us, event_trips=event_trips)
    if url.startswith("redis+cluster"):
        rc = store.redis  # redis-py's RedisCluster
        fp_key = store.fp_key(FINISH_URL)
        shift, mask = np.uint64(64 - store.bucket_bits), np.uint64((1 << (64 - store.bucket_bits)) - 1)
        t = time.perf_counter()
        for i in range(0, len(probe), batch):
            chunk = probe[i:i + batch]
            buckets = (chunk >> shift).tolist()
            members = ((chunk & mask) + np.uint64(10**16)).tolist()
            by: dict[int, list[int]] = {}
            for b, m in zip(buckets, members):
                by.setdefault(b, []).append(m)
            pipe = rc.pipeline(transaction=False)
            for b, ms in by.items():
                pipe.execute_command("SMISMEMBER", f"{fp_key}:{b}", *ms)
            pipe.execute()
        row["redis_py_check"] = len(probe) / (time.perf_counter() - t)
    store.delete_prefix()
    store.close()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--urls", type=int, default=300_000)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--events", type=int, default=500, help="center event transactions of 100 URLs")
    args = p.parse_args()
    rng = np.random.default_rng(1)
    stored = rng.integers(0, 2**64, args.urls, dtype=np.uint64)
    fresh = rng.integers(0, 2**64, args.urls, dtype=np.uint64)
    with EmbeddedRedis() as url:
        single = measure(url, stored, fresh, args.batch, args.events)
    with EmbeddedCluster(3) as url:
        cluster = measure(url, stored, fresh, args.batch, args.events)
    print(f"{args.urls:,} URLs in batches of {args.batch:,}; {args.events} event transactions of 100 URLs; "
          "one process, same machine")
    print(f"{'':34} {'one server':>12} {'3-master cluster':>17} {'cluster/one':>12}")
    for key, label in (("add", "store (SADD per bucket), URLs/s"), ("check", "check (SMISMEMBER), URLs/s")):
        print(f"{label:34} {single[key]:>12,.0f} {cluster[key]:>17,.0f} {cluster[key] / single[key]:>12.2f}")
    print(f"{'event transaction, µs':34} {single['event_us']:>12,.0f} {cluster['event_us']:>17,.0f} "
          f"{cluster['event_us'] / single['event_us']:>12.2f}")
    print(f"{'  waves (round trips) per event':34} {single['event_trips']:>12.1f} {cluster['event_trips']:>17.1f}")
    print(f"{'check via redis-py RedisCluster':34} {'':>12} {cluster['redis_py_check']:>17,.0f} "
          f"{'':>12}  (ours {cluster['check'] / cluster['redis_py_check']:.1f}x)")


if __name__ == "__main__":
    main()

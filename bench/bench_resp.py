"""Benchmark: dedupnet's hand-packed RESP vs redis-py's own pipeline, the same commands.

The store packs a batch's fingerprint commands with numpy and reads the replies with
its own hiredis reader (dedupnet/adapters/storage/store.py). The obvious alternative is redis-py's
``pipeline(transaction=False)``: one ``execute_command`` per bucket with the members as
Python ints, one ``execute()`` (one write, one read: also one round trip). Both are
given the same numpy grouping by bucket, send the same commands (the same members under
the same keys) and must return the same flags, which is checked.

Prints client CPU (``time.process_time``) and wall time per batch for a 400-URL look-up
(the daemons' set size), a 10,000-URL look-up and a 10,000-URL SADD (``make bench``'s
batch), medians of ``--repeat`` interleaved runs, and the ratio. redis-py parses with
hiredis when it is installed (it is a dependency: ``redis[hiredis]``); the line says.

Run: ``.venv/bin/python bench/bench_resp.py [--repeat R] [--redis URL]``.
Timings depend on the machine and its load; compare the ratios.
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import statistics
import time
from contextlib import nullcontext

import numpy as np
import redis
from redis.utils import HIREDIS_AVAILABLE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.adapters.storage.store import MEMBER_OFFSET, FINISH_URL, Store  # noqa: E402


def pipeline_op(client: redis.Redis, store: Store, command: str, fps: np.ndarray) -> np.ndarray | int:
    """``command`` for each bucket of ``fps`` through a redis-py pipeline: the store's
    key layout (bucket = top bits, member = the rest + offset), written as a user would."""
    shift = 64 - store.bucket_bits
    buckets = (fps >> np.uint64(shift)).astype(np.int64)
    order = np.argsort(buckets, kind="stable")
    members = ((fps[order] & np.uint64((1 << shift) - 1)) + np.uint64(MEMBER_OFFSET)).tolist()
    sorted_buckets = buckets[order]
    starts = np.flatnonzero(np.r_[True, sorted_buckets[1:] != sorted_buckets[:-1]]).tolist()
    ends = starts[1:] + [len(fps)]
    key = store.fp_key(FINISH_URL)
    pipe = client.pipeline(transaction=False)
    for start, end in zip(starts, ends):
        pipe.execute_command(command, f"{key}:{int(sorted_buckets[start])}", *members[start:end])
    replies = pipe.execute()
    if command == "SADD":
        return int(sum(replies))
    flags = np.zeros(len(fps), dtype=bool)
    flags[order] = np.fromiter((f for r in replies for f in r), dtype=np.int8, count=len(fps)).astype(bool)
    return flags


def timed(fn, n: int) -> tuple[float, float]:
    c, w = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.process_time() - c) * 1e6 / n, (time.perf_counter() - w) * 1e6 / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="interleaved runs per figure; medians are printed")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the batches per run (0.1 for a smoke run)")
    ap.add_argument("--redis", help="use this server instead of the embedded one (its keys under bench-resp:* are removed)")
    args = ap.parse_args()

    with nullcontext(args.redis) if args.redis else EmbeddedRedis() as url:
        store = Store(url, "bench-resp")
        store.delete_prefix()
        client = redis.Redis.from_url(url)
        rng = np.random.default_rng(5)
        stored = rng.integers(0, 2**64, size=200_000, dtype=np.uint64)
        for i in range(0, len(stored), 20_000):
            store.fp_add(FINISH_URL, stored[i : i + 20_000])

        def query(n: int) -> np.ndarray:
            q = np.concatenate([stored[: n // 2], rng.integers(0, 2**64, size=n - n // 2, dtype=np.uint64)])
            rng.shuffle(q)
            return q

        q400, q10k = query(400), query(10_000)
        cases = [
            ("400-URL look-up", lambda: store.fp_contains(FINISH_URL, q400),
             lambda: pipeline_op(client, store, "SMISMEMBER", q400), 400),
            ("10,000-URL look-up", lambda: store.fp_contains(FINISH_URL, q10k),
             lambda: pipeline_op(client, store, "SMISMEMBER", q10k), 20),
            ("10,000-URL SADD (present)", lambda: store.fp_add(FINISH_URL, q10k),
             lambda: pipeline_op(client, store, "SADD", q10k), 20),
        ]
        print(f"Redis {store.redis.info('server').get('redis_version')} at {url}; redis-py {redis.__version__} "
              f"(hiredis parser: {HIREDIS_AVAILABLE}); medians of {args.repeat} interleaved runs")
        print(f"{'batch':<27} {'way':<18} {'client CPU µs':>14} {'wall µs':>10}")
        for name, ours, theirs, n in cases:
            ours()  # warm up (the SADD adds its new half here)
            a, b = ours(), theirs()  # the same answers
            assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, (name, a, b)
            n = max(1, int(n * args.scale))
            runs: dict[str, list] = {"store (ours)": [], "redis-py pipeline": []}
            for _ in range(args.repeat):
                runs["store (ours)"].append(timed(ours, n))
                runs["redis-py pipeline"].append(timed(theirs, n))
            med = {way: [statistics.median(r[i] for r in rs) for i in range(2)] for way, rs in runs.items()}
            for way, (cpu, wall) in med.items():
                print(f"{name:<27} {way:<18} {cpu:>14,.0f} {wall:>10,.0f}")
            (oc, ow), (tc, tw) = med["store (ours)"], med["redis-py pipeline"]
            print(f"{'':<27} {'pipeline / ours':<18} {tc / oc:>13.1f}x {tw / ow:>9.1f}x")
        store.delete_prefix()
        store.close()
        client.close()


if __name__ == "__main__":
    main()

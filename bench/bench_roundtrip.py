"""Benchmark: CPU and wall time of one Redis round trip, by how trio code reaches Redis.

Three ways of executing the same :class:`~dedupnet.adapters.storage.store.Batch`:

* ``sync``       ``Store.execute`` called directly (the bench, the demo, tests);
* ``to_thread``  ``await AsyncStore.run(store.execute, batch)``: a worker thread per
                 call, what the daemons did before;
* ``trio``       ``await AsyncStore.execute(batch)``: trio sockets + hiredis, what the
                 daemons do now.

For a small batch (an INCRBY and a 10-fingerprint SMISMEMBER) and a 400-URL look-up
(SMISMEMBER over the bucketed ``finish_URL``, ~330 commands), it prints the client's
CPU (``time.process_time``, all threads of this process) and wall time per round
trip, and the server's CPU per round trip (INFO cpu deltas), medians of ``--repeat``
runs. Timings depend on the machine and its load; compare the ratios.

Run: ``.venv/bin/python bench/bench_roundtrip.py [--trips N] [--repeat R] [--redis URL]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import statistics
import time
from contextlib import nullcontext

import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.aio import AsyncStore  # noqa: E402
from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.adapters.storage.store import FINISH_URL, Batch, Store  # noqa: E402


def server_cpu(store: Store) -> float:
    info = store.redis.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def small_batch(store: Store, fps: np.ndarray) -> Batch:
    batch = store.batch()
    batch.add(b"INCRBY", store.key("number_seq"), 1)
    batch.fingerprints(b"SMISMEMBER", store.key(FINISH_URL), fps[:10])
    return batch


def lookup_batch(store: Store, fps: np.ndarray) -> Batch:
    batch = store.batch()
    batch.fingerprints(b"SMISMEMBER", store.key(FINISH_URL), fps)
    return batch


def measure(store: Store, make, trips: int, mode: str) -> tuple[float, float, float]:
    """(client CPU µs, wall µs, server CPU µs) per round trip. The batch is built anew
    each trip, as the daemons do, in every mode alike."""
    astore = AsyncStore(store)

    async def on_trio() -> None:
        for _ in range(trips):
            if mode == "trio":
                await astore.execute(make())
            else:
                await astore.run(store.execute, make())
        await astore.aclose()

    s0, c0, w0 = server_cpu(store), time.process_time(), time.perf_counter()
    if mode == "sync":
        for _ in range(trips):
            store.execute(make())
    else:
        trio.run(on_trio)
    c1, w1 = time.process_time(), time.perf_counter()
    s1 = server_cpu(store)
    return tuple(x * 1e6 / trips for x in (c1 - c0, w1 - w0, s1 - s0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trips", type=int, default=2000, help="round trips per run (the 400-URL batch: a quarter)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure; medians are printed")
    ap.add_argument("--redis", help="use this server instead of the embedded one (its keys under bench-rt:* are removed)")
    args = ap.parse_args()

    with nullcontext(args.redis) if args.redis else EmbeddedRedis() as url:
        store = Store(url, "bench-rt")
        store.delete_prefix()
        rng = np.random.default_rng(3)
        stored = rng.integers(0, 2**64, size=200_000, dtype=np.uint64)
        for i in range(0, len(stored), 20_000):
            store.fp_add(FINISH_URL, stored[i : i + 20_000])
        query = np.concatenate([stored[:200], rng.integers(0, 2**64, size=200, dtype=np.uint64)])
        cases = [
            ("small batch (2 commands)", lambda: small_batch(store, query), args.trips),
            (f"400-URL look-up ({len(lookup_batch(store, query))} commands)", lambda: lookup_batch(store, query),
             max(args.trips // 4, 1)),
        ]
        print(f"Redis {store.redis.info('server').get('redis_version')} at {url}; medians of {args.repeat} runs")
        print(f"{'batch':<36} {'path':<10} {'client CPU µs':>14} {'wall µs':>10} {'server CPU µs':>14}")
        for name, make, trips in cases:
            make()  # warm the caches (bucket heads)
            modes = ("sync", "to_thread", "trio")
            runs: dict[str, list] = {mode: [] for mode in modes}
            for _ in range(args.repeat):
                for mode in modes:  # interleaved, so load changes hit every path alike
                    runs[mode].append(measure(store, make, trips, mode))
            figures = {}
            for mode in modes:
                figures[mode] = [statistics.median(r[i] for r in runs[mode]) for i in range(3)]
                cpu, wall, srv = figures[mode]
                print(f"{name:<36} {mode:<10} {cpu:>14.1f} {wall:>10.1f} {srv:>14.1f}")
            base = figures["to_thread"]
            for mode in ("sync", "trio"):
                print(f"{'':<36} {mode + '/thread':<10} {figures[mode][0] / base[0]:>13.2f}x "
                      f"{figures[mode][1] / base[1]:>9.2f}x")
        store.delete_prefix()
        store.close()


if __name__ == "__main__":
    main()

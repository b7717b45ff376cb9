"""Benchmark: a center's admitted record grown to a billion URLs in one Redis.

Whether one center can keep an exact record of 1,000,000,000 admitted URLs in about
10 GB, and whether its look-ups stay fast at that size, is only known by building one.
Fingerprints are random 64-bit integers (what xxh3 of distinct URLs looks like), written
with the center's own path (``Batch.fingerprints`` SADD on ``admitted``, in chunks) and
looked up with its SMISMEMBER path, in batches half present, half absent, every answer
checked. At each checkpoint it prints Redis ``used_memory`` per stored URL, the insert
rate since the last checkpoint and the look-up rate, with the client's and the server's
CPU per look-up, which a loaded machine moves far less than it moves wall-clock rates.

At every checkpoint the look-up rate is also measured on a second small record (another
prefix, the first checkpoint's size, same ``bucket_bits``, same server), alternately
with the big record's: the rate against the first checkpoint compares rates measured up
to an hour apart, under whatever else the machine ran meanwhile; the side-by-side one
does not.

Run (docs/BENCHMARKS.md, "A billion URLs at one center")::

    nice -n 19 .venv/bin/python bench/bench_billion.py --urls 1e9 --bucket-bits 20 --lookup-batches 100 --rounds 5

The server is an embedded one of its own (no persistence, no ``maxmemory``: nothing is
evicted or written to disk), or ``--redis URL`` (its keys under the prefixes are removed).
The run stops, and still prints its summary, if the machine's available memory falls
below ``--min-available-gb``.
"""

from __future__ import annotations

from pathlib import Path
import argparse
import json
import sys
import time
from contextlib import nullcontext

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.adapters.storage.store import ADMITTED, Store  # noqa: E402

DEFAULT_CHECKPOINTS = "1e6,1e7,1e8,2.5e8,5e8,7.5e8,1e9"
#: Present fingerprints kept from each inserted chunk to draw look-ups from: the whole
#: record cannot be kept in the client, and look-ups must reach all of it, old and new.
SAMPLE_PER_CHUNK = 4_000


def available_bytes() -> int:
    """The machine's ``MemAvailable`` (Linux); a huge number where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def server_cpu(store: Store) -> float:
    info = store.redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def chunk_fps(seed: int, index: int, size: int) -> np.ndarray:
    """Chunk ``index``'s fingerprints: a stream of its own, so any chunk can be made again."""
    return np.random.default_rng([seed, index]).integers(0, 1 << 64, size=size, dtype=np.uint64, endpoint=False)


class Record:
    """One admitted record under its own prefix, with a sample of what it holds."""

    def __init__(self, url: str, prefix: str, bucket_bits: int, seed: int):
        self.store = Store(url, prefix, bucket_bits=bucket_bits, socket_timeout=600.0)
        self.store.delete_prefix()
        self.seed = seed
        self.stored = 0  # fingerprints sent
        self.added = 0  # of them new to the set (random 64-bit ones collide ~never)
        self.chunks = 0
        self.sample: list[np.ndarray] = []
        self.misses = np.random.default_rng([seed, 1 << 40])
        if self.store.bucket_bits != bucket_bits:
            raise SystemExit(f"{prefix}: the store records {self.store.bucket_bits} bucket bits, not {bucket_bits}")

    def insert(self, n: int) -> None:
        fps = chunk_fps(self.seed, self.chunks, n)
        self.chunks += 1
        self.added += self.store.fp_add(ADMITTED, fps)
        self.stored += n
        keep = min(n, SAMPLE_PER_CHUNK)
        self.sample.append(fps[np.random.default_rng([self.seed, self.chunks, 7]).choice(n, keep, replace=False)])

    def lookup(self, batches: int, batch: int) -> dict:
        """``batches`` look-ups of ``batch`` fingerprints, half drawn from everything
        inserted so far, half random (absent): their wall time and CPU, and whether every
        answer was right."""
        pool = np.concatenate(self.sample)
        rng = np.random.default_rng([self.seed, self.chunks, batches, int(time.time_ns())])
        half = batch // 2
        wrong = 0
        wall = client = 0.0
        s0 = server_cpu(self.store)
        for _ in range(batches):
            present = pool[rng.integers(0, len(pool), half)]
            absent = self.misses.integers(0, 1 << 64, size=batch - half, dtype=np.uint64)
            query = np.concatenate([present, absent])
            expect = np.r_[np.ones(half, bool), np.zeros(batch - half, bool)]
            order = rng.permutation(batch)
            query, expect = query[order], expect[order]
            t, c = time.perf_counter(), time.process_time()
            found = self.store.fp_contains(ADMITTED, query)
            wall += time.perf_counter() - t
            client += time.process_time() - c
            wrong += int((found != expect).sum())
        server = server_cpu(self.store) - s0
        n = batches * batch
        return {
            "lookups": n,
            "wrong": wrong,
            "rate": n / wall,
            "client_us_per_1000": client / n * 1e9,
            "server_us_per_1000": server / n * 1e9,
        }


def bucket_insert_cost(url: str, sizes: list[int], inserts: int = 20_000) -> list[dict]:
    """Server CPU per fingerprint added to one bucket already holding ``size``: an intset
    is one sorted array, so an insert moves half of it, and how many fingerprints a
    bucket holds at a billion is what ``bucket_bits`` decides. The bucket is filled in
    ascending order (appends, so a million-member one takes seconds, not hours), then
    ``inserts`` random new members go in one SADD each, pipelined."""
    import redis

    r = redis.Redis.from_url(url)
    out = []
    for size in sizes:
        key = f"bench:bucket:{size}"
        r.delete(key)
        rng = np.random.default_rng(size)
        members = np.unique(rng.integers(0, 1 << 44, size=size + inserts + 1000, dtype=np.int64))
        rng.shuffle(members)
        members, extra = np.sort(members[:size]), members[size:size + inserts]
        for i in range(0, size, 100_000):
            r.sadd(key, *(members[i:i + 100_000] + 10**16).tolist())
        encoding = r.object("encoding", key).decode()
        per_member = r.memory_usage(key, samples=0) / size
        pipe = r.pipeline(transaction=False)
        for m in (extra + 10**16).tolist():
            pipe.sadd(key, m)
        info = r.info("cpu")
        c0 = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        pipe.execute()
        info = r.info("cpu")
        cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"]) - c0
        out.append({"size": size, "encoding": encoding, "encoding_after": r.object("encoding", key).decode(),
                    "bytes_per_member": per_member,
                    "inserts": len(extra), "server_us_per_insert": cpu / len(extra) * 1e6})
        r.delete(key)
    r.close()
    return out


def memory(store: Store) -> tuple[int, int]:
    info = store.redis.info("memory")
    return int(info["used_memory"]), int(info["used_memory_rss"])


def parse_count(text: str) -> int:
    return int(float(text.replace("_", "")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--urls", type=parse_count, default=1_000_000_000, help="fingerprints to store (default 1e9)")
    ap.add_argument("--bucket-bits", type=int, default=20, help="2**bits bucket sets (default 20)")
    ap.add_argument("--checkpoints", default=DEFAULT_CHECKPOINTS,
                    help=f"record sizes to measure at, comma-separated (default {DEFAULT_CHECKPOINTS}; "
                         "--urls is always one)")
    ap.add_argument("--chunk", type=parse_count, default=10_000_000, help="fingerprints per SADD round trip")
    ap.add_argument("--batch", type=int, default=1_000, help="fingerprints per look-up (default 1,000)")
    ap.add_argument("--lookup-batches", type=int, default=100, help="look-ups per rate measurement")
    ap.add_argument("--rounds", type=int, default=5,
                    help="side-by-side rounds (small, big) at each checkpoint (0: none)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--min-available-gb", type=float, default=3.0,
                    help="stop inserting when the machine's available memory falls below this")
    ap.add_argument("--redis", help="use this server instead of an embedded one")
    ap.add_argument("--bucket-insert-cost", metavar="SIZES",
                    help="only measure the server CPU of one insert into a bucket of each of these sizes "
                         "(e.g. 954,3815,15259,1048000: a billion over 2**20, 2**18, 2**16, 2**8 buckets)")
    ap.add_argument("--json", help="also write the summary to this file")
    args = ap.parse_args(argv)

    marks = sorted({c for c in map(parse_count, args.checkpoints.split(",")) if 0 < c < args.urls} | {args.urls})
    floor = int(args.min_available_gb * 2**30)
    t0 = time.monotonic()

    def say(line: str) -> None:
        print(f"[{time.monotonic() - t0:8.1f} s] {line}", flush=True)

    config = {"maxmemory": "0", "maxmemory-policy": "noeviction"}
    if args.bucket_insert_cost:
        with nullcontext(args.redis) if args.redis else EmbeddedRedis(config=config) as url:
            for row in bucket_insert_cost(url, [parse_count(x) for x in args.bucket_insert_cost.split(",")]):
                say(f"bucket of {row['size']:>10,} ({row['encoding']}, then {row['encoding_after']}): "
                    f"{row['server_us_per_insert']:8.2f} us of server CPU per insert ({row['inserts']:,} inserts), "
                    f"{row['bytes_per_member']:.1f} B per member")
        return 0
    with nullcontext(args.redis) if args.redis else EmbeddedRedis(config=config) as url:
        small = Record(url, "bench:small", args.bucket_bits, args.seed + 1)
        big = Record(url, "bench:billion", args.bucket_bits, args.seed)
        store = big.store
        server = store.redis.info("server")
        maxmemory = int(store.redis.config_get("maxmemory")["maxmemory"])
        intset = int(store.redis.config_get("set-max-intset-entries")["set-max-intset-entries"])
        say(f"{server.get('server_name', 'redis')} {server.get('valkey_version') or server.get('redis_version')} "
            f"at {url}, maxmemory {maxmemory}, set-max-intset-entries {intset:,}; "
            f"{args.urls:,} fingerprints, {1 << args.bucket_bits:,} buckets, chunks of {args.chunk:,}, "
            f"look-ups of {args.batch:,} (half present); checkpoints {', '.join(f'{m:,}' for m in marks)}")
        if args.rounds:
            while small.stored < marks[0]:
                small.insert(min(args.chunk, marks[0] - small.stored))
            say(f"the small record for side-by-side look-ups: {small.stored:,} in bench:small")
        base, base_rss = memory(store)
        checkpoints: list[dict] = []
        aborted = None
        last_n, last_t, last_progress = 0, time.monotonic(), time.monotonic()
        insert_s = 0.0
        for mark in marks:
            while big.stored < mark:
                avail = available_bytes()
                if avail < floor:
                    aborted = f"available memory {avail / 2**30:.1f} GB < {args.min_available_gb} GB"
                    break
                t = time.monotonic()
                big.insert(min(args.chunk, mark - big.stored))
                insert_s += time.monotonic() - t
                if time.monotonic() - last_progress >= 60:
                    last_progress = time.monotonic()
                    used, rss = memory(store)
                    say(f"{big.stored:>13,} stored, {(used - base) / big.added:5.2f} B/URL used "
                        f"({(rss - base_rss) / big.added:5.2f} rss), {big.stored / insert_s:,.0f} URLs/s inserting, "
                        f"{avail / 2**30:.1f} GB available")
            if aborted:
                say(f"stopped: {aborted}")
                break
            used, rss = memory(store)
            now = time.monotonic()
            rate = (big.stored - last_n) / (now - last_t)
            look = big.lookup(args.lookup_batches, args.batch)
            cp = {
                "urls": big.stored,
                "added": big.added,
                "elapsed_s": round(now - t0, 1),
                "used_memory": used,
                "bytes_per_url": (used - base) / big.added,
                "rss_bytes_per_url": (rss - base_rss) / big.added,
                "keys": int(store.redis.dbsize()),
                "insert_rate": rate,
                "lookup": look,
                "early_ratio": look["rate"] / checkpoints[0]["lookup"]["rate"] if checkpoints else 1.0,
                "side_by_side": [],
            }
            checkpoints.append(cp)
            say(f"CHECKPOINT {big.stored:,}: {cp['bytes_per_url']:.2f} B/URL used_memory "
                f"({used / 1e9:.2f} GB; rss {cp['rss_bytes_per_url']:.2f} B/URL), {cp['keys']:,} keys, "
                f"insert {rate:,.0f} URLs/s, look-up {look['rate']:,.0f} URLs/s "
                f"({cp['early_ratio']:.2f} of the first checkpoint's; CPU per 1,000: client "
                f"{look['client_us_per_1000']:,.0f} us, server {look['server_us_per_1000']:,.0f} us), "
                f"{look['wrong']} wrong of {look['lookups']:,}")
            for i in range(args.rounds):
                a = small.lookup(args.lookup_batches, args.batch)
                b = big.lookup(args.lookup_batches, args.batch)
                cp["side_by_side"].append({"small": a, "big": b})
                say(f"  side by side {i + 1}: {small.stored:,}: {a['rate']:,.0f} URLs/s, {big.stored:,}: "
                    f"{b['rate']:,.0f} URLs/s (ratio {b['rate'] / a['rate']:.2f}; server CPU per 1,000 "
                    f"{a['server_us_per_1000']:,.0f} vs {b['server_us_per_1000']:,.0f} us), "
                    f"{a['wrong'] + b['wrong']} wrong")
            if cp["side_by_side"]:
                cp["side_ratio"] = (float(np.median([r["big"]["rate"] for r in cp["side_by_side"]]))
                                    / float(np.median([r["small"]["rate"] for r in cp["side_by_side"]])))
            last_t, last_n = time.monotonic(), big.stored

        wrong = sum(c["lookup"]["wrong"] + sum(r["small"]["wrong"] + r["big"]["wrong"] for r in c["side_by_side"])
                    for c in checkpoints)
        summary = {
            "urls": args.urls,
            "reached": big.stored,
            "bucket_bits": args.bucket_bits,
            "chunk": args.chunk,
            "batch": args.batch,
            "aborted": aborted,
            "wrong_answers": wrong,
            "elapsed_s": round(time.monotonic() - t0, 1),
            "checkpoints": checkpoints,
        }
        if checkpoints:
            summary["early_ratio"] = checkpoints[-1]["early_ratio"]
            summary["side_ratio"] = checkpoints[-1].get("side_ratio")
        say("SUMMARY " + json.dumps(summary))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=1)
        if args.redis:  # an embedded server is simply stopped: freeing 8 GB key by key takes minutes
            store.delete_prefix()
            small.store.delete_prefix()
    return 1 if wrong or aborted else 0


if __name__ == "__main__":
    sys.exit(main())

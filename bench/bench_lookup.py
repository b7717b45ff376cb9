"""Benchmark: fewer commands per fingerprint look-up? Per-bucket SMISMEMBER vs Lua.

A look-up of n URLs in a bucketed fingerprint set (``finish_URL``, 1,024 buckets) is
today one SMISMEMBER per bucket touched, all in one round trip (~330 commands for
400 URLs, ~630 for 1,000). Alternatives, each one round trip, same answers:

* ``per-bucket``      today's pipeline of SMISMEMBER commands;
* ``lua-array``       one EVALSHA: KEYS = the buckets, ARGV = per-bucket counts then
                      the members; the script loops SMISMEMBER server-side and returns
                      one flat array of 0/1;
* ``lua-string``      the same script returning the flags as one string of "0"/"1"
                      (one bulk reply to parse instead of n integers);
* ``per-bucket/256``  today's pipeline over 256 buckets (``bucket_bits=8``): fewer,
                      longer commands.

Prints, per look-up, client CPU (``time.process_time``), server CPU (INFO cpu deltas,
user+sys) and their sum, wall time, and the commands sent; medians of ``--repeat``
runs. The server shares the machine's cores, so client + server CPU is what counts.

Run: ``.venv/bin/python bench/bench_lookup.py [--stored N] [--lookups L] [--repeat R]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import hashlib
import statistics
import time
from contextlib import nullcontext

import numpy as np
from redis.exceptions import ResponseError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.adapters.storage.store import FINISH_URL, Store  # noqa: E402
from dedupnet.adapters.storage.resp import MEMBER_DIGITS, MEMBER_OFFSET, MEMBER_RECORD, bulk  # noqa: E402

LUA_ARRAY = b"""
local out, a = {}, #KEYS
for i = 1, #KEYS do
  local n = tonumber(ARGV[i])
  local r = redis.call('SMISMEMBER', KEYS[i], unpack(ARGV, a + 1, a + n))
  for j = 1, n do out[#out + 1] = r[j] end
  a = a + n
end
return out
"""

#: The same loop, one string reply instead of an array (fewer reply objects to parse).
LUA_STRING = LUA_ARRAY.replace(b"return out", b"return table.concat(out)")


def server_cpu(store: Store) -> float:
    info = store.redis.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def grouped(store: Store, fps: np.ndarray):
    """Sorted by bucket: (order, unique buckets, counts, members' RESP records)."""
    shift = np.uint64(64 - store.bucket_bits)
    mask = np.uint64((1 << (64 - store.bucket_bits)) - 1)
    buckets = (fps >> shift).astype(np.int64)
    order = np.argsort(buckets, kind="stable")
    buckets = buckets[order]
    members = (fps[order] & mask) + np.uint64(MEMBER_OFFSET)
    records = np.empty((len(fps), MEMBER_RECORD), dtype=np.uint8)
    records[:, :5] = np.frombuffer(b"$%d\r\n" % MEMBER_DIGITS, dtype=np.uint8)
    records[:, 5:-2] = members.astype(f"S{MEMBER_DIGITS}").view(np.uint8).reshape(-1, MEMBER_DIGITS)
    records[:, -2:] = np.frombuffer(b"\r\n", dtype=np.uint8)
    unique, counts = np.unique(buckets, return_counts=True)
    return order, unique, counts, records.tobytes()


def lua_lookup(store: Store, sha: bytes, fps: np.ndarray, as_string: bool) -> tuple[np.ndarray, int]:
    order, unique, counts, body = grouped(store, fps)
    prefix = store.key(FINISH_URL).encode() + b":"
    parts = [b"*%d\r\n" % (3 + 2 * len(unique) + len(fps)), bulk(b"EVALSHA"), bulk(sha), bulk(b"%d" % len(unique))]
    parts.extend(bulk(prefix + b"%d" % b) for b in unique.tolist())
    parts.extend(bulk(b"%d" % c) for c in counts.tolist())
    parts.append(body)
    (reply,) = raw_round_trip(store, b"".join(parts), 1)
    if isinstance(reply, ResponseError):
        raise reply
    if as_string:
        flat = np.frombuffer(reply, dtype=np.uint8) == ord("1")
    else:
        flat = np.fromiter(reply, dtype=np.int8, count=len(fps)).astype(bool)
    out = np.zeros(len(fps), dtype=bool)
    out[order] = flat
    return out, 1


def bucket_lookup(store: Store, fps: np.ndarray) -> tuple[np.ndarray, int]:
    batch = store.batch()
    handle = batch.fingerprints(b"SMISMEMBER", store.key(FINISH_URL), fps)
    return handle.flags(store.execute(batch)), len(batch)


def raw_round_trip(store: Store, payload: bytes, replies: int) -> list:
    return store._round_trip(payload, replies)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stored", type=int, default=1_000_000, help="fingerprints in the set (default 1M)")
    ap.add_argument("--lookups", type=int, default=300, help="look-ups per run")
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure; medians are printed")
    ap.add_argument("--redis", help="use this server instead of the embedded one (keys under bench-lk*:* are removed)")
    args = ap.parse_args()
    rng = np.random.default_rng(5)
    stored = rng.integers(0, 2**64, size=args.stored, dtype=np.uint64)

    with nullcontext(args.redis) if args.redis else EmbeddedRedis() as url:
        s10, s8 = Store(url, "bench-lk10", bucket_bits=10), Store(url, "bench-lk8", bucket_bits=8)
        for s in (s10, s8):
            s.delete_prefix()
            for i in range(0, len(stored), 50_000):
                s.fp_add(FINISH_URL, stored[i : i + 50_000])
        sha_array = s10.redis.script_load(LUA_ARRAY).encode()
        sha_string = s10.redis.script_load(LUA_STRING).encode()
        assert sha_array.decode() == hashlib.sha1(LUA_ARRAY).hexdigest()
        ways = {
            "per-bucket": lambda q: bucket_lookup(s10, q),
            "lua-array": lambda q: lua_lookup(s10, sha_array, q, False),
            "lua-string": lambda q: lua_lookup(s10, sha_string, q, True),
            "per-bucket/256": lambda q: bucket_lookup(s8, q),
        }
        print(f"Redis {s10.redis.info('server').get('redis_version')} at {url}; {args.stored:,} stored, "
              f"{args.lookups} look-ups a run, medians of {args.repeat} runs (µs per look-up)")
        print(f"{'URLs':>5} {'way':<15} {'commands':>8} {'client CPU':>11} {'server CPU':>11} {'sum':>8} {'wall':>8}")
        for n in (400, 1000):
            queries = [np.concatenate([rng.choice(stored, n // 2), rng.integers(0, 2**64, n - n // 2, dtype=np.uint64)])
                       for _ in range(args.lookups)]
            expected = [np.r_[np.ones(n // 2, bool), np.zeros(n - n // 2, bool)] for _ in queries]
            for name, way in ways.items():  # same answers, and warm caches
                got, _ = way(queries[0])
                assert np.array_equal(got, expected[0]), name
            runs: dict[str, list] = {name: [] for name in ways}
            commands = {}
            for _ in range(args.repeat):
                for name, way in ways.items():  # interleaved, so load changes hit every way alike
                    s0, c0, w0 = server_cpu(s10), time.process_time(), time.perf_counter()
                    for q in queries:
                        _, commands[name] = way(q)
                    c1, w1 = time.process_time(), time.perf_counter()
                    s1 = server_cpu(s10)
                    runs[name].append([(x * 1e6 / len(queries)) for x in (c1 - c0, s1 - s0, w1 - w0)])
            for name in ways:
                cpu, srv, wall = (statistics.median(r[i] for r in runs[name]) for i in range(3))
                print(f"{n:>5} {name:<15} {commands[name]:>8} {cpu:>11.1f} {srv:>11.1f} {cpu + srv:>8.1f} {wall:>8.1f}")
        for s in (s10, s8):
            s.delete_prefix()
            s.close()


if __name__ == "__main__":
    main()

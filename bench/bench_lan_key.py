"""Benchmark: what HMAC tags on the LANs cost (dedupnet/codec/auth.py).

Two parts, each against a baseline measured in the same process:

1. **Per message**: signing (``Keyring.sign``) and verifying (``Keyring.verify``) a
   heartbeat and flag=1 frames of 20 and 400 URLs (plain and zstd bodies), next to
   ``wire.encode`` and a full decode of the same message.
2. **Whole system**: ``dedupnet sim`` with and without ``--lan-key`` on the same
   workload, alternating (plain, keyed, keyed, plain, ...) so that a drift of the
   machine hits both alike: wall time, the process's CPU time, bytes on
   the wire per distinct URL, lost URLs, duplicate fetches.

Run: ``.venv/bin/python bench/bench_lan_key.py [--runs 2] [--networks 3 --hosts 3]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import statistics
import time

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.codec import wire  # noqa: E402
from dedupnet.codec.auth import Keyring  # noqa: E402
from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.codec.messages import Frame, Heartbeat  # noqa: E402
from dedupnet.harness.report import SimConfig  # noqa: E402
from dedupnet.harness.sim import simulate  # noqa: E402


def per_op(fn, n: int, repeats: int = 5) -> float:
    """Microseconds per call: the best of ``repeats`` rounds (a shared machine's noise
    only ever adds time)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n // repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / (n // repeats) * 1e6)
    return best


def micro() -> None:
    ring = Keyring.single(bytes(range(32)))
    msgs = {
        "heartbeat": Heartbeat("127.0.1.10", 1700000000.5),
        "frame 20 URLs": Frame({f"http://site{i % 7}.test/a/{i}.html": 0 for i in range(20)}, "127.0.1.10", 1, 1),
        "frame 400 URLs": Frame({f"http://site{i % 7}.test/a/{i}.html": 0 for i in range(400)}, "127.0.1.10", 1, 1),
    }
    print("per message (us)          bytes  +tag   encode  decode   sign  verify  sign+verify / encode+decode")
    for name, msg in msgs.items():
        for compress in (False, True):
            data = wire.encode(msg, compress=compress)
            if compress and not wire.is_compressed(data):
                continue
            signed = ring.sign(data)
            n = 20000 if len(data) < 2000 else 4000
            enc = per_op(lambda: wire.encode(msg, compress=compress), n)
            dec = per_op(lambda: wire.decode_one(data), n)
            sign = per_op(lambda: ring.sign(data), n)
            end = len(signed) - 18
            hb, tag = signed[:end], signed[end:]
            ver = per_op(lambda: ring.verify(hb, tag), n)
            label = f"{name}{' zstd' if compress else ''}"
            print(f"  {label:<22} {len(data):>6} {len(signed) - len(data):>5} {enc:>8.1f} {dec:>7.1f} {sign:>6.1f} "
                  f"{ver:>7.1f}  {(sign + ver) / (enc + dec):>6.0%}")


def system(args) -> None:
    rows: dict[bool, list] = {False: [], True: []}
    with EmbeddedRedis() as url:
        for run in range(args.runs):
            for keyed in (False, True) if run % 2 == 0 else (True, False):  # ABBA: a drift hits both alike
                cfg = SimConfig(networks=args.networks, hosts=args.hosts, pages=args.pages, seed=args.seed,
                                lan_key=keyed, timeout=args.timeout)
                cpu = time.process_time()
                r = trio.run(lambda: simulate(cfg, url, out=None))
                r.process_cpu = time.process_time() - cpu  # the whole process: web, crawlers, daemons
                rows[keyed].append(r)
                print(f"  run {run + 1} {'HMAC' if keyed else 'plain':<5} wall {r.wall_time:6.1f} s  "
                      f"process CPU {r.process_cpu:5.1f} s  bytes/URL {r.bytes_per_url:7.1f}  frames {sum(r.frames.values()):,}  center CPU "
                      f"{r.center_cpu_s:.2f} s  lost {r.lost_urls}  duplicates {r.duplicate_fetches}  "
                      f"{'TIMED OUT' if r.timed_out else ''}  refused/throttled: {r.bad_input or 'none'}", flush=True)
    print(f"\n{args.networks}x{args.hosts}, {args.pages:,} pages, seed {args.seed}, {args.runs} runs each (alternating)")
    print("                 wall time (s)         bytes per distinct URL   lost  duplicates")
    for keyed in (False, True):
        rs = rows[keyed]
        walls = [r.wall_time for r in rs]
        bpu = [r.bytes_per_url for r in rs]
        print(f"  {'HMAC' if keyed else 'plain':<6} {statistics.mean(walls):8.1f} ({', '.join(f'{w:.1f}' for w in walls)})"
              f"   {statistics.mean(bpu):8.1f} ({', '.join(f'{b:.1f}' for b in bpu)})"
              f"   {sum(r.lost_urls for r in rs):4}  {sum(r.duplicate_fetches for r in rs):6}")
    plain, keyed = (statistics.mean(r.bytes_per_url for r in rows[k]) for k in (False, True))
    print(f"  HMAC adds {keyed - plain:.1f} bytes per URL ({keyed / plain - 1:+.1%}); wall time "
          f"{statistics.mean(r.wall_time for r in rows[True]) / statistics.mean(r.wall_time for r in rows[False]) - 1:+.1%}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--networks", type=int, default=3)
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--pages", type=int, default=3000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=SimConfig.timeout, help="per run (default %(default)s s)")
    p.add_argument("--no-sim", action="store_true", help="the per-message figures only")
    args = p.parse_args()
    micro()
    if not args.no_sim:
        print()
        system(args)


if __name__ == "__main__":
    main()

"""Benchmark: what a host's queue of tasks costs, in Redis bytes and CPU per queued URL,
at millions of URLs of a broad crawl's shape.

``--urls`` distinct URLs of dedupnet/harness/url_shapes.py's shape over ``--sites``
sites go into ``task_pool`` by the host's own write path (``AddTasks``, one task message
a page's links), on an embedded Redis of their own, with the compactor run as the host
daemon runs it (every ``--compact-every`` URLs: until nothing is left to seal). At each
checkpoint: the growth of ``used_memory`` per queued URL (the lists, their fingerprints
``task_pool:fp`` and the sites' schedule together) and the CPU per URL of writing and
of compacting. Then ``--take`` URLs are taken (politeness off) and the taker's CPU per
URL measured; at the end every URL taken is checked to be one that was queued, and
each taken once.

With ``--baseline CHECKOUT`` (e.g. a git worktree of main) the same URLs are run through
that checkout's code too, in its own process and Redis, and the ratios printed (the
URLs are written to a file first, so both sides read the very same ones).

Run: ``.venv/bin/python bench/bench_queue_bytes.py --urls 1000000 10000000 --sites 100000
--baseline ../main-worktree``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def write_urls(path: Path, n: int, sites: int, seed: int) -> None:
    from dedupnet.harness.url_shapes import distinct_urls

    with path.open("w") as f:
        for links in distinct_urls(n, sites, seed):
            f.write(" ".join(links) + "\n")


def side(path: Path, checkpoints: list[int], compact_every: int, take: int) -> dict:
    """One run on this process's code (PYTHONPATH chooses the checkout)."""
    from dedupnet.adapters.storage.embedded import EmbeddedRedis
    from dedupnet.adapters.storage.store import Store
    from local_host import protocol as hp
    from local_host.frontier import sites
    from local_host.pools import HostPools

    compact = getattr(sites, "compact_steps", None)  # None: a checkout without sealed blocks
    out: dict = {"checkpoints": []}
    with EmbeddedRedis() as url:
        store = Store(url, "q")
        pools = HostPools(store, exact=True)
        pools.setup()
        before = store.redis.info("memory")["used_memory"]
        n, write_cpu, compact_cpu, since = 0, 0.0, 0.0, 0
        with path.open() as f:
            for line in f:
                links = tuple(line.split())
                t = time.process_time()
                pools.apply([hp.AddTasks(links)])
                write_cpu += time.process_time() - t
                n += len(links)
                since += len(links)
                if compact and (since >= compact_every or n >= checkpoints[-1]):
                    t = time.process_time()
                    while store.drive(compact(store)):
                        pass
                    compact_cpu += time.process_time() - t
                    since = 0
                if checkpoints and n >= checkpoints[0]:
                    used = store.redis.info("memory")["used_memory"] - before
                    out["checkpoints"].append({"urls": n, "bytes_per_url": used / n, "write_us": 1e6 * write_cpu / n,
                                               "compact_us": 1e6 * compact_cpu / n})
                    print(json.dumps(out["checkpoints"][-1]), file=sys.stderr, flush=True)
                    checkpoints = checkpoints[1:]
                    if not checkpoints:
                        break
        taken: list[str] = []
        t = time.process_time()
        while len(taken) < take:
            got = sites.take(store, "bench", min(500, take - len(taken)), sites.Pace(burst=64))
            if not got.entries:
                break
            taken += [u for _, u in got.entries]
        out["take_us"] = 1e6 * (time.process_time() - t) / max(1, len(taken))
        queued = set()
        with path.open() as f:
            for line in f:
                queued.update(line.split())
                if len(queued) >= n:
                    break
        out["taken"] = len(taken)
        out["taken_twice"] = len(taken) - len(set(taken))
        out["taken_not_queued"] = len(set(taken) - queued)
        out["left"] = sites.task_count(store) - len(taken)
        store.close()
    return out


def run(checkout: Path, path: Path, args) -> dict:
    argv = [sys.executable, str(HERE / "bench" / "bench_queue_bytes.py"), "--side", str(path),
            "--urls", *map(str, args.urls), "--compact-every", str(args.compact_every), "--take", str(args.take)]
    proc = subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(checkout)}, cwd=checkout,
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        raise SystemExit(f"the run of {checkout} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--urls", type=int, nargs="+", default=[1_000_000], help="checkpoints: URLs queued")
    ap.add_argument("--sites", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--compact-every", type=int, default=20_000, help="URLs queued between compactions")
    ap.add_argument("--take", type=int, default=200_000, help="URLs taken at the end")
    ap.add_argument("--baseline", metavar="CHECKOUT", help="also run another checkout's code on the same URLs")
    ap.add_argument("--side", metavar="FILE", help=argparse.SUPPRESS)  # one run on FILE's URLs, JSON out
    args = ap.parse_args()
    if args.side:
        print(json.dumps(side(Path(args.side), sorted(args.urls), args.compact_every, args.take)))
        return
    path = Path(f"/tmp/bench_queue_urls_{max(args.urls)}_{args.sites}_{args.seed}.txt")
    if not path.exists():
        t = time.monotonic()
        write_urls(path, max(args.urls), args.sites, args.seed)
        print(f"{max(args.urls):,} URLs over {args.sites:,} sites written to {path} in {time.monotonic() - t:.0f} s")
    sides = {"this": HERE}
    if args.baseline:
        sides = {"base": Path(args.baseline).resolve(), **sides}
    rows = {name: run(checkout, path, args) for name, checkout in sides.items()}
    print(f"{'URLs queued':>12} {'side':>6} {'B/URL':>7} {'write us/URL':>13} {'compact us/URL':>15}")
    for i, n in enumerate(sorted(args.urls)):
        for name, row in rows.items():
            c = row["checkpoints"][i]
            print(f"{c['urls']:>12,} {name:>6} {c['bytes_per_url']:>7.1f} {c['write_us']:>13.1f} {c['compact_us']:>15.1f}")
        if "base" in rows:
            b, t = rows["base"]["checkpoints"][i], rows["this"]["checkpoints"][i]
            print(f"{'':>12} {'ratio':>6} {t['bytes_per_url'] / b['bytes_per_url']:>7.2f} "
                  f"{(t['write_us'] + t['compact_us']) / b['write_us']:>13.2f} (write + compact / base write)")
    for name, row in rows.items():
        print(f"{name}: took {row['taken']:,} at {row['take_us']:.1f} us CPU/URL; taken twice {row['taken_twice']}, "
              f"taken but never queued {row['taken_not_queued']}, left queued {row['left']:,}")
    print(json.dumps({name: row for name, row in rows.items()}))


if __name__ == "__main__":
    main()

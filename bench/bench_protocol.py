"""Benchmark: URLs pushed straight into hosts' URL_pools of a 2 x 3 system (real
daemons as trio tasks in one process, real TCP on loopback, one embedded Redis),
timed until the system is quiescent. Prints sets/s and URLs/s through the whole
protocol (§2.2-§2.4 and task assignment), frames/bytes on the wire, and the centers'
Redis bytes per admitted URL by key family (MEMORY USAGE of every key, after the run, as ``dedupnet sim`` reports them).

Run: ``.venv/bin/python bench/bench_protocol.py [--urls N] [--set-size S] [--mode exact|paper]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import logging
import random
import time

import redis
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.harness.cluster import open_cluster  # noqa: E402
from dedupnet.harness.report import redis_memory  # noqa: E402
from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402


async def run(url: str, args) -> None:
    rnd = random.Random(1)
    urls = [f"http://site{i % 211}.example/d/{i}.html" for i in range(args.urls)]
    async with open_cluster(url, args.networks, args.hosts, mode=args.mode, set_size=args.set_size,
                            prefix="bench") as system:
        hosts = list(system.hosts.values())
        pushed = 0
        t0 = time.perf_counter()
        # Every URL found by one host; a share found again by a host of another network.
        for i, h in enumerate(hosts):
            mine = urls[i::len(hosts)]
            again = rnd.sample(urls, int(len(urls) * args.overlap / len(hosts)))
            pushed += len(mine) + len(again)
            await h.store.run(h.pools.push, mine + again)
        t_push = time.perf_counter() - t0
        await system.wait_quiescent(poll=0.02)
        elapsed = time.perf_counter() - t0
        sets = sum(h.counters.get("sets_sent") for h in hosts)
        admitted = sum(c.counters.get("urls_admitted") for c in system.centers.values())
        frames = sum(v for d in [*system.centers.values(), *hosts] for k, v in d.counters.snapshot().items()
                     if k.startswith("frames_sent"))
        wire = sum(d.counters.get("sent_bytes") for d in [*system.centers.values(), *hosts])
        print(f"{args.networks} networks x {args.hosts} hosts, {args.mode} mode, set size {args.set_size}")
        print(f"URLs pushed          {pushed:>10,}   ({t_push:.2f} s to push)")
        print(f"URLs admitted        {admitted:>10,}   (distinct: {len(urls):,})")
        print(f"sets sent by hosts   {sets:>10,}")
        print(f"wall time            {elapsed:>10.2f} s")
        print(f"sets/s               {sets / elapsed:>10,.0f}")
        print(f"URLs/s (pushed)      {pushed / elapsed:>10,.0f}")
        print(f"frames on the wire   {frames:>10,}   {wire / 1e6:.1f} MB, {wire / pushed:.0f} bytes/URL")
        families = redis_memory(redis.Redis.from_url(url), "bench")["center"]
        total = sum(families.values())
        print(f"center Redis         {total / 1e6:>10.2f} MB   {total / admitted:.1f} bytes per admitted URL: "
              + ", ".join(f"{f} {b / admitted:.1f}" for f, b in sorted(families.items(), key=lambda kv: -kv[1])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--urls", type=int, default=200_000, help="distinct URLs (default 200,000)")
    ap.add_argument("--overlap", type=float, default=0.3, help="share of URLs found again elsewhere")
    ap.add_argument("--set-size", type=int, default=1000)
    ap.add_argument("--networks", type=int, default=2)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--mode", choices=["exact", "paper"], default="exact")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with EmbeddedRedis() as url:
        trio.run(run, url, args)


if __name__ == "__main__":
    main()

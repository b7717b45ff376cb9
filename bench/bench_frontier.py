"""Benchmark: the same synthetic web crawled by the same two-network deployment, once by
dedupnet's own crawler on every host and once through the URLFrontier API by the
example client (examples/urlfrontier/crawl.py, one per host), side by side.

Both runs are dedupnet/harness/frontiercrawl.py: real ``dedupnet center`` / ``dedupnet
local`` processes on one embedded Redis, the web served in this process, politeness
off (robots.txt on). Each run checks itself against the web's own counts (duplicate
fetches, URLs missed) and prints:

* pages/s: page requests answered (not 503, robots.txt apart) over the seconds from the
  first page request to the last, as the web saw them;
* CPU ms per page of the daemons, and of the URLFrontier clients (their fetching,
  parsing and gRPC: in the own-crawler run that work is inside the daemons).

The web server shares this process and the machine with everything else, so figures
are for comparing the two paths on one machine at one time, not absolute.

Run: ``.venv/bin/python bench/bench_frontier.py [--networks 2] [--pages 5000]
[--sites 50] [--seeds 10] [--workers 16] [--concurrency 16]``.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import psutil
import trio

from dedupnet.adapters.embedded import EmbeddedRedis
from dedupnet.harness.frontiercrawl import crawl
from dedupnet.harness.report import SimConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--networks", type=int, default=2, help="networks, one host each (default %(default)s)")
    ap.add_argument("--pages", type=int, default=5000, help="pages of the synthetic web (default %(default)s)")
    ap.add_argument("--sites", type=int, default=50, help="sites of the synthetic web (default %(default)s)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the web (default %(default)s)")
    ap.add_argument("--seeds", type=int, default=10, help="seed URLs (default %(default)s)")
    ap.add_argument("--workers", type=int, default=16,
                    help="requests in flight per URLFrontier client (default %(default)s)")
    ap.add_argument("--concurrency", type=int, default=16,
                    help="requests in flight per dedupnet crawler (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take (default %(default)s)")
    args = ap.parse_args()
    logging.getLogger("dedupnet").setLevel(logging.ERROR)
    cfg = SimConfig(networks=args.networks, hosts=1, pages=args.pages, sites=args.sites, seed=args.seed,
                    seeds=args.seeds, concurrency=args.concurrency, set_size=400, set_linger=0.2)
    print(f"synthetic web {args.pages:,} pages / {args.sites} sites; {args.networks} networks, one host each; "
          f"politeness off, robots on; {psutil.cpu_count()} CPUs")
    print(f"{'path':>22} {'pages':>7} {'dups':>5} {'missed':>6} {'seconds':>8} {'pages/s':>8}"
          f" {'daemons CPU ms/page':>19} {'clients CPU ms/page':>19}")
    with EmbeddedRedis() as redis_url:
        for name, frontier in (("dedupnet crawler", False), ("URLFrontier client", True)):
            logdir = Path(tempfile.mkdtemp(prefix="bench-frontier-"))
            run = trio.run(lambda: crawl(cfg, redis_url, "benchfrontier", logdir, frontier=frontier,
                                         workers=args.workers, timeout=args.timeout))
            pages = max(run.pages, 1)
            clients = f"{run.client_cpu / pages * 1000:>19.2f}" if frontier else f"{'-':>19}"
            print(f"{name:>22} {run.pages:>7} {run.web.duplicate_fetches():>5} {len(run.lost):>6}"
                  f" {run.seconds:>8.2f} {run.pages / max(run.seconds, 1e-9):>8.0f}"
                  f" {run.daemon_cpu / pages * 1000:>19.2f}"
                  f" {clients}", flush=True)


if __name__ == "__main__":
    main()

"""Benchmark: the same synthetic web crawled by the same deployment (one host per
network) three ways, side by side: by dedupnet's own crawler on every host, through
the URLFrontier API by the example client (examples/urlfrontier/crawl.py, one per
host), and through the Scrapy path by the example project's spider (examples/scrapy,
one per host, on dedupnet's scheduler).

Every run is dedupnet/harness/frontiercrawl.py: real ``dedupnet center`` / ``dedupnet
local`` processes on one embedded Redis, the web served in this process, politeness
off (robots.txt on; the spider's per-site bound raised to its total), the same number
of requests in flight per host on every path. The paths alternate, ``--runs`` rounds.
Each run checks itself against the web's own counts (duplicate fetches, URLs missed)
and prints:

* pages/s: page requests answered (not 503, robots.txt apart) over the seconds from the
  first page request to the last, as the web saw them;
* CPU ms per page of the daemons, and of the crawler side (the URLFrontier clients'
  or the spiders' fetching, parsing, gRPC or Redis, from their launch, so start-up
  included; in the own-crawler run that work is inside the daemons), and the sum.

The web server shares this process and the machine with everything else, so figures
are for comparing the paths on one machine at one time, not absolute.

Run: ``.venv/bin/python bench/bench_frontier.py [--networks 2] [--pages 5000]
[--sites 50] [--seeds 10] [--workers 16] [--runs 1] [--paths crawler,frontier,scrapy]``
(the Scrapy side needs the ``scrapy`` extra).
"""

from __future__ import annotations

import sys
import argparse
import logging
import tempfile
from pathlib import Path

import psutil
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.harness.frontiercrawl import PATHS, crawl  # noqa: E402
from dedupnet.harness.report import SimConfig  # noqa: E402


NAMES = {"crawler": "dedupnet crawler", "frontier": "URLFrontier client", "scrapy": "Scrapy spider"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--networks", type=int, default=2, help="networks, one host each (default %(default)s)")
    ap.add_argument("--pages", type=int, default=5000, help="pages of the synthetic web (default %(default)s)")
    ap.add_argument("--sites", type=int, default=50, help="sites of the synthetic web (default %(default)s)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the web (default %(default)s)")
    ap.add_argument("--seeds", type=int, default=10, help="seed URLs (default %(default)s)")
    ap.add_argument("--workers", type=int, default=16,
                    help="requests in flight per host, whatever crawls it (default %(default)s)")
    ap.add_argument("--runs", type=int, default=1, help="rounds of the paths, alternating (default %(default)s)")
    ap.add_argument("--paths", default=",".join(PATHS), help="which paths, in this order (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take (default %(default)s)")
    args = ap.parse_args()
    paths = args.paths.split(",")
    if not paths or set(paths) - set(PATHS):
        ap.error(f"--paths: a comma-separated choice of {', '.join(PATHS)}")
    logging.getLogger("dedupnet").setLevel(logging.ERROR)
    cfg = SimConfig(networks=args.networks, hosts=1, pages=args.pages, sites=args.sites, seed=args.seed,
                    seeds=args.seeds, concurrency=args.workers, set_size=400)
    print(f"synthetic web {args.pages:,} pages / {args.sites} sites; {args.networks} networks, one host each; "
          f"{args.workers} requests in flight per host; politeness off, robots on; {psutil.cpu_count()} CPUs")
    print("| path | run | pages | duplicates | missed | seconds | pages/s | daemons CPU ms/page "
          "| crawler-side CPU ms/page | total CPU ms/page |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with EmbeddedRedis() as redis_url:
        for run_no in range(1, args.runs + 1):
            for path in paths:
                logdir = Path(tempfile.mkdtemp(prefix=f"bench-frontier-{path}-"))
                run = trio.run(lambda: crawl(cfg, redis_url, f"benchfrontier{run_no}{path}", logdir, path=path,
                                             workers=args.workers, timeout=args.timeout))
                pages = max(run.pages, 1)
                daemons = run.daemon_cpu / pages * 1000
                side = f"{run.client_cpu / pages * 1000:.2f}" if path != "crawler" else "-"
                total = (run.daemon_cpu + run.client_cpu) / pages * 1000
                print(f"| {NAMES[path]} | {run_no} | {run.pages} | {run.web.duplicate_fetches()} | {len(run.lost)}"
                      f" | {run.seconds:.2f} | {run.pages / max(run.seconds, 1e-9):.0f} | {daemons:.2f}"
                      f" | {side} | {total:.2f} |", flush=True)


if __name__ == "__main__":
    main()

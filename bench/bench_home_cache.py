"""Benchmark: the home map's memory of sites (dedupnet/codec/homes.py) at a crawl's
number of sites: microseconds per ``HomeMap.home_of`` over a stream of URLs (in the
order bench/bench_capacity.py numbers them, each site again every ``--sites`` URLs,
and in a random order), for this checkout and, with ``--baseline CHECKOUT``, that one
(each in a fresh interpreter, alternating, best of ``--rounds``); and the Python memory
per site remembered (tracemalloc, this checkout).

Run: ``.venv/bin/python bench/bench_home_cache.py [--baseline ../base] [--sites 100000]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_MULT = 2654435761  # bench/bench_capacity.py's url_of


def url_of(i: int, n_sites: int) -> str:
    return f"http://site{i * _MULT % n_sites}.example/s{i % 97}/page-{i}.html"


def child(sites: int, urls: int, order: str, networks: int) -> None:
    from dedupnet.codec.homes import HomeMap

    m = HomeMap({n: 1.0 for n in range(1, networks + 1)})
    ids = list(range(urls))
    if order == "random":
        random.Random(1).shuffle(ids)
    stream = [url_of(i, sites) for i in ids]
    gc.collect()
    t0 = time.perf_counter()
    for url in stream:
        m.home_of(url)
    us = (time.perf_counter() - t0) / urls * 1e6
    # The misses, counted on a second map (not timed): a cache's own count, or its
    # computations counted.
    m = HomeMap(m.weights)
    info = getattr(m.home_of_site, "cache_info", None)
    misses = 0
    if info is None:
        score = m._score

        def counted(site: str) -> int:
            nonlocal misses
            misses += 1
            return score(site)

        m._score = counted  # type: ignore[method-assign]
    for url in stream:
        m.home_of(url)
    print(json.dumps({"us": us, "misses": (info().misses if info is not None else misses) / urls}))


def bytes_per_site(sites: int) -> float:
    sys.path.insert(0, str(ROOT))  # this checkout's map, whatever is installed
    from dedupnet.codec.homes import HomeMap

    m = HomeMap({1: 1.0, 2: 1.0})
    tracemalloc.start()
    for i in range(sites):
        m.home_of_site(f"site{i}.example")  # a fresh string, as site_of gives one per URL
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return used / sites


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, help="a checkout to measure side by side")
    ap.add_argument("--sites", type=int, default=100_000)
    ap.add_argument("--urls", type=int, default=1_000_000)
    ap.add_argument("--networks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("ORDER", "SITES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(int(args.child[1]), args.urls, args.child[0], args.networks)
        return
    checkouts = {"this": ROOT, **({"base": args.baseline.resolve()} if args.baseline else {})}
    print(f"{args.urls:,} URLs over {args.sites:,} sites, {args.networks} networks: µs per home_of")
    for order in ("numbered", "random"):
        best = {name: float("inf") for name in checkouts}
        missed = {name: 0.0 for name in checkouts}
        for r in range(args.rounds):
            items = list(checkouts.items())
            for name, path in items if r % 2 == 0 else reversed(items):
                out = subprocess.run([sys.executable, __file__, "--child", order, str(args.sites), "--urls",
                                      str(args.urls), "--networks", str(args.networks)],
                                     env={**os.environ, "PYTHONPATH": str(path)}, cwd=path, capture_output=True,
                                     text=True, check=True).stdout
                got = json.loads(out.splitlines()[-1])
                best[name], missed[name] = min(best[name], got["us"]), got["misses"]
        print(f"  {order:<9}" + "".join(f"  {name} {us:5.2f} µs ({missed[name]:.0%} missed)"
                                        for name, us in best.items()), flush=True)
    print(f"memory per site remembered (this checkout): {bytes_per_site(min(args.sites, 200_000)):.0f} bytes")


if __name__ == "__main__":
    main()

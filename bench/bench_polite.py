"""Benchmark: one host crawling a broad web politely — are its fetch slots busy, and is
it as fast as politeness allows?

A host's crawl on a real web is bounded by politeness, not by its CPU: each site may be
fetched once per ``per_site_delay``. With many sites holding work, a host can keep
every fetch slot busy; whether it does depends on how it picks the next task. This
bench crawls a synthetic web of the real shape (``WebSpec.shaped("real")``: many sites
of Zipf sizes, 85 % of links on their site) answering after ``--latency`` seconds, with
the crawler's own defaults (concurrency 32, 2 per site, 0.25 s: the daemons'), starting
from every site's home page. A stand-in for the protocol feeds every link found back
as a task once (the host's own look-up, ``HostPools``'s ``AddTasks``: what an admitted
URL becomes), so tasks arrive as they would: a site's pages in bursts.

Every 0.1 s it samples fetch slots in use, sites with work (a task queued or in
progress) and pages done, and prints, over the samples with at least ``--min-sites``
(32) sites with work:

* slots busy: mean requests on the wire / concurrency, and against what politeness
  allows at that moment (``min(concurrency, sites with work * latency / delay)``);
* requests/s (pages and robots.txt: both take a slot and a site's turn) against
  ``min(concurrency / latency, sites with work / delay)`` (the target is 0.85 of it);
* each finished site's last page against its own bound (its pages * delay, from the
  moment its first page was fetched) — how many came later than 1.1 x bound + 5 s;
* the crawler process's CPU per page.

``--baseline ROOT`` runs the same crawl with the crawler of another checkout (its
``.venv``; e.g. a worktree of main) first and prints both, side by side. The web and
Redis are always this checkout's. Run::

    .venv/bin/python bench/bench_polite.py [--sites 2000] [--pages 20000] [--latency 0.1]
        [--seconds 90] [--baseline /path/to/main-checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent


# -- the crawl (in a child process, with the crawler of the checkout on its sys.path) --------
def crawl_child(args) -> None:
    import trio

    from dedupnet.adapters.monitor.metrics import Counters
    from dedupnet.adapters.storage.store import URL_POOL, Store
    from dedupnet.codec.urls import site_of
    from local_host import protocol as hp
    from local_host.crawler.crawl import Crawler, CrawlerSettings
    from local_host.pools import HostPools

    store = Store(args.redis, args.prefix)
    pools = HostPools(store, exact=True)
    pools.setup()
    seeds = json.loads(Path(args.seeds_file).read_text())
    settings = CrawlerSettings(progress_interval=3600.0)
    counters = Counters()
    crawler = Crawler(store, settings, counters, consumer="bench")
    outstanding: dict[str, int] = {}
    seen: set[str] = set()
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    done: dict[str, int] = {}
    real_process = crawler._process
    t0 = time.monotonic()

    async def process(eid, url):
        try:
            await real_process(eid, url)
        finally:
            site = site_of(url)
            now = time.monotonic() - t0
            outstanding[site] -= 1
            first.setdefault(site, now)
            last[site] = now
            done[site] = done.get(site, 0) + 1

    crawler._process = process

    def add(urls: list[str]) -> None:
        new = [u for u in dict.fromkeys(urls) if u not in seen]
        if not new:
            return
        seen.update(new)
        for u in new:
            s = site_of(u)
            outstanding[s] = outstanding.get(s, 0) + 1
        pools.apply([hp.AddTasks(tuple(new))])

    def feed(after: bytes) -> bytes:
        """Links the crawler pushed since ``after``, queued as tasks once each."""
        entries = store.redis.xrange(store.key(URL_POOL), min=b"(" + after, count=5000)
        if entries:
            add([f[b"u"].decode() for _, f in entries])
            after = entries[-1][0]
        return after

    samples = []

    async def main():
        nonlocal t0
        await trio.to_thread.run_sync(add, seeds)
        t0 = time.monotonic()
        async with trio.open_nursery() as nursery:
            await nursery.start(crawler.run)
            after = b"0-0"
            while time.monotonic() - t0 < args.seconds:
                after = await trio.to_thread.run_sync(feed, after)
                work = sum(1 for n in outstanding.values() if n > 0)
                requests = counters.total("pages_fetched") + counters.total("robots_fetched")
                samples.append((time.monotonic() - t0, crawler.politeness.active, work, crawler.pages_done, requests))
                if not work and crawler.idle:
                    break
                await trio.sleep(0.1)
            nursery.cancel_scope.cancel()

    cpu = time.process_time()
    trio.run(main)
    cpu = time.process_time() - cpu
    left = {site for site, n in outstanding.items() if n > 0}
    store.delete_prefix()
    import resource

    print(json.dumps({"samples": samples, "first": first, "last": last, "done": done, "cpu": cpu,
                      "unfinished": sorted(left), "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


# -- the web (a child process) ------------------------------------------------------------------
def web_child(args) -> None:
    import trio

    from dedupnet.harness.web import SyntheticWeb, WebSpec

    web = SyntheticWeb(WebSpec.shaped("real", pages=args.pages, sites=args.sites, seed=args.seed), port=0,
                       latency=args.latency)

    async def run():
        async with trio.open_nursery() as nursery:
            port = await nursery.start(web.serve)
            print(json.dumps({"port": port, "seeds": web.seeds(args.sites)}), flush=True)

    try:
        trio.run(run)
    except KeyboardInterrupt:
        pass


# -- the parent ----------------------------------------------------------------------------------
def run_side(root: Path, redis_url: str, seeds_file: str, args, name: str) -> dict:
    python = root / ".venv" / "bin" / "python"
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([str(python), str(HERE), "--child", "crawl", "--redis", redis_url, "--prefix", f"polite-{name}",
                          "--seeds-file", seeds_file, "--seconds", str(args.seconds)],
                         env=env, cwd=root, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def figures(result: dict, args) -> dict:
    conc, delay, lat = 32, 0.25, args.latency
    rows = [s for s in result["samples"] if s[2] >= args.min_sites]
    busy = [s[1] / conc for s in rows]
    allowed = [s[1] / min(conc, s[2] * lat / delay) for s in rows]
    rate = expected = 0.0
    if len(rows) >= 2:
        rate = (rows[-1][4] - rows[0][4]) / (rows[-1][0] - rows[0][0])
        expected = sum(min(conc / lat, s[2] / delay) for s in rows) / len(rows)
    unfinished = set(result["unfinished"])
    late = sum(1 for site, t in result["last"].items()
               if site not in unfinished and t - result["first"][site] > 1.1 * result["done"][site] * delay + 5)
    all_rows = result["samples"]
    return {"seconds": all_rows[-1][0] if all_rows else 0, "pages": all_rows[-1][3] if all_rows else 0,
            "window_s": rows[-1][0] - rows[0][0] if len(rows) >= 2 else 0.0,
            "slots_busy": sum(busy) / len(busy) if busy else 0.0,
            "slots_busy_of_allowed": sum(allowed) / len(allowed) if allowed else 0.0,
            "pages_per_s": rate, "bound_per_s": expected, "sites_fetched": len(result["done"]), "sites_late": late,
            "sites_done": len(result["done"]) - len(unfinished),
            "cpu_ms_per_page": 1000 * result["cpu"] / max(1, all_rows[-1][3] if all_rows else 1),
            "rss_mb": result["rss_mb"]}


def late_done(f: dict) -> str:
    return f"{f['sites_late']:,}/{f['sites_done']:,}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sites", type=int, default=2000)
    ap.add_argument("--pages", type=int, default=20000)
    ap.add_argument("--latency", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=90.0, help="longest crawl (default 90)")
    ap.add_argument("--min-sites", type=int, default=32,
                    help="figures over the samples with at least this many sites with work (default 32)")
    ap.add_argument("--baseline", metavar="ROOT", help="another checkout whose crawler runs the same crawl first")
    ap.add_argument("--child", choices=("crawl", "web"), help=argparse.SUPPRESS)
    ap.add_argument("--redis", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", help=argparse.SUPPRESS)
    ap.add_argument("--seeds-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "crawl":
        return crawl_child(args)
    if args.child == "web":
        return web_child(args)

    sys.path.insert(0, str(ROOT))
    from dedupnet.adapters.storage.embedded import EmbeddedRedis

    web = subprocess.Popen([sys.executable, str(HERE), "--child", "web", "--sites", str(args.sites), "--pages",
                            str(args.pages), "--latency", str(args.latency), "--seed", str(args.seed)],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        hello = json.loads(web.stdout.readline())
        seeds_file = f"/tmp/bench_polite_seeds_{os.getpid()}.json"
        Path(seeds_file).write_text(json.dumps(hello["seeds"]))
        sides = [("baseline", Path(args.baseline))] if args.baseline else []
        sides.append(("this", ROOT))
        results = {}
        with EmbeddedRedis() as redis_url:
            for name, root in sides:
                results[name] = figures(run_side(root, redis_url, seeds_file, args, name), args)
                print(f"{name}: " + json.dumps({k: round(v, 3) for k, v in results[name].items()}), flush=True)
    finally:
        web.send_signal(signal.SIGINT)
        web.wait(10)
    print(f"\n{'':<10}{'crawl s':>9}{'pages':>8}{'req/s':>9}{'bound/s':>9}{'ratio':>7}{'slots busy':>12}"
          f"{'of allowed':>12}{'late/done':>12}{'CPU ms/page':>12}{'peak RSS MB':>12}")
    for name, f in results.items():
        ratio = f["pages_per_s"] / f["bound_per_s"] if f["bound_per_s"] else 0.0
        print(f"{name:<10}{f['seconds']:>9.1f}{f['pages']:>8,}{f['pages_per_s']:>9.1f}{f['bound_per_s']:>9.1f}"
              f"{ratio:>7.2f}{f['slots_busy']:>12.0%}{f['slots_busy_of_allowed']:>12.0%}"
              f"{late_done(f):>12}{f['cpu_ms_per_page']:>12.2f}{f['rss_mb']:>12.0f}")
    print(f"(over the samples with at least {args.min_sites} sites with work; target: ratio >= 0.85, slots busy "
          ">= 90 % of what politeness allows)")


if __name__ == "__main__":
    main()

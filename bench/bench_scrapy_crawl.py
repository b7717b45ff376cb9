"""Benchmark: a whole Scrapy crawl on scrapy-redis and on dedupnet's Scrapy path, same web.

The example project's ``follow`` spider (examples/scrapy), unchanged, crawls a synthetic
web (``--pages`` over ``--sites``, served by this process) with ``--spiders`` processes,
once on scrapy-redis (its scheduler and dupefilter, one Redis) and once on dedupnet
(one ``dedupnet center`` per network, ``--networks``, and one ``dedupnet local --no-crawl``
host per spider), alternating, ``--runs`` times each. The same Scrapy settings on both
sides: ``CONCURRENT_REQUESTS`` 32, no download delay, the example's per-domain bound and
``ROBOTSTXT_OBEY``. The seeds go to the first spider only (``start_urls``): scrapy-redis
queues start requests past its dupefilter, so seeds given to every spider would be
fetched by every spider.

Closing: scrapy-redis closes a plain spider the first time its queue is empty, so its
spiders run with bench/scrapy_idle_close.py (close after ``--idle-close`` s with nothing
to do, what scrapy-redis's ``MAX_IDLE_TIME_BEFORE_CLOSE`` does for a ``RedisSpider``);
dedupnet's spiders close on the cluster's verdict (``DEDUPNET_CENTER``), with
``DEDUPNET_MAX_IDLE`` = ``--idle-close`` as the fallback.

Redis: each side of each run has a fresh embedded server (every daemon of the dedupnet
side on it, each under its own prefix: the sum over every Redis of a deployment);
scrapy-redis runs with ``SCHEDULER_PERSIST`` so its keys are there after the spiders
closed. Measured once every spider has exited.

Printed per side, medians over the runs:

* pages/s: pages fetched (the web's log, 503 answers not counted) over the time from
  the spiders' launch to the last fetch (Scrapy's start-up counts on both sides);
* first 1,000: seconds from the launch to the 1,000th page;
* exit: seconds from the last fetch to the last spider's exit;
* duplicates (fetches beyond the first of a URL) and missed (reachable URLs never
  fetched), from the web's log against its ground truth;
* disallowed: pages fetched that the site's robots.txt disallows (``/private/``), summed
  over the runs (``--side dedupnet --runs 20`` is the 20-run check);
* Redis bytes per URL (reachable URLs): the sum of ``MEMORY USAGE`` of every key
  (``SAMPLES 0``), and the growth of ``used_memory`` twice: once every spider has exited
  (dedupnet's daemons still connected, each connection with its buffers), and once every
  client of the deployment has gone (the daemons stopped too; for scrapy-redis the same
  moment as the first). The server is the same embedded one on both sides, with the
  configuration dedupnet gives it.

``--kill F``: the last spider (the one without seeds) is SIGKILLed once F of the URLs
are fetched and started again with the same settings, as after a crash; missed is then
what the crash lost and duplicates what it fetched twice.

Run: ``.venv/bin/python bench/bench_scrapy_crawl.py --spiders 2 --networks 1``
(needs the ``bench`` extra: ``pip install -e '.[bench]'``). A shared machine moves the
rates by tens of percent: compare the two sides of one invocation, not across machines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.harness import procdaemons, procplan  # noqa: E402
from dedupnet.harness.report import SimConfig  # noqa: E402
from dedupnet.harness.scrapyhost import EXAMPLE  # noqa: E402
from dedupnet.harness.web import SyntheticWeb, WebSpec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COMMON = ("-s", "CONCURRENT_REQUESTS=32", "-s", "DOWNLOAD_DELAY=0", "-s", "LOG_LEVEL=INFO",
          "-s", "TELNETCONSOLE_ENABLED=0")


def redis_bytes(url: str) -> tuple[int, int]:
    """(sum of MEMORY USAGE of every key, used_memory)."""
    r = redis.Redis.from_url(url)
    try:
        keys = sum(r.memory_usage(k, samples=0) or 0 for k in r.scan_iter(count=1000))
        return keys, r.info("memory")["used_memory"]
    finally:
        r.close()


async def one_run(side: str, args, logdir: Path) -> dict:
    web = SyntheticWeb(WebSpec(pages=args.pages, sites=args.sites, seed=args.seed), port=0)
    env = procplan.daemon_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bench"), env["PYTHONPATH"]])
    with EmbeddedRedis() as url, tempfile.TemporaryDirectory(dir=logdir) as tmp:
        tmp = Path(tmp)
        _, base = redis_bytes(url)
        daemons: list[procdaemons.Daemon] = []
        async with trio.open_nursery() as nursery:
            await nursery.start(web.serve)
            seeds = web.seeds(3)
            reach = web.reachable_detail(seeds)
            if side == "dedupnet":
                cfg = SimConfig(networks=args.networks, hosts=args.spiders // args.networks, pages=args.pages,
                                sites=args.sites, seed=args.seed)
                centers, hosts = procplan.plan_daemons(cfg, url, "bench", tmp)
                for h in hosts:
                    h.argv.append("--no-crawl")
                daemons = centers + hosts
                await procdaemons.start_all(centers, hosts, tmp, env, 60)
                center = "%s:%d" % centers[0].address
                argvs = [["-s", f"DEDUPNET_REDIS_URL={url}", "-s", f"DEDUPNET_PREFIX={h.prefix}",
                          "-s", f"DEDUPNET_CONSUMER={h.name}", "-s", f"DEDUPNET_CENTER={center}",
                          "-s", f"DEDUPNET_MAX_IDLE={args.idle_close:g}"] for h in hosts]
            else:
                argvs = [["-s", "SCHEDULER=scrapy_redis.scheduler.Scheduler",
                          "-s", "DUPEFILTER_CLASS=scrapy_redis.dupefilter.RFPDupeFilter",
                          "-s", f"REDIS_URL={url}", "-s", "SCHEDULER_PERSIST=True",
                          "-s", '''EXTENSIONS={"scrapy_idle_close.IdleClose": 500}''',
                          "-s", f"IDLE_CLOSE_AFTER={args.idle_close:g}"] for _ in range(args.spiders)]
            argvs[0] += ["-a", "start_urls=" + ",".join(seeds)]
            t0 = time.monotonic()

            def spider(i: int) -> subprocess.Popen:
                with open(tmp / f"spider{i}.log", "ab") as log:
                    return subprocess.Popen([sys.executable, "-m", "scrapy", "crawl", "follow", *COMMON, *argvs[i]],
                                            cwd=EXAMPLE, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT)

            procs = [spider(i) for i in range(len(argvs))]
            last, count, first_k = t0, 0, None
            exits: dict[int, float] = {}
            killed = not args.kill
            with trio.move_on_after(args.timeout):
                while len(exits) < len(procs):
                    fetched = sum(web.answer_counts.values())
                    now = time.monotonic()
                    if fetched != count:
                        last, count = now, fetched
                        if first_k is None and fetched >= 1000:
                            first_k = now - t0
                    if not killed and fetched >= args.kill * len(reach.fetched):
                        # The last spider (no seeds: a restart adds none), as a crash would.
                        procs[-1].kill()
                        procs[-1].wait()
                        procs[-1] = spider(len(procs) - 1)
                        killed = True
                    for i, p in enumerate(procs):
                        if i not in exits and p.poll() is not None:
                            exits[i] = now
                    await trio.sleep(0.01)
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            keys, used = redis_bytes(url)
            if daemons:
                await procdaemons.stop_all(daemons, 15)
            _, used_alone = redis_bytes(url)
            nursery.cancel_scope.cancel()
        if not web.answer_counts:  # every spider failed to start (scrapy-redis missing: pip install .[bench])
            tail = (tmp / "spider0.log").read_text(errors="replace").strip().splitlines()[-1:]
            raise SystemExit(f"{side}: no page fetched in {args.timeout:g} s; spider0.log ends: {' '.join(tail)}")
    answered = set(web.answer_counts)
    urls = len(reach.fetched)
    return {"pages_s": len(answered) / (last - t0), "first_1000": first_k,
            "exit": (max(exits.values()) - last) if len(exits) == len(procs) else None,
            "duplicates": web.duplicate_fetches(), "missed": len(reach.fetched - answered),
            "disallowed": sum(1 for u in answered if web.disallowed(u)),
            "keys_b": keys / urls, "used_b": (used - base) / urls,
            "alone_b": (used_alone - base) / urls, "urls": urls}


def median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spiders", type=int, default=2)
    p.add_argument("--networks", type=int, default=1)
    p.add_argument("--pages", type=int, default=6000)
    p.add_argument("--sites", type=int, default=60)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", type=int, default=2, help="runs of each side, alternating")
    p.add_argument("--side", choices=("both", "scrapy-redis", "dedupnet"), default="both",
                   help="run one side only (e.g. the 20-run robots.txt check)")
    p.add_argument("--idle-close", type=float, default=10.0, help="seconds idle before a spider closes (fallback)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take")
    p.add_argument("--kill", type=float, default=0.0, metavar="FRACTION",
                   help="SIGKILL the last spider once this fraction of the URLs is fetched, and start it again "
                        "(0: no kill); duplicates are then what the crash fetched twice")
    args = p.parse_args()
    if args.spiders % args.networks:
        p.error("--spiders must be a multiple of --networks (one host per spider, as many per network)")
    results: dict[str, list[dict]] = {side: [] for side in ("scrapy-redis", "dedupnet")
                                      if args.side in ("both", side)}
    with tempfile.TemporaryDirectory() as logdir:
        for run in range(args.runs):
            for side in results:
                row = trio.run(one_run, side, args, Path(logdir))
                results[side].append(row)
                print(f"run {run + 1} {side}: {row}", file=sys.stderr)
    urls = next(iter(results.values()))[0]["urls"]
    kill = f"; the last spider SIGKILLed at {args.kill:.0%} of the URLs and started again" if args.kill else ""
    print(f"{args.pages} pages over {args.sites} sites ({urls} URLs to request), {args.spiders} spiders, "
          f"dedupnet in {args.networks} network(s); medians of {args.runs} runs{kill}")
    print("| | N | pages/s (start → last fetch) | first 1,000 pages (s) | exit after last page (s) "
          "| duplicates | missed | disallowed (sum) | Redis bytes per URL (keys; `used_memory` growth, daemons connected; "
          "every client gone) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for side, rows in results.items():
        name = side if side == "scrapy-redis" else f"dedupnet, {args.networks} network{'s' * (args.networks > 1)}"
        print(f"| {name} | {args.spiders} | {fmt(median(rows, 'pages_s'), '.0f')} | "
              f"{fmt(median(rows, 'first_1000'), '.2f')} | {fmt(median(rows, 'exit'), '.1f')} | "
              f"{fmt(median(rows, 'duplicates'), 'g')} | {fmt(median(rows, 'missed'), 'g')} | "
              f"{sum(r['disallowed'] for r in rows)} in {len(rows)} runs | "
              f"{fmt(median(rows, 'keys_b'), '.0f')}; {fmt(median(rows, 'used_b'), '.0f')}, "
              f"{fmt(median(rows, 'alone_b'), '.0f')} |")


if __name__ == "__main__":
    main()

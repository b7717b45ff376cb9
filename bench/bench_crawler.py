"""Benchmark: one host's crawler on the synthetic web, politeness off.

For each concurrency level (default 1, 8, 32, 64) the crawler of one host crawls the
same ``--tasks`` URLs (default 2,000) of a synthetic web (default 5,000 pages over 50
sites) and a table is printed: pages/s, and CPU seconds per page of the crawler
process (``time.process_time``: the event loop and the Redis worker threads), of the
web server and of Redis (psutil). The last line states the target — at least 200
pages/s for one host, the web server on the same machine — and whether the best
level met it.

What is measured, and what is not
    * The web server runs in a separate process (``python -m dedupnet.harness.web``, started
      afresh for every level so that flaky pages fail again and the work is the same)
      so it does not share the crawler's GIL; its port is read from its first line of
      output. Redis is an embedded, non-persistent server (or ``--redis URL``).
    * There is no protocol here. The tasks are pre-computed from the web's ground
      truth (:meth:`SyntheticWeb.reachable_detail` from every site's home page; the
      first ``--tasks`` URLs the crawler would fetch, breadth first: pages, 404s and
      redirects) and all put into the host's ``task_pool`` before the clock starts.
      The links the crawler pushes into ``URL_pool`` are written and ignored. So the
      figure is the crawler's own: take, robots check, fetch, parse, and the
      transaction that records each page (finish_URL, URL_pool, XACK + XDEL; pages
      that finish together share one).
    * Politeness off: ``per_site_delay=0``, no per-site bound; robots.txt is on
      (fetched once per site). Retries of the web's flaky 503 pages wait 10 ms, not
      the default 0.5 s, so a back-off does not idle the end of the run.
    * The clock runs from the crawler's start to its last task recorded; each level
      uses its own key prefix (a fresh finish_URL), which is removed afterwards.
      On a shared machine figures vary by 20 % and more from run to run (CPU per
      page less than pages/s): ``--repeat 3`` runs every level three times and
      shows the median run.

Side by side with another checkout (``--baseline CHECKOUT``, e.g. a git worktree of
main; ``--baseline-python`` if it needs its own interpreter): every level is run
``--rounds`` times on each side, alternately, each run a process of its own with its
own embedded Redis and web (this script with ``PYTHONPATH`` set to the checkout), and
the table gives the median of each figure per side and the ratio this / base, with
the total CPU per page (crawler + web + Redis).

Run: ``.venv/bin/python bench/bench_crawler.py [--levels 1,8,32,64] [--tasks 2000]
[--pages 5000] [--sites 50] [--repeat 1] [--redis URL] [--baseline CHECKOUT --rounds 3]``. On a 2-core machine the web
server and the crawler each take about a core; figures depend on the machine and its
load.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.adapters.monitor.metrics import Counters  # noqa: E402
from dedupnet.adapters.storage.store import FINISH_URL, TASK_POOL, Store  # noqa: E402
from local_host.frontier.sites import task_count  # noqa: E402
from dedupnet.codec.urls import fingerprint_many  # noqa: E402
from dedupnet.harness.web import SyntheticWeb, WebSpec  # noqa: E402
from local_host.crawler.crawl import FAILED, Crawler, CrawlerSettings  # noqa: E402

TARGET = 200.0  # pages/s, one host


@dataclass
class Row:
    concurrency: int
    pages: int
    seconds: float
    crawler_cpu: float
    web_cpu: float | None
    redis_cpu: float | None
    failed: int
    requests: int

    @property
    def rate(self) -> float:
        return self.pages / self.seconds


class WebProcess:
    """``python -m dedupnet.harness.web`` in a child process; :attr:`port` once it serves."""

    def __init__(self, pages: int, sites: int, seed: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dedupnet.harness.web", "--pages", str(pages), "--sites", str(sites),
             "--seed", str(seed), "--port", "0", "--seeds", "0"],
            stdout=subprocess.PIPE, text=True)
        first = self.proc.stdout.readline()  # printed once every site listens
        m = re.search(r"port (\d+);", first)
        if m is None:
            self.stop()
            raise RuntimeError(f"synthetic web did not start: {first!r}")
        self.port = int(m.group(1))
        self.ps = psutil.Process(self.proc.pid)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # its normal way to stop
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def tasks_for(web: SyntheticWeb, n: int) -> list[str]:
    """The first ``n`` URLs a crawl from every home page fetches, breadth first."""
    reach = web.reachable_detail(web.seeds(web.spec.sites))
    fetched = reach.fetched
    urls = [u for u in reach.depth if u in fetched]  # depth: insertion order is BFS order
    if len(urls) < n:
        raise SystemExit(f"the web has only {len(urls)} reachable URLs; use more --pages or fewer --tasks")
    return urls[:n]


def cpu_of(ps: psutil.Process | None) -> float | None:
    if ps is None:
        return None
    t = ps.cpu_times()
    return t.user + t.system


async def crawl(store: Store, settings: CrawlerSettings, n: int, probes) -> tuple[float, float, dict, Counters]:
    """Crawl until ``n`` tasks are done: (wall seconds, crawler CPU seconds, other CPU deltas)."""
    counters = Counters()
    crawler = Crawler(store, settings, counters, consumer="bench")
    before = {name: cpu_of(ps) for name, ps in probes.items()}
    c0, t0 = time.process_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(crawler.run)
        while crawler.pages_done < n:
            await trio.sleep(0.005)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        nursery.cancel_scope.cancel()
    others = {name: (cpu_of(probes[name]) - v if v is not None else None) for name, v in before.items()}
    return seconds, cpu, others, counters


def run_level(redis_url: str, redis_ps, args, concurrency: int) -> Row:
    web_proc = WebProcess(args.pages, args.sites, args.seed)
    try:
        web = SyntheticWeb(WebSpec(pages=args.pages, sites=args.sites, seed=args.seed), port=web_proc.port)
        urls = tasks_for(web, args.tasks)
        store = Store(redis_url, f"benchcrawl{concurrency}")
        store.delete_prefix()
        for i in range(0, len(urls), 5000):
            store.stream_add(TASK_POOL, urls[i : i + 5000])
        settings = CrawlerSettings(
            concurrency=concurrency, per_site_concurrency=0, per_site_delay=0.0, respect_robots=True,
            retry_base=0.01, max_leased=max(256, 4 * concurrency), progress_interval=3600.0)
        seconds, cpu, others, counters = trio.run(
            crawl, store, settings, len(urls), {"web": web_proc.ps, "redis": redis_ps})
        assert store.fp_contains(FINISH_URL, fingerprint_many(urls)).all(), "a task was not recorded"
        assert task_count(store) == 0
        failed = store.redis.hlen(store.key(FAILED))
        store.delete_prefix()
        store.close()
        return Row(concurrency, len(urls), seconds, cpu, others["web"], others["redis"], failed,
                   counters.total("pages_fetched") + counters.total("robots_fetched"))
    finally:
        web_proc.stop()


def per_page(cpu: float | None, pages: int) -> str:
    return f"{cpu / pages * 1000:>8.2f}" if cpu is not None else f"{'-':>8}"


#: (heading, width, the figure of a row as a dict); the side-by-side table's columns.
FIGURES = [
    ("pages/s", 8, lambda r: r["pages"] / r["seconds"]),
    ("crawler CPU ms/page", 19, lambda r: r["crawler_cpu"] * 1000 / r["pages"]),
    ("web ms/page", 11, lambda r: r["web_cpu"] * 1000 / r["pages"] if r["web_cpu"] is not None else None),
    ("redis ms/page", 13, lambda r: r["redis_cpu"] * 1000 / r["pages"] if r["redis_cpu"] is not None else None),
    ("total CPU ms/page", 17,
     lambda r: sum(r[k] or 0.0 for k in ("crawler_cpu", "web_cpu", "redis_cpu")) * 1000 / r["pages"]),
]


def side_argv(python: str, checkout: str, level: int, args) -> list[str]:
    """The checkout's own copy of this script (its modules may live elsewhere), one
    level one time, its row printed as JSON (``--row``)."""
    return [python, str(Path(checkout) / "bench" / "bench_crawler.py"), "--row", "--levels", str(level), "--tasks", str(args.tasks), "--pages", str(args.pages),
            "--sites", str(args.sites), "--seed", str(args.seed)]


def run_side(python: str, checkout: str, level: int, args) -> dict:
    """One run of a level with ``checkout``'s dedupnet and local_host (PYTHONPATH; the
    synthetic web's child inherits it), in its own process and embedded Redis."""
    env = {**os.environ, "PYTHONPATH": checkout}
    proc = subprocess.run(side_argv(python, checkout, level, args), env=env, cwd=checkout, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the run of {checkout} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def side_by_side(args, levels: list[int]) -> None:
    """Every level run ``--rounds`` times on each side, alternately (baseline first), so
    a change of the machine's load hits both alike; the median of each figure, and the
    ratio this / baseline."""
    here = str(Path(__file__).resolve().parent.parent)
    sides = [("base", args.baseline_python or sys.executable, str(Path(args.baseline).resolve())),
             ("this", sys.executable, here)]
    print(f"synthetic web {args.pages:,} pages / {args.sites} sites (separate process); {args.tasks:,} tasks per "
          f"level; politeness off, robots on; {psutil.cpu_count()} CPUs; base = {sides[0][2]}, "
          f"{args.rounds} rounds alternated, medians")
    head = f"{'concurrency':>11} {'run':>10}" + "".join(f" {h:>{w}}" for h, w, _ in FIGURES)
    print(head)
    for c in levels:
        rows: dict[str, list[dict]] = {"base": [], "this": []}
        for _ in range(max(1, args.rounds)):
            for name, python, checkout in sides:
                rows[name].append(run_side(python, checkout, c, args))
        med = {name: [_median([f(r) for r in rs]) for _, _, f in FIGURES] for name, rs in rows.items()}
        for name in ("base", "this"):
            print(f"{c:>11} {name:>10}" + "".join(
                f" {v:>{w}.2f}" if v is not None else f" {'-':>{w}}" for v, (_, w, _) in zip(med[name], FIGURES)))
        ratios = [t / b if t is not None and b else None for t, b in zip(med["this"], med["base"])]
        print(f"{c:>11} {'this/base':>10}" + "".join(
            f" {v:>{w}.2f}" if v is not None else f" {'-':>{w}}" for v, (_, w, _) in zip(ratios, FIGURES)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="1,8,32,64", help="concurrency levels, comma-separated (default 1,8,32,64)")
    ap.add_argument("--tasks", type=int, default=2000, help="pages crawled per level (default 2,000)")
    ap.add_argument("--pages", type=int, default=5000, help="pages of the synthetic web (default 5,000)")
    ap.add_argument("--sites", type=int, default=50, help="sites of the synthetic web (default 50)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic web")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per level; the median run (by pages/s) is shown (default 1)")
    ap.add_argument("--redis", help="use this server instead of an embedded one (keys benchcrawl*:* are removed)")
    ap.add_argument("--baseline", metavar="CHECKOUT",
                    help="also run every level with another checkout's code (e.g. a worktree of main), side by "
                         "side, each run in its own process; see --rounds")
    ap.add_argument("--baseline-python", metavar="PYTHON",
                    help="with --baseline: the interpreter for its runs (default: this one)")
    ap.add_argument("--rounds", type=int, default=3, help="with --baseline: runs per level and side (default 3)")
    ap.add_argument("--row", action="store_true", help=argparse.SUPPRESS)  # one run, its row as JSON
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    # 404s and the like are logged as warnings per page: not what is measured here.
    logging.getLogger("dedupnet").setLevel(logging.ERROR)
    if args.baseline:
        side_by_side(args, levels)
        return

    server = None if args.redis else EmbeddedRedis()
    with nullcontext(args.redis) if args.redis else server as redis_url:
        redis_ps = psutil.Process(server.pid) if server is not None else None
        if args.row:
            print(json.dumps(asdict(run_level(redis_url, redis_ps, args, levels[0]))))
            return
        print(f"synthetic web {args.pages:,} pages / {args.sites} sites (separate process); "
              f"{args.tasks:,} tasks per level; politeness off, robots on; {psutil.cpu_count()} CPUs")
        print(f"{'concurrency':>11} {'pages':>7} {'requests':>8} {'failed':>6} {'seconds':>8} {'pages/s':>8}"
              f" {'crawler CPU ms/page':>19} {'web ms/page':>11} {'redis ms/page':>13}")
        rows = []
        for c in levels:
            runs = sorted((run_level(redis_url, redis_ps, args, c) for _ in range(max(1, args.repeat))),
                          key=lambda r: r.rate)
            row = runs[len(runs) // 2]
            rows.append(row)
            print(f"{row.concurrency:>11} {row.pages:>7} {row.requests:>8} {row.failed:>6} {row.seconds:>8.2f}"
                  f" {row.rate:>8.0f} {per_page(row.crawler_cpu, row.pages):>19}"
                  f" {per_page(row.web_cpu, row.pages):>11} {per_page(row.redis_cpu, row.pages):>13}", flush=True)
        best = max(rows, key=lambda r: r.rate)
        verdict = "met" if best.rate >= TARGET else "NOT met"
        print(f"target: >= {TARGET:.0f} pages/s for one host -> {verdict} "
              f"(best {best.rate:.0f} pages/s at concurrency {best.concurrency})")


if __name__ == "__main__":
    main()

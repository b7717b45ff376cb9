"""A host gone for good with its data, no operator action (docs/PROTOCOL.md section 12):
real `dedupnet center` / `dedupnet local` processes on one LAN, crawling the synthetic
web; one host is SIGKILLed at a share of the crawl and its Redis data deleted. Prints
what was fetched, lost and fetched twice (from the web's own log), how long the crawl
took after the kill, and the verdict's story meanwhile.

    .venv/bin/python bench/bench_host_gone.py [--hosts 3] [--pages 1500] [--at 0.3] [--reissue-after 10]
"""

from __future__ import annotations

import sys
import argparse
import os
import signal
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.monitor.census import survey  # noqa: E402
from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.adapters.storage.store import Store  # noqa: E402
from dedupnet.harness import procdaemons, procplan, simproc  # noqa: E402
from dedupnet.harness.report import SimConfig, assign_seeds  # noqa: E402
from dedupnet.harness.web import SyntheticWeb, WebSpec  # noqa: E402


async def run(args) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="hostgone-"))
    redis = EmbeddedRedis()
    redis_url = redis.start()
    web = SyntheticWeb(WebSpec(pages=args.pages, sites=args.sites, seed=args.seed), port=0)
    cfg = SimConfig(networks=1, hosts=args.hosts, pages=args.pages, sites=args.sites, seed=args.seed, set_size=100,
                    concurrency=8, per_site_delay=args.per_site_delay)
    prefix = f"hostgone-{os.getpid()}"
    async with trio.open_nursery() as nursery:
        await nursery.start(web.serve)
        centers, hosts = procplan.plan_daemons(cfg, redis_url, prefix, tmp)
        for c in centers:
            c.argv += ["--reissue-after", str(args.reissue_after)]
        env = procplan.daemon_env()
        try:
            await procdaemons.start_all(centers, hosts, tmp, env, 60)
            seeds = web.seeds(6)
            reach = web.reachable_detail(seeds)
            by_ip = {h.name: h for h in hosts}
            for ip, urls in assign_seeds(list(by_ip), seeds).items():
                await trio.to_thread.run_sync(simproc._push, redis_url, by_ip[ip].prefix, urls)
            start = time.monotonic()
            while len(web.answer_counts) < args.at * len(reach.fetched):
                await trio.sleep(0.05)
            victim = hosts[-1]
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait()
            Store(redis_url, victim.prefix).delete_prefix()  # its disk is gone
            killed = time.monotonic()
            print(f"killed {victim.name} at {len(web.answer_counts)} of {len(reach.fetched)} pages "
                  f"({time.monotonic() - start:.1f} s into the crawl); its data deleted")
            verdicts: list[tuple[float, str]] = []
            while True:
                report = await survey(centers[0].address, [None], settle=0.2)
                v = report["verdict"]
                if not verdicts or verdicts[-1][1] != v:
                    verdicts.append((time.monotonic() - killed, v))
                    print(f"  +{verdicts[-1][0]:.1f} s: {v} ({'; '.join(report['reasons'][:2])})")
                if v == "complete" or time.monotonic() - killed > args.reissue_after + 120:
                    break
                await trio.sleep(0.5)
            done = time.monotonic() - killed
            fetched = set(web.answer_counts)
            lost = reach.fetched - fetched
            twice = sum(1 for n in web.answer_counts.values() if n > 1)
            print(f"complete {done:.1f} s after the kill (reissue_after {args.reissue_after:g} s); "
                  f"fetched {len(fetched & reach.fetched)} of {len(reach.fetched)}; lost {len(lost)}; "
                  f"fetched twice {twice}")
        finally:
            await procdaemons.stop_all(centers + hosts, 15)
            nursery.cancel_scope.cancel()
    redis.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--pages", type=int, default=1500)
    p.add_argument("--sites", type=int, default=30)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--at", type=float, default=0.3)
    p.add_argument("--per-site-delay", type=float, default=0.05)
    p.add_argument("--reissue-after", type=float, default=10.0)
    trio.run(run, p.parse_args())


if __name__ == "__main__":
    main()

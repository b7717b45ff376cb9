"""What ``--secure`` costs: ``dedupnet sim`` plain against ``--secure`` (TLS between the
centers and HMAC tags on the LANs) and ``--secure --lan-tls``, side by side,
alternating, in one process on one embedded Redis.

Each round runs every variant once, in the order given, on the same web and seed, so a
change in the machine's load hits all variants alike. Bytes on the wire: what the
daemons sent; on TLS connections the TCP bytes under the SSLStream (TLS records,
handshakes and alerts included: dedupnet/adapters/net/tls.py CountingStream), on plain ones the
messages' bytes (which are the TCP payload). Per distinct URL (the URLs a perfect crawl
requests) and per URL found (links pushed into URL_pool).

    .venv/bin/python bench/bench_secure.py --rounds 2                 # 3x3, 3,000 pages
    .venv/bin/python bench/bench_secure.py --variants plain,secure,secure+lan --processes
"""

from __future__ import annotations

from pathlib import Path
import argparse
import dataclasses
import logging
import sys
import time

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.harness.report import SimConfig  # noqa: E402
from dedupnet.harness.sim import simulate  # noqa: E402

VARIANTS = {"plain": {}, "secure": {"secure": True}, "secure+lan": {"secure": True, "lan_tls": True}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default="plain,secure", help="comma-separated: " + ", ".join(VARIANTS))
    p.add_argument("--networks", type=int, default=3)
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--pages", type=int, default=3000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--processes", action="store_true", help="every daemon its own process (dedupnet/harness/simproc.py)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # as dedupnet sim: the crawlers' 404s are the web's, not news
    variants = args.variants.split(",")
    base = SimConfig(networks=args.networks, hosts=args.hosts, pages=args.pages, seed=args.seed)
    rows = []
    with EmbeddedRedis() as url:
        for r in range(1, args.rounds + 1):
            for name in variants:
                cfg = dataclasses.replace(base, **VARIANTS[name])
                t = time.perf_counter()
                if args.processes:
                    from dedupnet.harness.simproc import simulate_processes

                    report = trio.run(lambda: simulate_processes(cfg, url, out=None))
                else:
                    report = trio.run(lambda: simulate(cfg, url, out=None))
                rows.append((r, name, report, time.perf_counter() - t))
                print(f"  round {r} {name:<11} wall {report.wall_time:6.1f} s  bytes/URL {report.bytes_per_url:7.1f}"
                      f"  dup {report.duplicate_fetches} lost {report.lost_urls}", file=sys.stderr, flush=True)
                if report.duplicate_fetches:  # the web answered more than the crawlers saw: a retry?
                    print(f"    web answered {report.requests:,} requests, the crawlers saw {report.crawler_requests:,}",
                          file=sys.stderr, flush=True)
                for line in report.invariant_examples[:5]:  # who fetched what twice, when
                    print(f"    {line}", file=sys.stderr, flush=True)
    head = (f"{'round':>5} {'variant':<11}{'wall s':>8}{'bytes on wire':>15}{'B/distinct URL':>16}"
            f"{'B/URL found':>13}{'messages B':>12}{'TLS bytes':>11}{'TLS own':>9}{'handshakes':>11}{'dup':>5}{'lost':>5}")
    print(f"\n{args.networks}x{args.hosts}, {args.pages:,} pages, seed {args.seed}"
          f"{', --processes' if args.processes else ', one process'}")
    print(head + "\n" + "-" * len(head))
    for r, name, rep, _ in rows:
        print(f"{r:>5} {name:<11}{rep.wall_time:>8.1f}{rep.bytes_on_wire:>15,}{rep.bytes_per_url:>16.1f}"
              f"{rep.bytes_on_wire / max(rep.urls_found, 1):>13.1f}"
              f"{rep.bytes_on_wire - rep.tls_bytes_on_wire + rep.tls_payload_bytes:>12,}{rep.tls_bytes_on_wire:>11,}"
              f"{rep.tls_bytes_on_wire - rep.tls_payload_bytes:>9,}{rep.tls_handshakes:>11}"
              f"{rep.duplicate_fetches:>5}{rep.lost_urls:>5}")
    print("\nmeans")
    for name in variants:
        mine = [rep for _, n, rep, _ in rows if n == name]
        wall = sum(x.wall_time for x in mine) / len(mine)
        bpu = sum(x.bytes_per_url for x in mine) / len(mine)
        own = sum((x.tls_bytes_on_wire - x.tls_payload_bytes) / x.reachable_urls for x in mine) / len(mine)
        print(f"  {name:<11} wall {wall:6.1f} s   bytes per distinct URL {bpu:7.1f}, of which TLS's own {own:5.1f}")
    return 0 if all(rep.duplicate_fetches == 0 and rep.lost_urls == 0 and not rep.timed_out for _, _, rep, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

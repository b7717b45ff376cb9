"""The long runs of ``dedupnet simulate`` (dedupnet/harness/dst): many fault schedules at
one layout, and the per-URL costs across layouts for docs/BENCHMARKS.md.

    python bench/bench_simulate.py schedules --runs 1000              # 4x3, 3 faults each
    python bench/bench_simulate.py schedules --runs 1000 --kinds=-wipe-host
    python bench/bench_simulate.py scale --layouts 2x2,4x3,8x4,16x8,32x16 --pages 200000

``schedules`` prints one line per failing run (with its replay command), the violations
by kind and by the fault kinds of the failing schedules, and schedules per minute.
``scale`` prints one row per layout: messages, bytes, look-ups and transactions per URL
fetched at the centers and the hosts, stored entries per URL, discovery-to-admission
latency in virtual time, and virtual over real time.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dedupnet.harness.dst import faults as fl  # noqa: E402
from dedupnet.harness.dst.cli import _kinds  # noqa: E402
from dedupnet.harness.dst.run import replay_command, simulate  # noqa: E402
from dedupnet.harness.dst.world import DstConfig  # noqa: E402


def schedules(args) -> int:
    t0 = time.perf_counter()
    by_violation: Counter[str] = Counter()
    by_fault: Counter[str] = Counter()
    faults_run: Counter[str] = Counter()
    failed = 0
    virtual = 0.0
    for k in range(args.runs):
        cfg = DstConfig(networks=args.networks, hosts=args.hosts, pages=args.pages, sites=args.sites,
                        seed=args.seed + k, faults=args.faults, kinds=args.kinds, mode=args.mode)
        r = simulate(cfg)
        virtual += r.virtual
        faults_run.update(f.kind for f in r.schedule)
        if r.ok:
            continue
        failed += 1
        by_violation.update({v.kind for v in r.outcome.violations})
        by_fault.update({f.kind for f in r.schedule})
        print(f"seed {cfg.seed}: {'; '.join(str(v)[:160] for v in r.outcome.violations)}\n"
              f"    replay: {replay_command(cfg, r.schedule)}", flush=True)
    wall = time.perf_counter() - t0
    print(f"\n{args.runs} schedules at {args.networks}x{args.hosts}, {args.pages} pages, {args.faults} faults each "
          f"({sum(faults_run.values())} faults: {dict(sorted(faults_run.items()))})")
    print(f"{failed} with violations; by violation: {dict(by_violation)}; fault kinds in failing schedules: "
          f"{dict(by_fault.most_common())}")
    print(f"{wall:.1f} s: {args.runs / wall * 60:.0f} schedules/min, virtual time {virtual / wall:.0f}x real")
    return 1 if failed else 0


def scale(args) -> int:
    print("| layout | pages | URLs fetched | WAN msgs/URL | WAN B/URL | LAN msgs/URL | LAN B/URL | center "
          "look-ups/URL | center txns/URL | host look-ups/URL | host txns/URL | center entries/URL | host "
          "entries/URL | found->admitted p50 / p99 (s) | virtual s | wall s |")
    print("|" + "---|" * 16)
    for layout in args.layouts.split(","):
        networks, hosts = (int(x) for x in layout.split("x"))
        cfg = DstConfig(networks=networks, hosts=hosts, pages=args.pages, sites=args.sites, seed=args.seed,
                        faults=0, stall_after=args.stall_after, routing=args.routing)
        r = simulate(cfg)
        c = r.costs
        print(f"| {layout} | {args.pages} | {c['urls_fetched']} | {c['messages_per_url']['wan']:.2f} | "
              f"{c['bytes_per_url']['wan']:.0f} | {c['messages_per_url']['lan']:.2f} | {c['bytes_per_url']['lan']:.0f} | "
              f"{c['center_lookups_per_url']:.3f} | {c['center_writes_per_url']:.3f} | {c['host_lookups_per_url']:.3f} | "
              f"{c['host_writes_per_url']:.3f} | {c['center_entries_per_url']:.2f} | {c['host_entries_per_url']:.2f} | "
              f"{c['admit_latency_p50'] or 0:.2f} / {c['admit_latency_p99'] or 0:.2f} | {r.virtual:.0f} | {r.wall:.1f} |"
              + ("" if r.ok else f" VIOLATIONS: {'; '.join(map(str, r.outcome.violations))}"), flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("schedules", help="many fault schedules at one layout")
    s.add_argument("--runs", type=int, default=1000)
    s.add_argument("--networks", type=int, default=4)
    s.add_argument("--hosts", type=int, default=3)
    s.add_argument("--pages", type=int, default=1000)
    s.add_argument("--sites", type=int, default=20)
    s.add_argument("--faults", type=int, default=3)
    s.add_argument("--kinds", type=_kinds, default=fl.KINDS)
    s.add_argument("--mode", default="exact")
    s.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("scale", help="per-URL costs across layouts")
    c.add_argument("--layouts", default="2x2,4x3,8x4,16x8,32x16")
    c.add_argument("--pages", type=int, default=20000)
    c.add_argument("--sites", type=int, default=500)
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--stall-after", type=float, default=600.0)
    c.add_argument("--routing", choices=("home", "broadcast"), help="the centers' routing (default: exact mode's)")
    args = p.parse_args(argv)
    return schedules(args) if args.what == "schedules" else scale(args)


if __name__ == "__main__":
    sys.exit(main())

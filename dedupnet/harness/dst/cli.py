"""``dedupnet simulate``: many seeded fault schedules against the protocol's own cores,
in virtual time, each checked; a failure prints its seed, the command that replays it
and the story of the URLs it is about."""

from __future__ import annotations

import argparse
import sys
import time

from . import faults as fl
from .run import Result, replay_command, simulate, trace_of
from .world import DstConfig


def _fault(spec: str) -> fl.Fault:
    try:
        return fl.parse(spec)
    except (ValueError, KeyError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k for k in text.split(",") if k)
    bad = [k for k in kinds if k.lstrip("-") not in fl.KINDS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown fault kinds {bad} (known: {', '.join(fl.KINDS)})")
    if all(k.startswith("-") for k in kinds):  # "-wipe-host": every kind but these
        return tuple(k for k in fl.KINDS if "-" + k not in kinds)
    return kinds


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--networks", type=int, default=4, help="networks, each with a center (default 4)")
    p.add_argument("--hosts", type=int, default=3, help="hosts per network (default 3)")
    p.add_argument("--pages", type=int, default=2000, help="pages of the synthetic web (default 2000)")
    p.add_argument("--sites", type=int, default=20, help="sites of the synthetic web (default 20)")
    p.add_argument("--mode", choices=("exact", "paper"), default="exact",
                   help="exact (default): no URL admitted twice, checked; paper: the paper's look-ups only")
    p.add_argument("--seed", type=int, default=1, help="the first run's seed: web, schedule and run (default 1)")
    p.add_argument("--runs", type=int, default=1, help="runs, one per seed from --seed on (default 1)")
    p.add_argument("--faults", type=int, default=3, help="faults drawn per schedule (default 3; 0: none)")
    p.add_argument("--kinds", type=_kinds, default=fl.KINDS, metavar="K1,K2|-K1,-K2",
                   help="fault kinds to draw from (default all: " + ", ".join(fl.KINDS) +
                        "); a list of -KIND: all but those")
    p.add_argument("--fault", dest="schedule", action="append", type=_fault, metavar="SPEC",
                   help="an explicit fault instead of drawn ones (repeat): KIND:at=F,for=S,target=T, as a run prints "
                        "them (at: share of the reachable URLs fetched)")
    p.add_argument("--routing", choices=("home", "broadcast"),
                   help="exact mode: each URL to its site's home network (the default) or to every network")
    p.add_argument("--seed-urls", type=int, default=6, help="seed URLs the crawl starts from (default 6)")
    p.add_argument("--stall-after", type=float, default=DstConfig.stall_after, metavar="S",
                   help="virtual seconds without progress after the last fault that count as a stall "
                        "(default %(default)s)")
    p.add_argument("--costs", action="store_true", help="print each run's costs per URL fetched")
    p.add_argument("--no-trace", action="store_true", help="on a violation, do not replay it to print its trace")
    p.add_argument("--quiet", action="store_true", help="one line per failing run only, and the summary")


def config_of(args, seed: int) -> DstConfig:
    return DstConfig(networks=args.networks, hosts=args.hosts, pages=args.pages, sites=args.sites, seed=seed,
                     mode=args.mode, faults=args.faults, kinds=args.kinds, seeds=args.seed_urls,
                     schedule=tuple(args.schedule) if args.schedule else None, stall_after=args.stall_after,
                     routing=args.routing)


def line(r: Result) -> str:
    o = r.outcome
    return (f"seed {r.config.seed:>6}  {'ok  ' if r.ok else 'FAIL'}  trace {r.trace_hash}  "
            f"{r.virtual:8.1f} s virtual  {r.wall:6.2f} s  fetched {o.fetched}/{o.reachable}  "
            f"refetched {o.refetched}  faults: {' '.join(str(f) for f in r.schedule) or '-'}")


def report_failure(r: Result, out, trace: bool) -> None:
    for v in r.outcome.violations:
        print(f"    {v}", file=out)
    print(f"    replay: {replay_command(r.config, r.schedule)}", file=out)
    urls = next((v.urls[:2] for v in r.outcome.violations if v.urls), [])
    if trace and urls:
        print(f"    the story of {', '.join(urls)} (replayed from the seed):", file=out)
        for text in trace_of(r.config, urls):
            print(f"      {text}", file=out)
    elif trace:
        print("    the last steps:", file=out)
        for t, entry in r.recent[-25:]:
            print(f"      {t:10.3f}  {entry}", file=out)


def format_costs(c: dict) -> str:
    return (f"    per URL fetched ({c['urls_fetched']}): messages wan {c['messages_per_url']['wan']:.2f} "
            f"lan {c['messages_per_url']['lan']:.2f}, bytes wan {c['bytes_per_url']['wan']:.0f} "
            f"lan {c['bytes_per_url']['lan']:.0f}; look-ups center {c['center_lookups_per_url']:.2f} "
            f"host {c['host_lookups_per_url']:.2f}; transactions center {c['center_writes_per_url']:.2f} "
            f"host {c['host_writes_per_url']:.2f}; stored entries center {c['center_entries_per_url']:.2f} "
            f"host {c['host_entries_per_url']:.2f}; found->admitted p50 {c['admit_latency_p50'] or 0:.2f} s "
            f"p99 {c['admit_latency_p99'] or 0:.2f} s")


def run(args, out=None) -> int:
    out = out or sys.stdout  # at call time: a caller may have replaced it since import
    t0 = time.perf_counter()
    failed: list[int] = []
    virtual = 0.0
    for k in range(args.runs):
        r = simulate(config_of(args, args.seed + k))
        virtual += r.virtual
        if not r.ok:
            failed.append(r.config.seed)
        if not args.quiet or not r.ok:
            print(line(r), file=out, flush=True)
        if not r.ok:
            report_failure(r, out, trace=not args.no_trace and len(failed) <= 3)
        if args.costs:
            print(format_costs(r.costs), file=out)
    wall = time.perf_counter() - t0
    print(f"{args.runs} runs, {len(failed)} with violations{' (seeds ' + ' '.join(map(str, failed[:20])) + ')' if failed else ''}; "
          f"{args.runs / wall * 60:.0f} schedules/min, virtual time {virtual / wall:.0f}x real "
          f"({virtual:.0f} s in {wall:.1f} s)", file=out)
    return 1 if failed else 0

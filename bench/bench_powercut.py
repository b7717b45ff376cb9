"""The power-cut scenario, many times: every daemon's Redis on its own loop-mounted ext4,
every filesystem shut down without its journal's tail, every process killed, all started
again on what the disks kept (dedupnet/harness/powercut.py). Needs root.

    sudo .venv/bin/python bench/bench_powercut.py --runs 10
    sudo .venv/bin/python bench/bench_powercut.py --layout 2x2 --pages 500 --sites 8 --at 0.2,0.3,0.4,0.5,0.6 --runs 5

Run ``i`` uses seed ``first-seed + i`` (the web, and the fault) and the ``i``-th cut point
of ``--at`` (cycled). One Markdown row per run: pages in flight at the cut (the hosts'
crawlers, asked just before it), duplicate fetches (all, and those a host made again of
its own), lost URLs, whether every daemon came back by itself and the crawl completed.
A run passes with 0 lost, no invariant violation, duplicates within the pages in flight,
every daemon restarted and the crawl quiescent; the exit status is 1 if one did not.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.harness.faults import Fault  # noqa: E402
from dedupnet.harness.powercut import unavailable  # noqa: E402
from dedupnet.harness.report import SimConfig  # noqa: E402
from dedupnet.harness.simproc import DaemonFailed, simulate_processes  # noqa: E402


def one_run(url: str, networks: int, hosts: int, args, seed: int, at: float) -> dict:
    cfg = SimConfig(networks=networks, hosts=hosts, pages=args.pages, sites=args.sites, seed=seed,
                    timeout=args.timeout, durable_acks=not args.no_durable_acks,
                    faults=(Fault("power-cut", at=at, duration=args.down),))
    failed = None
    try:
        r = trio.run(functools.partial(simulate_processes, cfg, url, out=io.StringIO()))
    except* DaemonFailed as group:  # a daemon that did not come back: the run failed, the loop goes on
        failed = str(group.exceptions[0]).splitlines()[0]
    if failed is not None:
        return {"seed": seed, "at": at, "failed": failed}
    (fault,) = r.faults or [{}]
    restarted = fault.get("note", "").endswith("all restarted")
    in_flight = fault.get("in_flight")
    ok = (r.lost_urls == 0 and r.invariant_violations == 0 and not r.timed_out and restarted
          and in_flight is not None and r.duplicate_fetches <= in_flight)
    return {"seed": seed, "at": at, "urls": r.reachable_urls, "in_flight": in_flight,
            "duplicates": r.duplicate_fetches, "same_host": r.refetched_after_kill, "lost": r.lost_urls,
            "violations": r.invariant_violations, "restarted": restarted, "completed": not r.timed_out,
            "wall": round(r.wall_time, 1), "ok": ok}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layout", default="2x3", help="NETWORKSxHOSTS (default 2x3)")
    p.add_argument("--pages", type=int, default=3000)
    p.add_argument("--sites", type=int, default=30)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--at", default="0.4", help="comma-separated cut points, shares of the URLs fetched (cycled)")
    p.add_argument("--down", type=float, default=1.0, help="seconds the machines stay off")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--no-durable-acks", action="store_true", help="the daemons without durable acknowledgements")
    p.add_argument("--out", help="write every run as JSON")
    args = p.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        print(f"cannot cut the power here: {reason}", file=sys.stderr)
        return 2
    networks, hosts = (int(x) for x in args.layout.lower().split("x"))
    cuts = [float(a) for a in args.at.split(",")]
    runs = []
    print("| seed | cut at | URLs | in flight | duplicates (same host) | lost | violations | all restarted | "
          "completed | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    with EmbeddedRedis() as url:  # the daemons run their own; this one only holds the seeds
        for i in range(args.runs):
            run = one_run(url, networks, hosts, args, args.first_seed + i, cuts[i % len(cuts)])
            runs.append(run)
            if "failed" in run:
                print(f"| {run['seed']} | {run['at']:g} | FAILED: {run['failed']} |", flush=True)
                continue
            print(f"| {run['seed']} | {run['at']:g} | {run['urls']:,} | {run['in_flight']} | {run['duplicates']} "
                  f"({run['same_host']}) | {run['lost']} | {run['violations']} | "
                  f"{'yes' if run['restarted'] else 'NO'} | {'yes' if run['completed'] else 'NO'} | "
                  f"{run['wall']} |", flush=True)
    passed = sum(1 for r in runs if r.get("ok"))
    print(f"\n{passed} of {len(runs)} runs passed", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(runs, indent=1))
    return 0 if passed == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Every process fault of `dedupnet sim --processes`, on real daemon processes, seeds 1-3: the table of docs/BENCHMARKS.md.

    .venv/bin/python bench/bench_faults.py --layout 3x3 --pages 3000 --seeds 1,2,3 --out faults.json

Each row is one ``dedupnet sim --processes --fault KIND:at=AT`` run (target drawn from the
seed, duration the kind's default: dedupnet/harness/faults.py), one after the other, each with its
own daemons and keys on one embedded Redis (``kill-redis`` runs start their own, which
they kill). Printed as a Markdown table: duplicate fetches (all, and those a killed host
made again by itself), lost URLs, violations of the harness's invariant, quiescence, wall
time of the crawl.
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
from dedupnet.harness.faults import PROCESS_FAULTS, Fault  # noqa: E402
from dedupnet.harness.report import SimConfig  # noqa: E402
from dedupnet.harness.simproc import simulate_processes  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layout", default="3x3")
    p.add_argument("--pages", type=int, default=3000)
    p.add_argument("--sites", type=int, default=30)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--kinds", default="none," + ",".join(PROCESS_FAULTS),
                   help="comma-separated; 'none' is the run without a fault")
    p.add_argument("--at", type=float, default=0.3, help="share of the URLs fetched when the fault starts")
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--out", help="write every report as JSON")
    args = p.parse_args(argv)
    networks, hosts = (int(x) for x in args.layout.lower().split("x"))
    rows, reports = [], []
    print("| fault | seed | target | duplicates (re-fetched after kill) | lost | violations | quiescent | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    with EmbeddedRedis() as url:
        for kind in args.kinds.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                faults = () if kind == "none" else (Fault(kind, at=args.at),)
                cfg = SimConfig(networks=networks, hosts=hosts, pages=args.pages, sites=args.sites, seed=seed,
                                timeout=args.timeout, faults=faults)
                r = trio.run(functools.partial(simulate_processes, cfg, url, out=io.StringIO()))
                target = r.faults[0]["target"] if r.faults else "–"
                row = (f"| {kind} | {seed} | {target} | {r.duplicate_fetches} ({r.refetched_after_kill}) | "
                       f"{r.lost_urls} | {r.invariant_violations} | {'yes' if not r.timed_out else 'NO'} | "
                       f"{r.wall_time:.1f} |")
                print(row, flush=True)
                rows.append(row)
                reports.append(r.to_json())
    if args.out:
        Path(args.out).write_text(json.dumps(reports, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

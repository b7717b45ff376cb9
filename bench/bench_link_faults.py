"""Link-fault scenarios: each one, exact mode, on the same web, seeds 1-3, one table.

    .venv/bin/python bench/bench_link_faults.py                      # 3x3, 3,000 pages, seeds 1-3
    .venv/bin/python bench/bench_link_faults.py --scenarios partition --seeds 1 --json out.json
    .venv/bin/python bench/bench_link_faults.py --processes         # every daemon its own process

Every run is ``dedupnet sim`` in one process (dedupnet/harness/sim.py ``simulate``) with one
fault of dedupnet/harness/relay.py (``SimConfig.faults``): when it starts and which links it
hits come from the seed (dedupnet/harness/relay.py ``schedule_link_faults``). With
``--processes`` every run is ``dedupnet sim --processes`` (dedupnet/harness/simproc.py: every
daemon its own OS process, the relays in the harness). One embedded Redis serves the
runs one after the other. Columns: duplicate fetches and lost URLs
(the web server's counts), whether the run reached quiescence, wall seconds from
seeding to quiescence, sets concluded incomplete, and what the relays did.
"""

from __future__ import annotations

from pathlib import Path
import argparse
import functools
import sys
from collections import Counter

import orjson
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.harness.faults import LINK_FAULTS, Fault  # noqa: E402
from dedupnet.harness.report import SimConfig  # noqa: E402
from dedupnet.harness.sim import simulate  # noqa: E402
from dedupnet.harness.simproc import simulate_processes  # noqa: E402


def relay_totals(report) -> str:
    if not report.links:
        return "-"
    total: Counter[str] = Counter()
    for counters in report.links.get("relays", {}).values():
        total.update(counters)
    resets = sum(v for k, v in total.items() if k.startswith("resets:"))
    parts = [f"{total['messages']:,} msgs"]
    for key, label in (("delayed", "delayed"), ("duplicated", "duplicated"), ("dropped", "lost+reset"),
                       ("refused", "refused")):
        if total[key]:
            parts.append(f"{total[key]:,} {label}")
    parts.append(f"{resets} resets")
    return ", ".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", default=",".join(LINK_FAULTS),
                   help="comma-separated link faults; 'none' is a clean run for comparison")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--networks", type=int, default=3)
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--pages", type=int, default=3000)
    p.add_argument("--sites", type=int, default=30)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", metavar="FILE", help="write every report")
    p.add_argument("--processes", action="store_true", help="every daemon its own process (dedupnet sim --processes)")
    args = p.parse_args(argv)
    rows, reports = [], []
    head = (f"| {'scenario':<16} | seed | {'link(s)':<26} | duplicates | lost | quiescent | wall s "
            f"| incomplete | relays |")
    with EmbeddedRedis() as url:
        for scenario in args.scenarios.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                cfg = SimConfig(networks=args.networks, hosts=args.hosts, pages=args.pages, sites=args.sites,
                                seed=seed, timeout=args.timeout,
                                faults=() if scenario == "none" else (Fault(scenario),))
                runner = simulate_processes if args.processes else simulate
                r = trio.run(functools.partial(runner, cfg, url, out=None))
                reports.append(r.to_json())
                fault = r.links["faults"][0] if r.links.get("faults") else scenario
                where = fault.split(" on ", 1)[1].split(" at ")[0] if " on " in fault else "-"
                row = (f"| {scenario:<16} | {seed:>4} | {where:<26} | {r.duplicate_fetches:>10} | {r.lost_urls:>4} "
                       f"| {'no (timeout)' if r.timed_out else 'yes':<9} | {r.wall_time:>6.1f} "
                       f"| {r.sets_concluded_incomplete:>10} | {relay_totals(r)} |")
                rows.append(row)
                print(row, flush=True)
    print()
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    print("\n".join(rows))
    if args.json:
        with open(args.json, "wb") as f:
            f.write(orjson.dumps(reports, option=orjson.OPT_INDENT_2))
    bad = [r for r in reports if r["duplicate_fetches"] or r["lost_urls"] or r["timed_out"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""``dedupnet sim --chaos N``: N random fault schedules, one line each, and a summary.

Each schedule is drawn by :func:`dedupnet.harness.faults.chaos_schedule` from the chaos seed
(``--chaos-seed``, else ``--seed``) and printed as the ``--fault`` specs that run it
again on its own, so a failing schedule is one command to reproduce. Every schedule
crawls the same web (``--seed``) from scratch, with its own daemons and keys. A
schedule passes when the run reaches quiescence with 0 duplicate fetches, 0 lost URLs
and no violation of the harness's invariant (dedupnet.harness.crawlchecks.check_extracted).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time

import trio

from dedupnet.harness.faults import SET_UP_FAULTS, chaos_schedule
from dedupnet.harness.report import Report, SimConfig
from dedupnet.harness.sim import INPROCESS_FAULTS, simulate


def passed(r: Report) -> bool:
    return (not r.timed_out and r.duplicate_fetches == r.refetched_after_kill and not r.lost_urls
            and not r.invariant_violations)


def line(i: int, r: Report) -> str:
    specs = " ".join(f["spec"] for f in r.faults)
    state = "quiescent" if not r.timed_out else "NOT quiescent"
    verdict = "ok  " if passed(r) else "FAIL"
    return (f"{verdict} #{i:<3} dup {r.duplicate_fetches:>3} (own re-fetch {r.refetched_after_kill:>2})  "
            f"lost {r.lost_urls:>3}  viol {r.invariant_violations:>3}  "
            f"{state:<13} {r.wall_time:6.1f} s   {specs}")


def run_chaos(base: SimConfig, args) -> int:
    from dedupnet.adapters.storage.embedded import EmbeddedRedis

    seed = args.chaos_seed if args.chaos_seed is not None else base.seed
    if args.processes:
        from dedupnet.harness.simproc import SUPPORTED_FAULTS, simulate_processes
        kinds, runner = tuple(k for k in SUPPORTED_FAULTS if k not in SET_UP_FAULTS), simulate_processes
    else:
        kinds, runner = INPROCESS_FAULTS, simulate
    if not kinds:
        print("dedupnet sim --chaos: the one-process simulation has no faults yet; add --processes", file=sys.stderr)
        return 2
    try:
        schedules = chaos_schedule(seed, base.networks, base.hosts, args.chaos, kinds=kinds)
    except ValueError as e:
        print(f"dedupnet sim --chaos: {e}", file=sys.stderr)
        return 2
    print(f"-- chaos: {len(schedules)} schedules, chaos seed {seed}, {base.networks} x {base.hosts}, "
          f"{base.mode} mode, {base.pages:,} pages (web seed {base.seed}){' with --processes' if args.processes else ''}",
          flush=True)
    reports: list[Report] = []
    t0 = time.perf_counter()
    with contextlib.nullcontext(args.redis) if args.redis else EmbeddedRedis() as url:
        for i, schedule in enumerate(schedules):
            cfg = dataclasses.replace(base, faults=schedule)
            try:
                r = trio.run(functools.partial(runner, cfg, url, out=None))
            except ValueError as e:
                print(f"dedupnet sim --chaos: schedule #{i}: {e}", file=sys.stderr)
                return 2
            reports.append(r)
            print(line(i, r), flush=True)
            for v in r.invariant_examples[:5]:
                print(f"       {v}", flush=True)
    failed = [(i, r) for i, r in enumerate(reports) if not passed(r)]
    print(f"-- chaos seed {seed}: {len(reports) - len(failed)} of {len(reports)} schedules passed; "
          f"duplicates {sum(r.duplicate_fetches for r in reports)} (a killed host's own re-fetches "
          f"{sum(r.refetched_after_kill for r in reports)}), lost {sum(r.lost_urls for r in reports)}, "
          f"invariant violations {sum(r.invariant_violations for r in reports)}, "
          f"not quiescent {sum(r.timed_out for r in reports)}; wall {time.perf_counter() - t0:.1f} s "
          f"(runs {sum(r.wall_time for r in reports):.1f} s)")
    for i, r in failed:
        flags = " ".join(f"--fault {f['spec']}" for f in r.faults)
        print(f"   reproduce #{i}: dedupnet sim{' --processes' if args.processes else ''} --networks {base.networks} "
              f"--hosts {base.hosts} --pages {base.pages} --sites {base.sites} --seed {base.seed} {flags}")
    return 1 if failed else 0


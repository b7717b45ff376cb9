"""Benchmark: a center's sans-I/O core alone, its cost per event as its backlog grows.
No sockets, no Redis: the quiet, fair way to see what an event costs the center's CPU
when many sets wait (a slow or absent home network, hosts sending faster than sets
conclude). Two backlogs:

* ``routed``: N own sets wait in stage HOME for a home network that does not take
  them (10 URLs each; stored, as a restarted center resumes them); timed, sets of 10 URLs homed here, from a LAN host: each is two
  events (the frame, its look-up's result), admitted at once, so the backlog stays N.
* ``held``: ``max_in_flight`` sets wait for a LAN host that does not answer and N
  frames are held back (unacknowledged), up to 1,000 per host; timed, more frames held
  from a host of its own (one event each).

Prints microseconds per event at each backlog; with ``--baseline CHECKOUT``, the same
for that checkout's core side by side (each measured in a fresh interpreter, the two
alternating, the best of ``--rounds`` kept).

Run: ``.venv/bin/python bench/bench_center_backlog.py [--baseline ../base] [--backlogs 100,1000,10000]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("routed", "held")


def _num(network: int, host: int, seq: int) -> int:
    return seq << 32 | network << 16 | host


def _routed(backlog: int, timed: int) -> tuple[float, int]:
    from center_host.config import CenterConfig
    from center_host.events import Host, Joined, Lookup, LookupDone, Peer, Received, Resume
    from center_host.protocol import CenterProtocol
    from center_host.sets import SetRecord, Stage
    from dedupnet.codec.messages import FLAG_LOOKUP, Frame

    core = CenterProtocol(CenterConfig(network=1, lan="10.1.0.0/16", peers={2: "10.2.0.0/16"}, routing="home"))
    host = Host("10.1.0.10")
    home = core.homes.home_of if core.homes is not None else None
    assert home is not None
    urls: dict[int, list[str]] = {1: [], 2: []}
    i = 0
    while len(urls[1]) < timed * 10 or len(urls[2]) < backlog * 10:
        url = f"http://site{i}.example/p/{i}"
        urls[home(url)].append(url)
        i += 1
    # The backlog as a restarted center finds it (one event, the same for every core):
    # sets of 10 URLs each with network 2, their home, which does not take them.
    stored = []
    for k in range(backlog):
        batch = urls[2][k * 10:(k + 1) * 10]
        rec = SetRecord(Frame(dict.fromkeys(batch, 0), host.ip, _num(1, 10, k + 1), FLAG_LOOKUP), Stage.HOME,
                        host.ip, {"net:2"}, routes={2: batch})
        stored.append(rec.dump())
    core.handle(Resume(stored, {}))
    core.handle(Joined(host))
    core.handle(Joined(Peer(2)))

    def one_set(seq: int, batch: list[str]) -> None:
        number = _num(1, 10, seq)
        for action in core.handle(Received(host, Frame(dict.fromkeys(batch, 0), host.ip, number, 1))):
            if isinstance(action, Lookup):
                core.handle(LookupDone(number, False, [False] * len(action.urls)))

    assert len(core.stages.sets) == backlog, len(core.stages.sets)
    gc.collect()
    t0 = time.perf_counter()
    for k in range(timed):
        one_set(backlog + k + 1, urls[1][k * 10:(k + 1) * 10])
    elapsed = time.perf_counter() - t0
    assert len(core.stages.sets) == backlog
    return elapsed, 2 * timed


def _held(backlog: int, timed: int) -> tuple[float, int]:
    from center_host.config import CenterConfig
    from center_host.events import Host, Joined, Lookup, LookupDone, Received
    from center_host.protocol import CenterProtocol
    from dedupnet.codec.messages import Frame

    core = CenterProtocol(CenterConfig(network=1, lan="10.1.0.0/16", routing="broadcast", local_lookup="lan"))
    core.handle(Joined(Host("10.1.0.2")))  # asked about every set, never answers
    core.handle(Joined(Host("10.1.0.3")))
    seq = 0

    def frame_from(host_id: int) -> None:
        nonlocal seq
        seq += 1
        ip = f"10.1.{host_id >> 8}.{host_id & 255}"
        for action in core.handle(Received(Host(ip), Frame({f"http://s{seq}.example/": 0}, ip, _num(1, host_id, seq), 1))):
            if isinstance(action, Lookup):
                core.handle(LookupDone(action.number, False, [False] * len(action.urls)))

    for _ in range(core.config.max_in_flight):
        frame_from(3)
    for k in range(backlog):
        frame_from(100 + k // 1000)
    assert len(core.stages.waiting) == backlog
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(timed):
        frame_from(99)
    elapsed = time.perf_counter() - t0
    assert len(core.stages.waiting) == backlog + timed
    return elapsed, timed


def child(scenario: str, backlog: int, timed: int) -> None:
    elapsed, events = (_routed if scenario == "routed" else _held)(backlog, timed)
    print(json.dumps({"us_per_event": elapsed / events * 1e6}))


def measure(checkout: Path, scenario: str, backlog: int, timed: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run([sys.executable, __file__, "--child", scenario, str(backlog), str(timed)], env=env,
                         cwd=checkout, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out.splitlines()[-1])["us_per_event"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, help="a checkout to measure side by side (e.g. a git worktree of main)")
    ap.add_argument("--backlogs", default="100,1000,10000", help="backlogs, comma-separated (default 100,1000,10000)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="routed,held (default both)")
    ap.add_argument("--timed", type=int, default=1000, help="sets (routed) or frames (held) timed per run (default 1000)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per checkout and backlog, best kept (default 3)")
    ap.add_argument("--child", nargs=3, metavar=("SCENARIO", "BACKLOG", "TIMED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    checkouts = {"this": ROOT, **({"base": args.baseline.resolve()} if args.baseline else {})}
    backlogs = [int(b) for b in args.backlogs.split(",")]
    print(f"{'scenario':<8} {'backlog':>8}  " + "  ".join(f"{name + ' µs/event':>15}" for name in checkouts)
          + ("  base/this" if args.baseline else ""))
    for scenario in args.scenarios.split(","):
        for backlog in backlogs:
            best = {name: float("inf") for name in checkouts}
            for r in range(args.rounds):
                order = list(checkouts.items())
                for name, path in order if r % 2 == 0 else reversed(order):
                    best[name] = min(best[name], measure(path, scenario, backlog, args.timed))
            ratio = f"  {best['base'] / best['this']:9.2f}" if args.baseline else ""
            print(f"{scenario:<8} {backlog:>8,}  " + "  ".join(f"{best[n]:>15.1f}" for n in checkouts) + ratio,
                  flush=True)


if __name__ == "__main__":
    main()

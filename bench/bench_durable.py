"""What durable acknowledgements cost: ``dedupnet sim`` on a Redis with its AOF on, with
and without ``--durable-acks``, runs alternating so the machine's load hits all alike.

    .venv/bin/python bench/bench_durable.py --rounds 3
    .venv/bin/python bench/bench_durable.py --rounds 2 --sim-args "--networks 2 --hosts 2"

Each run gets a fresh embedded server (its own data dir) in one of these variants:

* ``everysec``: ``appendfsync everysec``, no waits (the daemons' server before durable
  acknowledgements);
* ``everysec+wait``: the same server, every daemon ``--durable-acks`` (``WAITAOF``
  after each event whose messages depend on its writes);
* ``always+wait``: ``appendfsync always`` (every write fsynced before its reply), and
  ``--durable-acks`` (each ``WAITAOF`` then finds its writes on disk already).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402

VARIANTS = {"everysec": ("everysec", False), "everysec+wait": ("everysec", True), "always+wait": ("always", True)}


def run_one(variant: str, sim_args: list[str], workdir: Path, index: int) -> dict:
    fsync, wait = VARIANTS[variant]
    data_dir = workdir / f"{variant}-{index}"
    out = workdir / f"{variant}-{index}.json"
    with EmbeddedRedis(persistent=True, data_dir=data_dir, config={"appendfsync": fsync}) as url:
        # The light workload its table was measured with; the wait for the disk is the variable.
        argv = [sys.executable, "-m", "dedupnet.cli", "sim", "--redis", url, "--json", str(out), "--light", *sim_args]
        argv.append("--durable-acks" if wait else "--no-durable-acks")
        proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"{variant}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    r = json.loads(out.read_text())
    return {"variant": variant, "wall_time": r["wall_time"], "pages_per_s": r["pages_per_s"],
            "latency_p50": r["latency_p50"], "latency_p99": r["latency_p99"], "lost": r["lost_urls"],
            "duplicates": r["duplicate_fetches"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="runs of each variant (default 3)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated (default: all)")
    p.add_argument("--sim-args", default="", help="more `dedupnet sim` arguments, e.g. \"--pages 10000\"")
    p.add_argument("--out", metavar="FILE", help="write every run as JSON")
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    runs = []
    with tempfile.TemporaryDirectory(prefix="dedupnet-bench-durable-") as tmp:
        for i in range(args.rounds):
            for variant in variants:
                run = run_one(variant, shlex.split(args.sim_args), Path(tmp), i)
                runs.append(run)
                print(f"round {i + 1} {variant:<14} wall {run['wall_time']:6.1f} s  {run['pages_per_s']:6.1f} pages/s  "
                      f"p50 {run['latency_p50']:.3f} s  p99 {run['latency_p99']:.3f} s  lost {run['lost']}  "
                      f"duplicates {run['duplicates']}", flush=True)
    print(f"\n{'variant':<14} {'wall s (median)':>16} {'pages/s':>8} {'p50 s':>7} {'p99 s':>7}   runs")
    for variant in variants:
        mine = [r for r in runs if r["variant"] == variant]
        med = {k: statistics.median(r[k] for r in mine) for k in ("wall_time", "pages_per_s", "latency_p50", "latency_p99")}
        print(f"{variant:<14} {med['wall_time']:16.1f} {med['pages_per_s']:8.1f} {med['latency_p50']:7.3f} "
              f"{med['latency_p99']:7.3f}   " + ", ".join(f"{r['wall_time']:.1f}" for r in mine))
    if args.out:
        Path(args.out).write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

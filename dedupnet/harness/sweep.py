"""The topology sweep: the same web and seed crawled by 2x2, 3x3, 5x5, 8x4 ... networks x
hosts, one simulation after the other, in one table — is the cost per URL flat as the
layout grows, and is it still exact (no duplicate fetch, no lost URL)?

Each simulation is its own ``python -m dedupnet.cli sim ... --json FILE`` process (its
own embedded Redis), so this checkout and another one (``--baseline-python``: the
interpreter of a checkout with its own venv, e.g. of main) are run and read the same
way, and one layout cannot leave anything behind for the next. Both runs of a layout
go one after the other (baseline first), so a change of machine load hits both alike.

The other checkout's report may lack figures this one has (an older ``sim``): those
are printed ``n/a``. Options of this checkout's ``sim`` that the other may not have go
in ``--sim-args`` (this checkout only); ``--processes``, ``--routing``, ``--weight``,
``--web-latency`` and ``--concurrency`` go to both (the workload must be the same on
both sides; a checkout without one of them fails its runs, with its error shown).

The workload is the light one on both sides (``THIS_SIDE``: this checkout is given
``--light``; an older checkout runs it by default), over the classic web of 30 sites
unless ``--sites`` says otherwise: the table is about what de-duplication costs as the
layout grows, not about politeness (``dedupnet sim`` alone reports that).

Seeds: every run is given ``--seeds max(seeds, networks)``, both sides, so both crawl
the same ground truth and (in this checkout) every network starts with a seed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_LAYOUTS = "2x2,3x3,5x5,8x4"

#: (key, heading, width, format); the figures of one run, as :func:`figures` gives them.
COLUMNS = [
    ("wall_s", "wall s", 8, ".1f"),
    ("pages_per_s", "pages/s", 9, ",.0f"),
    ("scale", "vs 1st", 7, ".2f"),
    ("frames_per_url", "frames/URL", 11, ".3f"),
    ("bytes_per_url", "bytes/URL", 10, ",.0f"),
    ("set_fill", "set fill", 9, ".1f"),
    ("p50_ms", "p50 ms", 8, ",.0f"),
    ("p99_ms", "p99 ms", 8, ",.0f"),
    ("incomplete", "incompl", 8, ",d"),
    ("duplicates", "dups", 6, ",d"),
    ("lost", "lost", 6, ",d"),
    ("cpu_ms_per_1k", "CPU ms/1k", 10, ",.0f"),
    ("cpu_ms_per_page", "CPU ms/page", 12, ",.2f"),
    ("redis_b_per_url", "Redis B/URL", 12, ",.0f"),
    ("busiest_share", "busiest", 8, ".2f"),
    ("busiest_x_l", "xL", 6, ".2f"),
    ("host_max_mean", "host max/mean", 14, ".2f"),
    ("multi_host_sites", "sites >1 host", 14, ",d"),
    ("hosts_per_site_1s", "hosts/site/s", 13, ",d"),
]
#: Columns where this/main is a meaningful ratio (the rest are counts that should be 0).
RATIO = {"wall_s", "pages_per_s", "frames_per_url", "bytes_per_url", "set_fill", "p50_ms", "p99_ms",
         "cpu_ms_per_1k", "cpu_ms_per_page", "redis_b_per_url", "busiest_x_l", "host_max_mean"}
#: What the columns mean, printed under the table.
LEGEND = ("bytes/URL: bytes on the wire per distinct URL; CPU ms/1k: center CPU per 1,000 admitted URLs; "
          "CPU ms/page: every process of the run per request to the web; "
          "p99 ms: discovery -> admission; busiest: the busiest network's share of pages fetched (xL: times the "
          "number of networks, 1.00 = even); host max/mean: pages per host; sites >1 host: sites fetched by more "
          "than one host; hosts/site/s: the most hosts on one site within 1 s (the last five from the web's log)")


def parse_layouts(text: str) -> list[tuple[int, int]]:
    """``"2x2,3x3,8x4"`` -> ``[(2, 2), (3, 3), (8, 4)]`` (networks x hosts per network)."""
    layouts = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        try:
            n, h = (int(x) for x in part.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"layout {part!r} is not NETWORKSxHOSTS (e.g. 3x3)") from None
        if not (1 <= n <= 250 and 1 <= h <= 200):
            raise argparse.ArgumentTypeError(f"layout {part!r}: 1..250 networks, 1..200 hosts per network")
        layouts.append((n, h))
    if not layouts:
        raise argparse.ArgumentTypeError("no layout given")
    return layouts


def figures(report: dict) -> dict:
    """One run's row, from its JSON report; None for what that report does not have (an
    older checkout's) and what the run could not measure (latency with --processes)."""
    found = report.get("urls_found") or 0
    distinct = report.get("reachable_urls") or 0
    frames = sum((report.get("frames") or {}).values())

    def ms(key):
        v = report.get(key)
        return None if v is None else v * 1000

    frames_per_url = report.get("frames_per_url")
    if frames_per_url is None and found:
        frames_per_url = frames / found
    bytes_per_url = report.get("bytes_per_url")
    if bytes_per_url is None and distinct:
        bytes_per_url = report.get("bytes_on_wire", 0) / distinct
    admitted = report.get("per_network_admitted") or {}
    share = report.get("busiest_network_share")
    networks = (report.get("config") or {}).get("networks")
    host_max, host_mean = report.get("pages_per_host_max"), report.get("pages_per_host_mean")
    return {
        "wall_s": report.get("wall_time"), "pages_per_s": report.get("pages_per_s"),
        "frames_per_url": frames_per_url, "bytes_per_url": bytes_per_url, "set_fill": report.get("set_fill"),
        "p50_ms": ms("latency_p50"), "p99_ms": ms("latency_p99"),
        "incomplete": report.get("sets_concluded_incomplete"), "duplicates": report.get("duplicate_fetches"),
        "lost": report.get("lost_urls"), "cpu_ms_per_1k": report.get("center_cpu_ms_per_1k_urls"),
        "cpu_ms_per_page": report.get("cpu_total_ms_per_page"),
        "redis_b_per_url": report.get("center_redis_bytes_per_url"),
        "busiest_share": share, "busiest_x_l": share * networks if share is not None and networks else None,
        "host_max_mean": host_max / host_mean if host_max is not None and host_mean else None,
        "multi_host_sites": report.get("sites_multi_host"), "hosts_per_site_1s": report.get("max_hosts_per_site_1s"),
        "timed_out": report.get("timed_out"), "max_url_pool": report.get("max_url_pool"),
        "networks_idle": sorted(k for k, v in admitted.items() if not v),
    }


def _cell(value, width: int, spec: str) -> str:
    if value is None:
        return f"{'n/a':>{width}}"
    if spec.endswith("d"):
        value = int(value)
    return f"{format(value, spec):>{width}}"


def format_table(runs: list[dict]) -> str:
    """One row per run (``main`` / ``this`` per layout when there is a baseline), plus a
    ``this/main`` ratio row per layout."""
    head = f"{'layout':<8}{'run':<10}" + "".join(f"{h:>{w}}" for _, h, w, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    sides = []
    for r in runs:
        if r["side"] not in sides:
            sides.append(r["side"])
    first = {}
    for r in runs:
        f = r.get("figures")
        if f and f.get("pages_per_s") and r["side"] not in first:
            first[r["side"]] = f["pages_per_s"]
    layouts = []
    for r in runs:
        if r["layout"] not in layouts:
            layouts.append(r["layout"])
    for layout in layouts:
        by_side = {r["side"]: r for r in runs if r["layout"] == layout}
        for side in sides:
            r = by_side.get(side)
            if r is None:
                continue
            f = dict(r.get("figures") or {})
            if not f:
                lines.append(f"{layout:<8}{side:<10}  FAILED: {r.get('error', 'no report')}")
                continue
            base = first.get(side)
            f["scale"] = f["pages_per_s"] / base if base and f.get("pages_per_s") else None
            note = "  TIMED OUT" if f.get("timed_out") else ""
            if f.get("networks_idle"):
                note += f"  idle: {','.join(f['networks_idle'])}"
            lines.append(f"{layout:<8}{side:<10}" + "".join(_cell(f.get(k), w, s) for k, _, w, s in COLUMNS) + note)
        if "main" in by_side and "this" in by_side and by_side["main"].get("figures") and by_side["this"].get("figures"):
            m, t = by_side["main"]["figures"], by_side["this"]["figures"]
            cells = []
            for k, _, w, _ in COLUMNS:
                ok = k in RATIO and m.get(k) and t.get(k) is not None
                cells.append(_cell(t[k] / m[k] if ok else None, w, ".2f") if k in RATIO else " " * w)
            lines.append(f"{layout:<8}{'this/main':<10}" + "".join(cells))
    return "\n".join(lines)


#: Options of this checkout's runs, before ``--sim-args``: the light workload (16 requests
#: per host, 4 per site, no per-site delay, no durable acks, the classic web), which is
#: what a checkout from before ``dedupnet sim`` ran as deployed runs by default, so that
#: both sides crawl alike and the growth of the de-dup cost is what the table shows.
THIS_SIDE = ["--light"]


def sim_argv(python: str, layout: tuple[int, int], args, json_path: Path, extra: list[str]) -> list[str]:
    n, h = layout
    argv = [python, "-m", "dedupnet.cli", "sim", "--networks", str(n), "--hosts", str(h), "--pages", str(args.pages),
            "--seed", str(args.seed), "--seeds", str(max(args.seeds, n)), "--timeout", str(args.timeout),
            "--json", str(json_path)]
    if args.sites is not None:
        argv += ["--sites", str(args.sites)]
    if args.mode is not None:
        argv += ["--mode", args.mode]
    if args.processes:
        argv.append("--processes")
    if args.routing is not None:
        argv += ["--routing", args.routing]
    for w in args.weights or ():
        argv += ["--weight", w]
    if args.web_latency:
        argv += ["--web-latency", str(args.web_latency)]
    if args.concurrency is not None:
        argv += ["--concurrency", str(args.concurrency)]
    return argv + extra


def _checkout_of(python: str) -> Path | None:
    """The checkout whose venv ``python`` is (``<checkout>/.venv/bin/python``), if it looks like one."""
    p = Path(python)
    if not p.is_absolute():
        return None
    for parent in p.parents:
        if (parent / "dedupnet" / "cli.py").is_file():
            return parent
    return None


def run_one(side: str, python: str, layout: tuple[int, int], args, extra: list[str], workdir: Path,
            out=sys.stdout) -> dict:
    n, h = layout
    name = f"{n}x{h}"
    json_path = workdir / f"{name}-{side}.json"
    argv = sim_argv(python, layout, args, json_path, extra)
    cwd = _checkout_of(python) or Path.cwd()
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # each interpreter imports its own checkout's dedupnet
    print(f"-- {name} {side}: {shlex.join(argv[1:])}  (in {cwd})", file=out, flush=True)
    t = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=args.timeout + 300)
    took = time.perf_counter() - t
    run = {"layout": name, "side": side, "argv": argv, "returncode": proc.returncode, "seconds": round(took, 1)}
    try:
        report = json.loads(json_path.read_text())
    except (OSError, ValueError):
        report = None
    if report is None:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        run["error"] = f"exit code {proc.returncode}, no report"
        print(f"   FAILED ({run['error']}):\n{tail}", file=out, flush=True)
        return run
    run["report"], run["figures"] = report, figures(report)
    f = run["figures"]
    print(f"   {took:.0f} s: {report.get('requests', 0):,} requests, {f['duplicates']} duplicates, {f['lost']} lost"
          + (", TIMED OUT" if f["timed_out"] else ""), file=out, flush=True)
    return run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench_topology.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", type=parse_layouts, default=parse_layouts(DEFAULT_LAYOUTS),
                   help=f"NETWORKSxHOSTS,... (default {DEFAULT_LAYOUTS})")
    p.add_argument("--pages", type=int, default=10_000, help="pages of the synthetic web (default 10,000)")
    p.add_argument("--sites", type=int, default=30,
                   help="sites of the synthetic web (default 30, the older tables' web; both checkouts)")
    p.add_argument("--seed", type=int, default=1, help="seeds the web and the runs (default 1)")
    p.add_argument("--seeds", type=int, default=6, help="seed URLs; at least one per network (default 6)")
    p.add_argument("--mode", choices=("exact", "paper", "owner"), help="sim's --mode (default: sim's, exact)")
    p.add_argument("--processes", action="store_true", help="every daemon its own process (both checkouts)")
    p.add_argument("--routing", choices=("home", "broadcast"), help="sim's --routing (both checkouts; default: sim's)")
    p.add_argument("--weight", dest="weights", action="append", metavar="NET=W",
                   help="sim's --weight (repeat; both checkouts)")
    p.add_argument("--web-latency", type=float, default=0.0, metavar="S",
                   help="sim's --web-latency (both checkouts; default 0)")
    p.add_argument("--concurrency", type=int, metavar="N", help="sim's --concurrency (both checkouts; default: sim's)")
    p.add_argument("--timeout", type=float, default=1800.0, help="each simulation gives up after this (default 1800 s)")
    p.add_argument("--python", default=sys.executable, help="this checkout's interpreter (default: this one)")
    p.add_argument("--baseline-python", metavar="PYTHON",
                   help="another checkout's interpreter (e.g. /work/base/.venv/bin/python): its runs are 'main'")
    p.add_argument("--sim-args", default="", metavar="ARGS",
                   help="more `dedupnet sim` options for this checkout's runs only, e.g. \"--set-size 200\"")
    p.add_argument("--out", metavar="FILE", help="write every run (reports and rows) as JSON")
    return p


def main(argv: list[str] | None = None, out=sys.stdout) -> int:
    args = build_parser().parse_args(argv)
    extra = shlex.split(args.sim_args)
    sides = ([("main", args.baseline_python, [])] if args.baseline_python else []) + [
        ("this", args.python, THIS_SIDE + extra)]
    runs = []
    with tempfile.TemporaryDirectory(prefix="dedupnet-sweep-") as tmp:
        for layout in args.layouts:
            for side, python, side_extra in sides:
                try:
                    runs.append(run_one(side, python, layout, args, side_extra, Path(tmp), out=out))
                except subprocess.TimeoutExpired:
                    runs.append({"layout": f"{layout[0]}x{layout[1]}", "side": side, "error": "did not finish"})
    workload = [f"--{k.replace('_', '-')} {v}" for k, v in (("routing", args.routing),
                ("web_latency", args.web_latency or None), ("concurrency", args.concurrency)) if v is not None]
    workload += [f"--weight {w}" for w in args.weights or ()]
    print(f"\nTopology sweep: {args.pages:,} pages, seed {args.seed}"
          + (", --processes" if args.processes else "") + "".join(f", {w}" for w in workload)
          + (f", this: {args.sim_args}" if extra else ""), file=out)
    print(format_table(runs), file=out)
    print(LEGEND, file=out, flush=True)
    if args.out:
        config = {k: v for k, v in vars(args).items() if k != "layouts"}
        config["layouts"] = [f"{n}x{h}" for n, h in args.layouts]
        Path(args.out).write_text(json.dumps({"config": config, "runs": runs}, indent=1))
    bad = [r for r in runs if "figures" not in r or r["figures"]["timed_out"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

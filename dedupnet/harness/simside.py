"""``dedupnet sim --baseline CHECKOUT`` (or ``--baseline-python PYTHON``): the same run
with another checkout's code and with this one's, side by side, every figure with
its ratio this / base.

Each run is its own ``python -m dedupnet.cli sim ... --json FILE`` process with its
own embedded Redis, given this command line less the options of the comparison; the
sides alternate (base first) ``--rounds`` times, so a change of the machine's load
hits both alike, and each figure is the median of its side's runs. ``--baseline``
runs the checkout's code with this interpreter (``PYTHONPATH``; e.g. a git worktree
of main), ``--baseline-python`` with the interpreter of the checkout's own venv.

A baseline whose report lacks a figure (an older ``sim``) shows ``n/a`` for it. One
figure never lacks: the CPU of the whole run, every process of it (the sim process
and what it started and reaped: Redis, the daemons), measured from here
(``RUSAGE_CHILDREN``), start-up and the ground truth's computation included, so it
is higher than the report's own "CPU per page", which counts from seeding to the end.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["run_side_by_side", "sim_argv_of", "format_side_by_side"]

#: Options of the comparison itself, with how many values each takes: not passed on.
OWN_OPTIONS = {"--baseline": 1, "--baseline-python": 1, "--rounds": 1, "--json": 1, "--plot": 1}
ROLES = ("hosts", "centers", "web", "harness", "redis")


def sim_argv_of(argv: list[str]) -> list[str]:
    """The ``sim`` command's arguments in ``argv`` (a ``dedupnet`` command line), less
    the comparison's own options."""
    if "sim" not in argv:
        raise ValueError("--baseline needs the command line of `dedupnet sim`")
    rest = argv[argv.index("sim") + 1:]
    out, skip = [], 0
    for arg in rest:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in OWN_OPTIONS:
            skip = 0 if "=" in arg else OWN_OPTIONS[name]
            continue
        out.append(arg)
    return out


def figures(report: dict | None, tree_cpu: float) -> dict[str, float | None]:
    """One run's figures, from its JSON report (None where it has none) and the CPU
    seconds of its whole process tree."""
    r = report or {}
    requests = r.get("requests") or 0
    per_role = r.get("cpu_ms_per_page") or {}

    def ms(key):
        v = r.get(key)
        return None if v is None else v * 1000

    out = {
        "wall s": r.get("wall_time"), "requests": requests or None, "pages/s": r.get("pages_per_s"),
        "CPU ms/page": r.get("cpu_total_ms_per_page"),
        **{f"  {role}": per_role.get(role) for role in ROLES},
        "whole run CPU ms/page": tree_cpu * 1000 / requests if requests else None,
        "center CPU ms/1k URLs": r.get("center_cpu_ms_per_1k_urls"),
        "Redis cmds/s": r.get("redis_commands_per_s"), "Redis cmds/page": r.get("redis_commands_per_page"),
        "p50 ms": ms("latency_p50"), "p99 ms": ms("latency_p99"),
        "frames/URL": r.get("frames_per_url"), "bytes/URL": r.get("bytes_per_url"),
        "duplicates": r.get("duplicate_fetches"), "lost": r.get("lost_urls"),
    }
    return out


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_one(python: str, checkout: str, argv: list[str], json_path: Path, *, use_path: bool, out) -> dict:
    """One run of ``sim`` with ``checkout``'s code; its figures."""
    env = dict(os.environ)
    if use_path:
        env["PYTHONPATH"] = checkout
    else:
        env.pop("PYTHONPATH", None)  # the interpreter's venv imports its own checkout
    cmd = [python, "-m", "dedupnet.cli", "sim", *argv, "--json", str(json_path)]
    before = _children_cpu()
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    tree = _children_cpu() - before
    try:
        report = json.loads(json_path.read_text())
    except (OSError, ValueError):
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        print(f"   {checkout}: no report (exit code {proc.returncode}):\n{tail}", file=out, flush=True)
        report = None
    return figures(report, tree)


def _cell(v: float | None, spec: str = ",.2f") -> str:
    return f"{'n/a':>12}" if v is None else f"{format(v, spec):>12}"


def format_side_by_side(base: list[dict], this: list[dict]) -> str:
    """The medians of each side's runs, and this / base."""
    lines = [f"{'':<24}{'base':>12}{'this':>12}{'this/base':>12}"]
    for key in (base or this)[0]:
        b = _median([r[key] for r in base])
        t = _median([r[key] for r in this])
        ratio = t / b if b and t is not None else None
        lines.append(f"{key:<24}{_cell(b)}{_cell(t)}{_cell(ratio, '.2f')}")
    return "\n".join(lines)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def run_side_by_side(args, argv: list[str] | None = None, out=sys.stdout) -> int:
    """``dedupnet sim --baseline ...``: both sides, ``args.rounds`` times each; 0 if
    every run was exact (no duplicate, nothing lost), else 1."""
    here = str(Path(__file__).resolve().parents[2])
    sim_argv = sim_argv_of(sys.argv if argv is None else argv)
    if args.baseline:
        base = (args.baseline_python or sys.executable, str(Path(args.baseline).resolve()), True)
    else:
        python = Path(args.baseline_python)
        checkout = next((p for p in python.parents if (p / "dedupnet" / "cli.py").is_file()), None)
        if checkout is None:
            print("dedupnet sim: --baseline-python: not the interpreter of a checkout's venv "
                  "(<checkout>/.venv/bin/python); give --baseline CHECKOUT", file=sys.stderr)
            return 2
        base = (str(python), str(checkout), False)
    sides = {"base": base, "this": (sys.executable, here, True)}
    runs: dict[str, list[dict]] = {"base": [], "this": []}
    with tempfile.TemporaryDirectory(prefix="dedupnet-sim-side-") as tmp:
        for i in range(max(1, args.rounds)):
            for name, (python, checkout, use_path) in sides.items():
                print(f"-- round {i + 1}, {name}: {checkout}: sim {' '.join(sim_argv)}", file=out, flush=True)
                f = run_one(python, checkout, sim_argv, Path(tmp) / f"{name}-{i}.json", use_path=use_path, out=out)
                runs[name].append(f)
                print(f"   {_cell(f['pages/s']).strip()} pages/s, {_cell(f['CPU ms/page']).strip()} ms CPU per page, "
                      f"p50 / p99 {_cell(f['p50 ms']).strip()} / {_cell(f['p99 ms']).strip()} ms, "
                      f"{f['duplicates']} duplicates, {f['lost']} lost", file=out, flush=True)
    print(f"\nSide by side: sim {' '.join(sim_argv)}; medians of {max(1, args.rounds)} runs per side, alternated",
          file=out)
    print(format_side_by_side(runs["base"], runs["this"]), file=out, flush=True)
    exact = all(r["duplicates"] == 0 and r["lost"] == 0 for rs in runs.values() for r in rs)
    return 0 if exact else 1

"""The center core benches docs/BENCHMARKS.md quotes ("A center's cost per event with a
backlog") keep running: a tiny run of each, against this tree as its own baseline."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> str:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_backlog_bench_prints_both_scenarios_side_by_side():
    out = run("bench/bench_center_backlog.py", "--baseline", str(ROOT), "--backlogs", "10,20", "--timed", "20",
              "--rounds", "1")
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("routed", "10"), ("routed", "20"), ("held", "10"), ("held", "20")]
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)


def test_home_cache_bench_counts_misses():
    out = run("bench/bench_home_cache.py", "--baseline", str(ROOT), "--sites", "100", "--urls", "2000",
              "--rounds", "1")
    assert "numbered   this" in out and "(5% missed)" in out and "bytes" in out

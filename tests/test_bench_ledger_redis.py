"""A short run of bench/bench_ledger_redis.py in the suite: the script keeps running, and
the layouts keep the order docs/BENCHMARKS.md "A center's ledger as bits" quotes (the
blocks alone a fraction of the text set, and below the blocks with fingerprints)."""

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_ledger_redis.py"


def test_bench_ledger_redis_prints_each_layouts_cost_per_url():
    out = subprocess.run([sys.executable, str(BENCH), "--urls", "20000", "--task", "500"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split("|") for line in out.stdout.splitlines()[1:]]
    assert len(rows) == 10 and rows[-1][0].strip() == "20,000"
    text, fingerprints, blocks = (float(cell.split(",")[1]) for cell in rows[-1][1:])
    assert 0 < blocks < 0.25 * text and blocks + 6 < fingerprints < text  # 8 B a fingerprint

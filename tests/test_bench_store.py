"""A short run of ``make bench``'s store benchmark (bench/bench_store.py) in the suite: the
script keeps running, and the figures docs/DECISIONS.md "Store" quotes keep their
shape (bucketed intsets a few bytes a URL, one plain set several times that)."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_store.py"


def test_bench_store_prints_bucketed_and_one_big_set_bytes():
    out = subprocess.run([sys.executable, str(BENCH), "--urls", "50000", "--batch", "5000", "--baseline-sample", "2000"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "(25,000 found)" in out.stdout  # half the checked URLs were stored
    buckets = float(re.search(r"Redis bytes per stored URL\s+([\d.]+)", out.stdout).group(1))
    one_set = float(re.search(r"one big set, same URLs\s+([\d.]+)", out.stdout).group(1))
    baseline = float(re.search(r"baseline SADD sha1-hex/URL .*\(([\d.]+) bytes/URL\)", out.stdout).group(1))
    assert 0 < buckets < 16  # intsets: 8 bytes a member, plus the keys
    assert one_set > 2 * buckets and baseline > 2 * buckets

"""A short run of the capacity bench (bench/bench_capacity.py): real daemons, each with
its own Redis, fed as crawlers write their links. The figures BENCHMARKS.md quotes come
from this script, so it must keep running, keep checking exactness from what it pushed,
and keep printing costs of a plausible size."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_capacity.py"

pytestmark = pytest.mark.slow  # six daemon processes and their Redis servers


def test_capacity_bench_admits_every_url_once_and_prints_its_costs():
    out = subprocess.run([sys.executable, str(BENCH), "--urls", "30000", "--sites", "3000", "--store-urls", "20000",
                          "--window", "10000", "--progress", "5"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(next(line for line in reversed(out.stdout.splitlines()) if line.startswith("{")))
    exact = summary["exact"]
    assert exact["distinct_pushed"] == 30_000
    assert exact["tasks_queued"] == 30_000
    assert exact["admitted_twice"] == exact["lost"] == exact["admitted_not_pushed"] == 0
    assert exact["missing_from_home_record"] == exact["in_another_centers_record"] == 0
    assert summary["admitted"] == 30_000
    assert 1.7 * 30_000 < summary["pushed"] < 2.3 * 30_000  # found twice on average
    assert "admitted twice 0, lost 0" in out.stdout
    roles = summary["final"]["roles"]
    # A center's exact record is 8 bytes a fingerprint in intsets; a host keeps each task's URL.
    assert 6 < roles["center"]["key_bytes_by_family"]["admitted"] < 16
    assert 8 < roles["center"]["key_bytes_per_url"] < 2000
    assert 30 < roles["host"]["key_bytes_per_url"] < 2000
    assert re.search(r"centers: CPU \d+ ms per 1,000 URLs .*Redis bytes per URL [\d.]+ keys", out.stdout)
    assert all(r > 0 for r in summary["admitted_per_s"].values())
    assert summary["store_bench"]["check_urls_per_s"] > 0
    assert summary["checkpoints"] and summary["timeline"]
    # Where each role's Redis time went: a center looks its record up and adds to it.
    first = summary["checkpoints"][0]["roles"]
    assert {"smismember", "sadd"} <= set(first["center"]["interval_redis_command_ms_per_1k"])
    assert all(ms > 0 for ms in first["host"]["interval_redis_command_ms_per_1k"].values())
    assert "their Redis since the last, ms/1k by command: centers " in out.stdout

"""A smoke run of bench/bench_frontier.py on a tiny web: the script runs its three
paths (dedupnet's crawler, the URLFrontier client, the Scrapy spider) to the end and
each row says the crawl was whole (no duplicate fetch, nothing missed), so a change
that breaks one side of the benchmark shows here rather than on the day it is run.
Nothing about speed is checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("grpc")
pytest.importorskip("grpc_tools")
pytest.importorskip("scrapy")

from dedupnet.harness import procplan  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "bench_frontier.py"


def test_the_benchmark_crawls_the_same_web_whole_on_all_three_paths(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--pages", "60", "--sites", "3", "--seeds", "2",
                          "--workers", "4", "--networks", "1", "--timeout", "60"],
                         capture_output=True, text=True, timeout=180, cwd=tmp_path, env=procplan.daemon_env())
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| path")]
    assert [r[0] for r in rows] == ["dedupnet crawler", "URLFrontier client", "Scrapy spider"], out.stdout
    pages = {r[2] for r in rows}
    assert len(pages) == 1 and int(pages.pop()) > 0, out.stdout  # the same web, all of it, on every path
    assert all(r[3] == "0" and r[4] == "0" for r in rows), out.stdout  # no duplicates, nothing missed

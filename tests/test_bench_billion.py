"""A short run of the billion-URL admitted-record benchmark (bench/bench_billion.py): the
script keeps running, its look-ups are checked answer by answer (and that check does
catch a wrong answer), and the bytes per URL it prints stay those of intsets."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from dedupnet.adapters.storage.store import ADMITTED

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_billion.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_billion", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_billion_small_run_is_exact_and_compact(tmp_path):
    summary_file = tmp_path / "summary.json"
    out = subprocess.run(
        [sys.executable, str(BENCH), "--urls", "200000", "--bucket-bits", "12", "--checkpoints", "100000",
         "--chunk", "50000", "--lookup-batches", "20", "--rounds", "1", "--json", str(summary_file)],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    printed = [float(b) for b in re.findall(r"CHECKPOINT [\d,]+: ([\d.]+) B/URL used_memory", out.stdout)]
    assert len(printed) == 2, out.stdout
    # 4,096 buckets of ~49 8-byte members: the members plus ~3 B/URL of keys.
    assert 8 < printed[-1] < 30
    summary = json.loads(summary_file.read_text())
    assert summary["reached"] == summary["checkpoints"][-1]["added"] == 200_000
    assert summary["wrong_answers"] == 0 and summary["aborted"] is None
    for cp in summary["checkpoints"]:
        assert cp["lookup"]["lookups"] == 20 * 1000 and cp["lookup"]["wrong"] == 0
        assert len(cp["side_by_side"]) == 1 and cp["side_ratio"] > 0
    assert summary["side_ratio"] > 0 and summary["early_ratio"] > 0


def test_bench_billion_lookup_counts_a_wrong_answer(redis_url, prefix):
    """A sampled fingerprint the record does not hold must come back counted as wrong:
    otherwise "0 wrong" in BENCHMARKS.md would say nothing."""
    bench = load_bench()
    record = bench.Record(redis_url, f"{prefix}:billion", 12, seed=5)
    try:
        record.insert(20_000)
        assert record.added == 20_000
        assert record.store.fp_contains(ADMITTED, bench.chunk_fps(5, 0, 20_000)).all()
        assert record.lookup(5, 1000)["wrong"] == 0
        record.sample.append(bench.chunk_fps(5, 99, 50_000))  # never inserted
        assert record.lookup(5, 1000)["wrong"] > 0
        assert not record.store.fp_contains(ADMITTED, np.array([1, 2, 3], dtype=np.uint64)).any()
    finally:
        record.store.delete_prefix()

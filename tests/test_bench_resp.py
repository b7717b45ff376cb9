"""The store's hand-packed RESP against redis-py's own pipeline (bench/bench_resp.py).

The benchmark that keeps the hand-packed RESP (docs/DECISIONS.md "Hand-written or a
library") compares like with like only if both ways send the same commands: the same
members under the same bucket keys. Here, on the session's Redis, each way reads what
the other wrote, so a packing that drifted from redis-py's encoding of the key layout
(member offset, bucket bits, key names) fails, and so would the benchmark's premise.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import redis

from dedupnet.adapters.storage.store import FINISH_URL

_spec = importlib.util.spec_from_file_location("bench_resp", Path(__file__).parent.parent / "bench" / "bench_resp.py")
bench_resp = importlib.util.module_from_spec(_spec)
sys.modules["bench_resp"] = bench_resp
_spec.loader.exec_module(bench_resp)


def test_store_and_redis_py_pipeline_read_each_others_writes(store, redis_url):
    client = redis.Redis.from_url(redis_url)
    try:
        rng = np.random.default_rng(11)
        mine, theirs, absent = (rng.integers(0, 2**64, size=3_000, dtype=np.uint64) for _ in range(3))
        mine[:2] = [0, 2**64 - 1]  # the extremes of bucket and member
        assert store.fp_add(FINISH_URL, mine) == len(mine)
        assert bench_resp.pipeline_op(client, store, "SADD", theirs) == len(theirs)
        # Each way sees the other's writes as present, and adds none of them again.
        assert bench_resp.pipeline_op(client, store, "SADD", mine) == 0
        assert store.fp_add(FINISH_URL, theirs) == 0
        query = np.concatenate([mine[:500], theirs[:500], absent[:500]])
        rng.shuffle(query)
        expected = np.isin(query, np.concatenate([mine, theirs]))
        assert np.array_equal(store.fp_contains(FINISH_URL, query), expected)
        assert np.array_equal(bench_resp.pipeline_op(client, store, "SMISMEMBER", query), expected)
    finally:
        client.close()

"""The optional Bloom-filter finish_URL (dedupnet/adapters/storage/bloom.py): sized as
specified, no false negatives, a measured false-positive rate near the configured one,
and in a crawl every false positive is a URL never crawled: a deliberately small filter
loses URLs (about as many as its rate predicts), a default-sized one loses none."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import trio

from dedupnet.adapters.storage.bloom import BloomSpec, attach, spec_from
from dedupnet.service.config import Settings
from dedupnet.harness.report import SimConfig
from dedupnet.harness.sim import simulate
from dedupnet.adapters.storage.store import FINISH_URL
from local_host.pools import HostPools


def fps(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**64, n, dtype=np.uint64)


def test_sizing_follows_the_textbook():
    spec = BloomSpec(1_000_000, 0.01)
    assert spec.bits == math.ceil(1_000_000 * math.log(100) / math.log(2) ** 2) == 9_585_059
    assert spec.hashes == 7
    assert spec.expected_rate(1_000_000) == pytest.approx(0.01, rel=0.05)
    pos = spec.positions(fps(1000, 1))
    assert pos.shape == (1000, 7) and int(pos.max()) < spec.bits
    assert len(set(pos[0].tolist())) == 7  # double hashing: k distinct positions
    with pytest.raises(ValueError):
        BloomSpec(0, 0.01)
    with pytest.raises(ValueError):
        BloomSpec(10, 1.5)
    assert spec_from(Settings()) is None
    assert spec_from(Settings(finish_url_filter="bloom", bloom_capacity=5, bloom_error_rate=0.1)) == BloomSpec(5, 0.1)
    with pytest.raises(ValueError, match="finish_url_filter"):
        Settings(finish_url_filter="cuckoo")


def test_no_false_negatives_and_the_measured_rate(store):
    spec = BloomSpec(20_000, 0.01)
    attach(store, spec)
    stored = fps(20_000, 1)
    assert store.fp_add(FINISH_URL, stored[:10_000]) == 10_000  # all new
    assert store.fp_add(FINISH_URL, stored[10_000:]) >= 9_950  # new, but for this batch's own FPs
    assert store.fp_add(FINISH_URL, stored[:500]) == 0
    assert store.fp_contains(FINISH_URL, stored).all()  # never a false negative
    fresh = fps(50_000, 2)  # seeded, and the positions a function of the fingerprint: the same rate every run
    rate = store.fp_contains(FINISH_URL, fresh).mean()
    assert 0.5 * spec.error_rate < rate < 2 * spec.error_rate, rate
    # bits in Redis strings, nothing in the intset buckets
    keys = sorted(k.decode() for k in store.redis.scan_iter(match=f"{store.prefix}:*")
                  if not k.endswith(b":fp_bucket_bits"))  # the store's layout record
    assert keys == [f"{store.prefix}:finish_URL:bloom:0"]
    assert store.redis.strlen(keys[0]) == math.ceil(spec.bits / 8)
    with pytest.raises(ValueError, match="cannot SREM"):
        store.fp_remove(FINISH_URL, stored[:1])


def test_the_host_pools_use_it_unchanged(store):
    attach(store, BloomSpec(1000, 0.001))
    pools = HostPools(store, exact=True)
    assert pools.finish(["http://a.example/", "http://b.example/"]) == 2
    from local_host import protocol as hp

    done = pools.lookup(hp.Lookup(("t", 1), ("http://a.example/", "http://c.example/"), 0))
    assert done.seen == [True, False]


def _crawl(redis_url, pages=500, **bloom):
    cfg = SimConfig(networks=2, hosts=2, pages=pages, sites=10, timeout=60, finish_url_filter="bloom", **bloom)
    return cfg, trio.run(functools.partial(simulate, cfg, redis_url, out=None))


def test_a_small_filter_loses_urls_and_never_duplicates(redis_url):
    """Each host's filter holds ~100 URLs or more against a capacity of 20: past a few
    dozen its rate nears 1. Every false positive drops a URL nobody crawls (the
    harness's invariant check: "extracted, never crawled"), and the pages only it links
    to with it; a false negative, which would be a duplicate fetch, never happens. At
    such a rate a crawl without a loss does not happen; how the losses compare with
    what a filter's rate predicts varies with which host crawls what, so that is
    measured over many crawls by ``bench/bench_bloom.py --crawls``."""
    cfg, r = _crawl(redis_url, bloom_capacity=20, bloom_error_rate=0.01)
    assert not r.timed_out and r.duplicate_fetches == 0  # never a duplicate: no false negatives
    assert r.lost_urls > 0 and r.invariant_violations > 0


def test_a_default_sized_filter_loses_nothing(redis_url):
    cfg, r = _crawl(redis_url, pages=300)
    assert not r.timed_out
    assert r.lost_urls == 0 and r.duplicate_fetches == 0 and r.fetched_urls == r.reachable_urls

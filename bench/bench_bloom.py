"""Redis bytes per URL and URLs/s of a host's finish_URL: the exact intset buckets
against the optional Bloom filter (dedupnet/adapters/storage/bloom.py), on the same embedded server, in
one process, one after the other.

For each: N URLs' fingerprints stored in batches of B (``SADD`` per bucket, or
``BITFIELD SET`` per segment), then N look-ups of which half are stored; the server's
``used_memory`` before and after gives bytes per URL; the measured false-positive rate
of the Bloom filter is printed next to its configured one.

    .venv/bin/python bench/bench_bloom.py --urls 1000000 --batch 10000

``--crawls R``: instead, R simulated crawls (2 networks x 2 hosts, 500 pages) with a
filter too small for them (capacity 100, rate 0.01): the URLs each lost to a false
positive against the count the filter's rate predicts. The suite checks only that
such a crawl loses URLs and fetches none twice; the ratio varies with which host
crawls what, so it is looked at here, over many runs.

    .venv/bin/python bench/bench_bloom.py --crawls 10
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import time

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.adapters.storage.bloom import BloomSpec, attach  # noqa: E402
from dedupnet.adapters.storage.embedded import EmbeddedRedis  # noqa: E402
from dedupnet.adapters.storage.store import FINISH_URL, Store  # noqa: E402


def run(url: str, name: str, spec: BloomSpec | None, stored: np.ndarray, fresh: np.ndarray, batch: int) -> dict:
    store = Store(url, f"bench-bloom-{name}")
    store.delete_prefix()
    attach(store, spec)
    before = store.used_memory()
    t = time.perf_counter()
    for i in range(0, len(stored), batch):
        store.fp_add(FINISH_URL, stored[i:i + batch])
    add_s = time.perf_counter() - t
    memory = store.used_memory() - before
    probe = np.concatenate([stored[: len(stored) // 2], fresh[: len(stored) // 2]])
    t = time.perf_counter()
    seen = np.concatenate([store.fp_contains(FINISH_URL, probe[i:i + batch]) for i in range(0, len(probe), batch)])
    check_s = time.perf_counter() - t
    half = len(stored) // 2
    assert seen[:half].all(), "a stored URL was not found"
    row = dict(name=name, bytes_per_url=memory / len(stored), add=len(stored) / add_s, check=len(probe) / check_s,
               fp_rate=float(seen[half:].mean()))
    store.delete_prefix()
    store.close()
    return row


def predicted_losses(cfg, report) -> float:
    """What the filters' rates predict: each URL a network admits looked up in the
    finish_URL of each host of its LAN (at most: the host that found it always, the
    others when the LAN is asked), each filter filling as its host crawls."""
    spec = BloomSpec(cfg.bloom_capacity, cfg.bloom_error_rate)
    expected = 0.0
    for ip, pages in report.per_host_pages.items():
        admitted = report.per_network_admitted[f"net:{int(ip.split('.')[2])}"]
        expected += admitted * float(np.mean([spec.expected_rate(x) for x in np.linspace(0, pages, 50)]))
    return expected


def crawls(url: str, runs: int) -> None:
    import functools

    import trio

    from dedupnet.harness.report import SimConfig
    from dedupnet.harness.sim import simulate

    print(f"{'run':>4} {'lost':>6} {'violations':>11} {'predicted':>10} {'ratio':>6} {'duplicates':>11}")
    for i in range(runs):
        cfg = SimConfig(networks=2, hosts=2, pages=500, sites=10, timeout=60, finish_url_filter="bloom",
                        bloom_capacity=100, bloom_error_rate=0.01, seed=i + 1)
        r = trio.run(functools.partial(simulate, cfg, url, out=None))
        expected = predicted_losses(cfg, r)
        print(f"{i + 1:>4} {r.lost_urls:>6} {r.invariant_violations:>11} {expected:>10.1f} "
              f"{r.invariant_violations / expected if expected else float('nan'):>6.2f} {r.duplicate_fetches:>11}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--urls", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--redis", metavar="URL", help="a server of your own (default: the embedded one)")
    p.add_argument("--crawls", type=int, metavar="R", help="R crawls with a too-small filter: losses against the rate")
    args = p.parse_args()
    if args.crawls:
        server = EmbeddedRedis() if not args.redis else None
        try:
            crawls(args.redis or server.start(), args.crawls)
        finally:
            if server is not None:
                server.stop()
        return
    rng = np.random.default_rng(1)
    stored = rng.integers(0, 2**64, args.urls, dtype=np.uint64)
    fresh = rng.integers(0, 2**64, args.urls, dtype=np.uint64)
    runs = [("exact (intset buckets)", None),
            ("bloom p=0.01", BloomSpec(args.urls, 0.01)),
            ("bloom p=0.001", BloomSpec(args.urls, 0.001)),
            ("bloom p=0.0001", BloomSpec(args.urls, 0.0001))]
    server = EmbeddedRedis() if not args.redis else None
    url = args.redis or server.start()
    try:
        rows = [run(url, name.split()[0] + str(i), spec, stored, fresh, args.batch) | {"label": name, "spec": spec}
                for i, (name, spec) in enumerate(runs)]
    finally:
        if server is not None:
            server.stop()
    print(f"finish_URL: {args.urls:,} URLs stored in batches of {args.batch:,}, then {args.urls:,} looked up "
          f"(half stored), one server, one process")
    print(f"{'':24} {'bytes/URL':>10} {'add URLs/s':>12} {'check URLs/s':>13} {'FP measured':>12} {'FP configured':>14} {'k':>3}")
    base = rows[0]
    for r in rows:
        spec = r["spec"]
        print(f"{r['label']:24} {r['bytes_per_url']:>10.2f} {r['add']:>12,.0f} {r['check']:>13,.0f} "
              f"{r['fp_rate']:>12.5f} {spec.error_rate if spec else 0:>14g} {spec.hashes if spec else '-':>3}")
    for r in rows[1:]:
        print(f"{r['label']}: {base['bytes_per_url'] / r['bytes_per_url']:.1f}x less memory, "
              f"add {r['add'] / base['add']:.2f}x, check {r['check'] / base['check']:.2f}x the exact sets' speed")


if __name__ == "__main__":
    main()

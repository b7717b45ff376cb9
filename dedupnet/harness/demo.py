"""``dedupnet demo``: local de-dup (paper §2.2) on a real Redis, shown step by step.

It makes a crawler-like stream of URLs (popular pages found again and again, cosmetic
variants of one URL, some junk), marks part of them as crawled earlier, and runs them through
what a local host does before anything leaves it: normalise and reject, push into
``URL_pool``, look up ``finish_URL``, group into ``URL_set``s, number and frame them.
"""

from __future__ import annotations

import random
import time
from contextlib import nullcontext

from dedupnet.adapters.storage.store_choice import store_for
from local_host.local_dedup import local_reduce
from local_host.pools import HostPools
from local_host.protocol import Forget

from dedupnet.codec import wire
from dedupnet.service.config import Settings
from dedupnet.adapters.storage.embedded import EmbeddedRedis
from dedupnet.codec.messages import FLAG_NEW_SET, Frame
from dedupnet.codec.numbers import host_id_from_ip, make_number, split_number
from dedupnet.adapters.storage.store import FINISH_URL, URL_POOL, Store
from dedupnet.codec.urls import URLGate, fingerprint_many

HOST_IP = "127.0.1.10"
LAN = "127.0.1.0/24"
NETWORK = 1


def crawler_like_urls(n: int, seed: int) -> list[str]:
    """Skewed popularity (a few pages found again and again) over 40 sites,
    cosmetic variants of one URL, and junk."""
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        roll = rnd.random()
        if roll < 0.02:
            out.append(rnd.choice(["mailto:a@b.example", "ftp://files.example/x", "http:///nohost",
                                   "javascript:void(0)", "http://long.example/" + "x" * 3000]))
            continue
        page = int((n // 2) * rnd.random() ** 3)
        site = page % 40
        url = f"http://site{site}.example/docs/{page}.html"
        if roll < 0.10:  # the same page, written differently
            url = rnd.choice([
                url.replace("http://site", "HTTP://SITE"),
                url.replace(".example/", ".example:80/"),
                url + "#section-2",
                url.replace("/docs/", "/docs/./"),
            ])
        out.append(url)
    return out


def run(settings: Settings, *, urls: int = 50_000, crawled_share: float = 0.3, seed: int = 1) -> int:
    with nullcontext(settings.redis_url) if settings.redis_url else EmbeddedRedis() as url:
        store = store_for(url, settings.prefix or f"dedupnet:demo:{HOST_IP}", bucket_bits=settings.bucket_bits)
        store.delete_prefix()
        try:
            return _run(store, settings, urls, crawled_share, seed)
        finally:
            store.delete_prefix()
            store.close()


def _walk(store: Store, pools: HostPools, settings: Settings) -> tuple[int, int, list[bytes], int | None]:
    """Steps 2-4: walk URL_pool, look up finish_URL, group into URL_sets, number, frame.
    Returns the URLs dropped as crawled and as repeats, the frames, and the first number."""
    crawled = repeated = 0
    frames: list[bytes] = []
    first_number = None
    host_id = host_id_from_ip(HOST_IP, LAN)
    batch_size = max(settings.set_size * 10, 10_000)
    while entries := pools.take(batch_size):
        ids = [eid for eid, _ in entries]
        batch = [u for _, u in entries]
        fps = fingerprint_many(batch)
        result = local_reduce(batch, fps, store.fp_contains(FINISH_URL, fps), settings.set_size)
        crawled += len(result.crawled)
        repeated += len(result.repeated)
        # Already crawled, or a repeat of a URL in this batch: they leave URL_pool now.
        pools.apply([Forget(tuple(ids[i] for i in result.crawled + result.repeated))])
        for seq, url_set in zip(store.next_sequences(len(result.url_sets)), result.url_sets):
            number = make_number(NETWORK, host_id, seq)
            first_number = first_number if first_number is not None else number
            frames.append(wire.encode(Frame(URL_set=url_set, IP=HOST_IP, number=number, flag=FLAG_NEW_SET)))
    return crawled, repeated, frames, first_number


def _run(store: Store, settings: Settings, n: int, crawled_share: float, seed: int) -> int:
    t0 = time.perf_counter()
    raw = crawler_like_urls(n, seed)
    gate = URLGate(max_length=settings.max_url_length)

    # Step 1 (§2.2): the crawler stores extracted URLs into URL_pool (normalised; junk never enters).
    pools = HostPools(store, exact=False)
    pools.setup()
    accepted = gate.accept(raw)
    store.stream_add(URL_POOL, accepted)  # normalised by the gate above: one round trip

    # Pretend an earlier crawl finished part of the distinct pages.
    distinct = sorted(set(accepted))
    rnd = random.Random(seed + 1)
    finished = [u for u in distinct if rnd.random() < crawled_share]
    store.fp_add(FINISH_URL, fingerprint_many(finished))

    round_trips0 = store.round_trips
    crawled, repeated, frames, first_number = _walk(store, pools, settings)
    elapsed = time.perf_counter() - t0
    sent = [url for f in frames for url in wire.decode_one(f).URL_set]
    in_sets, across_sets = len(sent), len(sent) - len(set(sent))
    pending = pools.sizes()[URL_POOL]

    rejected = ", ".join(f"{r} {c}" for r, c in gate.rejected.most_common()) or "none"
    net, host, seq = split_number(first_number) if first_number is not None else (0, 0, 0)
    print(f"""dedupnet demo: local de-dup (paper §2.2) on Redis {store.url}
host {HOST_IP} in LAN {LAN} (network {NETWORK}), set size {settings.set_size}

  URLs found by the crawler            {len(raw):>8,}
  rejected before URL_pool             {len(raw) - len(accepted):>8,}   ({rejected})
  pushed into URL_pool (normalised)    {len(accepted):>8,}   {len(distinct):,} distinct
  already in finish_URL (dropped)      {crawled:>8,}
  repeats within a batch (dropped)     {repeated:>8,}
  new URLs put in URL_sets             {in_sets:>8,}   {across_sets:,} of them repeat a URL of an earlier batch's set:
                                                 the center removes those (§2.3, exact mode)
  URL_sets framed with flag=1          {len(frames):>8,}   {sum(map(len, frames)):,} bytes on the wire
  first number                         {first_number}   (network {net}, host {host}, sequence {seq})
  still in URL_pool                    {pending:>8,}   (leave only when the center acknowledges; no center in this demo)
  Redis round trips for the look-ups   {store.round_trips - round_trips0:>8,}
  wall time                            {elapsed:>8.2f} s
""")
    expected = len(accepted) - crawled - repeated
    if in_sets != expected or pending != in_sets:
        print(f"INCONSISTENT: {in_sets} URLs in sets, {pending} pending, expected {expected}")
        return 1
    return 0

"""The URLFrontier service end to end: a crawl of the synthetic web by two networks of
real daemons, each host driven only through the URLFrontier API by the example client
(examples/urlfrontier/crawl.py: stubs from the stock .proto, httpx), checked against
the web's own request counts: every URL a correct crawl fetches, fetched once."""

from __future__ import annotations

import collections

import pytest

pytest.importorskip("grpc")
pytest.importorskip("grpc_tools")

from dedupnet.harness.frontiercrawl import crawl  # noqa: E402
from dedupnet.harness.report import SimConfig  # noqa: E402
from dedupnet.harness.cluster import host_ip  # noqa: E402


async def test_two_networks_crawled_through_the_urlfrontier_api_fetch_every_url_once(redis_url, prefix, tmp_path):
    cfg = SimConfig(networks=2, hosts=1, pages=400, sites=8, seed=3, seeds=4, set_size=50)
    run = await crawl(cfg, redis_url, prefix, tmp_path, path="frontier", workers=8, timeout=90)
    web = run.web
    assert not run.lost, f"{len(run.lost)} missed, e.g. {sorted(run.lost)[:5]}"
    assert not run.extra, f"fetched but not to be: {sorted(run.extra)[:5]}"
    dups = {u: web.answered_by[u] for u, c in web.answer_counts.items() if c > 1}
    assert web.duplicate_fetches() == 0, f"{len(dups)} fetched twice: {list(dups.items())[:5]}"
    # Both networks' clients crawled, each from its host's address; nobody else did.
    by_client = collections.Counter(ip for u in web.answered_by for ip in web.answered_by[u])
    assert set(by_client) == {host_ip(1, 0), host_ip(2, 0)}, by_client
    assert all(line.startswith("fetched ") for line in run.client_lines), run.client_lines

"""The synthetic web: determinism, graph shape, real HTTP serving, and ground truth
checked against a small crawler written here (real HTTP over loopback, httpx under trio)."""

from __future__ import annotations

import collections
import functools
import re
import statistics
import urllib.parse
import urllib.robotparser

import httpx
import pytest
import trio
import trio.testing

from dedupnet.codec.errors import BadURL
from dedupnet.codec.urls import normalize
from dedupnet.harness.web import SyntheticWeb, WebSpec, main, site_host

A_HREF = re.compile(r"""<a\b[^>]*?\bhref\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""", re.IGNORECASE)
BASE_HREF = re.compile(r"""<base\b[^>]*?\bhref\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""", re.IGNORECASE)
AGENT = "dedupnet-test"


def extract_links(page_url: str, body: bytes) -> list[str]:
    """What a simple crawler extracts: hrefs resolved against <base> (or the page URL),
    normalised; unresolvable or rejected hrefs are dropped."""
    text = body.decode("utf-8", "replace")
    base = page_url
    m = BASE_HREF.search(text)
    if m:
        base = urllib.parse.urljoin(page_url, next(g for g in m.groups() if g is not None))
    out = []
    for m in A_HREF.finditer(text):
        href = next(g for g in m.groups() if g is not None)
        try:
            out.append(normalize(urllib.parse.urljoin(base, href)))
        except (ValueError, BadURL):
            pass
    return out


def small_spec(seed: int = 3) -> WebSpec:
    return WebSpec(pages=300, sites=5, seed=seed)


async def start(nursery, spec: WebSpec) -> SyntheticWeb:
    web = SyntheticWeb(spec, port=0)
    with trio.fail_after(10):
        await nursery.start(functools.partial(web.serve, host_port=0))
    return web


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(follow_redirects=False, trust_env=False, timeout=10)


# ---------------------------------------------------------------------- no HTTP


def test_site_addresses():
    assert site_host(0) == "127.77.0.1"
    assert site_host(249) == "127.77.0.250"
    assert site_host(250) == "127.77.1.1"
    web = SyntheticWeb(WebSpec(pages=600, sites=260), port=8077)
    assert web.url(259) == "http://127.77.1.10:8077/"


def test_determinism():
    a, b = SyntheticWeb(WebSpec(), port=8077), SyntheticWeb(WebSpec(), port=8077)
    assert a.links == b.links and a.paths == b.paths and a.redirect_to == b.redirect_to
    assert a.site == b.site and a.flaky == b.flaky and a.seeds(5) == b.seeds(5)
    sample = [a.url(i) for i in range(0, a.spec.pages, 37)] + list(a.examples().values())
    for u in sample:
        assert a.expected_response(u) == b.expected_response(u), u
    assert a.reachable(a.seeds(3)) == b.reachable(b.seeds(3))
    c = SyntheticWeb(WebSpec(seed=1), port=8077)
    assert c.links != a.links
    assert [c.expected_response(u)[2] for u in sample] != [a.expected_response(u)[2] for u in sample]


def test_graph_shape():
    web = SyntheticWeb(WebSpec(), port=8077)
    st = web.stats()
    degrees = [len(out) for i, out in enumerate(web.links) if i >= web.spec.sites and out]
    assert st["max_out_degree"] >= 10 * statistics.median(degrees)
    assert 5 <= st["links"] / len(degrees) <= 10  # mean about mean_out_degree
    # dup_share: most discovered links are duplicates of a few popular targets.
    assert st["distinct_link_targets"] < 0.2 * st["links"]
    counts = collections.Counter(t for out in web.links for t in out)
    assert counts.most_common(1)[0][1] >= 50
    # cross-site links, 404 links, redirects, flaky and private pages all exist.
    cross = sum(1 for i, out in enumerate(web.links) for t in out
                if t >= 0 and web.site[t] != web.site[i])
    assert 0.15 < cross / st["links"] < 0.45
    assert st["missing_urls"] > 0 and any(t < 0 for out in web.links for t in out)
    assert st["redirects"] > 10 and st["flaky"] > 10 and st["private"] > 10
    assert len(web.reachable(web.seeds(5))) > 0.6 * st["pages"]


def test_html_carries_exactly_the_graph_links():
    """Every page's HTML, parsed by a crawler, yields the links the graph says
    (absolute, relative, root-relative, fragments, <base>, broken markup, odd links)."""
    web = SyntheticWeb(small_spec(), port=8077)
    for i in range(web.spec.pages):
        url = web.url(i)
        status, headers, body = web.expected_response(url)
        if status != 200 or dict(headers)[b"content-type"] != b"text/html; charset=utf-8":
            continue
        assert extract_links(url, body) == web.links_of(url), url
    odd = web.links_of(web.examples()["odd"])
    assert odd and all(u.startswith("http://127.77.") for u in odd)
    assert len(web.links_of(web.examples()["broken"])) > 0


def test_reachable_rules():
    web = SyntheticWeb(small_spec(), port=8077)
    seeds = web.seeds(2)
    full = web.reachable_detail(seeds)
    assert full.pages and full.missing and full.redirects and full.disallowed
    assert not (full.pages & full.missing) and not (full.pages & full.redirects)
    assert all("/private/" in u for u in full.disallowed)
    assert not any("/private/" in u for u in full.fetched)
    ex = web.examples()
    # the loop pair: both redirect, neither is a page; the chain ends at a page
    assert ex["loop"] in full.redirects
    assert web.redirect_of(web.redirect_of(ex["loop"])[1])[1] == ex["loop"]
    u = ex["chain"]
    for _ in range(3):
        assert u in full.redirects
        u = web.redirect_of(u)[1]
    assert u in full.pages
    no_robots = web.reachable_detail(seeds, obey_robots=False)
    assert not no_robots.disallowed and no_robots.pages > full.pages
    assert any("/private/" in u for u in no_robots.pages)
    d0 = web.reachable_detail(seeds, max_depth=0)
    assert d0.pages == set(seeds)
    d1 = web.reachable(seeds, max_depth=1)
    assert set(seeds) < d1 < full.pages


def test_cli_rejects_bad_spec():
    with pytest.raises(SystemExit):
        main(["--pages", "5", "--sites", "20"])


# ---------------------------------------------------------------------- serving


async def test_serving(nursery):
    web = await start(nursery, small_spec())
    ex = web.examples()
    with trio.fail_after(15):
        async with client() as c:
            r = await c.get(ex["home"])
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
            assert extract_links(ex["home"], r.content) == web.links_of(ex["home"])
            assert r.content == web.expected_response(ex["home"])[2]
            assert r.headers["content-length"] == str(len(r.content))

            r = await c.get(ex["missing"])
            assert r.status_code == 404

            r = await c.get(ex["redirect"])
            status, target = web.redirect_of(ex["redirect"])
            assert r.status_code == status in (301, 302)
            assert normalize(urllib.parse.urljoin(ex["redirect"], r.headers["location"])) == target

            flaky = ex["flaky"]
            for _ in range(web.spec.flaky_failures):
                assert (await c.get(flaky)).status_code == 503
            assert (await c.get(flaky)).status_code == 200
            assert (await c.get(flaky)).status_code == 200

            r = await c.get(web.origins[1] + "/robots.txt")
            assert r.status_code == 200 and r.headers["content-type"] == "text/plain"
            rp = urllib.robotparser.RobotFileParser()
            rp.parse(r.text.splitlines())
            assert not rp.can_fetch(AGENT, ex["private"]) and rp.can_fetch(AGENT, ex["html"])
            assert "crawl-delay" not in r.text.lower()

            r = await c.get(ex["huge"])
            assert r.status_code == 200 and len(r.content) > 3_000_000
            r = await c.get(ex["pdf"])
            assert r.status_code == 200 and r.headers["content-type"] == "application/pdf"
            r = await c.head(ex["html"])
            assert r.status_code == 200 and r.content == b"" and int(r.headers["content-length"]) > 0

            # un-normalised spellings are counted under the normalised URL
            r = await c.get(ex["html"].replace("/p", "/%70", 1))
            assert r.status_code == 200

    assert web.fetch_counts[ex["home"]] == 1
    assert web.fetch_counts[flaky] == web.spec.flaky_failures + 2
    assert web.answer_counts[flaky] == 2
    assert web.fetch_counts[ex["html"]] == 2  # HEAD + GET of the %70 spelling
    assert web.robots_fetches[web.origins[1] + "/robots.txt"] == 1
    assert sum(web.fetch_counts.values()) == 9 + web.spec.flaky_failures
    assert len(web.request_log) == sum(web.fetch_counts.values()) + 1
    assert {site for _, site, _, _ in web.request_log} <= set(web.hosts)
    assert web.duplicate_fetches() == 2  # flaky and html fetched twice after the 503s


async def test_keep_alive_and_bad_requests(nursery):
    web = await start(nursery, small_spec())
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(web.hosts[0], web.port)
        req = f"GET / HTTP/1.1\r\nHost: {web.hosts[0]}\r\n\r\n".encode()
        await stream.send_all(req + req)  # pipelined on one connection
        body = web.expected_response(web.url(0))[2]
        buf = b""
        while buf.count(body) < 2:
            buf += await stream.receive_some(65536)
        await stream.aclose()

        stream = await trio.open_tcp_stream(web.hosts[0], web.port)
        await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
        buf = b""
        while chunk := await stream.receive_some(65536):
            buf += chunk
        assert buf.startswith(b"HTTP/1.1 400")
        await stream.aclose()
    assert web.fetch_counts[web.url(0)] == 2


# ------------------------------------------------------------------ ground truth


async def crawl(web: SyntheticWeb, seeds: list[str], *, max_depth: int | None = None) -> dict[str, set[str]]:
    """A plain breadth-first crawler: robots.txt, 503 retries, redirects as new URLs."""
    found = {k: set() for k in ("pages", "missing", "redirects", "disallowed")}
    depth = {normalize(s): 0 for s in seeds}
    queue = collections.deque(depth)
    robots: dict[str, urllib.robotparser.RobotFileParser] = {}
    async with client() as c:
        while queue:
            url = queue.popleft()
            origin = url[: url.index("/", len("http://"))]
            if origin not in robots:
                rp = robots[origin] = urllib.robotparser.RobotFileParser()
                rp.parse((await c.get(origin + "/robots.txt")).text.splitlines())
            if not robots[origin].can_fetch(AGENT, url):
                found["disallowed"].add(url)
                continue
            for _ in range(5):
                r = await c.get(url)
                if r.status_code != 503:
                    break
            if r.status_code in (301, 302):
                found["redirects"].add(url)
                nxt = [normalize(urllib.parse.urljoin(url, r.headers["location"]))]
            elif r.status_code == 404:
                found["missing"].add(url)
                continue
            else:
                assert r.status_code == 200, (url, r.status_code)
                found["pages"].add(url)
                html = r.headers["content-type"].startswith("text/html")
                nxt = extract_links(url, r.content) if html else []
            if max_depth is not None and depth[url] >= max_depth:
                continue
            for v in nxt:
                if v not in depth:
                    depth[v] = depth[url] + 1
                    queue.append(v)
    return found


async def test_crawler_reaches_exactly_the_ground_truth(nursery):
    web = await start(nursery, small_spec())
    seeds = web.seeds(2)
    truth = web.reachable_detail(seeds)
    with trio.fail_after(30):
        found = await crawl(web, seeds)
    assert found["pages"] == truth.pages == web.reachable(seeds)
    assert found["missing"] == truth.missing
    assert found["redirects"] == truth.redirects
    assert found["disallowed"] == truth.disallowed
    # each URL fetched exactly once, flaky ones until they answered
    assert set(web.fetch_counts) == truth.fetched
    flaky = {u for u in truth.fetched if (i := web.lookup(u)) is not None and web.flaky[i]}
    assert flaky
    for u, n in web.fetch_counts.items():
        assert n == (web.spec.flaky_failures + 1 if u in flaky else 1), u
    assert web.duplicate_fetches() == 0
    assert set(web.robots_fetches.values()) == {1}
    # the special pages were met
    ex = web.examples()
    for k in ("huge", "pdf", "broken", "odd", "loop", "chain"):
        assert ex[k] in truth.fetched, k

    web.reset_counts()
    d1 = web.reachable_detail(seeds, max_depth=1)
    with trio.fail_after(30):
        found = await crawl(web, seeds, max_depth=1)
    assert found["pages"] == d1.pages and found["missing"] == d1.missing
    assert found["redirects"] == d1.redirects and found["disallowed"] == d1.disallowed
    assert len(d1.pages) < len(truth.pages)
    assert set(web.fetch_counts) == d1.fetched


async def test_latency_every_answer_waits_and_a_thousand_wait_at_once(autojump_clock):
    """Virtual time: 1,000 connections each ask once; every answer comes ``latency`` after
    its request, all at the same moment (serialised, the last would wait 1,000 x latency),
    and the log has each request at its arrival, with its client."""
    web = SyntheticWeb(small_spec(), port=0, latency=0.2)
    n, answered = 1000, []

    async def ask(k: int, nursery) -> None:
        client, server = trio.testing.memory_stream_pair()
        nursery.start_soon(web.serve_connection, server, 1, f"127.0.1.{k % 200}")
        t0 = trio.current_time()
        await client.send_all(f"GET / HTTP/1.1\r\nHost: {web.hosts[1]}\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := await client.receive_some(65536):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200 ")
        answered.append(trio.current_time() - t0)

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for k in range(n):
            nursery.start_soon(ask, k, nursery)
    assert len(answered) == n and all(abs(w - 0.2) < 1e-9 for w in answered)
    assert trio.current_time() - start == pytest.approx(0.2)
    assert len(web.request_log) == n and {t for t, *_ in web.request_log} == {start}
    assert {c for *_, c in web.request_log} == {f"127.0.1.{k}" for k in range(200)}
    with pytest.raises(ValueError, match="latency"):
        SyntheticWeb(small_spec(), latency=-1)

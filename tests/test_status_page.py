"""The live status page: ``/status.json`` of a real running center (real
Redis, real TCP, real HTTP on loopback) checked against what the center did, and the
page itself in a real headless browser (Debian's Chromium, ``--dump-dom`` after its
JavaScript has polled and drawn), skipped with the reason where no browser is found."""

import io
import os
import random
import re
import shutil

import httpx
import pytest
import trio

from dedupnet.harness.cluster import open_cluster
from dedupnet.adapters.monitor.status_page import by_label, key_family
from dedupnet.harness.simpage import SimStatus, serve_sim_status
from dedupnet.harness.web import SyntheticWeb, WebSpec

from .helpers import until

HTTP = ("127.0.0.1", 0)


def site_urls(tag, n):
    return [f"http://site{i % 5}.example/{tag}/{i}" for i in range(n)]


async def get_json(port: int) -> dict:
    async with httpx.AsyncClient(timeout=5) as client:
        r = await client.get(f"http://127.0.0.1:{port}/status.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.headers["cache-control"] == "no-store"
    return r.json()


async def test_status_json_reports_what_the_center_did(redis_url):
    """Network 2 is down: a set of network 1 waits for it in dist_reduce_pool (exact
    mode waits, docs/PROTOCOL.md §10), and the next one, less the 30 URLs the first one
    holds, gathers behind it in local_reduce_pool (R4: it goes once nothing is out). The JSON shows the members' liveness, the sets by stage and age, who they
    wait for, the duplicates dropped and the Redis memory; then the hosts go, network 2
    comes back, and the 40 URLs are admitted into task_URL with no host to take them."""
    # Broadcast routing, where every set waits for the network that is down (§10); what
    # home routing shows (waiting_for_networks) is checked in tests/test_homes.py.
    async with open_cluster(redis_url, 2, 2, set_size=100, prefix=f"page{random.random()}",
                            metrics=HTTP, routing="broadcast") as system:
        c1 = system.centers[1]
        h10, h11 = system.hosts["127.0.1.10"], system.hosts["127.0.1.11"]
        port2 = system.centers[2].port
        await system.kill("center2")
        await until(lambda: not c1.core.members.peers)
        shared, more = site_urls("shared", 30), site_urls("more", 10)
        started = trio.current_time()
        await h10.store.run(h10.pools.push, shared)
        await until(lambda: len(c1.core.stages.sets) == 1)
        await h11.store.run(h11.pools.push, shared + more)
        await until(lambda: len(c1.core.stages.sets) == 2 and c1.core.stages.gathering)  # R4: behind the one out (Nagle's rule)
        d = await get_json(c1.http_port)
        elapsed = trio.current_time() - started  # the sets' ages were taken before now, after they were stored
        assert d["role"] == "center" and d["network"] == 1 and d["mode"] == "exact"
        members = {m["member"]: m for m in d["liveness"]}
        assert set(members) == {"127.0.1.10", "127.0.1.11", "net:2"}
        assert members["net:2"] | {"address": None} == {
            "member": "net:2", "kind": "peer", "address": None, "state": "down", "silent": None,
            "waiting_sets": 1, "task_urls": 0}
        for ip in ("127.0.1.10", "127.0.1.11"):
            assert members[ip]["state"] == "live" and members[ip]["kind"] == "host"
            assert 0 <= members[ip]["silent"] <= 2 * d["heartbeat"]["interval"]
        assert d["waiting_for"] == {"net:2": 1}
        assert set(d["sets"]) == {"dist", "lan"}
        dist, lan = d["sets"]["dist"], d["sets"]["lan"]
        assert dist["count"] == 1 and dist["urls"] == 30 and sum(dist["ages"].values()) == 1
        assert lan["count"] == 1 and lan["urls"] == 10
        ages = [s["age"] for s in d["oldest_sets"]]
        assert ages == sorted(ages, reverse=True) and 0 <= ages[-1] <= ages[0] <= elapsed
        assert dist["oldest"] == ages[0]
        assert [(s["origin"], s["urls"], s["awaiting"]) for s in d["oldest_sets"]] == [
            ("127.0.1.10", 30, ["net:2"]), ("127.0.1.11", 10, [])]
        assert d["dropped"].get("center-record") == 30  # the second set's URLs held by the first
        assert d["admitted"]["total"] == 0 and d["task_URL_per_host"] == {}
        assert d["pools"]["dist_reduce_pool"] == 1 and d["pools"]["local_reduce_pool"] == 1
        assert d["redis_memory"]["dist_reduce_pool"] > 0 and d["redis_memory_error"] is None
        assert any(e["logger"] == "dedupnet.center" and "not connected" in e["message"] and e["level"] == "WARNING"
                   for e in d["recent_errors"])

        for ip in ("127.0.1.10", "127.0.1.11"):
            await system.kill(ip)
        await until(lambda: not c1.core.members.hosts)
        await system.start_center(2, 2, port=port2)
        await until(lambda: not c1.core.stages.sets and c1.core.members.peers)
        d = await get_json(c1.http_port)
        # The hosts that went stay listed, down (a center remembers its hosts until they
        # leave or are reassigned: a crawl whose work sits with a dead host is not finished).
        assert {m["member"]: m["state"] for m in d["liveness"]} == {
            "127.0.1.10": "down", "127.0.1.11": "down", "net:2": "live"}
        assert d["admitted"]["total"] == 40 and d["admitted"]["per_s"] > 0
        assert d["task_URL_per_host"] == {"": 40}  # admitted while no host was there (gap 8)
        assert d["sets"] == {} and d["waiting_for"] == {} and d["oldest_sets"] == []
        assert d["counters"]['urls_admitted'] == 40
        assert by_label(d["counters"], "sets_concluded", "complete") == {"true": 2}


async def test_http_endpoint_answers_metrics_page_and_errors(redis_url):
    """One endpoint: /metrics as before, the page (with its CSP), 404 naming the paths
    (counted); and the simulation's JSON over the same cluster: every center, every host."""
    async with open_cluster(redis_url, 2, 1, prefix=f"page{random.random()}", metrics=HTTP) as system:
        port = system.centers[1].http_port
        async with httpx.AsyncClient(timeout=5) as client:
            metrics = await client.get(f"http://127.0.0.1:{port}/metrics")
            assert metrics.status_code == 200 and "dedupnet_frames_sent_total" in metrics.text
            page = await client.get(f"http://127.0.0.1:{port}/")
            assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
            assert "default-src 'none'" in page.headers["content-security-policy"]
            assert b"status.json" in page.content and b"innerHTML" not in page.content
            missing = await client.get(f"http://127.0.0.1:{port}/nothing")
            assert missing.status_code == 404 and "/status.json" in missing.text
        assert system.centers[1].counters.get("http_errors", status="404") == 1
        host = await get_json(system.hosts["127.0.1.10"].http_port)
        assert host["role"] == "host" and host["connected"] is True and "redis_memory" in host

        web = SyntheticWeb(WebSpec(pages=30, sites=2, seed=1), port=0)
        sim = await SimStatus(system, web, {"networks": 2, "hosts": 1}).snapshot()
        assert [c["network"] for c in sim["centers"]] == [1, 2]
        assert [h["ip"] for h in sim["hosts"]] == ["127.0.1.10", "127.0.2.10"]
        assert all(h["connected"] and "counters" not in h for h in sim["hosts"])
        assert sim["progress"]["pages_fetched"] == 0 and "recent_errors" not in sim["centers"][0]


def test_key_family_drops_bucket_numbers():
    assert key_family("finish_URL:517") == "finish_URL"
    assert key_family("task_pool:fp:3") == "task_pool:fp"
    assert key_family("local_reduce_pool") == "local_reduce_pool"


# -- the page in a real browser --------------------------------------------------------
def find_browser() -> str | None:
    """``$DEDUPNET_TEST_BROWSER``, else Chromium or Chrome on the PATH. ``make test``
    installs Debian's chromium when it runs as root and it is missing (Makefile)."""
    named = os.environ.get("DEDUPNET_TEST_BROWSER")
    if named:
        return shutil.which(named)
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


def browser_command(browser: str, profile, url: str, *action: str) -> list[str]:
    """Headless, with nothing to reach but loopback: every name resolves to nothing
    except 127.0.0.1, and the browser's own background traffic is off."""
    return [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            f"--user-data-dir={profile}", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-default-apps", "--disable-extensions",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            # Virtual time runs the page's polls without waiting for them in real time.
            "--virtual-time-budget=3000", *action, url]


async def dump_dom(browser: str, profile, url: str) -> str:
    with trio.fail_after(60):
        done = await trio.run_process(browser_command(browser, profile, url, "--dump-dom"),
                                      capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode()


def row(dom: str, attr: str, value: str) -> str:
    m = re.search(rf'<tr [^>]*{attr}="{re.escape(value)}"[^>]*>.*?</tr>', dom, re.S)
    assert m, f"no row {attr}={value} in the page"
    return m.group(0)


def field(html: str, name: str) -> str:
    m = re.search(rf'data-field="{name}"[^>]*>([^<]*)<', html)
    assert m, f"no {name} in the page"
    return m.group(1)


@pytest.mark.skipif(find_browser() is None, reason="no Chromium or Chrome found (make test installs Debian's "
                    "chromium when it runs as root; or set DEDUPNET_TEST_BROWSER)")
async def test_page_in_a_headless_browser_shows_members_and_figures(redis_url, tmp_path):
    browser = find_browser()
    async with open_cluster(redis_url, 2, 2, set_size=50, prefix=f"page{random.random()}",
                            metrics=HTTP) as system:
        h = system.hosts["127.0.1.10"]
        await h.store.run(h.pools.push, site_urls("browser", 25))
        with trio.fail_after(20):
            await system.wait_quiescent()
        c1 = system.centers[1]
        dom = await dump_dom(browser, tmp_path / "profile", f"http://127.0.0.1:{c1.http_port}/")
        assert 'data-state="ok"' in dom and not re.search(r'data-polls="0"', dom)
        for ip in ("127.0.1.10", "127.0.1.11"):
            assert field(row(dom, "data-member", ip), "state") == "live"
        assert field(row(dom, "data-member", "net:2"), "state") == "live"
        # Each URL is admitted by its site's home network: center 1's page counts its share.
        own = sum(c1.core.homes.home_of(u) == 1 for u in site_urls("browser", 25))
        assert 0 < own < 25 and field(dom, "admitted-total") == str(own)
        assert field(dom, "members-live") == "3 / 3"
        assert 'data-family="admitted"' in dom  # Redis memory per key family
        assert "Network 1 — center 127.0.1.1" in dom

        # The simulation's page for the same system: both centers and the hosts on one page.
        web = SyntheticWeb(WebSpec(pages=30, sites=2, seed=1), port=0)
        async with trio.open_nursery() as nursery:
            during = serve_sim_status(HTTP, {"networks": 2, "hosts": 2, "mode": "exact"}, out=io.StringIO())
            port = await nursery.start(during, system, web)
            dom = await dump_dom(browser, tmp_path / "profile2", f"http://127.0.0.1:{port}/")
            nursery.cancel_scope.cancel()
        assert 'id="center-1"' in dom and 'id="center-2"' in dom
        assert field(dom, "admitted-total") == "25"  # the simulation's figure: both centers' sum
        assert "connected" in row(dom, "data-host", "127.0.2.11")


def test_http_flag_has_one_name():
    """``--http`` is the one name of the endpoint: there is no older release whose
    ``--metrics`` would need keeping, and two names for one setting is one too many."""
    from dedupnet.cli import build_parser
    from dedupnet.service.config import load_settings
    from dedupnet.service.daemons import http_endpoint

    def settings(*argv):
        args = build_parser().parse_args(["center", "--network", "1", *argv])
        return load_settings(**{k: v for k, v in vars(args).items() if k == "http"})

    assert http_endpoint(settings("--http", "127.0.0.1:9700")) == ("127.0.0.1", 9700)
    assert http_endpoint(settings("--http", "[::1]:1")) == ("::1", 1)
    assert http_endpoint(settings()) is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["center", "--network", "1", "--metrics", "0.0.0.0:9700"])


def test_sim_http_flag(capsys):
    """``dedupnet sim --http PORT`` (loopback) or ``HOST:PORT``; refused with --processes,
    whose centers are processes of their own, before anything starts."""
    from dedupnet.cli import build_parser, main

    assert build_parser().parse_args(["sim", "--http", "8080"]).http == ("127.0.0.1", 8080)
    assert build_parser().parse_args(["sim", "--http", "0.0.0.0:8080"]).http == ("0.0.0.0", 8080)
    assert main(["sim", "--http", "8080", "--processes"]) == 2
    assert "dedupnet center --http" in capsys.readouterr().err

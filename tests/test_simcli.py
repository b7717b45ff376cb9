"""``dedupnet sim`` as an operator runs it: the deployed daemons' politeness and durable
acknowledgements unless told otherwise, the real web's shape, its counts range-checked,
the pacing figures against the politeness bound, and one verdict line."""

import dataclasses
import hashlib
from collections import Counter

import pytest

from dedupnet.cli import build_parser, main
from dedupnet.codec.settings import SETTINGS
from dedupnet.codec.urls import site_of
from dedupnet.harness import pacing, simcli
from dedupnet.harness.report import SimConfig, format_report
from dedupnet.harness.sim import simulate
from dedupnet.harness.verdict import verdict
from dedupnet.harness.web import SyntheticWeb
from dedupnet.harness.webgraph import SHAPES, WebGraph, WebSpec


def config(*argv: str) -> SimConfig:
    return simcli.config_from(build_parser().parse_args(["sim", *argv]))


def test_sim_runs_with_the_declared_politeness_and_durable_acks_unless_told_otherwise():
    cfg = config()
    for name in ("concurrency", "per_site_concurrency", "per_site_delay", "durable_acks"):
        assert getattr(cfg, name) == SETTINGS[name].default, name
    assert cfg.web_shape == "real" and cfg.web_latency == simcli.REAL_WEB_LATENCY > 0
    light = config("--light")
    assert light.web_latency == 0
    assert (light.concurrency, light.per_site_concurrency, light.per_site_delay, light.durable_acks,
            light.web_shape) == (SimConfig.concurrency, SimConfig.per_site_concurrency, SimConfig.per_site_delay,
                                 False, "classic")
    given = config("--light", "--per-site-delay", "0.5", "--durable-acks", "--concurrency", "7")
    assert (given.per_site_delay, given.durable_acks, given.concurrency) == (0.5, True, 7)
    assert config("--no-durable-acks").durable_acks is False
    assert config("--web-shape", "classic").web_shape == "classic"


@pytest.mark.parametrize("argv, flag", [
    (["--networks", "0"], "--networks"), (["--networks", "-1"], "--networks"), (["--hosts", "0"], "--hosts"),
    (["--networks", "256"], "--networks"), (["--hosts", "246"], "--hosts"), (["--sites", "0"], "--sites"),
    (["--pages", "25", "--sites", "10"], "--pages"), (["--seeds", "0"], "--seeds"),
    (["--set-size", "0"], "--set-size"), (["--timeout", "0"], "--timeout"), (["--windows", "0"], "--windows"),
    (["--per-site", "-1"], "--per-site"), (["--per-site-delay", "-0.5"], "--per-site-delay"),
    (["--max-depth", "-1"], "--max-depth"), (["--answer-timeout", "0"], "--answer-timeout"),
    (["--chaos", "0"], "--chaos"),
    (["--bloom-capacity", "0"], "--bloom-capacity"), (["--bloom-error-rate", "1.5"], "--bloom-error-rate"),
    (["--redis-cluster", "0"], "--redis-cluster"), (["--timeout", "nan"], "--timeout"),
])
def test_every_count_and_size_is_range_checked_in_one_line(capsys, argv, flag):
    assert main(["sim", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"dedupnet sim: {flag} must"), err


def _graph_hash(spec: WebSpec) -> str:
    g = WebGraph(spec)
    return hashlib.sha256(repr((g.site, g.links, g.paths)).encode()).hexdigest()[:16]


def test_the_classic_web_is_drawn_as_before_and_the_real_one_has_the_real_shape():
    # Pinned from the checkout before shapes existed: the same spec, the same graph.
    assert _graph_hash(WebSpec()) == "5b8345d2f2702b49"
    assert _graph_hash(WebSpec.shaped("classic", pages=500, sites=8, seed=3)) == _graph_hash(
        WebSpec(pages=500, sites=8, seed=3))
    real = WebGraph(WebSpec.shaped("real", pages=6000, sites=300, seed=2))
    links = [(real.site[i], real.site[t]) for i, out in enumerate(real.links) for t in out if t >= 0]
    on_site = sum(a == b for a, b in links) / len(links)
    assert 0.82 <= on_site <= 0.9, on_site
    sizes = sorted(Counter(real.site).values(), reverse=True)
    assert sizes[0] > 15 * sizes[len(sizes) // 2], sizes[:5]  # a few big sites, many small ones
    classic = WebGraph(WebSpec(pages=6000, sites=300, seed=2))
    assert sorted(Counter(classic.site).values(), reverse=True)[0] < sizes[0] / 2
    with pytest.raises(ValueError, match="web shape"):
        WebSpec.shaped("flat")
    assert set(SHAPES) == {"classic", "real"}


def test_the_politeness_bound_of_a_site_is_its_requests_times_the_delay():
    web = SyntheticWeb(WebSpec(pages=200, sites=4, seed=1), port=8077)
    fetched = web.reachable_detail(web.seeds(4)).fetched
    n = pacing.site_requests(web, fetched)
    assert sum(n.values()) >= len(fetched) + 4  # every URL, and robots.txt per site
    cfg = SimConfig(networks=1, hosts=1, per_site_delay=0.25, per_site_concurrency=2, concurrency=32, web_latency=0.1)
    b = pacing.politeness_bound(cfg, web, fetched)
    big = max(n, key=n.get)
    assert b["sites"][big] == pytest.approx((n[big] - 1) * 0.25 + 0.1)
    assert b["bound"] == pytest.approx(max(b["sites"].values()), abs=1e-3)
    # Without a delay, the per-site bound and the slots decide.
    fast = pacing.politeness_bound(dataclasses.replace(cfg, per_site_delay=0.0, concurrency=1), web, fetched)
    assert fast["slots"] == pytest.approx(sum(n.values()) * 0.1, abs=1e-2) and fast["bound"] == fast["slots"]


def test_a_site_held_behind_another_is_late_on_its_own_bound():
    """A hand-made record of answers: the small site's pages come long after it had work."""
    web = SyntheticWeb(WebSpec(pages=200, sites=4, seed=1), port=8077)
    seeds = web.seeds(4)
    reach = web.reachable_detail(seeds)
    small = min({site_of(u) for u in reach.fetched}, key=lambda s: sum(site_of(u) == s for u in reach.fetched))
    for i, url in enumerate(sorted(reach.fetched)):
        at = 100.0 + i * 0.01 if site_of(url) == small else i * 0.01
        web.answered_at[url].append(at)
    cfg = SimConfig(networks=1, hosts=1, per_site_delay=0.01, per_site_concurrency=2)
    figures = pacing.pacing(cfg, web, seeds, reach, 101.0, 0.0, [])
    assert figures["late_sites"] == 1 and figures["worst_site"] == small, figures
    assert figures["worst_site_excess"] > 90
    web.answered_at.clear()
    for url in reach.fetched:  # every page answered at once: no site late
        web.answered_at[url].append(0.0)
    assert pacing.pacing(cfg, web, seeds, reach, 1.0, 0.0, [])["late_sites"] == 0


def test_a_site_whose_pages_are_found_late_is_not_late():
    """Its bound counts each URL from when it was known: a page found at 50 s and fetched
    at once is on time, though the site's first page was fetched at 0."""
    web = SyntheticWeb(WebSpec(pages=200, sites=4, seed=1), port=8077)
    cfg = SimConfig(networks=1, hosts=1, per_site_delay=0.25, per_site_concurrency=2, web_latency=0.0)
    site = f"http://{web.hosts[1]}:8077"
    known = {site + "/": 0.0, site + "/p1": 50.0}
    on_time = {site + "/": 0.3, site + "/p1": 50.3}
    got = pacing._late_sites(cfg, web, set(known), known, on_time)
    assert got["late_sites"] == 0 and got["worst_site_excess"] < 0.5, got
    held = {site + "/": 0.3, site + "/p1": 58.0}  # 8 s after it was known: held
    assert pacing._late_sites(cfg, web, set(known), known, held)["late_sites"] == 1


async def test_a_polite_run_reports_its_bound_and_never_beats_it(redis_url):
    cfg = SimConfig(networks=2, hosts=1, pages=300, sites=30, seeds=4, timeout=120, web_shape="real",
                    per_site_delay=0.1, per_site_concurrency=2, concurrency=32, web_latency=0.05)
    r = await simulate(cfg, redis_url, out=None)
    line, ok = verdict(r)
    assert ok and line == f"exact: 0 duplicates, 0 lost, {r.reachable_urls:,} of {r.reachable_urls:,} URLs"
    assert r.politeness_bound > 1 and r.wall_time >= 0.95 * r.politeness_bound, (r.wall_time, r.politeness_bound)
    assert r.bound_ratio == pytest.approx(r.wall_time / r.politeness_bound, abs=0.01)
    assert r.fetch_slots == 64 and len(r.slots_over_time) == 10
    # Every request holds a slot for the web's latency at least: the mean is no less than
    # requests x latency over the crawl, as the web saw it and as the crawlers counted.
    assert r.slots_in_use_web >= 0.9 * r.requests * 0.05 / r.wall_time
    assert 0 < r.slots_in_use_crawlers <= 64
    assert max(p["sites_with_work"] for p in r.sites_over_time) > 0 and r.late_sites is not None
    assert r.requests_made >= r.requests and 0 < r.rate_share <= 1.5, (r.requests_made, r.requests_allowed)
    text = format_report(r)
    assert "runs with: politeness 2 per site, 0.1 s between requests" in text and "web real: 85%" in text
    assert text.splitlines()[-1] == line and "politeness bound" in text
    failed = dataclasses.replace(r, lost_urls=2, fetched_urls=r.reachable_urls - 2)
    assert verdict(failed) == (f"NOT EXACT: 0 duplicates, 2 lost, {r.reachable_urls - 2:,} of "
                               f"{r.reachable_urls:,} URLs", False)
    assert verdict(dataclasses.replace(r, timed_out=True))[0].startswith("NOT EXACT: TIMED OUT, ")
    assert not verdict(dataclasses.replace(r, duplicate_fetches=3))[1]
    assert verdict(dataclasses.replace(r, duplicate_fetches=3, refetched_after_kill=3))[1]
    paper = dataclasses.replace(r, duplicate_fetches=3, config={**r.config, "mode": "paper"})
    assert verdict(paper)[1] and verdict(paper)[0].startswith("paper: 3 duplicates")


def test_what_politeness_allows_follows_the_sites_with_work():
    """Two sites with work for 10 s, one more for the first 5: at 0.25 s a site, 4 + 4
    requests a second for 10 s and 4 for 5 s are allowed (100); the record says 50 made."""
    web = SyntheticWeb(WebSpec(pages=200, sites=4, seed=1), port=8077)
    a, b, c = (f"http://{web.hosts[k]}:8077/p" for k in range(3))
    known = {a + "1": 0.0, a + "2": 0.0, b + "1": 0.0, c + "1": 0.0}
    first = {a + "1": 4.0, a + "2": 10.0, b + "1": 10.0, c + "1": 5.0}
    steps = pacing._work_steps(known, first)
    assert steps[1][-1] == 0 and max(steps[1]) == 3
    web.request_log.extend((0.1 + i * 0.2, web.hosts[0], "/", "?") for i in range(50))
    cfg = SimConfig(networks=1, hosts=1, per_site_delay=0.25, per_site_concurrency=2, concurrency=32, web_latency=0.0)
    got = pacing._against_allowed(cfg, web, 0.0, 10.0, steps)
    assert got["requests_allowed"] == 100 and got["requests_made"] == 50 and got["rate_share"] == 0.5
    # All slots bound it when they are fewer: 1 host x 1 slot at 0.5 s latency is 2 a second.
    slow = dataclasses.replace(cfg, concurrency=1, web_latency=0.5)
    assert pacing._against_allowed(slow, web, 0.0, 10.0, steps)["requests_allowed"] == 20
    assert pacing._against_allowed(dataclasses.replace(cfg, per_site_delay=0.0), web, 0.0, 10.0, steps) == {}

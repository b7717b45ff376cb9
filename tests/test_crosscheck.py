"""The deterministic simulator (dedupnet/harness/dst) against the real system (the
daemons of ``dedupnet sim`` in one process, real Redis, TCP and HTTP): one scenario,
the same synthetic web and seed, both routings. Timing differs between the two by
design, so they are compared on what timing cannot change (docs/SIMULATION.md): the
URLs fetched, each once; the URLs admitted, each once; under home routing the network
that admitted each URL, its site's home."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import trio

from dedupnet.harness.dst.run import run_world
from dedupnet.harness.dst.world import DstConfig
from dedupnet.harness.report import SimConfig
from dedupnet.harness.sim import simulate

#: One scenario for both: 2x2, a few hundred pages, at least one seed per network, no faults.
SCENARIO = dict(networks=2, hosts=2, pages=400, sites=8, seeds=4, seed=3)


async def real_run(redis_url: str, routing: str, port: int):
    """The daemons' run: fetches from the web server's counts, admissions from every
    center's ``on_admit`` (the adapter's report of the core's Admit actions). The real
    web listens on a free port; its URLs are given the simulated web's ``port`` (a site
    is its host without the port, so no home changes with it)."""
    admits: dict[str, list[int]] = defaultdict(list)
    webs, homes = [], []

    async def during(system, web):
        webs.append(web)
        homes.extend(c.core.homes.map if c.core.homes else None for c in system.centers.values())
        for n, center in system.centers.items():
            inner = center.on_admit

            def on_admit(urls, n=n, inner=inner):
                for u in urls:
                    admits[u].append(n)
                inner(urls)

            center.on_admit = on_admit
        await trio.sleep_forever()

    report = await simulate(SimConfig(timeout=90, routing=routing, **SCENARIO), redis_url, out=None, during=during)
    assert not report.timed_out
    counts = {int(k.split(":")[1]): v for k, v in report.per_network_admitted.items()}
    # The hook saw every admission the centers counted (none happened before it was in place).
    assert sum(len(nets) for nets in admits.values()) == sum(counts.values())
    old, new = f":{webs[0].port}/", f":{port}/"
    return ({u.replace(old, new, 1): c for u, c in webs[0].answer_counts.items()},
            {u.replace(old, new, 1): nets for u, nets in admits.items()}, counts, homes[0])


def dst_run(routing: str):
    result, world = run_world(DstConfig(faults=0, routing=routing, **SCENARIO))
    assert result.ok, [str(v) for v in result.outcome.violations]
    fetched = {u: len(hosts) for u, hosts in world.web.answered.items()}
    counts = Counter(n for nets in world.admits.values() for n in nets)
    return fetched, dict(world.admits), world.reach, {n: counts[n] for n in world.centers}, world.synthetic.port


@pytest.mark.parametrize("routing", ["home", "broadcast"])
async def test_simulator_and_daemons_fetch_and_admit_the_same_urls(redis_url, routing):
    sim_fetched, sim_admits, reach, sim_counts, port = dst_run(routing)
    real_fetched, real_admits, real_counts, homes = await real_run(redis_url, routing, port)

    # The URLs fetched: the web's ground truth, each once, in both.
    assert set(sim_fetched) == set(real_fetched) == reach.fetched
    assert set(sim_fetched.values()) == set(real_fetched.values()) == {1}
    # The URLs admitted: the reachable ones and the robots-disallowed ones (a crawler
    # learns robots.txt after admission), each once, in both.
    assert set(sim_admits) == set(real_admits) == reach.fetched | reach.disallowed
    assert all(len(nets) == 1 for nets in sim_admits.values())
    assert all(len(nets) == 1 for nets in real_admits.values())
    assert sum(sim_counts.values()) == sum(real_counts.values()) == len(sim_admits)
    if routing == "home":
        # Which center admits a URL is the daemons' home map's, not timing's: the same URL by URL.
        assert sim_admits == real_admits == {u: [homes.home_of(u)] for u in sim_admits}
        assert sim_counts == real_counts

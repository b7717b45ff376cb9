"""The topology sweep (bench/bench_topology.py, dedupnet/harness/sweep.py) and the seeding that
makes it fair: every network of every layout starts with a seed."""

import io
import json
from types import SimpleNamespace

import pytest
import redis

from dedupnet.harness import sim

from dedupnet.harness import procplan, simproc

from dedupnet.harness import sweep
from dedupnet.harness.cluster import host_ip
from dedupnet.harness.report import SimConfig, assign_seeds, seed_count, seeds_per_network
from dedupnet.adapters.storage.store import Store
from dedupnet.harness.web import SyntheticWeb, WebSpec
from local_host.pools import HostPools


def _seeds(cfg: SimConfig) -> list[str]:
    return SyntheticWeb(WebSpec(pages=cfg.pages, sites=cfg.sites, seed=cfg.seed), port=0).seeds(seed_count(cfg))


def _url_pool_lengths(server, prefixes: dict[str, str]) -> dict[int, int]:
    """Entries in the URL_pools of each network's hosts (the seeds pushed)."""
    per_net: dict[int, int] = {}
    for ip, prefix in prefixes.items():
        n = int(ip.split(".")[2])
        per_net[n] = per_net.get(n, 0) + server.xlen(f"{prefix}:URL_pool")
    return per_net


async def test_8x4_in_process_every_network_gets_a_seed(redis_url, prefix):
    cfg = SimConfig(networks=8, hosts=4, pages=300, sites=6)  # 6 seeds by default: fewer than networks
    seeds = _seeds(cfg)
    assert len(seeds) == 8 == len(set(seeds))
    stores = {host_ip(n, i): Store(redis_url, f"{prefix}:host:{host_ip(n, i)}")
              for n in range(1, 9) for i in range(4)}
    # sim._seed on real host pools (what the cluster's daemons have): settings.ip and pools.
    system = SimpleNamespace(hosts={ip: SimpleNamespace(settings=SimpleNamespace(ip=ip), pools=HostPools(s, exact=True))
                                    for ip, s in stores.items()})
    server = redis.Redis.from_url(redis_url)
    try:
        plan = await sim._seed(system, seeds, "default")
        assert seeds_per_network(plan) == {f"net:{n}": 1 for n in range(1, 9)}
        assert _url_pool_lengths(server, {ip: s.prefix for ip, s in stores.items()}) == {n: 1 for n in range(1, 9)}
    finally:
        for s in stores.values():
            s.delete_prefix()
            s.close()
        server.close()


async def test_processes_3x3_every_network_gets_a_seed(redis_url, prefix, tmp_path):
    cfg = SimConfig(networks=3, hosts=3, pages=300, sites=6)
    seeds = _seeds(cfg)
    assert len(seeds) == 6
    _centers, hosts = procplan.plan_daemons(cfg, redis_url, prefix, tmp_path)
    server = redis.Redis.from_url(redis_url)
    try:
        plan = await simproc._seed(redis_url, hosts, seeds, "default")
        assert seeds_per_network(plan) == {"net:1": 2, "net:2": 2, "net:3": 2}
        assert _url_pool_lengths(server, {h.name: h.prefix for h in hosts}) == {1: 2, 2: 2, 3: 2}
    finally:
        for h in hosts:
            Store(redis_url, h.prefix).delete_prefix()
        server.close()


@pytest.mark.parametrize("networks, hosts, seeds", [(8, 4, 6), (3, 3, 6), (5, 5, 6), (2, 2, 6), (4, 1, 2)])
def test_seeds_are_dealt_over_the_networks_first_and_deterministically(networks, hosts, seeds):
    ips = [host_ip(n, i) for n in range(1, networks + 1) for i in range(hosts)]
    cfg = SimConfig(networks=networks, hosts=hosts, seeds=seeds)
    urls = [f"http://s{k}.test/" for k in range(seed_count(cfg))]
    plan = assign_seeds(ips, urls)
    counts = seeds_per_network(plan)
    assert len(counts) == networks and min(counts.values()) >= 1
    assert max(counts.values()) - min(counts.values()) <= 1
    assert plan == assign_seeds(list(reversed(ips)), urls)  # the order hosts are listed in does not matter


def test_layouts_parse():
    assert sweep.parse_layouts("2x2, 3x3,8X4") == [(2, 2), (3, 3), (8, 4)]
    with pytest.raises(Exception, match="NETWORKSxHOSTS"):
        sweep.parse_layouts("3by3")


def test_short_sweep_has_a_row_per_layout_and_is_exact(tmp_path):
    out_file, out = tmp_path / "sweep.json", io.StringIO()
    rc = sweep.main(["--layouts", "2x2,3x2", "--pages", "300", "--sites", "6", "--timeout", "90",
                     "--out", str(out_file)], out=out)
    text = out.getvalue()
    assert rc == 0, text
    table = text[text.index("Topology sweep"):].splitlines()
    assert [line.split()[:2] for line in table if line[:1].isdigit()] == [["2x2", "this"], ["3x2", "this"]]
    assert "frames/URL" in table[1] and "Redis B/URL" in table[1] and "sites >1 host" in table[1]
    assert "busiest" in table[-1]  # the legend
    data = json.loads(out_file.read_text())
    assert [r["layout"] for r in data["runs"]] == ["2x2", "3x2"]
    for run in data["runs"]:
        r, f = run["report"], run["figures"]
        assert not r["timed_out"] and r["duplicate_fetches"] == 0 and r["lost_urls"] == 0
        n = r["config"]["networks"]
        # Every network was seeded and admitted something.
        assert set(r["seeds_per_network"]) == set(r["per_network_admitted"]) == {f"net:{k}" for k in range(1, n + 1)}
        assert all(v > 0 for v in r["per_network_admitted"].values())
        assert all(v > 0 for v in r["seeds_per_network"].values())
        # The new figures are there and plausible.
        assert r["set_fill"] > 1 and r["frames_per_url"] > 0 and r["bytes_per_url"] > 0
        assert r["max_url_pool"] > 0 and r["center_cpu_ms_per_1k_urls"] > 0
        assert r["redis_bytes"]["center"]["admitted"] > 0 and r["redis_bytes"]["host"]["finish_URL"] > 0
        assert r["center_redis_bytes_per_url"] > 0
        assert f["duplicates"] == 0 and f["lost"] == 0 and f["networks_idle"] == []
        assert f["cpu_ms_per_page"] > 0
        # From the web's log: one host per site (each site has one home).
        assert f["multi_host_sites"] == 0 and f["hosts_per_site_1s"] == 1 and f["host_max_mean"] >= 1
        assert 1 / n <= f["busiest_share"] <= 1 and f["busiest_x_l"] == pytest.approx(f["busiest_share"] * n)
    assert data["runs"][0]["figures"]["pages_per_s"] > 0


def test_table_prints_n_a_for_what_an_older_report_lacks():
    old = {"wall_time": 2.0, "pages_per_s": 100.0, "urls_found": 50, "reachable_urls": 10, "frames": {"frame": 25},
           "bytes_on_wire": 5000, "latency_p50": 0.1, "latency_p99": 0.3, "sets_concluded_incomplete": 0,
           "duplicate_fetches": 0, "lost_urls": 0, "timed_out": False}
    new = {**old, "set_fill": 12.0, "center_cpu_ms_per_1k_urls": 300.0, "center_redis_bytes_per_url": 120.0,
           "cpu_total_ms_per_page": 3.0,
           "wall_time": 1.0, "pages_per_s": 200.0, "config": {"networks": 2}, "busiest_network_share": 0.6,
           "pages_per_host_max": 30, "pages_per_host_mean": 20.0, "sites_multi_host": 0, "max_hosts_per_site_1s": 1}
    table = sweep.format_table([{"layout": "2x2", "side": "main", "figures": sweep.figures(old)},
                                {"layout": "2x2", "side": "this", "figures": sweep.figures(new)}])
    head, _, main, this, ratio = table.splitlines()
    assert main.split()[:2] == ["2x2", "main"] and main.count("n/a") == 9
    assert "n/a" not in this and this.split()[-5:] == ["0.60", "1.20", "1.50", "0", "1"]
    assert "busiest" in head and "host max/mean" in head and "sites >1 host" in head and "hosts/site/s" in head
    assert "0.500" in main and "500" in main  # frames/URL from frames / URLs found, bytes/URL from bytes / distinct
    assert ratio.split()[:4] == ["2x2", "this/main", "0.50", "2.00"]


def test_sweep_gives_the_workload_flags_to_every_run(tmp_path):
    args = sweep.build_parser().parse_args(["--routing", "broadcast", "--weight", "2=3", "--web-latency", "0.2",
                                            "--concurrency", "4", "--sim-args", "--set-size 50"])
    for extra in ([], ["--set-size", "50"]):  # the baseline's runs and this checkout's
        argv = sweep.sim_argv("python", (3, 3), args, tmp_path / "r.json", extra)
        flags = " ".join(argv)
        assert "--routing broadcast --weight 2=3 --web-latency 0.2 --concurrency 4" in flags
    plain = " ".join(sweep.sim_argv("python", (3, 3), sweep.build_parser().parse_args([]), tmp_path / "r.json", []))
    assert "--routing" not in plain and "--web-latency" not in plain and "--concurrency" not in plain

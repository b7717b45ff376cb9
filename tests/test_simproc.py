"""``dedupnet sim --processes``: every center and host as its own OS process,
started with the same ``dedupnet center`` / ``dedupnet local`` commands a user runs."""

import io
import json
import os
import signal
import subprocess

import pytest
import redis

from dedupnet.harness import procdaemons, simproc
from dedupnet.harness.report import SimConfig
from dedupnet.harness.simproc import simulate_processes
from dedupnet.harness.web import SyntheticWeb

from .helpers import DEDUPNET, check_cpu_figures, wait_for
from .procs import live_processes, server_processes


def _children(pid: int) -> set[int]:
    return {p.pid for p in live_processes() if p.ppid == pid}


async def test_processes_mode_runs_a_2x2_simulation_and_leaves_nothing_behind(redis_url, monkeypatch):
    webs, spawned = [], []

    class RecordingWeb(SyntheticWeb):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            webs.append(self)

    def spawn(argv, **kwargs):
        proc = real_spawn(argv, **kwargs)
        spawned.append(proc)
        return proc

    real_spawn = procdaemons.spawn
    monkeypatch.setattr(simproc, "SyntheticWeb", RecordingWeb)
    monkeypatch.setattr(procdaemons, "spawn", spawn)
    me = os.getpid()
    children_before = _children(me)
    servers_before = server_processes(lambda ppid, cwd, cmdline: ppid == me)

    out = io.StringIO()
    cfg = SimConfig(networks=2, hosts=2, pages=300, sites=6, mode="exact", timeout=40)
    report = await simulate_processes(cfg, redis_url, out=out)

    assert not report.timed_out, out.getvalue()
    assert report.lost_urls == 0, report.lost_examples
    assert report.duplicate_fetches == 0
    (web,) = webs
    # The report's counts are the web server's own ...
    assert report.requests == sum(web.answer_counts.values())
    assert report.fetched_urls == len(web.answer_counts) == report.reachable_urls > 100
    # ... and the daemons' counters (read from their status ports) agree with it, 503s included.
    assert sum(report.per_host_pages.values()) == sum(web.fetch_counts.values())
    assert set(report.per_host_pages) == {"127.0.1.10", "127.0.1.11", "127.0.2.10", "127.0.2.11"}
    assert sum(report.per_network_admitted.values()) >= report.reachable_urls
    assert report.frames["frame"] > 0 and report.frames["task"] > 0
    assert "status" not in report.frames  # the harness's status polls are not protocol traffic
    # ... nor their Welcomes: one per connection that offers compression, here the four
    # hosts' links and the one peer link (a reconnection adds one; the polls added hundreds)
    assert 0 < report.frames.get("welcome", 0) <= 10, report.frames
    assert report.bytes_on_wire > 0 and report.redis_lookups > 0
    assert report.latency_p50 is None and report.latency_p99 is None  # not observable from outside
    assert report.config["processes"] is True
    # The centers' own CPU (/proc/<pid>/stat) and the run's Redis memory by key family.
    assert report.center_cpu_s > 0 and report.center_cpu_ms_per_1k_urls > 0
    check_cpu_figures(report, {"hosts", "centers", "web", "harness", "redis"})
    assert report.redis_bytes["center"]["admitted"] > 0 and report.redis_bytes["host"]["finish_URL"] > 0
    assert report.set_fill > 1 and report.seeds_per_network == {"net:1": 3, "net:2": 3}
    assert report.timeline and report.timeline[-1]["pages_fetched"] == report.requests
    assert "pages" in out.getvalue() and "logs kept" not in out.getvalue()

    # Six daemons, each stopped cleanly by SIGTERM and reaped; nothing of them is left.
    assert len(spawned) == 6
    assert [p.returncode for p in spawned] == [0] * 6
    pids = {p.pid for p in spawned}
    assert _children(me) <= children_before
    assert not [p for p in live_processes() if p.pid in pids
                or ("dedupnet.cli" in p.cmdline and redis_url in p.cmdline)]
    assert server_processes(lambda ppid, cwd, cmdline: ppid == me) == servers_before
    assert not server_processes(lambda ppid, cwd, cmdline: ppid in pids)
    server = redis.Redis.from_url(redis_url)
    try:
        assert not list(server.scan_iter(match="simproc-*", count=1000))
    finally:
        server.close()


@pytest.mark.parametrize("change, message", [
    ({"mode": "owner"}, "mode 'owner' is not supported"),
    ({"scenario": "churn"}, "supported: default, concurrent, restart"),
])
async def test_processes_mode_refuses_what_it_cannot_run(change, message):
    with pytest.raises(ValueError, match=message):
        await simulate_processes(SimConfig(**change), "redis://127.0.0.1:1")


def test_cli_sim_processes_writes_its_report_and_leaves_nothing_behind(tmp_path):
    report = tmp_path / "out.json"

    def left():
        return [p for p in live_processes() if p.session == proc.pid]

    # Its own session: every process it starts (daemons, the embedded Redis) carries its
    # session id, so what outlives it can be found even after being re-parented.
    proc = subprocess.Popen(
        [*DEDUPNET, "sim", "--processes", "--networks", "2", "--hosts", "2",
         "--pages", "200", "--sites", "5", "--timeout", "90", "--json", str(report)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=10)
        pytest.fail(f"dedupnet sim --processes did not finish in 150 s:\n{output}")
    finally:
        if not wait_for(lambda: not left(), 10):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output
    assert "quiescent" in output and "duplicate fetches" in output
    data = json.loads(report.read_text())
    assert data["timed_out"] is False
    assert data["config"]["processes"] is True and data["config"]["networks"] == 2 and data["config"]["hosts"] == 2
    assert data["lost_urls"] == 0 and data["duplicate_fetches"] == 0
    assert data["fetched_urls"] == data["reachable_urls"] > 50
    assert len(data["per_host_pages"]) == 4 and data["frames"]["frame"] > 0
    assert data["latency_p50"] is None
    assert left() == [], "processes of the run outlived it"


@pytest.mark.parametrize("routing", ["home", "broadcast"])
async def test_politeness_from_the_webs_own_log_one_host_per_site(redis_url, routing):
    """Every daemon its own process, so the web sees each host's own source address. With
    one home per site no site is fetched by two hosts (robots.txt included), in the whole
    system; asking every network instead (broadcast) lets each network crawl the URLs it
    found, so sites are fetched from both: the check tells the two apart. The web answers
    in 50 ms: on an instant one the whole crawl is over in about a second, and a network
    whose first sets were answered first could claim nearly every URL (a host with none)."""
    cfg = SimConfig(networks=2, hosts=2, pages=150, sites=10, timeout=60, routing=routing, web_latency=0.05)
    report = await simulate_processes(cfg, redis_url, out=None)
    assert not report.timed_out and report.lost_urls == 0 and report.duplicate_fetches == 0
    assert report.sites_fetched == 10
    assert sum(report.pages_per_network.values()) == sum(report.per_host_pages.values())
    if routing == "home":
        assert report.sites_multi_host == 0 and report.max_hosts_per_site_1s == 1
    else:
        assert report.sites_multi_host > 0 and report.max_hosts_per_site_1s > 1

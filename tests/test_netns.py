"""dedupnet on real interfaces. Two LANs built from network namespaces, veth pairs and
bridges, joined by a WAN link with loss and delay (tc); `dedupnet center` / `dedupnet local`
run in them as real processes with nothing but their network, their center (hosts) or
their peers (centers) given: IP and LAN are detected from the interfaces (netifaces).
They crawl a synthetic web served, by this process, inside a namespace of its own; the
web's fetch log says whether any page was fetched twice or never.

The layout, how the WAN is impaired and the daemons are in tests/netns_lab.py; the
``lab`` fixture (tests/conftest.py) builds the namespaces and removes them. Skipped, with
the reason, where namespaces cannot be built (not root, no iproute2, no veth/bridge
support).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from dedupnet.harness.web import SyntheticWeb, WebSpec

from . import netns
from .netns import Lab, in_netns
from .netns_lab import (CENTER_PORT, HOST_PORT, HOSTS, NETWORKS, WEB_NET, Daemon, build_two_lans, center_lan_ip,
                        center_wan_ip, host_ip, host_name, lan, poll_all, quiet, stop)

ROOT = Path(__file__).resolve().parent.parent


_QDISC_STATS = re.compile(r"qdisc (\S+) .*?\n\s*Sent (\d+) bytes (\d+) pkt \(dropped (\d+),", re.S)


def wan_stats(lab: Lab, n: int) -> dict[str, int]:
    """Packets center ``n`` sent on the WAN, those its qdiscs and filters dropped, and its
    TCP retransmissions."""
    out = lab.tc(f"c{n}", "-s", "qdisc", "show", "dev", "wan0").stdout
    stats = [(int(pkts), int(dropped)) for _, _, pkts, dropped in _QDISC_STATS.findall(out)]
    snmp = netns.run("ip", "netns", "exec", lab.ns(f"c{n}"), "cat", "/proc/net/snmp").stdout.splitlines()
    tcp = [line.split()[1:] for line in snmp if line.startswith("Tcp:")]
    retrans = int(dict(zip(tcp[0], tcp[1]))["RetransSegs"]) if len(tcp) == 2 else 0
    return {"packets": max((p for p, _ in stats), default=0), "dropped": sum(d for _, d in stats),
            "tcp_retransmits": retrans}


# -- the web's --bind: runs anywhere ---------------------------------------------------
async def test_web_bind_moves_every_site_into_another_network():
    web = SyntheticWeb(WebSpec(pages=300, sites=260, seed=3), port=0, bind="127.78.0.0/16")
    assert web.hosts[0] == "127.78.0.1" and web.hosts[249] == "127.78.0.250" and web.hosts[250] == "127.78.1.1"
    with pytest.raises(ValueError, match="no room"):
        SyntheticWeb(WebSpec(pages=300, sites=260), bind="10.0.0.0/24")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(web.serve)
        seed = web.seeds(1)[0]
        assert seed == f"http://127.78.0.1:{port}/"
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.78.1.1", port)
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: 127.78.1.1\r\nConnection: close\r\n\r\n")
            reply = b""
            while chunk := await stream.receive_some(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 200") and b"of site 250" in reply
        assert web.answer_counts == {f"http://127.78.1.1:{port}/": 1}
        nursery.cancel_scope.cancel()


def test_dedupnet_web_bind_flag_is_validated():
    out = subprocess.run([sys.executable, "-m", "dedupnet.cli", "web", "--sites", "300", "--pages", "400",
                          "--bind", "10.0.0.0/24"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "no room for site 250" in out.stderr


# -- two LANs on real interfaces -------------------------------------------------------
async def test_two_lans_on_real_interfaces_crawl_without_duplicates_or_losses(lab, tmp_path):
    trio.socket.set_custom_socket_factory(netns.NetnsSocketFactory())
    t_start = time.perf_counter()
    impairment = build_two_lans(lab)
    web = SyntheticWeb(WebSpec(pages=600, sites=12, seed=1), port=0, bind=WEB_NET)
    cli = [sys.executable, "-m", "dedupnet.cli"]
    # --insecure: this test is about real interfaces, not keys (tests/test_exposure.py is).
    common = ["--log-level", "INFO", "--insecure"]
    centers, hosts = [], []
    for n in range(1, NETWORKS + 1):
        argv = [*cli, "center", "--network", str(n), "--listen", f"0.0.0.0:{CENTER_PORT}",
                "--data-dir", str(tmp_path / f"c{n}"), *common]
        for m in range(1, NETWORKS + 1):
            if m != n:
                argv += ["--peer", f"{m},{center_wan_ip(m)}:{CENTER_PORT},{lan(m)}"]
        centers.append(Daemon(f"c{n}", "center", n, argv, CENTER_PORT, tmp_path / f"c{n}.log"))
    daemons = centers
    seeds_by_host: dict[str, list[str]] = {}
    report: dict = {"impairment": impairment}
    try:
        async with trio.open_nursery() as nursery:
            with in_netns(lab.ns("web")):
                await nursery.start(web.serve)
            seeds = web.seeds(NETWORKS * HOSTS)
            order = [host_name(n, i) for i in range(HOSTS) for n in range(1, NETWORKS + 1)]
            for k, url in enumerate(seeds):
                seeds_by_host.setdefault(order[k % len(order)], []).append(url)
            for n in range(1, NETWORKS + 1):
                for i in range(HOSTS):
                    h = host_name(n, i)
                    argv = [*cli, "local", "--network", str(n), "--center", f"{center_lan_ip(n)}:{CENTER_PORT}",
                            "--listen", f"0.0.0.0:{HOST_PORT}", "--data-dir", str(tmp_path / h), *common,
                            "--set-size", "50",
                            "--concurrency", "16", "--per-site", "4", "--per-site-delay", "0"]
                    argv += [a for url in seeds_by_host.get(h, []) for a in ("--seed", url)]
                    hosts.append(Daemon(h, "host", n, argv, HOST_PORT, tmp_path / f"{h}.log"))
            daemons = centers + hosts

            with trio.fail_after(60):  # start: centers, then hosts, until every link is up
                for d in centers:
                    d.start(lab, tmp_path)
                while True:
                    await poll_all(lab, centers)
                    if all(d.status for d in centers):
                        break
                    await trio.sleep(0.2)
                for d in hosts:
                    d.start(lab, tmp_path)
                while True:
                    await poll_all(lab, daemons)
                    members = {c.network: set((c.status or {}).get("members", {})) for c in centers}
                    if all(h.status and h.status.get("connected") for h in hosts) and all(
                            members[c.network] >= {host_ip(h.network, int("abcdefgh".index(h.ns[-1])))
                                                   for h in hosts if h.network == c.network}
                            | {f"net:{m}" for m in range(1, NETWORKS + 1) if m != c.network} for c in centers):
                        break
                    await trio.sleep(0.2)
            report["startup_s"] = round(time.perf_counter() - t_start, 1)

            # IP and LAN came from the interfaces: a host's from the one that reaches its
            # center; a center's IP is its WAN leg (what its peers see), its LAN the other leg.
            for h in hosts:
                i = "abcdefgh".index(h.ns[-1])
                assert h.status["ip"] == host_ip(h.network, i)
                assert f"(network {h.network}, LAN {lan(h.network)})" in h.log.read_text()
            for c in centers:
                assert c.status["listen"] == f"{center_wan_ip(c.network)}:{CENTER_PORT}"
                assert f"(LAN {lan(c.network)}," in c.log.read_text()

            t0 = time.perf_counter()
            quiet_polls = 0
            with trio.move_on_after(100) as scope:
                while quiet_polls < 3:
                    await trio.sleep(0.5)
                    await poll_all(lab, daemons)
                    started = sum(web.answer_counts.values()) >= len(seeds)
                    quiet_polls = quiet_polls + 1 if started and all(quiet(d) for d in daemons) else 0
            report["crawl_s"] = round(time.perf_counter() - t0, 1)
            report["quiescent"] = not scope.cancelled_caught
            nursery.cancel_scope.cancel()

        reach = web.reachable_detail(seeds)
        fetched = set(web.answer_counts)
        report.update(
            reachable=len(reach.fetched), fetched=len(fetched), requests=sum(web.answer_counts.values()),
            duplicates=web.duplicate_fetches(), lost=len(reach.fetched - fetched),
            unexpected=len(fetched - reach.fetched),
            pages_per_host={h.ns: (h.status or {}).get("crawler", {}).get("pages_done") for h in hosts},
            wan={f"c{n}": wan_stats(lab, n) for n in range(1, NETWORKS + 1)},
        )
    finally:
        with trio.CancelScope(shield=True):
            codes = await stop(daemons)
        report["exit_codes"] = codes
        report["wall_s"] = round(time.perf_counter() - t_start, 1)
        print("\nnetns report:", json.dumps(report, sort_keys=True))
        trio.socket.set_custom_socket_factory(None)

    logs = "\n".join(f"--- {d.ns}\n{d.log_tail()}" for d in daemons)
    assert report["quiescent"], f"no quiescence in 100 s: {report}\n{logs}"
    assert report["duplicates"] == 0, report
    assert report["lost"] == 0, (report, sorted(reach.fetched - fetched)[:10])
    assert report["unexpected"] == 0, sorted(fetched - reach.fetched)[:10]
    assert report["reachable"] > 200
    assert all(report["pages_per_host"].values()), report  # every host crawled
    assert sum(s["packets"] for s in report["wan"].values()) > 0  # the WAN carried the protocol
    assert set(codes.values()) == {0}, f"{codes}\n{logs}"


def test_a_center_does_not_guess_between_several_lan_candidates(lab, tmp_path):
    """A center listening on every address, with three legs: one towards its peer, two
    that could be its LAN. It refuses to start and says which flag decides."""
    lab.add("m")
    lab.add("x")
    for k in (1, 2, 3):
        lab.veth("m", f"leg{k}", "x", f"leg{k}")
        lab.ip("m", "addr", "add", f"10.{k}.0.1/24", "dev", f"leg{k}")
        lab.ip("x", "addr", "add", f"10.{k}.0.2/24", "dev", f"leg{k}")
    cli = [sys.executable, "-m", "dedupnet.cli", "center", "--network", "1", "--listen", "0.0.0.0:7700",
           "--data-dir", str(tmp_path / "c")]

    def center(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(lab.exec_argv("m", [*cli, *args]), capture_output=True, text=True, timeout=60,
                              cwd=ROOT)

    out = center("--peer", "2,10.3.0.2:7700,10.9.0.0/24")
    assert out.returncode == 2, out.stderr
    assert "cannot tell this center's LAN" in out.stderr and "10.1.0.0/24" in out.stderr and "--lan" in out.stderr
    out = center()  # no peers: no way to tell its address either
    assert out.returncode == 2 and "several addresses" in out.stderr and "--ip" in out.stderr

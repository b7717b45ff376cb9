"""Issue #9 part 3: dedupnet on real interfaces. Two LANs built from network
namespaces, veth pairs and bridges, joined by a WAN link with loss and delay (tc);
`dedupnet center` / `dedupnet local` run in them as real processes with nothing but
their network, their center (hosts) or their peers (centers) given: IP and LAN are
detected from the interfaces (netifaces). They crawl a synthetic web served, by this
process, inside a namespace of its own; the web's fetch log says whether any page was
fetched twice or never.

Layout (N = 2 networks x H = 2 hosts; every box a namespace ``dnt<pid>-<name>``)::

    h1a h1b   c1 (lan0 10.1.0.1/24, wan0 10.255.0.1/24) --+
      |   |     |                                        |  wan: bridge
     [sw1: bridge br0]                                    +-- [wan]   (tc on every wan0)
      |                                                  |
     web (l1 10.1.0.254, l2 10.2.0.254; sites in          c2 ... 10.2.0.0/24, 10.255.0.2
          10.77.0.0/16, local on its lo)

Hosts (10.L.0.10+i) reach their center on the LAN and the web through 10.L.0.254;
the web does not forward, so the only way between the LANs is center to center over
the WAN. Each daemon runs its own embedded Redis inside its namespace, as a real
deployment keeps one Redis per host; no Redis is shared across namespaces.

Skipped, with the reason, where namespaces cannot be built (not root, no iproute2,
no veth/bridge support). The WAN gets ``tc netem delay 100ms loss 2%`` where the kernel
has netem; a kernel without it (CONFIG_NET_SCH_NETEM unset) gets a token bucket
(``tbf``) on the WAN instead: queueing delay and drops when a burst overflows it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from dedupnet.service.daemons import fetch_status
from dedupnet.adapters.children import spawn
from dedupnet.harness.procdaemons import is_quiet
from dedupnet.harness.web import SyntheticWeb, WebSpec

from . import netns
from .netns import Lab, LabError, in_netns

ROOT = Path(__file__).resolve().parent.parent
NETWORKS, HOSTS = 2, 2
WEB_NET = "10.77.0.0/16"
CENTER_PORT, HOST_PORT = 7700, 7701
NETEM = ("delay", "100ms", "loss", "2%")
TBF = ("rate", "256kbit", "burst", "4kb", "latency", "200ms")
LOSS = 0.02


def lan(n: int) -> str:
    return f"10.{n}.0.0/24"


def center_lan_ip(n: int) -> str:
    return f"10.{n}.0.1"


def center_wan_ip(n: int) -> str:
    return f"10.255.0.{n}"


def host_ip(n: int, i: int) -> str:
    return f"10.{n}.0.{10 + i}"


def host_name(n: int, i: int) -> str:
    return f"h{n}{'abcdefgh'[i]}"


def build_two_lans(lab: Lab, networks: int = NETWORKS, hosts: int = HOSTS) -> str:
    """The layout of the module docstring; returns how the WAN is impaired."""
    lab.add("wan")
    lab.bridge("wan")
    lab.add("web")
    lab.ip("web", "route", "add", "local", WEB_NET, "dev", "lo")  # every site address is the web's own
    for n in range(1, networks + 1):
        sw, c = f"sw{n}", f"c{n}"
        lab.add(sw)
        lab.bridge(sw)
        lab.add(c)
        lab.plug(c, "lan0", sw, "pc", f"{center_lan_ip(n)}/24")
        lab.plug(c, "wan0", "wan", f"pc{n}", f"{center_wan_ip(n)}/24")
        lab.plug("web", f"l{n}", sw, "pweb", f"10.{n}.0.254/24")
        for i in range(hosts):
            h = host_name(n, i)
            lab.add(h)
            lab.plug(h, "eth0", sw, f"p{h}", f"{host_ip(n, i)}/24")
            lab.ip(h, "route", "add", WEB_NET, "via", f"10.{n}.0.254")
    return impair_wan(lab, networks)


def impair_wan(lab: Lab, networks: int = NETWORKS) -> str:
    """tc on every center's WAN leg (egress, so each direction once): netem where the
    kernel has it; else a token bucket plus random loss from an eBPF classifier."""
    if netns.netem_available(lab.ns("c1"), "wan0"):
        for n in range(1, networks + 1):
            lab.tc(f"c{n}", "qdisc", "add", "dev", "wan0", "root", "netem", *NETEM)
        return "netem " + " ".join(NETEM)
    for n in range(1, networks + 1):
        lab.tc(f"c{n}", "qdisc", "add", "dev", "wan0", "root", "tbf", *TBF)
    what = "no netem in this kernel: tbf " + " ".join(TBF)
    try:
        for n in range(1, networks + 1):
            netns.add_random_drop(lab.ns(f"c{n}"), "wan0", LOSS)
    except (LabError, OSError) as e:
        return f"{what}; no random loss either ({e})"
    return f"{what} + {LOSS:.0%} random loss (eBPF tc filter)"


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


@dataclass
class Daemon:
    ns: str  # lab name of its namespace
    role: str
    network: int
    argv: list[str]
    port: int
    log: Path
    proc: subprocess.Popen | None = None
    status: dict | None = field(default=None)

    def start(self, lab: Lab, cwd: Path) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
                   PYTHONUNBUFFERED="1")
        with open(self.log, "ab") as log:
            # spawn: PR_SET_PDEATHSIG, so the daemon dies with the test even if it is killed outright
            # (`ip netns exec` execs the command: the pid is the daemon's).
            self.proc = spawn(lab.exec_argv(self.ns, self.argv), stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, cwd=cwd, env=env)

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"{self.role} in {self.ns} exited with {self.proc.returncode}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def poll(self, lab: Lab) -> dict | None:
        """What `dedupnet status 127.0.0.1:PORT` answers, asked from inside its namespace."""
        try:
            with in_netns(lab.ns(self.ns)):
                self.status = await fetch_status(("127.0.0.1", self.port), timeout=3.0)
        except Exception:  # noqa: BLE001 - not (yet) answering, whatever the reason
            self.status = None
        return self.status


def quiet(d: Daemon) -> bool:
    """The --processes simulation's rule, on the status this test polled."""
    return is_quiet(d, d.status)


async def poll_all(lab: Lab, daemons: list[Daemon]) -> None:
    async with trio.open_nursery() as nursery:
        for d in daemons:
            nursery.start_soon(d.poll, lab)
    for d in daemons:
        d.check_alive()


async def stop(daemons: list[Daemon], timeout: float = 20.0) -> dict[str, int | None]:
    """SIGTERM (hosts first), wait, SIGKILL what is left; exit codes by namespace."""
    for d in sorted(daemons, key=lambda d: d.role != "host"):
        if d.proc is not None and d.proc.poll() is None:
            d.proc.send_signal(signal.SIGTERM)
    with trio.move_on_after(timeout):
        while any(d.proc is not None and d.proc.poll() is None for d in daemons):
            await trio.sleep(0.05)
    codes = {}
    for d in daemons:
        if d.proc is None:
            continue
        if d.proc.poll() is None:
            d.proc.kill()
        try:
            codes[d.ns] = d.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            codes[d.ns] = None
    return codes


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
@pytest.fixture
def lab():
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    netns.remove_stale()
    lab = Lab()
    try:
        yield lab
    finally:
        problems = lab.close()
        left = [ns for ns in netns.list_namespaces() if ns.startswith(lab.tag + "-")]
        assert not left, f"namespaces left behind: {left}"
        assert not problems, problems


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

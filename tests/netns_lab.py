"""The lab of the namespace tests (tests/test_netns.py, and the tests that reuse its
layout or its daemons): two LANs and a WAN built with tests/netns.py, and the daemons
that run in them.

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

The WAN gets ``tc netem delay 100ms loss 2%`` where the kernel has netem; a kernel
without it (CONFIG_NET_SCH_NETEM unset) gets a token bucket (``tbf``) on the WAN
instead: queueing delay and drops when a burst overflows it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import trio

from dedupnet.adapters.children import spawn
from dedupnet.harness.procdaemons import is_quiet
from dedupnet.service.daemons import fetch_status

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

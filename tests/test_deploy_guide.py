"""docs/DEPLOY.md, "A deployment, step by step", followed as written: the blocks the
guide marks with ``<!-- deploy-test: MACHINE... [FILE] -->`` are taken from the guide
itself and run on those machines, so the guide and this test cannot drift apart.

The machines are network namespaces (tests/netns.py, the layout of tests/netns_lab.py:
two LANs, a center and two hosts each, a WAN between the centers) plus an admin
machine with a leg on each LAN and on the WAN. Each machine has a directory of its own
standing for its file system: ``/etc/dedupnet`` and ``/var/lib/dedupnet`` in a block
are rewritten to that directory, and ``dedupnet`` is this checkout. A marked block is
either a shell block (run with bash in the machine's namespace and directory), a file
(written at the path the marker names), or ``until-complete`` (run until it exits 0).
The daemons are started by the ``ExecStart`` line of the systemd unit the guide ships
(deploy/systemd/dedupnet@.service), with ``%i`` the role, as systemd would.

Two steps are the test's own, as the guide leaves them to the operator: copying each
bundle from the admin machine to the machines named in the guide's sentence, and the
seed list (the synthetic web's, served by this process in a namespace of its own, so
its fetch log says whether any page was fetched twice or never).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from dedupnet.harness.web import SyntheticWeb, WebSpec

from . import netns
from .netns import Lab, in_netns
from .netns_lab import WEB_NET, Daemon, build_two_lans, stop

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "DEPLOY.md"
UNIT = ROOT / "deploy" / "systemd" / "dedupnet@.service"
MARKED = re.compile(r"^<!-- deploy-test: (?P<what>[^>]*?) -->\n```[a-z]*\n(?P<body>.*?)^```", re.S | re.M)
#: Where the guide's files live on a machine, and where the test puts them instead.
MACHINE_PATHS = ("/etc/dedupnet", "/var/lib/dedupnet")
CENTERS = {"c1": 1, "c2": 2}
HOSTS = {"h1a": 1, "h1b": 1, "h2a": 2, "h2b": 2}
#: The copy the guide asks of the operator: "center-N.tar to the center of network N and
#: hosts-N.tar to each host of network N".
BUNDLES = {**{c: f"center-{n}.tar" for c, n in CENTERS.items()}, **{h: f"hosts-{n}.tar" for h, n in HOSTS.items()}}


@dataclass
class Step:
    machines: list[str]
    body: str
    file: str | None = None  # the block is this file's content
    until_complete: bool = False


def guide_steps(text: str) -> list[Step]:
    steps = []
    for m in MARKED.finditer(text):
        words = m.group("what").split()
        file = words.pop() if words[-1].startswith("/") else None
        until = words[-1] == "until-complete"
        if until:
            words.pop()
        steps.append(Step(words, m.group("body"), file, until))
    return steps


def exec_start(unit: str, instance: str) -> list[str]:
    """The unit's command line for ``dedupnet@INSTANCE``, as systemd would run it."""
    lines = [line.removeprefix("ExecStart=") for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0].replace("%i", instance))


def unit_setting(unit: str, key: str) -> str:
    return next(line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(key + "="))


def test_the_guide_marks_a_complete_deployment():
    """Runs anywhere: every machine has a marked step, each its config file, and the
    unit's command line is one the CLI parses for both roles."""
    from dedupnet import cli

    steps = guide_steps(GUIDE.read_text())
    machines = {m for s in steps for m in s.machines}
    assert machines == {"admin", *CENTERS, *HOSTS}
    for m in [*CENTERS, *HOSTS]:
        assert [s.file for s in steps if m in s.machines and s.file] == ["/etc/dedupnet/dedupnet.toml"], m
    assert [s.machines for s in steps if s.until_complete] == [["admin"]]
    unit = UNIT.read_text()
    assert unit_setting(unit, "WorkingDirectory") == "/var/lib/dedupnet"
    assert unit_setting(unit, "StateDirectory") == "dedupnet"
    for role in ("center", "local"):
        argv = exec_start(unit, role)
        assert Path(argv[0]).name == "dedupnet"
        cli.build_parser().parse_args(argv[1:])


def test_systemd_takes_the_unit(tmp_path):
    """`systemd-analyze verify` finds nothing wrong with the unit but the missing
    install (skipped without systemd-analyze)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("no systemd-analyze on PATH")
    unit = tmp_path / "dedupnet@center.service"
    unit.write_text(UNIT.read_text())
    out = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in (out.stdout + out.stderr).splitlines()
                  if line.strip() and "/opt/dedupnet/bin/dedupnet is not executable" not in line]
    assert not complaints, complaints


class Machines:
    """A directory per machine standing for its file system, and the commands of the
    guide run there."""

    def __init__(self, lab: Lab, root: Path):
        self.lab, self.root = lab, root
        bindir = root / "bin"
        bindir.mkdir()
        self.dedupnet = bindir / "dedupnet"
        self.dedupnet.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m dedupnet.cli \"$@\"\n")
        self.dedupnet.chmod(0o755)
        self.env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
                        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))

    def home(self, machine: str) -> Path:
        home = self.root / machine
        home.mkdir(exist_ok=True)
        return home

    def localise(self, machine: str, text: str) -> str:
        for path in MACHINE_PATHS:
            text = text.replace(path, f"{self.home(machine)}{path}")
        return text

    def write(self, machine: str, path: str, content: str) -> None:
        target = Path(self.localise(machine, path))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.localise(machine, content))

    async def run(self, machine: str, body: str) -> subprocess.CompletedProcess:
        argv = self.lab.exec_argv(machine, ["bash", "-euo", "pipefail", "-c", self.localise(machine, body)])
        return await trio.to_thread.run_sync(lambda: subprocess.run(
            argv, cwd=self.home(machine), env=self.env, capture_output=True, text=True, timeout=60))

    def daemon(self, machine: str, role: str, network: int, unit: str) -> Daemon:
        argv = [str(self.dedupnet) if a.endswith("/dedupnet") else self.localise(machine, a)
                for a in exec_start(unit, role)]
        return Daemon(machine, "host" if role == "local" else "center", network, argv, 7700,
                      self.root / f"{machine}.log")


def add_admin(lab: Lab) -> None:
    """The admin machine: a leg on the WAN and one on each LAN."""
    lab.add("admin")
    lab.plug("admin", "wan0", "wan", "padmin", "10.255.0.100/24")
    for n in CENTERS.values():
        lab.plug("admin", f"lan{n}", f"sw{n}", "padmin", f"10.{n}.0.100/24")


async def test_following_the_deployment_guide_reaches_a_complete_crawl(lab, tmp_path):
    trio.socket.set_custom_socket_factory(netns.NetnsSocketFactory())
    build_two_lans(lab)
    add_admin(lab)
    machines = Machines(lab, tmp_path)
    unit = UNIT.read_text()
    web = SyntheticWeb(WebSpec(pages=300, sites=8, seed=1), port=0, bind=WEB_NET)
    steps = guide_steps(GUIDE.read_text())
    daemons: list[Daemon] = []
    verdict = None
    try:
        async with trio.open_nursery() as nursery:
            with in_netns(lab.ns("web")):
                await nursery.start(web.serve)
            seeds = web.seeds(4)
            copied = False
            for step in steps:
                if step.until_complete:
                    continue
                if step.machines != ["admin"] and not copied:
                    # the operator's copy of the bundles, once the admin machine made them
                    for m, bundle in BUNDLES.items():
                        shutil.copy(machines.home("admin") / bundle, machines.home(m) / bundle)
                    copied = True
                for m in step.machines:
                    if step.file:
                        machines.write(m, step.file, step.body)
                        continue
                    out = await machines.run(m, step.body)
                    assert out.returncode == 0, f"on {m}:\n{step.body}\n{out.stdout}\n{out.stderr}"
            for m in HOSTS:  # the operator's seed list
                (machines.home(m) / "etc/dedupnet/seeds.txt").write_text("\n".join(seeds) + "\n")
            for m, n in [*CENTERS.items(), *HOSTS.items()]:
                d = machines.daemon(m, "center" if m in CENTERS else "local", n, unit)
                (machines.home(m) / "var/lib/dedupnet").mkdir(parents=True, exist_ok=True)  # StateDirectory=
                d.start(lab, Path(machines.localise(m, unit_setting(unit, "WorkingDirectory"))))
                daemons.append(d)

            (check,) = [s for s in steps if s.until_complete]
            with trio.move_on_after(180):
                while True:
                    await trio.sleep(1.0)
                    for d in daemons:
                        d.check_alive()
                    if sum(web.answer_counts.values()) < len(seeds):
                        continue
                    verdict = await machines.run("admin", check.body)
                    if verdict.returncode == 0:
                        break
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            codes = await stop(daemons)
        trio.socket.set_custom_socket_factory(None)

    logs = "\n".join(f"--- {d.ns}\n{d.log_tail()}" for d in daemons)
    assert verdict is not None and verdict.returncode == 0, (
        f"never complete; last answer:\n{verdict and verdict.stdout}{verdict and verdict.stderr}\n{logs}")
    report = verdict.stdout
    assert report.rstrip().endswith("verdict: complete"), report
    for n in CENTERS.values():
        assert f"network {n}  center" in report, report
    for ip in ("10.1.0.10", "10.1.0.11", "10.2.0.10", "10.2.0.11"):
        assert ip in report, report
    reach = web.reachable_detail(seeds)
    assert web.duplicate_fetches() == 0
    assert reach.fetched == set(web.answer_counts), "pages never fetched, or fetched though unreachable"
    assert len(reach.fetched) > 100
    assert set(codes.values()) == {0}, f"{codes}\n{logs}"

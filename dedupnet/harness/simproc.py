"""``dedupnet sim --processes``: the simulation with every daemon as its own OS process.

Every center and host runs through the same ``dedupnet center`` / ``dedupnet local``
commands a user would type (``python -m dedupnet.cli ...``), each with stdout and
stderr in a log file of a temporary directory (kept, and its path printed, when the
run fails). What stays in this (harness) process: the synthetic web, the seeding and
the observation. All daemons share the Redis server given, each under the key prefix
the in-process cluster uses (``<prefix>:center<L>``, ``<prefix>:host:<ip>``).

The harness knows the daemons only from outside: it polls each one's status port (what
``dedupnet status`` shows) for progress, quiescence and, at the end, the counters of the
report. What that cannot give is reported as such: discovery-to-admission latency is
``None`` and Redis round trips are 0 (the daemons' stores are in other processes).
Status replies are monitoring, not protocol: the frames and bytes the daemons sent to
this harness's status requests are taken out of the report's frame and byte counts.

Supported: modes ``exact`` and ``paper``; scenarios ``default``, ``concurrent`` and
``restart`` (center 1 gets SIGTERM a third of the way in and is started again with
the same command). ``owner`` (no daemons) and ``churn`` (a host leaving for good needs
the in-process handle) are refused with a clear error.

Faults (``cfg.faults``, ``dedupnet sim --processes --fault SPEC``): every
process fault of :mod:`dedupnet.harness.faults`, carried out by :mod:`dedupnet.harness.procfaults`
(signals to the daemons; ``kill-redis`` makes the run start its own persistent server
on a fixed port instead of using the one given, so that it can kill and restart it).
The run is not quiescent while a fault is under way. Link faults (``partition``,
``lossy-wan``, ``lossy-lan``, ``duplicate-frames``) go through the fault-injecting relays
of :mod:`dedupnet.harness.relay`, run in this harness process (:func:`start_link_faults`): the
link a fault names is given to its dialing daemon as the relay's address (a host's
``--center``, the lower-numbered center's ``--peer`` address of the higher one), and
the relay connects on from that daemon's own loopback IP, so the center's source-address
check sees the real host or peer. The same seed draws the same link schedule as the
one-process simulation (:func:`dedupnet.harness.relay.schedule_link_faults`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import redis
import trio

from dedupnet.adapters.redis_cluster import admin_client
from dedupnet.adapters.store import is_cluster_url
from dedupnet.adapters.store_choice import store_for
from local_host.pools import HostPools

from dedupnet.codec import wire
from dedupnet.codec.auth import Keyring, keyring_from, new_key_line, write_key_file
from dedupnet.harness.cluster import center_ip, host_ip, lan
from dedupnet.adapters.children import free_port, spawn
from dedupnet.codec.errors import DedupnetError
from dedupnet.codec.messages import Heartbeat, Register, Status
from dedupnet.codec.settings import CENTER, LOCAL, SETTINGS, SIM
from dedupnet.adapters.metrics import Counters
from dedupnet.harness.faults import LINK_FAULTS, PROCESS_FAULTS, Fault, format_fault, resolve, target_parts
from dedupnet.adapters.netinfo import source_ip_towards
from dedupnet.harness.powercut import LoopDisk, unavailable
from dedupnet.harness.procfaults import FaultRecord, FaultRunner, KillableRedis
from dedupnet.harness.relay import LinkFaults, host_name, schedule_link_faults, start_link_relays, wan_name
from dedupnet.harness.report import (
    Observer, Report, SimConfig, build_report, assign_seeds, check_routing, check_secure, progress_line,
    redis_memory, seed_count, wants_lan_key,
)
from dedupnet.adapters.transport import ConnectionClosed, connect
from dedupnet.harness.web import SyntheticWeb, WebSpec

__all__ = ["PROCESS_MODES", "PROCESS_SCENARIOS", "DaemonFailed", "simulate_processes"]

PROCESS_MODES = ("exact", "paper")
PROCESS_SCENARIOS = ("default", "concurrent", "restart")

_ROOT = Path(__file__).resolve().parents[2]  # holds dedupnet/, center_host/, local_host/
_STATUS_FRAMES = 'frames_sent{kind="status"}'
_POLL = 0.2
_LOG_TAIL = 30
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far; 0 if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()  # from field 3 (state) on
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime: fields 14, 15


class DaemonFailed(RuntimeError):
    """A daemon process exited (or never answered) when it should be running."""


@dataclass
class Daemon:
    """One ``dedupnet center`` / ``dedupnet local`` process and what the harness saw of it."""

    name: str  # "center<L>" or the host's IP
    role: str  # "center" | "host"
    network: int
    address: tuple[str, int]  # its status port (a center's --listen)
    prefix: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    #: The last status body it answered, and the status replies (frames, bytes) it had
    #: sent to the harness before that one: its counters include them.
    status: dict | None = None
    control_before: tuple[int, int] = (0, 0)
    _control: list[int] = field(default_factory=lambda: [0, 0])
    #: Counters of earlier lives (the restart scenario), monitoring taken out.
    carried: Counter = field(default_factory=Counter)
    #: CPU seconds (/proc/<pid>/stat) when the measured run started (of this life), and
    #: those of earlier lives since then.
    cpu_base: float = 0.0
    cpu_carried: float = 0.0
    #: Under a fault (killed, frozen, leaving): not polled, not expected to answer.
    down: bool = False
    #: Left for good (leave-host): not part of the system any more.
    gone: bool = False
    #: The LAN keyring (``--lan-key``, ``--secure``): the harness's status requests
    #: are tagged with it, as ``dedupnet status --lan-key-file`` does.
    keyring: Keyring | None = None
    #: Its own embedded Redis's data dir (``kill-host-redis``: the daemon starts, and must
    #: keep running, a server of its own); None: the run's shared server.
    data_dir: Path | None = None

    def redis_url(self, shared: str) -> str:
        """Where its keys are: its own server (its ``redis.url``), or the shared one."""
        if self.data_dir is None:
            return shared
        return (self.data_dir / "redis.url").read_text().strip()

    def cpu(self) -> float:
        """CPU seconds (user + system) this life's process has used so far; 0 if gone."""
        return 0.0 if self.proc is None else cpu_seconds(self.proc.pid)

    def mark_cpu(self) -> None:
        """From now on: the run's CPU is counted from here."""
        self.cpu_base, self.cpu_carried = self.cpu(), 0.0

    def cpu_used(self) -> float:
        """CPU seconds since :meth:`mark_cpu`, over all lives."""
        return self.cpu_carried + max(self.cpu() - self.cpu_base, 0.0)

    def start(self, cwd: Path, env: dict) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            # spawn: PR_SET_PDEATHSIG, so a daemon dies with the harness even if it is killed outright.
            self.proc = spawn(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                               cwd=cwd, env=env)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise DaemonFailed(f"{self.role} {self.name} exited with code {self.proc.returncode} "
                               f"(log: {self.log_path}):\n{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "  (no log)"
        return "\n".join("  | " + line for line in lines[-_LOG_TAIL:])

    async def poll_status(self, timeout: float = 3.0) -> dict | None:
        """What ``dedupnet status`` asks (:func:`dedupnet.service.daemons.fetch_status`), counting
        the reply's frames and bytes; None when it does not answer."""
        counters = Counters()
        before = (self._control[0], self._control[1])
        try:
            ip = source_ip_towards(self.address[0])
            register = Register(ip, 0, "control", f"{ip}:1")
            with trio.fail_after(timeout):
                # compress=False: no Welcome, so the daemon's frames_sent{kind="welcome"}
                # stays the protocol's own (the report's frames per URL), not the polls'.
                async with await connect(*self.address, register, local_ip=ip, counters=counters,
                                         keyring=self.keyring, compress=False) as conn:
                    conn.send_nowait(wire.encode(Status(True)))
                    while True:
                        reply = await conn.receive()
                        if isinstance(reply, Status):
                            body = reply.body or {}
                            break
                        if not isinstance(reply, Heartbeat):
                            return None
        except (OSError, trio.TooSlowError, trio.BrokenResourceError, ConnectionClosed, DedupnetError):
            return None  # refused, closed, timed out, garbled: not answering
        finally:
            self._control[0] += counters.total("frames_received")
            self._control[1] += counters.get("received_bytes")
        self.status, self.control_before = body, before
        return body

    def counters(self) -> dict[str, int]:
        """Its counters over all its lives, without the status replies sent to the harness."""
        snap = Counter(self.carried)
        if self.status is not None:
            snap.update(self.status.get("counters", {}))
            frames, nbytes = self.control_before
            snap[_STATUS_FRAMES] -= frames
            snap["sent_bytes"] -= nbytes
        return {k: v for k, v in sorted(snap.items()) if v > 0}

    def new_life(self) -> None:
        """Before a restart: keep what this life counted, start the next from zero."""
        self.carried = Counter(self.counters())
        self.status, self.control_before, self._control = None, (0, 0), [0, 0]


class SnapshotCounters:
    """The read side of :class:`dedupnet.adapters.metrics.Counters` over a status snapshot
    (``{'name{label="v",...}': n}``), for :func:`dedupnet.harness.report.build_report`."""

    _SERIES = re.compile(r'^([^{]+)(?:\{(.*)\})?$')
    _LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

    def __init__(self, snap: dict[str, int]):
        self._snap = dict(snap)

    def _parse(self, series: str) -> tuple[str, dict[str, str]]:
        m = self._SERIES.match(series)
        if m is None:
            return series, {}
        return m.group(1), dict(self._LABEL.findall(m.group(2) or ""))

    def snapshot(self) -> dict[str, int]:
        return dict(self._snap)

    def get(self, name: str, **labels: object) -> int:
        want = {k: str(v) for k, v in labels.items()}
        return sum(v for k, v in self._snap.items() if self._parse(k) == (name, want))

    def total(self, name: str) -> int:
        return sum(v for k, v in self._snap.items() if self._parse(k)[0] == name)


def _check(cfg: SimConfig) -> None:
    if cfg.mode not in PROCESS_MODES:
        raise ValueError(f"--processes runs the protocol's daemons: mode {cfg.mode!r} is not supported "
                         f"(supported: {', '.join(PROCESS_MODES)}; run {cfg.mode!r} without --processes)")
    if cfg.scenario not in PROCESS_SCENARIOS:
        raise ValueError(f"--processes does not support scenario {cfg.scenario!r} yet "
                         f"(supported: {', '.join(PROCESS_SCENARIOS)}; run {cfg.scenario!r} without --processes)")
    if cfg.send_delay:
        raise ValueError("--send-delay is a fault hook of the one-process simulation; run it without --processes")
    check_faults(cfg)
    check_secure(cfg)
    check_routing(cfg)


#: Fault kinds ``--processes`` carries out: process faults (dedupnet/harness/procfaults.py) and
#: link faults (the relays of dedupnet/harness/relay.py, :func:`start_link_faults`).
SUPPORTED_FAULTS = PROCESS_FAULTS + LINK_FAULTS


def check_faults(cfg: SimConfig) -> None:
    """ValueError, before anything starts, for a fault this runner cannot carry out or
    a target the layout lacks."""
    leaving: Counter[int] = Counter()
    for i, f in enumerate(cfg.faults):
        if f.kind not in SUPPORTED_FAULTS:
            raise ValueError(f"{f.kind}: not a fault --processes can carry out")
        if f.kind in LINK_FAULTS:
            continue
        r = resolve(f, cfg.seed, cfg.networks, cfg.hosts, i)
        if r.kind == "leave-host":
            leaving[target_parts(r.target)[0]] += 1
    for network, n in leaving.items():
        if n >= cfg.hosts:
            raise ValueError(f"{n} leave-host faults in network {network} of {cfg.hosts} hosts: "
                             f"nobody would be left to crawl its tasks")
    _link_schedule(cfg)  # a link target the layout lacks, a WAN fault on one network


def _link_faults_of(cfg: SimConfig) -> list[Fault]:
    return [f for f in cfg.faults if f.kind in LINK_FAULTS]


def _link_schedule(cfg: SimConfig):
    return schedule_link_faults(_link_faults_of(cfg), cfg.networks, cfg.hosts, cfg.seed)


async def start_link_faults(cfg: SimConfig, nursery: trio.Nursery,
                            center_ports: dict[int, int]) -> tuple[LinkFaults | None, dict[str, tuple[str, int]]]:
    """The link faults of ``cfg`` with ``--processes``: one clean relay per link a fault
    names, run in ``nursery`` (this harness process) in front of the center that link
    reaches (:func:`dedupnet.harness.relay.start_link_relays`), and the controller that switches
    the faults on and off (:class:`dedupnet.harness.relay.LinkFaults`, ticked by the run).
    Returns the controller (None without link faults) and each link's relay address,
    which :func:`_plan` gives the link's dialing daemon instead of the center's."""
    schedule = _link_schedule(cfg)
    if not schedule:
        return None, {}
    relays = await start_link_relays(nursery, [link for f in schedule for link in f.links],
                                     lambda n: (center_ip(n), center_ports[n]), seed=cfg.seed)
    return LinkFaults(schedule, relays, nursery), {link: r.address for link, r in relays.items()}


def _link_records(cfg: SimConfig, links: LinkFaults, trio_t0: float, end: float) -> list[dict]:
    """The link faults as report fault records (what ``--chaos`` prints and reproduces):
    when each was on, in seconds since the crawl began; one without an end lasted to ``end``."""
    records = []
    for i, (f, sf) in enumerate(zip(_link_faults_of(cfg), links.schedule)):
        rec = FaultRecord(format_fault(Fault(f.kind, sf.at, f.duration, f.target)), sf.kind, sf.target, sf.at,
                          sf.duration)
        if i in links.windows:
            start, stop = links.windows[i]
            rec.started = round(start - trio_t0, 2)
            rec.ended = round(stop - trio_t0, 2) if stop is not None else round(end, 2)
            done = {k: sum(links.relays[l].counters[k] for l in sf.links) for k in ("messages", "refused")}
            resets = sum(v for l in sf.links for k, v in links.relays[l].counters.items() if k.startswith("resets:"))
            rec.note = (f"relays {', '.join(sf.links)}: {done['messages']:,} messages, {resets:,} resets"
                        + (", to the end of the run" if stop is None else ""))
        else:
            rec.note = "not injected: the crawl ended before its moment"
        records.append(rec.to_json())
    return records


def _center_ports(cfg: SimConfig) -> dict[int, int]:
    """A port free now for each center (it binds it a moment later; a lost race shows as
    a daemon exiting at start, reported with its log)."""
    return {n: free_port(center_ip(n)) for n in range(1, cfg.networks + 1)}


def _tls_flags(cfg: SimConfig, tls_dir: Path | None, role: str, network: int) -> list[str]:
    """``--secure``: a center's --tls-cert/--tls-key/--tls-ca (made by dedupnet certs'
    code for the run); with ``--lan-tls`` --lan-tls on both, and the CA for hosts."""
    if tls_dir is None:
        return []
    lan = ["--lan-tls"] if cfg.lan_tls else []
    if role == "center":
        return ["--tls-cert", str(tls_dir / f"center-{network}.pem"), "--tls-key",
                str(tls_dir / f"center-{network}-key.pem"), "--tls-ca", str(tls_dir / "ca.pem"), *lan]
    return [*lan, "--tls-ca", str(tls_dir / "ca.pem")] if lan else []


def _plan(cfg: SimConfig, redis_url: str, prefix: str, logdir: Path, ports: dict[int, int] | None = None,
          via: dict[str, tuple[str, int]] | None = None,
          tls_dir: Path | None = None, key_file: Path | str | None = None) -> tuple[list[Daemon], list[Daemon]]:
    """Every daemon's command line. ``ports``: the centers' (drawn if None); ``via``:
    the relay address of each relayed link (``wan:A-B``, ``host:N.I``), given to the
    daemon that dials it instead of the center it reaches; ``tls_dir``: the run's
    certificates (``--secure``); ``key_file``: the LAN key file every daemon gets as
    ``--lan-key-file`` (``--lan-key``, ``--secure``)."""
    keyring = keyring_from(key_file)
    keys = [] if key_file is None else ["--lan-key-file", str(key_file), "--key-poll-interval", f"{cfg.key_poll_interval:g}"]
    cli = [sys.executable, "-m", "dedupnet.cli"]
    ports = ports if ports is not None else _center_ports(cfg)
    via = via or {}
    # A power cut: every daemon keeps its data in its own embedded Redis on its own disk.
    power = wants_disks(cfg)

    def store_flags(target: str) -> list[str]:
        return ["--data-dir", str(disk_dir(logdir, target))] if power else ["--redis", redis_url]

    centers = []
    for n, port in ports.items():
        argv = [*cli, "center", "--network", str(n), "--ip", center_ip(n), "--lan", lan(n),
                "--listen", f"{center_ip(n)}:{port}", *store_flags(f"center:{n}"), "--prefix", f"{prefix}:center{n}",
                "--log-level", "INFO", *run_settings(cfg, CENTER),
                "--no-discovery"]  # hosts are told their center; a simulation opens no UDP port
        argv += _tls_flags(cfg, tls_dir, "center", n) + keys
        for m, peer_port in ports.items():
            if m != n:
                # The lower-numbered center dials the higher one (center_host/daemon.py _dial):
                # its --peer address is the link's relay if there is one.
                host, port_m = via.get(wan_name(n, m), (center_ip(m), peer_port)) if n < m else (center_ip(m), peer_port)
                argv += ["--peer", f"{m},{host}:{port_m},{lan(m)}"]
        centers.append(Daemon(f"center{n}", "center", n, (center_ip(n), port), f"{prefix}:center{n}", argv,
                              logdir / f"center{n}.log", keyring=keyring,
                              data_dir=disk_dir(logdir, f"center:{n}") if power else None))
    hosts = []
    own = {r.target for i, f in enumerate(cfg.faults) if f.kind == "kill-host-redis"
           for r in [resolve(f, cfg.seed, cfg.networks, cfg.hosts, i)]}
    for n in range(1, cfg.networks + 1):
        for i in range(cfg.hosts):
            ip = host_ip(n, i)
            port = free_port(ip)
            center_host, center_port = via.get(host_name(n, i), (center_ip(n), ports[n]))
            data_dir = (disk_dir(logdir, f"host:{n}.{i}") if power else
                        logdir / f"redis-{ip}" if f"host:{n}.{i}" in own else None)
            store = ["--redis", redis_url] if data_dir is None else ["--data-dir", str(data_dir)]
            argv = [*cli, "local", "--network", str(n), "--ip", ip, "--lan", lan(n),
                    "--center", f"{center_host}:{center_port}", "--listen", f"{ip}:{port}",
                    *store, "--prefix", f"{prefix}:host:{ip}", "--log-level", "INFO", *run_settings(cfg, LOCAL)]
            argv += _tls_flags(cfg, tls_dir, "host", n) + keys
            hosts.append(Daemon(ip, "host", n, (ip, port), f"{prefix}:host:{ip}", argv, logdir / f"host-{ip}.log",
                                keyring=keyring, data_dir=data_dir))
    return centers, hosts


def run_settings(cfg: SimConfig, role: str) -> list[str]:
    """The flags that give a daemon of ``role`` the run's value of every setting marked
    ``sim`` (dedupnet/codec/settings.py): a setting declared there reaches the daemons
    with no edit here."""
    return [arg for s in SETTINGS.values() if SIM in s.roles and role in s.roles for arg in s.argv(cfg.setting(s.name))]


def wants_disks(cfg: SimConfig) -> bool:
    """A ``power-cut`` run: every daemon's Redis on a disk of its own (dedupnet/harness/powercut.py)."""
    return any(f.kind == "power-cut" for f in cfg.faults)


def disk_dir(logdir: Path, target: str) -> Path:
    """The data dir of ``target``'s Redis on its own disk (mounted at ``disks/<target>/mnt``)."""
    return logdir / "disks" / target.replace(":", "-") / "mnt" / "data"


def _make_disks(cfg: SimConfig, logdir: Path) -> dict[str, LoopDisk]:
    """One loop-mounted ext4 per daemon; every one made is removed again if one fails."""
    reason = unavailable()
    if reason is not None:
        raise ValueError(f"power-cut: {reason}")
    disks: dict[str, LoopDisk] = {}
    try:
        for target in [f"center:{n}" for n in range(1, cfg.networks + 1)] + [
                f"host:{n}.{i}" for n in range(1, cfg.networks + 1) for i in range(cfg.hosts)]:
            disks[target] = LoopDisk(disk_dir(logdir, target).parent.parent).create()
    except BaseException:
        _remove_disks(disks)
        raise
    return disks


def _remove_disks(disks: dict[str, LoopDisk]) -> list[str]:
    problems = []
    for target, disk in disks.items():
        try:
            disk.remove()
        except OSError as e:
            problems.append(f"the disk of {target} could not be unmounted: {e}")
    return problems


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


async def _poll_all(daemons: list[Daemon]) -> dict[str, dict | None]:
    """Every daemon's status at once; raises DaemonFailed if one has exited."""
    results: dict[str, dict | None] = {}

    async def one(d: Daemon) -> None:
        results[d.name] = await d.poll_status()

    live = [d for d in daemons if not d.down and not d.gone]
    async with trio.open_nursery() as nursery:
        for d in live:
            nursery.start_soon(one, d)
    for d in live:
        if not d.down:  # a fault may have begun while it was polled
            d.check_alive()
    return results


def _connected(centers: list[Daemon], hosts: list[Daemon], st: dict[str, dict | None]) -> bool:
    if any(not (st.get(h.name) or {}).get("connected") for h in hosts):
        return False
    for c in centers:
        status = st.get(c.name)
        members = set(status.get("members", {})) if status else set()
        want = {h.name for h in hosts if h.network == c.network}
        want |= {f"net:{o.network}" for o in centers if o is not c}
        if not want <= members:
            return False
    return True


async def _wait(what: str, daemons: list[Daemon], ready, timeout: float) -> None:
    with trio.move_on_after(timeout):
        while True:
            st = await _poll_all(daemons)
            if ready(st):
                return
            await trio.sleep(_POLL)
    pending = [d.name for d in daemons if d.status is None]
    raise DaemonFailed(f"{what}: not done after {timeout:.0f} s" +
                       (f" (no status from {', '.join(pending)})" if pending else ""))


async def _start(centers: list[Daemon], hosts: list[Daemon], logdir: Path, env: dict, timeout: float) -> None:
    """Centers first (each answers its status port), then hosts; until all are connected."""
    for d in centers:
        d.start(logdir, env)
    await _wait("starting the centers", centers, lambda st: all(st.values()), timeout)
    for d in hosts:
        d.start(logdir, env)
    await _wait("connecting every host and center", centers + hosts,
                lambda st: _connected(centers, hosts, st), timeout)


async def _stop(daemons: list[Daemon], timeout: float) -> list[str]:
    """SIGTERM the hosts, then the centers (a host stopped by SIGTERM hands its tasks
    back to its center, which must still be there), wait (bounded), SIGKILL the
    stragglers, reap all. Returns what went wrong (exit codes other than 0)."""
    hosts = [d for d in daemons if d.role == "host"]
    if hosts and len(hosts) < len(daemons):
        return await _stop(hosts, timeout) + await _stop([d for d in daemons if d.role != "host"], timeout)
    problems = []
    running = [d for d in daemons if d.alive()]
    for d in running:
        try:
            d.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    with trio.move_on_after(timeout):
        while any(d.alive() for d in running):
            await trio.sleep(0.05)
    for d in daemons:
        if d.alive():
            problems.append(f"{d.name} did not stop within {timeout:.0f} s of SIGTERM: killed")
            d.proc.kill()
        if d.proc is not None:
            try:
                d.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
                problems.append(f"{d.name} (pid {d.proc.pid}) did not die on SIGKILL")
                continue
            if any(d is r for r in running) and d.proc.returncode not in (0, -signal.SIGTERM):
                problems.append(f"{d.name} exited with code {d.proc.returncode}")
    return problems


async def _restart(d: Daemon, logdir: Path, env: dict, timeout: float) -> None:
    """SIGTERM one daemon and start it again with the same command (same port, same keys)."""
    await d.poll_status()  # its latest counters, carried into the next life
    d.new_life()
    cpu_so_far = d.cpu_used()
    d.proc.send_signal(signal.SIGTERM)
    with trio.move_on_after(timeout):
        while d.alive():
            await trio.sleep(0.05)
    if d.alive():
        d.proc.kill()
    d.proc.wait(timeout=5)
    d.cpu_carried = cpu_so_far
    await _start_again(d, logdir, env, timeout)


async def _start_again(d: Daemon, logdir: Path, env: dict, timeout: float) -> None:
    """Start a stopped or killed daemon with its command (same port, same keys) and wait
    until its status port answers; its CPU counts from then on."""
    d.start(logdir, env)
    with trio.move_on_after(timeout):
        while await d.poll_status() is None:
            d.check_alive()
            await trio.sleep(_POLL)
    if d.status is None:
        raise DaemonFailed(f"{d.name} did not answer within {timeout:.0f} s of its restart:\n{d.log_tail()}")
    d.cpu_base = d.cpu()  # the start-up of the new life is not counted


def _push(redis_url: str, prefix: str, urls: list[str]) -> None:
    store = store_for(redis_url, prefix)
    try:
        HostPools(store, exact=True).push(urls)
    finally:
        store.close()


async def _seed(redis_url: str, hosts: list[Daemon], seeds: list[str], scenario: str) -> dict[str, list[str]]:
    """As :func:`dedupnet.harness.sim._seed`, through each host's keys on the shared server."""
    if scenario == "concurrent":
        async with trio.open_nursery() as n:
            for h in hosts:
                n.start_soon(trio.to_thread.run_sync, _push, h.redis_url(redis_url), h.prefix, seeds)
        return {h.name: list(seeds) for h in hosts}
    by_ip = {h.name: h for h in hosts}
    plan = assign_seeds(list(by_ip), seeds)
    for ip, urls in plan.items():
        if urls:
            await trio.to_thread.run_sync(_push, by_ip[ip].redis_url(redis_url), by_ip[ip].prefix, urls)
    return plan


def _quiet(d: Daemon, st: dict | None) -> bool:
    if not st:
        return False
    pools = st.get("pools", {})
    if d.role == "center":
        return not st.get("sets_in_flight") and not pools.get("task_URL")
    crawler = st.get("crawler")  # None: --no-crawl, the host's tasks are its other crawlers'
    idle = crawler is None or (crawler.get("idle") and not crawler.get("in_progress"))
    return bool(st.get("connected") and idle
                and not pools.get("URL_pool") and not pools.get("task_pool") and not pools.get("unacked_sets")
                and not st.get("sets_in_flight", {}).get("unacked"))


def _sizes(daemons: list[Daemon], st: dict[str, dict | None]) -> dict[str, int]:
    sizes: Counter[str] = Counter({"URL_pool": 0, "task_pool": 0, "reduce_pools": 0, "task_URL": 0})
    for d in daemons:
        s = st.get(d.name)
        if not s:
            continue
        pools = s.get("pools", {})
        if d.role == "host":
            sizes["URL_pool"] += pools.get("URL_pool", 0)
            sizes["task_pool"] += pools.get("task_pool", 0)
        else:
            sizes["reduce_pools"] += sum(s.get("sets_in_flight", {}).values())
            sizes["task_URL"] += pools.get("task_URL", 0)
    return dict(sizes)


async def _run_to_quiescence(cfg: SimConfig, centers, hosts, web: SyntheticWeb, timeline: list, t0: float,
                             out, restart, faults: FaultRunner | None = None, total: int = 0,
                             links: LinkFaults | None = None) -> bool:
    """As :func:`dedupnet.harness.sim._run_to_quiescence`, from the daemons' status ports.
    Faults start once their share of the ``total`` URLs is fetched; the run is not
    quiescent while one is under way (a daemon down or frozen answers nothing, a link
    fault with an end has not ended yet)."""
    daemons = centers + hosts
    quiet, next_print, restarted = 0, 0.0, False
    with trio.move_on_after(cfg.timeout) as scope:
        async with trio.open_nursery() as nursery:
            while quiet < 2:
                await trio.sleep(_POLL)
                st = await _poll_all(daemons)
                sizes = _sizes(daemons, st)
                now = time.perf_counter() - t0
                fetched = sum(web.answer_counts.values())
                sample = {"t": round(now, 2), "pages_fetched": fetched, "duplicates": web.duplicate_fetches(), **sizes}
                timeline.append(sample)
                if cfg.scenario == "restart" and not restarted and fetched >= cfg.pages // 3:
                    restarted = True
                    await restart(centers[0])
                    quiet = 0
                    continue
                if faults is not None:
                    faults.start_due(nursery, fetched, total)
                if links is not None:
                    links.tick(fetched / max(total, 1))
                done = (not (faults and faults.busy) and not any(d.down for d in daemons)
                        and (links is None or links.settled)
                        and all(_quiet(d, st.get(d.name)) for d in daemons if not d.gone))
                quiet = quiet + 1 if done else 0
                if out is not None and now >= next_print:
                    next_print = now + cfg.progress_every
                    print(progress_line(sample), file=out, flush=True)
            nursery.cancel_scope.cancel()
    return scope.cancelled_caught


def _build_report(cfg, web, seeds, centers, hosts, server, timeline, wall, timed_out, **extra) -> Report:
    """:func:`dedupnet.harness.report.build_report` over the daemons' status counters instead of live objects."""
    system = SimpleNamespace(
        centers={c.network: SimpleNamespace(counters=SnapshotCounters(c.counters())) for c in centers},
        hosts={h.name: SimpleNamespace(counters=SnapshotCounters(h.counters())) for h in hosts},
    )
    report = build_report(cfg, web, seeds, system, server, Observer(), timeline, wall, timed_out, **extra)
    report.config["processes"] = True
    return report


async def _run(cfg, redis_url, prefix, web, seeds, centers, hosts, server, logdir, env, out, startup_timeout,
               killable: KillableRedis | None = None, links: LinkFaults | None = None,
               disks: dict[str, LoopDisk] | None = None) -> Report:
    t_start = time.perf_counter()
    await _start(centers, hosts, logdir, env, startup_timeout)
    if out is not None:
        print(f"  {len(centers)} center and {len(hosts)} host processes connected after "
              f"{time.perf_counter() - t_start:.1f} s", file=out, flush=True)
    server.config_resetstat()
    for c in centers:
        c.mark_cpu()
    plan = await _seed(redis_url, hosts, seeds, cfg.scenario)
    t0 = time.perf_counter()
    trio_t0 = trio.current_time()
    timeline: list[dict] = []

    async def restart(d: Daemon) -> None:
        await _restart(d, logdir, env, startup_timeout)

    async def start_again(d: Daemon) -> None:
        await _start_again(d, logdir, env, startup_timeout)

    faults = None
    if any(f.kind in PROCESS_FAULTS for f in cfg.faults):
        resolved = [resolve(f, cfg.seed, cfg.networks, cfg.hosts, i) for i, f in enumerate(cfg.faults)
                    if f.kind in PROCESS_FAULTS]
        by_target = {f"center:{c.network}": c for c in centers}
        by_target |= {f"host:{h.network}.{int(h.name.rsplit('.', 1)[1]) - 10}": h for h in hosts}
        faults = FaultRunner(resolved, by_target, start_again, killable, t0, out, disks=disks or {})
    total = len(web.reachable_detail(seeds, max_depth=cfg.max_depth).fetched)
    if links is not None:
        links.total = total
    timed_out = await _run_to_quiescence(cfg, centers, hosts, web, timeline, t0, out, restart, faults, total, links)
    wall = time.perf_counter() - t0
    await _poll_all(centers + hosts)  # the counters as they are now
    cpu = sum(c.cpu_used() for c in centers)
    memory = await trio.to_thread.run_sync(redis_memory, server, prefix)
    killed = frozenset()
    if faults is not None:
        faults.not_started()
        killed = faults.killed_hosts()
    report = _build_report(cfg, web, seeds, centers, hosts, server, timeline, wall, timed_out, plan=plan,
                           center_cpu=cpu, memory=memory, killed=killed)
    if faults is not None:
        report.faults = [r.to_json() for r in faults.records]
    if links is not None:
        report.faults = sorted(report.faults + _link_records(cfg, links, trio_t0, wall), key=lambda r: r["at"])
        report.links = links.summary(t0=trio_t0)
    return report


async def simulate_processes(cfg: SimConfig, redis_url: str, *, out=sys.stdout, startup_timeout: float = 60.0,
                             stop_timeout: float = 15.0) -> Report:
    """Run one simulation with every center and host as its own ``dedupnet`` process,
    to quiescence (or ``cfg.timeout``), and report it like :func:`dedupnet.harness.sim.simulate`.

    ``startup_timeout`` bounds starting and connecting the daemons (and a restart);
    ``stop_timeout`` the wait after SIGTERM before SIGKILL. Whatever happens, every
    daemon is stopped and reaped and the run's keys are removed before this returns
    or raises; the daemons' logs are kept (path printed) unless the run succeeded.
    """
    _check(cfg)
    if is_cluster_url(redis_url) and any(f.kind == "kill-redis" for f in cfg.faults):
        raise ValueError("kill-redis kills the run's own single server, not a cluster's node: run it without "
                         "--redis-cluster (tests/test_redis_cluster.py kills a cluster master)")
    web = SyntheticWeb(WebSpec(pages=cfg.pages, sites=cfg.sites, seed=cfg.seed), port=0, latency=cfg.web_latency)
    prefix = f"simproc-{cfg.mode}-{cfg.seed}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    logdir = Path(tempfile.mkdtemp(prefix="dedupnet-simproc-"))
    env = _env()
    killable = None
    if any(f.kind == "kill-redis" for f in cfg.faults):
        # A server this run may kill: its own, persistent, on a fixed port (not redis_url).
        killable = KillableRedis(logdir / "redis")
        redis_url = await trio.to_thread.run_sync(killable.start)
    server = admin_client(redis_url)  # redis-py's RedisCluster for redis+cluster:// URLs
    daemons: list[Daemon] = []
    disks: dict[str, LoopDisk] = {}
    succeeded = False
    problems: list[str] = []
    try:
        error: Exception | None = None
        async with trio.open_nursery() as nursery:
            await nursery.start(web.serve)
            seeds = web.seeds(seed_count(cfg))
            ports = _center_ports(cfg)
            # The relays live in this process, in front of the centers, for the whole run.
            links, via = await start_link_faults(cfg, nursery, ports)
            tls_dir = None
            if cfg.secure:  # certificates for this run, removed with the logs
                from dedupnet.adapters.tls import make_certs

                tls_dir = logdir / "certs"
                await trio.to_thread.run_sync(lambda: make_certs(tls_dir, range(1, cfg.networks + 1), days=2))
            key_file = cfg.lan_key_file
            if key_file is None and wants_lan_key(cfg):  # a random LAN key for this run, removed with the logs
                key_file = logdir / "lan.keys"
                write_key_file(key_file, [new_key_line(1)])
            centers, hosts = _plan(cfg, redis_url, prefix, logdir, ports, via, tls_dir, key_file)
            daemons = centers + hosts
            try:
                if wants_disks(cfg):
                    disks = await trio.to_thread.run_sync(_make_disks, cfg, logdir)
                report = await _run(cfg, redis_url, prefix, web, seeds, centers, hosts, server, logdir, env, out,
                                    startup_timeout, killable, links, disks)
            except Exception as e:  # noqa: BLE001 - raised below as itself, not in the nursery's ExceptionGroup
                error = e
            finally:
                with trio.CancelScope(shield=True):
                    problems = await _stop(daemons, stop_timeout)
                    problems += await trio.to_thread.run_sync(_remove_disks, disks)
            nursery.cancel_scope.cancel()
        if error is not None:
            raise error
        succeeded = not report.timed_out and not problems
        return report
    finally:
        for name in [d.prefix for d in daemons] + [prefix]:
            try:
                store = store_for(redis_url, name)
                try:
                    store.delete_prefix()
                finally:
                    store.close()
            except redis.RedisError as e:
                problems.append(f"could not remove the keys under {name}: {e}")
        server.close()
        if killable is not None:
            await trio.to_thread.run_sync(killable.stop)
        dest = out if out is not None else sys.stderr
        for p in problems:
            print(f"  warning: {p}", file=dest, flush=True)
        if succeeded:
            shutil.rmtree(logdir, ignore_errors=True)
        else:
            print(f"  daemon logs kept in {logdir}", file=dest, flush=True)

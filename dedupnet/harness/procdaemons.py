"""The daemons of ``dedupnet sim --processes`` as the harness sees them, from outside:
one :class:`Daemon` per ``dedupnet center`` / ``dedupnet local`` process, its status
port polled (what ``dedupnet status`` asks) for progress, quiescence and counters, and
the daemons started, restarted and stopped in the order the protocol needs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import trio

from dedupnet.adapters.children import spawn
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.net.netinfo import source_ip_towards
from dedupnet.adapters.net.transport import ConnectionClosed, connect
from dedupnet.codec import wire
from dedupnet.codec.auth import Keyring
from dedupnet.codec.errors import DedupnetError
from dedupnet.codec.messages import Heartbeat, Register, Status

__all__ = ["Daemon", "DaemonFailed", "SnapshotCounters", "cpu_seconds", "is_quiet", "poll_all", "pool_sizes",
           "restart_daemon", "start_all", "start_daemon_again", "stop_all"]

_STATUS_FRAMES = 'frames_sent{kind="status"}'
POLL = 0.2  # seconds between two polls of the daemons' status
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
    """The read side of :class:`dedupnet.adapters.monitor.metrics.Counters` over a status snapshot
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


async def poll_all(daemons: list[Daemon]) -> dict[str, dict | None]:
    """Every daemon's status at once; raises DaemonFailed if one has exited."""
    results: dict[str, dict | None] = {}

    async def one(d: Daemon) -> None:
        results[d.name] = await d.poll_status()

    live = [d for d in daemons if not d.down and not d.gone]
    async with trio.open_nursery() as nursery:
        for d in live:
            nursery.start_soon(one, d)
    for d in live:
        if not (d.down or d.gone):  # a fault may have begun while it was polled
            d.check_alive()
    return results


def connected(centers: list[Daemon], hosts: list[Daemon], st: dict[str, dict | None]) -> bool:
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


async def wait_for(what: str, daemons: list[Daemon], ready, timeout: float) -> None:
    with trio.move_on_after(timeout):
        while True:
            st = await poll_all(daemons)
            if ready(st):
                return
            await trio.sleep(POLL)
    pending = [d.name for d in daemons if d.status is None]
    raise DaemonFailed(f"{what}: not done after {timeout:.0f} s" +
                       (f" (no status from {', '.join(pending)})" if pending else ""))


async def start_all(centers: list[Daemon], hosts: list[Daemon], logdir: Path, env: dict, timeout: float) -> None:
    """Centers first (each answers its status port), then hosts; until all are connected."""
    for d in centers:
        d.start(logdir, env)
    await wait_for("starting the centers", centers, lambda st: all(st.values()), timeout)
    for d in hosts:
        d.start(logdir, env)
    await wait_for("connecting every host and center", centers + hosts,
                lambda st: connected(centers, hosts, st), timeout)


async def stop_all(daemons: list[Daemon], timeout: float) -> list[str]:
    """SIGTERM the hosts, then the centers (a host stopped by SIGTERM hands its tasks
    back to its center, which must still be there), wait (bounded), SIGKILL the
    stragglers, reap all. Returns what went wrong (exit codes other than 0)."""
    hosts = [d for d in daemons if d.role == "host"]
    if hosts and len(hosts) < len(daemons):
        return await stop_all(hosts, timeout) + await stop_all([d for d in daemons if d.role != "host"], timeout)
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


async def restart_daemon(d: Daemon, logdir: Path, env: dict, timeout: float) -> None:
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
    await start_daemon_again(d, logdir, env, timeout)


async def start_daemon_again(d: Daemon, logdir: Path, env: dict, timeout: float) -> None:
    """Start a stopped or killed daemon with its command (same port, same keys) and wait
    until its status port answers; its CPU counts from then on."""
    d.start(logdir, env)
    with trio.move_on_after(timeout):
        while await d.poll_status() is None:
            d.check_alive()
            await trio.sleep(POLL)
    if d.status is None:
        raise DaemonFailed(f"{d.name} did not answer within {timeout:.0f} s of its restart:\n{d.log_tail()}")
    d.cpu_base = d.cpu()  # the start-up of the new life is not counted


def is_quiet(d: Daemon, st: dict | None) -> bool:
    if not st:
        return False
    pools = st.get("pools", {})
    if d.role == "center":  # and no host that is not live holds tasks on its ledger: they wait for a re-issue
        held = any(m.get("kind") == "host" and m.get("state") != "live" and m.get("ledger")
                   for m in st.get("liveness", ()))
        return not st.get("sets_in_flight") and not pools.get("task_URL") and not held
    crawler = st.get("crawler")  # None: --no-crawl, the host's tasks are its other crawlers'
    idle = crawler is None or (crawler.get("idle") and not crawler.get("in_progress"))
    return bool(st.get("connected") and idle
                and not pools.get("URL_pool") and not pools.get("task_pool") and not pools.get("unacked_sets")
                and not st.get("sets_in_flight", {}).get("unacked"))


def pool_sizes(daemons: list[Daemon], st: dict[str, dict | None]) -> dict[str, int]:
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

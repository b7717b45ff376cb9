"""Carrying out process faults on the daemons of ``dedupnet sim --processes``.

:mod:`dedupnet.harness.faults` names the faults; :mod:`dedupnet.harness.simproc` runs every daemon as
its own process; this module does to those processes what a machine does to a real
deployment, with signals, while the crawl runs:

* ``kill-host`` / ``kill-center``: SIGKILL (no clean-up runs: what the daemon holds in
  memory is gone, what it wrote to Redis stays), then, after the fault's duration, the
  same command again: same address, same key prefix, so it resumes from Redis;
* ``freeze-host`` / ``freeze-center``: SIGSTOP, then SIGCONT after the duration (a GC or
  VM pause; longer than the heartbeat timeout, the daemon's peers give it up meanwhile);
* ``leave-host``: SIGTERM, for good: the host hands its work back and is never started
  again (:func:`dedupnet.service.daemons.run_local`);
* ``kill-redis``: SIGKILL of the Redis server every daemon uses, restarted after the
  duration on the same port and data dir (AOF, ``appendfsync everysec``, as a daemon's
  own embedded server runs; docs/DECISIONS.md says why that loses nothing here).
* ``kill-host-redis``: SIGKILL of the embedded Redis a host started itself (the harness
  gives that host a ``--data-dir`` instead of the shared server); the harness restarts
  nothing: the host daemon must bring its server back and carry on
  (:func:`dedupnet.adapters.runtime.supervise_redis`).
* ``power-cut``: every daemon runs its own embedded Redis on its own loop-mounted ext4
  (:mod:`dedupnet.harness.powercut`); every filesystem is shut down without flushing its
  journal, then every Redis and daemon SIGKILLed, the filesystems unmounted and mounted
  again, and after the duration every daemon started once more on its data.
* ``host-gone-disk-lost``: SIGKILL of a host and its Redis data deleted (its key prefix
  on the shared server, or its own data dir), for good: its center must re-issue what it
  held (``reissue_after``) with no operator action.

Link faults (``partition``, ``lossy-wan``, ...) are the relay's, run by the harness:
see :func:`dedupnet.harness.simproc.start_link_faults`.

Every fault is logged (``fault ... started`` / ``ended``) and recorded in the report.
Whatever happens to the run (timeout, error), a frozen daemon is continued and a killed
Redis is started again before the harness stops the daemons.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

import trio

from dedupnet.adapters.children import free_port
from dedupnet.adapters.storage.embedded import EmbeddedRedis
from dedupnet.adapters.storage.store import Store
from local_host.pools import HostPools
from dedupnet.harness.faults import PROCESS_FAULTS, Fault, format_fault

__all__ = ["FaultRunner", "KillableRedis", "FaultRecord"]


class KillableRedis:
    """The simulation's Redis when a fault kills it: persistent (AOF in ``data_dir``,
    fsync every second, as ``dedupnet center`` / ``local`` run their own embedded
    server), on a port fixed for the whole run so that a restarted server is where the
    daemons' clients look for it."""

    def __init__(self, data_dir: Path):
        self.server = EmbeddedRedis(persistent=True, data_dir=data_dir, port=free_port("127.0.0.1"))
        self.kills = 0

    def start(self) -> str:
        return self.server.start()

    def kill(self) -> None:
        """SIGKILL: no SHUTDOWN, no final fsync (the AOF has what was written to it)."""
        pid = self.server.pid
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        self.server._proc.wait()
        self.kills += 1

    def restart(self) -> None:
        """Start it again on the same port and data dir; it loads the AOF before answering."""
        self.server.restart()

    def stop(self) -> None:
        self.server.stop()


@dataclass
class FaultRecord:
    """One fault of a run, resolved, and what the harness saw of it."""

    spec: str
    kind: str
    target: str
    at: float
    duration: float | None
    started: float | None = None  # seconds since the crawl began
    ended: float | None = None
    note: str = ""
    #: ``power-cut``: the pages the hosts' crawlers had in progress (leased, not yet recorded
    #: as done) just before the cut, from their status, plus the pages the web was asked
    #: for from that poll until the restart (started between the poll and the cut: a
    #: crawler takes a task the moment a site may be fetched); None if one did not
    #: answer. A re-fetch after the cut can only be one of these, which is how a run's
    #: duplicates are bounded.
    in_flight: int | None = None

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class FaultRunner:
    """Starts each fault once ``at`` of the run's URLs are fetched, runs it as its own
    task, and tells the harness when none is under way (quiescence means nothing while
    a daemon is down or frozen)."""

    faults: list[Fault]
    daemons: dict[str, object]  # target -> procdaemons.Daemon ("host:1.0", "center:1")
    restart: Callable[[object], Awaitable[None]]  # start a killed daemon again, wait for its status port
    redis: KillableRedis | None
    t0: float
    out: object = None
    records: list[FaultRecord] = field(default_factory=list)
    active: int = 0
    #: Each daemon's disk (target -> LoopDisk) when the run has a ``power-cut``.
    disks: dict[str, object] = field(default_factory=dict)
    #: The run's SyntheticWeb, whose request log tells what started around a power cut.
    web: object = None
    #: The shared Redis's URL (a gone host's keys are deleted there).
    redis_url: str | None = None

    def __post_init__(self) -> None:
        self._pending = list(self.faults)
        #: One fault at a time per target: a second one waits for the first to end
        #: (a kill of a daemon already down, or of a Redis not restarted yet, is no fault).
        self._locks: dict[str, trio.Lock] = {}
        for f in self.faults:
            self.records.append(FaultRecord(format_fault(f), f.kind, f.target, f.at, f.duration))
        self._record = {id(f): r for f, r in zip(self.faults, self.records)}

    @property
    def busy(self) -> bool:
        """A fault is under way (a daemon down or frozen, Redis killed)."""
        return self.active > 0

    def start_due(self, nursery: trio.Nursery, fetched: int, total: int) -> None:
        for f in list(self._pending):
            if fetched >= math.ceil(f.at * total):
                self._pending.remove(f)
                self.active += 1
                nursery.start_soon(self._run, f)

    def not_started(self) -> None:
        """At the end: faults whose moment never came."""
        for f in self._pending:
            self._record[id(f)].note = "not injected: the crawl ended before its moment"

    def killed_hosts(self) -> frozenset[str]:
        """The IPs of the hosts this run SIGKILLed, or whose Redis it SIGKILLed (their
        re-fetches are excused: the pages in flight at the crash; the caller bounds them)."""
        return frozenset(self.daemons[r.target].name for r in self.records
                         if r.kind in ("kill-host", "kill-host-redis") and r.started is not None
                         and r.target in self.daemons) | frozenset(
            d.name for r in self.records if r.kind == "power-cut" and r.started is not None
            for d in self.daemons.values() if d.role == "host")

    def gone_hosts(self) -> frozenset[str]:
        """The IPs of the hosts this run took away for good with their data: the pages they
        had in flight are fetched again by the hosts their tasks went to."""
        return frozenset(self.daemons[r.target].name for r in self.records
                         if r.kind == "host-gone-disk-lost" and r.started is not None)

    def _log(self, text: str) -> None:
        if self.out is not None:
            print(f"  t={time.perf_counter() - self.t0:6.1f}s  {text}", file=self.out, flush=True)

    async def _run(self, f: Fault) -> None:
        rec = self._record[id(f)]
        key = "redis" if f.kind in ("kill-redis", "power-cut") else f.target
        lock = self._locks.setdefault(key, trio.Lock())
        try:
            async with lock:
                await self._one(f, rec)
        finally:
            self.active -= 1

    async def _one(self, f: Fault, rec: FaultRecord) -> None:
        rec.started = round(time.perf_counter() - self.t0, 2)
        self._log(f"fault {rec.spec} started")
        try:
            if f.kind not in PROCESS_FAULTS:
                raise ValueError(f"{f.kind} is a link fault, not a process fault")
            if f.kind == "kill-redis":
                await self._kill_redis(f, rec)
            elif f.kind == "power-cut":
                await self._power_cut(f, rec)
            elif f.kind == "kill-host-redis":
                await self._kill_host_redis(self.daemons[f.target], rec)
            elif f.kind == "host-gone-disk-lost":
                await self._gone(self.daemons[f.target], rec)
            else:
                d = self.daemons.get(f.target)
                if d is None or d.gone:
                    rec.note = f"skipped: {f.target} is not running (it left)"
                elif f.kind.startswith("kill-"):
                    await self._kill(f, d, rec)
                elif f.kind.startswith("freeze-"):
                    await self._freeze(f, d, rec)
                else:
                    await self._leave(d, rec)
        finally:
            rec.ended = round(time.perf_counter() - self.t0, 2)
            self._log(f"fault {rec.spec} ended{': ' + rec.note if rec.note else ''}")

    async def _kill(self, f: Fault, d, rec: FaultRecord) -> None:
        await _sigkill(d)
        rec.note = f"pid {d.proc.pid} killed"
        await trio.sleep(f.duration or 0)
        await self.restart(d)
        d.down = False
        rec.note += f", restarted as pid {d.proc.pid}"

    async def _freeze(self, f: Fault, d, rec: FaultRecord) -> None:
        d.down = True  # its status port cannot answer while it is stopped
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            await trio.sleep(f.duration or 0)
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)  # also when the run is cancelled: it must be able to stop
            d.down = False
        rec.note = f"pid {d.proc.pid} stopped {f.duration:g} s"

    async def _leave(self, d, rec: FaultRecord) -> None:
        d.down = True
        await d.poll_status()
        d.new_life()
        d.proc.send_signal(signal.SIGTERM)
        await trio.to_thread.run_sync(d.proc.wait)
        code = d.proc.returncode
        d.gone, d.down = True, False
        rec.note = f"left for good (exit code {code})"

    async def _gone(self, d, rec: FaultRecord) -> None:
        """SIGKILL, data deleted, never started again. ``in_flight`` bounds the re-fetches:
        its pages in progress at the poll, what it asked the web for after it, and the
        pages it had finished without its center knowing (its ledger gives them out again)."""
        polled = trio.current_time()
        in_progress = await _in_progress([d])
        await _sigkill(d)
        unreported = None  # its own server (a data dir) died with it: unknown
        if d.data_dir is not None:
            await trio.to_thread.run_sync(shutil.rmtree, d.data_dir)
        else:
            store = Store(self.redis_url, d.prefix)
            try:
                unreported = await trio.to_thread.run_sync(HostPools(store, exact=True).unreported)  # as it died
                await trio.to_thread.run_sync(store.delete_prefix)
            finally:
                store.close()
        d.gone, d.down = True, False
        if None not in (in_progress, unreported) and self.web is not None:
            in_progress += _asked_since(self.web, polled, d.name)
            rec.in_flight = in_progress + unreported
        rec.note = (f"pid {d.proc.pid} killed, its data deleted; {'?' if in_progress is None else in_progress} "
                    f"pages in flight, {unreported} finished but not reported to its center")

    async def _kill_redis(self, f: Fault, rec: FaultRecord) -> None:
        if self.redis is None:
            raise ValueError("kill-redis needs the harness's own Redis (KillableRedis)")
        await trio.to_thread.run_sync(self.redis.kill)
        try:
            await trio.sleep(f.duration or 0)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.redis.restart)
        rec.note = "Redis SIGKILLed, restarted on its AOF"

    async def _power_cut(self, f: Fault, rec: FaultRecord) -> None:
        """Every filesystem stops first (nothing written after this instant reaches a disk),
        then every process dies; the disks come back with what their journals had committed."""
        if not self.disks:
            raise ValueError("power-cut needs every daemon's Redis on its own disk (simulate_processes sets them up)")
        live = [d for d in self.daemons.values() if not d.gone]
        polled = trio.current_time()
        rec.in_flight = await _in_progress([d for d in live if d.role == "host"])
        for d in live:  # frozen at once: no page starts between the count and the cut
            os.kill(d.proc.pid, signal.SIGSTOP)
        for d in live:
            d.down = True
            d.new_life()
        for disk in self.disks.values():
            disk.cut()
        for d in live:
            cpu = d.cpu_used()
            server = _server_child(d.proc.pid)
            if server is not None:
                os.kill(server, signal.SIGKILL)
            d.proc.kill()
            await trio.to_thread.run_sync(d.proc.wait)
            d.cpu_carried, d.cpu_base = cpu, 0.0
        for disk in self.disks.values():
            await trio.to_thread.run_sync(_remount, disk)
        await trio.sleep(f.duration or 0)
        if rec.in_flight is not None and self.web is not None:
            rec.in_flight += _asked_since(self.web, polled)
        rec.note = (f"{len(self.disks)} filesystems shut down without their journal's tail, {len(live)} daemons "
                    f"killed, {'?' if rec.in_flight is None else rec.in_flight} pages in flight")
        for d in sorted(live, key=lambda d: d.role != "center"):  # centers first, as at the start
            await self.restart(d)
            d.down = False
        rec.note += ", all restarted"

    async def _kill_host_redis(self, d, rec: FaultRecord, timeout: float = 60.0) -> None:
        """SIGKILL the host's own server; the fault ends when the host runs a new one (or
        has exited, which the run then reports as a daemon failure)."""
        old = _server_child(d.proc.pid)
        if old is None:
            rec.note = f"skipped: {d.name} runs no Redis of its own"
            return
        d.down = True  # its status needs its Redis: not polled until the server is back
        try:
            os.kill(old, signal.SIGKILL)
            with trio.move_on_after(timeout):
                while d.alive():
                    new = _server_child(d.proc.pid)
                    if new is not None and new != old:
                        rec.note = f"Redis pid {old} SIGKILLed; the host restarted it as pid {new}"
                        return
                    await trio.sleep(0.05)
            rec.note = (f"Redis pid {old} SIGKILLed; the host did not restart it within {timeout:g} s"
                        if d.alive() else f"Redis pid {old} SIGKILLed; the host exited ({d.proc.returncode})")
        finally:
            d.down = False


async def _in_progress(hosts: list, timeout: float = 1.0) -> int | None:
    """The pages the hosts' crawlers have in progress, asked of all at once so that the
    answer is one instant's; None if one does not answer (its figure is unknown)."""
    replies: list[dict | None] = []

    async def ask(d) -> None:
        replies.append(await d.poll_status(timeout))

    async with trio.open_nursery() as nursery:
        for d in hosts:
            nursery.start_soon(ask, d)
    if any(r is None for r in replies):
        return None
    return sum((r.get("crawler") or {}).get("in_progress", 0) for r in replies)


async def _sigkill(d) -> None:
    """SIGKILL daemon ``d`` (down from now on), its CPU so far carried over to its next life."""
    d.down = True
    d.new_life()  # what its last status said is kept; the rest of this life is lost with it
    cpu = d.cpu_used()
    d.proc.kill()
    await trio.to_thread.run_sync(d.proc.wait)
    d.cpu_carried, d.cpu_base = cpu, 0.0


def _asked_since(web, since: float, client: str | None = None) -> int:
    """Pages the web was asked for from ``since`` on (by ``client``, or by anyone)."""
    return sum(1 for t, _, path, peer in web.request_log
               if t >= since and path != "/robots.txt" and client in (None, peer))


def _remount(disk) -> None:
    disk.unmount()
    disk.mount()


def _server_child(pid: int) -> int | None:
    """The pid of a live Redis/Valkey server whose parent is ``pid`` (a daemon's embedded one)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(ppid) == pid and state not in ("Z", "X") and comm.startswith(("redis-server", "valkey-server")):
            return int(entry.name)
    return None

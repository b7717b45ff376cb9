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
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import redis
import trio

from dedupnet.adapters.storage.redis_cluster import admin_client
from dedupnet.adapters.storage.store import is_cluster_url
from dedupnet.adapters.storage.store_choice import store_for
from dedupnet.codec.auth import new_key_line, write_key_file
from dedupnet.harness.cluster import center_ip
from dedupnet.harness.faults import LINK_FAULTS, PROCESS_FAULTS, Fault, format_fault, resolve, target_parts
from dedupnet.harness.powercut import LoopDisk
from dedupnet.harness.procdaemons import (
    POLL, Daemon, DaemonFailed, SnapshotCounters, is_quiet, poll_all, pool_sizes, restart_daemon, start_all,
    start_daemon_again, stop_all,
)
from dedupnet.harness.procfaults import FaultRecord, FaultRunner, KillableRedis
from dedupnet.harness.procplan import center_ports, daemon_env, make_disks, plan_daemons, remove_disks, wants_disks
from dedupnet.harness.relay import LinkFaults, schedule_link_faults, start_link_relays
from dedupnet.harness.simcpu import CpuMeter, Timed, redis_cpu
from dedupnet.harness.report import (
    Observer, Report, SimConfig, build_report, assign_seeds, check_routing, check_secure, progress_line,
    redis_memory, seed_count, wants_lan_key, web_spec,
)
from dedupnet.harness.web import SyntheticWeb
from local_host.pools import HostPools

__all__ = ["PROCESS_MODES", "PROCESS_SCENARIOS", "DaemonFailed", "simulate_processes"]

PROCESS_MODES = ("exact", "paper")
PROCESS_SCENARIOS = ("default", "concurrent", "restart")


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
    which :func:`~dedupnet.harness.procplan.plan_daemons` gives the link's dialing daemon
    instead of the center's."""
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
            done = {k: sum(links.relays[link].counters[k] for link in sf.links) for k in ("messages", "refused")}
            resets = sum(v for link in sf.links for k, v in links.relays[link].counters.items()
                         if k.startswith("resets:"))
            rec.note = (f"relays {', '.join(sf.links)}: {done['messages']:,} messages, {resets:,} resets"
                        + (", to the end of the run" if stop is None else ""))
        else:
            rec.note = "not injected: the crawl ended before its moment"
        records.append(rec.to_json())
    return records


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
                await trio.sleep(POLL)
                st = await poll_all(daemons)
                sizes = pool_sizes(daemons, st)
                now = time.perf_counter() - t0
                fetched = sum(web.answer_counts.values())
                sample = {"t": round(now, 2), "pages_fetched": fetched, "duplicates": web.duplicate_fetches(), **sizes,
                          "web_in_flight": web.in_flight}
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
                        and all(is_quiet(d, st.get(d.name)) for d in daemons if not d.gone))
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
    await start_all(centers, hosts, logdir, env, startup_timeout)
    if out is not None:
        print(f"  {len(centers)} center and {len(hosts)} host processes connected after "
              f"{time.perf_counter() - t_start:.1f} s", file=out, flush=True)
    server.config_resetstat()
    for d in centers + hosts:
        d.mark_cpu()
    cpu_start = (time.process_time(), redis_cpu(server))
    plan = await _seed(redis_url, hosts, seeds, cfg.scenario)
    t0 = time.perf_counter()
    trio_t0 = trio.current_time()
    timeline: list[dict] = []

    async def restart(d: Daemon) -> None:
        await restart_daemon(d, logdir, env, startup_timeout)

    async def start_again(d: Daemon) -> None:
        await start_daemon_again(d, logdir, env, startup_timeout)

    faults = None
    if any(f.kind in PROCESS_FAULTS for f in cfg.faults):
        resolved = [resolve(f, cfg.seed, cfg.networks, cfg.hosts, i) for i, f in enumerate(cfg.faults)
                    if f.kind in PROCESS_FAULTS]
        by_target = {f"center:{c.network}": c for c in centers}
        by_target |= {f"host:{h.network}.{int(h.name.rsplit('.', 1)[1]) - 10}": h for h in hosts}
        faults = FaultRunner(resolved, by_target, start_again, killable, t0, out, disks=disks or {}, web=web,
                             redis_url=redis_url)
    total = len(web.reachable_detail(seeds, max_depth=cfg.max_depth).fetched)
    if links is not None:
        links.total = total
    harness = CpuMeter()  # the harness's own polling, in this process beside the web
    timed_out = await Timed(_run_to_quiescence(cfg, centers, hosts, web, timeline, t0, out, restart, faults, total,
                                                links), harness)
    wall = time.perf_counter() - t0
    await poll_all(centers + hosts)  # the counters as they are now
    cpu = sum(c.cpu_used() for c in centers)
    redis_now = redis_cpu(server)
    cpu_roles = {"hosts": sum(h.cpu_used() for h in hosts), "centers": cpu,
                 "web": time.process_time() - cpu_start[0] - harness.seconds,  # this process serves the web
                 "harness": harness.seconds,
                 "redis": None if redis_now is None or cpu_start[1] is None else redis_now - cpu_start[1]}
    memory = await trio.to_thread.run_sync(redis_memory, server, prefix)
    killed = gone = frozenset()
    if faults is not None:
        faults.not_started()
        killed, gone = faults.killed_hosts(), faults.gone_hosts()
    report = _build_report(cfg, web, seeds, centers, hosts, server, timeline, wall, timed_out, plan=plan,
                           center_cpu=cpu, memory=memory, killed=killed, gone=gone, web_t0=trio_t0,
                           cpu_roles=cpu_roles)
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
    web = SyntheticWeb(web_spec(cfg), port=0, latency=cfg.web_latency)
    prefix = f"simproc-{cfg.mode}-{cfg.seed}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    logdir = Path(tempfile.mkdtemp(prefix="dedupnet-simproc-"))
    killable = None
    if any(f.kind == "kill-redis" for f in cfg.faults):
        # A server this run may kill: its own, persistent, on a fixed port (not redis_url).
        killable = KillableRedis(logdir / "redis")
        redis_url = await trio.to_thread.run_sync(killable.start)
    server = admin_client(redis_url)  # redis-py's RedisCluster for redis+cluster:// URLs
    daemons: list[Daemon] = []
    problems: list[str] = []
    succeeded = False
    try:
        report = await _serve_and_run(cfg, redis_url, prefix, web, server, logdir, out, startup_timeout,
                                      stop_timeout, killable, daemons, problems)
        succeeded = not report.timed_out and not problems
        return report
    finally:
        await _clean_up(redis_url, [d.prefix for d in daemons] + [prefix], server, killable, problems, succeeded,
                        logdir, out)


async def _serve_and_run(cfg: SimConfig, redis_url: str, prefix: str, web: SyntheticWeb, server, logdir: Path, out,
                         startup_timeout: float, stop_timeout: float, killable: KillableRedis | None,
                         daemons: list[Daemon], problems: list[str]) -> Report:
    """The web and the relays served, the daemons planned, run and stopped (their disks
    removed) whatever happens. ``daemons`` and ``problems`` are filled in as they become
    known, so that the caller cleans up after them even when this raises."""
    env = daemon_env()
    disks: dict[str, LoopDisk] = {}
    error: Exception | None = None
    async with trio.open_nursery() as nursery:
        await nursery.start(web.serve)
        seeds = web.seeds(seed_count(cfg))
        ports = center_ports(cfg)
        # The relays live in this process, in front of the centers, for the whole run.
        links, via = await start_link_faults(cfg, nursery, ports)
        tls_dir, key_file = await _credentials(cfg, logdir)
        centers, hosts = plan_daemons(cfg, redis_url, prefix, logdir, ports, via, tls_dir, key_file)
        daemons += centers + hosts
        try:
            if wants_disks(cfg):
                disks = await trio.to_thread.run_sync(make_disks, cfg, logdir)
            report = await _run(cfg, redis_url, prefix, web, seeds, centers, hosts, server, logdir, env, out,
                                startup_timeout, killable, links, disks)
        except Exception as e:  # noqa: BLE001 - raised below as itself, not in the nursery's ExceptionGroup
            error = e
        finally:
            with trio.CancelScope(shield=True):
                problems += await stop_all(daemons, stop_timeout)
                problems += await trio.to_thread.run_sync(remove_disks, disks)
        nursery.cancel_scope.cancel()
    if error is not None:
        raise error
    return report


async def _credentials(cfg: SimConfig, logdir: Path) -> tuple[Path | None, Path | str | None]:
    """The run's certificates (``--secure``) and LAN key file (``--lan-key``, ``--secure``:
    the one given, or a random key); what is made here is removed with the logs."""
    tls_dir = None
    if cfg.secure:
        from dedupnet.adapters.net.tls import make_certs

        tls_dir = logdir / "certs"
        await trio.to_thread.run_sync(lambda: make_certs(tls_dir, range(1, cfg.networks + 1), days=2))
    key_file = cfg.lan_key_file
    if key_file is None and wants_lan_key(cfg):
        key_file = logdir / "lan.keys"
        write_key_file(key_file, [new_key_line(1)])
    return tls_dir, key_file


async def _clean_up(redis_url: str, prefixes: list[str], server, killable: KillableRedis | None,
                    problems: list[str], succeeded: bool, logdir: Path, out) -> None:
    """The run's keys removed, its own server stopped, what went wrong printed; the logs
    removed after a run that succeeded, else kept and their path printed."""
    for name in prefixes:
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

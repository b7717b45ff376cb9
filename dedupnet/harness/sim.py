"""``dedupnet sim``: a whole multi-network crawl on one machine, and what it cost.

The harness stands up the synthetic web, one embedded Redis, L centers and L×H
hosts with their crawlers (each on its own loopback address, 127.0.L.x, peered as a
real deployment would be), seeds the crawl, shows progress, stops at quiescence and
reports: pages reachable (the web's ground truth), pages fetched, duplicate fetches
and lost URLs (from the web server's own counts), frames and bytes, Redis look-ups,
throughput, discovery-to-admission latency, sets concluded incomplete, load balance.

Redis mapping: one server for the whole simulation; every center and host has its
own key prefix on it (``sim-<mode>-<seed>:center<L>``, ``...:host:<ip>``), exactly
the keys a real daemon would use on its own server. ``--processes`` runs every
daemon as its own OS process (``dedupnet center`` / ``dedupnet local``) against the
same server.

Link faults (``SimConfig.faults``): the links they name go through relays
(dedupnet/harness/relay.py) from the start, clean; each fault is switched on when its fraction
of the crawl is fetched and off after its duration, and the run ends only after every
fault with an end has ended (a partition has healed). The report lists what the relays did.

Modes: ``exact`` and ``paper`` run the protocol; ``owner`` runs the hash-partitioned
baseline (dedupnet/harness/owner.py) on the same hosts and web.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections import Counter
from typing import Any

import redis
import trio

from local_host.crawler.crawl import Crawler, CrawlerSettings

from dedupnet.harness.cluster import host_ip, open_cluster
from dedupnet.codec.errors import DedupnetError
from dedupnet.codec.homes import parse_weights
from dedupnet.harness.faults import LINK_FAULTS
from dedupnet.adapters.storage.redis_cluster import admin_client
from dedupnet.adapters.storage.store import TASK_POOL, URL_POOL
from dedupnet.harness.simcpu import CpuMeter, Timed, redis_cpu
from dedupnet.harness.web import SyntheticWeb
from dedupnet.harness.report import (
    SimConfig, Report, Observer, redis_memory, wants_lan_key, check_secure, secure_certs,
    seed_count, assign_seeds, check_routing, check_windows, progress_line, build_report, web_spec,
)


async def simulate(cfg: SimConfig, redis_url: str, *, out=sys.stdout, during=None) -> Report:
    """Run one simulation to quiescence (or ``cfg.timeout``) and report it.

    ``during``, if given, is started as ``during(system, web)`` once the crawlers run and
    cancelled when the crawl is over (tests use it for an attacker or a key rotation)."""
    if any(f.kind not in INPROCESS_FAULTS for f in cfg.faults):
        raise ValueError(faults_refused(cfg.faults))
    check_secure(cfg)
    check_windows(cfg)
    check_routing(cfg)
    import tempfile

    with secure_certs(cfg) as tls_dir, tempfile.TemporaryDirectory(prefix="dedupnet-sim-keys-") as keys:
        key_file = cfg.lan_key_file
        if wants_lan_key(cfg) and key_file is None:
            from dedupnet.codec.auth import new_key_line, write_key_file

            key_file = f"{keys}/lan.keys"
            write_key_file(key_file, [new_key_line(1)])
        return await _simulate(cfg, redis_url, out=out, during=during, key_file=key_file, tls_dir=tls_dir)


async def _simulate(cfg: SimConfig, redis_url: str, *, out, during, key_file: str | None,
                    tls_dir: str | None) -> Report:
    web = SyntheticWeb(web_spec(cfg), port=0, latency=cfg.web_latency)
    web_meter, harness_meter = CpuMeter(), CpuMeter()
    web_meter.attach_web(web)
    server = admin_client(redis_url)  # redis-py's RedisCluster for redis+cluster:// URLs
    server.config_resetstat()
    crawler = CrawlerSettings(concurrency=cfg.concurrency, per_site_concurrency=cfg.per_site_concurrency,
                              per_site_delay=cfg.per_site_delay, max_depth=cfg.max_depth, retry_base=0.05,
                              progress_interval=3600)
    observer = Observer()
    prefix = f"sim-{cfg.mode}-{cfg.seed}-{time.monotonic_ns() % 10**6}"
    async with trio.open_nursery() as nursery:
        await nursery.start(web.serve)
        seeds = web.seeds(seed_count(cfg))
        system_cm = _open_system(cfg, redis_url, prefix, crawler, key_file, tls_dir)
        async with system_cm as system, trio.open_nursery() as crawling:
            _attach_bloom(cfg, system)
            links = _link_faults(cfg, system, web, seeds)
            crawlers = await _crawlers(system, crawler, crawling, cfg.mode)
            meter = CpuMeter() if cfg.mode != "owner" else None
            for d in getattr(system, "centers", {}).values():
                d.on_admit = observer.on_admit
                if meter is not None:
                    meter.attach(d)
            for h in system.hosts.values():
                if hasattr(h, "on_found"):
                    h.on_found = observer.on_found
            meter_start = meter.seconds if meter else 0.0
            cpu_start = (time.process_time(), web_meter.seconds, redis_cpu(server), harness_meter.seconds)
            if during is not None:
                crawling.start_soon(during, system, web)
            plan = await _seed(system, seeds, cfg.scenario)
            t0, web_t0 = time.perf_counter(), trio.current_time()
            timeline: list[dict] = []
            timed_out, windows = await Timed(_run_windows(cfg, system, crawlers, web, timeline, t0, out, meter,
                                                           links, seeds, observer, harness_meter), harness_meter)
            wall = time.perf_counter() - t0
            center_cpu = meter.seconds - meter_start if meter else None
            cpu_roles = _cpu_roles(cpu_start, center_cpu, web_meter.seconds, redis_cpu(server), harness_meter.seconds)
            memory = await trio.to_thread.run_sync(redis_memory, server, prefix)
            report = build_report(cfg, web, seeds, system, server, observer, timeline, wall, timed_out, plan=plan,
                             center_cpu=center_cpu, memory=memory, windows=windows, web_t0=web_t0,
                             cpu_roles=cpu_roles)
            if links is not None:
                report.links = links.summary(t0=trio.current_time() - wall)
            crawling.cancel_scope.cancel()  # before the system closes the stores they use
        nursery.cancel_scope.cancel()
    return report


def _open_system(cfg: SimConfig, redis_url: str, prefix: str, crawler: CrawlerSettings, key_file: str | None,
                 tls_dir: str | None):
    """The run's daemons in this process: the protocol's cluster, or the owner baseline's."""
    if cfg.mode == "owner":
        from dedupnet.harness.owner import open_owner_cluster

        return open_owner_cluster(redis_url, cfg.networks, cfg.hosts, prefix=prefix)
    return open_cluster(redis_url, cfg.networks, cfg.hosts, mode=cfg.mode, set_size=cfg.set_size, prefix=prefix,
                        crawler=crawler, partition_policy=cfg.partition_policy, answer_timeout=cfg.answer_timeout,
                        send_delay=cfg.send_delay, tls_dir=tls_dir, lan_tls=cfg.lan_tls, routing=cfg.routing,
                        weights=parse_weights(list(cfg.weights)), durable_acks=cfg.durable_acks, **_link_relays(cfg),
                        **({"recrawl": recrawl_policy(cfg)} if cfg.recrawl_after is not None else {}),
                        **({"lan_key_file": key_file, "key_poll_interval": cfg.key_poll_interval}
                           if key_file else {}))


def _cpu_roles(start: tuple[float, float, float | None, float], center_cpu: float | None, web_cpu: float,
               redis_now: float | None, harness_cpu: float) -> dict[str, float | None]:
    """CPU seconds since ``start`` (process time, web meter, Redis, harness meter) by
    role: the process's time less what the centers, the web and the harness's own
    sampling spent in it is the hosts'."""
    process = time.process_time() - start[0]
    web, harness = web_cpu - start[1], harness_cpu - start[3]
    centers = center_cpu or 0.0
    return {"hosts": process - centers - web - harness, "centers": center_cpu, "web": web, "harness": harness,
            "redis": None if redis_now is None or start[2] is None else redis_now - start[2]}


# --- link faults (dedupnet/harness/relay.py): relays on the chosen links, switched on as the crawl goes


def _link_relays(cfg: SimConfig) -> dict:
    """open_cluster's arguments for the relays the link faults need (none without any)."""
    schedule = _link_schedule(cfg)
    return {"links": frozenset(link for f in schedule for link in f.links), "link_seed": cfg.seed} if schedule else {}


def _link_schedule(cfg: SimConfig):
    from dedupnet.harness.relay import schedule_link_faults

    return schedule_link_faults([f for f in cfg.faults if f.kind in LINK_FAULTS], cfg.networks, cfg.hosts, cfg.seed)


def _link_faults(cfg: SimConfig, system, web: SyntheticWeb, seeds: list[str]):
    """The controller that switches the link faults on (at their fraction of the crawl:
    requests to the web over the ground truth's URL count) and off; None without any."""
    schedule = _link_schedule(cfg)
    if not schedule:
        return None
    if cfg.mode == "owner":
        raise ValueError("link faults need the protocol's daemons (exact or paper mode)")
    from dedupnet.harness.relay import LinkFaults

    faults = LinkFaults(schedule, system.relays, system.nursery)
    faults.total = len(web.reachable_detail(seeds, max_depth=cfg.max_depth).fetched)
    return faults


def _attach_bloom(cfg: SimConfig, system) -> None:
    """``finish_url_filter = "bloom"``: every host's finish_URL becomes a Bloom filter,
    before anything is seeded (nothing has been looked up or finished yet)."""
    from dedupnet.adapters.storage.bloom import attach, spec_from

    spec = spec_from(cfg)
    if spec is not None:
        for h in system.hosts.values():
            attach(h.pools.store, spec)


async def _crawlers(system, settings: CrawlerSettings, nursery: trio.Nursery, mode: str) -> dict[str, Any]:
    """The owner baseline's hosts get a crawler here, on their task_pool; the protocol's
    hosts run theirs inside the daemon (none returned: they are looked up each time)."""
    if mode != "owner":
        return {}  # they live in the daemons (and hosts come and go with churn)
    crawlers = {}
    for ip, h in system.hosts.items():
        # From the host's own address, as the protocol's hosts fetch (cluster.py): the web tells them apart.
        c = Crawler(h.pools.store, dataclasses.replace(settings, local_address=ip), h.counters, consumer=ip)
        await nursery.start(c.run)
        crawlers[ip] = c
    return crawlers


async def _seed(system, seeds: list[str], scenario: str) -> dict[str, list[str]]:
    """Push the seeds; returns which host got which."""
    hosts = {_ip_of(h): h for h in system.hosts.values()}
    if scenario == "concurrent":
        # Every host of every network finds the same link-dense pages at the same moment.
        async with trio.open_nursery() as n:
            for h in hosts.values():
                n.start_soon(trio.to_thread.run_sync, _push, h, seeds)
        return {ip: list(seeds) for ip in hosts}
    plan = assign_seeds(list(hosts), seeds)
    for ip, urls in plan.items():
        if urls:
            _push(hosts[ip], urls)
    return plan


def _ip_of(host) -> str:
    return host.settings.ip


def _push(host, urls: list[str]) -> None:
    host.pools.push(urls)


async def _pool_sizes(system, meter: CpuMeter | None = None) -> dict[str, int]:
    hosts = list(system.hosts.values())

    def read() -> list[dict[str, int]]:  # every host's in one worker thread's turn, timed
        t = time.thread_time()
        try:
            return [h.pools.sizes() for h in hosts]
        finally:
            if meter is not None:
                meter.add(time.thread_time() - t)

    sizes: Counter[str] = Counter()
    for pools in await trio.to_thread.run_sync(read):
        sizes["URL_pool"] += pools[URL_POOL]
        sizes["task_pool"] += pools[TASK_POOL]
    for c in getattr(system, "centers", {}).values():
        sizes["reduce_pools"] += len(c.core.stages.sets)
        sizes["task_URL"] += len(c.core.members.tasks)
    return dict(sizes)


def recrawl_policy(cfg: SimConfig):
    """The daemons' :class:`~dedupnet.adapters.storage.recrawl.RecrawlPolicy` (None without ``recrawl_after``)."""
    from dedupnet.codec.ages import RecrawlPolicy

    return RecrawlPolicy.from_settings(cfg.recrawl_after)


async def _run_windows(cfg: SimConfig, system, crawlers, web: SyntheticWeb, timeline, t0, out, meter, links,
                       seeds: list[str], observer: Observer,
                       harness_meter: CpuMeter | None = None) -> tuple[bool, list[dict]]:
    """Window 1 is the crawl from the seeds, to quiescence. With ``recrawl_after`` A each
    further window waits until A and one slice (dedupnet/adapters/storage/recrawl.py: how much longer a URL
    may still count as seen) have passed since the previous one was quiescent, so that
    every URL admitted or crawled in it is due again, then offers the same seeds again
    through the hosts' URL_pool (what a host's crawler does every ``recrawl_interval``
    under a re-crawl policy) and runs to quiescence: every page must be found again and
    fetched once more, in the whole system. Returns whether a window timed out, and the
    windows (start and end in seconds since ``t0``, requests answered in each)."""
    from dedupnet.adapters.storage.recrawl import SLICES

    windows: list[dict] = []
    timed_out = False
    for k in range(cfg.windows):
        if k:
            wait = windows[-1]["end_wall"] + cfg.recrawl_after * (1 + 1 / SLICES) + 0.1 - time.time()
            await trio.sleep(max(wait, 0.0))
            observer.found.clear()
            await _seed(system, seeds, cfg.scenario)
        start, before = time.perf_counter() - t0, sum(web.answer_counts.values())
        timed_out |= await _run_to_quiescence(cfg, system, crawlers, web, timeline, t0, out, meter, links,
                                              harness_meter)
        windows.append({"window": k + 1, "start": round(start, 2), "end": round(time.perf_counter() - t0, 2),
                        "requests": sum(web.answer_counts.values()) - before, "end_wall": time.time()})
        if timed_out:
            break
    for w in windows:
        del w["end_wall"]
    return timed_out, windows if cfg.recrawl_after is not None else []


#: Seconds between two reads of the hosts' pools while a crawler is busy: a read is a
#: round trip to each host's Redis, and read at every sample they were a large part of
#: a politeness-bound crawl's Redis commands. A sample with every crawler idle always
#: reads them, so quiescence is judged on fresh sizes.
SIZES_EVERY = 1.0


async def _run_to_quiescence(cfg, system, crawlers, web, timeline, t0, out, meter: CpuMeter | None = None,
                             links=None, harness_meter: CpuMeter | None = None) -> bool:
    """Sample progress every 0.1 s until nothing is left anywhere (twice in a row) or
    the timeout; the samples with the pools' sizes are those of ``SIZES_EVERY``. With
    link faults, a fault with an end must have ended (healed) first."""
    quiet = 0
    next_print = 0.0
    sizes_at = -math.inf
    events: set[str] = set()
    with trio.move_on_after(cfg.timeout) as scope:
        while quiet < 2:
            await trio.sleep(0.1)
            now = time.perf_counter() - t0
            current = crawlers if crawlers else {ip: h.crawler for ip, h in system.hosts.items()}
            idle = all(c.idle for c in current.values() if c is not None)
            sizes: dict[str, int] = {}
            fresh = idle or now >= sizes_at + SIZES_EVERY
            if fresh:
                sizes_at = now
                try:
                    sizes = await _pool_sizes(system, harness_meter)
                except (DedupnetError, redis.RedisError) as e:  # Redis (a cluster node) is down: not done yet
                    sizes = {"store_unavailable": 1}
                    if out is not None:
                        print(f"  Redis unavailable: {e}; waiting", file=out, flush=True)
            fetched = sum(web.answer_counts.values())
            sample = {"t": round(now, 2), "pages_fetched": fetched, "duplicates": web.duplicate_fetches(), **sizes,
                      "web_in_flight": web.in_flight, "slots_in_use": _slots_in_use(current)}
            timeline.append(sample)
            await _scenario_events(cfg, system, fetched, events)
            if links is not None:
                links.tick(fetched / max(links.total, 1))
            if meter is not None:
                for c in getattr(system, "centers", {}).values():
                    meter.attach(c)  # a restarted center is a new daemon
            done = idle and not any(sizes.values()) and await system.quiescent()
            done = done and (links is None or links.settled)
            quiet = quiet + 1 if done else 0
            if out is not None and now >= next_print and fresh:
                next_print = now + cfg.progress_every
                print(progress_line(sample), file=out, flush=True)
    return scope.cancelled_caught


def _slots_in_use(crawlers: dict) -> int:
    """The crawlers' fetch slots in use now: requests holding one of a host's
    ``concurrency`` slots (``Politeness.active``; a crawler without it: its requests on
    the wire)."""
    used = 0
    for c in crawlers.values():
        politeness = getattr(c, "politeness", None)
        used += politeness.active if politeness is not None else getattr(c, "on_the_wire", 0)
    return used


async def _scenario_events(cfg: SimConfig, system, fetched: int, done: set[str]) -> None:
    """churn: a host leaves and another joins; restart: a center is killed and restarted.
    Both once a third of the pages are fetched."""
    if cfg.scenario not in ("churn", "restart") or fetched < cfg.pages // 3 or cfg.scenario in done:
        return
    done.add(cfg.scenario)
    if cfg.scenario == "restart":
        await system.restart_center(1)
        return
    leaving = host_ip(1, cfg.hosts - 1)
    await system.leave_host(leaving)
    await system.start_host(1, cfg.hosts)


#: Fault kinds the one-process simulation carries out: the link faults (dedupnet/harness/relay.py).
INPROCESS_FAULTS: tuple[str, ...] = LINK_FAULTS


def faults_refused(faults) -> str:
    kinds = sorted({f.kind for f in faults if f.kind not in INPROCESS_FAULTS})
    return (f"fault(s) {', '.join(kinds)} need --processes (every daemon its own process, "
            f"dedupnet/harness/simproc.py); without it: {', '.join(INPROCESS_FAULTS) or 'none yet'}")

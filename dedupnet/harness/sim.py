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

Link faults (``SimConfig.faults``, issue #9): the links they name go through relays
(dedupnet/harness/relay.py) from the start, clean; each fault is switched on when its fraction
of the crawl is fetched and off after its duration, and the run ends only after every
fault with an end has ended (a partition has healed). The report lists what the relays did.

Modes: ``exact`` and ``paper`` run the protocol; ``owner`` runs the hash-partitioned
baseline (dedupnet/harness/owner.py) on the same hosts and web.
"""

from __future__ import annotations

import math
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
import trio

from center_host.protocol import PARTITION_POLICIES
from local_host.crawler import Crawler, CrawlerSettings

from dedupnet.harness.cluster import host_ip, open_cluster
from dedupnet.codec.errors import BadURL, DedupnetError
from dedupnet.harness.faults import FAULTS, LINK_FAULTS, Fault, parse_fault
from dedupnet.adapters.redis_cluster import admin_client, merged_info
from dedupnet.adapters.status_page import key_family, key_memory
from dedupnet.adapters.store import FINISH_URL, TASK_POOL, URL_POOL
from dedupnet.codec.urls import fingerprint_many, normalize
from dedupnet.harness.web import SyntheticWeb, WebSpec

SCENARIOS = ("default", "concurrent", "churn", "restart")
MODES = ("exact", "paper", "owner")


@dataclass
class SimConfig:
    networks: int = 3
    hosts: int = 3
    pages: int = 3000
    sites: int = 30
    mode: str = "exact"
    seed: int = 1
    scenario: str = "default"
    timeout: float = 120.0
    set_size: int = 400
    set_linger: float = 0.5
    partition_policy: str | None = None  # the mode's default
    answer_timeout: float = 2.0
    #: Fault injection: every message a host sends waits this long (hosts too busy to
    #: answer in time). 0 in a normal run.
    send_delay: float = 0.0
    #: Faults injected during the run (dedupnet/harness/faults.py): process faults need
    #: ``--processes`` (dedupnet/harness/simproc.py); link faults go through the relay.
    faults: tuple[Fault, ...] = ()
    seeds: int = 6
    max_depth: int | None = None
    #: Politeness per site: the simulation is about de-dup, so it is light by default.
    per_site_delay: float = 0.0
    per_site_concurrency: int = 4
    concurrency: int = 16
    progress_every: float = 1.0
    #: Faults to inject (issue #9); link faults (dedupnet/harness/relay.py) run in-process.
    faults: tuple[Fault, ...] = ()
    #: The hosts' finish_URL: "exact" or "bloom" (dedupnet/adapters/bloom.py): every false
    #: positive of the filter is a URL never crawled, counted in ``lost URLs``.
    finish_url_filter: str = "exact"
    bloom_capacity: int = 10_000_000
    bloom_error_rate: float = 0.001
    #: HMAC tags on the LANs (issue #10, dedupnet/codec/auth.py): a random key made for the
    #: run (one key file, shared by every LAN of the simulation), or this key file.
    lan_key: bool = False
    lan_key_file: str | None = None
    #: Seconds between two reads of the key file by each daemon (a rotation's pace).
    key_poll_interval: float = 1.0
    #: ``--secure`` (issue #10): TLS with client certificates between the centers,
    #: certificates made for the run in a temporary directory (dedupnet/adapters/tls.py).
    #: Also HMAC tags on the LANs, as ``lan_key`` (a random LAN key made for the run).
    secure: bool = False
    #: ``--lan-tls``: with ``secure``, TLS between hosts and their center too.
    lan_tls: bool = False
    #: Re-crawl by age (issue #13): every daemon's ``recrawl_after``, and ``windows`` K:
    #: the seeds are offered again K - 1 times, each once the previous window is quiescent
    #: and older than the age (:func:`_run_windows`); every URL must be fetched K times.
    recrawl_after: float | None = None
    windows: int = 1


@dataclass
class Report:
    config: dict
    timed_out: bool
    wall_time: float
    reachable_pages: int
    reachable_urls: int  # pages + missing (404) + redirects: what a perfect crawl requests
    fetched_urls: int
    requests: int
    crawler_requests: int  # the crawlers' own count of answered requests (503s aside)
    duplicate_fetches: int
    harness_duplicates: int | None  # URLs finished by more than one host, from Redis
    lost_urls: int
    lost_examples: list[str]
    unexpected_fetches: int
    frames: dict[str, int]
    frames_by_stage: dict[str, int]
    bytes_on_wire: int
    redis_lookups: int
    redis_round_trips: int
    urls_found: int
    urls_per_s: float
    pages_per_s: float
    latency_p50: float | None
    latency_p99: float | None
    sets_concluded_incomplete: int
    per_host_pages: dict[str, int]
    per_network_admitted: dict[str, int]
    #: Seed URLs each network's hosts were given (every network gets at least one).
    seeds_per_network: dict[str, int] = field(default_factory=dict)
    urls_admitted: int = 0
    #: Average URLs per URL_set a host sends its center (flag=1 frames), from the centers' counters.
    set_fill: float | None = None
    frames_per_url: float | None = None  # frames sent / URLs found (URL_pool)
    bytes_per_url: float | None = None  # bytes on the wire / distinct URLs (reachable_urls)
    max_url_pool: int = 0  # the largest URL_pool backlog (all hosts) the timeline saw
    #: CPU seconds of the centers: with --processes the processes' own (/proc/<pid>/stat,
    #: from seeding to the end); in one process the centers' reactor work, timed (see CpuMeter).
    center_cpu_s: float | None = None
    center_cpu_ms_per_1k_urls: float | None = None  # per 1,000 admitted URLs
    #: MEMORY USAGE of the run's keys at the end, by role ("center", "host") and key family.
    redis_bytes: dict[str, dict[str, int]] = field(default_factory=dict)
    center_redis_bytes_per_url: float | None = None  # per admitted URL
    host_redis_bytes_per_url: float | None = None  # per admitted URL
    #: The harness's own invariant check (:func:`check_extracted`): URLs that some fetched
    #: page links to and that were not crawled exactly once, and what was seen of them.
    invariant_violations: int = 0
    invariant_examples: list[str] = field(default_factory=list)
    #: Of the duplicate fetches: pages a SIGKILLed host fetched again by itself after its
    #: restart (it was killed with them in progress; see check_extracted). Not violations.
    refetched_after_kill: int = 0
    #: The faults injected (resolved: every field filled), when they ran and what came of them.
    faults: list[dict] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)
    #: Link faults: what was scheduled, when it started and ended, what each relay did.
    links: dict = field(default_factory=dict)
    #: Every daemon's ``bad_input`` and ``handshake_failed`` counters, summed by reason
    #: (an attack, a key rotation gone wrong); ``rejected`` by the cores.
    bad_input: dict[str, int] = field(default_factory=dict)
    #: TLS runs (``--secure``): TCP bytes of the TLS connections (records and handshakes),
    #: all daemons' sending sides; ``bytes_on_wire`` counts these instead of the messages
    #: they carry.
    tls_bytes_on_wire: int = 0
    #: Of ``tls_bytes_on_wire``: the messages those records carried (the rest is TLS's own).
    tls_payload_bytes: int = 0
    tls_handshakes: int = 0
    #: Re-crawl windows (``recrawl_after``): each one's start, end (seconds) and requests.
    windows: list[dict] = field(default_factory=list)
    #: URLs of the ground truth fetched exactly K times over K windows, fewer, more.
    window_counts: dict[str, int] = field(default_factory=dict)
    #: The shortest time between two answered requests for one URL (None: none twice).
    min_refetch_gap: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


class Observer:
    """Discovery and admission times of URLs, for the latency figures."""

    def __init__(self) -> None:
        self.found: dict[str, float] = {}
        self.latencies: list[float] = []

    def on_found(self, entries: list[tuple[bytes, str]]) -> None:
        for eid, url in entries:
            t = int(eid.split(b"-")[0]) / 1000  # a stream id starts with its time in ms
            if url not in self.found or t < self.found[url]:
                self.found[url] = t

    def on_admit(self, urls: tuple[str, ...]) -> None:
        now = time.time()
        self.latencies += [now - self.found[u] for u in urls if u in self.found]


class _Timed:
    """Awaits a coroutine, adding the CPU time of this thread spent *inside* it (each
    step between two suspensions) to a meter: what other tasks do while it waits is
    not counted."""

    def __init__(self, coro, meter: "CpuMeter"):
        self._coro, self._meter = coro, meter

    def __await__(self):
        it = self._coro.__await__()
        value, error = None, None
        while True:
            t = time.thread_time()
            try:
                yielded = it.throw(error) if error is not None else it.send(value)
            except StopIteration as stop:
                return stop.value
            finally:
                self._meter.add(time.thread_time() - t)
            value, error = None, None
            try:
                value = yield yielded
            except GeneratorExit:
                it.close()
                raise
            except BaseException as e:  # noqa: BLE001 - handed to the coroutine, as await would
                error = e


class CpuMeter:
    """CPU time of the centers' work when they run in this process, for the report's
    "center CPU per 1,000 URLs": each center's core (``reactor._handle``), the carrying
    out of its actions (``reactor._execute``, step by step) and its Redis client calls
    (``store.run``, in the worker thread). Not counted: reading and decoding frames in
    the transport tasks and the heartbeats, which --processes (whole-process CPU) does
    count; so the in-process figure is a lower bound of the same thing."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds

    def attach(self, daemon) -> None:
        """Instrument one center daemon (once; a restarted center is a new daemon)."""
        if getattr(daemon, "_sim_cpu_meter", None) is self:
            return
        daemon._sim_cpu_meter = self
        reactor, store = daemon.reactor, daemon.store
        handle, execute, run = reactor._handle, reactor._execute, store.run

        def timed_handle(event):
            t = time.thread_time()
            try:
                return handle(event)
            finally:
                self.add(time.thread_time() - t)

        async def timed_execute(actions):
            return await _Timed(execute(actions), self)

        def timed_call(fn, args, kwargs):
            t = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(time.thread_time() - t)

        async def timed_run(fn, *args, **kwargs):
            return await run(timed_call, fn, args, kwargs)

        reactor._handle, reactor._execute, store.run = timed_handle, timed_execute, timed_run


def _on_cluster(server) -> bool:
    return isinstance(server, redis.RedisCluster)


def redis_memory(server: redis.Redis, prefix: str) -> dict[str, dict[str, int]]:
    """MEMORY USAGE (every element: SAMPLES 0) of each key of a run, found by SCAN under
    ``prefix``, summed by role and family: ``{"center": {"admitted": n, ...}, "host":
    {"finish_URL": n, ...}}``. Keys are ``<prefix>:center<L>:<family>`` and
    ``<prefix>:host:<ip>:<family>`` (both runners)."""
    out: dict[str, Counter[str]] = {"center": Counter(), "host": Counter()}
    for rest, size in key_memory(server, prefix, cluster=_on_cluster(server)).items():
        if rest.startswith("center"):
            role, rest = "center", rest.split(":", 1)[1] if ":" in rest else ""
        elif rest.startswith("host:"):
            parts = rest.split(":", 2)  # host, a.b.c.d, <family>
            role, rest = "host", parts[2] if len(parts) == 3 else ""
        else:
            continue
        out[role][key_family(rest)] += size
    return {role: dict(sorted(c.items())) for role, c in out.items()}


def seeds_per_network(plan: dict[str, list[str]]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for ip, urls in plan.items():
        counts[f"net:{int(ip.split('.')[2])}"] += len(urls)
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0][4:])))


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(math.ceil(p / 100 * len(ordered))) - 1)]


async def simulate(cfg: SimConfig, redis_url: str, *, out=sys.stdout, during=None) -> Report:
    """Run one simulation to quiescence (or ``cfg.timeout``) and report it.

    ``during``, if given, is started as ``during(system, web)`` once the crawlers run and
    cancelled when the crawl is over (tests use it for an attacker or a key rotation)."""
    if any(f.kind not in INPROCESS_FAULTS for f in cfg.faults):
        raise ValueError(faults_refused(cfg.faults))
    check_secure(cfg)
    check_windows(cfg)
    import tempfile

    with secure_certs(cfg) as tls_dir, tempfile.TemporaryDirectory(prefix="dedupnet-sim-keys-") as keys:
        key_file = cfg.lan_key_file
        if wants_lan_key(cfg) and key_file is None:
            from dedupnet.codec.auth import new_key_line, write_key_file

            key_file = f"{keys}/lan.keys"
            write_key_file(key_file, [new_key_line(1)])
        return await _simulate(cfg, redis_url, out=out, during=during, key_file=key_file, tls_dir=tls_dir)


def wants_lan_key(cfg: SimConfig) -> bool:
    """Whether a random LAN key is made for the run: ``--lan-key``, or ``--secure``
    (TLS between the centers and HMAC tags on the LANs); not for owner mode (no LANs)."""
    return (cfg.lan_key or cfg.secure) and cfg.mode != "owner"


def check_secure(cfg: SimConfig) -> None:
    """ValueError for what ``--secure`` cannot be combined with (both runners)."""
    if cfg.lan_tls and not cfg.secure:
        raise ValueError("--lan-tls goes with --secure")
    if cfg.secure and cfg.mode == "owner":
        raise ValueError("--secure runs the protocol's daemons (exact or paper mode); owner has no centers")
    if cfg.secure and any(f.kind in LINK_FAULTS for f in cfg.faults):
        raise ValueError("--secure cannot be combined with link faults: the fault relay acts on whole "
                         "dedupnet messages, which TLS hides from it")


def secure_certs(cfg: SimConfig):
    """A context manager: a temporary directory with a CA and a certificate per center
    (dedupnet/adapters/tls.py make_certs) for a ``--secure`` run, removed afterwards; None
    (nothing made) otherwise."""
    import contextlib
    import tempfile

    if not cfg.secure:
        return contextlib.nullcontext(None)

    @contextlib.contextmanager
    def made():
        from dedupnet.adapters.tls import make_certs

        with tempfile.TemporaryDirectory(prefix="dedupnet-sim-certs-") as d:
            make_certs(d, range(1, cfg.networks + 1), days=2)
            yield d
    return made()


async def _simulate(cfg: SimConfig, redis_url: str, *, out, during, key_file: str | None,
                    tls_dir: str | None) -> Report:
    web = SyntheticWeb(WebSpec(pages=cfg.pages, sites=cfg.sites, seed=cfg.seed), port=0)
    server = admin_client(redis_url)  # redis-py's RedisCluster for redis+cluster:// URLs
    server.config_resetstat()
    crawler = CrawlerSettings(concurrency=cfg.concurrency, per_site_concurrency=cfg.per_site_concurrency,
                              per_site_delay=cfg.per_site_delay, max_depth=cfg.max_depth, retry_base=0.05,
                              block_timeout=0.2, progress_interval=3600)
    observer = Observer()
    prefix = f"sim-{cfg.mode}-{cfg.seed}-{time.monotonic_ns() % 10**6}"
    async with trio.open_nursery() as nursery:
        await nursery.start(web.serve)
        seeds = web.seeds(seed_count(cfg))
        if cfg.mode == "owner":
            from dedupnet.harness.owner import open_owner_cluster

            system_cm = open_owner_cluster(redis_url, cfg.networks, cfg.hosts, prefix=prefix)
        else:
            system_cm = open_cluster(redis_url, cfg.networks, cfg.hosts, mode=cfg.mode, set_size=cfg.set_size,
                                     prefix=prefix, crawler=crawler, set_linger=cfg.set_linger,
                                     partition_policy=cfg.partition_policy, answer_timeout=cfg.answer_timeout,
                                     send_delay=cfg.send_delay, tls_dir=tls_dir, lan_tls=cfg.lan_tls,
                                     **_link_relays(cfg),
                                     **({"recrawl": recrawl_policy(cfg)} if cfg.recrawl_after is not None else {}),
                                     **({"lan_key_file": key_file, "key_poll_interval": cfg.key_poll_interval}
                                        if key_file else {}))
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
            if during is not None:
                crawling.start_soon(during, system, web)
            plan = await _seed(system, seeds, cfg.scenario)
            t0 = time.perf_counter()
            timeline: list[dict] = []
            timed_out, windows = await _run_windows(cfg, system, crawlers, web, timeline, t0, out, meter, links,
                                                    seeds, observer)
            wall = time.perf_counter() - t0
            memory = await trio.to_thread.run_sync(redis_memory, server, prefix)
            report = _report(cfg, web, seeds, system, server, observer, timeline, wall, timed_out, plan=plan,
                             center_cpu=meter.seconds - meter_start if meter else None, memory=memory,
                             windows=windows)
            if links is not None:
                report.links = links.summary(t0=trio.current_time() - wall)
            crawling.cancel_scope.cancel()  # before the system closes the stores they use
        nursery.cancel_scope.cancel()
    return report


# --- link faults (dedupnet/harness/relay.py): relays on the chosen links, switched on as the crawl goes


def _link_relays(cfg: SimConfig) -> dict:
    """open_cluster's arguments for the relays the link faults need (none without any)."""
    schedule = _link_schedule(cfg)
    return {"links": frozenset(l for f in schedule for l in f.links), "link_seed": cfg.seed} if schedule else {}


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
    from dedupnet.adapters.bloom import attach, spec_from

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
        c = Crawler(h.pools.store, settings, h.counters, consumer=ip)
        await nursery.start(c.run)
        crawlers[ip] = c
    return crawlers


def seed_count(cfg: SimConfig) -> int:
    """Seed URLs a run starts from: ``cfg.seeds``, but at least one per network, so that
    no network of a wide layout (8x4 with the default 6 seeds) sits idle."""
    return max(cfg.seeds, cfg.networks)


def seed_order(ips: list[str]) -> list[str]:
    """Hosts in the order seeds are dealt to them: host 0 of every network, then host 1
    of every network, ... (round-robin over the networks first), so that with at least
    as many seeds as networks every network gets one. Deterministic: by address."""
    def key(ip: str) -> tuple[int, int]:
        parts = ip.split(".")
        return int(parts[3]), int(parts[2])  # host index (10 + i), then network
    return sorted(ips, key=key)


def assign_seeds(ips: list[str], seeds: list[str]) -> dict[str, list[str]]:
    """Which host gets which seeds (both runners deal them the same way)."""
    order = seed_order(ips)
    plan: dict[str, list[str]] = {ip: [] for ip in order}
    for i, url in enumerate(seeds):
        plan[order[i % len(order)]].append(url)
    return plan


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


async def _pool_sizes(system) -> dict[str, int]:
    sizes: Counter[str] = Counter()
    for h in system.hosts.values():
        pools = await trio.to_thread.run_sync(h.pools.sizes)
        sizes["URL_pool"] += pools[URL_POOL]
        sizes["task_pool"] += pools[TASK_POOL]
    for c in getattr(system, "centers", {}).values():
        sizes["reduce_pools"] += len(c.core.sets)
        sizes["task_URL"] += len(c.core.tasks)
    return dict(sizes)


def recrawl_policy(cfg: SimConfig):
    """The daemons' :class:`~dedupnet.adapters.recrawl.RecrawlPolicy` (None without ``recrawl_after``)."""
    from dedupnet.adapters.recrawl import RecrawlPolicy

    return RecrawlPolicy.from_settings(cfg.recrawl_after)


def check_windows(cfg: SimConfig) -> None:
    """ValueError for what ``--recrawl-after``/``--windows`` cannot be combined with."""
    if cfg.windows < 1:
        raise ValueError("--windows must be at least 1")
    if cfg.windows > 1 and cfg.recrawl_after is None:
        raise ValueError("--windows needs --recrawl-after (without it nothing is ever crawled again)")
    if cfg.recrawl_after is not None and cfg.mode == "owner":
        raise ValueError("--recrawl-after runs the protocol's daemons (exact or paper mode); owner has no ages")
    if cfg.windows > 1 and cfg.scenario not in ("default", "concurrent"):
        raise ValueError(f"--windows runs the default and concurrent scenarios, not {cfg.scenario!r}")


async def _run_windows(cfg: SimConfig, system, crawlers, web: SyntheticWeb, timeline, t0, out, meter, links,
                       seeds: list[str], observer: Observer) -> tuple[bool, list[dict]]:
    """Window 1 is the crawl from the seeds, to quiescence. With ``recrawl_after`` A each
    further window waits until A and one slice (dedupnet/adapters/recrawl.py: how much longer a URL
    may still count as seen) have passed since the previous one was quiescent, so that
    every URL admitted or crawled in it is due again, then offers the same seeds again
    through the hosts' URL_pool (what a host's crawler does every ``recrawl_interval``
    under a re-crawl policy) and runs to quiescence: every page must be found again and
    fetched once more, in the whole system. Returns whether a window timed out, and the
    windows (start and end in seconds since ``t0``, requests answered in each)."""
    from dedupnet.adapters.recrawl import SLICES

    windows: list[dict] = []
    timed_out = False
    for k in range(cfg.windows):
        if k:
            wait = windows[-1]["end_wall"] + cfg.recrawl_after * (1 + 1 / SLICES) + 0.1 - time.time()
            await trio.sleep(max(wait, 0.0))
            observer.found.clear()
            await _seed(system, seeds, cfg.scenario)
        start, before = time.perf_counter() - t0, sum(web.answer_counts.values())
        timed_out |= await _run_to_quiescence(cfg, system, crawlers, web, timeline, t0, out, meter, links)
        windows.append({"window": k + 1, "start": round(start, 2), "end": round(time.perf_counter() - t0, 2),
                        "requests": sum(web.answer_counts.values()) - before, "end_wall": time.time()})
        if timed_out:
            break
    for w in windows:
        del w["end_wall"]
    return timed_out, windows if cfg.recrawl_after is not None else []


async def _run_to_quiescence(cfg, system, crawlers, web, timeline, t0, out, meter: CpuMeter | None = None,
                             links=None) -> bool:
    """Sample progress until nothing is left anywhere (twice in a row) or the timeout.
    With link faults, a fault with an end must have ended (healed) first."""
    quiet = 0
    next_print = 0.0
    events: set[str] = set()
    with trio.move_on_after(cfg.timeout) as scope:
        while quiet < 2:
            await trio.sleep(0.1)
            try:
                sizes = await _pool_sizes(system)
            except (DedupnetError, redis.RedisError) as e:  # Redis (a cluster node) is down: not done yet
                sizes = {"store_unavailable": 1}
                if out is not None:
                    print(f"  Redis unavailable: {e}; waiting", file=out, flush=True)
            now = time.perf_counter() - t0
            fetched = sum(web.answer_counts.values())
            sample = {"t": round(now, 2), "pages_fetched": fetched, "duplicates": web.duplicate_fetches(), **sizes}
            timeline.append(sample)
            await _scenario_events(cfg, system, fetched, events)
            if links is not None:
                links.tick(fetched / max(links.total, 1))
            if meter is not None:
                for c in getattr(system, "centers", {}).values():
                    meter.attach(c)  # a restarted center is a new daemon
            current = crawlers if crawlers else {ip: h.crawler for ip, h in system.hosts.items()}
            idle = all(c.idle for c in current.values() if c is not None)
            done = idle and not any(sizes.values()) and await system.quiescent()
            done = done and (links is None or links.settled)
            quiet = quiet + 1 if done else 0
            if out is not None and now >= next_print:
                next_print = now + cfg.progress_every
                print(progress_line(sample), file=out, flush=True)
    return scope.cancelled_caught


def progress_line(sample: dict) -> str:
    """One line of live progress from a timeline sample."""
    t, fetched = sample["t"], sample["pages_fetched"]
    return (f"  t={t:6.1f}s  pages {fetched:>6} ({fetched / max(t, 1e-9):6.0f}/s)  "
            f"URL_pool {sample.get('URL_pool', 0):>5}  task_pool {sample.get('task_pool', 0):>5}  "
            f"in flight {sample.get('reduce_pools', 0):>3}  duplicates {sample['duplicates']}")


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


def _report(cfg, web: SyntheticWeb, seeds, system, server, observer: Observer, timeline, wall, timed_out, *,
            plan: dict[str, list[str]] | None = None, center_cpu: float | None = None,
            memory: dict[str, dict[str, int]] | None = None, killed: frozenset[str] = frozenset(),
            windows: list[dict] | None = None) -> Report:
    reach = web.reachable_detail(seeds, max_depth=cfg.max_depth)
    expected = reach.fetched
    k = cfg.windows
    violations, refetched = check_extracted(web, seeds, reach.depth, cfg.max_depth, killed=killed, windows=k)
    fetched = set(web.answer_counts)
    lost = sorted(expected - fetched)
    daemons = [*getattr(system, "centers", {}).values(), *system.hosts.values()]
    frames: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    for d in daemons:
        for key, value in d.counters.snapshot().items():
            if key.startswith("frames_sent{"):
                frames[key[len("frames_sent{kind=\""):-2]] += value
            elif key.startswith("frames_in{"):
                stages[key[len("frames_in"):]] += value
    stats = merged_info(server, "commandstats")
    lookups = sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("smismember", "hmget"))
    trips = sum(s.round_trips for s in getattr(system, "stores", {}).values()) if hasattr(system, "stores") else 0
    found = sum(d.counters.get("links_pushed") for d in system.hosts.values())
    per_host = {ip: sum(v for k, v in h.counters.snapshot().items() if k.startswith("pages_fetched"))
                for ip, h in sorted(system.hosts.items())}
    per_net = {f"net:{n}": c.counters.get("urls_admitted") for n, c in sorted(getattr(system, "centers", {}).items())}
    requests = sum(web.answer_counts.values())
    crawler_requests = sum(v for h in system.hosts.values() for k, v in h.counters.snapshot().items()
                           if k.startswith("pages_fetched{") and k != 'pages_fetched{status="503"}')
    stores = [h.pools.store for h in system.hosts.values() if hasattr(h, "pools")]
    centers = list(getattr(system, "centers", {}).values())
    admitted = sum(per_net.values())
    set_frames = sum(c.counters.get("frames_in", stage="lan", flag="1") for c in centers)
    set_urls = sum(c.counters.get("urls_in", stage="lan") for c in centers)
    frames_sent = sum(frames.values())
    memory = memory or {}
    center_bytes = sum(memory.get("center", {}).values())
    host_bytes = sum(memory.get("host", {}).values())
    extra = dict(
        seeds_per_network=seeds_per_network(plan or {}), urls_admitted=admitted,
        set_fill=round(set_urls / set_frames, 1) if set_frames else None,
        frames_per_url=round(frames_sent / found, 3) if found else None,
        bytes_per_url=round(sum(wire_bytes(d.counters) for d in daemons) / len(expected), 1) if expected else None,
        tls_bytes_on_wire=sum(d.counters.get("tls_bytes_sent") for d in daemons),
        tls_handshakes=sum(d.counters.get("tls_handshakes") for d in daemons),
        tls_payload_bytes=sum(d.counters.get("tls_payload_sent") for d in daemons),
        max_url_pool=max((s.get("URL_pool", 0) for s in timeline), default=0),
        center_cpu_s=None if center_cpu is None else round(center_cpu, 3),
        center_cpu_ms_per_1k_urls=round(center_cpu * 1e6 / admitted, 1) if center_cpu is not None and admitted else None,
        redis_bytes=memory,
        center_redis_bytes_per_url=round(center_bytes / admitted, 1) if memory and admitted else None,
        host_redis_bytes_per_url=round(host_bytes / admitted, 1) if memory and admitted else None,
    )
    bad: Counter[str] = Counter()
    for d in daemons:
        for key, value in d.counters.snapshot().items():
            if key.startswith(("bad_input{", "handshake_failed{", "rejected{", "throttled{")):
                bad[key] += value
    extra["bad_input"] = dict(bad)
    if windows:
        counts = [web.answer_counts.get(u, 0) for u in expected]
        extra.update(windows=windows, min_refetch_gap=refetch_gap(web), window_counts={
            "exactly": sum(n == k for n in counts), "fewer": sum(n < k for n in counts),
            "more": sum(n > k for n in counts)})
    return Report(
        config=asdict(cfg), timed_out=timed_out, wall_time=round(wall, 3),
        reachable_pages=len(reach.pages), reachable_urls=len(expected), fetched_urls=len(fetched & expected),
        requests=requests, crawler_requests=crawler_requests,
        duplicate_fetches=web.duplicate_fetches() if k == 1 else sum(max(n - k, 0) for n in web.answer_counts.values()),
        # finish_URL keeps no URL for ever under a re-crawl policy: only the web can tell then.
        harness_duplicates=finished_twice(stores, reach.disallowed) if stores and not windows else None,
        invariant_violations=len(violations), invariant_examples=violations[:20], refetched_after_kill=refetched,
        lost_urls=len(lost), lost_examples=lost[:10],
        unexpected_fetches=len(fetched - expected), frames=dict(frames), frames_by_stage=dict(stages),
        bytes_on_wire=sum(wire_bytes(d.counters) for d in daemons), redis_lookups=lookups,
        redis_round_trips=trips, urls_found=found, urls_per_s=round(found / wall, 1) if wall else 0.0,
        pages_per_s=round(requests / wall, 1) if wall else 0.0,
        latency_p50=percentile(observer.latencies, 50), latency_p99=percentile(observer.latencies, 99),
        sets_concluded_incomplete=sum(d.counters.total("concluded_incomplete") for d in daemons),
        per_host_pages=per_host, per_network_admitted=per_net, timeline=timeline, **extra,
    )


def wire_bytes(counters) -> int:
    """Bytes a daemon put on the wire: its messages' bytes (``bytes_sent``), except that
    those sent inside TLS count as the TLS records that carried them (``tls_bytes_sent``:
    TCP bytes under the SSLStream, handshakes included; dedupnet/adapters/tls.py CountingStream)."""
    return counters.get("bytes_sent") - counters.get("tls_payload_sent") + counters.get("tls_bytes_sent")


def check_extracted(web: SyntheticWeb, seeds: list[str], depth: dict[str, int],
                    max_depth: int | None = None, *, killed: frozenset[str] = frozenset(),
                    windows: int = 1) -> tuple[list[str], int]:
    """The design guide's invariant, checked from what the web served, not from anything
    the daemons say: every URL a crawler extracted (a seed, a link of a page the web
    answered, a redirect's target) ends crawled exactly once, or, if robots.txt forbids
    it, not at all; and nothing is crawled that no fetched page led to. Variants of one
    URL (``#x``, un-normalised spellings) are one URL after normalisation, which is how
    a duplicate of a crawled URL is recorded. Returns one line per violation (the URL,
    what went wrong, the fetched pages that carried it, when and by whom it was
    requested) and the number of re-fetches excused: requests for a URL that one host
    in ``killed`` (SIGKILLed during the run) made again, all by itself. A crawler records
    a page in the same transaction that takes its task (local_host/crawler.py), so a
    crawler killed between the web's answer and that transaction fetches the page again
    when it restarts: at least once, never by another host. No crawler can do better:
    the request is a side effect outside its store. Who made a request is the client
    address the web saw (the daemons' crawlers send from their host's IP). With
    ``windows`` K (re-crawl by age, ``--windows``) "once" is K times: once in each window."""
    carriers: dict[str, list[str]] = {}
    for s in seeds:
        carriers.setdefault(normalize(s), []).append("(seed)")
    for page in sorted(web.answer_counts):
        if max_depth is not None and depth.get(page, 0) >= max_depth:
            continue  # its links are not followed (the crawler stores the depth with the URL)
        redirect = web.redirect_of(page)
        for link in dict.fromkeys([redirect[1]] if redirect else web.links_of(page)):
            carriers.setdefault(link, []).append(page)
    times: dict[str, list[float]] = {}
    origin = dict(zip(web.hosts, web.origins))
    for t, host, path in web.request_log:
        try:
            times.setdefault(normalize(origin[host] + path), []).append(t)
        except (KeyError, ValueError, BadURL):
            continue  # robots.txt and garbled targets: not a crawl of a URL
    out = []

    def seen(url: str) -> str:
        via = carriers.get(url, [])
        at = ", ".join(f"{t:.1f}" for t in times.get(url, [])[:5])
        by = ", ".join(web.answered_by.get(url, [])[:5])
        return (f"; carried by {len(via)} page(s), e.g. {', '.join(via[:3])}" if via else "") + \
               (f"; requested at t={at}" if at else "") + (f" by {by}" if by else "")

    excused = 0
    for url in sorted(carriers):
        n = web.answer_counts.get(url, 0)
        by = set(web.answered_by.get(url, ()))
        if n > windows and len(by) == 1 and by <= killed:
            excused += n - windows
            continue
        if web.disallowed(url):
            if web.fetch_counts.get(url, 0):
                out.append(f"{url}: robots.txt forbids it, fetched {web.fetch_counts[url]} time(s){seen(url)}")
        elif n == 0:
            out.append(f"{url}: extracted, never crawled (lost){seen(url)}")
        elif n > windows:
            out.append(f"{url}: crawled {n} times (duplicate{f' over {windows} windows' if windows > 1 else ''}){seen(url)}")
        elif n < windows:
            out.append(f"{url}: crawled {n} of {windows} times (missed a window){seen(url)}")
    for url in sorted(set(web.answer_counts) - set(carriers)):
        out.append(f"{url}: crawled, but no fetched page or seed led to it{seen(url)}")
    return out, excused


def refetch_gap(web: SyntheticWeb) -> float | None:
    """The shortest time between two answered requests for one URL (the web's request
    log; a flaky page's 503s are not answers), or None if no URL was fetched twice."""
    origin = dict(zip(web.hosts, web.origins))
    times: dict[str, list[float]] = {}
    for t, host, path in web.request_log:
        if path == "/robots.txt":
            continue  # each crawler reads it once per site
        try:
            times.setdefault(normalize(origin[host] + path), []).append(t)
        except (KeyError, ValueError, BadURL):
            continue
    gaps = []
    for url, ts in times.items():
        i = web.lookup(url)
        if i is not None and web.flaky[i]:
            ts = ts[web.spec.flaky_failures:]
        gaps += [b - a for a, b in zip(ts, ts[1:])]
    return round(min(gaps), 3) if gaps else None


def finished_twice(stores: list, skipped: set[str]) -> int:
    """The harness's own duplicate count: URLs recorded in the finish_URL of more than one
    host (each host finishes a URL once), less robots-disallowed ones, which are finished
    without a request. Independent of the web server's counts, which it should match."""
    seen: Counter[tuple[int, bytes]] = Counter()
    for store in stores:
        batch = store.batch()
        for bucket in range(1 << store.bucket_bits):
            batch.add(b"SMEMBERS", f"{store.fp_key(FINISH_URL)}:{bucket}")
        for bucket, members in enumerate(store.execute(batch)):
            seen.update((bucket, m) for m in members)
    excluded = set(stores[0].fp_members(fingerprint_many(sorted(skipped)))) if skipped else set()
    return sum(c - 1 for key, c in seen.items() if c > 1 and key not in excluded)


def _bloom_note(c: dict) -> str:
    if c.get("finish_url_filter", "exact") != "bloom":
        return ""
    return (f"\n  finish_URL                       bloom: {c['bloom_capacity']:,} URLs at {c['bloom_error_rate']:g}"
            f" (each false positive is a URL never crawled: counted in lost URLs)")


def format_report(r: Report) -> str:
    c = r.config
    status = "TIMED OUT (not quiescent)" if r.timed_out else "quiescent"
    lat = "n/a" if r.latency_p50 is None else f"{r.latency_p50 * 1000:.0f} ms / {r.latency_p99 * 1000:.0f} ms"
    frames = ", ".join(f"{k} {v:,}" for k, v in sorted(r.frames.items()))
    hosts = " ".join(f"{ip.rsplit('.', 2)[-2]}.{ip.rsplit('.', 1)[-1]}:{n}" for ip, n in r.per_host_pages.items())
    seeds = sum(r.seeds_per_network.values()) if r.config.get("scenario") != "concurrent" and r.seeds_per_network \
        else c["seeds"]
    cpu = "n/a" if r.center_cpu_s is None else (
        f"{r.center_cpu_s * 1000:,.0f} ms   {_num(r.center_cpu_ms_per_1k_urls, '.1f')} ms per 1,000 admitted URLs"
        + ("" if r.config.get("processes") else "   (reactor work, timed in-process)"))
    memory = "; ".join(f"{role} " + " ".join(f"{k}:{v / max(r.urls_admitted, 1):.1f}" for k, v in fam.items())
                       for role, fam in r.redis_bytes.items() if fam) or "n/a"
    return f"""dedupnet sim: {c['networks']} networks x {c['hosts']} hosts, {c['mode']} mode, scenario {c['scenario']}, seed {c['seed']}
  web: {c['pages']:,} pages over {c['sites']} sites; {r.reachable_pages:,} pages reachable from {seeds} seeds ({r.reachable_urls:,} URLs to request)
  run: {status} after {r.wall_time:.1f} s

  URLs fetched                {r.fetched_urls:>10,} of {r.reachable_urls:,}
  duplicate fetches           {r.duplicate_fetches:>10,}
  lost URLs                   {r.lost_urls:>10,}{'   e.g. ' + r.lost_examples[0] if r.lost_examples else ''}{_bloom_note(c)}
  unexpected fetches          {r.unexpected_fetches:>10,}   (not in the ground truth, e.g. robots-disallowed)
  extracted -> crawled once   {r.invariant_violations:>10,} violations{'   e.g. ' + r.invariant_examples[0] if r.invariant_examples else ''}
  re-fetched after a kill     {r.refetched_after_kill:>10,}   (by the killed host itself: pages it had in progress)
  requests to the web         {r.requests:>10,}   {r.pages_per_s:,.0f}/s
  links found (URL_pool)      {r.urls_found:>10,}   {r.urls_per_s:,.0f}/s
  frames sent                 {sum(r.frames.values()):>10,}   {frames}
  bytes on the wire           {r.bytes_on_wire:>10,}   {r.bytes_on_wire / max(r.urls_found, 1):,.0f} per URL found, {_num(r.bytes_per_url, ',.0f')} per distinct URL{_tls_text(r)}
  frames per URL found        {_num(r.frames_per_url, '>10.3f')}
  URLs per URL_set (fill)     {_num(r.set_fill, '>10.1f')}   (flag=1 frames at the centers)
  max URL_pool backlog        {r.max_url_pool:>10,}
  Redis look-ups              {r.redis_lookups:>10,}   (SMISMEMBER/HMGET commands)
  discovery -> admission      p50 / p99: {lat}
  sets concluded incomplete   {r.sets_concluded_incomplete:>10,}
  center CPU                  {cpu}
  Redis bytes per admitted URL  center {_num(r.center_redis_bytes_per_url, '.1f')}, hosts {_num(r.host_redis_bytes_per_url, '.1f')}   ({r.urls_admitted:,} URLs admitted)
    by key family             {memory}
  pages per host              {hosts}
  URLs admitted per network   {' '.join(f'{k}:{v}' for k, v in r.per_network_admitted.items()) or 'n/a'}
  seeds per network           {' '.join(f'{k}:{v}' for k, v in r.seeds_per_network.items()) or 'n/a'}""" + _windows_lines(r) + _faults_lines(r) + _links_text(r) + _auth_lines(r)


def _windows_lines(r: Report) -> str:
    """Re-crawl by age: the windows, and whether every URL was fetched once in each."""
    if not r.windows:
        return ""
    c, k, n = r.config, len(r.windows), r.window_counts
    age = c["recrawl_after"]
    gap = "n/a" if r.min_refetch_gap is None else f"{r.min_refetch_gap:.2f} s"
    lines = [f"  re-crawl by age             recrawl_after {age:g} s, {k} windows: fetched exactly {k} times "
             f"{n['exactly']:,} of {r.reachable_urls:,} URLs, fewer {n['fewer']:,}, more {n['more']:,}",
             f"  closest two fetches of a URL  {gap}   (never less than recrawl_after)"]
    for w in r.windows:
        long = "   longer than recrawl_after: a URL found again after its age in it is fetched again" \
            if w["end"] - w["start"] > age else ""
        lines.append(f"    window {w['window']:<3}               t={w['start']:.1f}-{w['end']:.1f} s   "
                     f"{w['requests']:,} requests{long}")
    return "".join("\n" + line for line in lines)


def _auth_lines(r: Report) -> str:
    """LAN keys (issue #10) and what was refused, if either applies."""
    keyed = r.config.get("lan_key") or r.config.get("lan_key_file") or r.config.get("secure")
    if not keyed and not r.bad_input:
        return ""
    refused = ", ".join(f"{k} {v:,}" for k, v in sorted(r.bad_input.items())) or "none"
    return (f"\n  LAN frames                  {'HMAC-SHA256 tagged (LAN key)' if keyed else 'untagged'}"
            f"\n  refused, throttled, rejected {refused}")


def _tls_text(r: Report) -> str:
    if not r.config.get("secure"):
        return ""
    return (f"\n  TLS (--secure)              {r.tls_handshakes:>10,} handshakes, {r.tls_bytes_on_wire:,} bytes of TLS "
            f"records (TCP bytes, in the figure above), {r.tls_bytes_on_wire - r.tls_payload_bytes:,} of them TLS's "
            f"own{'; LAN too' if r.config.get('lan_tls') else '; centers only'}")


def _faults_lines(r: Report) -> str:
    """The faults of the run, then every invariant violation found (with its URL)."""
    lines = []
    for f in r.faults:
        when = "not started" if f.get("started") is None else f"t={f['started']:.1f}-{f['ended']:.1f} s"
        lines.append(f"  fault {f['spec']:<44} {when}   {f.get('note', '')}")
    if r.invariant_violations:
        lines.append(f"  invariant violations ({r.invariant_violations}, first {len(r.invariant_examples)}):")
        lines += [f"    {v}" for v in r.invariant_examples]
    return "".join("\n" + line for line in lines)


def _links_text(r: Report) -> str:
    from dedupnet.harness.relay import format_links

    return "\n" + format_links(r.links) if r.links else ""


def _num(value, spec: str) -> str:
    """A figure, or n/a (right-aligned like the figure would be) when it was not measured."""
    if value is None:
        width = re.match(r"[<>^]?(\d*)", spec.lstrip(",")).group(1) or "0"
        return f"{'n/a':>{width}}"
    return format(value, spec)


def format_comparison(reports: list[Report]) -> str:
    head = f"{'mode':<8}{'duplicates':>11}{'lost':>7}{'frames/URL':>12}{'bytes/URL':>11}{'URLs/s':>9}{'p99 ms':>9}{'wall s':>8}"
    lines = [head, "-" * len(head)]
    for r in reports:
        found = max(r.urls_found, 1)
        p99 = "n/a" if r.latency_p99 is None else f"{r.latency_p99 * 1000:.0f}"
        lines.append(f"{r.config['mode']:<8}{r.duplicate_fetches:>11,}{r.lost_urls:>7,}"
                     f"{sum(r.frames.values()) / found:>12.2f}{r.bytes_on_wire / found:>11.0f}"
                     f"{r.urls_per_s:>9,.0f}{p99:>9}{r.wall_time:>8.1f}")
    return "\n".join(lines)


def plot(report: Report, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in report.timeline]
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    a.plot(t, [s["pages_fetched"] for s in report.timeline], label="pages fetched")
    a.plot(t, [s["duplicates"] for s in report.timeline], label="duplicate fetches")
    a.set_ylabel("requests")
    a.legend()
    for key in ("URL_pool", "task_pool", "reduce_pools", "task_URL"):
        b.plot(t, [s.get(key, 0) for s in report.timeline], label=key)
    b.set_xlabel("seconds")
    b.set_ylabel("entries")
    b.legend()
    c = report.config
    fig.suptitle(f"dedupnet sim: {c['networks']}x{c['hosts']}, {c['mode']} mode, {c['scenario']}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)



#: Fault kinds the one-process simulation carries out: the link faults (dedupnet/harness/relay.py).
INPROCESS_FAULTS: tuple[str, ...] = LINK_FAULTS


def faults_refused(faults) -> str:
    kinds = sorted({f.kind for f in faults if f.kind not in INPROCESS_FAULTS})
    return (f"fault(s) {', '.join(kinds)} need --processes (every daemon its own process, "
            f"dedupnet/harness/simproc.py); without it: {', '.join(INPROCESS_FAULTS) or 'none yet'}")


def run(args) -> int:
    """``dedupnet sim``: one run, or ``--compare`` (the three modes on the same seed),
    or ``--chaos N`` (N random fault schedules, dedupnet/harness/chaos.py)."""
    import contextlib
    import dataclasses

    import orjson

    from dedupnet.adapters.embedded import EmbeddedRedis

    if args.sweep:
        return _sweep(args)

    base = SimConfig(networks=args.networks, hosts=args.hosts, pages=args.pages, sites=args.sites, mode=args.mode,
                     seed=args.seed, scenario=args.scenario, timeout=args.timeout, seeds=args.seeds,
                     max_depth=args.max_depth, set_size=args.set_size, set_linger=args.set_linger,
                     partition_policy=args.partition_policy, answer_timeout=args.answer_timeout,
                     send_delay=args.send_delay, faults=tuple(args.faults or ()),
                     finish_url_filter=args.finish_url_filter, bloom_capacity=args.bloom_capacity,
                     bloom_error_rate=args.bloom_error_rate,
                     lan_key=getattr(args, "lan_key", False), secure=args.secure, lan_tls=args.lan_tls,
                     recrawl_after=args.recrawl_after, windows=args.windows)
    try:
        check_secure(base)
        check_windows(base)
        if base.recrawl_after is not None and (args.processes or args.compare or args.chaos is not None):
            raise ValueError("--recrawl-after runs in one process, one mode (not with --processes, --compare "
                             "or --chaos)")
        if args.compare and base.secure:
            raise ValueError("--secure cannot be combined with --compare (its owner baseline has no centers)")
    except ValueError as e:
        print(f"dedupnet sim: {e}", file=sys.stderr)
        return 2
    if args.chaos is not None:
        from dedupnet.harness.chaos import run_chaos

        return run_chaos(base, args)
    if args.http and args.processes:
        print("dedupnet sim: --http serves the one-process simulation's page; with --processes every center is its "
              "own process: give it --http there (dedupnet center --http HOST:PORT)", file=sys.stderr)
        return 2
    if base.faults and not args.processes and any(f.kind not in INPROCESS_FAULTS for f in base.faults):
        print("dedupnet sim: " + faults_refused(base.faults), file=sys.stderr)
        return 2
    modes = MODES if args.compare else (args.mode,)
    reports = []
    if args.redis_cluster:
        from dedupnet.adapters.embedded import EmbeddedCluster

        server_cm = EmbeddedCluster(args.redis_cluster)
    else:
        server_cm = contextlib.nullcontext(args.redis) if args.redis else EmbeddedRedis()
    with server_cm as url:
        for mode in modes:
            cfg = dataclasses.replace(base, mode=mode)
            print(f"-- {cfg.networks} networks x {cfg.hosts} hosts, {mode} mode, {cfg.scenario}: crawling "
                  f"{cfg.pages:,} pages over {cfg.sites} sites", flush=True)
            if args.processes:
                from dedupnet.harness.simproc import simulate_processes

                try:
                    report = trio.run(simulate_processes, cfg, url)
                except ValueError as e:  # a mode or scenario processes mode does not run
                    print(f"dedupnet sim: {e}", file=sys.stderr)
                    return 2
            else:
                during = None
                if args.http:  # the live status page of the whole system (dedupnet/adapters/status_page.py)
                    from dedupnet.adapters.status_page import serve_sim_status

                    during = serve_sim_status(args.http, {k: getattr(cfg, k) for k in (
                        "networks", "hosts", "pages", "sites", "mode", "scenario", "seed")})
                report = trio.run(lambda: simulate(cfg, url, during=during))
            reports.append(report)
            print(format_report(report), flush=True)
    if args.compare:
        print("\n" + format_comparison(reports))
    if args.json:
        data = [r.to_json() for r in reports] if args.compare else reports[0].to_json()
        with open(args.json, "wb") as f:
            f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    if args.plot:
        plot(reports[0], args.plot)
    return 1 if any(r.timed_out for r in reports) else 0


def _sweep(args) -> int:
    """``dedupnet sim --sweep 2x2,3x3``: :mod:`dedupnet.harness.sweep` with this command's web,
    seed and --processes (one simulation process per layout)."""
    from dedupnet.harness import sweep

    argv = ["--layouts", args.sweep, "--pages", str(args.pages), "--sites", str(args.sites), "--seed", str(args.seed),
            "--seeds", str(args.seeds), "--mode", args.mode]
    if args.timeout != SimConfig.timeout:
        argv += ["--timeout", str(args.timeout)]
    if args.processes:
        argv.append("--processes")
    if args.baseline_python:
        argv += ["--baseline-python", args.baseline_python]
    if args.json:
        argv += ["--out", args.json]
    return sweep.main(argv)


def _fault_arg(spec: str) -> Fault:
    import argparse

    try:
        return parse_fault(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _http_arg(text: str) -> tuple[str, int]:
    """``PORT`` (on 127.0.0.1) or ``HOST:PORT``."""
    import argparse

    from dedupnet.service.config import endpoint

    try:
        return ("127.0.0.1", int(text)) if text.isdigit() else endpoint(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p) -> None:
    p.add_argument("--networks", type=int, default=3, help="networks (LANs), each with a center (default 3)")
    p.add_argument("--hosts", type=int, default=3, help="crawler hosts per network (default 3)")
    p.add_argument("--pages", type=int, default=3000, help="pages of the synthetic web (default 3000)")
    p.add_argument("--sites", type=int, default=30, help="sites of the synthetic web (default 30)")
    p.add_argument("--mode", choices=MODES, default="exact")
    p.add_argument("--seed", type=int, default=1, help="seeds the web and the run (default 1)")
    p.add_argument("--seeds", type=int, default=6, help="seed URLs the crawl starts from (default 6)")
    p.add_argument("--max-depth", type=int, help="links deeper than this are not followed")
    p.add_argument("--set-size", type=int, default=SimConfig.set_size, help="URLs per URL_set (default %(default)s)")
    p.add_argument("--set-linger", type=float, default=SimConfig.set_linger, metavar="S",
                   help="seconds a host waits for a URL_set to fill (default %(default)s)")
    p.add_argument("--partition-policy", choices=PARTITION_POLICIES,
                   help="a late answer or a network that is down: wait (exact mode's default) or admit")
    p.add_argument("--answer-timeout", type=float, default=SimConfig.answer_timeout, metavar="S",
                   help="seconds before a set is asked again (default %(default)s)")
    p.add_argument("--send-delay", type=float, default=0.0, metavar="S",
                   help="fault injection: every message a host sends waits S seconds (one process only)")
    p.add_argument("--fault", dest="faults", action="append", type=_fault_arg, metavar="SPEC",
                   help="inject a fault (repeat for several): KIND[:at=F,for=S,target=T], e.g. kill-host, "
                        "kill-center:at=0.3,for=5,target=center:1; kinds: " + ", ".join(FAULTS) +
                        " (see dedupnet/harness/faults.py)")
    p.add_argument("--chaos", type=int, metavar="N",
                   help="run N random fault schedules (reproducible from --chaos-seed) and print one line each "
                        "plus a summary")
    p.add_argument("--chaos-seed", type=int, metavar="S", help="seed of the --chaos schedules (default: --seed)")
    p.add_argument("--scenario", choices=SCENARIOS, default="default",
                   help="concurrent: every host seeded with the same pages; churn: a host leaves and another "
                        "joins; restart: a center is killed and restarted (both a third of the way in)")
    p.add_argument("--timeout", type=float, default=120.0, help="give up (and say so) after this many seconds")
    p.add_argument("--compare", action="store_true", help="run exact, paper and owner on the same seed, side by side")
    p.add_argument("--processes", action="store_true",
                   help="every center and host as its own OS process (dedupnet center / dedupnet local)")
    p.add_argument("--sweep", metavar="LAYOUTS",
                   help="run these layouts (e.g. 2x2,3x3,5x5,8x4; --networks/--hosts ignored) one after the other "
                        "and print one table (see bench/bench_topology.py for all its options)")
    p.add_argument("--baseline-python", metavar="PYTHON",
                   help="with --sweep: also run each layout with another checkout's interpreter, side by side")
    p.add_argument("--lan-key", action="store_true",
                   help="HMAC tags on the LANs (issue #10): a random LAN key is made for the run")
    p.add_argument("--secure", action="store_true",
                   help="issue #10's protections together: TLS with client certificates between the centers "
                        "(certificates made for the run) and HMAC tags on the LANs (a random LAN key, as --lan-key); "
                        "the report counts TLS records on the wire")
    p.add_argument("--lan-tls", action="store_true", help="with --secure: TLS between hosts and their center too")
    p.add_argument("--http", type=_http_arg, metavar="[HOST:]PORT",
                   help="serve a live status page of the whole system (every center, the hosts) at "
                        "http://HOST:PORT/ while it runs (HOST default 127.0.0.1; docs/STATUS.md)")
    p.add_argument("--recrawl-after", type=float, metavar="S",
                   help="re-crawl by age (issue #13): every daemon's recrawl_after; with --windows K the seeds "
                        "are offered again, each time once the last window is quiescent and 1.25 x S seconds old, and "
                        "the report checks that every URL was fetched exactly K times")
    p.add_argument("--windows", type=int, default=1, metavar="K",
                   help="with --recrawl-after: crawl K windows (default %(default)s)")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw the run over time (needs matplotlib)")
    p.add_argument("--redis", metavar="URL", help="use this Redis server instead of an embedded one "
                                                   "(redis+cluster://HOST:PORT: a Redis Cluster)")
    p.add_argument("--redis-cluster", type=int, metavar="N",
                   help="run on an embedded Redis Cluster of N masters (dedupnet/adapters/embedded.py EmbeddedCluster)")
    p.add_argument("--finish-url-filter", choices=("exact", "bloom"), default="exact",
                   help="the hosts' finish_URL: exact (default) or bloom; each false positive is a URL never crawled")
    p.add_argument("--bloom-capacity", type=int, default=SimConfig.bloom_capacity, metavar="N")
    p.add_argument("--bloom-error-rate", type=float, default=SimConfig.bloom_error_rate, metavar="P")

"""What both simulation runners share (no runner imports the other): a run's
config, the observer that counts what the web served, the seeding rule, the progress
line, and the report with its checks (duplicate fetches, lost URLs, the extracted ->
crawled-once invariant of :mod:`dedupnet.harness.crawlchecks`) and its text."""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import redis


from dedupnet.codec.settings import SETTINGS
from dedupnet.harness.cluster import network_of_host
from dedupnet.harness.crawlchecks import check_extracted, finished_twice, refetch_gap, window_counts
from dedupnet.harness.faults import LINK_FAULTS, Fault
from dedupnet.harness.pacing import pacing, pacing_lines
from dedupnet.harness.simcpu import cpu_figures, cpu_lines
from dedupnet.harness.verdict import runs_with, verdict
from dedupnet.adapters.storage.redis_cluster import merged_info
from dedupnet.adapters.monitor.status_page import key_family, key_memory
from dedupnet.harness.web import SyntheticWeb, WebSpec
from dedupnet.harness.weblog import load_spread


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
    set_size: int = 400  # smaller than the daemons' default: a small crawl still fills several sets
    partition_policy: str | None = None  # the mode's default
    answer_timeout: float = SETTINGS["answer_timeout"].default
    #: Fault injection: every message a host sends waits this long (hosts too busy to
    #: answer in time). 0 in a normal run.
    send_delay: float = 0.0
    #: Faults injected during the run (dedupnet/harness/faults.py): process faults need
    #: ``--processes`` (dedupnet/harness/simproc.py); link faults (dedupnet/harness/relay.py)
    #: run in-process.
    faults: tuple[Fault, ...] = ()
    seeds: int = 6
    max_depth: int | None = None
    #: The light workload the tests (and the tables measured before ``dedupnet sim`` ran
    #: as deployed) build on: politeness light, no durable acknowledgements, the classic
    #: web. ``dedupnet sim`` itself runs the deployed daemons' values and the real web
    #: (dedupnet/harness/simcli.py ``deployed``) unless told otherwise (``--light``).
    per_site_delay: float = 0.0
    per_site_concurrency: int = 4
    concurrency: int = 16
    #: The synthetic web's shape: a name of dedupnet/harness/webgraph.py ``SHAPES``.
    web_shape: str = "classic"
    progress_every: float = 1.0
    #: The hosts' finish_URL: "exact" or "bloom" (dedupnet/adapters/storage/bloom.py): every false
    #: positive of the filter is a URL never crawled, counted in ``lost URLs``.
    finish_url_filter: str = "exact"
    bloom_capacity: int = 10_000_000
    bloom_error_rate: float = 0.001
    #: HMAC tags on the LANs (dedupnet/codec/auth.py): a random key made for the
    #: run (one key file, shared by every LAN of the simulation), or this key file.
    lan_key: bool = False
    lan_key_file: str | None = None
    #: Seconds between two reads of the key file by each daemon (a rotation's pace).
    key_poll_interval: float = 1.0
    #: ``--secure``: TLS with client certificates between the centers,
    #: certificates made for the run in a temporary directory (dedupnet/adapters/net/tls.py).
    #: Also HMAC tags on the LANs, as ``lan_key`` (a random LAN key made for the run).
    secure: bool = False
    #: ``--lan-tls``: with ``secure``, TLS between hosts and their center too.
    lan_tls: bool = False
    #: Re-crawl by age: every daemon's ``recrawl_after``, and ``windows`` K:
    #: the seeds are offered again K - 1 times, each once the previous window is quiescent
    #: and older than the age (:func:`_run_windows`); every URL must be fetched K times.
    recrawl_after: float | None = None
    windows: int = 1
    #: Exact mode: every center's ``routing`` ("home" or "broadcast"; None: the center's
    #: default) and ``weights`` (``"NETWORK=WEIGHT"`` each, the setting's spelling).
    routing: str | None = None
    weights: tuple[str, ...] = ()
    #: Seconds every answer of the synthetic web waits, as on the real web (0: at once).
    web_latency: float = 0.0
    #: Every daemon's ``durable_acks``: off here (the light workload); ``dedupnet sim``
    #: turns it on, as deployed, and runs its own server with its AOF on (simcli.py).
    durable_acks: bool = False
    #: The daemons' other settings marked ``sim`` (dedupnet/codec/settings.py), by name,
    #: that this config has no field of its own for; absent: the setting's default.
    settings: dict[str, object] = field(default_factory=dict)

    def setting(self, name: str) -> object:
        """Setting ``name`` as every daemon of this run gets it."""
        return getattr(self, name) if hasattr(self, name) else self.settings.get(name, SETTINGS[name].default)


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
    #: CPU seconds of every process of the run, by role, from seeding to the end, and
    #: per request the web answered (dedupnet/harness/simcpu.py).
    cpu_s: dict[str, float] = field(default_factory=dict)
    cpu_total_s: float | None = None
    cpu_ms_per_page: dict[str, float] = field(default_factory=dict)
    cpu_total_ms_per_page: float | None = None
    #: MEMORY USAGE of the run's keys at the end, by role ("center", "host") and key family.
    redis_bytes: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Bytes of messages written, by the sender's role and the message's kind.
    bytes_by_kind: dict[str, int] = field(default_factory=dict)
    center_redis_bytes_per_url: float | None = None  # per admitted URL
    #: Every command the run's Redis served (its commandstats: the daemons' polling as well
    #: as their work, and the harness's own reads), per second of the run and per request
    #: the web answered, and the busiest commands by name.
    redis_commands: int | None = None
    redis_commands_per_s: float | None = None
    redis_commands_per_page: float | None = None
    redis_commands_top: dict[str, int] = field(default_factory=dict)
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
    #: How the load fell on the web, from its request log (dedupnet/harness/weblog.py).
    pages_per_network: dict[str, int] = field(default_factory=dict)
    busiest_network_share: float | None = None
    pages_per_host_max: int = 0
    pages_per_host_mean: float | None = None
    sites_fetched: int = 0
    sites_multi_host: int = 0
    max_hosts_per_site_1s: int = 0
    longest_pause: float = 0.0
    #: Pacing against politeness (dedupnet/harness/pacing.py): the politeness bound, the
    #: crawl's time over it, fetch slots in use, sites with work and being fetched, and
    #: the sites whose last page came late against their own bound.
    politeness_bound: float | None = None
    bound_largest_site: float | None = None
    bound_slots: float | None = None
    bound_ratio: float | None = None
    fetch_slots: int = 0
    slots_in_use_web: float | None = None
    slots_in_use_crawlers: float | None = None
    slots_over_time: list = field(default_factory=list)
    sites_over_time: list[dict] = field(default_factory=list)
    late_sites: int | None = None
    worst_site_ratio: float | None = None
    worst_site_excess: float | None = None
    worst_site: str | None = None
    requests_made: int = 0
    requests_allowed: int = 0
    rate_share: float | None = None

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
        counts[f"net:{network_of_host(ip)}"] += len(urls)
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0][4:])))


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(math.ceil(p / 100 * len(ordered))) - 1)]


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
    (dedupnet/adapters/net/tls.py make_certs) for a ``--secure`` run, removed afterwards; None
    (nothing made) otherwise."""
    import contextlib
    import tempfile

    if not cfg.secure:
        return contextlib.nullcontext(None)

    @contextlib.contextmanager
    def made():
        from dedupnet.adapters.net.tls import make_certs

        with tempfile.TemporaryDirectory(prefix="dedupnet-sim-certs-") as d:
            make_certs(d, range(1, cfg.networks + 1), days=2)
            yield d
    return made()


def web_spec(cfg: SimConfig) -> WebSpec:
    """The synthetic web of a run (both runners build the same one)."""
    return WebSpec.shaped(cfg.web_shape, pages=cfg.pages, sites=cfg.sites, seed=cfg.seed)


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


def check_routing(cfg: SimConfig) -> None:
    """ValueError for a routing or weights the run's centers would refuse (before anything starts)."""
    from center_host.config import ROUTINGS
    from dedupnet.codec.homes import parse_weights

    if cfg.routing is not None and cfg.routing not in ROUTINGS:
        raise ValueError(f"--routing must be one of {', '.join(ROUTINGS)}, not {cfg.routing!r}")
    if cfg.mode == "owner" and (cfg.routing or cfg.weights):
        raise ValueError("--routing and --weight are the centers' (exact mode); owner has no centers")
    if cfg.mode == "paper" and cfg.routing not in (None, "broadcast"):
        raise ValueError("paper mode always broadcasts: --routing home is exact mode's")
    weights = parse_weights(list(cfg.weights))
    outside = sorted(set(weights) - set(range(1, cfg.networks + 1)))
    if outside:
        raise ValueError(f"--weight for network(s) {outside}: the networks are 1..{cfg.networks}")
    bad = [n for n, w in weights.items() if not 0 < w < float("inf")]
    if bad:
        raise ValueError(f"--weight of network(s) {bad}: a weight is a positive number")


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


def progress_line(sample: dict) -> str:
    """One line of live progress from a timeline sample."""
    t, fetched = sample["t"], sample["pages_fetched"]
    return (f"  t={t:6.1f}s  pages {fetched:>6} ({fetched / max(t, 1e-9):6.0f}/s)  "
            f"URL_pool {sample.get('URL_pool', 0):>5}  task_pool {sample.get('task_pool', 0):>5}  "
            f"in flight {sample.get('reduce_pools', 0):>3}  fetching {sample.get('web_in_flight', 0):>3}  "
            f"duplicates {sample['duplicates']}")


def build_report(cfg, web: SyntheticWeb, seeds, system, server, observer: Observer, timeline, wall, timed_out, *,
            plan: dict[str, list[str]] | None = None, center_cpu: float | None = None,
            memory: dict[str, dict[str, int]] | None = None, killed: frozenset[str] = frozenset(),
            gone: frozenset[str] = frozenset(),
            windows: list[dict] | None = None, web_t0: float | None = None,
            cpu_roles: dict[str, float | None] | None = None) -> Report:
    """A run's report; ``web_t0``: its start on trio's clock, for the pacing figures (None: the bound only);
    ``cpu_roles``: CPU seconds of the run's processes by role (:func:`~dedupnet.harness.simcpu.cpu_figures`)."""
    reach = web.reachable_detail(seeds, max_depth=cfg.max_depth)
    expected = reach.fetched
    k = cfg.windows
    violations, refetched = check_extracted(web, seeds, reach.depth, cfg.max_depth, killed=killed, gone=gone, windows=k)
    fetched = set(web.answer_counts)
    lost = sorted(expected - fetched)
    daemons = [*getattr(system, "centers", {}).values(), *system.hosts.values()]
    frames, stages, kind_bytes = _frames(daemons, getattr(system, "centers", {}).values())
    calls = _command_calls(server)
    trips = sum(s.round_trips for s in getattr(system, "stores", {}).values()) if hasattr(system, "stores") else 0
    found = sum(d.counters.get("links_pushed") for d in system.hosts.values())
    per_host = {ip: sum(v for k, v in h.counters.snapshot().items() if k.startswith("pages_fetched"))
                for ip, h in sorted(system.hosts.items())}
    per_net = {f"net:{n}": c.counters.get("urls_admitted") for n, c in sorted(getattr(system, "centers", {}).items())}
    requests = sum(web.answer_counts.values())
    crawler_requests = sum(v for h in system.hosts.values() for k, v in h.counters.snapshot().items()
                           if k.startswith("pages_fetched{") and k != 'pages_fetched{status="503"}')
    stores = [h.pools.store for h in system.hosts.values() if hasattr(h, "pools")]
    admitted = sum(per_net.values())
    frames_sent = sum(frames.values())
    extra = dict(
        seeds_per_network=seeds_per_network(plan or {}), urls_admitted=admitted,
        set_fill=_set_fill(getattr(system, "centers", {}).values()),
        frames_per_url=round(frames_sent / found, 3) if found else None,
        bytes_per_url=round(sum(wire_bytes(d.counters) for d in daemons) / len(expected), 1) if expected else None,
        **_tls_figures(daemons), max_url_pool=max((s.get("URL_pool", 0) for s in timeline), default=0),
        **_center_costs(center_cpu, memory or {}, admitted),
        bytes_by_kind=dict(kind_bytes), **cpu_figures(cpu_roles or {}, requests),
    )
    extra["bad_input"] = _refused(daemons)
    extra.update(_commands(calls, wall, requests))
    extra.update(load_spread(web.request_log, networks=cfg.networks, hosts=system.hosts))
    extra.update(pacing(cfg, web, seeds, reach, wall, web_t0, timeline) if k == 1 else {})
    if windows:
        extra.update(windows=windows, min_refetch_gap=refetch_gap(web), window_counts=window_counts(web, expected, k))
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
        bytes_on_wire=sum(wire_bytes(d.counters) for d in daemons),
        redis_round_trips=trips, urls_found=found, urls_per_s=round(found / wall, 1) if wall else 0.0,
        pages_per_s=round(requests / wall, 1) if wall else 0.0,
        latency_p50=percentile(observer.latencies, 50), latency_p99=percentile(observer.latencies, 99),
        sets_concluded_incomplete=sum(d.counters.total("concluded_incomplete") for d in daemons),
        per_host_pages=per_host, per_network_admitted=per_net, timeline=timeline, **extra,
    )


def _command_calls(server) -> dict[str, int]:
    """Calls of each command the run's Redis served (its commandstats), by name."""
    stats = merged_info(server, "commandstats")
    return {k.removeprefix("cmdstat_"): v.get("calls", 0) for k, v in stats.items() if isinstance(v, dict)}


def _commands(calls: dict[str, int], wall: float, requests: int) -> dict:
    """Commands the run's Redis served, in all, per second and per page, the ten busiest
    by name, and its look-ups (SMISMEMBER, HMGET)."""
    total = sum(calls.values())
    return dict(redis_lookups=calls.get("smismember", 0) + calls.get("hmget", 0), redis_commands=total,
                redis_commands_per_s=round(total / wall, 1) if wall else None,
                redis_commands_per_page=round(total / requests, 2) if requests else None,
                redis_commands_top=dict(sorted(calls.items(), key=lambda kv: -kv[1])[:10]))


def _set_fill(centers) -> float | None:
    """URLs per URL_set the centers received from their hosts (flag=1 frames)."""
    frames = sum(c.counters.get("frames_in", stage="lan", flag="1") for c in centers)
    urls = sum(c.counters.get("urls_in", stage="lan") for c in centers)
    return round(urls / frames, 1) if frames else None


def _frames(daemons, centers) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """Every daemon's frames sent, by kind, and received, by stage; bytes sent by the
    sender's role and the message's kind."""
    frames: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    kind_bytes: Counter[str] = Counter()
    center_ids = {id(c) for c in centers}
    for d in daemons:
        role = "center" if id(d) in center_ids else "host"
        for key, value in d.counters.snapshot().items():
            if key.startswith("frames_sent{"):
                frames[key[len("frames_sent{kind=\""):-2]] += value
            elif key.startswith("sent_kind_bytes{"):
                kind_bytes[role + " " + key[len('sent_kind_bytes{kind="'):-2]] += value
            elif key.startswith("frames_in{"):
                stages[key[len("frames_in"):]] += value
    return frames, stages, kind_bytes


def _tls_figures(daemons) -> dict[str, int]:
    """What TLS cost (``--secure``): its bytes, its handshakes, and the messages inside."""
    return {field: sum(d.counters.get(counter) for d in daemons) for field, counter in (
        ("tls_bytes_on_wire", "tls_sent_bytes"), ("tls_handshakes", "tls_handshakes"),
        ("tls_payload_bytes", "tls_payload_sent_bytes"))}


def _center_costs(center_cpu: float | None, memory: dict[str, dict[str, int]], admitted: int) -> dict:
    """The centers' CPU and the Redis memory, in all and per admitted URL."""
    center_bytes = sum(memory.get("center", {}).values())
    host_bytes = sum(memory.get("host", {}).values())
    return dict(
        center_cpu_s=None if center_cpu is None else round(center_cpu, 3),
        center_cpu_ms_per_1k_urls=round(center_cpu * 1e6 / admitted, 1) if center_cpu is not None and admitted else None,
        redis_bytes=memory,
        center_redis_bytes_per_url=round(center_bytes / admitted, 1) if memory and admitted else None,
        host_redis_bytes_per_url=round(host_bytes / admitted, 1) if memory and admitted else None,
    )


def _refused(daemons) -> dict[str, int]:
    """What the daemons refused or slowed down, by counter series."""
    bad: Counter[str] = Counter()
    for d in daemons:
        for key, value in d.counters.snapshot().items():
            if key.startswith(("bad_input{", "handshake_failed{", "rejected{", "throttled{")):
                bad[key] += value
    return dict(bad)


def _kind_text(r: Report) -> str:
    """Where the bytes per distinct URL go: by the sender's role and the message kind."""
    n = max(r.reachable_urls, 1)
    return ", ".join(f"{k} {v / n:.1f}" for k, v in sorted(r.bytes_by_kind.items(), key=lambda kv: -kv[1])) or "n/a"


def wire_bytes(counters) -> int:
    """Bytes a daemon put on the wire: its messages' bytes (``sent_bytes``), except that
    those sent inside TLS count as the TLS records that carried them (``tls_sent_bytes``:
    TCP bytes under the SSLStream, handshakes included; dedupnet/adapters/net/tls.py CountingStream)."""
    return counters.get("sent_bytes") - counters.get("tls_payload_sent_bytes") + counters.get("tls_sent_bytes")


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
    routing = f", routing {c['routing']}" if c.get("routing") else ""
    routing += f" (weights {' '.join(c['weights'])})" if c.get("weights") else ""
    latency = f", each answer after {c['web_latency']:g} s" if c.get("web_latency") else ""
    return f"""dedupnet sim: {c['networks']} networks x {c['hosts']} hosts, {c['mode']} mode{routing}, scenario {c['scenario']}, seed {c['seed']}
  web: {c['pages']:,} pages over {c['sites']} sites{latency}; {r.reachable_pages:,} pages reachable from {seeds} seeds ({r.reachable_urls:,} URLs to request)
  run: {status} after {r.wall_time:.1f} s; each host's crawler fetches {c.get('concurrency', '?')} at once
{runs_with(c)}

  URLs fetched                {r.fetched_urls:>10,} of {r.reachable_urls:,}
  duplicate fetches           {r.duplicate_fetches:>10,}
  lost URLs                   {r.lost_urls:>10,}{'   e.g. ' + r.lost_examples[0] if r.lost_examples else ''}{_bloom_note(c)}
  unexpected fetches          {r.unexpected_fetches:>10,}   (not in the ground truth, e.g. robots-disallowed)
  extracted -> crawled once   {r.invariant_violations:>10,} violations{'   e.g. ' + r.invariant_examples[0] if r.invariant_examples else ''}
  re-fetched after a kill     {r.refetched_after_kill:>10,}   (pages a killed host had in progress, fetched again by itself; or a gone host had not reported, by another)
  requests to the web         {r.requests:>10,}   {r.pages_per_s:,.0f}/s
  links found (URL_pool)      {r.urls_found:>10,}   {r.urls_per_s:,.0f}/s
  frames sent                 {sum(r.frames.values()):>10,}   {frames}
  bytes on the wire           {r.bytes_on_wire:>10,}   {r.bytes_on_wire / max(r.urls_found, 1):,.0f} per URL found, {_num(r.bytes_per_url, ',.0f')} per distinct URL{_tls_text(r)}
  bytes per distinct URL      {_kind_text(r)}
  frames per URL found        {_num(r.frames_per_url, '>10.3f')}
  URLs per URL_set (fill)     {_num(r.set_fill, '>10.1f')}   (flag=1 frames at the centers)
  max URL_pool backlog        {r.max_url_pool:>10,}
  Redis look-ups              {r.redis_lookups:>10,}   (SMISMEMBER/HMGET commands)
  Redis commands              {_num(r.redis_commands, '>10,')}   {_num(r.redis_commands_per_s, ',.0f')}/s, {_num(r.redis_commands_per_page, '.1f')} per page
  discovery -> admission      p50 / p99: {lat}
  sets concluded incomplete   {r.sets_concluded_incomplete:>10,}
  center CPU                  {cpu}{cpu_lines(r)}
  Redis bytes per admitted URL  center {_num(r.center_redis_bytes_per_url, '.1f')}, hosts {_num(r.host_redis_bytes_per_url, '.1f')}   ({r.urls_admitted:,} URLs admitted)
    by key family             {memory}
  pages per host              {hosts}
    max / mean                {r.pages_per_host_max:>10,} / {_num(r.pages_per_host_mean, ',.0f')}{_ratio(r.pages_per_host_max, r.pages_per_host_mean)}   (from the web's log)
  pages per network           {' '.join(f'{k}:{v}' for k, v in r.pages_per_network.items()) or 'n/a'}
    busiest network's share   {_num(r.busiest_network_share, '>10.3f')}   (1/L = {1 / max(c['networks'], 1):.3f})
  sites fetched by >1 host    {r.sites_multi_host:>10,} of {r.sites_fetched:,} sites fetched
  most hosts on a site in 1 s {r.max_hosts_per_site_1s:>10,}
  longest pause between pages {r.longest_pause:>10.1f} s
  URLs admitted per network   {' '.join(f'{k}:{v}' for k, v in r.per_network_admitted.items()) or 'n/a'}
  seeds per network           {' '.join(f'{k}:{v}' for k, v in r.seeds_per_network.items()) or 'n/a'}""" + \
        pacing_lines(r) + _windows_lines(r) + _faults_lines(r) + _links_text(r) + _auth_lines(r) + "\n" + verdict(r)[0]



def _ratio(a: float | None, b: float | None) -> str:
    return f" ({a / b:.2f}x)" if a is not None and b else ""


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
    """LAN keys and what was refused, if either applies."""
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
        read = [s for s in report.timeline if key in s]  # the samples that read the pools
        b.plot([s["t"] for s in read], [s[key] for s in read], label=key)
    b.set_xlabel("seconds")
    b.set_ylabel("entries")
    b.legend()
    c = report.config
    fig.suptitle(f"dedupnet sim: {c['networks']}x{c['hosts']}, {c['mode']} mode, {c['scenario']}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

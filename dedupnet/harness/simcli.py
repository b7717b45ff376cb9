"""The ``dedupnet sim`` command: its flags, and which runner (in one process:
dedupnet/harness/sim.py; as processes: dedupnet/harness/simproc.py; repeated under faults:
dedupnet/harness/chaos.py; or the topology sweep) a run goes to."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile

import trio

from center_host.config import PARTITION_POLICIES, ROUTINGS
from dedupnet.codec.settings import CENTER, LOCAL, SETTINGS, SIM

from dedupnet.harness.faults import FAULTS, Fault, parse_fault
from dedupnet.harness.report import (
    SCENARIOS, MODES, Report, SimConfig, check_routing, check_secure, check_windows, format_report, format_comparison,
    plot, seed_count, web_spec,
)
from dedupnet.harness.simranges import DEFAULT_TIMEOUT, check_ranges
from dedupnet.harness.verdict import verdict
from dedupnet.harness.webgraph import SHAPES
from dedupnet.harness.sim import INPROCESS_FAULTS, faults_refused, simulate


#: Seconds a site of the real web takes to answer, about: what makes a host's fetch
#: slots worth counting (at 0 a request holds its slot for no time at all).
REAL_WEB_LATENCY = 0.1


def deployed() -> dict:
    """What ``dedupnet sim`` runs with unless told otherwise: the deployed daemons'
    politeness and durable acknowledgements, from where they are declared
    (dedupnet/codec/settings.py), and a web of the real one's shape and latency."""
    return {**{name: SETTINGS[name].default for name in ("concurrency", "per_site_concurrency", "per_site_delay",
                                                          "durable_acks")},
            "web_shape": "real", "web_latency": REAL_WEB_LATENCY}


def light() -> dict:
    """``--light``: the same fields as SimConfig() itself has them, the workload of the
    tests and of every table measured before ``dedupnet sim`` ran as deployed."""
    return {name: getattr(SimConfig, name) for name in deployed()}


def config_from(args) -> SimConfig:
    """The run's config from ``dedupnet sim``'s flags: what they give, else the deployed
    values (``--light``: the light ones)."""
    own = dict(networks=args.networks, hosts=args.hosts, pages=args.pages, sites=args.sites, mode=args.mode,
               seed=args.seed, scenario=args.scenario, timeout=_given(args.timeout, DEFAULT_TIMEOUT), seeds=args.seeds,
               max_depth=args.max_depth, set_size=args.set_size,
               partition_policy=args.partition_policy, answer_timeout=args.answer_timeout,
               send_delay=args.send_delay, faults=tuple(args.faults or ()),
               finish_url_filter=args.finish_url_filter, bloom_capacity=args.bloom_capacity,
               bloom_error_rate=args.bloom_error_rate,
               lan_key=getattr(args, "lan_key", False), secure=args.secure, lan_tls=args.lan_tls,
               recrawl_after=args.recrawl_after, windows=args.windows, routing=args.routing,
               weights=tuple(args.weights or ()))
    # The flags of add_daemon_settings: into the config's field of that name, else its settings.
    given = {s.name: getattr(args, s.name) for s in _daemon_settings()
             if s.name not in own and getattr(args, s.name, None) is not None}
    for name in ("concurrency", "durable_acks", "web_shape", "web_latency"):
        if getattr(args, name, None) is not None:
            given[name] = getattr(args, name)
    fields = {f.name for f in dataclasses.fields(SimConfig)}
    preset = light() if getattr(args, "light", False) else deployed()
    return SimConfig(**own, **{**preset, **{k: v for k, v in given.items() if k in fields}},
                     settings={k: v for k, v in given.items() if k not in fields})


def _given(value, default):
    return default if value is None else value


def run(args) -> int:
    """``dedupnet sim``: one run, or ``--compare`` (the three modes on the same seed),
    or ``--chaos N`` (N random fault schedules, dedupnet/harness/chaos.py)."""
    if args.sweep:
        return _sweep(args)
    if args.baseline or args.baseline_python:
        from dedupnet.harness.simside import run_side_by_side

        return run_side_by_side(args)

    base = config_from(args)
    try:
        check_ranges(args, base)
        _check_flags(args, base)
        base = _with_timeout(args, base)
    except ValueError as e:
        print(f"dedupnet sim: {e}", file=sys.stderr)
        return 2
    if args.chaos is not None:
        from dedupnet.harness.chaos import run_chaos

        return run_chaos(base, args)
    refused = _refused_in_one_run(args, base)
    if refused is not None:
        print(f"dedupnet sim: {refused}", file=sys.stderr)
        return 2
    reports = _run_modes(args, base)
    if reports is None:
        return 2
    _write_outputs(args, reports)
    return 0 if all(verdict(r)[1] for r in reports) else 1


def _with_timeout(args, cfg: SimConfig) -> SimConfig:
    """``--timeout`` not given: 120 s, or twice the run's politeness bound and a minute
    more when that is longer (a polite crawl of a big site is long, not stuck)."""
    if args.timeout is not None:
        return cfg
    from dedupnet.harness.pacing import politeness_bound
    from dedupnet.harness.web import SyntheticWeb

    web = SyntheticWeb(web_spec(cfg), port=0)
    fetched = web.reachable_detail(web.seeds(seed_count(cfg)), max_depth=cfg.max_depth).fetched
    bound = politeness_bound(cfg, web, fetched)["bound"]
    return dataclasses.replace(cfg, timeout=max(DEFAULT_TIMEOUT, round(2 * bound + 60)))


def _check_flags(args, base: SimConfig) -> None:
    """ValueError for flags that cannot go together, whatever kind of run."""
    check_secure(base)
    check_windows(base)
    check_routing(base)
    if base.recrawl_after is not None and (args.processes or args.compare or args.chaos is not None):
        raise ValueError("--recrawl-after runs in one process, one mode (not with --processes, --compare "
                         "or --chaos)")
    if any(f.kind == "host-gone-disk-lost" for f in base.faults) and not 0 < base.setting("reissue_after") < base.timeout:
        raise ValueError(f"host-gone-disk-lost waits for the center to re-issue the host's tasks: give --reissue-after "
                         f"S with 0 < S < --timeout ({base.timeout:g}), e.g. --reissue-after 10")
    if args.compare and base.secure:
        raise ValueError("--secure cannot be combined with --compare (its owner baseline has no centers)")


def _refused_in_one_run(args, base: SimConfig) -> str | None:
    """Why a single run (or --compare) cannot do what the flags ask, or None."""
    if args.http and args.processes:
        return ("--http serves the one-process simulation's page; with --processes every center is its "
                "own process: give it --http there (dedupnet center --http HOST:PORT)")
    if base.faults and not args.processes and any(f.kind not in INPROCESS_FAULTS for f in base.faults):
        return faults_refused(base.faults)
    return None


def _run_modes(args, base: SimConfig) -> list[Report] | None:
    """Every mode asked for (one, or the three of --compare) on the run's server, each
    report printed as it comes; None if a mode was refused (said on stderr)."""
    modes = MODES if args.compare else (args.mode,)
    reports = []
    if args.redis_cluster:
        from dedupnet.harness.embedded_cluster import EmbeddedCluster

        server_cm = EmbeddedCluster(args.redis_cluster)
    else:
        server_cm = contextlib.nullcontext(args.redis) if args.redis else _embedded(base)
    with server_cm as url:
        for mode in modes:
            cfg = dataclasses.replace(base, mode=mode)
            print(f"-- {cfg.networks} networks x {cfg.hosts} hosts, {mode} mode, {cfg.scenario}: crawling "
                  f"{cfg.pages:,} pages over {cfg.sites} sites", flush=True)
            report = _run_one(args, cfg, url)
            if report is None:
                return None
            reports.append(report)
            print(format_report(report), flush=True)
    return reports


def _run_one(args, cfg: SimConfig, url: str) -> Report | None:
    if args.processes:
        from dedupnet.harness.simproc import simulate_processes

        try:
            return trio.run(simulate_processes, cfg, url)
        except ValueError as e:  # a mode or scenario processes mode does not run
            print(f"dedupnet sim: {e}", file=sys.stderr)
            return None
    during = None
    if args.http:  # the live status page of the whole system (dedupnet/adapters/monitor/status_page.py)
        from dedupnet.harness.simpage import serve_sim_status

        during = serve_sim_status(args.http, {k: getattr(cfg, k) for k in (
            "networks", "hosts", "pages", "sites", "mode", "scenario", "seed")})
    return trio.run(lambda: simulate(cfg, url, during=during))


def _write_outputs(args, reports: list[Report]) -> None:
    """The comparison table (--compare), the JSON (--json) and the plot (--plot)."""
    import orjson

    if args.compare:
        print("\n" + format_comparison(reports))
    if args.json:
        data = [r.to_json() for r in reports] if args.compare else reports[0].to_json()
        with open(args.json, "wb") as f:
            f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    if args.plot:
        plot(reports[0], args.plot)


@contextlib.contextmanager
def _embedded(cfg: SimConfig):
    """The simulation's own server: in memory only, or with ``--durable-acks`` keeping
    its AOF in a temporary directory, fsynced as a daemon's server does then, so that
    the daemons' waits for the disk are real."""
    from dedupnet.adapters.storage.embedded import EmbeddedRedis

    if not cfg.durable_acks:
        with EmbeddedRedis() as url:
            yield url
        return
    with tempfile.TemporaryDirectory(prefix="dedupnet-sim-aof-") as data_dir:
        with EmbeddedRedis(persistent=True, data_dir=data_dir, config={"appendfsync": "always"}) as url:
            yield url


def _sweep(args) -> int:
    """``dedupnet sim --sweep 2x2,3x3``: :mod:`dedupnet.harness.sweep` with this command's web,
    seed and --processes (one simulation process per layout)."""
    from dedupnet.harness import sweep

    argv = ["--layouts", args.sweep, "--pages", str(args.pages), "--sites", str(args.sites), "--seed", str(args.seed),
            "--seeds", str(args.seeds), "--mode", args.mode]
    if args.timeout is not None:
        argv += ["--timeout", str(args.timeout)]
    if args.routing:
        argv += ["--routing", args.routing]
    for w in args.weights or ():
        argv += ["--weight", w]
    if args.web_latency is not None:
        argv += ["--web-latency", str(args.web_latency)]
    if args.concurrency is not None:
        argv += ["--concurrency", str(args.concurrency)]
    if args.processes:
        argv.append("--processes")
    more = (["--durable-acks"] if args.durable_acks else []) + (["--web-shape", args.web_shape] if args.web_shape
                                                                 else [])
    if more:  # the sweep runs the light workload on both checkouts; these go to this one's runs on top
        argv.append("--sim-args=" + " ".join(more))
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


def _seconds(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def _positive(text: str) -> int:
    import argparse

    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def _http_arg(text: str) -> tuple[str, int]:
    """``PORT`` (on 127.0.0.1) or ``HOST:PORT``."""
    import argparse

    from dedupnet.service.config import endpoint

    try:
        return ("127.0.0.1", int(text)) if text.isdigit() else endpoint(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _daemon_settings():
    return [s for s in SETTINGS.values() if SIM in s.roles and s.option]


def add_daemon_settings(p) -> None:
    """A flag for every daemon setting marked ``sim`` (dedupnet/codec/settings.py) that
    ``dedupnet sim`` has no flag of its own for: each daemon of the run gets the value."""
    known = {a.dest for a in p._actions}
    for s in _daemon_settings():
        if s.name not in known:
            who = " and ".join(name for role, name in ((CENTER, "center"), (LOCAL, "host")) if role in s.roles)
            default = deployed().get(s.name, getattr(SimConfig, s.name, s.default))
            shown = "" if default is None or s.type in (bool, list) else f" (default {default})"
            p.add_argument(s.option, help=f"every {who}'s: {s.help}{shown}", **s.argparse_options())


def add_arguments(p) -> None:
    """The flags of ``dedupnet sim``, in the order --help lists them."""
    _add_layout_arguments(p)
    _add_protocol_arguments(p)
    _add_fault_arguments(p)
    _add_run_arguments(p)
    _add_security_arguments(p)
    _add_feature_arguments(p)
    _add_output_arguments(p)
    _add_store_arguments(p)
    add_daemon_settings(p)


def _add_layout_arguments(p) -> None:
    """The system and the web it crawls."""
    p.add_argument("--networks", type=int, default=3, help="networks (LANs), each with a center (default 3)")
    p.add_argument("--hosts", type=int, default=3, help="crawler hosts per network (default 3)")
    p.add_argument("--pages", type=int, default=3000, help="pages of the synthetic web (default 3000)")
    p.add_argument("--sites", type=int, default=300,
                   help="sites of the synthetic web (default 300: a real web has many, mostly small)")
    p.add_argument("--mode", choices=MODES, default="exact",
                   help="exact: no URL admitted twice; paper: the paper's look-ups only; owner: the hash-partitioned "
                        "baseline (default: exact)")
    p.add_argument("--seed", type=int, default=1, help="seeds the web and the run (default 1)")
    p.add_argument("--seeds", type=int, default=6, help="seed URLs the crawl starts from (default 6)")
    p.add_argument("--max-depth", type=int, help="links deeper than this are not followed")
    p.add_argument("--web-shape", choices=tuple(SHAPES),
                   help="real (default): 85%% of links stay on their site, site sizes by Zipf's law; classic: 30%% "
                        "of links leave their site, sizes mildly skewed (the web of the older tables)")
    p.add_argument("--light", action="store_true",
                   help="the light workload of the tests and the older tables: 16 requests per host, 4 per site, no "
                        "per-site delay, no durable acks, the classic web (flags given win)")


def _add_protocol_arguments(p) -> None:
    p.add_argument("--set-size", type=int, default=SimConfig.set_size, help="URLs per URL_set (default %(default)s)")
    p.add_argument("--routing", choices=ROUTINGS,
                   help="exact mode, every center's: home decides each URL at its site's home network alone, "
                        "broadcast asks every network (default: the center's, home)")
    p.add_argument("--weight", dest="weights", action="append", metavar="NET=W",
                   help="a network's share of the sites under --routing home (default 1; repeat), every center's")
    p.add_argument("--web-latency", type=_seconds, metavar="S",
                   help="seconds every answer of the synthetic web waits, as on the real web: the crawlers are "
                        f"then bound by --concurrency over it, not by this machine (default {REAL_WEB_LATENCY:g}; "
                        "--light: 0)")
    p.add_argument("--concurrency", type=_positive, metavar="N",
                   help=f"requests each host's crawler keeps in flight (default {deployed()['concurrency']}, the "
                        f"daemons')")
    p.add_argument("--partition-policy", choices=PARTITION_POLICIES,
                   help="a late answer or a network that is down: wait (exact mode's default) or admit")
    p.add_argument("--answer-timeout", type=float, default=SimConfig.answer_timeout, metavar="S",
                   help="seconds before a set is asked again (default %(default)s)")


def _add_fault_arguments(p) -> None:
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


def _add_run_arguments(p) -> None:
    """How long, how many runs, in how many processes."""
    p.add_argument("--timeout", type=float, metavar="S",
                   help=f"give up (and say so) after this many seconds (default {DEFAULT_TIMEOUT:g}, or twice the "
                        "run's politeness bound and 60 more when that is longer)")
    p.add_argument("--compare", action="store_true", help="run exact, paper and owner on the same seed, side by side")
    p.add_argument("--processes", action="store_true",
                   help="every center and host as its own OS process (dedupnet center / dedupnet local)")
    p.add_argument("--sweep", metavar="LAYOUTS",
                   help="run these layouts (e.g. 2x2,3x3,5x5,8x4; --networks/--hosts ignored) one after the other "
                        "and print one table (see bench/bench_topology.py for all its options)")
    p.add_argument("--baseline-python", metavar="PYTHON",
                   help="also run with another checkout's interpreter (its .venv/bin/python), side by side: each "
                        "layout of --sweep, or else this run, every figure with its ratio")
    p.add_argument("--baseline", metavar="CHECKOUT",
                   help="this run side by side with another checkout's code (e.g. a git worktree of main; this "
                        "interpreter unless --baseline-python), each run its own process, every figure with its ratio "
                        "(dedupnet/harness/simside.py)")
    p.add_argument("--rounds", type=int, default=1, metavar="N",
                   help="with --baseline: runs per side, alternated; the medians are shown (default %(default)s)")


def _add_security_arguments(p) -> None:
    p.add_argument("--lan-key", action="store_true",
                   help="HMAC tags on the LANs: a random LAN key is made for the run")
    p.add_argument("--secure", action="store_true",
                   help="both protections together: TLS with client certificates between the centers "
                        "(certificates made for the run) and HMAC tags on the LANs (a random LAN key, as --lan-key); "
                        "the report counts TLS records on the wire")
    p.add_argument("--lan-tls", action="store_true", help="with --secure: TLS between hosts and their center too")


def _add_feature_arguments(p) -> None:
    """Optional parts of the product switched on for the run: the live status page,
    re-crawling by age, acknowledgements only once on disk."""
    p.add_argument("--http", type=_http_arg, metavar="[HOST:]PORT",
                   help="serve a live status page of the whole system (every center, the hosts) at "
                        "http://HOST:PORT/ while it runs (HOST default 127.0.0.1; docs/STATUS.md)")
    p.add_argument("--recrawl-after", type=float, metavar="S",
                   help="re-crawl by age: every daemon's recrawl_after; with --windows K the seeds "
                        "are offered again, each time once the last window is quiescent and 1.25 x S seconds old, and "
                        "the report checks that every URL was fetched exactly K times")
    p.add_argument("--windows", type=int, default=1, metavar="K",
                   help="with --recrawl-after: crawl K windows (default %(default)s)")
    acks = p.add_mutually_exclusive_group()
    acks.add_argument("--durable-acks", action="store_const", const=True, dest="durable_acks",
                      help="every daemon sends what depends on a write only once Redis has fsynced it (WAITAOF), as "
                           "deployed daemons do; the embedded server keeps an AOF in a temporary directory (default)")
    acks.add_argument("--no-durable-acks", action="store_const", const=False, dest="durable_acks",
                      help="the daemons send without waiting for the disk, and the embedded server keeps nothing on it")


def _add_output_arguments(p) -> None:
    p.add_argument("--json", metavar="FILE", help="write the report as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw the run over time (needs matplotlib)")


def _add_store_arguments(p) -> None:
    """Where the run's keys are, and how the hosts keep finish_URL."""
    p.add_argument("--redis", metavar="URL", help="use this Redis server instead of an embedded one "
                                                   "(redis+cluster://HOST:PORT: a Redis Cluster)")
    p.add_argument("--redis-cluster", type=int, metavar="N",
                   help="run on an embedded Redis Cluster of N masters (dedupnet/harness/embedded_cluster.py)")
    p.add_argument("--finish-url-filter", choices=("exact", "bloom"), default="exact",
                   help="the hosts' finish_URL: exact (default) or bloom; each false positive is a URL never crawled")
    p.add_argument("--bloom-capacity", type=int, default=SimConfig.bloom_capacity, metavar="N",
                   help="URLs the hosts' Bloom filters are sized for (default %(default)s)")
    p.add_argument("--bloom-error-rate", type=float, default=SimConfig.bloom_error_rate, metavar="P",
                   help="their false-positive rate at capacity (default %(default)s)")

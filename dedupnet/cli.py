"""The single ``dedupnet`` command: ``dedupnet <subcommand> --help`` for each."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from dedupnet import __version__
from dedupnet.codec.errors import DedupnetError, SettingsError
from dedupnet.service.config import FOREIGN_LOOKUPS, MODES, PARTITION_POLICIES, ROUTINGS, Settings, load_settings

CENTER, LOCAL, PUSH, DEMO = "center", "local", "push", "demo"  # PUSH: push and finish
DAEMONS = (CENTER, LOCAL)


def flag(*names: str, roles, required=(), **options) -> tuple:
    """One flag of the Settings: ``roles`` are the subcommands that take it, ``required``
    those that cannot run without it (it may come from the config file instead, so
    argparse is not told: the help marks it). ``help`` may be a dict role -> text."""
    return names, frozenset(roles), frozenset(required), options


# Every flag that maps to a Settings field of the same name (a TOML file may set any of
# them). What each role reads is in dedupnet/service/daemons.py: a flag is listed for a
# role only if that role uses it.
SETTINGS_FLAGS = [
    flag("--network", type=int, metavar="N", roles=DAEMONS, required=(CENTER,),
         help={CENTER: "this LAN's network id (1..65535), part of every number",
               LOCAL: "this LAN's network id (1..65535); required unless --center auto (the center's answer "
                      "gives it)"}),
    flag("--listen", metavar="HOST:PORT", roles=DAEMONS, required=(CENTER,),
         help={CENTER: "where hosts and peer centers connect (0.0.0.0:PORT: every address)",
               LOCAL: "where dedupnet status reaches this host (default: its IP, any free port)"}),
    flag("--center", metavar="HOST:PORT|auto", roles=(LOCAL,), required=(LOCAL,),
         help="this host's center; auto: find it by a UDP broadcast on the LAN (then --network is optional)"),
    flag("--config", metavar="FILE", roles=(*DAEMONS, PUSH, DEMO),
         help="TOML settings file: key = value, the keys named like the flags (set_size for --set-size); "
              "flags override it, relative paths in it are relative to its directory"),
    flag("--redis", dest="redis_url", metavar="URL", roles=(*DAEMONS, PUSH, DEMO),
         help="Redis to use (redis://HOST:PORT/DB, or redis+cluster://HOST:PORT,... for a Redis Cluster); "
              "without it an embedded server is started"),
    flag("--prefix", metavar="P", roles=(*DAEMONS, PUSH, DEMO),
         help={CENTER: "key prefix of the center's pools (default: dedupnet:centerN)",
               LOCAL: "key prefix of the host's pools (default: dedupnet:host:IP)",
               PUSH: "key prefix of the host's pools (default: dedupnet:host:IP, from --ip)",
               DEMO: "key prefix of the demo's pools (removed when it ends)"}),
    flag("--ip", roles=DAEMONS,
         help={CENTER: "this center's IP, its identity (default: the --listen address, or the address that "
                       "reaches the first peer)",
               LOCAL: "this host's IP, its identity (default: the address that reaches the center)"}),
    flag("--lan", metavar="CIDR", roles=DAEMONS, help="this LAN (default: the interface's address and netmask)"),
    flag("--mode", choices=MODES, roles=(*DAEMONS, PUSH, DEMO),
         help="exact: no URL admitted twice; paper: the paper's look-ups only (every daemon the same)"),
    flag("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], roles=(*DAEMONS, PUSH, DEMO),
         help="the least important log lines shown; DEBUG also prints the traceback of a fatal error"),
    flag("--data-dir", metavar="DIR", roles=DAEMONS,
         help={CENTER: "where the embedded Redis keeps its append-only file (default: dedupnet-data/centerN)",
               LOCAL: "where the embedded Redis keeps its append-only file (default: dedupnet-data/host-IP)"}),
    flag("--http", metavar="HOST:PORT", roles=DAEMONS,
         help="serve the live status page at http://HOST:PORT/, its JSON at /status.json (docs/STATUS.md) and "
              "Prometheus metrics at /metrics (default: off)"),
    flag("--metrics", metavar="HOST:PORT", roles=DAEMONS, help="the old name of --http"),
    flag("--peer", dest="peers", action="append", metavar="NET,HOST:PORT,CIDR", roles=(CENTER,),
         help="another network's center and its LAN (repeat per peer)"),
    # the protocol
    flag("--set-size", type=int, metavar="N", roles=(LOCAL, DEMO), help="URLs per URL_set"),
    flag("--set-linger", type=float, metavar="S", roles=(LOCAL,),
         help="seconds a host waits for a URL_set to fill before sending it part full"),
    flag("--answer-timeout", type=float, metavar="S", roles=(CENTER,),
         help="seconds to wait for the answers to a look-up before asking again"),
    flag("--max-resends", type=int, metavar="N", roles=(CENTER,),
         help="re-sends to silent members before concluding without them (admit) or slowing down (wait)"),
    flag("--partition-policy", choices=PARTITION_POLICIES, roles=(CENTER,),
         help="a silent member or a network that is down: wait (exact mode's default) or admit without it "
              "after --max-resends (paper mode's default)"),
    flag("--foreign-lookup", choices=FOREIGN_LOOKUPS, roles=(CENTER,),
         help="who answers another network's set: center (exact mode's default: its admitted record) or lan "
              "(every LAN host, the paper's §2.4; paper mode's default)"),
    flag("--local-lookup", choices=FOREIGN_LOOKUPS, roles=(CENTER,),
         help="who answers this LAN's own sets: center (exact mode's default: its admitted record, no LAN "
              "broadcast) or lan (every other LAN host, the paper's §2.3; paper mode's default)"),
    flag("--routing", choices=ROUTINGS, roles=(CENTER,),
         help="exact mode: home (default) decides each URL at its site's home network alone; broadcast asks "
              "every peer network (every center needs the same)"),
    flag("--weight", dest="weights", action="append", metavar="NET=W", roles=(CENTER,),
         help="a network's share of the sites under --routing home (default 1; repeat; every center needs "
              "the same)"),
    flag("--previous-weights", dest="previous_weights", action="append", metavar="NET=W,...", roles=(CENTER,),
         help="after a change of the map: the map before it, every network with its weight (repeat for "
              "older ones); a site that moved is admitted by its new home only once its earlier home has "
              "said it did not admit the URL (every center needs the same)"),
    flag("--gather-linger", type=float, metavar="S", roles=(CENTER,),
         help="exact mode: seconds this LAN's sets gather into one for the peer networks while one of its own "
              "is out with them (0: each alone)"),
    flag("--heartbeat-interval", type=float, metavar="S", roles=DAEMONS,
         help={CENTER: "seconds between two heartbeats to this center's hosts and peer centers",
               LOCAL: "seconds between two heartbeats to the center"}),
    flag("--heartbeat-timeout", type=float, metavar="S", roles=DAEMONS,
         help={CENTER: "seconds of silence after which a host or a peer network counts as gone",
               LOCAL: "seconds of silence after which the host gives its center up and dials again (the same "
                      "on the LAN's center and hosts)"}),
    flag("--stop-grace", type=float, metavar="S", roles=(LOCAL,),
         help="on SIGTERM: seconds the pages already requested get to finish (then they are handed back and "
              "fetched again elsewhere)"),
    flag("--stop-timeout", type=float, metavar="S", roles=(LOCAL,),
         help="on SIGTERM: seconds the whole stop (pages, URL_pool, the hand-back) may take before the host exits "
              "with what is left in its Redis"),
    flag("--no-durable-acks", dest="durable_acks", action="store_const", const=False, roles=DAEMONS,
         help="send acknowledgements, answers and tasks without waiting for their writes to be fsynced to "
              "Redis' AOF (default: wait, when the Redis has its AOF on)"),
    flag("--no-compress", dest="compress", action="store_const", const=False, roles=DAEMONS,
         help="never offer or accept zstd-compressed bodies (default: negotiated per connection)"),
    flag("--recrawl-after", type=float, metavar="S", roles=(*DAEMONS, PUSH),
         help="re-crawl by age: a URL counts as crawled for S seconds only, then it is admitted again when "
              "found again, never twice within S anywhere (default: never again; every daemon the same)"),
    flag("--recrawl-site", dest="recrawl_sites", action="append", metavar="GLOB=S", roles=(*DAEMONS, PUSH),
         help="the age of the sites matching GLOB (S seconds or 'never'); the first match wins over "
              "--recrawl-after (repeat)"),
    flag("--finish-url-filter", choices=["exact", "bloom"], roles=(LOCAL, PUSH),
         help="a host's finish_URL: exact, or bloom (less memory; each false positive is a URL never crawled)"),
    flag("--bloom-capacity", type=int, metavar="N", roles=(LOCAL, PUSH), help="URLs the Bloom filter is sized for"),
    flag("--bloom-error-rate", type=float, metavar="P", roles=(LOCAL, PUSH),
         help="the Bloom filter's false-positive rate at its capacity"),
    # LAN discovery
    flag("--discovery-port", type=int, metavar="N", roles=DAEMONS,
         help={CENTER: "UDP port on which this center answers hosts started with --center auto",
               LOCAL: "UDP port on which --center auto asks for the center"}),
    flag("--no-discovery", dest="discovery", action="store_const", const=False, roles=(CENTER,),
         help="do not answer LAN discovery (hosts then need --center HOST:PORT)"),
    flag("--discovery-address", metavar="IPV4", roles=(LOCAL,),
         help="with --center auto: send the query here (default: each interface's broadcast address)"),
    flag("--discovery-timeout", type=float, metavar="S", roles=(LOCAL,),
         help="with --center auto: give up after this long without an answer"),
    # security
    flag("--tls-cert", metavar="PEM", roles=DAEMONS,
         help={CENTER: "this center's TLS certificate (dedupnet certs makes them); with --tls-key and --tls-ca "
                       "the center requires TLS of its peers",
               LOCAL: "this host's own TLS certificate, presented to its center (optional with --lan-tls)"}),
    flag("--tls-key", metavar="PEM", roles=DAEMONS, help="the private key of --tls-cert"),
    flag("--tls-ca", metavar="PEM", roles=DAEMONS,
         help="the deployment's CA certificate: the other side's certificate must be signed by it"),
    flag("--lan-tls", dest="lan_tls", action="store_const", const=True, roles=DAEMONS,
         help={CENTER: "require TLS of this LAN's hosts too", LOCAL: "speak TLS to the center (needs --tls-ca)"}),
    flag("--insecure", action="store_const", const=True, roles=DAEMONS,
         help="listen beyond loopback without authentication (no LAN key; peer centers without TLS), logged as "
              "a WARNING every minute; without it such a daemon refuses to start (docs/DEPLOY.md)"),
    flag("--lan-key-file", metavar="FILE", roles=DAEMONS,
         help="LAN key file ('KEY_ID HEX_SECRET [send]' lines): every message between a center and its hosts "
              "carries an HMAC tag (re-read every --key-poll-interval: rotate keys without a restart)"),
    flag("--peer-key-file", metavar="FILE", roles=(CENTER,),
         help="key file of the peer centers, as --lan-key-file"),
    flag("--key-poll-interval", type=float, metavar="S", roles=DAEMONS,
         help="seconds between two reads of the key files"),
    flag("--max-connections-per-source", type=int, metavar="N", roles=(CENTER,),
         help="connections one source address may hold open"),
    flag("--max-bytes-per-s", type=float, metavar="B", roles=(CENTER,),
         help="bytes a second read from one connection, above which reading it is throttled"),
    flag("--max-messages-per-s", type=float, metavar="N", roles=(CENTER,),
         help="messages a second read from one connection, above which reading it is throttled"),
    # the crawler
    flag("--no-crawl", dest="crawl", action="store_const", const=False, roles=(LOCAL,),
         help="run the protocol only: no crawler (URLs come from dedupnet push or a Scrapy spider)"),
    flag("--frontier", metavar="[HOST:]PORT", roles=(LOCAL,),
         help="serve the URLFrontier API (gRPC) here for crawlers in any language, on 127.0.0.1 unless HOST "
              "says otherwise (needs pip install 'dedupnet[frontier]'; docs/FRONTIER.md)"),
    flag("--seed", dest="seeds", action="append", metavar="URL", roles=(LOCAL,),
         help="a seed URL, sent through the protocol like any found link (repeat)"),
    flag("--seeds-file", metavar="FILE", roles=(LOCAL,), help="seed URLs, one per line"),
    flag("--concurrency", type=int, metavar="N", roles=(LOCAL,), help="requests at once, all sites together"),
    flag("--per-site", dest="per_site_concurrency", type=int, metavar="N", roles=(LOCAL,),
         help="requests at once to one site"),
    flag("--per-site-delay", type=float, metavar="S", roles=(LOCAL,), help="seconds between two requests to one site"),
    flag("--max-depth", type=int, metavar="N", roles=(LOCAL,),
         help="do not follow the links of pages this deep (seeds: 0; default: no limit)"),
    flag("--allow-domain", dest="allowed_domains", action="append", metavar="DOMAIN", roles=(LOCAL,),
         help="only follow links to this host and its subdomains (repeat; default: any)"),
    flag("--ignore-robots", dest="respect_robots", action="store_const", const=False, roles=(LOCAL,),
         help="fetch what robots.txt forbids (default: robots.txt is honoured)"),
    flag("--store", dest="store_dir", metavar="DIR", roles=(LOCAL,),
         help="write fetched pages as JSON lines into DIR (default: not kept)"),
    flag("--recrawl-interval", type=float, metavar="S", roles=(LOCAL,),
         help="offer the seeds again this often, through the protocol (with --recrawl-after; default: off)"),
]

GROUPS = {  # where a flag is listed in --help, by its first name; the rest go under "settings"
    "crawler": {"--no-crawl", "--frontier", "--seed", "--seeds-file", "--concurrency", "--per-site", "--per-site-delay",
                "--max-depth", "--allow-domain", "--ignore-robots", "--store", "--recrawl-interval"},
    "TLS, keys and limits": {"--insecure", "--tls-cert", "--tls-key", "--tls-ca", "--lan-tls", "--lan-key-file",
                             "--peer-key-file",
                             "--key-poll-interval", "--max-connections-per-source", "--max-bytes-per-s",
                             "--max-messages-per-s"},
}


def _default_text(dest: str, options: dict) -> str:
    """`` (default: X)`` from the Settings field itself, so --help cannot drift from it."""
    field = Settings.__dataclass_fields__.get(dest)
    if field is None or options.get("action") == "store_const" or field.default in (None, dataclasses.MISSING):
        return ""
    value = field.default
    if isinstance(value, float) and value.is_integer() and value >= 1000:
        value = int(value)
    return f" (default: {value})"


def add_settings_flags(parser: argparse.ArgumentParser, role: str) -> None:
    """The Settings flags of one role, grouped, the required ones first and marked."""
    groups = {"required": parser.add_argument_group(
        "required (a flag, or the same key in the --config file)")}
    for names, roles, required, options in SETTINGS_FLAGS:
        if role not in roles:
            continue
        options = dict(options)
        text = options["help"][role] if isinstance(options["help"], dict) else options["help"]
        dest = options.get("dest") or names[0].lstrip("-").replace("-", "_")
        name = "required" if role in required else next((g for g, members in GROUPS.items() if names[0] in members),
                                                         "settings")
        if name not in groups:
            groups[name] = parser.add_argument_group(name)
        options["help"] = text + _default_text(dest, options)
        groups[name].add_argument(*names, **options)


class Parser(argparse.ArgumentParser):
    """A mistake on the command line is one line naming it, not the usage first."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="dedupnet", description="Redis-based URL de-duplication across crawler hosts and networks.")
    parser.add_argument("--version", action="version", version=f"dedupnet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)

    center = sub.add_parser(CENTER, help="run a network's center daemon",
                            description="The center of one LAN: de-dups among its hosts (§2.3) and with the "
                                        "other networks (§2.4), and hands admitted URLs to its hosts.")
    add_settings_flags(center, CENTER)
    local = sub.add_parser(LOCAL, help="run a local host daemon (with its crawler)",
                           description="A local host: de-dups its URL_pool (§2.2), answers its center's "
                                       "requests (§2.3), receives tasks into its task_pool and crawls them.")
    add_settings_flags(local, LOCAL)

    status = sub.add_parser("status", help="show a running daemon's pools, members, sets and counters",
                            description="Asks a running center or host for its pools, members, sets in flight "
                                        "and counters.")
    status.add_argument("address", metavar="HOST:PORT", nargs="?",
                        help="the daemon's --listen address (default: listen in --config)")
    status.add_argument("--config", metavar="FILE",
                        help="the daemon's own config file: its listen address and lan_key_file are used")
    status.add_argument("--key-file", metavar="FILE", action="append",
                        help="the daemon's --lan-key-file, if it has one (default: lan_key_file in --config); "
                             "with --cluster repeat it for each network's key")
    status.add_argument("--cluster", action="store_true",
                        help="ask every center reachable from this one and their hosts, and say whether the crawl "
                             "is complete, in progress or stuck and why (exit status 0, 3 or 4)")
    status.add_argument("--json", action="store_true", help="print the raw JSON")

    reassign = sub.add_parser("reassign", help="hand a gone host's tasks to the live hosts of its LAN",
                              description="Tells a host's center that the host is gone: the tasks the center "
                                          "assigned to it and it has not acknowledged, and with --data-dir the "
                                          "tasks of its own task_pool, go to the LAN's live hosts, and the "
                                          "center no longer counts it as a host. Refused while the host is "
                                          "connected (docs/DEPLOY.md).")
    reassign.add_argument("address", metavar="HOST:PORT", nargs="?",
                          help="the host's center (its --listen address; default: listen in --config)")
    reassign.add_argument("--host", required=True, metavar="IP", help="the gone host's IP (required)")
    reassign.add_argument("--config", metavar="FILE",
                          help="the center's own config file: its listen address and lan_key_file are used")
    reassign.add_argument("--key-file", metavar="FILE",
                          help="the center's --lan-key-file, if it has one (default: lan_key_file in --config)")
    reassign.add_argument("--data-dir", metavar="DIR",
                          help="the gone host's --data-dir: its task_pool moves too (its daemon must be stopped)")
    reassign.add_argument("--redis", dest="redis_url", metavar="URL",
                          help="the gone host's Redis, if it used --redis (instead of --data-dir)")
    reassign.add_argument("--prefix", metavar="P",
                          help="the gone host's key prefix (default: dedupnet:host:IP)")
    reassign.add_argument("--leave-task-pool", action="store_true",
                          help="without --data-dir: move only what the center holds; the host's own task_pool "
                               "stays in its Redis, crawled only if it starts again")

    for name, what in (("push", "put URLs into a host's URL_pool (what a crawler does)"),
                       ("finish", "record URLs as crawled in a host's finish_URL")):
        p = sub.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".")
        p.add_argument("urls", nargs="*", metavar="URL", help="the URLs (or --file)")
        p.add_argument("--file", metavar="FILE", help="read URLs from FILE, one per line ('-' for stdin)")
        p.add_argument("--ip", help="the host's IP (gives the default prefix)")
        p.add_argument("--data-dir", metavar="DIR",
                       help="the host daemon's --data-dir: its embedded Redis is used (or give --redis)")
        add_settings_flags(p, PUSH)

    certs = sub.add_parser("certs", help="make a CA, TLS certificates and LAN keys for a deployment",
                           description="Makes a small CA (reused if DIR has one) and a certificate and key per "
                                       "network's center, naming its network id (URI dedupnet://network/N), "
                                       "optionally per host, and a LAN key file per network (kept if DIR has "
                                       "one), and prints the settings to use (docs/DEPLOY.md).")
    from dedupnet.adapters.tls import add_arguments as add_certs_arguments

    add_certs_arguments(certs)

    # Listed here for --help; its flags are dedupnet.harness.web's own, handed over in main().
    sub.add_parser("web", add_help=False, help="serve a synthetic web on loopback (for crawls and tests)")

    demo = sub.add_parser("demo", help="run local de-dup (paper §2.2) on an embedded Redis and report",
                          description="Runs what a local host does before anything leaves it (§2.2) on a "
                                      "crawler-like stream of URLs, and reports each step.")
    demo.add_argument("--urls", type=int, default=50_000, help="URLs the simulated crawler finds (default: 50000)")
    demo.add_argument("--seed", type=int, default=1, help="seed of the URL stream (default: 1)")
    add_settings_flags(demo, DEMO)

    sim = sub.add_parser("sim", help="a whole multi-network crawl on this machine, with a report",
                         description="Stands up a synthetic web, an embedded Redis, L centers and LxH hosts "
                                     "with crawlers on loopback, crawls to the end and reports duplicates, "
                                     "lost URLs and costs (docs/SIMULATION.md).")
    sim.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="ERROR",
                     help="the daemons' least important log lines shown (default: ERROR)")
    from dedupnet.harness.simcli import add_arguments

    add_arguments(sim)

    simulate = sub.add_parser(
        "simulate", help="seeded fault schedules against the protocol's cores in virtual time, each checked",
        description="Runs the centers' and hosts' protocol cores (the daemons' own) with modelled networks, "
                    "Redis and crawlers, on one seeded scheduler and a virtual clock: the same seed gives the same "
                    "run (its trace hash is printed). Each run draws a schedule of faults (process, store, network "
                    "and membership) and is checked: no URL admitted twice (exact mode), every reachable URL "
                    "fetched, quiescence after the last fault, no set held for ever. A failing run prints the "
                    "command that replays it and the story of the URLs concerned.")
    from dedupnet.harness.dst.cli import add_arguments as add_simulate_arguments

    add_simulate_arguments(simulate)

    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["web"]:
        from dedupnet.harness import web

        return web.main(argv[1:], Parser)
    args = build_parser().parse_args(argv)
    debug = getattr(args, "log_level", None) == "DEBUG"
    try:
        return _run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader of the output went away (`| head`): nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001 - every failure ends in one line (and the traceback on DEBUG)
        return fatal(f"dedupnet {args.command}", exc, debug=debug or logging.getLogger().isEnabledFor(logging.DEBUG))


def _run(args: argparse.Namespace) -> int:
    if args.command == "sim":  # its own flags; the daemons' settings do not apply
        from dedupnet.harness import simcli

        logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return simcli.run(args)
    if args.command == "simulate":
        from dedupnet.harness.dst import cli as dst_cli

        return dst_cli.run(args)
    if args.command == "certs":
        from dedupnet.adapters.tls import certs_main

        return certs_main(args)
    if args.command == "status":  # its own output says what went wrong; the transport's warnings would repeat it
        from dedupnet.service.daemons import print_status, status_target

        logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

        address, key_files = status_target(args.address, args.config, args.key_file)
        if args.cluster:
            from dedupnet.service.daemons import print_cluster_status

            return print_cluster_status(address, as_json=args.json, key_files=key_files)
        return print_status(address, as_json=args.json, key_file=key_files[0] if key_files else None)
    if args.command == "reassign":
        from dedupnet.service.daemons import status_target
        from dedupnet.service.reassign import run_reassign

        logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        address, key_files = status_target(args.address, args.config, [args.key_file] if args.key_file else None)
        return run_reassign(address, args.host, key_file=key_files[0] if key_files else None, data_dir=args.data_dir,
                            redis_url=args.redis_url, prefix=args.prefix, leave_task_pool=args.leave_task_pool)
    fields = set(Settings.__dataclass_fields__)
    overrides = {k: v for k, v in vars(args).items() if k in fields}
    settings = load_settings(getattr(args, "config", None), **overrides)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        from dedupnet.harness import demo

        return demo.run(settings, urls=args.urls, seed=args.seed)
    if args.command in ("push", "finish"):
        from dedupnet.service.daemons import push_or_finish

        return push_or_finish(settings, args.command, _read_urls(args), data_dir=args.data_dir)
    from dedupnet.service.daemons import run_center, run_local

    return run_center(settings) if args.command == CENTER else run_local(settings)


def fatal(who: str, exc: BaseException, *, debug: bool = False) -> int:
    """Report what stopped a command in one line on stderr, and return its exit status:
    2 for a setting that cannot work (a bad value or file, an address in use: the
    operator must change something), 1 for anything else. The traceback only with
    ``debug``: an operator needs the cause, a developer the place."""
    leaves = _leaves(exc)
    settings = [e for e in leaves if isinstance(e, SettingsError)]
    if not settings and exc in leaves and isinstance(exc, (ValueError, OSError)):
        settings = [exc]  # raised before anything ran: the settings, a file they name
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    if settings:
        print(f"{who}: {settings[0]}", file=sys.stderr)
        return 2
    first = next((e for e in leaves if isinstance(e, DedupnetError)), leaves[0])
    what = str(first) if isinstance(first, DedupnetError) else f"{type(first).__name__}: {first}"
    hint = "" if debug or isinstance(first, DedupnetError) else " (--log-level DEBUG shows where)"
    print(f"{who}: {what}{hint}", file=sys.stderr)
    return 1


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, as trio's nurseries raise them."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _read_urls(args: argparse.Namespace) -> list[str]:
    urls = list(args.urls)
    if args.file:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        urls += [line.strip() for line in text.splitlines() if line.strip()]
    return urls


if __name__ == "__main__":
    sys.exit(main())

"""The single ``dedupnet`` command: ``dedupnet <subcommand> --help`` for each."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from dedupnet import __version__
from dedupnet.service.config import FOREIGN_LOOKUPS, MODES, PARTITION_POLICIES, ROUTINGS, Settings, endpoint, load_settings
from dedupnet.codec.errors import DiscoveryError

NOT_YET: dict[str, str] = {}

# Flags shared by every subcommand that touches a Redis or the protocol; each maps to
# the Settings field of the same name (a TOML file may set any of them).
COMMON = [
    (("--config",), dict(metavar="FILE", help="TOML settings file (flags override it)")),
    (("--redis",), dict(dest="redis_url", metavar="URL", help="Redis URL; without it an embedded server is started")),
    (("--prefix",), dict(help="key prefix of the pools on the Redis server")),
    (("--set-size",), dict(type=int, help="URLs per URL_set (default 1000)")),
    (("--set-linger",), dict(type=float, metavar="S", help="seconds a host waits for a URL_set to fill (default 0.5)")),
    (("--mode",), dict(choices=MODES, help="exact (default): no URL admitted twice; paper: the paper's look-ups only")),
    (("--log-level",), dict(choices=["DEBUG", "INFO", "WARNING", "ERROR"])),
    (("--finish-url-filter",), dict(choices=["exact", "bloom"],
                                    help="a host's finish_URL: exact (default) or bloom (less memory; each "
                                         "false positive is a URL never crawled)")),
    (("--bloom-capacity",), dict(type=int, metavar="N", help="URLs the Bloom filter is sized for (default 10,000,000)")),
    (("--bloom-error-rate",), dict(type=float, metavar="P", help="its false-positive rate at capacity (default 0.001)")),
    (("--recrawl-after",), dict(type=float, metavar="S",
                                help="re-crawl by age: a URL counts as crawled for S seconds only, then it is "
                                     "admitted again when found again, never twice within S anywhere (default: "
                                     "never again; every daemon needs the same value)")),
    (("--recrawl-site",), dict(dest="recrawl_sites", action="append", metavar="GLOB=S",
                               help="the age of the sites matching GLOB (S seconds or 'never'); the first match "
                                    "wins over --recrawl-after (repeat)")),
]
DAEMON = [
    (("--network",), dict(type=int, help="this LAN's network id (1..65535)")),
    (("--ip",), dict(help="this daemon's IP, its identity (default: from the network interface)")),
    (("--lan",), dict(metavar="CIDR", help="this LAN (default: the interface's address and netmask)")),
    (("--listen",), dict(metavar="HOST:PORT", help="address to listen on")),
    (("--data-dir",), dict(metavar="DIR", help="where the embedded Redis keeps its append-only file")),
    (("--http",), dict(metavar="HOST:PORT", help="serve the live status page at http://HOST:PORT/ (its JSON at "
                                                 "/status.json, docs/STATUS.md) and Prometheus metrics at /metrics")),
    (("--metrics",), dict(metavar="HOST:PORT", help="the old name of --http")),
    (("--answer-timeout",), dict(type=float, metavar="S", help="seconds to wait for answers (default 2)")),
    (("--max-resends",), dict(type=int, help="re-sends to silent members before concluding ('admit') or slowing down ('wait') (default 2)")),
    (("--foreign-lookup",), dict(choices=FOREIGN_LOOKUPS,
                                 help="who answers another network's set: center (exact mode's default: its "
                                      "admitted record) or lan (every LAN host, the paper's §2.4; paper mode)")),
    (("--local-lookup",), dict(choices=FOREIGN_LOOKUPS,
                               help="who answers this LAN's own sets: center (exact mode's default: its "
                                    "admitted record, no LAN broadcast) or lan (every other LAN host, the "
                                    "paper's §2.3; paper mode)")),
    (("--gather-linger",), dict(type=float, metavar="S",
                                help="exact mode, a center: seconds its LAN's sets gather into one for the peer "
                                     "networks while one of its own is out with them (default 0.5; 0: each alone)")),
    (("--partition-policy",), dict(choices=PARTITION_POLICIES,
                                   help="a silent member or a network that is down: wait (exact mode's default) "
                                        "or admit without it after --max-resends (paper mode's default)")),
    (("--heartbeat-interval",), dict(type=float, metavar="S")),
    (("--heartbeat-timeout",), dict(type=float, metavar="S", help="silence after which a member leaves, and a host gives its center up and dials again (default 5)")),
    (("--no-compress",), dict(dest="compress", action="store_const", const=False,
                              help="never offer or accept zstd-compressed bodies (default: negotiated per connection)")),
    (("--lan-key-file",), dict(metavar="FILE", help="LAN key file ('KEY_ID HEX_SECRET [send]' lines): every message "
                                                    "between a center and its hosts carries an HMAC tag (re-read "
                                                    "every second: rotate keys without a restart)")),
    (("--key-poll-interval",), dict(type=float, metavar="S", help="seconds between two reads of the key files (default 1)")),
    (("--tls-cert",), dict(metavar="PEM", help="this daemon's TLS certificate (dedupnet certs makes them); "
                                               "a center with --tls-cert/--tls-key/--tls-ca requires TLS of its peers")),
    (("--tls-key",), dict(metavar="PEM", help="the key of --tls-cert")),
    (("--tls-ca",), dict(metavar="PEM", help="the deployment's CA certificate: peers' certificates must be signed by it")),
    (("--discovery-port",), dict(type=int, metavar="N", help="UDP port of LAN discovery: a center answers "
                                                             "there, a host with --center auto asks there (default 7799)")),
    (("--lan-tls",), dict(dest="lan_tls", action="store_const", const=True,
                          help="TLS on the LAN too: a center requires it of its hosts; a host uses it to its center")),
]


def _parent(flags) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    for names, options in flags:
        parser.add_argument(*names, **options)
    return parser


def build_parser() -> argparse.ArgumentParser:
    common, daemon = _parent(COMMON), _parent(DAEMON)
    parser = argparse.ArgumentParser(
        prog="dedupnet",
        description="Redis-based URL de-duplication across crawler hosts and networks.",
    )
    parser.add_argument("--version", action="version", version=f"dedupnet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)

    center = sub.add_parser("center", parents=[common, daemon], help="run a network's center host daemon",
                            description="The center of one LAN: de-dups among its hosts (§2.3) and with the "
                                        "other networks (§2.4), and hands admitted URLs to its hosts.")
    center.add_argument("--peer", dest="peers", action="append", metavar="NET,HOST:PORT,CIDR",
                        help="another network's center and its LAN (repeat per peer)")
    center.add_argument("--peer-key-file", metavar="FILE", help="key file of the peer centers (as --lan-key-file)")
    center.add_argument("--routing", choices=ROUTINGS,
                        help="exact mode: home (default) decides each URL at its site's home network alone; "
                             "broadcast asks every peer network (every center needs the same)")
    center.add_argument("--weight", dest="weights", action="append", metavar="NET=W",
                        help="a network's share of the sites under --routing home (default 1; repeat; every "
                             "center needs the same)")
    center.add_argument("--no-discovery", dest="discovery", action="store_const", const=False,
                        help="do not answer LAN discovery (hosts then need --center HOST:PORT)")
    center.add_argument("--max-connections-per-source", type=int, metavar="N",
                        help="connections one source address may hold open (default 16)")
    center.add_argument("--max-bytes-per-s", type=float, metavar="B",
                        help="bytes a second read from one connection, above which it is throttled (default 32 MiB)")
    center.add_argument("--max-messages-per-s", type=float, metavar="N",
                        help="messages a second read from one connection, above which it is throttled (default 20000)")

    local = sub.add_parser("local", parents=[common, daemon], help="run a local host daemon",
                           description="A local host: de-dups its URL_pool (§2.2), answers its center's "
                                       "requests (§2.3) and receives tasks into its task_pool.")
    local.add_argument("--center", metavar="HOST:PORT|auto",
                       help="this host's center; auto: find it by a UDP broadcast on the LAN (then --network "
                            "is optional: the center's answer gives it)")
    local.add_argument("--discovery-address", metavar="IPV4",
                       help="with --center auto: send the query here (default: each interface's broadcast address)")
    local.add_argument("--discovery-timeout", type=float, metavar="S",
                       help="with --center auto: give up after this long without an answer (default 30)")
    crawl = local.add_argument_group("crawler")
    crawl.add_argument("--no-crawl", dest="crawl", action="store_const", const=False,
                       help="run the protocol only (URLs come from `dedupnet push`)")
    crawl.add_argument("--seed", dest="seeds", action="append", metavar="URL", help="a seed URL (repeat)")
    crawl.add_argument("--seeds-file", metavar="FILE", help="seed URLs, one per line")
    crawl.add_argument("--concurrency", type=int, help="requests at once, all sites (default 32)")
    crawl.add_argument("--per-site", dest="per_site_concurrency", type=int, help="requests at once to one site (default 2)")
    crawl.add_argument("--per-site-delay", type=float, metavar="S", help="seconds between requests to one site (default 0.25)")
    crawl.add_argument("--max-depth", type=int, help="do not follow links of pages this deep (seeds: 0)")
    crawl.add_argument("--allow-domain", dest="allowed_domains", action="append", metavar="DOMAIN",
                       help="only follow links to this host and its subdomains (repeat)")
    crawl.add_argument("--ignore-robots", dest="respect_robots", action="store_const", const=False)
    crawl.add_argument("--store", dest="store_dir", metavar="DIR", help="write fetched pages as JSON lines here")
    crawl.add_argument("--recrawl-interval", type=float, metavar="S", help="re-crawl the seeds this often (through the "
                       "protocol with --recrawl-after)")

    status = sub.add_parser("status", help="show a running daemon's pools, members, sets and counters")
    status.add_argument("address", metavar="HOST:PORT", help="the daemon's --listen address")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.add_argument("--key-file", metavar="FILE", help="the daemon's --lan-key-file, if it has one")

    for name, what in (("push", "put URLs into a host's URL_pool (what a crawler does)"),
                       ("finish", "record URLs as crawled in a host's finish_URL")):
        p = sub.add_parser(name, parents=[common], help=what)
        p.add_argument("urls", nargs="*", metavar="URL")
        p.add_argument("--file", metavar="FILE", help="read URLs from FILE, one per line ('-' for stdin)")
        p.add_argument("--ip", help="the host's IP (gives the default prefix)")
        p.add_argument("--data-dir", metavar="DIR", help="the host daemon's --data-dir (finds its embedded Redis)")

    certs = sub.add_parser("certs", help="make a CA and TLS certificates for a deployment's centers (and hosts)",
                           description="Makes a small CA (reused if DIR has one) and a certificate and key per "
                                       "network's center, naming its network id (URI dedupnet://network/N), "
                                       "optionally per host, and prints the settings to use (docs/DECISIONS.md).")
    from dedupnet.adapters.tls import add_arguments as add_certs_arguments

    add_certs_arguments(certs)

    # Listed here for --help; its flags are dedupnet.harness.web's own, handed over in main().
    sub.add_parser("web", add_help=False, help="serve a synthetic web on loopback (for crawls and tests)")

    demo = sub.add_parser("demo", parents=[common], help="run local de-dup (paper §2.2) on an embedded Redis and report")
    demo.add_argument("--urls", type=int, default=50_000, help="URLs the simulated crawler finds (default 50,000)")
    demo.add_argument("--seed", type=int, default=1)

    sim = sub.add_parser("sim", help="a whole multi-network crawl on this machine, with a report",
                         description="Stands up a synthetic web, an embedded Redis, L centers and LxH hosts "
                                     "with crawlers on loopback, crawls to the end and reports duplicates, "
                                     "lost URLs and costs.")
    sim.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="ERROR")
    from dedupnet.harness.simcli import add_arguments

    add_arguments(sim)

    for name, what in NOT_YET.items():
        sub.add_parser(name, parents=[common], help=f"{what} — not yet available")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["web"]:
        from dedupnet.harness import web

        return web.main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "sim":  # its own flags; the daemons' settings do not apply
        from dedupnet.harness import simcli

        logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return simcli.run(args)
    if args.command == "certs":
        from dedupnet.adapters.tls import certs_main

        return certs_main(args)
    fields = set(Settings.__dataclass_fields__)
    overrides = {k: v for k, v in vars(args).items() if k in fields}
    try:
        settings = load_settings(getattr(args, "config", None), **overrides)
    except (OSError, ValueError) as e:
        print(f"dedupnet: bad settings: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if args.command in NOT_YET:
        print(f"dedupnet {args.command}: {NOT_YET[args.command]} is not yet available.", file=sys.stderr)
        return 2
    try:
        if args.command == "demo":
            from dedupnet.harness import demo

            return demo.run(settings, urls=args.urls, seed=args.seed)
        if args.command == "status":
            from dedupnet.service.daemons import print_status

            return print_status(endpoint(args.address), as_json=args.json, key_file=args.key_file)
        if args.command in ("push", "finish"):
            from dedupnet.service.daemons import push_or_finish

            return push_or_finish(settings, args.command, _read_urls(args), data_dir=args.data_dir)
        from dedupnet.service.daemons import run_center, run_local

        return run_center(settings) if args.command == "center" else run_local(settings)
    except ValueError as e:  # settings that only the subcommand can check
        print(f"dedupnet {args.command}: {e}", file=sys.stderr)
        return 2
    except DiscoveryError as e:  # --center auto found no center (or several)
        print(f"dedupnet {args.command}: {e}", file=sys.stderr)
        return 1


def _read_urls(args: argparse.Namespace) -> list[str]:
    urls = list(args.urls)
    if args.file:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        urls += [line.strip() for line in text.splitlines() if line.strip()]
    return urls


if __name__ == "__main__":
    sys.exit(main())

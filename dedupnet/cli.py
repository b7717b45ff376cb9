"""The single ``dedupnet`` command: ``dedupnet <subcommand> --help`` for each."""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from dedupnet import __version__
from dedupnet.codec.errors import DedupnetError, SettingsError
from dedupnet.codec.settings import CENTER, DEMO, LOCAL, PUSH, RETIRED, SETTINGS, SIM, Setting, positive_int
from dedupnet.service.config import load_settings

#: The flag every command with settings takes besides the settings' own.
CONFIG_HELP = ("TOML settings file: key = value, the keys named like the flags (set_size for --set-size); flags "
               "override it, relative paths in it are relative to its directory")


def _default_text(setting: Setting) -> str:
    """`` (default: X)`` from the declaration itself, so --help cannot drift from it."""
    value = setting.default
    if setting.type in (bool, list) or value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and value >= 1000:
        value = int(value)
    return f" (default: {value})"


def add_settings_flags(parser: argparse.ArgumentParser, role: str) -> None:
    """The flags of the settings ``role`` reads (dedupnet/codec/settings.py), grouped,
    the required ones first and marked."""
    groups = {"required": parser.add_argument_group("required (a flag, or the same key in the --config file)")}

    def group(name: str):
        if name not in groups:
            groups[name] = parser.add_argument_group(name)
        return groups[name]

    group("settings").add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    for setting in SETTINGS.values():
        if role not in setting.roles or not setting.option:
            continue
        name = "required" if role in setting.required else setting.group
        group(name).add_argument(setting.option, help=setting.help_for(role) + _default_text(setting),
                                 **setting.argparse_options())
    add_retired_flags(parser, role)


def add_retired_flags(parser: argparse.ArgumentParser, role: str) -> None:
    """The flags of removed settings (dedupnet/codec/settings.py ``RETIRED``): not in
    ``--help``; given, they are one line saying why, and exit status 2."""
    for retired in RETIRED.values():
        if role in retired.roles:
            parser.add_argument(retired.option, action=RetiredFlag, nargs="?", help=argparse.SUPPRESS,
                                retired=retired)


class RetiredFlag(argparse.Action):
    """A removed setting's flag: given, one line saying why and exit status 2."""

    def __init__(self, *args, retired, **kwargs):  # noqa: ANN001, ANN002, ANN003 - argparse's signature
        super().__init__(*args, **kwargs)
        self.retired = retired

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001 - argparse's signature
        parser.error(self.retired.message())


class Parser(argparse.ArgumentParser):
    """A mistake on the command line is one line naming it, not the usage first."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):  # noqa: ANN001 - argparse's signature
        """An unknown flag is named with the subcommand's --help (and the flag it most
        resembles), not the top command's: argparse gathers the subcommands' leftovers
        and reports them as the top command's."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            sub = self._subcommand(getattr(parsed, "command", None)) or self
            flags = [f for f in extras if f.startswith("--")]
            close = difflib.get_close_matches(flags[0].split("=")[0], list(sub._option_string_actions), 1, 0.75) \
                if flags else []
            hint = f"; did you mean {close[0]}?" if close else ""
            sub.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed

    def _subcommand(self, name: str | None) -> argparse.ArgumentParser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and name in action.choices:
                return action.choices[name]
        return None


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="dedupnet", description="Redis-based URL de-duplication across crawler hosts and networks.")
    parser.add_argument("--version", action="version", version=f"dedupnet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    # In the order --help lists them.
    _add_daemon_commands(sub)
    _add_status_command(sub)
    _add_reassign_command(sub)
    _add_pool_commands(sub)
    _add_tool_commands(sub)
    _add_simulation_commands(sub)
    return parser


def _add_daemon_commands(sub: argparse._SubParsersAction) -> None:
    center = sub.add_parser(CENTER, help="run a network's center daemon",
                            description="The center of one LAN: de-dups among its hosts (§2.3) and with the "
                                        "other networks (§2.4), and hands admitted URLs to its hosts.")
    add_settings_flags(center, CENTER)
    local = sub.add_parser(LOCAL, help="run a local host daemon (with its crawler)",
                           description="A local host: de-dups its URL_pool (§2.2), answers its center's "
                                       "requests (§2.3), receives tasks into its task_pool and crawls them.")
    add_settings_flags(local, LOCAL)


def _add_status_command(sub: argparse._SubParsersAction) -> None:
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


def _add_reassign_command(sub: argparse._SubParsersAction) -> None:
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
                          help="without --data-dir (its disk is gone): move what the center holds, every URL it "
                               "gave the host and was not told is finished; if the host starts again it drops them")


def _add_pool_commands(sub: argparse._SubParsersAction) -> None:
    for name, what in (("push", "put URLs into a host's URL_pool (what a crawler does)"),
                       ("finish", "record URLs as crawled in a host's finish_URL")):
        p = sub.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".")
        p.add_argument("urls", nargs="*", metavar="URL", help="the URLs (or --file)")
        p.add_argument("--file", metavar="FILE", help="read URLs from FILE, one per line ('-' for stdin)")
        p.add_argument("--ip", help="the host's IP (gives the default prefix)")
        p.add_argument("--data-dir", metavar="DIR",
                       help="the host daemon's --data-dir: its embedded Redis is used (or give --redis)")
        add_settings_flags(p, PUSH)


def _add_tool_commands(sub: argparse._SubParsersAction) -> None:
    certs = sub.add_parser("certs", help="make a CA, TLS certificates and LAN keys for a deployment",
                           description="Makes a small CA (reused if DIR has one) and a certificate and key per "
                                       "network's center, naming its network id (URI dedupnet://network/N), "
                                       "optionally per host, and a LAN key file per network (kept if DIR has "
                                       "one), and prints the settings to use (docs/DEPLOY.md).")
    from dedupnet.adapters.net.tls import add_arguments as add_certs_arguments

    add_certs_arguments(certs)

    # Listed here for --help; its flags are dedupnet.harness.web's own, handed over in main().
    sub.add_parser("web", add_help=False, help="serve a synthetic web on loopback (for crawls and tests)")

    demo = sub.add_parser("demo", help="run local de-dup (paper §2.2) on an embedded Redis and report",
                          description="Runs what a local host does before anything leaves it (§2.2) on a "
                                      "crawler-like stream of URLs, and reports each step.")
    demo.add_argument("--urls", type=positive_int, default=50_000, metavar="N",
                      help="URLs the simulated crawler finds (default: 50000)")
    demo.add_argument("--seed", type=int, default=1, metavar="N", help="seed of the URL stream (default: 1)")
    add_settings_flags(demo, DEMO)


def _add_simulation_commands(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser("sim", help="a whole multi-network crawl on this machine, with a report",
                         description="Stands up a synthetic web, an embedded Redis, L centers and LxH hosts "
                                     "with crawlers on loopback, crawls to the end and reports duplicates, "
                                     "lost URLs and costs (docs/SIMULATION.md).")
    sim.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="ERROR",
                     help="the daemons' least important log lines shown (default: ERROR)")
    from dedupnet.harness.simcli import add_arguments

    add_arguments(sim)
    add_retired_flags(sim, SIM)

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

        setup_logging(args.log_level)
        return simcli.run(args)
    if args.command == "simulate":
        from dedupnet.harness.dst import cli as dst_cli

        return dst_cli.run(args)
    if args.command == "certs":
        from dedupnet.adapters.net.tls import certs_main

        return certs_main(args)
    if args.command == "status":  # its own output says what went wrong; the transport's warnings would repeat it
        from dedupnet.service.daemons import print_status, status_target

        setup_logging(logging.ERROR)

        address, key_files = status_target(args.address, args.config, args.key_file)
        if args.cluster:
            from dedupnet.service.daemons import print_cluster_status

            return print_cluster_status(address, as_json=args.json, key_files=key_files)
        return print_status(address, as_json=args.json, key_file=key_files[0] if key_files else None)
    if args.command == "reassign":
        from dedupnet.service.daemons import status_target
        from dedupnet.service.reassign import run_reassign

        setup_logging(logging.ERROR)
        address, key_files = status_target(args.address, args.config, [args.key_file] if args.key_file else None)
        return run_reassign(address, args.host, key_file=key_files[0] if key_files else None, data_dir=args.data_dir,
                            redis_url=args.redis_url, prefix=args.prefix, leave_task_pool=args.leave_task_pool)
    overrides = {k: v for k, v in vars(args).items() if k in SETTINGS}
    settings = load_settings(getattr(args, "config", None), **overrides)
    setup_logging(settings.log_level)
    if args.command == "demo":
        from dedupnet.harness import demo

        return demo.run(settings, urls=args.urls, seed=args.seed)
    if args.command in ("push", "finish"):
        from dedupnet.service.daemons import push_or_finish

        return push_or_finish(settings, args.command, _read_urls(args), data_dir=args.data_dir)
    from dedupnet.service.daemons import run_center, run_local

    return run_center(settings) if args.command == CENTER else run_local(settings)


#: Libraries that log a line per request at INFO: below DEBUG their lines are noise (the
#: crawler's counters and status page say what the requests did).
CHATTY_LIBRARIES = ("httpx", "httpcore", "hpack", "h2")


def setup_logging(level: int | str) -> None:
    """Every command's log lines: timestamped, on stderr, ``level`` and up; a library's
    per-request lines only with DEBUG."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        for name in CHATTY_LIBRARIES:
            logging.getLogger(name).setLevel(logging.WARNING)


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

"""The single ``dedupnet`` command: ``dedupnet <subcommand> --help`` for each."""

from __future__ import annotations

import argparse
import logging
import sys

from . import __version__
from .config import MODES, load_settings

NOT_YET = {
    "local": "the local host daemon (protocol issue #3, crawler issue #4)",
    "center": "the center host daemon (protocol issue #3)",
    "sim": "the multi-LAN simulation harness (issue #5)",
}


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", help="TOML settings file (flags override it)")
    common.add_argument("--redis", dest="redis_url", metavar="URL",
                        help="Redis URL; without it an embedded server is started and stopped")
    common.add_argument("--prefix", help="key prefix of this host's pools on the Redis server")
    common.add_argument("--set-size", type=int, help="URLs per URL_set (default 1000)")
    common.add_argument("--mode", choices=MODES, help="exact (default) or paper")
    common.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])

    parser = argparse.ArgumentParser(
        prog="dedupnet",
        description="Redis-based URL de-duplication across crawler hosts and networks.",
    )
    parser.add_argument("--version", action="version", version=f"dedupnet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)

    demo = sub.add_parser("demo", parents=[common], help="run local de-dup (paper §2.2) on an embedded Redis and report")
    demo.add_argument("--urls", type=int, default=50_000, help="URLs the simulated crawler finds (default 50,000)")
    demo.add_argument("--seed", type=int, default=1)

    for name, what in NOT_YET.items():
        sub.add_parser(name, parents=[common], help=f"{what} — not yet available")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(
            args.config, redis_url=args.redis_url, prefix=args.prefix, set_size=args.set_size,
            mode=args.mode, log_level=args.log_level,
        )
    except (OSError, ValueError) as e:
        print(f"dedupnet: bad settings: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if args.command in NOT_YET:
        print(f"dedupnet {args.command}: {NOT_YET[args.command]} is not yet available.", file=sys.stderr)
        return 2
    if args.command == "demo":
        from . import demo

        return demo.run(settings, urls=args.urls, seed=args.seed)
    raise AssertionError(args.command)  # argparse only lets known commands through


if __name__ == "__main__":
    sys.exit(main())

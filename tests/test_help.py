"""`dedupnet <command> --help` is what a new operator reads first: every flag says what it
does, each daemon lists only the flags it reads, required ones are marked, defaults
come from the settings themselves, and nothing cites the project's issue tracker."""

import argparse
import re
import subprocess
import sys

import pytest

from dedupnet.cli import RetiredFlag, build_parser
from dedupnet.harness.web import build_parser as web_parser
from dedupnet.service.config import Settings

ISSUE_REFERENCE = re.compile(r"#\d|\bissues?\b", re.IGNORECASE)


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    parsers = dict(sub.choices)
    parsers["web"] = web_parser()  # its flags are its own, handed over by main()
    return parsers


def flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags that do something (a removed setting's flag only says it was removed)."""
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, RetiredFlag))]


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_flag_says_what_it_does_and_cites_no_issue(name):
    parser = subcommands()[name]
    for action in flags(parser):
        where = f"dedupnet {name} {'/'.join(action.option_strings) or action.dest}"
        assert action.help and action.help != argparse.SUPPRESS and len(action.help) > 10, f"{where}: no help text"
        assert not ISSUE_REFERENCE.search(action.help), f"{where}: {action.help}"
    assert not ISSUE_REFERENCE.search(parser.format_help()), name


def test_the_command_list_cites_no_issue():
    assert not ISSUE_REFERENCE.search(build_parser().format_help())


def options(name: str) -> set[str]:
    return {o for a in flags(subcommands()[name]) for o in a.option_strings}


def test_each_daemon_lists_only_its_own_flags():
    center, local = options("center"), options("local")
    host_only = {"--center", "--set-size", "--seed", "--no-crawl", "--concurrency", "--ignore-robots",
                 "--discovery-address", "--discovery-timeout", "--finish-url-filter", "--bloom-capacity"}
    center_only = {"--peer", "--peer-key-file", "--no-discovery", "--answer-timeout",
                   "--max-resends", "--partition-policy", "--foreign-lookup", "--local-lookup",
                   "--max-connections-per-source", "--max-bytes-per-s", "--max-messages-per-s"}
    assert host_only <= local and not host_only & center
    assert center_only <= center and not center_only & local
    assert {"--network", "--listen", "--log-level", "--heartbeat-interval", "--lan-key-file", "--tls-ca"} <= center & local


def help_text(*argv: str) -> str:
    return subprocess.run([sys.executable, "-m", "dedupnet.cli", *argv, "--help"], capture_output=True, text=True,
                          check=True).stdout


def section(text: str, title: str) -> str:
    """The lines of one argument group of --help."""
    start = text.index("\n" + title)
    end = text.find("\n\n", start + 1)
    return text[start:end if end > 0 else None]


def test_required_flags_are_marked():
    center = section(help_text("center"), "required")
    assert "--network N" in center and "--listen HOST:PORT" in center and "--peer" not in center
    local = section(help_text("local"), "required")
    assert "--center HOST:PORT|auto" in local and "--seed" not in local


def test_defaults_are_shown_from_the_settings():
    parser = subcommands()["local"]
    for action in flags(parser):
        field = Settings.__dataclass_fields__.get(action.dest)
        if field is None or action.const is not None or field.default in (None, True, False):
            continue
        if not isinstance(field.default, (int, float, str)):
            continue
        assert "(default: " in action.help, f"{action.option_strings}: {action.help}"
    text = help_text("local")
    assert "(default: 32)" in section(text, "crawler")  # --concurrency, Settings.concurrency

"""Processes read from /proc, for the "nothing left behind" checks: every live one, and
the Redis/valkey servers among them."""

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SERVER_NAMES = {"valkey-server", "redis-server"}


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    session: int
    comm: str
    cmdline: str


def live_processes() -> list[Proc]:
    """Every process that is running (zombies and the dead left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_line = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat_line[stat_line.rindex(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            continue
        comm = stat_line[stat_line.index("(") + 1 : stat_line.rindex(")")]
        found.append(Proc(int(entry.name), int(fields[1]), int(fields[3]), comm, cmdline))
    return found


def server_processes(match: Callable[[int, str, str], bool]) -> list[tuple[int, str]]:
    """Live server processes for which ``match(ppid, cwd, cmdline)`` holds.

    (The server rewrites its cmdline to "valkey-server 127.0.0.1:PORT", but it
    chdir()s into its data dir, so its cwd identifies it.)
    """
    found = []
    for p in live_processes():
        argv0 = os.path.basename(p.cmdline.split(" ", 1)[0]) if p.cmdline else ""
        if p.comm not in SERVER_NAMES and argv0 not in SERVER_NAMES:
            continue
        try:
            cwd = os.readlink(f"/proc/{p.pid}/cwd")
        except OSError:
            cwd = ""
        if match(p.ppid, cwd, p.cmdline):
            found.append((p.pid, p.cmdline))
    return found

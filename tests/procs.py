"""Finding Redis/valkey server processes in /proc, for the "nothing left behind" checks."""

import os
from collections.abc import Callable
from pathlib import Path

SERVER_NAMES = {"valkey-server", "redis-server"}


def server_processes(match: Callable[[int, str, str], bool]) -> list[tuple[int, str]]:
    """Live server processes for which ``match(ppid, cwd, cmdline)`` holds.

    (The server rewrites its cmdline to "valkey-server 127.0.0.1:PORT", but it
    chdir()s into its data dir, so its cwd identifies it.)
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat_line = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        comm = stat_line[stat_line.index("(") + 1 : stat_line.rindex(")")]
        fields = stat_line[stat_line.rindex(")") + 2 :].split()
        state, ppid = fields[0], int(fields[1])
        argv0 = os.path.basename(cmdline.split(" ", 1)[0]) if cmdline else ""
        if state in ("Z", "X") or (comm not in SERVER_NAMES and argv0 not in SERVER_NAMES):
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            cwd = ""
        if match(ppid, cwd, cmdline):
            found.append((pid, cmdline))
    return found



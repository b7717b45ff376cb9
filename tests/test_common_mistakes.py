"""docs/DEPLOY.md, "Common mistakes": every mistake the section lists is made here, as
written there, and what the command said and its exit status must be what the section
says. The section is the test's input, so neither can drift from the other.

The section's commands run in one directory set up as the section says: ``dedupnet certs
--dir certs --networks 1,2`` made there, a center of network 1 running at
``127.0.1.1:7700`` with the LAN key ``certs/lan-1.key`` and the data directory
``c1-data``, something else listening on ``127.0.0.1:7700``, nothing on
``127.0.0.1:7790`` or on ``127.0.9.1``. Ports 7700 and 7790 stand for two ports free on
this machine when the test runs; process ids are compared as ``pid N``. A mistake whose
exit status is ``runs`` does not stop the daemon (a retry may cure it, or it is only a
warning): its line must appear within a few seconds, and the daemon is then stopped.

``python -m tests.test_common_mistakes`` prints the rows as the commands answer now, to
paste into the section after a deliberate change."""

from __future__ import annotations

import contextlib
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from .helpers import DEDUPNET, free_port

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "DEPLOY.md"
SECTION = re.compile(r"<!-- common-mistakes -->\n(?P<table>.*?)<!-- end of the common mistakes -->", re.S)
ROW = re.compile(r"^\| (?P<what>[^|]+?) \| `(?P<command>[^`]+)` \| `` (?P<line>.+) `` \| (?P<exit>\w+) \|$")
#: A daemon's own log records: the mistake's line is the one that is not one of these,
#: or (for a mistake that does not stop it) the record that carries it.
RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
#: Seconds a ``runs`` mistake has to say its line.
RUNS_WITHIN = 30.0


def rows(text: str | None = None) -> list[dict[str, str]]:
    match = SECTION.search(text if text is not None else GUIDE.read_text())
    assert match, "docs/DEPLOY.md has no <!-- common-mistakes --> section"
    found = [m.groupdict() for line in match["table"].splitlines() if (m := ROW.match(line))]
    return found


class Place:
    """The directory the section's commands run in, and the ports standing for 7700, 7790
    and the discovery port 7799 (a host's ``--center auto`` asks on a port of its own, so
    that no center of another test running beside this one answers it)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {"7700": str(free_port()), "7790": str(free_port()), "7799": str(free_port())}

    def real(self, text: str) -> str:
        return re.sub(r"\b(7700|7790)\b", lambda m: self.ports[m[1]], text)

    def shown(self, text: str) -> str:
        """What a command said, as the section writes it."""
        back = {v: k for k, v in self.ports.items()}
        text = re.sub(r"\b(\d{4,5})\b", lambda m: back.get(m[1], m[1]), text)
        return re.sub(r"\bpid \d+", "pid N", text)


@contextlib.contextmanager
def place(root: Path):
    p = Place(root)
    subprocess.run([*DEDUPNET, "certs", "--dir", "certs", "--networks", "1,2"], cwd=root, check=True,
                   capture_output=True)
    (root / "seeds.txt").write_text("http://127.77.0.1:8077/\n# the second site\nexample.com/page\n")
    (root / "peer.toml").write_text('network = 1\nlisten = "127.0.0.1:7790"\n'
                                    'peer = ["2,127.0.2.1:7700,127.0.2.0/24"]\n')
    (root / "size.toml").write_text('network = 1\nlisten = "127.0.0.1:7790"\nset_size = "500"\n')
    (root / "open.key").write_text((root / "certs" / "lan-1.key").read_text())
    (root / "open.key").chmod(0o644)
    center = subprocess.Popen([*DEDUPNET, "center", "--network", "1", "--listen", f"127.0.1.1:{p.ports['7700']}",
                               "--lan-key-file", "certs/lan-1.key", "--data-dir", "c1-data"], cwd=root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", int(p.ports["7700"])))
            taken.listen()
            deadline = time.monotonic() + 30
            while socket.socket().connect_ex(("127.0.1.1", int(p.ports["7700"]))) != 0:
                assert center.poll() is None and time.monotonic() < deadline, "the section's center did not start"
                time.sleep(0.1)
            yield p
    finally:
        center.send_signal(signal.SIGTERM)
        center.wait(timeout=20)


def observe(p: Place, command: str, runs: bool) -> tuple[str, str]:
    """(the line, the exit status) of ``command`` as the section would show them."""
    argv = shlex.split(p.real(command))
    assert argv[0] == "dedupnet"
    if "auto" in argv and argv[argv.index("auto") - 1] == "--center" and "--discovery-port" not in argv:
        argv += ["--discovery-port", p.ports["7799"]]
    if not runs:
        out = subprocess.run([*DEDUPNET, *argv[1:]], cwd=p.root, capture_output=True, text=True, timeout=30)
        said = [line for line in out.stderr.splitlines() if not RECORD.match(line)]
        return p.shown(said[-1] if said else ""), str(out.returncode)
    proc = subprocess.Popen([*DEDUPNET, *argv[1:]], cwd=p.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    silent = threading.Timer(RUNS_WITHIN, proc.kill)  # a daemon that says nothing must not hold the test
    silent.start()
    try:
        deadline = time.monotonic() + RUNS_WITHIN
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            m = RECORD.match(line)
            if m and m[1] in ("WARNING", "ERROR"):
                return p.shown(line[m.end():].rstrip("\n")), "runs" if proc.poll() is None else str(proc.returncode)
        return "", "nothing said" if proc.poll() is None else str(proc.returncode)
    finally:
        silent.cancel()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


@pytest.fixture(scope="module")
def section_place(tmp_path_factory):
    with place(tmp_path_factory.mktemp("mistakes")) as p:
        yield p


def test_the_section_lists_at_least_25_mistakes():
    assert len(rows()) >= 25
    assert len({r["command"] for r in rows()}) == len(rows()), "a mistake listed twice"


@pytest.mark.parametrize("row", rows(), ids=lambda r: r["what"][:40])
def test_each_mistake_says_what_the_section_says(section_place, row):
    line, status = observe(section_place, row["command"], row["exit"] == "runs")
    assert (line, status) == (row["line"], row["exit"]), row["command"]
    if status != "runs":  # a daemon's mistake in its settings is 2; 1 is for what a later try may find
        assert status == "2" or row["command"].split()[1] in ("status", "push", "reassign") \
            or "--center auto" in row["command"], "a daemon's mistake in its settings exits 2"


if __name__ == "__main__":  # the rows as the commands answer now
    import tempfile

    with tempfile.TemporaryDirectory() as d, place(Path(d)) as here:
        for r in rows():
            said, code = observe(here, r["command"], r["exit"] == "runs")
            print(f"| {r['what']} | `{r['command']}` | `` {said} `` | {code} |")

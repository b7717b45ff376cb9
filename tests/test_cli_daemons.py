"""`dedupnet center` / `local` / `push` / `status` as a user runs them: real processes,
real TCP on loopback, each daemon with its own embedded (persistent) Redis."""

import json
import signal
import subprocess

import pytest

from .helpers import DEDUPNET, dedupnet, status, wait_for
from .procs import server_processes



@pytest.fixture
def deployment(tmp_path):
    procs = []

    def start(*args):
        log = open(tmp_path / f"{len(procs)}.log", "w")
        procs.append(subprocess.Popen([*DEDUPNET, *args], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT))

    start("center", "--network", "1", "--listen", "127.0.1.1:17700", "--peer", "2,127.0.2.1:17700,127.0.2.0/24")
    start("center", "--network", "2", "--listen", "127.0.2.1:17700", "--peer", "1,127.0.1.1:17700,127.0.1.0/24")
    for net in (1, 2):
        start("local", "--network", str(net), "--ip", f"127.0.{net}.10", "--center", f"127.0.{net}.1:17700",
              "--listen", f"127.0.{net}.10:17701", "--set-size", "25", "--no-crawl")
    yield tmp_path, procs
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(timeout=20)


def test_two_networks_from_the_command_line(deployment):
    tmp, procs = deployment
    assert wait_for(lambda: (s := status("127.0.1.10:17701")) and s["connected"]
                    and (t := status("127.0.2.10:17701")) and t["connected"])
    urls = tmp / "urls.txt"
    urls.write_text("\n".join(f"http://site{i % 4}.example/p{i}" for i in range(100)) + "\nftp://nope/\n")
    for net in (1, 2):
        out = dedupnet("push", "--data-dir", f"dedupnet-data/host-127.0.{net}.10", "--ip", f"127.0.{net}.10",
                  "--file", str(urls), cwd=tmp)
        assert json.loads(out.stdout) == {"pushed": 100, "rejected": 1}, out.stderr

    def settled():
        a, b = status("127.0.1.10:17701"), status("127.0.2.10:17701")
        return a and b and a["pools"]["URL_pool"] == b["pools"]["URL_pool"] == 0 and \
            a["pools"]["task_pool"] + b["pools"]["task_pool"] == 100

    assert wait_for(settled), (status("127.0.1.10:17701"), status("127.0.2.10:17701"))
    center = status("127.0.1.1:17700")
    assert set(center["members"]) == {"127.0.1.10", "net:2"}
    assert center["sets_in_flight"] == {}

    # SIGTERM: every daemon stops cleanly, with its Redis.
    for p in procs:
        p.send_signal(signal.SIGTERM)
    assert [p.wait(timeout=20) for p in procs] == [0, 0, 0, 0]
    assert "shutting down" in (tmp / "0.log").read_text()
    pids = {p.pid for p in procs}
    assert wait_for(lambda: not server_processes(lambda ppid, cwd, cmd: ppid in pids), 10)


def test_status_of_nothing_says_so():
    out = dedupnet("status", "127.0.0.1:1")
    assert out.returncode == 1 and "no answer from 127.0.0.1:1" in out.stderr and not out.stdout


@pytest.mark.parametrize("args, message", [
    (["center", "--listen", "127.0.0.1:1"], "--network"),
    (["local", "--network", "1"], "--center"),
    (["center", "--network", "1", "--listen", "127.0.0.1:1", "--peer", "2,nope"], "NETWORK,HOST:PORT,CIDR"),
    (["local", "--network", "1", "--center", "127.0.0.1:1", "--per-site", "0"], "(--per-site) must be at least 1"),
    (["local", "--network", "1", "--center", "127.0.0.1:1", "--max-depth", "-1"], "max_depth must not be negative"),
    (["demo", "--urls", "0"], "argument --urls: must be at least 1, not 0"),
    (["certs", "--networks", "1", "--days", "0"], "argument --days: must be at least 1, not 0"),
])
def test_daemons_explain_missing_or_bad_settings(args, message):
    out = dedupnet(*args)
    assert out.returncode == 2 and message in out.stderr


@pytest.mark.parametrize("args", [
    ["center", "--network", "0", "--listen", "127.0.0.1:1"],
    ["center", "--network", "70000", "--listen", "127.0.0.1:1"],
    ["local", "--network", "0", "--center", "127.0.0.1:1"],
    ["center", "--network", "1", "--listen", "127.0.0.1:1", "--peer", "0,127.0.2.1:1,127.0.2.0/24"],
    ["center", "--network", "1", "--listen", "127.0.0.1:1", "--peer", "65536,127.0.2.1:1,127.0.2.0/24"],
])
def test_network_ids_outside_1_to_65535_are_refused_in_one_line(args):
    out = dedupnet(*args)
    assert out.returncode == 2, out.stderr
    assert "must be a network id within 1..65535" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr

"""A center that stops answering but keeps its TCP connections open (SIGSTOP): real
``dedupnet center`` / ``local`` processes, each with its own embedded Redis. Every host
gives the connection up within the heartbeat timeout and says so in its log, keeps its
unacknowledged sets, and sends them again once the center answers (SIGCONT): 0 lost."""

import json
import os
import re
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from .helpers import DEDUPNET, dedupnet, free_port, status, wait_for

NET = 41  # 127.0.41.0/24: a LAN of its own (other tests use 127.0.1-2.x)
CENTER = f"127.0.{NET}.1"
HOSTS = [f"127.0.{NET}.10", f"127.0.{NET}.11"]
TIMEOUT = 3.0  # --heartbeat-timeout of every daemon


def state(pid: int) -> str:
    """The process state letter of /proc/PID/stat ('T' once a SIGSTOP has taken effect)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text.rsplit(")", 1)[1].split()[0]


@pytest.fixture
def lan(tmp_path):
    port = free_port(CENTER)
    procs, logs = {}, {}

    def start(name, *args):
        logs[name] = tmp_path / f"{name}.log"
        with open(logs[name], "w") as log:
            procs[name] = subprocess.Popen([*DEDUPNET, *args, "--heartbeat-timeout", str(TIMEOUT)], cwd=tmp_path,
                                           stdout=log, stderr=subprocess.STDOUT)

    start("center", "center", "--network", str(NET), "--listen", f"{CENTER}:{port}", "--no-discovery")
    listen = {}
    for ip in HOSTS:
        listen[ip] = f"{ip}:{free_port(ip)}"
        start(ip, "local", "--network", str(NET), "--ip", ip, "--center", f"{CENTER}:{port}",
              "--listen", listen[ip], "--set-size", "10", "--no-crawl")
    yield tmp_path, procs, logs, f"{CENTER}:{port}", listen
    for p in procs.values():
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def push(tmp, ip, urls):
    out = dedupnet("push", "--data-dir", f"dedupnet-data/host-{ip}", "--ip", ip, *urls, cwd=tmp)
    assert json.loads(out.stdout)["pushed"] == len(urls), out.stdout + out.stderr


def tasks(listen) -> int | None:
    """URLs admitted to the LAN's hosts (they do not crawl: every task stays queued), once
    nothing is pending anywhere; None while something is."""
    total = 0
    for address in listen.values():
        s = status(address)
        if not s or not s["connected"] or s["pools"]["URL_pool"] or s["sets_in_flight"]["unacked"]:
            return None
        total += s["pools"]["task_pool"]
    return total


def test_a_stopped_center_is_given_up_by_every_host_and_its_sets_go_again_after_it_resumes(lan):
    tmp, procs, logs, center, listen = lan
    assert wait_for(lambda: all((s := status(a)) and s["connected"] for a in listen.values())), "hosts connected"
    for i, ip in enumerate(HOSTS):
        push(tmp, ip, [f"http://before{i}.example/p{j}" for j in range(30)])
    assert wait_for(lambda: tasks(listen) == 60), "the first URLs admitted"

    pid = procs["center"].pid
    os.kill(pid, signal.SIGSTOP)
    assert wait_for(lambda: state(pid) == "T", 5), "the center stopped"
    stopped = time.time()
    for i, ip in enumerate(HOSTS):
        push(tmp, ip, [f"http://during{i}.example/p{j}" for j in range(30)])

    # Every host gives the center up and says so in one line: which center, how long silent;
    # when, by its log's clock (the pushes above are the test's own CLI start-ups).
    pattern = re.compile(rf"^(\S+ \S+) .*{re.escape(center)} sent nothing for ([\d.]+) s \(heartbeat timeout 3 s\): "
                         r"giving the connection up and dialling again", re.M)
    for ip in HOSTS:
        found = wait_for(lambda: pattern.search(logs[ip].read_text()), 4 * TIMEOUT)
        assert found, f"{ip} gave the center up"
        assert TIMEOUT <= float(found.group(2)) < TIMEOUT + 1
        assert datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - stopped < 4 * TIMEOUT
    # ... and keeps the sets the center has not acknowledged.
    for address in listen.values():
        s = status(address)
        assert s["sets_in_flight"]["unacked"] > 0 and s["pools"]["unacked_sets"] > 0, s

    os.kill(pid, signal.SIGCONT)
    assert wait_for(lambda: tasks(listen) == 120, 40), "every URL admitted after the center resumed"
    for ip in HOSTS:
        assert status(listen[ip])["counters"].get("heartbeat_missed", 0) >= 1
